// Nearest and bilinear 2-D resampling on NCHW, forward and backward.
//
// Nearest: source index iy = min(floor(oy * (H / OH)), H - 1) evaluated as PyTorch does,
// in double for float64 data and in float otherwise.  The backward is a gather: input
// row iy checks the output rows around [iy * OH / H, (iy + 1) * OH / H) and takes
// those whose source is iy.  Bilinear follows PyTorch's source-index rule
// (align_corners: oy * (H - 1) / (OH - 1); else (oy + 0.5) * H / OH - 0.5 clamped at 0);
// its backward scatters with atomic adds.
//
// Bound: memory.  Launch: 1-D grid-stride, 256 threads, one thread per output element
// (per input element for the nearest backward); upsampling by power-of-two factors
// takes nearest_up_packs_kernel, one thread per 16-byte pack of an output row.
#include "common.cuh"

__device__ __forceinline__ long long nearest_src(long long o, long long in, long long out, bool dbl) {
    long long s = dbl ? (long long)floor((double)o * ((double)in / (double)out))
                      : (long long)floorf((float)o * ((float)in / (float)out));
    return s < in - 1 ? s : in - 1;
}

__device__ __forceinline__ long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

template <typename T>
__global__ void nearest_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, long long planes,
                                   long long H, long long W, long long OH, long long OW) {
    const bool dbl = sizeof(T) == 8;
    grid_plane_elements(planes, OH, OW, [&](long long i, long long p, long long oy, long long ox) {
        long long iy = nearest_src(oy, H, OH, dbl), ix = nearest_src(ox, W, OW, dbl);
        y[i] = x[(p * H + iy) * W + ix];
    });
}

// Nearest upsampling by a power-of-two row factor sh and a column factor sw of 1 or 2,
// where the source index is exactly o / s (the host checks the factors, that W is a
// whole number of packs and that the output stays below 2^31 elements, so indices are
// 32-bit).  Row r of the input seen as [planes * H, W] becomes rows sh * r ... sh * r +
// sh - 1 of the output seen as [planes * OH, OW].  One thread per 16-byte pack of an
// output row: it reads the P / sw input elements the pack repeats and stores the pack
// in the sh rows, so a warp's loads and each of its stores are contiguous.
template <typename T>
__global__ void nearest_up_packs_kernel(const T* __restrict__ x, T* __restrict__ y,
                                        long long out_packs, long long W, long long sh,
                                        long long sw) {
    const int P = Pack<T>::N;
    const unsigned int usw = (unsigned int)sw, ush = (unsigned int)sh;
    const unsigned int out_row_packs = (unsigned int)W / P * usw;
    const unsigned int stride = gridDim.x * blockDim.x;
    const Pack<T>* xp = reinterpret_cast<const Pack<T>*>(x);
    Pack<T>* yp = reinterpret_cast<Pack<T>*>(y);
    for (unsigned int q = blockIdx.x * blockDim.x + threadIdx.x; q < out_packs; q += stride) {
        const unsigned int r = q / out_row_packs, j = q - r * out_row_packs;
        Pack<T> pack;
        if (usw == 1) {
            pack = xp[q];
        } else {  // each of P / 2 input elements twice
            const T* src = x + (size_t)r * (unsigned int)W + j * (P / 2);
#pragma unroll
            for (int e = 0; e < P; ++e) pack.v[e] = src[e / 2];
        }
        Pack<T>* out = yp + (size_t)r * ush * out_row_packs + j;
        for (unsigned int t = 0; t < ush; ++t) out[t * out_row_packs] = pack;
    }
}

