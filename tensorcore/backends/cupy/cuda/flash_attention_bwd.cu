// Flash attention backward on the tensor cores: dq, dk, dv of out = softmax(q kᵀ · scale) v
// for 16-bit q, k, v, recomputing the probabilities from the forward's log-sum-exp
// instead of reading a saved Lq x Lk matrix.
//
// With c = scale · log2(e), lse the forward's per-row log2 Σ 2^(S·c) and
// delta_i = Σ_c dout_ic · out_ic (flash_attention_bwd_dot_kernel):
//   P = 2^(S·c - lse),  dV = Pᵀ dout,  dP = dout Vᵀ,  dS = P ∘ (dP - delta),
//   dQ = scale · dS K,  dK = scale · dSᵀ Q.
// One block of 4 warps owns 64 keys of one (batch, head), 16 per warp, and walks the
// queries 64 at a time (Q, dout, lse and delta tiles double-buffered, the next one loading
// under the current one's math).  Each warp computes its keys' rows of Sᵀ = K Qᵀ and
// dPᵀ = V doutᵀ with mma.sync, turns them into Pᵀ and dSᵀ in registers and accumulates
// dV += Pᵀ dout and dK += dSᵀ Q in float32 registers (the accumulators of two 8-query
// tiles are the A fragment of one 16-query k-step, as in the forward).  dQ needs every
// key: the block's dSᵀ goes to shared memory as 16-bit, each warp multiplies 16 query
// rows of it by K and adds the result into a float32 dq buffer with atomics; a last
// kernel (flash_attention_bwd_dq_kernel) rounds that buffer to the storage type.
// Hidden keys (causal: key > query) get P = 0; query rows past Lq and key rows past Lk
// are zero-filled and add nothing.  Tensor layouts and strides as in the forward.
#include "flash_attention.cuh"

// delta[row] = Σ_c dout[row, c] · out[row, c] over rows (b, h, i): one warp per row.
template <typename T>
__global__ void flash_attention_bwd_dot_kernel(const T* __restrict__ out, const T* __restrict__ dout,
                                               float* __restrict__ delta, long long rows, int heads, int lq,
                                               int d, long long ob, long long oh, long long ol, long long gb,
                                               long long gh, long long gl) {
    const long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= rows) return;
    const int lane = threadIdx.x % 32, i = (int)(row % lq);
    const long long bh = row / lq, b = bh / heads, h = bh % heads;
    const T* op = out + b * ob + h * oh + i * ol;
    const T* gp = dout + b * gb + h * gh + i * gl;
    float acc = 0.f;
    for (int c = lane; c < d; c += 32) acc += load_acc(op[c]) * load_acc(gp[c]);
    for (int offset = 16; offset > 0; offset >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    if (lane == 0) delta[row] = acc;
}

// dq = acc rounded to the storage type (both [B, H, Lq, d], dense).
template <typename T>
__global__ void flash_attention_bwd_dq_kernel(const float* __restrict__ acc, T* __restrict__ dq, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dq[i] = store_as<T>(acc[i]);
}

