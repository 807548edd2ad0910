// GroupNorm and BatchNorm on x [N, C, S] (S = the spatial size), forward and
// backward, with an optional fused activation after the affine (GroupNorm + SiLU).
//
// Both norms are statistics over sets of (n, c) planes of S contiguous elements:
//   GroupNorm: stat (n, g) covers planes n*C + g*cpg ... + cpg - 1   (stride 1)
//   BatchNorm: stat c      covers planes c, C + c, ... (N planes)     (stride C)
// GroupNorm may add a per-plane shift [N, C] to x first (add_shift, common.cuh): both
// forward kernels add it to every value they read, BatchNorm passes null.
// Every plane is split into `chunks` chunks so that even [1, 128, 128, 128] with 32
// groups gives thousands of blocks and fills the GPU.
//
// Bound: memory (x is read twice, y written once; the second read mostly hits L2 at
// UNet sizes).  Launch: grid (N*C, chunks), 256 threads per block, one chunk of one
// plane per block, 16-byte packs when S and the chunk length allow, PLANE_BATCH packs
// per thread loaded together so each thread keeps several loads in flight.
//   plane_stats_kernel     Welford partial (count, mean, M2) per (plane, chunk), each
//                          batch of packs reduced from registers (no division per
//                          element); the last block of a stat to finish (an arrival
//                          counter per stat) merges the stat's partials and writes mean /
//                          rstd and, for BatchNorm training, the running stats, then
//                          resets its counter, so the counters are zero after every
//                          launch (capturable in a CUDA graph)
//   plane_coef_kernel      per GroupNorm plane, the scale and beta plane_apply_kernel
//                          applies, for a convolution that normalizes x as it packs it
//   plane_apply_kernel     act(xhat * w[c] + b[c]) from mean / rstd (or, BatchNorm eval,
//                          from the running stats); registers capped for six blocks per
//                          SM (no spills at that cap)
//   plane_bwd_sums_kernel  per (plane, chunk): sum(dy) and sum(dy * xhat), with dy the
//                          gradient through the activation
//   plane_bwd_dx_kernel    merges those sums per stat, writes dx
//   plane_param_grads_kernel  one thread per channel: dw, db from the per-plane sums
#include "common.cuh"

#define PLANE_BATCH 4

struct StatMap {
    long long C, cpg, bn, N;
    // Stat index of plane p, and the first plane / plane stride / plane count of it.
    __device__ __forceinline__ long long stat_of(long long p) const {
        long long n = p / C, c = p - n * C;
        return bn ? c : n * (C / cpg) + c / cpg;
    }
    __device__ __forceinline__ long long first(long long p) const {
        long long n = p / C, c = p - n * C;
        return bn ? c : n * C + (c / cpg) * cpg;
    }
    __device__ __forceinline__ long long step() const { return bn ? C : 1; }
    __device__ __forceinline__ long long count() const { return bn ? N : cpg; }
};

template <typename T>
__device__ __forceinline__ void chunk_range(long long S, long long chunks, long long chunk,
                                            long long& lo, long long& hi) {
    const int P = Pack<T>::N;
    long long len = (S + chunks - 1) / chunks;
    len = (len + P - 1) / P * P;  // chunk boundaries on pack boundaries
    lo = chunk * len;
    hi = lo + len < S ? lo + len : S;
}

// Merge the Welford partials of the stat that plane p belongs to (warp 0 only).  The
// partials come from other blocks: read them from L2 (__ldcg), not a stale L1.
template <typename A>
__device__ __forceinline__ Welford<A> merge_stat(const A* part, const StatMap& map, long long p,
                                                 long long chunks) {
    Welford<A> st{(A)0, (A)0, (A)0};
    long long first = map.first(p), step = map.step(), total = map.count() * chunks;
    for (long long q = threadIdx.x; q < total; q += 32) {
        const A* o = part + ((first + (q / chunks) * step) * chunks + q % chunks) * 3;
        st.merge(__ldcg(o), __ldcg(o + 1), __ldcg(o + 2));
    }
    warp_welford(st);
    return st;
}

