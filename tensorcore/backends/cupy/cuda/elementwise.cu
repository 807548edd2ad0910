// Elementwise kernels: unary math, same-shape / scalar / broadcast binary ops, and the
// fused per-channel affine + activation family (bias_act, act(x * scale + bias)) with
// its backward.
//
// Bound: memory.  Launch: 1-D grid-stride loops, 256 threads per block, grid capped
// at a few blocks per SM (the host sizes it for the device's SM count).  When every
// pointer is 16-byte aligned and `vec` is set, each thread moves whole 16-byte packs
// (float4 for float32), one per step of the grid-stride loop (grid_packs_then_elements
// in common.cuh); the tail past the last whole pack is done element by element.  One
// pack per step with 8 blocks of 256 per SM (full occupancy) keeps about 4 MB in flight,
// which covers the memory latency; loading several packs before using any costs
// registers and resident warps instead (docs/benchmarks.md#elementwise-launch-shape).
#include "common.cuh"

// Op codes (U_*, B_*): opcodes.cuh, generated from backends/opcodes.py.

template <typename A> __device__ __forceinline__ A unary_op(int op, A x) {
    switch (op) {
        case U_NEG: return -x;
        case U_ABS: return x < (A)0 ? -x : x;
        case U_SIGN: return x > (A)0 ? (A)1 : (x < (A)0 ? (A)-1 : x);
        case U_EXP: return m_exp(x);
        case U_LOG: return m_log(x);
        case U_LOG1P: return m_log1p(x);
        case U_SQRT: return m_sqrt(x);
        case U_RSQRT: return (A)1 / m_sqrt(x);
        case U_SIN: return m_sin(x);
        case U_COS: return m_cos(x);
        case U_TANH: return m_tanh(x);
        case U_SIGMOID: return sigmoid_of(x);
        case U_RELU: return x > (A)0 ? x : (A)0;
        case U_ERF: return m_erf(x);
        case U_GELU: return act_fwd(ACT_GELU, x);
        case U_GELU_TANH: return act_fwd(ACT_GELU_TANH, x);
        case U_SILU: return act_fwd(ACT_SILU, x);
        case U_SOFTPLUS: {
            A ax = x < (A)0 ? -x : x;
            return (x > (A)0 ? x : (A)0) + m_log1p(m_exp(-ax));
        }
        case U_FLOOR: return m_floor(x);
        case U_CEIL: return m_ceil(x);
        default: return m_rint(x);
    }
}

template <typename A> __device__ __forceinline__ A binary_op(int op, A a, A b) {
    switch (op) {
        case B_ADD: return a + b;
        case B_SUB: return a - b;
        case B_MUL: return a * b;
        case B_DIV: return a / b;
        case B_POW: return m_pow(a, b);
        case B_MAXIMUM: return nan_max(a, b);
        default: return nan_min(a, b);
    }
}

template <typename T>
__global__ void unary_kernel(const T* __restrict__ x, T* __restrict__ y, long long n,
                             long long op, long long vec) {
    const Pack<T>* xp = reinterpret_cast<const Pack<T>*>(x);
    Pack<T>* yp = reinterpret_cast<Pack<T>*>(y);
    grid_packs_then_elements<T>(
        n, vec != 0,
        [&](long long i) {
            Pack<T> p = xp[i];
#pragma unroll
            for (int k = 0; k < Pack<T>::N; ++k)
                p.v[k] = store_as<T>(unary_op((int)op, load_acc(p.v[k])));
            yp[i] = p;
        },
        [&](long long i) { y[i] = store_as<T>(unary_op((int)op, load_acc(x[i]))); });
}

// y [rows, n] = x[:, :n] * act(x[:, n:]) for x [rows, 2n] (GEGLU's gate): one pass over x.
// bias [2n] (or null) is added to each row of x first, the sum rounded to T as a separate
// bias add would store it.  With vec, n is a multiple of the pack width and the arrays
// are 16-byte aligned.
template <typename T>
__device__ __forceinline__ acc_t<T> glu_input(T x, const T* bias, long long col) {
    return bias ? load_acc(store_as<T>(load_acc(x) + load_acc(bias[col]))) : load_acc(x);
}

