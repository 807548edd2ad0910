// Flash attention forward on the tensor cores: out = softmax(q kᵀ · scale) v for 16-bit
// q, k, v, without the Lq x Lk score matrix ever reaching memory.
//
// One block of 4 warps takes 64 query rows of one (batch, head); each warp owns 16 rows.
// The block walks the keys 64 at a time: K and V tiles come into shared memory with
// cp.async (the next tile's copy runs under the current tile's math), S = Q Kᵀ is
// computed with mma.sync m16n8k16 into float registers, and the online softmax keeps,
// per row, the running maximum m and sum l (in the exp2 domain, scale · log2(e) folded
// in): P = exp2(S - m) goes from the S accumulators straight into the A fragments of
// O += P V (the m16n8 accumulator layout of two key tiles is the m16k16 A layout), and
// O is rescaled by exp2(m_old - m_new) whenever the maximum moves.  At the end O / l is
// stored.  Accumulation is float32 throughout.
//
// D is the head dim rounded up to a multiple of 16 (48 for 40); the columns past the real
// head dim d are zero-filled in shared memory, so they add nothing.  Keys past Lk (the
// last tile) and, when causal, keys after the query are set to -inf before the softmax.
// q, k, v are read through their strides (batch, head, row; the head dim is contiguous),
// which must be multiples of 8 elements with 16-byte aligned bases; out is stored as
// [B, Lq, H, d] (the layout the output projection reads as [B, Lq, H·d], so merging the
// heads back costs no copy).
#include "common.cuh"
#include "tensor_core.cuh"

#define FA_ROWS 64   // query rows per block
#define FA_KEYS 64   // keys per tile
#define FA_WARPS 4

// 16-byte chunks of a [rows, D] tile (row stride D + 8 halves in shared memory) from a
// strided [rows, d] source; chunks past d or rows past `valid` are zero-filled.
template <int D>
__device__ __forceinline__ void load_tile(unsigned smem, const unsigned short* src, long long row_stride,
                                          int valid, int d) {
    constexpr int CHUNKS = D / 8;
    for (int c = threadIdx.x; c < FA_ROWS * CHUNKS; c += FA_WARPS * 32) {
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

template <typename T, int D>
__global__ void __launch_bounds__(FA_WARPS * 32)
flash_attention_fwd_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                           T* __restrict__ out, int heads, int lq, int lk, int d, float scale_log2,
                           int causal, long long qb, long long qh, long long ql, long long kb, long long kh,
                           long long kl, long long vb, long long vh, long long vl) {
    constexpr int KSTEPS = D / 16;       // mma k-steps over the head dim
    constexpr int NT = FA_KEYS / 8;      // 8-key tiles of S per warp
    constexpr int OT = D / 8;            // 8-column tiles of O per warp
    constexpr int TILE = FA_ROWS * (D + 8);
    extern __shared__ __align__(16) unsigned short smem[];
    const unsigned s_q = smem_addr(smem), s_k = s_q + TILE * 2, s_v = s_k + 2 * TILE * 2;  // K, V: 2 stages each

    const int bh = blockIdx.y, b = bh / heads, h = bh % heads;
    const int row0 = blockIdx.x * FA_ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned short* qp = (const unsigned short*)q + b * qb + h * qh + row0 * ql;
    const unsigned short* kp = (const unsigned short*)k + b * kb + h * kh;
    const unsigned short* vp = (const unsigned short*)v + b * vb + h * vh;

    const int last_key = causal ? min(lk, row0 + FA_ROWS) : lk;  // keys any row of the block sees
    const int tiles = (last_key + FA_KEYS - 1) / FA_KEYS;
    load_tile<D>(s_q, qp, ql, lq - row0, d);
    load_tile<D>(s_k, kp, kl, lk, d);
    load_tile<D>(s_v, vp, vl, lk, d);
    cp_async_commit();

    unsigned qa[KSTEPS][4];
    float o[OT][4];
#pragma unroll
    for (int j = 0; j < OT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m0 = neg_inf<float>(), m1 = neg_inf<float>(), l0 = 0.f, l1 = 0.f;  // rows lane/4 and lane/4 + 8
    const int g = lane / 4, t = lane % 4;
    const int my_row0 = row0 + warp * 16 + g, my_row1 = my_row0 + 8;

    for (int tile = 0; tile < tiles; ++tile) {
        const int stage = tile & 1;
        if (tile + 1 < tiles) {  // the next tile's copy runs under this tile's math
            const int next = (tile + 1) * FA_KEYS;
            load_tile<D>(s_k + (stage ^ 1) * TILE * 2, kp + next * kl, kl, lk - next, d);
            load_tile<D>(s_v + (stage ^ 1) * TILE * 2, vp + next * vl, vl, lk - next, d);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (tile == 0) {
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ++ks) {
                const int quad = lane / 8;
                const int r = warp * 16 + (quad % 2) * 8 + lane % 8, c = ks * 16 + (quad / 2) * 8;
                ldsm_x4(qa[ks], s_q + (r * (D + 8) + c) * 2);
            }
        }
        const unsigned ks_base = s_k + stage * TILE * 2, vs_base = s_v + stage * TILE * 2;

        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                const int quad = lane / 8;
                const int key = j * 8 + (quad / 2) * 8 + lane % 8, c = ks * 16 + (quad % 2) * 8;
                unsigned kb4[4];
                ldsm_x4(kb4, ks_base + (key * (D + 8) + c) * 2);
                const unsigned b0[2] = {kb4[0], kb4[1]}, b1[2] = {kb4[2], kb4[3]};
                Mma<T>::run(s[j], qa[ks], b0);
                Mma<T>::run(s[j + 1], qa[ks], b1);
            }
        }

        // mask keys past lk and, when causal, keys after the row; the new row maxima
        const int key0 = tile * FA_KEYS;
        float max0 = m0, max1 = m1;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = key0 + j * 8 + 2 * t + (e & 1);
                const int row = e < 2 ? my_row0 : my_row1;
                const bool hidden = key >= lk || (causal && key > row);
                s[j][e] = hidden ? neg_inf<float>() : s[j][e] * scale_log2;
            }
            max0 = fmaxf(max0, fmaxf(s[j][0], s[j][1]));
            max1 = fmaxf(max1, fmaxf(s[j][2], s[j][3]));
        }
