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
// (per input element for the nearest backward).
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
    bool dbl = sizeof(T) == 8;
    long long total = planes * OH * OW;
    long long stride = (long long)gridDim.x * blockDim.x;
    const bool narrow = total < (1LL << 31);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        long long p = i;
        const long long ox = divmod_index(p, OW, narrow), oy = divmod_index(p, OH, narrow);
        long long iy = nearest_src(oy, H, OH, dbl), ix = nearest_src(ox, W, OW, dbl);
        y[i] = x[(p * H + iy) * W + ix];
    }
}

template <typename T>
__global__ void nearest_bwd_kernel(const T* __restrict__ g, T* __restrict__ dx, long long planes,
                                   long long H, long long W, long long OH, long long OW) {
    typedef acc_t<T> A;
    bool dbl = sizeof(T) == 8;
    long long total = planes * H * W;
    long long stride = (long long)gridDim.x * blockDim.x;
    const bool narrow = total < (1LL << 31);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        long long p = i;
        const long long ix = divmod_index(p, W, narrow), iy = divmod_index(p, H, narrow);
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
    }
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
    long long total = planes * OH * OW;
    long long stride = (long long)gridDim.x * blockDim.x;
    const bool narrow = total < (1LL << 31);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        long long p = i;
        const long long ox = divmod_index(p, OW, narrow), oy = divmod_index(p, OH, narrow);
        Taps ty = bilinear_taps(oy, H, OH, align), tx = bilinear_taps(ox, W, OW, align);
        const T* xp = x + p * H * W;
        A ly = (A)ty.l1, lx = (A)tx.l1;
        A top = ((A)1 - lx) * load_acc(xp[ty.i0 * W + tx.i0]) + lx * load_acc(xp[ty.i0 * W + tx.i1]);
        A bot = ((A)1 - lx) * load_acc(xp[ty.i1 * W + tx.i0]) + lx * load_acc(xp[ty.i1 * W + tx.i1]);
        y[i] = store_as<T>(((A)1 - ly) * top + ly * bot);
    }
}

// dx must be zeroed by the caller.
template <typename T>
__global__ void bilinear_bwd_kernel(const T* __restrict__ g, T* __restrict__ dx, long long planes,
                                    long long H, long long W, long long OH, long long OW,
                                    long long align) {
    typedef acc_t<T> A;
    long long total = planes * OH * OW;
    long long stride = (long long)gridDim.x * blockDim.x;
    const bool narrow = total < (1LL << 31);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        long long p = i;
        const long long ox = divmod_index(p, OW, narrow), oy = divmod_index(p, OH, narrow);
        Taps ty = bilinear_taps(oy, H, OH, align), tx = bilinear_taps(ox, W, OW, align);
        T* dp = dx + p * H * W;
        A gv = load_acc(g[i]), ly = (A)ty.l1, lx = (A)tx.l1;
        atomic_add_acc(dp + ty.i0 * W + tx.i0, ((A)1 - ly) * ((A)1 - lx) * gv);
        atomic_add_acc(dp + ty.i0 * W + tx.i1, ((A)1 - ly) * lx * gv);
        atomic_add_acc(dp + ty.i1 * W + tx.i0, ly * ((A)1 - lx) * gv);
        atomic_add_acc(dp + ty.i1 * W + tx.i1, ly * lx * gv);
    }
}
