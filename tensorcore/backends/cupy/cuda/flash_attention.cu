// Flash attention forward on the tensor cores: out = softmax(q kᵀ · scale) v for 16-bit
// q, k, v, without the Lq x Lk score matrix ever reaching memory.
//
// One block of 4 warps takes 64·M query rows of one (batch, head); each warp owns M tiles
// of 16 rows (M = 2 for narrow heads: each K/V fragment read from shared memory then
// feeds two MMAs).  The block walks the keys KEYS at a time (128 up to head width 80:
// half the per-tile softmax bookkeeping and barriers of 64; 96 where that holds every key,
// as a text encoder's 77 do: a quarter less work than 128): K and V tiles come into shared
// memory with cp.async (the next tile's copy runs under the current tile's math), S = Q Kᵀ
// is computed with mma.sync m16n8k16 into float registers, and the online softmax keeps,
// per row, the running maximum m and sum l in the exp2 domain: P = 2^(S·c - m) with
// c = scale · log2(e), one FMA per score and (float16) one ex2 per pair of scores (exp2_pair: the
// special-function unit, whose rate is about 1/128 of the tensor cores' multiply-adds, is
// what bounds narrow heads).  The pairs are the A fragments of O += P V as they come (the
// m16n8 accumulator layout of two key tiles is the m16k16 A layout); l is summed on the
// tensor cores too, as P times a fragment of ones, from the very P that multiplies V, and
// O and l are rescaled by 2^(m_old - m_new) as the maximum moves.  At the end O / l is
// stored, and, when asked, the row's log-sum-exp m + log2(l) (exp2 domain, scaled scores)
// for a backward pass that recomputes P.  Accumulation is float32.
//
// DV is the head dim (a multiple of 8), D = DV rounded up to 16 the tiles' width in shared
// memory; the columns past the real head dim d are zero-filled there.  A head dim of an
// odd number of 8s (40, 72, ...) ends Q Kᵀ with one m16n8k8 step, and O has DV / 8
// column tiles: no MMA runs on the padding.  Keys past Lk and,
// when causal, keys after the query are set to -inf before the softmax; only the tiles
// that hold such keys pay for the test.  An additive mask (MASKED; any strides over batch, head
// and query, keys contiguous; a padding mask is [B, 1, 1, Lk] broadcast) is added to
// every score as mask / scale, before the maximum; a row whose keys are all -inf gets
// NaN, as the reference softmax gives it.  scale must be > 0 (the maximum is taken over
// unscaled scores).  q, k, v are read through their strides (batch, head, row; the head
// dim is contiguous), which must be multiples of 8 elements with 16-byte aligned bases;
// out is stored as [B, Lq, H, d] (the layout the output projection reads as
// [B, Lq, H·d], so merging the heads back costs no copy).
#include "flash_attention.cuh"