template <typename T>
__global__ void plane_stats_kernel(const T* __restrict__ x, const T* __restrict__ shift,
                                   acc_t<T>* __restrict__ part,
                                   acc_t<T>* __restrict__ mean_out,
                                   acc_t<T>* __restrict__ rstd_out, T* __restrict__ running_mean,
                                   T* __restrict__ running_var, unsigned int* arrived,
                                   long long S, long long chunks, long long C, long long cpg,
                                   long long bn, long long N, double eps, double momentum,
                                   long long vec) {
    typedef acc_t<T> A;
    __shared__ A scratch[96];
    __shared__ bool last;
    const int P = Pack<T>::N;
    StatMap map{C, cpg, bn, N};
    long long plane = blockIdx.x, chunk = blockIdx.y, lo, hi;
    chunk_range<T>(S, chunks, chunk, lo, hi);
    const T* xp = x + plane * S;
    Welford<A> st{(A)0, (A)0, (A)0};
    long long j = lo;
    if (vec) {
        const Pack<T>* pk = reinterpret_cast<const Pack<T>*>(xp + lo);
        long long npack = hi > lo ? (hi - lo) / P : 0;
        for (long long i = threadIdx.x; i < npack; i += PLANE_BATCH * blockDim.x) {
            Pack<T> v[PLANE_BATCH];
            int held = 0;  // packs of this batch the thread holds (a prefix of v)
#pragma unroll
            for (int q = 0; q < PLANE_BATCH; ++q)
                if (i + q * blockDim.x < npack) {
                    v[q] = pk[i + q * blockDim.x];
                    add_shift(v[q], shift, plane);
                    held = q + 1;
                }
            A cnt = (A)(held * P), mean = packs_sum(v, held) / cnt;
            st.merge(cnt, mean, packs_m2(v, held, mean));
        }
        j = lo + npack * P;
    }
    for (long long i = j + threadIdx.x; i < hi; i += blockDim.x)
        st.push(load_acc(add_shift(xp[i], shift, plane)));
    block_welford(st, scratch);
    const long long stat = map.stat_of(plane);
    if (threadIdx.x == 0) {
        A* o = part + (plane * chunks + chunk) * 3;
        o[0] = st.n;
        o[1] = st.mean;
        o[2] = st.m2;
        __threadfence();
        last = atomicAdd(&arrived[stat], 1u) == (unsigned int)(map.count() * chunks) - 1u;
    }
    __syncthreads();
    if (!last || threadIdx.x >= 32) return;
    __threadfence();
    Welford<A> m = merge_stat(part, map, plane, chunks);
    if (threadIdx.x == 0) {
        A var = m.m2 / m.n;
        mean_out[stat] = m.mean;
        rstd_out[stat] = m_rsqrt(var + (A)eps);
        A mo = (A)momentum;
        A unbiased = m.n > (A)1 ? m.m2 / (m.n - (A)1) : var;
        if (running_mean)  // BatchNorm: stat == channel
            running_mean[stat] = store_as<T>(((A)1 - mo) * load_acc(running_mean[stat]) + mo * m.mean);
        if (running_var)
            running_var[stat] = store_as<T>(((A)1 - mo) * load_acc(running_var[stat]) + mo * unbiased);
        arrived[stat] = 0u;
    }
}

// The affine map plane c is normalized with: scale = rstd * w[c], beta = b[c] - mean * scale.
template <typename T>
__device__ __forceinline__ void plane_affine(acc_t<T> mu, acc_t<T> rs, const T* __restrict__ w,
                                             const T* __restrict__ b, long long c, acc_t<T>& scale,
                                             acc_t<T>& beta) {
    typedef acc_t<T> A;
    scale = rs * (w ? load_acc(w[c]) : (A)1);
    beta = (b ? load_acc(b[c]) : (A)0) - mu * scale;
}

// coef [2, planes] = the scale and beta plane_apply_kernel normalizes each plane (n, c) of
// a GroupNorm with, for a convolution that applies the norm as it packs x
// (conv_igemm.cu's conv_pack_norm_kernel) and so computes each value as plane_apply_kernel
// does.  One thread per plane, grid-stride.
template <typename T>
__global__ void plane_coef_kernel(const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ rstd,
                                  const T* __restrict__ w, const T* __restrict__ b,
                                  acc_t<T>* __restrict__ coef, long long C, long long cpg,
                                  long long planes) {
    const StatMap map{C, cpg, 0, 0};
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < planes;
         p += (long long)gridDim.x * blockDim.x) {
        const long long stat = map.stat_of(p);
        plane_affine(mean[stat], rstd[stat], w, b, p % C, coef[p], coef[planes + p]);
    }
}

