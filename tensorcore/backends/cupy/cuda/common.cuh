// Shared device helpers for every kernel family: storage types, the accumulation
// type, 16-byte packs, activations and warp/block reductions.
//
// The file needs no CUDA headers, so NVRTC (through CuPy) and nvcc compile it the
// same way.  half_t / bf16_t are plain 16-bit storage types converted with PTX;
// arithmetic always runs in acc_t<T> (float for 16-bit types, else T).
#pragma once
#include "opcodes.cuh"

struct half_t { unsigned short bits; };
struct bf16_t { unsigned short bits; };

template <typename T> struct acc_of { typedef T type; };
template <> struct acc_of<half_t> { typedef float type; };
template <> struct acc_of<bf16_t> { typedef float type; };
template <typename T> using acc_t = typename acc_of<T>::type;

__device__ __forceinline__ float load_acc(float v) { return v; }
__device__ __forceinline__ double load_acc(double v) { return v; }
__device__ __forceinline__ float load_acc(half_t v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
}
__device__ __forceinline__ float load_acc(bf16_t v) {
    return __uint_as_float(((unsigned int)v.bits) << 16);
}

template <typename T> __device__ __forceinline__ T store_as(acc_t<T> v);
template <> __device__ __forceinline__ float store_as<float>(float v) { return v; }
template <> __device__ __forceinline__ double store_as<double>(double v) { return v; }
template <> __device__ __forceinline__ half_t store_as<half_t>(float v) {
    half_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(v));
    return h;
}
template <> __device__ __forceinline__ bf16_t store_as<bf16_t>(float v) {
    bf16_t h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(v));
    return h;
}

// A 16-byte pack of T: one vectorised load or store.
template <typename T> struct alignas(16) Pack {
    static const int N = 16 / sizeof(T);
    T v[16 / sizeof(T)];
};

// GroupNorm's fused time-embedding add: x + shift[plane] rounded to T, as the separate
// add kernel stores it, so the statistics see the values an eager add would give.  A
// null shift leaves x as it is.
template <typename T>
__device__ __forceinline__ T add_shift(T v, const T* shift, long long plane) {
    return shift ? store_as<T>(load_acc(v) + load_acc(shift[plane])) : v;
}

template <typename T>
__device__ __forceinline__ void add_shift(Pack<T>& p, const T* shift, long long plane) {
    if (!shift) return;
    const acc_t<T> s = load_acc(shift[plane]);
#pragma unroll
    for (int e = 0; e < Pack<T>::N; ++e) p.v[e] = store_as<T>(load_acc(p.v[e]) + s);
}

// Sum, and sum of squared deviations from `mean`, of the first `held` packs of v: the
// two passes of an exact (count, mean, M2) over values held in registers.  N is a
// compile-time bound, so the loops unroll and v stays in registers.
template <int N, typename T>
__device__ __forceinline__ acc_t<T> packs_sum(const Pack<T> (&v)[N], int held) {
    acc_t<T> s = (acc_t<T>)0;
#pragma unroll
    for (int q = 0; q < N; ++q)
        if (q < held)
#pragma unroll
            for (int e = 0; e < Pack<T>::N; ++e) s += load_acc(v[q].v[e]);
    return s;
}

template <int N, typename T>
__device__ __forceinline__ acc_t<T> packs_m2(const Pack<T> (&v)[N], int held, acc_t<T> mean) {
    acc_t<T> m2 = (acc_t<T>)0;
#pragma unroll
    for (int q = 0; q < N; ++q)
        if (q < held)
#pragma unroll
            for (int e = 0; e < Pack<T>::N; ++e) {
                acc_t<T> d = load_acc(v[q].v[e]) - mean;
                m2 += d * d;
            }
    return m2;
}

// ----- flat index -> coordinates -------------------------------------------------------
// Returns r % d and leaves r / d in r.  With `narrow` (r and d below 2^31, uniform over
// the grid) the division is 32-bit: a 64-bit one costs ~5x more, and kernels that split
// every element's index into coordinates are otherwise bound by it, not by memory.
__device__ __forceinline__ long long divmod_index(long long& r, long long d, bool narrow) {
    if (narrow) {
        const unsigned int u = (unsigned int)r, ud = (unsigned int)d, q = u / ud;
        r = q;
        return u - q * ud;
    }
    const long long q = r / d, m = r - q * d;
    r = q;
    return m;
}

