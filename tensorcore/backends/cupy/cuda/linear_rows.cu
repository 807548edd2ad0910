// Products of few rows with a weight as stored: y[m, n] = act(round_T(sum_k a[m, k] *
// w[n, k]) + bias[n]) for M <= MAX_ROWS rows of a (a time-embedding projection, a
// classifier head).  On cuBLAS such a product is a GEMV plus a bias kernel: two launches
// whose time is mostly latency.  The product is rounded to T before the bias is added,
// as a stored matmul result that bias_act then reads, so the fused call and the two
// calls agree exactly.  a [M, K], w [N, K] (a Linear's weight, the product's operand
// being its transpose) and y [M, N] are C-contiguous, K a multiple of the pack and the
// operands 16-byte aligned (the host checks); bias [N] may be null.
//
// Bound: memory (w is read once; a stays in L1).  Launch: blocks of 256 threads, one warp
// per output column n: the lanes stream w's row n in 16-byte packs (four in flight per
// lane), each keeping one partial sum per row of a, then a warp sum per row.
//
// linear_rows_group_kernel runs up to GROUP_MAX such products of the same a in one launch
// (a UNet's time-embedding projections: one input, a weight per ResBlock): a table passed
// by value gives each product its weight, bias, result, column count, activation and its
// first block; each warp computes one column exactly as linear_rows_kernel would.
#include "common.cuh"

#define MAX_ROWS 8
#define GROUP_MAX 32

// Column n of y = act(round_T(a @ w.T) + bias) for the warp whose lane is ``lane``.
template <typename T>
__device__ __forceinline__ void linear_rows_column(const T* __restrict__ a, const T* __restrict__ w,
                                                   const T* __restrict__ bias, T* __restrict__ y,
                                                   long long M, long long N, long long K, int act,
                                                   long long n, int lane) {
    typedef acc_t<T> A;
    const long long packs = K / Pack<T>::N;
    const Pack<T>* wr = reinterpret_cast<const Pack<T>*>(w + n * K);
    const Pack<T>* ar = reinterpret_cast<const Pack<T>*>(a);
    A acc[MAX_ROWS];
#pragma unroll
    for (int m = 0; m < MAX_ROWS; ++m) acc[m] = (A)0;
#pragma unroll 4
    for (long long i = lane; i < packs; i += 32) {
        const Pack<T> wp = wr[i];
#pragma unroll
        for (int m = 0; m < MAX_ROWS; ++m) {
            if (m < M) {
                const Pack<T> ap = ar[m * packs + i];
#pragma unroll
                for (int e = 0; e < Pack<T>::N; ++e)
                    acc[m] += load_acc(ap.v[e]) * load_acc(wp.v[e]);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < MAX_ROWS; ++m) {
        if (m < M) {
            const A sum = warp_sum(acc[m]);
            if (lane == 0) {
                A v = load_acc(store_as<T>(sum));
                if (bias) v += load_acc(bias[n]);
                y[m * N + n] = store_as<T>(act_fwd(act, v));
            }
        }
    }
}

template <typename T>
__global__ void linear_rows_kernel(const T* __restrict__ a, const T* __restrict__ w,
                                   const T* __restrict__ bias, T* __restrict__ y, long long M,
                                   long long N, long long K, long long act) {
    const long long n = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) return;
    linear_rows_column<T>(a, w, bias, y, M, N, K, (int)act, n, threadIdx.x & 31);
}

// The products of one grouped launch (the host packs it as 8-byte words in this order).
struct LinearRowsGroup {
    unsigned long long w[GROUP_MAX], bias[GROUP_MAX], y[GROUP_MAX];  // bias 0: none
    long long n[GROUP_MAX], act[GROUP_MAX];
    long long first_block[GROUP_MAX + 1];  // product i owns blocks [first_block[i], first_block[i + 1])
};

template <typename T>
__global__ void linear_rows_group_kernel(const T* __restrict__ a, const LinearRowsGroup group,
                                         long long count, long long M, long long K) {
    int i = 0;
    while (i + 1 < count && blockIdx.x >= group.first_block[i + 1]) ++i;
    const long long n = (blockIdx.x - group.first_block[i]) * (blockDim.x / 32) + threadIdx.x / 32;
    const long long N = group.n[i];
    if (n >= N) return;
    linear_rows_column<T>(a, reinterpret_cast<const T*>(group.w[i]), reinterpret_cast<const T*>(group.bias[i]),
                          reinterpret_cast<T*>(group.y[i]), M, N, K, (int)group.act[i], n, threadIdx.x & 31);
}