template <typename T, int D>
__global__ void __launch_bounds__(FA_WARPS * 32)
flash_attention_bwd_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                           const T* __restrict__ dout, const float* __restrict__ lse,
                           const float* __restrict__ delta, float* __restrict__ dq_acc, T* __restrict__ dk,
                           T* __restrict__ dv, int heads, int lq, int lk, int d, float scale_log2, float scale,
                           int causal, long long qb, long long qh, long long ql, long long kb, long long kh,
                           long long kl, long long vb, long long vh, long long vl, long long gb, long long gh,
                           long long gl) {
    constexpr int QROWS = 64;                 // queries per tile
    constexpr int KSTEPS = D / 16;            // mma k-steps over the head dim
    constexpr int NT = QROWS / 8;             // 8-query tiles of Sᵀ per warp
    constexpr int OT = D / 8;                 // 8-column tiles of dK, dV, dQ
    constexpr int TILE = 64 * (D + 8);        // one padded [64, D] tile, in halves
    constexpr int DS_STRIDE = QROWS + 8;      // dSᵀ [key][query] row stride, in halves
    extern __shared__ __align__(16) unsigned short smem[];
    const unsigned s_k = smem_addr(smem), s_v = s_k + TILE * 2, s_q = s_v + TILE * 2;
    const unsigned s_g = s_q + 2 * TILE * 2, s_ds = s_g + 2 * TILE * 2;  // Q, dout: 2 stages each
    float* rows_lse = (float*)(smem + 6 * TILE + FA_KEYS * DS_STRIDE);  // [2 stages][lse 64 | delta 64]

    const int bh = blockIdx.y, b = bh / heads, h = bh % heads;
    const int key0 = blockIdx.x * FA_KEYS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4, quad = lane / 8;
    const int warp_key0 = key0 + warp * 16;
    const unsigned short* qp = (const unsigned short*)q + b * qb + h * qh;
    const unsigned short* gp = (const unsigned short*)dout + b * gb + h * gh;
    const float* lse_bh = lse + (long long)bh * lq;
    const float* delta_bh = delta + (long long)bh * lq;

    const int first = causal ? key0 / QROWS : 0;  // causal: earlier queries see none of these keys
    const int tiles = (lq + QROWS - 1) / QROWS;
    load_tile<FA_KEYS, D>(s_k, (const unsigned short*)k + b * kb + h * kh + key0 * kl, kl, lk - key0, d);
    load_tile<FA_KEYS, D>(s_v, (const unsigned short*)v + b * vb + h * vh + key0 * vl, vl, lk - key0, d);
    if (first < tiles) {
        const int q0 = first * QROWS;
        load_tile<QROWS, D>(s_q, qp + q0 * ql, ql, lq - q0, d);
        load_tile<QROWS, D>(s_g, gp + q0 * gl, gl, lq - q0, d);
        if (threadIdx.x < 2 * QROWS) {  // lse rows, then delta rows (0 past lq: those rows add nothing)
            const int i = threadIdx.x % QROWS;
            rows_lse[threadIdx.x] = q0 + i < lq ? (threadIdx.x < QROWS ? lse_bh : delta_bh)[q0 + i] : 0.f;
        }
    }
    cp_async_commit();

    float dk_acc[OT][4], dv_acc[OT][4];
#pragma unroll
    for (int j = 0; j < OT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk_acc[j][e] = dv_acc[j][e] = 0.f;

    for (int tile = first; tile < tiles; ++tile) {
        const int stage = (tile - first) & 1, q0 = tile * QROWS;
        float next_row = 0.f;  // this thread's lse or delta value of the next tile
        if (tile + 1 < tiles) {
            const int n0 = q0 + QROWS;
            load_tile<QROWS, D>(s_q + (stage ^ 1) * TILE * 2, qp + n0 * ql, ql, lq - n0, d);
            load_tile<QROWS, D>(s_g + (stage ^ 1) * TILE * 2, gp + n0 * gl, gl, lq - n0, d);
            const int i = threadIdx.x % QROWS;
            if (n0 + i < lq) next_row = (threadIdx.x < QROWS ? lse_bh : delta_bh)[n0 + i];
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const unsigned q_base = s_q + stage * TILE * 2, g_base = s_g + stage * TILE * 2;
        const float* s_lse = rows_lse + stage * 2 * QROWS;  // [stage][lse 64 | delta 64]
        const float* s_delta = s_lse + QROWS;

        // Sᵀ = K Qᵀ and dPᵀ = V doutᵀ for the warp's 16 keys x 64 queries
        float s[NT][4], dp[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.f;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
            const int r = warp * 16 + (quad % 2) * 8 + lane % 8, c = ks * 16 + (quad / 2) * 8;
            unsigned ka[4], va[4];
            ldsm_x4(ka, s_k + (r * (D + 8) + c) * 2);
            ldsm_x4(va, s_v + (r * (D + 8) + c) * 2);
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                const int row = j * 8 + (quad / 2) * 8 + lane % 8, col = ks * 16 + (quad % 2) * 8;
                unsigned qb4[4], gb4[4];
                ldsm_x4(qb4, q_base + (row * (D + 8) + col) * 2);
                ldsm_x4(gb4, g_base + (row * (D + 8) + col) * 2);
                const unsigned q0b[2] = {qb4[0], qb4[1]}, q1b[2] = {qb4[2], qb4[3]};
                const unsigned g0b[2] = {gb4[0], gb4[1]}, g1b[2] = {gb4[2], gb4[3]};
                Mma<T>::run(s[j], ka, q0b);
                Mma<T>::run(s[j + 1], ka, q1b);
                Mma<T>::run(dp[j], va, g0b);
                Mma<T>::run(dp[j + 1], va, g1b);
            }
        }

        // Pᵀ = 2^(Sᵀ·c - lse) (0 where hidden) into s, dSᵀ = Pᵀ ∘ (dPᵀ - delta) into dp
        const bool hides = causal && warp_key0 + 15 > q0;
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = j * 8 + 2 * t + (e & 1);
                float p = fast_exp2(fmaf(s[j][e], scale_log2, -s_lse[col]));
                if (hides && warp_key0 + g + (e >> 1) * 8 > q0 + col) p = 0.f;
                s[j][e] = p;
                dp[j][e] = p * (dp[j][e] - s_delta[col]);
            }

        // dV += Pᵀ dout, dK += dSᵀ Q (unscaled; scale applied at the store)
#pragma unroll
        for (int kk = 0; kk < QROWS / 16; ++kk) {
            const unsigned pa[4] = {pack_pair(s[2 * kk][0], s[2 * kk][1], T()), pack_pair(s[2 * kk][2], s[2 * kk][3], T()),
                                    pack_pair(s[2 * kk + 1][0], s[2 * kk + 1][1], T()),
                                    pack_pair(s[2 * kk + 1][2], s[2 * kk + 1][3], T())};
            const unsigned da[4] = {pack_pair(dp[2 * kk][0], dp[2 * kk][1], T()), pack_pair(dp[2 * kk][2], dp[2 * kk][3], T()),
                                    pack_pair(dp[2 * kk + 1][0], dp[2 * kk + 1][1], T()),
                                    pack_pair(dp[2 * kk + 1][2], dp[2 * kk + 1][3], T())};
#pragma unroll
            for (int j = 0; j < OT; j += 2) {
                const int row = kk * 16 + (quad % 2) * 8 + lane % 8, c = j * 8 + (quad / 2) * 8;
                unsigned gb4[4], qb4[4];
                ldsm_x4_t(gb4, g_base + (row * (D + 8) + c) * 2);
                ldsm_x4_t(qb4, q_base + (row * (D + 8) + c) * 2);
                const unsigned g0b[2] = {gb4[0], gb4[1]}, g1b[2] = {gb4[2], gb4[3]};
                const unsigned q0b[2] = {qb4[0], qb4[1]}, q1b[2] = {qb4[2], qb4[3]};
                Mma<T>::run(dv_acc[j], pa, g0b);
                Mma<T>::run(dv_acc[j + 1], pa, g1b);
                Mma<T>::run(dk_acc[j], da, q0b);
                Mma<T>::run(dk_acc[j + 1], da, q1b);
            }
        }

        // dSᵀ of the block to shared memory, then each warp adds dS K for 16 query rows
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int key = warp * 16 + g + half * 8, col = j * 8 + 2 * t;
                asm volatile("st.shared.b32 [%0], %1;" ::"r"(s_ds + (key * DS_STRIDE + col) * 2),
                             "r"(pack_pair(dp[j][2 * half], dp[j][2 * half + 1], T())));
            }
        if (tile + 1 < tiles && threadIdx.x < 2 * QROWS)  // the next tile's lse / delta rows
            rows_lse[(stage ^ 1) * 2 * QROWS + threadIdx.x] = next_row;
        __syncthreads();
        float dq[OT][4];
#pragma unroll
        for (int j = 0; j < OT; ++j) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < FA_KEYS / 16; ++kk) {
            unsigned a[4];  // A = dS (query x key) from dSᵀ [key][query]: a transposed load
            ldsm_x4_t(a, s_ds + ((kk * 16 + (quad / 2) * 8 + lane % 8) * DS_STRIDE + warp * 16 + (quad % 2) * 8) * 2);
#pragma unroll
            for (int j = 0; j < OT; j += 2) {
                const int key = kk * 16 + (quad % 2) * 8 + lane % 8, c = j * 8 + (quad / 2) * 8;
                unsigned kb4[4];
                ldsm_x4_t(kb4, s_k + (key * (D + 8) + c) * 2);
                const unsigned b0[2] = {kb4[0], kb4[1]}, b1[2] = {kb4[2], kb4[3]};
                Mma<T>::run(dq[j], a, b0);
                Mma<T>::run(dq[j + 1], a, b1);
            }
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = q0 + warp * 16 + g + half * 8;
            if (row >= lq) continue;
            float* dst = dq_acc + ((long long)bh * lq + row) * d;
#pragma unroll
            for (int j = 0; j < OT; ++j) {
                const int c = j * 8 + 2 * t;
                if (c < d) {
                    atomicAdd(dst + c, dq[j][2 * half] * scale);
                    atomicAdd(dst + c + 1, dq[j][2 * half + 1] * scale);
                }
            }
        }
        __syncthreads();  // every warp is done with this stage and with dSᵀ before they are refilled
    }
    cp_async_wait<0>();

    // dk, dv [B, H, Lk, d], dense
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int key = warp_key0 + g + half * 8;
        if (key >= lk) continue;
        const long long at = ((long long)bh * lk + key) * d;
#pragma unroll
        for (int j = 0; j < OT; ++j) {
            const int c = j * 8 + 2 * t;
            if (c < d) {
                *(unsigned*)(dk + at + c) = pack_pair(dk_acc[j][2 * half] * scale, dk_acc[j][2 * half + 1] * scale, T());
                *(unsigned*)(dv + at + c) = pack_pair(dv_acc[j][2 * half], dv_acc[j][2 * half + 1], T());
            }
        }
    }
}
