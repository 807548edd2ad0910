// One-wave GroupNorm forward for tensors that fit on chip (registers + shared memory of
// every SM): the whole tensor is loaded at once, reduced, and written once.
//
// The grid is one 1024-thread block per SM, launched cooperatively (all blocks resident
// at once).  Block b owns the contiguous packs [b * chunk, (b + 1) * chunk) of x; thread
// t holds packs b * chunk + t + k * 1024, the first RES_REG_PACKS in registers and the
// rest (at most RES_SHARED_PACKS) in dynamic shared memory, filled by cp.async: every
// load of the tensor is in flight together, and each thread folds its packs into
// running sums as they land, so the arithmetic hides under the loads.
//
// A block's range touches at most RES_STATS statistics (n, g), each contiguous in NCHW.
// The block sums x - K and (x - K)^2 per statistic, K the statistic's first value in the
// block's range (one of its values, so the sums do not cancel; the optional per-plane
// shift is added to every value as it is used, the pivot included), and publishes (mean,
// M2) per statistic in `partials`; after one grid barrier each
// block merges, per statistic it touches, the partials of all blocks that share it
// (fixed order) and writes act(xhat * w[c] + b[c]) from its on-chip copy.
//
// Against the cluster kernel (groupnorm_cluster.cu), which runs ~2.6 waves of
// load-reduce-store blocks of 16 KiB each, this reads the whole tensor, then writes the
// whole tensor, with one barrier in between.  The host checks the fit (chunk <= 1024 *
// the packs a thread holds, chunk * pack <= (RES_STATS - 1) * stat_len), 16-byte
// alignment and S % pack == 0, and passes shared memory for the packs held there.
// With `coef` given the kernel stops after the merge: each statistic's first block
// writes, per channel of the statistic, scale = rstd * w[c] and beta = b[c] - mean * scale
// (coef = [scale | beta], each [N][C]), the very numbers it would normalize with, for a
// consumer that normalizes as it reads x (conv_norm.py); y, mean and rstd are not written.
// Such tensors have fewer than 2^31 elements, so all index arithmetic is 32-bit: a
// 64-bit division costs ~150 instructions, and every thread of the GPU would pay it at
// the same moment here (nothing else runs to hide it).
#include "common.cuh"
#include <cooperative_groups.h>

#define RES_THREADS 1024
#define RES_REG_PACKS 4
#define RES_SHARED_PACKS 13
#define RES_STATS 4

// 16 bytes global -> shared without passing through registers (sm_80+).
__device__ __forceinline__ void copy_async16(void* shared, const void* global) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned int address = (unsigned int)__cvta_generic_to_shared(shared);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(address), "l"(global)
                 : "memory");
#else
    *reinterpret_cast<uint4*>(shared) = *reinterpret_cast<const uint4*>(global);
#endif
}

// Close the current group of cp.async copies; wait until at most `pending` groups are
// in flight.
__device__ __forceinline__ void copy_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// The count must be an immediate: callers pass a constant of an unrolled loop, so the
// switch folds away.  Counts above RES_SHARED_PACKS - 1 wait for more than asked.
#define WAIT_GROUP(N) case N: asm volatile("cp.async.wait_group " #N ";" ::: "memory"); break;
__device__ __forceinline__ void copy_async_wait(int pending) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    switch (pending) {
        WAIT_GROUP(12) WAIT_GROUP(11) WAIT_GROUP(10) WAIT_GROUP(9) WAIT_GROUP(8) WAIT_GROUP(7)
        WAIT_GROUP(6) WAIT_GROUP(5) WAIT_GROUP(4) WAIT_GROUP(3) WAIT_GROUP(2) WAIT_GROUP(1)
        default: asm volatile("cp.async.wait_group 0;" ::: "memory");
    }
#endif
}
#undef WAIT_GROUP

// Sum over the block of N values at once; every thread gets the totals.
template <int N, typename A>
__device__ __forceinline__ void block_sums(A (&v)[N], A* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = warp_sum(v[j]);
    if (lane == 0)
#pragma unroll
        for (int j = 0; j < N; ++j) scratch[j * 32 + warp] = v[j];
    __syncthreads();
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = warp_sum(lane < nwarps ? scratch[j * 32 + lane] : (A)0);
}

// Elements of statistic `stat` inside the pack range [lo, hi).
__device__ __forceinline__ int overlap(int lo, int hi, int stat, int stat_packs, int pack) {
    int a = stat * stat_packs > lo ? stat * stat_packs : lo;
    int b = (stat + 1) * stat_packs < hi ? (stat + 1) * stat_packs : hi;
    return b > a ? (b - a) * pack : 0;
}