// fn(i, plane, row, col) for every element i of `planes` row-major planes of rows x cols,
// the grid striding over them; the split of i is 32-bit when the total allows.
template <typename Fn>
__device__ __forceinline__ void grid_plane_elements(long long planes, long long rows,
                                                    long long cols, Fn fn) {
    const long long total = planes * rows * cols;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const bool narrow = total < (1LL << 31);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        long long plane = i;
        const long long col = divmod_index(plane, cols, narrow);
        const long long row = divmod_index(plane, rows, narrow);
        fn(i, plane, row, col);
    }
}

// The same for callers whose host keeps the total below 2^31: 32-bit throughout, which
// saves the registers of the 64-bit path.
template <typename Fn>
__device__ __forceinline__ void grid_plane_elements_narrow(long long planes, long long rows,
                                                           long long cols, Fn fn) {
    const unsigned int total = (unsigned int)(planes * rows * cols);
    const unsigned int urows = (unsigned int)rows, ucols = (unsigned int)cols;
    const unsigned int stride = gridDim.x * blockDim.x;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const unsigned int r = i / ucols, plane = r / urows;
        fn(i, plane, r - plane * urows, i - r * ucols);
    }
}

// ----- strided loops over 16-byte packs -------------------------------------------------
// pack_fn(i) for the whole packs i = start, start + stride, ... of n elements when `vec`
// (the caller's pointers are 16-byte aligned), then elem_fn(j) for the elements past the
// last whole pack (every element without `vec`), from `start` with the same stride.
template <typename T, typename PackFn, typename ElemFn>
__device__ __forceinline__ void strided_packs_then_elements(long long n, long long start,
                                                            long long stride, bool vec,
                                                            PackFn pack_fn, ElemFn elem_fn) {
    long long done = 0;
    if (vec) {
        const long long packs = n / Pack<T>::N;
        for (long long i = start; i < packs; i += stride) pack_fn(i);
        done = packs * Pack<T>::N;
    }
    for (long long j = done + start; j < n; j += stride) elem_fn(j);
}

// The whole grid striding over n elements.  One pack per thread per step: with 8 blocks
// of 256 threads per SM that keeps enough bytes in flight (elementwise.cu).
template <typename T, typename PackFn, typename ElemFn>
__device__ __forceinline__ void grid_packs_then_elements(long long n, bool vec, PackFn pack_fn,
                                                         ElemFn elem_fn) {
    strided_packs_then_elements<T>(n, (long long)blockIdx.x * blockDim.x + threadIdx.x,
                                   (long long)gridDim.x * blockDim.x, vec, pack_fn, elem_fn);
}