// y = act((x - mean) * rstd * w[c] + b[c]).  With use_running (BatchNorm eval) the
// statistics come from running_mean / running_var instead, and the first block of each
// channel writes them to mean / rstd for the backward.
template <typename T>
__global__ void __launch_bounds__(256, 6) plane_apply_kernel(const T* __restrict__ x,
                                   const T* __restrict__ shift, const T* __restrict__ w,
                                   const T* __restrict__ b, acc_t<T>* __restrict__ mean,
                                   acc_t<T>* __restrict__ rstd, T* __restrict__ y,
                                   const T* __restrict__ running_mean,
                                   const T* __restrict__ running_var, long long S,
                                   long long chunks, long long C, long long cpg, long long bn,
                                   long long N, double eps, long long act, long long use_running,
                                   long long vec) {
    typedef acc_t<T> A;
    const int P = Pack<T>::N;
    StatMap map{C, cpg, bn, N};
    long long plane = blockIdx.x, chunk = blockIdx.y, c = plane % C, lo, hi;
    A mu, rs;
    if (use_running) {
        mu = load_acc(running_mean[c]);
        rs = m_rsqrt(load_acc(running_var[c]) + (A)eps);
        if (chunk == 0 && plane == c && threadIdx.x == 0) {
            mean[c] = mu;
            rstd[c] = rs;
        }
    } else {
        long long stat = map.stat_of(plane);
        mu = mean[stat];
        rs = rstd[stat];
    }
    A scale, beta;
    plane_affine(mu, rs, w, b, c, scale, beta);
    chunk_range<T>(S, chunks, chunk, lo, hi);
    const T* xp = x + plane * S;
    T* yp = y + plane * S;
    long long j = lo;
    if (vec) {
        const Pack<T>* pin = reinterpret_cast<const Pack<T>*>(xp + lo);
        Pack<T>* pout = reinterpret_cast<Pack<T>*>(yp + lo);
        long long npack = hi > lo ? (hi - lo) / P : 0;
        for (long long i = threadIdx.x; i < npack; i += PLANE_BATCH * blockDim.x) {
            Pack<T> v[PLANE_BATCH];
#pragma unroll
            for (int q = 0; q < PLANE_BATCH; ++q)
                if (i + q * blockDim.x < npack) {
                    v[q] = pin[i + q * blockDim.x];
                    add_shift(v[q], shift, plane);
                }
#pragma unroll
            for (int q = 0; q < PLANE_BATCH; ++q)
                if (i + q * blockDim.x < npack) {
#pragma unroll
                    for (int e = 0; e < P; ++e)
                        v[q].v[e] = store_as<T>(act_fwd((int)act, load_acc(v[q].v[e]) * scale + beta));
                    pout[i + q * blockDim.x] = v[q];
                }
        }
        j = lo + npack * P;
    }
    for (long long i = j + threadIdx.x; i < hi; i += blockDim.x)
        yp[i] = store_as<T>(act_fwd((int)act, load_acc(add_shift(xp[i], shift, plane)) * scale + beta));
}

// Gradient through the activation at one element: g * act'(xhat * w + b).
template <typename A>
__device__ __forceinline__ A dy_at(A g, A xhat, A wc, A bc, int act) {
    return act == ACT_NONE ? g : g * act_grad(act, xhat * wc + bc);
}

