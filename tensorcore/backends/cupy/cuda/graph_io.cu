// A captured graph's own input and output copies (graph_io.py).
//
// A replayed plan reads its inputs from, and writes its outputs to, fixed buffers.  The
// caller's arrays change from call to call, so their addresses travel through a ring of
// pointer rows in pinned, mapped host memory, which the host fills with plain stores:
// row (launch number mod ring size) holds one pointer per slot (inputs first, then
// outputs), 0 where the slot is skipped this call.  The device keeps a copy of the
// table whose other rows -- per slot, the plan buffer's address and the slot's byte
// count -- are set once after the capture.  The graph's first node,
// graph_io_fetch_kernel, reads this launch's row over the bus into that copy, so the
// copy kernels read device memory only; a kernel rather than a host-to-device memcpy
// node keeps the graph all kernels, which the driver launches faster.  The launch
// number is a device counter that graph_io_finish_kernel, the graph's last node,
// advances and publishes to the host, so the host knows which rows the device has
// finished with.
//
// graph_io_fetch_kernel: one block; thread i copies slot i of this launch's row.  The
// loads are volatile: the host rewrites a row every ring's worth of launches.
__global__ void graph_io_fetch_kernel(const volatile unsigned long long* host_table, unsigned long long* table,
                                      int ring_rows, int row_width, const unsigned long long* launches) {
    const unsigned long long base = (launches[0] % (unsigned long long)ring_rows) * row_width;
    for (int i = threadIdx.x; i < row_width; i += blockDim.x) table[base + i] = host_table[base + i];
}

// graph_io_copy_kernel: blockIdx.y is the slot; the blocks along x stride over its
// bytes, 16 at a time when both addresses are 16-byte aligned.

__global__ void graph_io_copy_kernel(const unsigned long long* table, int ring_rows, int row_width,
                                     const unsigned long long* launches, int first_slot, int to_caller) {
    const int slot = first_slot + blockIdx.y;
    const unsigned long long row = launches[0] % (unsigned long long)ring_rows;
    const unsigned long long theirs = table[row * row_width + slot];
    if (theirs == 0) return;
    const unsigned long long ours = table[(unsigned long long)ring_rows * row_width + slot];
    const long long n = (long long)table[(unsigned long long)(ring_rows + 1) * row_width + slot];
    const char* src = (const char*)(to_caller ? ours : theirs);
    char* dst = (char*)(to_caller ? theirs : ours);
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long start = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long done = 0;
    if ((((unsigned long long)src | (unsigned long long)dst) & 15) == 0) {
        const uint4* s = (const uint4*)src;
        uint4* d = (uint4*)dst;
        for (long long i = start; i < n / 16; i += stride) d[i] = s[i];
        done = n & ~15LL;
    }
    for (long long i = done + start; i < n; i += stride) dst[i] = src[i];
}

// One thread: the launch is done with its ring row; tell the device's next launch and
// the host.
__global__ void graph_io_finish_kernel(unsigned long long* launches, volatile unsigned long long* published) {
    const unsigned long long next = launches[0] + 1;
    launches[0] = next;
    __threadfence_system();
    *published = next;
}