// ----- math overloads (float and double) -------------------------------------------
__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }
__device__ __forceinline__ float m_log1p(float x) { return log1pf(x); }
__device__ __forceinline__ double m_log1p(double x) { return log1p(x); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float m_rsqrt(float x) { return rsqrtf(x); }
__device__ __forceinline__ double m_rsqrt(double x) { return rsqrt(x); }
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float m_erf(float x) { return erff(x); }
__device__ __forceinline__ double m_erf(double x) { return erf(x); }
__device__ __forceinline__ float m_sin(float x) { return sinf(x); }
__device__ __forceinline__ double m_sin(double x) { return sin(x); }
__device__ __forceinline__ float m_cos(float x) { return cosf(x); }
__device__ __forceinline__ double m_cos(double x) { return cos(x); }
__device__ __forceinline__ float m_floor(float x) { return floorf(x); }
__device__ __forceinline__ double m_floor(double x) { return floor(x); }
__device__ __forceinline__ float m_ceil(float x) { return ceilf(x); }
__device__ __forceinline__ double m_ceil(double x) { return ceil(x); }
__device__ __forceinline__ float m_rint(float x) { return rintf(x); }
__device__ __forceinline__ double m_rint(double x) { return rint(x); }
__device__ __forceinline__ float m_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double m_pow(double x, double y) { return pow(x, y); }
__device__ __forceinline__ float m_fmod(float x, float y) { return fmodf(x, y); }
__device__ __forceinline__ double m_fmod(double x, double y) { return fmod(x, y); }

template <typename A> __device__ __forceinline__ A neg_inf() { return (A)(-1.0 / 0.0); }
template <typename A> __device__ __forceinline__ A pos_inf() { return (A)(1.0 / 0.0); }

// Maximum / minimum that propagate NaN, as NumPy's reductions do.
template <typename A> __device__ __forceinline__ A nan_max(A a, A b) {
    return (a > b || a != a) ? a : b;
}
template <typename A> __device__ __forceinline__ A nan_min(A a, A b) {
    return (a < b || a != a) ? a : b;
}

// ----- activations ------------------------------------------------------------------
// Activation codes (ACT_*): opcodes.cuh, generated from backends/opcodes.py.

template <typename A> __device__ __forceinline__ A sigmoid_of(A x) {
    return (A)1 / ((A)1 + m_exp(-x));
}
// float: hardware exp2 and reciprocal (a few ulp), so fused sigmoid / SiLU chains stay
// memory-bound instead of spending their time in IEEE division.
template <> __device__ __forceinline__ float sigmoid_of<float>(float x) {
    return __frcp_rn(1.0f + __expf(-x));
}

template <typename A> __device__ __forceinline__ A act_fwd(int act, A x) {
    const A k_sqrt_half = (A)0.70710678118654752440;
    const A k_tanh_c = (A)0.79788456080286535588;  // sqrt(2 / pi)
    switch (act) {
        case ACT_RELU: return x > (A)0 ? x : (A)0;
        case ACT_GELU: return (A)0.5 * x * ((A)1 + m_erf(x * k_sqrt_half));
        case ACT_GELU_TANH:
            return (A)0.5 * x * ((A)1 + m_tanh(k_tanh_c * (x + (A)0.044715 * x * x * x)));
        case ACT_SILU: return x * sigmoid_of(x);
        case ACT_SIGMOID: return sigmoid_of(x);
        case ACT_TANH: return m_tanh(x);
        default: return x;
    }
}

// d act(x) / dx.
template <typename A> __device__ __forceinline__ A act_grad(int act, A x) {
    const A k_sqrt_half = (A)0.70710678118654752440;
    const A k_inv_sqrt_2pi = (A)0.39894228040143267794;
    const A k_tanh_c = (A)0.79788456080286535588;
    switch (act) {
        case ACT_RELU: return x > (A)0 ? (A)1 : (A)0;
        case ACT_GELU:
            return (A)0.5 * ((A)1 + m_erf(x * k_sqrt_half)) +
                   x * k_inv_sqrt_2pi * m_exp((A)-0.5 * x * x);
        case ACT_GELU_TANH: {
            A inner = k_tanh_c * (x + (A)0.044715 * x * x * x);
            A t = m_tanh(inner);
            A dinner = k_tanh_c * ((A)1 + (A)3 * (A)0.044715 * x * x);
            return (A)0.5 * ((A)1 + t) + (A)0.5 * x * ((A)1 - t * t) * dinner;
        }
        case ACT_SILU: {
            A s = sigmoid_of(x);
            return s * ((A)1 + x * ((A)1 - s));
        }
        case ACT_SIGMOID: {
            A s = sigmoid_of(x);
            return s * ((A)1 - s);
        }
        case ACT_TANH: {
            A t = m_tanh(x);
            return (A)1 - t * t;
        }
        default: return (A)1;
    }
}

// ----- reductions across a warp / a block -----------------------------------------
template <typename A> __device__ __forceinline__ A warp_sum(A v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Welford state (count, mean, M2) and Chan's merge of two states.
template <typename A> struct Welford {
    A n, mean, m2;
    __device__ __forceinline__ void push(A x) {
        n += (A)1;
        A d = x - mean;
        mean += d / n;
        m2 += d * (x - mean);
    }
    __device__ __forceinline__ void merge(A on, A omean, A om2) {
        if (on == (A)0) return;
        A tot = n + on;
        A d = omean - mean;
        A f = on / tot;
        mean += d * f;
        m2 += om2 + d * d * n * f;
        n = tot;
    }
};

template <typename A> __device__ __forceinline__ void warp_welford(Welford<A>& w) {
    for (int o = 16; o > 0; o >>= 1) {
        A on = __shfl_xor_sync(0xffffffffu, w.n, o);
        A om = __shfl_xor_sync(0xffffffffu, w.mean, o);
        A o2 = __shfl_xor_sync(0xffffffffu, w.m2, o);
        w.merge(on, om, o2);
    }
}

// Sum over all threads of the block (blockDim.x a multiple of 32, at most 1024);
// every thread gets the result.  `scratch` holds 32 values.
template <typename A> __device__ __forceinline__ A block_sum(A v, A* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : (A)0;
    return warp_sum(v);
}

template <typename A> __device__ __forceinline__ void block_welford(Welford<A>& w, A* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    warp_welford(w);
    __syncthreads();
    if (lane == 0) {
        scratch[3 * warp] = w.n;
        scratch[3 * warp + 1] = w.mean;
        scratch[3 * warp + 2] = w.m2;
    }
    __syncthreads();
    w.n = w.mean = w.m2 = (A)0;
    if (lane < nwarps) w.merge(scratch[3 * lane], scratch[3 * lane + 1], scratch[3 * lane + 2]);
    warp_welford(w);
}

__device__ __forceinline__ bool is_aligned16(const void* p) {
    return (((unsigned long long)p) & 15ull) == 0;
}

// ----- atomic accumulation into any storage type -------------------------------------
__device__ __forceinline__ void atomic_add_acc(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add_acc(double* p, double v) { atomicAdd(p, v); }

// 16-bit types: compare-and-swap on the aligned 32-bit word holding the value.
template <typename H> __device__ __forceinline__ void atomic_add_16(H* p, float v) {
    unsigned long long addr = (unsigned long long)p;
    unsigned int* word = (unsigned int*)(addr & ~3ull);
    unsigned int shift = (addr & 2ull) ? 16u : 0u;
    unsigned int old = *word, assumed;
    do {
        assumed = old;
        H h;
        h.bits = (unsigned short)((assumed >> shift) & 0xffffu);
        unsigned int nb = store_as<H>(load_acc(h) + v).bits;
        unsigned int next = (assumed & ~(0xffffu << shift)) | (nb << shift);
        old = atomicCAS(word, assumed, next);
    } while (assumed != old);
}
__device__ __forceinline__ void atomic_add_acc(half_t* p, float v) { atomic_add_16(p, v); }
__device__ __forceinline__ void atomic_add_acc(bf16_t* p, float v) { atomic_add_16(p, v); }

// ----- rows shared by groups of threads ---------------------------------------------------
// Row kernels give each row `tpr` consecutive threads of a block (row_launch on the host:
// a warp, or the whole block).  A thread's slot: its row, its rank t among the row's
// threads, and whether the row exists (threads past the last row still join the
// group's reductions, so they must not return early).
struct RowSlot {
    long long row;
    int t, tpr;
    bool live;
};

__device__ __forceinline__ RowSlot row_slot(long long rows, long long tpr) {
    const int n = (int)tpr;
    const long long row = (long long)blockIdx.x * (blockDim.x / n) + threadIdx.x / n;
    return RowSlot{row, (int)(threadIdx.x % n), n, row < rows};
}

// The `tpr` threads of one row striding over its `cols` elements from rank t.
template <typename T, typename PackFn, typename ElemFn>
__device__ __forceinline__ void row_packs_then_elements(long long cols, int t, int tpr, bool vec,
                                                        PackFn pack_fn, ElemFn elem_fn) {
    strided_packs_then_elements<T>(cols, t, tpr, vec, pack_fn, elem_fn);
}

// ----- a row held in registers ----------------------------------------------------------
// Rows up to tpr * ROW_PACKS packs are loaded once, all loads in flight together, and
// every later pass over the row reads registers (indices are compile-time constants).
#define ROW_PACKS 8

template <typename T>
__device__ __forceinline__ void load_row(const T* __restrict__ xr, long long npack, int t, int tpr,
                                         Pack<T> (&buf)[ROW_PACKS]) {
    const Pack<T>* xp = reinterpret_cast<const Pack<T>*>(xr);
#pragma unroll
    for (int k = 0; k < ROW_PACKS; ++k)
        if (t + (long long)k * tpr < npack) buf[k] = xp[t + (long long)k * tpr];
}

// Sum / max over each group of `tpr` consecutive threads (32, or the whole block);
// `scratch` holds 32 values.
template <typename A> __device__ __forceinline__ A group_sum_of(A v, int tpr, A* scratch) {
    if (tpr == 32) return warp_sum(v);
    return block_sum(v, scratch);
}

template <typename A> __device__ __forceinline__ A warp_max(A v) {
    for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <typename A> __device__ __forceinline__ A group_max_of(A v, int tpr, A* scratch) {
    v = warp_max(v);
    if (tpr == 32) return v;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : neg_inf<A>();
    return warp_max(v);
}
