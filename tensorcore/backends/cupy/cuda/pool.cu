// 2-D max and average pooling on NCHW, forward and backward.
//
// Bound: memory.  Launch: 1-D grid-stride, 256 threads.  Forward: one thread per
// output element, looping over its window; 2x2 windows at stride 2 (the common
// downsampling) take max_pool_2x2_kernel, one thread per pair of outputs.
// Average-pool backward: one thread per input element, gathering from every window
// that contains it (no atomics, deterministic).  Max-pool backward: one thread per
// output, scattering to its argmax (the protocol passes no window geometry to it).
// argmax is the flat index y * W + x inside the (n, c) plane, as int64.
#include "common.cuh"

// Output windows [lo, hi] along one axis that contain input position p.
__device__ __forceinline__ void window_span(long long p, long long k, long long s, long long pad,
                                            long long out, long long& lo, long long& hi) {
    long long t = p + pad - k + 1;
    lo = t <= 0 ? 0 : (t + s - 1) / s;
    hi = (p + pad) / s;
    if (hi > out - 1) hi = out - 1;
}

// Whether window tap v (flat index `at`) replaces the running (best, arg), as in
// PyTorch and the NumPy reference: the first tap, a larger value, or a NaN (so the
// first maximum wins and the last NaN).
template <typename A>
__device__ __forceinline__ void take_max(A v, long long at, A& best, long long& arg) {
    if (arg < 0 || v > best || v != v) {
        best = v;
        arg = at;
    }
}

template <typename T>
__global__ void max_pool_fwd_kernel(const T* __restrict__ x, T* __restrict__ y,
                                    long long* __restrict__ argmax, long long planes, long long H,
                                    long long W, long long OH, long long OW, long long kh,
                                    long long kw, long long sh, long long sw, long long ph,
                                    long long pw) {
    typedef acc_t<T> A;
    grid_plane_elements(planes, OH, OW, [&](long long i, long long p, long long oy, long long ox) {
        const T* xp = x + p * H * W;
        A best = neg_inf<A>();
        long long arg = -1;
        for (long long ki = 0; ki < kh; ++ki) {
            long long yy = oy * sh - ph + ki;
            if (yy < 0 || yy >= H) continue;
            for (long long kj = 0; kj < kw; ++kj) {
                long long xx = ox * sw - pw + kj;
                if (xx >= 0 && xx < W) take_max(load_acc(xp[yy * W + xx]), yy * W + xx, best, arg);
            }
        }
        y[i] = store_as<T>(best);
        argmax[i] = arg;
    });
}

// N consecutive elements of T, moved as whole 4-, 8- or 16-byte words with evict-first
// hints (__ldcs / __stcs): a pooling reads each input byte once and writes each output
// byte once, so neither should displace cached data.
template <int BYTES> struct Word;
template <> struct Word<4> { typedef unsigned int type; };
template <> struct Word<8> { typedef uint2 type; };
template <> struct Word<16> { typedef uint4 type; };

template <typename T, int N>
struct alignas(sizeof(T) * N < 16 ? sizeof(T) * N : 16) Run {
    typedef typename Word<(sizeof(T) * N < 16 ? sizeof(T) * N : 16)>::type W;
    static const int WORDS = sizeof(T) * N / sizeof(W);
    T v[N];

    __device__ __forceinline__ void load_once(const T* p) {
#pragma unroll
        for (int i = 0; i < WORDS; ++i)
            reinterpret_cast<W*>(v)[i] = __ldcs(reinterpret_cast<const W*>(p) + i);
    }
    __device__ __forceinline__ void store_once(T* p) const {
#pragma unroll
        for (int i = 0; i < WORDS; ++i)
            __stcs(reinterpret_cast<W*>(p) + i, reinterpret_cast<const W*>(v)[i]);
    }
};