template <typename T>
__global__ void __launch_bounds__(RES_THREADS, 1)
group_norm_resident_kernel(const T* __restrict__ x, const T* __restrict__ shift,
                           const T* __restrict__ w,
                           const T* __restrict__ b, T* __restrict__ y,
                           acc_t<T>* __restrict__ mean_out, acc_t<T>* __restrict__ rstd_out,
                           acc_t<T>* __restrict__ partials, acc_t<T>* __restrict__ coef,
                           int packs, int chunk, int stat_len, int S, int C, double eps,
                           int act) {
    typedef acc_t<T> A;
    const int P = Pack<T>::N;
    extern __shared__ uint4 stash_words[];
    Pack<T>* stash = reinterpret_cast<Pack<T>*>(stash_words);
    __shared__ A scratch[2 * RES_STATS * 32];
    __shared__ A mean_rstd[2 * RES_STATS];

    const int lo = blockIdx.x * chunk, hi = lo + chunk < packs ? lo + chunk : packs;
    const int stat_packs = stat_len / P, first = lo / stat_packs;
    const int held = (hi - lo - (int)threadIdx.x + RES_THREADS - 1) / RES_THREADS;  // may be <= 0
    const Pack<T>* in = reinterpret_cast<const Pack<T>*>(x);
    auto index = [&](int k) { return lo + (int)threadIdx.x + k * RES_THREADS; };
    auto stashed = [&](int k) -> Pack<T>& {
        return stash[(k - RES_REG_PACKS) * RES_THREADS + threadIdx.x];
    };

    // Every load at once: register packs plainly, shared-memory packs asynchronously,
    // one cp.async group per pack (empty groups where the thread holds fewer).
    Pack<T> v[RES_REG_PACKS];
#pragma unroll
    for (int k = 0; k < RES_REG_PACKS; ++k)
        if (k < held) v[k] = in[index(k)];
#pragma unroll
    for (int k = RES_REG_PACKS; k < RES_REG_PACKS + RES_SHARED_PACKS; ++k) {
        if (k < held) copy_async16(&stashed(k), &in[index(k)]);
        copy_async_commit();
    }

    // The local index (0..RES_STATS-1) of the statistic of pack i, by comparisons.
    int bound[RES_STATS - 1];
#pragma unroll
    for (int j = 0; j < RES_STATS - 1; ++j) bound[j] = (first + j + 1) * stat_packs;
    auto local_stat = [&](int i) {
        int s = 0;
#pragma unroll
        for (int j = 0; j < RES_STATS - 1; ++j) s += i >= bound[j];
        return s;
    };

    // Sums of x - pivot and (x - pivot)^2 per local statistic, the pivot being the
    // statistic's first value in this block's range (one of its values: no cancellation
    // worth the name).  A thread's packs go through the statistics in order, so each
    // statistic is summed in one run of registers.
    A pivots[RES_STATS], sums[2 * RES_STATS];
#pragma unroll
    for (int j = 0; j < RES_STATS; ++j) {
        const int start = (first + j) * stat_packs > lo ? (first + j) * stat_packs : lo;
        pivots[j] = start < hi ? load_acc(add_shift(x[start * P], shift, start * P / S)) : (A)0;
        sums[j] = sums[RES_STATS + j] = (A)0;
    }
    int at = 0;
    int next = -1;  // first pack of the next statistic: the first pack starts a run
    A pivot = (A)0, s1 = (A)0, s2 = (A)0;
    auto close_run = [&]() {
#pragma unroll
        for (int j = 0; j < RES_STATS; ++j)
            if (j == at) {
                sums[j] += s1;
                sums[RES_STATS + j] += s2;
            }
    };
    auto add = [&](Pack<T> p, int i) {
        add_shift(p, shift, i * P / S);
        if (i >= next) {
            close_run();
            at = local_stat(i);
            next = (first + at + 1) * stat_packs;
            pivot = pivots[0];
#pragma unroll
            for (int j = 1; j < RES_STATS; ++j) pivot = at == j ? pivots[j] : pivot;
            s1 = s2 = (A)0;
        }
#pragma unroll
        for (int e = 0; e < P; ++e) {
            const A d = load_acc(p.v[e]) - pivot;
            s1 += d;
            s2 += d * d;
        }
    };
#pragma unroll
    for (int k = 0; k < RES_REG_PACKS; ++k)
        if (k < held) add(v[k], index(k));
#pragma unroll
    for (int k = RES_REG_PACKS; k < RES_REG_PACKS + RES_SHARED_PACKS; ++k) {
        copy_async_wait(RES_REG_PACKS + RES_SHARED_PACKS - 1 - k);  // pack k has landed
        if (k < held) add(stashed(k), index(k));
    }
    close_run();
    block_sums(sums, scratch);
    if (threadIdx.x == 0)  // this block's (mean, M2) per local statistic
#pragma unroll
        for (int j = 0; j < RES_STATS; ++j) {
            const A count = (A)overlap(lo, hi, first + j, stat_packs, P);
            const A d = count > (A)0 ? sums[j] / count : (A)0;
            partials[(blockIdx.x * RES_STATS + j) * 2] = pivots[j] + d;
            partials[(blockIdx.x * RES_STATS + j) * 2 + 1] = sums[RES_STATS + j] - sums[j] * d;
        }
    cooperative_groups::this_grid().sync();  // every block's partials are published

    // Warp j merges statistic first + j over the blocks whose ranges share it.
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int stat = first + warp;
    if (warp < RES_STATS && overlap(lo, hi, stat, stat_packs, P) > 0) {
        const int b_lo = stat * stat_packs / chunk, b_hi = ((stat + 1) * stat_packs - 1) / chunk;
        Welford<A> total{(A)0, (A)0, (A)0};
        for (int o = b_lo + lane; o <= b_hi; o += 32) {
            const int o_lo = o * chunk, o_hi = o_lo + chunk < packs ? o_lo + chunk : packs;
            const int slot = (o * RES_STATS + stat - o_lo / stat_packs) * 2;
            total.merge((A)overlap(o_lo, o_hi, stat, stat_packs, P), __ldcg(&partials[slot]),
                        __ldcg(&partials[slot + 1]));
        }
        warp_welford(total);
        const A rstd = m_rsqrt(total.m2 / total.n + (A)eps);
        if (lane == 0) {
            mean_rstd[warp] = total.mean;
            mean_rstd[RES_STATS + warp] = rstd;
            if (b_lo == blockIdx.x && !coef) {
                mean_out[stat] = total.mean;
                rstd_out[stat] = rstd;
            }
        }
        if (coef && b_lo == blockIdx.x) {  // the statistic's channels' scale and beta, as below
            // lane 0's merge, which the others' may differ from in the last bit
            const A mean0 = __shfl_sync(0xffffffffu, total.mean, 0);
            const A rstd0 = __shfl_sync(0xffffffffu, rstd, 0);
            const int cpg = stat_len / S, NC = packs * P / S;
            for (int k = lane; k < cpg; k += 32) {
                const int nc = stat * cpg + k, ch = nc % C;
                const A scale = rstd0 * (w ? load_acc(w[ch]) : (A)1);
                coef[nc] = scale;
                coef[NC + nc] = (b ? load_acc(b[ch]) : (A)0) - mean0 * scale;
            }
        }
    }
    if (coef) return;  // coefficients only: the consumer normalizes
    __syncthreads();

    // The channel of this thread's packs, stepped along: no division per pack.
    const int step = RES_THREADS * P, step_offset = step % S, step_channels = step / S % C;
    int offset = (lo + (int)threadIdx.x) * P % S, c = (lo + (int)threadIdx.x) * P / S % C;
    Pack<T>* out = reinterpret_cast<Pack<T>*>(y);
    auto normalize = [&](Pack<T> p, int i) {
        add_shift(p, shift, i * P / S);
        const int at = local_stat(i);
        const A scale = mean_rstd[RES_STATS + at] * (w ? load_acc(w[c]) : (A)1);
        const A beta = (b ? load_acc(b[c]) : (A)0) - mean_rstd[at] * scale;
        Pack<T> o;
#pragma unroll
        for (int e = 0; e < P; ++e)
            o.v[e] = store_as<T>(act_fwd(act, load_acc(p.v[e]) * scale + beta));
        out[i] = o;
        offset += step_offset;
        c += step_channels + (offset >= S);
        offset -= offset >= S ? S : 0;
        c -= c >= C ? C : 0;
    };
#pragma unroll
    for (int k = 0; k < RES_REG_PACKS; ++k)
        if (k < held) normalize(v[k], index(k));
    for (int k = RES_REG_PACKS; k < held; ++k) normalize(stashed(k), index(k));
}