template <typename T>
__global__ void glu_kernel(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y,
                           long long rows, long long n, long long act, long long vec) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    if (vec) {
        const long long np = n / Pack<T>::N;
        const Pack<T>* xp = reinterpret_cast<const Pack<T>*>(x);
        Pack<T>* yp = reinterpret_cast<Pack<T>*>(y);
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < rows * np; i += stride) {
            const long long row = i / np, col = i - row * np;
            const Pack<T> a = xp[row * 2 * np + col], g = xp[row * 2 * np + np + col];
            Pack<T> out;
#pragma unroll
            for (int k = 0; k < Pack<T>::N; ++k) {
                const long long c = col * Pack<T>::N + k;
                out.v[k] = store_as<T>(glu_input(a.v[k], bias, c) * act_fwd((int)act, glu_input(g.v[k], bias, n + c)));
            }
            yp[i] = out;
        }
        return;
    }
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < rows * n; i += stride) {
        const long long row = i / n, col = i - row * n;
        const T* in = x + row * 2 * n;
        y[i] = store_as<T>(glu_input(in[col], bias, col) * act_fwd((int)act, glu_input(in[n + col], bias, n + col)));
    }
}

// a and b have n elements each; a_step / b_step is 1, or 0 for a broadcast scalar.
template <typename T>
__global__ void binary_kernel(const T* __restrict__ a, const T* __restrict__ b,
                              T* __restrict__ out, long long n, long long op,
                              long long a_step, long long b_step) {
    typedef acc_t<T> A;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = store_as<T>(binary_op((int)op, load_acc(a[i * a_step]), load_acc(b[i * b_step])));
}

// Same-shape contiguous binary op on 16-byte packs (all pointers aligned).
template <typename T>
__global__ void binary_vec_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                  T* __restrict__ out, long long n, long long op) {
    const Pack<T>* ap = reinterpret_cast<const Pack<T>*>(a);
    const Pack<T>* bp = reinterpret_cast<const Pack<T>*>(b);
    Pack<T>* outp = reinterpret_cast<Pack<T>*>(out);
    grid_packs_then_elements<T>(
        n, true,
        [&](long long i) {
            Pack<T> pa = ap[i], pb = bp[i];
#pragma unroll
            for (int k = 0; k < Pack<T>::N; ++k)
                pa.v[k] = store_as<T>(binary_op((int)op, load_acc(pa.v[k]), load_acc(pb.v[k])));
            outp[i] = pa;
        },
        [&](long long i) {
            out[i] = store_as<T>(binary_op((int)op, load_acc(a[i]), load_acc(b[i])));
        });
}

// Broadcasting binary op over at most 4 (collapsed) output dims d0..d3, d3 fastest;
// sa*/sb* are element strides of a and b (0 along broadcast dims).
template <typename T>
__global__ void binary_bcast_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                    T* __restrict__ out, long long op,
                                    long long d1, long long d2, long long d3, long long n,
                                    long long sa0, long long sa1, long long sa2, long long sa3,
                                    long long sb0, long long sb1, long long sb2, long long sb3) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const bool narrow = n < (1LL << 31);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        long long r = i;
        const long long i3 = divmod_index(r, d3, narrow), i2 = divmod_index(r, d2, narrow);
        const long long i1 = divmod_index(r, d1, narrow), i0 = r;
        long long ia = i0 * sa0 + i1 * sa1 + i2 * sa2 + i3 * sa3;
        long long ib = i0 * sb0 + i1 * sb1 + i2 * sb2 + i3 * sb3;
        out[i] = store_as<T>(binary_op((int)op, load_acc(a[ia]), load_acc(b[ib])));
    }
}

// grid_packs_then_elements over x viewed as [outer, C, inner], each item with its
// channel c = (e / inner) % C (32-bit: the host keeps n below 2^31): pack_fn(i, c) for
// pack i, elem_fn(i, c) for element i.  Packs are used (`vec`) only when inner is a
// multiple of the pack width, so a pack never straddles two channels.
template <typename T, typename PackFn, typename ElemFn>
__device__ __forceinline__ void grid_channel_items(long long n, long long C, long long inner,
                                                   bool vec, PackFn pack_fn, ElemFn elem_fn) {
    const unsigned int uC = (unsigned int)C, uinner = (unsigned int)inner;
    auto channel = [&](long long e) { return ((unsigned int)e / uinner) % uC; };
    grid_packs_then_elements<T>(
        n, vec, [&](long long i) { pack_fn(i, channel(i * Pack<T>::N)); },
        [&](long long i) { elem_fn(i, channel(i)); });
}