#pragma unroll
        for (int offset = 1; offset < 4; offset <<= 1) {
            max0 = fmaxf(max0, __shfl_xor_sync(0xffffffffu, max0, offset));
            max1 = fmaxf(max1, __shfl_xor_sync(0xffffffffu, max1, offset));
        }
        // rows that have seen no key yet keep a -inf maximum: subtract 0 instead
        const float base0 = max0 == neg_inf<float>() ? 0.f : max0, base1 = max1 == neg_inf<float>() ? 0.f : max1;
        const float alpha0 = exp2f(m0 - base0), alpha1 = exp2f(m1 - base1);
        m0 = max0;
        m1 = max1;
        l0 *= alpha0;
        l1 *= alpha1;
#pragma unroll
        for (int j = 0; j < OT; ++j) {
            o[j][0] *= alpha0; o[j][1] *= alpha0;
            o[j][2] *= alpha1; o[j][3] *= alpha1;
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            s[j][0] = exp2f(s[j][0] - base0); s[j][1] = exp2f(s[j][1] - base0);
            s[j][2] = exp2f(s[j][2] - base1); s[j][3] = exp2f(s[j][3] - base1);
            l0 += s[j][0] + s[j][1];
            l1 += s[j][2] + s[j][3];
        }

        // O += P V: P's accumulators of key tiles 2kk, 2kk+1 are the A fragment of k-step kk
#pragma unroll
        for (int kk = 0; kk < FA_KEYS / 16; ++kk) {
            const unsigned pa[4] = {pack_pair(s[2 * kk][0], s[2 * kk][1], T()),
                                    pack_pair(s[2 * kk][2], s[2 * kk][3], T()),
                                    pack_pair(s[2 * kk + 1][0], s[2 * kk + 1][1], T()),
                                    pack_pair(s[2 * kk + 1][2], s[2 * kk + 1][3], T())};
#pragma unroll
            for (int j = 0; j < OT; j += 2) {
                const int quad = lane / 8;
                const int key = kk * 16 + (quad % 2) * 8 + lane % 8, c = j * 8 + (quad / 2) * 8;
                unsigned vb4[4];
                ldsm_x4_t(vb4, vs_base + (key * (D + 8) + c) * 2);
                const unsigned b0[2] = {vb4[0], vb4[1]}, b1[2] = {vb4[2], vb4[3]};
                Mma<T>::run(o[j], pa, b0);
                if (j + 1 < OT) Mma<T>::run(o[j + 1], pa, b1);
            }
        }
        __syncthreads();  // every warp is done with this stage before it is refilled
    }
    cp_async_wait<0>();

#pragma unroll
    for (int offset = 1; offset < 4; offset <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, offset);
        l1 += __shfl_xor_sync(0xffffffffu, l1, offset);
    }
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
    const long long out_row = (long long)heads * d;  // [B, Lq, H, d]
    T* op = out + (long long)b * lq * out_row + (long long)h * d;
#pragma unroll
    for (int j = 0; j < OT; ++j) {
        const int c = j * 8 + 2 * t;
        if (c >= d) continue;
        if (my_row0 < lq) {
            op[my_row0 * out_row + c] = store_as<T>(o[j][0] * inv0);
            op[my_row0 * out_row + c + 1] = store_as<T>(o[j][1] * inv0);
        }
        if (my_row1 < lq) {
            op[my_row1 * out_row + c] = store_as<T>(o[j][2] * inv1);
            op[my_row1 * out_row + c + 1] = store_as<T>(o[j][3] * inv1);
        }
    }
}