// 2x2 windows at stride 2 without padding, W a multiple of 4 (the host checks; OH = H / 2,
// OW = W / 2).  One thread per pair of outputs in a row: it reads four input columns of
// each of the window's two rows and writes two values and two int64 argmax, so a warp's
// every load and store is one contiguous run.  Same taps order
// and NaN rule as max_pool_fwd_kernel.  32-bit indices: the host keeps the input below
// 2^31 elements.
template <typename T>
__global__ void max_pool_2x2_kernel(const T* __restrict__ x, T* __restrict__ y,
                                    long long* __restrict__ argmax, long long out_pairs,
                                    long long H, long long W, long long OH) {
    typedef acc_t<T> A;
    const unsigned int uW = (unsigned int)W, uOH = (unsigned int)OH, n = (unsigned int)out_pairs;
    const unsigned int plane_size = (unsigned int)H * uW, row_pairs = uW / 4;
    const unsigned int stride = gridDim.x * blockDim.x;
    for (unsigned int q = blockIdx.x * blockDim.x + threadIdx.x; q < n; q += stride) {
        // orow = plane * OH + oy
        const unsigned int orow = q / row_pairs, k = q - orow * row_pairs;
        const unsigned int plane = orow / uOH, oy = orow - plane * uOH;
        const unsigned int top = 2 * oy * uW + 4 * k;  // the first tap, flat inside the plane
        Run<T, 4> row0, row1;
        row0.load_once(x + (size_t)plane * plane_size + top);
        row1.load_once(x + (size_t)plane * plane_size + top + uW);
        Run<T, 2> out;
        long long arg[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            A best = neg_inf<A>();
            arg[e] = -1;
            take_max(load_acc(row0.v[2 * e]), top + 2 * e, best, arg[e]);
            take_max(load_acc(row0.v[2 * e + 1]), top + 2 * e + 1, best, arg[e]);
            take_max(load_acc(row1.v[2 * e]), top + uW + 2 * e, best, arg[e]);
            take_max(load_acc(row1.v[2 * e + 1]), top + uW + 2 * e + 1, best, arg[e]);
            out.v[e] = store_as<T>(best);
        }
        out.store_once(y + 2 * (size_t)q);
        __stcs(reinterpret_cast<longlong2*>(argmax) + q, make_longlong2(arg[0], arg[1]));
    }
}

// dx (zeroed by the caller) += grad routed to each window's argmax: one thread per
// output element, atomic adds because overlapping windows can share an argmax.
template <typename T>
__global__ void max_pool_bwd_kernel(const T* __restrict__ g, const long long* __restrict__ argmax,
                                    T* __restrict__ dx, long long planes, long long HW,
                                    long long OHW) {
    grid_plane_elements(planes, 1, OHW, [&](long long i, long long p, long long, long long) {
        const long long a = argmax[i];
        if (a >= 0 && a < HW) atomic_add_acc(dx + p * HW + a, load_acc(g[i]));
    });
}

// Zero padding counts in the divisor (count_include_pad): divisor kh * kw.
template <typename T>
__global__ void avg_pool_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, long long planes,
                                    long long H, long long W, long long OH, long long OW,
                                    long long kh, long long kw, long long sh, long long sw,
                                    long long ph, long long pw) {
    typedef acc_t<T> A;
    const A inv = (A)1 / (A)(kh * kw);
    grid_plane_elements(planes, OH, OW, [&](long long i, long long p, long long oy, long long ox) {
        const T* xp = x + p * H * W;
        A acc = (A)0;
        for (long long ki = 0; ki < kh; ++ki) {
            long long yy = oy * sh - ph + ki;
            if (yy < 0 || yy >= H) continue;
            for (long long kj = 0; kj < kw; ++kj) {
                long long xx = ox * sw - pw + kj;
                if (xx >= 0 && xx < W) acc += load_acc(xp[yy * W + xx]);
            }
        }
        y[i] = store_as<T>(acc * inv);
    });
}

template <typename T>
__global__ void avg_pool_bwd_kernel(const T* __restrict__ g, T* __restrict__ dx, long long planes,
                                    long long H, long long W, long long OH, long long OW,
                                    long long kh, long long kw, long long sh, long long sw,
                                    long long ph, long long pw) {
    typedef acc_t<T> A;
    const A inv = (A)1 / (A)(kh * kw);
    grid_plane_elements(planes, H, W, [&](long long i, long long p, long long yy, long long xx) {
        long long ylo, yhi, xlo, xhi;
        window_span(yy, kh, sh, ph, OH, ylo, yhi);
        window_span(xx, kw, sw, pw, OW, xlo, xhi);
        A acc = (A)0;
        for (long long oy = ylo; oy <= yhi; ++oy)
            for (long long ox = xlo; ox <= xhi; ++ox) acc += load_acc(g[(p * OH + oy) * OW + ox]);
        dx[i] = store_as<T>(acc * inv);
    });
}
