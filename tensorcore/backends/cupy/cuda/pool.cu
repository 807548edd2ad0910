// 2-D max and average pooling on NCHW, forward and backward.
//
// Bound: memory.  Launch: 1-D grid-stride, 256 threads.  Forward: one thread per
// output element, looping over its window; 2x2 windows at stride 2 (the common
// downsampling) take max_pool_2x2_kernel, one thread per 16-byte output pack.
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

// 2x2 windows at stride 2 without padding, W a multiple of two packs (the host checks;
// OW = W / 2, OH = H / 2): one thread per pack of P outputs in a row, read as two whole
// input packs from each of the window's two rows, written as one pack of values and P
// int64 argmax.  Each thread takes two packs per grid stride (q and q + stride) and
// reads both before reducing either: eight 16-byte loads in flight.  Same taps order
// and NaN rule as max_pool_fwd_kernel.  32-bit indices: the host keeps the input below
// 2^31 elements.
template <typename T>
struct Window2x2 {
    Pack<T> row0[2], row1[2];
    unsigned int top;  // the first tap, flat inside the plane
};

template <typename T>
__device__ __forceinline__ Window2x2<T> load_window(const T* __restrict__ x, unsigned int q,
                                                    unsigned int uW, unsigned int uOH,
                                                    unsigned int plane_size) {
    const int P = Pack<T>::N;
    const unsigned int row_packs = uW / (2 * P);
    const unsigned int orow = q / row_packs, k = q - orow * row_packs;  // orow = plane * OH + oy
    const unsigned int plane = orow / uOH, oy = orow - plane * uOH;
    Window2x2<T> w;
    w.top = 2 * oy * uW + 2 * P * k;
    const T* base = x + (size_t)plane * plane_size + w.top;
    const Pack<T>* r0 = reinterpret_cast<const Pack<T>*>(base);
    const Pack<T>* r1 = reinterpret_cast<const Pack<T>*>(base + uW);
    w.row0[0] = r0[0];
    w.row0[1] = r0[1];
    w.row1[0] = r1[0];
    w.row1[1] = r1[1];
    return w;
}

template <typename T>
__device__ __forceinline__ void store_window_max(const Window2x2<T>& w, unsigned int q,
                                                 unsigned int uW, T* __restrict__ y,
                                                 long long* __restrict__ argmax) {
    typedef acc_t<T> A;
    const int P = Pack<T>::N;
    Pack<T> out;
    long long arg[P];
#pragma unroll
    for (int e = 0; e < P; ++e) {
        const int j = 2 * e;  // the window's left column inside the two packs
        A best = neg_inf<A>();
        arg[e] = -1;
        take_max(load_acc(w.row0[j / P].v[j % P]), w.top + j, best, arg[e]);
        take_max(load_acc(w.row0[(j + 1) / P].v[(j + 1) % P]), w.top + j + 1, best, arg[e]);
        take_max(load_acc(w.row1[j / P].v[j % P]), w.top + uW + j, best, arg[e]);
        take_max(load_acc(w.row1[(j + 1) / P].v[(j + 1) % P]), w.top + uW + j + 1, best, arg[e]);
        out.v[e] = store_as<T>(best);
    }
    reinterpret_cast<Pack<T>*>(y)[q] = out;
    longlong2* ap = reinterpret_cast<longlong2*>(argmax);
#pragma unroll
    for (int e = 0; e < P / 2; ++e) ap[q * (P / 2) + e] = make_longlong2(arg[2 * e], arg[2 * e + 1]);
}

template <typename T>
__global__ void max_pool_2x2_kernel(const T* __restrict__ x, T* __restrict__ y,
                                    long long* __restrict__ argmax, long long out_packs,
                                    long long H, long long W, long long OH) {
    const unsigned int uW = (unsigned int)W, uOH = (unsigned int)OH, n = (unsigned int)out_packs;
    const unsigned int plane_size = (unsigned int)H * uW;
    const unsigned int stride = gridDim.x * blockDim.x;
    for (unsigned int q = blockIdx.x * blockDim.x + threadIdx.x; q < n; q += 2 * stride) {
        const bool second = q + stride < n;
        const Window2x2<T> a = load_window(x, q, uW, uOH, plane_size);
        const Window2x2<T> b = load_window(x, second ? q + stride : q, uW, uOH, plane_size);
        store_window_max(a, q, uW, y, argmax);
        if (second) store_window_max(b, q + stride, uW, y, argmax);
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
