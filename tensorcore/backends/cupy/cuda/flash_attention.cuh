// Helpers shared by the flash attention forward and backward kernels: 16-byte cp.async
// tile loads into padded shared memory, float pairs packed to 16-bit, a one-instruction
// exp2 and reductions over the four lanes that hold one row of an MMA accumulator.
#pragma once
#include "common.cuh"
#include "tensor_core.cuh"

#define FA_KEYS 64   // keys per tile
#define FA_WARPS 4   // warps per block

// 16-byte chunks of a [ROWS, D] tile (row stride D + 8 halves in shared memory) from a
// strided [rows, d] source; chunks past d or rows past `valid` are zero-filled.
template <int ROWS, int D>
__device__ __forceinline__ void load_tile(unsigned smem, const unsigned short* src, long long row_stride,
                                          int valid, int d) {
    constexpr int CHUNKS = D / 8;
#pragma unroll 4
    for (int c = threadIdx.x; c < ROWS * CHUNKS; c += FA_WARPS * 32) {
        const int row = c / CHUNKS, chunk = c % CHUNKS;
        const bool inside = row < valid && chunk * 8 < d;
        const unsigned short* from = inside ? src + row * row_stride + chunk * 8 : src;
        cp_async16(smem + (row * (D + 8) + chunk * 8) * 2, from, inside);
    }
}

__device__ __forceinline__ unsigned pack_pair(float lo, float hi, half_t) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %2, %1;" : "=r"(r) : "f"(lo), "f"(hi));
    return r;
}
__device__ __forceinline__ unsigned pack_pair(float lo, float hi, bf16_t) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %2, %1;" : "=r"(r) : "f"(lo), "f"(hi));
    return r;
}

// 2^x in one MUFU instruction (subnormal results flush to 0, far below 16-bit resolution).
__device__ __forceinline__ float fast_exp2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

