// im2col / col2im for NCHW convolution, with padding, stride and dilation fused in, so
// a convolution and both of its gradients become im2col + GEMM (+ col2im).
//
// col layout per image: [C * kh * kw, OH * OW] (row = (c, ki, kj), column = (oy, ox)),
// images stacked: col is [N, C * kh * kw, OH * OW].
//
// Bound: memory (col is kh*kw times the input).  Launch: 1-D grid-stride, 256 threads;
// thread indices are decomposed with 32-bit arithmetic (the host keeps them < 2^32).
//   im2col_kernel: one thread per (n, c, oy, ox); it loops over the kh*kw taps, so the
//     index arithmetic is done once per kh*kw stores; consecutive threads write
//     consecutive ox (coalesced).
//   col2im_kernel: one thread per input element (n, c, y, x) gathering every tap that
//     read it -- deterministic, no atomics.
#include "common.cuh"

template <typename T>
__global__ void im2col_kernel(const T* __restrict__ x, T* __restrict__ col, long long N,
                              long long C, long long H, long long W, long long kh, long long kw,
                              long long sh, long long sw, long long ph, long long pw,
                              long long dh, long long dw, long long OH, long long OW) {
    long long total = N * C * OH * OW;
    long long stride = (long long)gridDim.x * blockDim.x;
    long long ohw = OH * OW, taps = kh * kw;
    unsigned int uOW = (unsigned int)OW, uOH = (unsigned int)OH, uC = (unsigned int)C;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        unsigned int ui = (unsigned int)i;  // the host keeps total below 2^32
        long long ox = ui % uOW, r = ui / uOW;
        long long oy = (unsigned int)r % uOH;
        r = (unsigned int)r / uOH;  // r = n * C + c
        long long n = (unsigned int)r / uC, c = r - n * C;
        const T* xp = x + r * H * W;
        T* cp = col + (n * C * taps + c * taps) * ohw + oy * OW + ox;
        long long y0 = oy * sh - ph, x0 = ox * sw - pw;
        for (long long ki = 0; ki < kh; ++ki) {
            long long yy = y0 + ki * dh;
            bool row_ok = yy >= 0 && yy < H;
            for (long long kj = 0; kj < kw; ++kj) {
                long long xx = x0 + kj * dw;
                T v = store_as<T>((acc_t<T>)0);
                if (row_ok && xx >= 0 && xx < W) v = xp[yy * W + xx];
                cp[(ki * kw + kj) * ohw] = v;
            }
        }
    }
}

template <typename T>
__global__ void col2im_kernel(const T* __restrict__ col, T* __restrict__ x, long long N,
                              long long C, long long H, long long W, long long kh, long long kw,
                              long long sh, long long sw, long long ph, long long pw,
                              long long dh, long long dw, long long OH, long long OW) {
    typedef acc_t<T> A;
    long long total = N * C * H * W;
    long long stride = (long long)gridDim.x * blockDim.x;
    long long ohw = OH * OW, taps = kh * kw;
    unsigned int uW = (unsigned int)W, uH = (unsigned int)H, uC = (unsigned int)C;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        unsigned int ui = (unsigned int)i;  // the host keeps total below 2^32
        long long xx = ui % uW, r = ui / uW;
        long long yy = (unsigned int)r % uH;
        r = (unsigned int)r / uH;
        long long n = (unsigned int)r / uC, c = r - n * C;
        const T* cp = col + (n * C * taps + c * taps) * ohw;
        A acc = (A)0;
        for (long long ki = 0; ki < kh; ++ki) {
            long long ty = yy + ph - ki * dh;  // = oy * sh
            if (ty < 0 || ty % sh) continue;
            long long oy = ty / sh;
            if (oy >= OH) continue;
            for (long long kj = 0; kj < kw; ++kj) {
                long long tx = xx + pw - kj * dw;
                if (tx < 0 || tx % sw) continue;
                long long ox = tx / sw;
                if (ox >= OW) continue;
                acc += load_acc(cp[(ki * kw + kj) * ohw + oy * OW + ox]);
            }
        }
        x[i] = store_as<T>(acc);
    }
}
