// Helpers shared by the flash attention forward and backward kernels: 16-byte cp.async
// tile loads into padded shared memory, float pairs packed to 16-bit, one-instruction
// exp2 (of a float, and of a 16-bit pair), the k = 8 MMA step and the maximum over the
// four lanes that hold one row of an MMA accumulator.
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

// 2^lo, 2^hi as one 16-bit pair (lo in the low half), already an MMA fragment register.
// float16: the arguments rounded to float16, then one ex2 for both -- half the
// special-function work of two float ex2 (relative error below 2^-9.9, the arguments'
// rounding 2^-12 of |x| at most).  bfloat16: the same float16 ex2, its two halves then
// widened and rounded to bfloat16 (three conversions, cheaper than a second ex2; the
// float16 result's error stays below bfloat16's own 2^-9 rounding, and bfloat16's
// 8-bit arguments, up to 1% on probabilities of 1/256 to 1/16, are never used).
__device__ __forceinline__ unsigned exp2_pair(float lo, float hi, half_t) {
    unsigned r;
    asm("ex2.approx.f16x2 %0, %1;" : "=r"(r) : "r"(pack_pair(lo, hi, half_t())));
    return r;
}
__device__ __forceinline__ unsigned exp2_pair(float lo, float hi, bf16_t) {
    const unsigned h = exp2_pair(lo, hi, half_t());
    float f_lo, f_hi;
    asm("{\n.reg .f16 l, h;\nmov.b32 {l, h}, %2;\ncvt.f32.f16 %0, l;\ncvt.f32.f16 %1, h;\n}"
        : "=f"(f_lo), "=f"(f_hi) : "r"(h));
    return pack_pair(f_lo, f_hi, bf16_t());
}

// The pair (1, 1): a B fragment of ones, whose product with P sums P's rows.
__device__ __forceinline__ unsigned ones_pair(half_t) { return 0x3C003C00u; }
__device__ __forceinline__ unsigned ones_pair(bf16_t) { return 0x3F803F80u; }

// d += a * b for one 16x8 tile over k = 8 (a: rows g and g + 8, columns 2t, 2t + 1;
// b: rows 2t, 2t + 1 of column g): the last step over a head dim of an odd number of 8s.
__device__ __forceinline__ void mma_k8(float (&d)[4], unsigned a0, unsigned a1, unsigned b, half_t) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(b));
}
__device__ __forceinline__ void mma_k8(float (&d)[4], unsigned a0, unsigned a1, unsigned b, bf16_t) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(b));
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

