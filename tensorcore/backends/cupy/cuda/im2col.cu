// im2col / col2im for NCHW convolution, with padding, stride and dilation fused in, so
// a convolution and both of its gradients become im2col + GEMM (+ col2im).
//
// col layout per image: [C * kh * kw, OH * OW] (row = (c, ki, kj), column = (oy, ox)),
// images stacked: col is [N, C * kh * kw, OH * OW].
//
// Bound: memory (col is kh*kw times the input).  Launch: 1-D grid-stride, 256 threads;
// thread indices are decomposed (grid_plane_elements_narrow) and taps addressed with 32-bit
// arithmetic (the host keeps the thread count and the padded image below 2^31).
//   im2col_kernel: one thread per (n, c, oy, ox); it loops over the kh*kw taps, so the
//     index arithmetic is done once per kh*kw stores; consecutive threads write
//     consecutive ox (coalesced).  3x3 kernels take an unrolled path with all nine
//     loads in flight at once (so do their col2im gathers).
//   col2im_kernel: one thread per input element (n, c, y, x) gathering every tap that
//     read it -- deterministic, no atomics; tap arithmetic in 32 bits (no division at
//     stride 1).
#include "common.cuh"

// The KH x KW taps of one output pixel with compile-time tap counts: every load is
// issued before the first store (a loop over runtime kh * kw issues one load and waits
// for it before its store, leaving a single load in flight per thread).
template <typename T, int KH, int KW>
__device__ __forceinline__ void im2col_taps(const T* __restrict__ xp, T* __restrict__ cp,
                                            int y0, int x0, int H, int W, int dh, int dw,
                                            long long ohw) {
    T v[KH * KW];
#pragma unroll
    for (int ki = 0; ki < KH; ++ki)
#pragma unroll
        for (int kj = 0; kj < KW; ++kj) {
            int yy = y0 + ki * dh, xx = x0 + kj * dw;
            bool inside = yy >= 0 && yy < H && xx >= 0 && xx < W;
            v[ki * KW + kj] = inside ? xp[yy * W + xx] : store_as<T>((acc_t<T>)0);
        }
#pragma unroll
    for (int t = 0; t < KH * KW; ++t) cp[t * ohw] = v[t];
}

template <typename T>
__global__ void im2col_kernel(const T* __restrict__ x, T* __restrict__ col, long long N,
                              long long C, long long H, long long W, long long kh, long long kw,
                              long long sh, long long sw, long long ph, long long pw,
                              long long dh, long long dw, long long OH, long long OW) {
    const long long ohw = OH * OW, taps = kh * kw;
    grid_plane_elements_narrow(N * C, OH, OW, [&](long long, long long r, long long oy_, long long ox_) {
        const int oy = (int)oy_, ox = (int)ox_;  // r = n * C + c
        const long long n = r / C, c = r - n * C;
        const T* xp = x + r * H * W;
        T* cp = col + (n * C * taps + c * taps) * ohw + oy * (int)OW + ox;
        int y0 = oy * (int)sh - (int)ph, x0 = ox * (int)sw - (int)pw;
        if (kh == 3 && kw == 3) {
            im2col_taps<T, 3, 3>(xp, cp, y0, x0, (int)H, (int)W, (int)dh, (int)dw, ohw);
            return;
        }
        for (int ki = 0; ki < (int)kh; ++ki) {
            int yy = y0 + ki * (int)dh;
            bool row_ok = yy >= 0 && yy < (int)H;
            for (int kj = 0; kj < (int)kw; ++kj) {
                int xx = x0 + kj * (int)dw;
                T v = store_as<T>((acc_t<T>)0);
                if (row_ok && xx >= 0 && xx < (int)W) v = xp[yy * (int)W + xx];
                cp[(long long)(ki * (int)kw + kj) * ohw] = v;
            }
        }
    });
}

// Output row (or column) that tap position t = y + pad - k * dilation reads from, or -1
// when no output does.  32-bit: a 64-bit division per tap made col2im instruction-bound.
__device__ __forceinline__ int tap_output(int t, int stride, int out_size) {
    if (t < 0) return -1;
    int o = t;
    if (stride != 1) {
        if (t % stride) return -1;
        o = t / stride;
    }
    return o < out_size ? o : -1;
}

// The sum over the KH x KW taps that read input position (y, x) = (ty - ph, tx - pw),
// with compile-time tap counts so all the loads are in flight before the first add.
template <typename T, int KH, int KW>
__device__ __forceinline__ acc_t<T> col2im_taps(const T* __restrict__ cp, int ty, int tx,
                                                int sh, int sw, int dh, int dw, int OH,
                                                int OW, long long ohw) {
    typedef acc_t<T> A;
    A v[KH * KW];
#pragma unroll
    for (int ki = 0; ki < KH; ++ki) {
        int oy = tap_output(ty - ki * dh, sh, OH);
#pragma unroll
        for (int kj = 0; kj < KW; ++kj) {
            int ox = tap_output(tx - kj * dw, sw, OW);
            v[ki * KW + kj] = oy >= 0 && ox >= 0
                ? load_acc(cp[(long long)(ki * KW + kj) * ohw + oy * OW + ox]) : (A)0;
        }
    }
    A acc = (A)0;
#pragma unroll
    for (int t = 0; t < KH * KW; ++t) acc += v[t];
    return acc;
}

template <typename T>
__global__ void col2im_kernel(const T* __restrict__ col, T* __restrict__ x, long long N,
                              long long C, long long H, long long W, long long kh, long long kw,
                              long long sh, long long sw, long long ph, long long pw,
                              long long dh, long long dw, long long OH, long long OW) {
    typedef acc_t<T> A;
    const long long ohw = OH * OW, taps = kh * kw;
    grid_plane_elements_narrow(N * C, H, W, [&](long long i, long long r, long long yy_, long long xx_) {
        const int yy = (int)yy_, xx = (int)xx_;  // r = n * C + c
        const long long n = r / C, c = r - n * C;
        const T* cp = col + (n * C * taps + c * taps) * ohw;
        if (kh == 3 && kw == 3) {
            x[i] = store_as<T>(col2im_taps<T, 3, 3>(cp, yy + (int)ph, xx + (int)pw, (int)sh,
                                                    (int)sw, (int)dh, (int)dw, (int)OH,
                                                    (int)OW, ohw));
            return;
        }
        A acc = (A)0;
        for (int ki = 0; ki < (int)kh; ++ki) {
            int oy = tap_output(yy + (int)ph - ki * (int)dh, (int)sh, (int)OH);
            if (oy < 0) continue;
            for (int kj = 0; kj < (int)kw; ++kj) {
                int ox = tap_output(xx + (int)pw - kj * (int)dw, (int)sw, (int)OW);
                if (ox < 0) continue;
                acc += load_acc(cp[(long long)(ki * (int)kw + kj) * ohw + oy * (int)OW + ox]);
            }
        }
        x[i] = store_as<T>(acc);
    });
}
