// Embedding backward: scatter-add the rows of grad [M, D] into out [num, D] at rows
// indices[m] (int64); repeated indices accumulate.  out must be zeroed by the caller.
//
// Bound: memory (atomics into out).  Launch: 1-D grid-stride, 256 threads, one thread
// per element of grad, so a warp covers 32 consecutive columns of one row.
#include "common.cuh"

template <typename T>
__global__ void embedding_bwd_kernel(const T* __restrict__ grad, const long long* __restrict__ indices,
                                     T* __restrict__ out, long long M, long long D, long long num) {
    long long total = M * D;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        long long m = i / D, d = i - m * D;
        long long row = indices[m];
        if (row < 0) row += num;
        if (row >= 0 && row < num) atomic_add_acc(out + row * D + d, load_acc(grad[i]));
    }
}
