// GroupNorm and BatchNorm on x [N, C, S] (S = the spatial size), forward and
// backward, with an optional fused activation after the affine (GroupNorm + SiLU).
//
// Both norms are statistics over sets of (n, c) planes of S contiguous elements:
//   GroupNorm: stat (n, g) covers planes n*C + g*cpg ... + cpg - 1   (stride 1)
//   BatchNorm: stat c      covers planes c, C + c, ... (N planes)     (stride C)
// Every plane is split into `chunks` chunks so that even [1, 128, 128, 128] with 32
// groups gives thousands of blocks and fills the GPU.
//
// Bound: memory.  Launch: grid (N*C, chunks), 256 threads per block, one chunk of one
// plane per block, 16-byte packs when S and the chunk length allow.
//   plane_stats_kernel     Welford partials (count, mean, M2) per (plane, chunk)
//   plane_apply_kernel     warp 0 merges the stat's partials, then the block writes
//                          act(xhat * w[c] + b[c]); one block per stat also writes
//                          mean / rstd and, for BatchNorm training, the running stats
//   plane_bwd_sums_kernel  per (plane, chunk): sum(dy) and sum(dy * xhat), with dy the
//                          gradient through the activation
//   plane_bwd_dx_kernel    merges those sums per stat, writes dx
//   plane_param_grads_kernel  one thread per channel: dw, db from the per-plane sums
// Reading x twice costs one extra pass, mostly served from L2 at these sizes.
#include "common.cuh"

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

template <typename T>
__global__ void plane_stats_kernel(const T* __restrict__ x, acc_t<T>* __restrict__ part,
                                   long long S, long long chunks, long long vec) {
    typedef acc_t<T> A;
    __shared__ A scratch[96];
    const int P = Pack<T>::N;
    long long plane = blockIdx.x, chunk = blockIdx.y, lo, hi;
    chunk_range<T>(S, chunks, chunk, lo, hi);
    const T* xp = x + plane * S;
    Welford<A> st{(A)0, (A)0, (A)0};
    long long j = lo;
    if (vec) {
        const Pack<T>* pk = reinterpret_cast<const Pack<T>*>(xp + lo);
        long long npack = hi > lo ? (hi - lo) / P : 0;
        for (long long i = threadIdx.x; i < npack; i += blockDim.x) {
            Pack<T> p = pk[i];
#pragma unroll
            for (int k = 0; k < P; ++k) st.push(load_acc(p.v[k]));
        }
        j = lo + npack * P;
    }
    for (long long i = j + threadIdx.x; i < hi; i += blockDim.x) st.push(load_acc(xp[i]));
    block_welford(st, scratch);
    if (threadIdx.x == 0) {
        A* o = part + (plane * chunks + chunk) * 3;
        o[0] = st.n;
        o[1] = st.mean;
        o[2] = st.m2;
    }
}

// Merge the Welford partials of the stat that plane p belongs to (warp 0 only).
template <typename A>
__device__ __forceinline__ Welford<A> merge_stat(const A* part, const StatMap& map, long long p,
                                                 long long chunks) {
    Welford<A> st{(A)0, (A)0, (A)0};
    long long first = map.first(p), step = map.step(), total = map.count() * chunks;
    for (long long q = threadIdx.x; q < total; q += 32) {
        const A* o = part + ((first + (q / chunks) * step) * chunks + q % chunks) * 3;
        st.merge(o[0], o[1], o[2]);
    }
    warp_welford(st);
    return st;
}

// y = act((x - mean) * rstd * w[c] + b[c]).  With use_running (BatchNorm eval) the
// statistics come from running_mean / running_var instead of the partials.
template <typename T>
__global__ void plane_apply_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                   const T* __restrict__ b, const acc_t<T>* __restrict__ part,
                                   T* __restrict__ y, acc_t<T>* __restrict__ mean_out,
                                   acc_t<T>* __restrict__ rstd_out, T* __restrict__ running_mean,
                                   T* __restrict__ running_var, long long S, long long chunks,
                                   long long C, long long cpg, long long bn, long long N,
                                   double eps, double momentum, long long act,
                                   long long use_running, long long vec) {
    typedef acc_t<T> A;
    __shared__ A stat[2];
    const int P = Pack<T>::N;
    StatMap map{C, cpg, bn, N};
    long long plane = blockIdx.x, chunk = blockIdx.y, c = plane % C, lo, hi;
    bool writer = chunk == 0 && plane == map.first(plane);
    if (threadIdx.x < 32) {
        A mu, rs;
        if (use_running) {
            mu = load_acc(running_mean[c]);
            rs = m_rsqrt(load_acc(running_var[c]) + (A)eps);
        } else {
            Welford<A> st = merge_stat(part, map, plane, chunks);
            mu = st.mean;
            A var = st.m2 / st.n;
            rs = m_rsqrt(var + (A)eps);
            if (writer && threadIdx.x == 0) {
                A mo = (A)momentum;
                A unbiased = st.n > (A)1 ? st.m2 / (st.n - (A)1) : var;
                if (running_mean)
                    running_mean[c] = store_as<T>(((A)1 - mo) * load_acc(running_mean[c]) + mo * mu);
                if (running_var)
                    running_var[c] = store_as<T>(((A)1 - mo) * load_acc(running_var[c]) + mo * unbiased);
            }
        }
        if (threadIdx.x == 0) {
            stat[0] = mu;
            stat[1] = rs;
            if (writer) {
                mean_out[map.stat_of(plane)] = mu;
                rstd_out[map.stat_of(plane)] = rs;
            }
        }
    }
    __syncthreads();
    A scale = stat[1] * (w ? load_acc(w[c]) : (A)1);
    A shift = (b ? load_acc(b[c]) : (A)0) - stat[0] * scale;
    chunk_range<T>(S, chunks, chunk, lo, hi);
    const T* xp = x + plane * S;
    T* yp = y + plane * S;
    long long j = lo;
    if (vec) {
        const Pack<T>* pin = reinterpret_cast<const Pack<T>*>(xp + lo);
        Pack<T>* pout = reinterpret_cast<Pack<T>*>(yp + lo);
        long long npack = hi > lo ? (hi - lo) / P : 0;
        for (long long i = threadIdx.x; i < npack; i += blockDim.x) {
            Pack<T> p = pin[i];
#pragma unroll
            for (int k = 0; k < P; ++k)
                p.v[k] = store_as<T>(act_fwd((int)act, load_acc(p.v[k]) * scale + shift));
            pout[i] = p;
        }
        j = lo + npack * P;
    }
    for (long long i = j + threadIdx.x; i < hi; i += blockDim.x)
        yp[i] = store_as<T>(act_fwd((int)act, load_acc(xp[i]) * scale + shift));
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
