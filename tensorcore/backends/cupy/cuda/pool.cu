// 2-D max and average pooling on NCHW, forward and backward.
//
// Bound: memory.  Launch: 1-D grid-stride, 256 threads.  Forward: one thread per
// output element, looping over its window.  Average-pool backward: one thread per
// input element, gathering from every window that contains it (no atomics,
// deterministic).  Max-pool backward: one thread per output, scattering to its argmax
// (the protocol passes no window geometry to it).
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

template <typename T>
__global__ void max_pool_fwd_kernel(const T* __restrict__ x, T* __restrict__ y,
                                    long long* __restrict__ argmax, long long planes, long long H,
                                    long long W, long long OH, long long OW, long long kh,
                                    long long kw, long long sh, long long sw, long long ph,
                                    long long pw) {
    typedef acc_t<T> A;
    long long total = planes * OH * OW;
    long long stride = (long long)gridDim.x * blockDim.x;
    const bool narrow = total < (1LL << 31);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        long long p = i;
        const long long ox = divmod_index(p, OW, narrow), oy = divmod_index(p, OH, narrow);
        const T* xp = x + p * H * W;
        A best = neg_inf<A>();
        long long arg = -1;
        for (long long ki = 0; ki < kh; ++ki) {
            long long yy = oy * sh - ph + ki;
            if (yy < 0 || yy >= H) continue;
            for (long long kj = 0; kj < kw; ++kj) {
                long long xx = ox * sw - pw + kj;
                if (xx < 0 || xx >= W) continue;
                A v = load_acc(xp[yy * W + xx]);
                if (arg < 0 || v > best || v != v) {
                    if (!(best != best)) {
                        best = v;
                        arg = yy * W + xx;
                    }
                }
            }
        }
        y[i] = store_as<T>(best);
        argmax[i] = arg;
    }
}

// dx (zeroed by the caller) += grad routed to each window's argmax: one thread per
// output element, atomic adds because overlapping windows can share an argmax.
template <typename T>
__global__ void max_pool_bwd_kernel(const T* __restrict__ g, const long long* __restrict__ argmax,
                                    T* __restrict__ dx, long long planes, long long HW,
                                    long long OHW) {
    long long total = planes * OHW;
    long long stride = (long long)gridDim.x * blockDim.x;
    const bool narrow = total < (1LL << 31);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        long long a = argmax[i], plane = i;
        divmod_index(plane, OHW, narrow);
        if (a >= 0 && a < HW) atomic_add_acc(dx + plane * HW + a, load_acc(g[i]));
    }
}

// Zero padding counts in the divisor (count_include_pad): divisor kh * kw.
template <typename T>
__global__ void avg_pool_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, long long planes,
                                    long long H, long long W, long long OH, long long OW,
                                    long long kh, long long kw, long long sh, long long sw,
                                    long long ph, long long pw) {
    typedef acc_t<T> A;
    long long total = planes * OH * OW;
    long long stride = (long long)gridDim.x * blockDim.x;
    A inv = (A)1 / (A)(kh * kw);
    const bool narrow = total < (1LL << 31);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        long long p = i;
        const long long ox = divmod_index(p, OW, narrow), oy = divmod_index(p, OH, narrow);
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
    }
}

template <typename T>
__global__ void avg_pool_bwd_kernel(const T* __restrict__ g, T* __restrict__ dx, long long planes,
                                    long long H, long long W, long long OH, long long OW,
                                    long long kh, long long kw, long long sh, long long sw,
                                    long long ph, long long pw) {
    typedef acc_t<T> A;
    long long total = planes * H * W;
    long long stride = (long long)gridDim.x * blockDim.x;
    A inv = (A)1 / (A)(kh * kw);
    const bool narrow = total < (1LL << 31);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        long long p = i;
        const long long xx = divmod_index(p, W, narrow), yy = divmod_index(p, H, narrow);
        long long ylo, yhi, xlo, xhi;
        window_span(yy, kh, sh, ph, OH, ylo, yhi);
        window_span(xx, kw, sw, pw, OW, xlo, xhi);
        A acc = (A)0;
        for (long long oy = ylo; oy <= yhi; ++oy)
            for (long long ox = xlo; ox <= xhi; ++ox) acc += load_acc(g[(p * OH + oy) * OW + ox]);
        dx[i] = store_as<T>(acc * inv);
    }
}