template <typename T, int DV, int M, int KEYS, bool MASKED>
__global__ void __launch_bounds__(FA_WARPS * 32)
flash_attention_fwd_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                           T* __restrict__ out, float* __restrict__ lse, int heads, int lq, int lk, int d,
                           float scale_log2, int causal, long long qb, long long qh, long long ql,
                           long long kb, long long kh, long long kl, long long vb, long long vh, long long vl,
                           const T* __restrict__ mask, long long mb, long long mh, long long mq,
                           float mask_scale) {
    constexpr int D = (DV + 15) / 16 * 16;   // tile width in shared memory
    constexpr int ROWS = FA_WARPS * 16 * M;  // query rows per block
    constexpr int KSTEPS = DV / 16;          // k16 steps over the head dim
    constexpr bool K8 = DV % 16 != 0;        // and one k8 step after them
    constexpr int NT = KEYS / 8;             // 8-key tiles of S per row tile
    constexpr int OT = DV / 8;               // 8-column tiles of O per row tile
    constexpr int KV_TILE = KEYS * (D + 8);
    static_assert(KEYS % 16 == 0 && (!K8 || NT % 4 == 0), "whole k16 steps of P, k8 steps of four key tiles");
    extern __shared__ __align__(16) unsigned short smem[];
    const unsigned s_q = smem_addr(smem), s_k = s_q + ROWS * (D + 8) * 2, s_v = s_k + 2 * KV_TILE * 2;

    const int bh = blockIdx.y, b = bh / heads, h = bh % heads;
    const int row0 = blockIdx.x * ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4, quad = lane / 8;
    const int warp_row0 = row0 + warp * 16 * M;  // the warp's first query row
    const unsigned short* qp = (const unsigned short*)q + b * qb + h * qh + row0 * ql;
    const unsigned short* kp = (const unsigned short*)k + b * kb + h * kh;
    const unsigned short* vp = (const unsigned short*)v + b * vb + h * vh;
    const T* mp = MASKED ? mask + b * mb + h * mh : nullptr;

    const int last_key = causal ? min(lk, row0 + ROWS) : lk;  // keys any row of the block sees
    const int tiles = (last_key + KEYS - 1) / KEYS;
    load_tile<ROWS, D>(s_q, qp, ql, lq - row0, d);
    load_tile<KEYS, D>(s_k, kp, kl, lk, d);
    load_tile<KEYS, D>(s_v, vp, vl, lk, d);
    cp_async_commit();

    unsigned qa[M][KSTEPS][4], qa8[M][2];
    float o[M][OT][4];
    float l[M][4];  // row sums: [0], [1] row g of the tile, [2], [3] row g + 8 (pairs equal)
    float m[M][2];  // running maxima of rows g and g + 8
    const unsigned ones[2] = {ones_pair(T()), ones_pair(T())};
#pragma unroll
    for (int mi = 0; mi < M; ++mi) {
#pragma unroll
        for (int j = 0; j < OT; ++j) o[mi][j][0] = o[mi][j][1] = o[mi][j][2] = o[mi][j][3] = 0.f;
        l[mi][0] = l[mi][1] = l[mi][2] = l[mi][3] = 0.f;
        m[mi][0] = m[mi][1] = neg_inf<float>();
    }

    for (int tile = 0; tile < tiles; ++tile) {
        const int stage = tile & 1;
        if (tile + 1 < tiles) {  // the next tile's copy runs under this tile's math
            const int next = (tile + 1) * KEYS;
            load_tile<KEYS, D>(s_k + (stage ^ 1) * KV_TILE * 2, kp + next * kl, kl, lk - next, d);
            load_tile<KEYS, D>(s_v + (stage ^ 1) * KV_TILE * 2, vp + next * vl, vl, lk - next, d);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (tile == 0) {
#pragma unroll
            for (int mi = 0; mi < M; ++mi) {
                const int r = warp * 16 * M + mi * 16 + (quad % 2) * 8 + lane % 8;
#pragma unroll
                for (int ks = 0; ks < KSTEPS; ++ks)
                    ldsm_x4(qa[mi][ks], s_q + (r * (D + 8) + ks * 16 + (quad / 2) * 8) * 2);
                if (K8) ldsm_x2(qa8[mi], s_q + (r * (D + 8) + KSTEPS * 16) * 2);
            }
        }
        const unsigned ks_base = s_k + stage * KV_TILE * 2, vs_base = s_v + stage * KV_TILE * 2;

        float s[M][NT][4];
#pragma unroll
        for (int mi = 0; mi < M; ++mi)
#pragma unroll
            for (int j = 0; j < NT; ++j) s[mi][j][0] = s[mi][j][1] = s[mi][j][2] = s[mi][j][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                const int key = j * 8 + (quad / 2) * 8 + lane % 8, c = ks * 16 + (quad % 2) * 8;
                unsigned kb4[4];
                ldsm_x4(kb4, ks_base + (key * (D + 8) + c) * 2);
                const unsigned b0[2] = {kb4[0], kb4[1]}, b1[2] = {kb4[2], kb4[3]};
#pragma unroll
                for (int mi = 0; mi < M; ++mi) {
                    Mma<T>::run(s[mi][j], qa[mi][ks], b0);
                    Mma<T>::run(s[mi][j + 1], qa[mi][ks], b1);
                }
            }
        }
        if (K8) {  // the last 8 columns of the head dim: four key tiles per ldmatrix
#pragma unroll
            for (int j = 0; j < NT; j += 4) {
                unsigned kb4[4];
                ldsm_x4(kb4, ks_base + ((j * 8 + quad * 8 + lane % 8) * (D + 8) + KSTEPS * 16) * 2);
#pragma unroll
                for (int mi = 0; mi < M; ++mi)
#pragma unroll
                    for (int e = 0; e < 4; ++e) mma_k8(s[mi][j + e], qa8[mi][0], qa8[mi][1], kb4[e], T());
            }
        }

        const int key0 = tile * KEYS;
        if (MASKED) {  // S + mask / scale: softmax(S·scale + mask) in the scores' own units
#pragma unroll
            for (int mi = 0; mi < M; ++mi)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = warp_row0 + mi * 16 + g + (e >> 1) * 8;
#pragma unroll
                    for (int j = 0; j < NT; ++j) {
                        const int key = key0 + j * 8 + 2 * t + (e & 1);
                        if (row < lq && key < lk) s[mi][j][e] += load_acc(mp[row * mq + key]) * mask_scale;
                    }
                }
        }

        // hide keys past lk and, when causal, keys after the row: only edge tiles hold them
        if (key0 + KEYS > lk || (causal && key0 + KEYS - 1 > warp_row0)) {
#pragma unroll
            for (int mi = 0; mi < M; ++mi)
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = key0 + j * 8 + 2 * t + (e & 1);
                        const int row = warp_row0 + mi * 16 + g + (e >> 1) * 8;
                        if (key >= lk || (causal && key > row)) s[mi][j][e] = neg_inf<float>();
                    }
        }

        // online softmax: new maxima (scaled), then O and l rescaled
        float base[M][2];
