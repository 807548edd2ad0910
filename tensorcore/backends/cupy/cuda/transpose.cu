// A batch of matrix transposes through shared memory: out[b][i][j] = src[b][j][i] with src
// a dense [batch, cols, rows] block and out a dense [batch, rows, cols] one.  Each block
// moves a 32 x 32 tile: it reads 32 consecutive elements of a source row per warp and
// writes 32 consecutive elements of an output row per warp, so both sides are coalesced
// (an element-by-element strided copy reads or writes one element per 32-byte sector).
// The tile row is padded by one element so the transposed read from shared memory does
// not hit one bank 32 times.
#include "common.cuh"

#define TRANSPOSE_TILE 32
#define TRANSPOSE_ROWS 8  // threadIdx.y extent: each thread moves 4 elements

template <typename T>
__global__ void __launch_bounds__(TRANSPOSE_TILE * TRANSPOSE_ROWS)
transpose_kernel(const T* __restrict__ src, T* __restrict__ out, int rows, int cols) {
    __shared__ T tile[TRANSPOSE_TILE][TRANSPOSE_TILE + 1];
    const long long base = (long long)blockIdx.z * rows * cols;
    const int i0 = blockIdx.x * TRANSPOSE_TILE, j0 = blockIdx.y * TRANSPOSE_TILE;
#pragma unroll
    for (int r = threadIdx.y; r < TRANSPOSE_TILE; r += TRANSPOSE_ROWS) {
        const int j = j0 + r, i = i0 + threadIdx.x;
        if (j < cols && i < rows) tile[r][threadIdx.x] = src[base + (long long)j * rows + i];
    }
    __syncthreads();
#pragma unroll
    for (int r = threadIdx.y; r < TRANSPOSE_TILE; r += TRANSPOSE_ROWS) {
        const int i = i0 + r, j = j0 + threadIdx.x;
        if (i < rows && j < cols) out[base + (long long)i * cols + j] = tile[threadIdx.x][r];
    }
}
