// GroupNorm's statistics alone, as the per-(sample, channel) affine map that a consumer
// applies while it reads x (the convolution pack of conv_igemm.cu): nothing the size of x
// is written.
//
//   group_norm_coef_kernel   for each statistic (n, g), mean and rstd of the
//                            (x + shift[n, c]) of its cpg = C / G channels, then for each
//                            of those channels scale = rstd * w[c] and
//                            beta = b[c] - mean * scale, stored in coef = [scale | beta],
//                            each [N][C].
//
// Grid (chunks, statistics), 256 or 512 threads.  A block loads its chunk of a statistic
// (at most 4 packs per thread, all loads in flight together), reduces an exact two-pass
// (count, mean, M2) from registers and publishes it in `part`.  The last block of a
// statistic to arrive (a counter per statistic in `arrived`, reset by that block, so the
// counters are zero again for the next launch and a captured graph can replay it) merges
// the chunks' partials in a fixed order and writes the statistic's coefficients.
// The shifted value is rounded to T, as the one-pass GroupNorm and an eager add round it.
// With the cluster GroupNorm's split (8 chunks, its thread count) every operation is the
// one that kernel does, in the same order, so the coefficients give its results bit for
// bit (the host launches it so).
// Bound: reading x once; for the small tensors of a batch-1 UNet, the launch latency.
#include "common.cuh"

#define STATS_PACKS 4

template <typename T>
__global__ void __launch_bounds__(512)
group_norm_coef_kernel(const T* __restrict__ x, const T* __restrict__ shift,
                       const T* __restrict__ w, const T* __restrict__ b,
                       acc_t<T>* __restrict__ part, unsigned int* __restrict__ arrived,
                       acc_t<T>* __restrict__ coef, long long stat_len, long long S,
                       long long C, long long NC, double eps) {
    typedef acc_t<T> A;
    const int P = Pack<T>::N;
    __shared__ A scratch[32];
    __shared__ A merged[2];
    __shared__ bool last;
    const long long stat = blockIdx.y, chunks = gridDim.x;
    const long long packs = stat_len / P, share = (packs + chunks - 1) / chunks;
    const long long lo = blockIdx.x * share, hi = lo + share < packs ? lo + share : packs;
    const long long base = stat * stat_len, first_plane = base / S;
    const Pack<T>* in = reinterpret_cast<const Pack<T>*>(x + base);
    Pack<T> v[STATS_PACKS];
    int held = 0;
#pragma unroll
    for (int q = 0; q < STATS_PACKS; ++q) {
        const long long i = lo + threadIdx.x + (long long)q * blockDim.x;
        if (i < hi) {
            v[q] = in[i];
            add_shift(v[q], shift, first_plane + i * P / S);
            held = q + 1;
        }
    }
    const A count = (A)((hi > lo ? hi - lo : 0) * P);
    const A mean = count > (A)0 ? block_sum(packs_sum(v, held), scratch) / count : (A)0;
    const A m2 = block_sum(packs_m2(v, held, mean), scratch);
    if (threadIdx.x == 0) {
        A* p = part + (stat * chunks + blockIdx.x) * 3;
        p[0] = count;
        p[1] = mean;
        p[2] = m2;
        __threadfence();  // the partial is visible before the counter says so
        last = atomicAdd(arrived + stat, 1u) == (unsigned int)(chunks - 1);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x < 32) {
        Welford<A> m{(A)0, (A)0, (A)0};
        for (long long k = threadIdx.x; k < chunks; k += 32) {
            const volatile A* q = part + (stat * chunks + k) * 3;
            m.merge(q[0], q[1], q[2]);
        }
        warp_welford(m);
        if (threadIdx.x == 0) {
            merged[0] = m.mean;
            merged[1] = m_rsqrt(m.m2 / m.n + (A)eps);
            arrived[stat] = 0u;
        }
    }
    __syncthreads();
    const long long cpg = stat_len / S, n_c0 = first_plane;  // plane (n, c) = n * C + c
    for (long long k = threadIdx.x; k < cpg; k += blockDim.x) {
        const long long nc = n_c0 + k, c = nc % C;
        const A scale = merged[1] * (w ? load_acc(w[c]) : (A)1);
        coef[nc] = scale;
        coef[NC + nc] = (b ? load_acc(b[c]) : (A)0) - merged[0] * scale;
    }
}
