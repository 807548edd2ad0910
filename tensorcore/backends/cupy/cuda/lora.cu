// Epilogue of the fused LoRA linear: out[m, n] = (out[m, n] + bias[n]) + scale * sum_k
// xa[m, k] * b[k, n], in place, after cuBLAS has written the base product x @ weight_t
// into out and xa = x @ lora_a.  out [M, N], xa [M, R], b [R, N] are C-contiguous;
// bias [N] may be null.  The rank R is small (LoRA ranks are 1..64), so each thread
// sums its R products itself; arithmetic in acc_t<T>, one rounding per element.
//
// Bound: memory (out read and written once; xa and b are small and stay in L1/L2).
// Launch: 1-D grid-stride, 256 threads, one thread per element of out, so a warp
// covers 32 consecutive columns of one row: b and out are read coalesced, xa is a
// broadcast within the warp.
#include "common.cuh"

template <typename T>
__global__ void lora_epilogue_kernel(T* __restrict__ out, const T* __restrict__ bias,
                                     const T* __restrict__ xa, const T* __restrict__ b,
                                     long long M, long long N, long long R, double scale_) {
    const acc_t<T> scale = (acc_t<T>)scale_;  // rounded to the storage's precision, as eager's `* scale`
    grid_plane_elements(1, M, N, [&](long long i, long long, long long m, long long n) {
        const T* a = xa + m * R;
        acc_t<T> acc = (acc_t<T>)0;
        for (long long k = 0; k < R; ++k) acc += load_acc(a[k]) * load_acc(b[k * N + n]);
        acc_t<T> y = load_acc(out[i]);
        if (bias != nullptr) y += load_acc(bias[n]);
        out[i] = store_as<T>(y + scale * acc);
    });
}