template <typename T>
__global__ void nearest_bwd_kernel(const T* __restrict__ g, T* __restrict__ dx, long long planes,
                                   long long H, long long W, long long OH, long long OW) {
    typedef acc_t<T> A;
    const bool dbl = sizeof(T) == 8;
    grid_plane_elements(planes, H, W, [&](long long i, long long p, long long iy, long long ix) {
        long long y0 = ceil_div(iy * OH, H) - 1, y1 = ceil_div((iy + 1) * OH, H) + 1;
        long long x0 = ceil_div(ix * OW, W) - 1, x1 = ceil_div((ix + 1) * OW, W) + 1;
        if (y0 < 0) y0 = 0;
        if (x0 < 0) x0 = 0;
        if (y1 > OH) y1 = OH;
        if (x1 > OW) x1 = OW;
        A acc = (A)0;
        for (long long oy = y0; oy < y1; ++oy) {
            if (nearest_src(oy, H, OH, dbl) != iy) continue;
            for (long long ox = x0; ox < x1; ++ox)
                if (nearest_src(ox, W, OW, dbl) == ix) acc += load_acc(g[(p * OH + oy) * OW + ox]);
        }
        dx[i] = store_as<T>(acc);
    });
}

// Source coordinate of output index o along an axis of `in` -> `out` samples.
__device__ __forceinline__ double bilinear_src(long long o, long long in, long long out,
                                               long long align) {
    if (align) return out > 1 ? (double)o * (double)(in - 1) / (double)(out - 1) : 0.0;
    double s = ((double)o + 0.5) * (double)in / (double)out - 0.5;
    return s < 0.0 ? 0.0 : s;
}

struct Taps {
    long long i0, i1;
    double l1;  // weight of i1; i0 gets 1 - l1
};

__device__ __forceinline__ Taps bilinear_taps(long long o, long long in, long long out, long long align) {
    double s = bilinear_src(o, in, out, align);
    long long i0 = (long long)s;
    if (i0 > in - 1) i0 = in - 1;
    long long i1 = i0 + 1 < in ? i0 + 1 : in - 1;
    double frac = s - (double)i0;
    return Taps{i0, i1, frac < 0.0 ? 0.0 : (frac > 1.0 ? 1.0 : frac)};
}

template <typename T>
__global__ void bilinear_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, long long planes,
                                    long long H, long long W, long long OH, long long OW,
                                    long long align) {
    typedef acc_t<T> A;
    grid_plane_elements(planes, OH, OW, [&](long long i, long long p, long long oy, long long ox) {
        Taps ty = bilinear_taps(oy, H, OH, align), tx = bilinear_taps(ox, W, OW, align);
        const T* xp = x + p * H * W;
        A ly = (A)ty.l1, lx = (A)tx.l1;
        A top = ((A)1 - lx) * load_acc(xp[ty.i0 * W + tx.i0]) + lx * load_acc(xp[ty.i0 * W + tx.i1]);
        A bot = ((A)1 - lx) * load_acc(xp[ty.i1 * W + tx.i0]) + lx * load_acc(xp[ty.i1 * W + tx.i1]);
        y[i] = store_as<T>(((A)1 - ly) * top + ly * bot);
    });
}

// dx must be zeroed by the caller.
template <typename T>
__global__ void bilinear_bwd_kernel(const T* __restrict__ g, T* __restrict__ dx, long long planes,
                                    long long H, long long W, long long OH, long long OW,
                                    long long align) {
    typedef acc_t<T> A;
    grid_plane_elements(planes, OH, OW, [&](long long i, long long p, long long oy, long long ox) {
        Taps ty = bilinear_taps(oy, H, OH, align), tx = bilinear_taps(ox, W, OW, align);
        T* dp = dx + p * H * W;
        A gv = load_acc(g[i]), ly = (A)ty.l1, lx = (A)tx.l1;
        atomic_add_acc(dp + ty.i0 * W + tx.i0, ((A)1 - ly) * ((A)1 - lx) * gv);
        atomic_add_acc(dp + ty.i0 * W + tx.i1, ((A)1 - ly) * lx * gv);
        atomic_add_acc(dp + ty.i1 * W + tx.i0, ly * ((A)1 - lx) * gv);
        atomic_add_acc(dp + ty.i1 * W + tx.i1, ly * lx * gv);
    });
}
