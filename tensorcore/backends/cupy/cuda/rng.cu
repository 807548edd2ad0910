// Counter-based random numbers (Philox-4x32-10): uniform, normal and integers.
//
// Element k of a call uses the Philox counter (offset + k / E, stream id) under the
// key `seed`, where E values come from one 128-bit block (E = 4 for uniform / normal,
// 2 for 64-bit integers).  `state` is a device buffer {offset, ticket}: every block
// reads the offset, and the last block to finish (ticket counter) advances it by the
// number of counters used.  The host never reads or writes it, so a call can be
// captured in a CUDA graph and every replay draws new numbers.
//
// Bound: memory (10 Philox rounds per 16 bytes are cheap).  Launch: 1-D grid-stride,
// 256 threads, one Philox block per thread per iteration.
#include "common.cuh"

struct U4 { unsigned int x, y, z, w; };

__device__ __forceinline__ U4 philox(unsigned long long ctr, unsigned long long seed) {
    unsigned int c0 = (unsigned int)ctr, c1 = (unsigned int)(ctr >> 32), c2 = 0x2545F491u, c3 = 0;
    unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        unsigned int n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return U4{c0, c1, c2, c3};
}

// Uniform in (0, 1]: never 0, so log() in Box-Muller is finite.
__device__ __forceinline__ double unit(unsigned int u) { return ((double)u + 1.0) * 2.3283064365386963e-10; }

// The last block to finish advances state[0] by `used` counters.
__device__ __forceinline__ void advance_state(unsigned long long* state, unsigned long long used) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        unsigned long long ticket = atomicAdd(state + 1, 1ull);
        if (ticket == gridDim.x - 1) {
            state[0] += used;
            state[1] = 0;
            __threadfence();
        }
    }
}

// kind 0: uniform in [a, b); kind 1: normal with mean a, std b.
template <typename T>
__global__ void rng_float_kernel(T* __restrict__ out, long long n, unsigned long long* state,
                                 unsigned long long seed, long long kind, double a, double b) {
    typedef acc_t<T> A;
    unsigned long long offset = state[0];
    long long blocks = (n + 3) / 4;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < blocks; t += stride) {
        U4 r = philox(offset + (unsigned long long)t, seed);
        double v[4];
        if (kind == 0) {
            v[0] = a + (b - a) * (1.0 - unit(r.x));
            v[1] = a + (b - a) * (1.0 - unit(r.y));
            v[2] = a + (b - a) * (1.0 - unit(r.z));
            v[3] = a + (b - a) * (1.0 - unit(r.w));
        } else {
            double r0 = sqrt(-2.0 * log(unit(r.x))), r1 = sqrt(-2.0 * log(unit(r.z)));
            double t0 = 6.283185307179586 * unit(r.y), t1 = 6.283185307179586 * unit(r.w);
            v[0] = a + b * r0 * cos(t0);
            v[1] = a + b * r0 * sin(t0);
            v[2] = a + b * r1 * cos(t1);
            v[3] = a + b * r1 * sin(t1);
        }
        for (int k = 0; k < 4; ++k) {
            long long i = 4 * t + k;
            if (i < n) out[i] = store_as<T>((A)v[k]);
        }
    }
    advance_state(state, (unsigned long long)blocks);
}

// Integers uniform in [low, low + span) as int64, 64 random bits per value.
__global__ void rng_int_kernel(long long* __restrict__ out, long long n, unsigned long long* state,
                               unsigned long long seed, long long low, unsigned long long span) {
    long long blocks = (n + 1) / 2;
    unsigned long long offset = state[0];
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < blocks; t += stride) {
        U4 r = philox(offset + (unsigned long long)t, seed);
        unsigned long long u0 = ((unsigned long long)r.x << 32) | r.y;
        unsigned long long u1 = ((unsigned long long)r.z << 32) | r.w;
        if (2 * t < n) out[2 * t] = low + (long long)(u0 % span);
        if (2 * t + 1 < n) out[2 * t + 1] = low + (long long)(u1 % span);
    }
    advance_state(state, (unsigned long long)blocks);
}
