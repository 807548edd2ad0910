// Sum / max / min reductions over the axes of a contiguous array, after the host has
// collapsed the shape into one of three patterns:
//   rows:  [K, R]      reduce the last axis      -> reduce_rows_kernel
//   cols:  [R, K]      reduce the leading axis   -> reduce_cols_kernel (two passes when
//                                                   R is long: partials, then rows=chunks)
//   mid:   [R1, K, R2] reduce both outer axes    -> reduce_mid_kernel
// A full reduction is rows with K = 1 after a grid-wide partial pass (reduce_flat_kernel).
//
// Bound: memory.  Launch geometry:
//   reduce_rows_kernel: 256-thread blocks; `tpr` threads per row (32: one warp per
//     row, rows packed 8 to a block; 256: one block per row for long rows).
//   reduce_cols_kernel: blocks of (32, 8): 32 adjacent columns (coalesced) by 8 row
//     lanes; blockIdx.y takes a chunk of rows; writes acc-typed partials.
//   reduce_mid_kernel: one 256-thread block per kept index.
//   reduce_flat_kernel: grid-stride over all elements, one acc partial per block.
// Accumulation is in acc_t<T> (float for 16-bit types).
#include "common.cuh"

// Reduction codes (R_*): opcodes.cuh, generated from backends/opcodes.py.

template <typename A> __device__ __forceinline__ A red_identity(int op) {
    return op == R_SUM ? (A)0 : (op == R_MAX ? neg_inf<A>() : pos_inf<A>());
}
template <typename A> __device__ __forceinline__ A red_combine(int op, A a, A b) {
    return op == R_SUM ? a + b : (op == R_MAX ? nan_max(a, b) : nan_min(a, b));
}
template <typename A> __device__ __forceinline__ A warp_reduce(int op, A v) {
    for (int o = 16; o > 0; o >>= 1) v = red_combine(op, v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Reduce each group of `tpr` consecutive threads (tpr = 32 or blockDim.x).
template <typename A> __device__ __forceinline__ A group_reduce(int op, A v, int tpr, A* scratch) {
    v = warp_reduce(op, v);
    if (tpr == 32) return v;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : red_identity<A>(op);
    return warp_reduce(op, v);
}

// In and Out are T or acc_t<T>: the second pass of a two-pass reduction reads acc
// partials (the `from_acc` flag selects the input type).
template <typename T, typename In>
__device__ __forceinline__ void reduce_rows_body(const In* __restrict__ x, T* __restrict__ out,
                                                 long long rows, long long cols, int op, int tpr) {
    typedef acc_t<T> A;
    __shared__ A scratch[32];
    int groups = blockDim.x / tpr;
    long long row = (long long)blockIdx.x * groups + threadIdx.x / tpr;
    int t = threadIdx.x % tpr;
    A v = red_identity<A>(op);
    if (row < rows) {
        const In* xr = x + row * cols;
        for (long long j = t; j < cols; j += tpr) v = red_combine(op, v, (A)load_acc(xr[j]));
    }
    v = group_reduce(op, v, tpr, scratch);
    if (row < rows && t == 0) out[row] = store_as<T>(v);
}

template <typename T>
__global__ void reduce_rows_kernel(const T* __restrict__ x, T* __restrict__ out,
                                   long long rows, long long cols, long long op, long long tpr) {
    reduce_rows_body<T, T>(x, out, rows, cols, (int)op, (int)tpr);
}

template <typename T>
__global__ void reduce_partials_kernel(const acc_t<T>* __restrict__ x, T* __restrict__ out,
                                       long long rows, long long cols, long long op, long long tpr) {
    reduce_rows_body<T, acc_t<T>>(x, out, rows, cols, (int)op, (int)tpr);
}

// partial[chunk, col] = reduce over rows [chunk * rows_per_chunk, ...) of x[row, col].
template <typename T>
__global__ void reduce_cols_kernel(const T* __restrict__ x, acc_t<T>* __restrict__ partial,
                                   long long rows, long long cols, long long rows_per_chunk,
                                   long long op) {
    typedef acc_t<T> A;
    __shared__ A tile[8][33];
    long long col = (long long)blockIdx.x * 32 + threadIdx.x;
    long long r0 = (long long)blockIdx.y * rows_per_chunk;
    long long r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
    A v = red_identity<A>((int)op);
    if (col < cols)
        for (long long r = r0 + threadIdx.y; r < r1; r += 8)
            v = red_combine((int)op, v, (A)load_acc(x[r * cols + col]));
    tile[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        for (int k = 1; k < 8; ++k) v = red_combine((int)op, v, tile[k][threadIdx.x]);
        partial[(long long)blockIdx.y * cols + col] = v;
    }
}

// out[k] = reduce over (i, j) of x[i, k, j] for x of shape [outer, K, inner].
template <typename T>
__global__ void reduce_mid_kernel(const T* __restrict__ x, T* __restrict__ out,
                                  long long outer, long long K, long long inner, long long op) {
    typedef acc_t<T> A;
    __shared__ A scratch[32];
    long long k = blockIdx.x;
    A v = red_identity<A>((int)op);
    for (long long i = 0; i < outer; ++i) {
        const T* xr = x + (i * K + k) * inner;
        for (long long j = threadIdx.x; j < inner; j += blockDim.x)
            v = red_combine((int)op, v, (A)load_acc(xr[j]));
    }
    v = group_reduce((int)op, v, (int)blockDim.x, scratch);
    if (threadIdx.x == 0) out[k] = store_as<T>(v);
}

// partial[block] = reduce of a grid-stride share of x[0:n].
template <typename T>
__global__ void reduce_flat_kernel(const T* __restrict__ x, acc_t<T>* __restrict__ partial,
                                   long long n, long long op) {
    typedef acc_t<T> A;
    __shared__ A scratch[32];
    A v = red_identity<A>((int)op);
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        v = red_combine((int)op, v, (A)load_acc(x[i]));
    v = group_reduce((int)op, v, (int)blockDim.x, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = v;
}