// out = op(x, v[c]), or op(v[c], x) with `v_first`: a tensor and an operand holding one
// value per channel of the [outer, C, inner] view ([N, C, H, W] with [N, C, 1, 1] or
// [1, C, 1, 1]; [..., D] with [D] has inner 1 and goes element by element).  Each
// thread turns one 16-byte pack of x into one pack of out, with one read of v.
template <typename T>
__global__ void binary_channel_kernel(const T* __restrict__ x, const T* __restrict__ v,
                                      T* __restrict__ out, long long n, long long C,
                                      long long inner, long long op, long long v_first,
                                      long long vec) {
    typedef acc_t<T> A;
    const Pack<T>* xp = reinterpret_cast<const Pack<T>*>(x);
    Pack<T>* outp = reinterpret_cast<Pack<T>*>(out);
    auto apply = [&](A a, A s) {
        return store_as<T>(v_first ? binary_op((int)op, s, a) : binary_op((int)op, a, s));
    };
    grid_channel_items<T>(
        n, C, inner, vec != 0,
        [&](long long i, unsigned int c) {
            const A s = load_acc(v[c]);
            Pack<T> p = xp[i];
#pragma unroll
            for (int k = 0; k < Pack<T>::N; ++k) p.v[k] = apply(load_acc(p.v[k]), s);
            outp[i] = p;
        },
        [&](long long i, unsigned int c) { out[i] = apply(load_acc(x[i]), load_acc(v[c])); });
}

// y = act(x * scale[c] + bias[c]) with x viewed as [outer, C, inner]; scale / bias may
// be null (1 / 0).  With a residual r (same shape as x, or null), y = that + r, the first
// result rounded to T as it would be stored before a separate add.
template <typename T>
__global__ void affine_act_kernel(const T* __restrict__ x, const T* __restrict__ scale,
                                  const T* __restrict__ bias, const T* __restrict__ residual,
                                  T* __restrict__ y, long long n, long long C, long long inner,
                                  long long act, long long vec) {
    typedef acc_t<T> A;
    const Pack<T>* xp = reinterpret_cast<const Pack<T>*>(x);
    const Pack<T>* rp = reinterpret_cast<const Pack<T>*>(residual);
    Pack<T>* yp = reinterpret_cast<Pack<T>*>(y);
    auto scale_of = [&](unsigned int c) { return scale ? load_acc(scale[c]) : (A)1; };
    auto bias_of = [&](unsigned int c) { return bias ? load_acc(bias[c]) : (A)0; };
    auto plus = [&](T v, const T* r) { return r ? store_as<T>(load_acc(v) + load_acc(*r)) : v; };
    grid_channel_items<T>(
        n, C, inner, vec != 0,
        [&](long long i, unsigned int c) {
            const A s = scale_of(c), b = bias_of(c);
            Pack<T> p = xp[i];
            Pack<T> r;
            if (residual) r = rp[i];
#pragma unroll
            for (int k = 0; k < Pack<T>::N; ++k)
                p.v[k] = plus(store_as<T>(act_fwd((int)act, load_acc(p.v[k]) * s + b)), residual ? &r.v[k] : nullptr);
            yp[i] = p;
        },
        [&](long long i, unsigned int c) {
            y[i] = plus(store_as<T>(act_fwd((int)act, load_acc(x[i]) * scale_of(c) + bias_of(c))),
                        residual ? residual + i : nullptr);
        });
}

// dx = grad * act'(x + bias[c]) with the same [outer, C, inner] view (bias may be null).
template <typename T>
__global__ void bias_act_grad_kernel(const T* __restrict__ grad, const T* __restrict__ x,
                                     const T* __restrict__ bias, T* __restrict__ dx,
                                     long long n, long long C, long long inner, long long act,
                                     long long vec) {
    typedef acc_t<T> A;
    const Pack<T>* gp = reinterpret_cast<const Pack<T>*>(grad);
    const Pack<T>* xp = reinterpret_cast<const Pack<T>*>(x);
    Pack<T>* dp = reinterpret_cast<Pack<T>*>(dx);
    auto bias_of = [&](unsigned int c) { return bias ? load_acc(bias[c]) : (A)0; };
    grid_channel_items<T>(
        n, C, inner, vec != 0,
        [&](long long i, unsigned int c) {
            const A b = bias_of(c);
            Pack<T> g = gp[i], p = xp[i];
#pragma unroll
            for (int k = 0; k < Pack<T>::N; ++k)
                g.v[k] = store_as<T>(load_acc(g.v[k]) * act_grad((int)act, load_acc(p.v[k]) + b));
            dp[i] = g;
        },
        [&](long long i, unsigned int c) {
            dx[i] = store_as<T>(load_acc(grad[i]) * act_grad((int)act, load_acc(x[i]) + bias_of(c)));
        });
}