#pragma unroll
        for (int mi = 0; mi < M; ++mi) {
            float max0 = s[mi][0][0], max1 = s[mi][0][2];
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                max0 = fmaxf(max0, fmaxf(s[mi][j][0], s[mi][j][1]));
                max1 = fmaxf(max1, fmaxf(s[mi][j][2], s[mi][j][3]));
            }
            max0 = fmaxf(m[mi][0], quad_max(max0) * scale_log2);
            max1 = fmaxf(m[mi][1], quad_max(max1) * scale_log2);
            // rows that have seen no key yet keep a -inf maximum: subtract 0 instead
            base[mi][0] = max0 == neg_inf<float>() ? 0.f : max0;
            base[mi][1] = max1 == neg_inf<float>() ? 0.f : max1;
            const float alpha0 = fast_exp2(m[mi][0] - base[mi][0]), alpha1 = fast_exp2(m[mi][1] - base[mi][1]);
            m[mi][0] = max0;
            m[mi][1] = max1;
            l[mi][0] *= alpha0; l[mi][1] *= alpha0;
            l[mi][2] *= alpha1; l[mi][3] *= alpha1;
#pragma unroll
            for (int j = 0; j < OT; ++j) {
                o[mi][j][0] *= alpha0; o[mi][j][1] *= alpha0;
                o[mi][j][2] *= alpha1; o[mi][j][3] *= alpha1;
            }
        }

        // O += P V and l += P 1: P = 2^(S·c - m) of key tiles 2kk, 2kk+1 is the A fragment of k-step kk
#pragma unroll
        for (int kk = 0; kk < KEYS / 16; ++kk) {
            unsigned pa[M][4];
#pragma unroll
            for (int mi = 0; mi < M; ++mi) {
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const float* s0 = s[mi][2 * kk + half];
                    pa[mi][2 * half] = exp2_pair(fmaf(s0[0], scale_log2, -base[mi][0]),
                                                 fmaf(s0[1], scale_log2, -base[mi][0]), T());
                    pa[mi][2 * half + 1] = exp2_pair(fmaf(s0[2], scale_log2, -base[mi][1]),
                                                     fmaf(s0[3], scale_log2, -base[mi][1]), T());
                }
                Mma<T>::run(l[mi], pa[mi], ones);
            }
#pragma unroll
            for (int j = 0; j < OT; j += 2) {
                const int key = kk * 16 + (quad % 2) * 8 + lane % 8, c = j * 8 + (quad / 2) * 8;
                unsigned vb4[4];
                ldsm_x4_t(vb4, vs_base + (key * (D + 8) + c) * 2);
                const unsigned b0[2] = {vb4[0], vb4[1]}, b1[2] = {vb4[2], vb4[3]};
#pragma unroll
                for (int mi = 0; mi < M; ++mi) {
                    Mma<T>::run(o[mi][j], pa[mi], b0);
                    if (j + 1 < OT) Mma<T>::run(o[mi][j + 1], pa[mi], b1);
                }
            }
        }
        __syncthreads();  // every warp is done with this stage before it is refilled
    }
    cp_async_wait<0>();

    const long long out_row = (long long)heads * d;  // [B, Lq, H, d]
    T* op = out + (long long)b * lq * out_row + (long long)h * d;
#pragma unroll
    for (int mi = 0; mi < M; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float sum = l[mi][2 * half];
            // no key seen: only a mask of -inf does that; NaN then, as the reference's softmax
            const float inv = sum > 0.f ? 1.f / sum : __int_as_float(0x7fc00000);
            const int row = warp_row0 + mi * 16 + g + half * 8;
            if (row >= lq) continue;
            if (lse != nullptr && t == 0) lse[(long long)bh * lq + row] = m[mi][half] + __log2f(sum);
#pragma unroll
            for (int j = 0; j < OT; ++j) {
                const int c = j * 8 + 2 * t;
                if (c < d)
                    *(unsigned*)(op + row * out_row + c) =
                        pack_pair(o[mi][j][2 * half] * inv, o[mi][j][2 * half + 1] * inv, T());
            }
        }
}
