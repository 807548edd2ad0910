// The forward of a convolution with few output channels (at most 8: an image model's
// last layer, 128 -> 3 at 512²) on the tensor cores, reading each input pixel about once.
//
// As a GEMM such a convolution has a narrow N, so the implicit-GEMM kernels'
// im2col tiles, copied once per tap, make it read the input R x S times over.  Here a
// block takes a TH x TW tile of output pixels of one image and walks the input channels
// a 128-byte block at a time: it copies the tile's halo ((TH + R - 1) x (TW + S - 1)
// input pixels of those channels, from the packed channels-last input, zero-filled
// outside the image) and the 8 x R x S rows of packed weights for them into shared
// memory (two stages: the next block's copy runs under this one's math), then each warp
// multiplies its 16 output pixels (one row segment) tap by tap: tap (r, s) reads the
// halo rows shifted by (r, s), which ldmatrix takes as per-lane row addresses, so no
// im2col tile is built.  mma.sync m16n8k16 (fp16, bf16) or m16n8k8 (TF32, operands
// rounded by the pack), float32 accumulators; the epilogue (bias, activation, residual,
// scale) as conv_igemm.cu's, stored NCHW.  Stride 1, dilation 1, any padding.
//
//   act  [N][IH][IW][Cp]       the packed input (conv_pack_kernel)
//   wpk  [Nout][R][S][Cp]      the packed weight
//   out  [N][Nout][OH][OW]
//
// Grid (ceil(OW / TW), ceil(OH / TH), N), TH * TW / 16 warps.  Bound: memory (the
// input read once, plus its halo), not the tensor cores.
#include "common.cuh"
#include "conv_igemm.cuh"

struct HaloShape {
    int IH, IW, Cp, Nout, OH, OW, R, S, pad_h, pad_w;
};

// Shared-memory row of one pixel's (or one weight row's) 128-byte channel block, padded
// by 16 bytes so that the 8 rows an ldmatrix matrix reads hit 32 different banks.
#define HALO_ROW 144
#define HALO_OUTPUTS 8  // output channels of a block: one n8 MMA tile

template <typename T, int TH, int TW>
__global__ void __launch_bounds__(TH * TW / 16 * 32)
conv_halo_kernel(const T* __restrict__ act, const T* __restrict__ wpk, T* __restrict__ out,
                 const T* __restrict__ bias, const T* __restrict__ residual, HaloShape p,
                 int act_code, float scale) {
    constexpr int THREADS = TH * TW / 16 * 32;
    constexpr int VEC = 16 / (int)sizeof(T);  // channels per 16-byte chunk
    constexpr int BLOCK = 8 * VEC;            // channels per 128-byte block
    static_assert(TW % 16 == 0, "whole 16-pixel MMA rows");
    extern __shared__ uint4 smem_words[];

    const int HW = TW + p.S - 1, halo = (TH + p.R - 1) * HW, taps = p.R * p.S;
    const unsigned stage_bytes = (halo + HALO_OUTPUTS * taps) * HALO_ROW;
    const int ox0 = blockIdx.x * TW, oy0 = blockIdx.y * TH, n = blockIdx.z;
    const int iy0 = oy0 - p.pad_h, ix0 = ox0 - p.pad_w;
    const unsigned base = smem_addr(smem_words);

    // the halo and the weight rows of channels [c0, c0 + BLOCK) into stage `stage`
    auto load = [&](int stage, int c0) {
        const unsigned halo_at = base + stage * stage_bytes, weights_at = halo_at + halo * HALO_ROW;
        for (int i = threadIdx.x; i < halo * 8; i += THREADS) {
            const int px = i / 8, chunk = i % 8, hy = px / HW, hx = px - hy * HW;
            const int iy = iy0 + hy, ix = ix0 + hx, c = c0 + chunk * VEC;
            const bool ok = (unsigned)iy < (unsigned)p.IH && (unsigned)ix < (unsigned)p.IW && c < p.Cp;
            cp_async16(halo_at + px * HALO_ROW + chunk * 16,
                       act + (ok ? ((long long)(n * p.IH + iy) * p.IW + ix) * p.Cp + c : 0), ok);
        }
        for (int i = threadIdx.x; i < HALO_OUTPUTS * taps * 8; i += THREADS) {
            const int row = i / 8, chunk = i % 8, j = row / taps, c = c0 + chunk * VEC;
            const bool ok = j < p.Nout && c < p.Cp;
            cp_async16(weights_at + row * HALO_ROW + chunk * 16,
                       wpk + (ok ? (long long)row * p.Cp + c : 0), ok);
        }
    };

    // this lane's ldmatrix rows at tap (0, 0): A, the warp's output pixel lane % 16 (one
    // row segment of 16), chunk lane / 16; B, output channel lane % 8, chunk (lane / 8) % 2
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int wy = warp / (TW / 16), wx = (warp % (TW / 16)) * 16;
    const unsigned a_row = ((wy * HW + wx + lane % 16) * HALO_ROW + (lane / 16) * 16);
    const unsigned b_row = ((lane % 8) * taps * HALO_ROW + ((lane / 8) % 2) * 16);

    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const int blocks = (p.Cp + BLOCK - 1) / BLOCK;
    load(0, 0);
    cp_async_commit();
    for (int k = 0; k < blocks; ++k) {
        if (k + 1 < blocks) load((k + 1) & 1, (k + 1) * BLOCK);
        cp_async_commit();
        cp_async_wait<1>();  // block k has landed (this thread's copies) ...
        __syncthreads();     // ... and everyone's
        const unsigned halo_at = base + (k & 1) * stage_bytes, weights_at = halo_at + halo * HALO_ROW;
        for (int r = 0; r < p.R; ++r)
            for (int s = 0; s < p.S; ++s) {
                const unsigned a_at = halo_at + a_row + (r * HW + s) * HALO_ROW;
                const unsigned b_at = weights_at + b_row + (r * p.S + s) * HALO_ROW;
#pragma unroll
                for (int ks = 0; ks < 4; ++ks) {  // 32 bytes of K per MMA
                    unsigned a[4], b[2];
                    ldsm_x4(a, a_at + ks * 32);
                    ldsm_x2(b, b_at + ks * 32);
                    Mma<T>::run(acc, a, b);
                }
            }
        __syncthreads();  // every warp is done with stage k & 1 before it is refilled
    }
    cp_async_wait<0>();

    // acc[e]: output pixel wx + g + 8 * (e >> 1) of the warp's row, channel 2 * t4 + (e & 1)
    const int g = lane / 4, t4 = lane % 4, oy = oy0 + wy;
    if (oy >= p.OH) return;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const int j = 2 * t4 + (e & 1), ox = ox0 + wx + g + 8 * (e >> 1);
        if (j >= p.Nout || ox >= p.OW) continue;
        const long long idx = (((long long)n * p.Nout + j) * p.OH + oy) * p.OW + ox;
        out[idx] = conv_epilogue<T>(acc[e], bias, residual, idx, j, act_code, scale);
    }
}
