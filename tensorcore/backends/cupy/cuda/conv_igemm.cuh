// The implicit-GEMM convolution's own pieces (conv_igemm.cu): the precisions, the K slice
// of a warp tile, the multistage main loop and the epilogue shared by the direct and the
// split-K stores.  The mma.sync building blocks are in tensor_core.cuh.
//
// Precisions (template argument PREC of the kernels):
//   PREC_16     half_t / bf16_t operands, mma m16n8k16, float accumulators
//   PREC_TF32   float operands already rounded to TF32 by the pack kernel, mma m16n8k8
//   PREC_3XTF32 float operands split in registers into big + small TF32 parts and
//               multiplied as big*big + big*small + small*big (float32 accuracy)
#pragma once
#include "common.cuh"
#include "tensor_core.cuh"

#define PREC_16 0
#define PREC_TF32 1
#define PREC_3XTF32 2

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }

__device__ __forceinline__ unsigned tf32_bits(float f) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(f));
    return r;
}

// Round to TF32 where asked (the pack kernels), identity for the other types.
template <typename T> __device__ __forceinline__ T tf32_if(T v, bool) { return v; }
template <> __device__ __forceinline__ float tf32_if<float>(float v, bool round) {
    return round ? __uint_as_float(tf32_bits(v)) : v;
}

// Split float bits into TF32 big and small parts: x ~= big + small to ~2^-22.
template <int N> __device__ __forceinline__ void tf32_split(const unsigned (&x)[N],
                                                             unsigned (&big)[N],
                                                             unsigned (&small)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const float f = __uint_as_float(x[i]);
        big[i] = tf32_bits(f);
        small[i] = tf32_bits(f - __uint_as_float(big[i]));
    }
}

// One K slice of a warp tile: acc[MT][NT] += a[MT] * b[NT].
template <typename T, int PREC, int MT, int NT>
__device__ __forceinline__ void mma_slice(float (&acc)[MT][NT][4], const unsigned (&a)[MT][4],
                                          const unsigned (&b)[NT][2]) {
    if constexpr (PREC == PREC_3XTF32) {
        unsigned ab[MT][4], as[MT][4], bb[NT][2], bs[NT][2];
#pragma unroll
        for (int i = 0; i < MT; ++i) tf32_split(a[i], ab[i], as[i]);
#pragma unroll
        for (int j = 0; j < NT; ++j) tf32_split(b[j], bb[j], bs[j]);
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                Mma<T>::run(acc[i][j], as[i], bb[j]);  // small terms first
                Mma<T>::run(acc[i][j], ab[i], bs[j]);
                Mma<T>::run(acc[i][j], ab[i], bb[j]);
            }
    } else {
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j) Mma<T>::run(acc[i][j], a[i], b[j]);
    }
}

template <int MT, int NT> __device__ __forceinline__ void zero(float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
}

// The multistage main loop over nk K tiles of KSTEPS mma slices each: STAGES - 1 tile
// copies in flight, one barrier per tile, and the fragments of the next slice loaded
// from shared memory while the current slice's mma run (two fragment buffers).  The
// barrier that makes tile kt + 1 visible is taken before the last slice of tile kt is
// multiplied (its fragments are already in registers), so the first fragments of tile
// kt + 1 load under those mma.  After that barrier no warp reads tile kt's stage any
// more, so tile kt + STAGES - 1 is copied into it at the start of tile kt + 1.
//   load(stage)               issue the cp.async copies of the next tile into a stage
//   load_frag(buf, stage, ks) fragments of slice ks of a stage into buffer buf
//   mma(buf)                  acc += the fragments of buffer buf
template <int STAGES, int KSTEPS, typename Load, typename LoadFrag, typename Mma>
__device__ __forceinline__ void multistage(int nk, Load& load, LoadFrag& load_frag, Mma& mma) {
    static_assert(KSTEPS % 2 == 0, "slices alternate between the two fragment buffers");
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nk) load(s);
        cp_async_commit();
    }
    if (nk <= 0) {
        cp_async_wait<0>();
        return;
    }
    cp_async_wait<STAGES - 2>();  // tile 0 has landed (this thread's copies)
    __syncthreads();              // ... everyone's
    int read = 0, write = STAGES - 1;
    load_frag(0, read, 0);
    for (int kt = 0; kt < nk; ++kt) {
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
            if (ks == 0) {  // the stage freed by the barrier of the previous tile
                if (kt + STAGES - 1 < nk) load(write);
                cp_async_commit();
                write = write + 1 == STAGES ? 0 : write + 1;
            }
            if (ks == KSTEPS - 1) {  // tile kt + 1 visible to every warp
                cp_async_wait<STAGES - 2>();
                __syncthreads();
                read = read + 1 == STAGES ? 0 : read + 1;
            }
            if (ks < KSTEPS - 1 || kt + 1 < nk) load_frag((ks + 1) & 1, read, (ks + 1) % KSTEPS);
            mma(ks & 1);
        }
    }
    cp_async_wait<0>();
}

// act(v + bias[j]) (+ residual[idx]) times scale, rounded to T: the fused epilogue.
template <typename T>
__device__ __forceinline__ T conv_epilogue(acc_t<T> v, const T* __restrict__ bias,
                                           const T* __restrict__ residual, long long idx,
                                           long long j, int act, acc_t<T> scale) {
    if (bias) v += load_acc(bias[j]);
    v = act_fwd(act, v);
    if (residual) v += load_acc(residual[idx]);
    return store_as<T>(v * scale);
}