// sums[(plane * chunks + chunk) * 2 + {0, 1}] = sum(dy), sum(dy * xhat) over the chunk.
template <typename T>
__global__ void plane_bwd_sums_kernel(const T* __restrict__ g, const T* __restrict__ x,
                                      const T* __restrict__ w, const T* __restrict__ b,
                                      const acc_t<T>* __restrict__ mean,
                                      const acc_t<T>* __restrict__ rstd, acc_t<T>* __restrict__ sums,
                                      long long S, long long chunks, long long C, long long cpg,
                                      long long bn, long long N, long long act) {
    typedef acc_t<T> A;
    __shared__ A scratch[32];
    StatMap map{C, cpg, bn, N};
    long long plane = blockIdx.x, chunk = blockIdx.y, c = plane % C, lo, hi;
    long long s = map.stat_of(plane);
    A mu = mean[s], rs = rstd[s];
    A wc = w ? load_acc(w[c]) : (A)1, bc = b ? load_acc(b[c]) : (A)0;
    chunk_range<T>(S, chunks, chunk, lo, hi);
    const T* gp = g + plane * S;
    const T* xp = x + plane * S;
    A s1 = (A)0, s2 = (A)0;
    for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        A xh = (load_acc(xp[i]) - mu) * rs;
        A dy = dy_at(load_acc(gp[i]), xh, wc, bc, (int)act);
        s1 += dy;
        s2 += dy * xh;
    }
    s1 = block_sum(s1, scratch);
    s2 = block_sum(s2, scratch);
    if (threadIdx.x == 0) {
        sums[(plane * chunks + chunk) * 2] = s1;
        sums[(plane * chunks + chunk) * 2 + 1] = s2;
    }
}

// dx = rstd * (dy * w[c] - (S1 + xhat * S2) / M), S1 = sum w_p * sum(dy)_p and
// S2 = sum w_p * sum(dy * xhat)_p over the planes p of the stat, M its element count.
// BatchNorm in eval mode (`frozen`): dx = dy * w[c] * rstd.
template <typename T>
__global__ void plane_bwd_dx_kernel(const T* __restrict__ g, const T* __restrict__ x,
                                    const T* __restrict__ w, const T* __restrict__ b,
                                    const acc_t<T>* __restrict__ mean,
                                    const acc_t<T>* __restrict__ rstd,
                                    const acc_t<T>* __restrict__ sums, T* __restrict__ dx,
                                    long long S, long long chunks, long long C, long long cpg,
                                    long long bn, long long N, long long act, long long frozen) {
    typedef acc_t<T> A;
    __shared__ A coef[2];
    StatMap map{C, cpg, bn, N};
    long long plane = blockIdx.x, chunk = blockIdx.y, c = plane % C, lo, hi;
    long long s = map.stat_of(plane);
    if (threadIdx.x < 32) {
        A s1 = (A)0, s2 = (A)0;
        if (!frozen) {
            long long first = map.first(plane), step = map.step(), total = map.count() * chunks;
            for (long long q = threadIdx.x; q < total; q += 32) {
                long long p = first + (q / chunks) * step;
                A wp = w ? load_acc(w[p % C]) : (A)1;
                const A* o = sums + (p * chunks + q % chunks) * 2;
                s1 += wp * o[0];
                s2 += wp * o[1];
            }
            s1 = warp_sum(s1);
            s2 = warp_sum(s2);
        }
        if (threadIdx.x == 0) {
            A M = (A)(map.count() * S);
            coef[0] = s1 / M;
            coef[1] = s2 / M;
        }
    }
    __syncthreads();
    A mu = mean[s], rs = rstd[s];
    A wc = w ? load_acc(w[c]) : (A)1, bc = b ? load_acc(b[c]) : (A)0;
    A c1 = coef[0], c2 = coef[1];
    chunk_range<T>(S, chunks, chunk, lo, hi);
    const T* gp = g + plane * S;
    const T* xp = x + plane * S;
    T* dp = dx + plane * S;
    for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        A xh = (load_acc(xp[i]) - mu) * rs;
        A dy = dy_at(load_acc(gp[i]), xh, wc, bc, (int)act);
        dp[i] = store_as<T>(rs * (dy * wc - c1 - xh * c2));
    }
}

// dw[c] = sum over n, chunks of sum(dy * xhat); db[c] = sum of sum(dy).
template <typename T>
__global__ void plane_param_grads_kernel(const acc_t<T>* __restrict__ sums, T* __restrict__ dw,
                                         T* __restrict__ db, long long N, long long C,
                                         long long chunks) {
    typedef acc_t<T> A;
    long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    A sw = (A)0, sb = (A)0;
    for (long long n = 0; n < N; ++n)
        for (long long k = 0; k < chunks; ++k) {
            const A* o = sums + ((n * C + c) * chunks + k) * 2;
            sb += o[0];
            sw += o[1];
        }
    if (dw) dw[c] = store_as<T>(sw);
    if (db) db[c] = store_as<T>(sb);
}
