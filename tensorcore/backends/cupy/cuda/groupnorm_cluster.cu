// One-pass GroupNorm forward on Hopper (sm_90+): each element is read once and written
// once, so the op moves as many bytes as a copy (planenorm.cu reads x twice).
//
// A thread-block cluster of CLUSTER blocks owns one statistic (n, g), whose cpg * S
// elements are contiguous in NCHW.  Each block loads its share into registers (up to
// GN_PACKS 16-byte packs per thread, the optional per-plane shift added on load),
// reduces it to a partial (count, mean, M2: an exact two-pass over the registers with
// plain block sums), and publishes the partial in its shared memory.
// After a cluster barrier every block reads the CLUSTER partials through distributed
// shared memory, merges them, and writes act(xhat * w[c] + b[c]) from its registers.
// A second barrier, split into its arrive (after the reads) and its wait (after the
// stores), keeps each block's shared memory alive until the others have read it
// without holding back any block's stores.
// The hardware schedules a cluster's blocks together, so the barrier cannot deadlock.
//
// Launch: grid = stats * CLUSTER blocks (1-D), blockDim.x threads with
// blockDim.x * GN_PACKS packs >= the per-block share; the host checks the fit,
// 16-byte alignment and S % pack == 0.  Older GPUs use planenorm.cu.  Registers are
// capped at 40 (six 256-thread blocks per SM; 4 bytes spill), the fastest cap in
// tests/benchmarks/groupnorm_cluster_sweep.py.
#include "common.cuh"

#define CLUSTER 8
#define GN_PACKS 4

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define CLUSTER_DIMS __cluster_dims__(CLUSTER, 1, 1)
#else
#define CLUSTER_DIMS
#endif

// The two halves of the cluster barrier: arrive once this block is done with the
// others' shared memory (release), wait before relying on theirs being done (acquire).
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// The shared-memory address `p` of this block, as seen in block `rank` of the cluster.
__device__ __forceinline__ unsigned int cluster_address(const void* p, unsigned int rank) {
    unsigned int remote = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned long long local;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(local) : "l"(p));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(remote) : "r"((unsigned int)local), "r"(rank));
#endif
    return remote;
}

// One 32-bit word at a cluster shared-memory address; floats and doubles are built from it.
__device__ __forceinline__ unsigned int load_cluster_word(unsigned int address) {
    unsigned int v = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(address));
#endif
    return v;
}

__device__ __forceinline__ float load_cluster(unsigned int address, float) {
    return __uint_as_float(load_cluster_word(address));
}

__device__ __forceinline__ double load_cluster(unsigned int address, double) {
    return __hiloint2double((int)load_cluster_word(address + 4), (int)load_cluster_word(address));
}

template <typename T>
__global__ void CLUSTER_DIMS __launch_bounds__(512, 3)
group_norm_cluster_kernel(const T* __restrict__ x, const T* __restrict__ shift,
                          const T* __restrict__ w,
                          const T* __restrict__ b, T* __restrict__ y,
                          acc_t<T>* __restrict__ mean_out, acc_t<T>* __restrict__ rstd_out,
                          long long stat_len, long long S, long long C, double eps,
                          long long act) {
    typedef acc_t<T> A;
    const int P = Pack<T>::N;
    __shared__ A scratch[96];
    __shared__ A partial[3];
    const long long stat = blockIdx.x / CLUSTER;
    const unsigned int rank = blockIdx.x % CLUSTER;  // == %cluster_ctarank for 1-D clusters
    const long long packs = stat_len / P, share = (packs + CLUSTER - 1) / CLUSTER;
    const long long lo = rank * share, hi = lo + share < packs ? lo + share : packs;
    const long long base = stat * stat_len;
    const Pack<T>* in = reinterpret_cast<const Pack<T>*>(x + base);

    const long long first_plane = shift ? base / S : 0;  // of the statistic, for the shift
    Pack<T> v[GN_PACKS];
    int held = 0;  // packs this thread holds (a prefix of v)
#pragma unroll
    for (int q = 0; q < GN_PACKS; ++q) {
        long long i = lo + threadIdx.x + (long long)q * blockDim.x;
        if (i < hi) {
            v[q] = in[i];
            add_shift(v[q], shift, first_plane + (unsigned int)(i * P) / (unsigned int)S);
            held = q + 1;
        }
    }
    // The block's share: exact two-pass mean and M2 from registers, plain block sums
    const A count = (A)((hi > lo ? hi - lo : 0) * P);
    const A block_mean = count > (A)0 ? block_sum(packs_sum(v, held), scratch) / count : (A)0;
    const A m2 = block_sum(packs_m2(v, held, block_mean), scratch);
    if (threadIdx.x == 0) {
        partial[0] = count;
        partial[1] = block_mean;
        partial[2] = m2;
    }
    cluster_arrive();
    cluster_wait();  // every block's partial is published
    if (threadIdx.x < 32) {
        Welford<A> m{(A)0, (A)0, (A)0};
        if (threadIdx.x < CLUSTER) {
            unsigned int r = threadIdx.x;
            m.n = load_cluster(cluster_address(&partial[0], r), (A)0);
            m.mean = load_cluster(cluster_address(&partial[1], r), (A)0);
            m.m2 = load_cluster(cluster_address(&partial[2], r), (A)0);
        }
        warp_welford(m);
        if (threadIdx.x == 0) {
            scratch[0] = m.mean;
            scratch[1] = m_rsqrt(m.m2 / m.n + (A)eps);
            if (rank == 0) {
                mean_out[stat] = scratch[0];
                rstd_out[stat] = scratch[1];
            }
        }
    }
    cluster_arrive();  // this block has read the partials it needs
    __syncthreads();   // scratch[0..1] visible block-wide

    const A mu = scratch[0], rs = scratch[1];
    Pack<T>* out = reinterpret_cast<Pack<T>*>(y + base);
    // The statistic's first channel, and the channel of each pack from its offset in
    // the statistic, in 32 bits (a group fits a cluster, so every operand does): a 64-bit
    // division costs ~5x more, and every thread of every block pays these.
    const unsigned int plane = (unsigned int)S, cpg = (unsigned int)stat_len / plane;
    const unsigned int first_channel = (unsigned int)stat % ((unsigned int)C / cpg) * cpg;
#pragma unroll
    for (int q = 0; q < GN_PACKS; ++q) {
        if (q < held) {
            long long i = lo + threadIdx.x + (long long)q * blockDim.x;
            unsigned int c = first_channel + (unsigned int)(i * P) / plane;
            A scale = rs * (w ? load_acc(w[c]) : (A)1);
            A beta = (b ? load_acc(b[c]) : (A)0) - mu * scale;
            Pack<T> o;
#pragma unroll
            for (int e = 0; e < P; ++e)
                o.v[e] = store_as<T>(act_fwd((int)act, load_acc(v[q].v[e]) * scale + beta));
            out[i] = o;
        }
    }
    cluster_wait();  // every block has read this block's partial: its shared memory may go
}
