// Fused optimizer updates over flat buffers: one launch updates every parameter of a
// (param group, dtype), in place, with no host round trip.
//
// Elementwise rules (SGD, Adam/AdamW, RMSProp, Adagrad, Lion).  Bound: memory (each
// element of p, g and the state is read and written once).  Launch: 1-D grid-stride
// loop, 256 threads per block, grid capped at a few blocks per SM; when `vec` is set
// (every pointer 16-byte aligned) threads move whole 16-byte packs (float4 for
// float32), the tail past the last whole pack element by element.
//
// Per-tensor rules (LAMB, LARS) need a norm per tensor: a first launch with grid
// (chunks, tensors) reduces sums of squares per tensor into `sums` (double, one atomic
// add per block), a second launch with the same grid applies the update.
//
// lr / step / first_step are 1-element device arrays of the accumulation type; the
// coefficients derived from them (bias corrections, decayed rates) are computed once
// per thread in double and rounded to the accumulation type, as torch.optim does with
// its Python-float coefficients.
#include "common.cuh"

// ----- elementwise rules: (p, g, s0, s1, s2) in the accumulation type ----------------
template <typename A> struct SgdRule {
    A lr, momentum, keep, wd;
    bool has_buf, first, nesterov;
    __device__ __forceinline__ void operator()(A& p, A g, A& buf, A&, A&) const {
        A d = g + wd * p;
        if (has_buf) {
            A b = first ? d : momentum * buf + keep * d;
            buf = b;
            d = nesterov ? d + momentum * b : b;
        }
        p -= lr * d;
    }
};

template <typename A> struct AdamRule {
    A step_size, inv_bc2_sqrt, decay, l2, b1, b2, c1, c2, eps;
    bool amsgrad;
    __device__ __forceinline__ void operator()(A& p, A g, A& m, A& v, A& vmax) const {
        A gi = g + l2 * p;
        m = b1 * m + c1 * gi;
        v = b2 * v + c2 * gi * gi;
        A second = v;
        if (amsgrad) {
            vmax = vmax > v ? vmax : v;
            second = vmax;
        }
        p = p * decay - step_size * m / (m_sqrt(second) * inv_bc2_sqrt + eps);
    }
};

template <typename A> struct RmspropRule {
    A lr, alpha, keep, eps, wd, momentum;
    bool centered, has_buf;
    __device__ __forceinline__ void operator()(A& p, A g, A& sq, A& grad_avg, A& buf) const {
        A gi = g + wd * p;
        sq = alpha * sq + keep * gi * gi;
        A var = sq;
        if (centered) {
            grad_avg = alpha * grad_avg + keep * gi;
            var = sq - grad_avg * grad_avg;
        }
        A s = gi / (m_sqrt(var) + eps);
        if (has_buf) {
            buf = momentum * buf + s;
            s = buf;
        }
        p -= lr * s;
    }
};

template <typename A> struct AdagradRule {
    A clr, wd, eps;
    __device__ __forceinline__ void operator()(A& p, A g, A& sum, A&, A&) const {
        A gi = g + wd * p;
        sum += gi * gi;
        p -= clr * (gi / (m_sqrt(sum) + eps));
    }
};

template <typename A> struct LionRule {
    A lr, decay, b1, b2, c1, c2;
    __device__ __forceinline__ void operator()(A& p, A g, A& m, A&, A&) const {
        A c = b1 * m + c1 * g;
        A direction = c > (A)0 ? (A)1 : (c < (A)0 ? (A)-1 : (A)0);
        p = p * decay - lr * direction;
        m = b2 * m + c2 * g;
    }
};

// Apply `rule` to every element; null state pointers are buffers the rule ignores.
template <typename T, typename Rule>
__device__ __forceinline__ void update_flat(const Rule& rule, T* __restrict__ p,
                                            const T* __restrict__ g, T* __restrict__ s0,
                                            T* __restrict__ s1, T* __restrict__ s2,
                                            long long n, long long vec) {
    typedef acc_t<T> A;
    Pack<T>* pp = reinterpret_cast<Pack<T>*>(p);
    const Pack<T>* gp = reinterpret_cast<const Pack<T>*>(g);
    Pack<T>* p0 = reinterpret_cast<Pack<T>*>(s0);
    Pack<T>* p1 = reinterpret_cast<Pack<T>*>(s1);
    Pack<T>* p2 = reinterpret_cast<Pack<T>*>(s2);
    grid_packs_then_elements<T>(
        n, vec != 0,
        [&](long long k) {
            Pack<T> vp = pp[k], vg = gp[k], v0, v1, v2;
            if (s0) v0 = p0[k];
            if (s1) v1 = p1[k];
            if (s2) v2 = p2[k];
#pragma unroll
            for (int j = 0; j < Pack<T>::N; ++j) {
                A x = load_acc(vp.v[j]);
                A a0 = s0 ? load_acc(v0.v[j]) : (A)0;
                A a1 = s1 ? load_acc(v1.v[j]) : (A)0;
                A a2 = s2 ? load_acc(v2.v[j]) : (A)0;
                rule(x, load_acc(vg.v[j]), a0, a1, a2);
                vp.v[j] = store_as<T>(x);
                if (s0) v0.v[j] = store_as<T>(a0);
                if (s1) v1.v[j] = store_as<T>(a1);
                if (s2) v2.v[j] = store_as<T>(a2);
            }
            pp[k] = vp;
            if (s0) p0[k] = v0;
            if (s1) p1[k] = v1;
            if (s2) p2[k] = v2;
        },
        [&](long long i) {
            A x = load_acc(p[i]);
            A a0 = s0 ? load_acc(s0[i]) : (A)0;
            A a1 = s1 ? load_acc(s1[i]) : (A)0;
            A a2 = s2 ? load_acc(s2[i]) : (A)0;
            rule(x, load_acc(g[i]), a0, a1, a2);
            p[i] = store_as<T>(x);
            if (s0) s0[i] = store_as<T>(a0);
            if (s1) s1[i] = store_as<T>(a1);
            if (s2) s2[i] = store_as<T>(a2);
        });
}

template <typename T>
__global__ void sgd_kernel(T* p, const T* g, T* buf, const acc_t<T>* lr,
                           const acc_t<T>* first_step, double momentum, double dampening,
                           long long nesterov, double weight_decay, long long n, long long vec) {
    typedef acc_t<T> A;
    SgdRule<A> rule;
    rule.lr = lr[0];
    rule.momentum = (A)momentum;
    rule.keep = (A)(1.0 - dampening);
    rule.wd = (A)weight_decay;
    rule.has_buf = buf != 0 && momentum != 0.0;
    rule.first = first_step[0] != (A)0;
    rule.nesterov = nesterov != 0;
    update_flat<T>(rule, p, g, rule.has_buf ? buf : (T*)0, (T*)0, (T*)0, n, vec);
}

template <typename T>
__global__ void adam_kernel(T* p, const T* g, T* m, T* v, T* vmax, const acc_t<T>* lr,
                            const acc_t<T>* step, double beta1, double beta2, double eps,
                            double weight_decay, long long decoupled, long long n,
                            long long vec) {
    typedef acc_t<T> A;
    double lr64 = (double)lr[0], t = (double)step[0];
    AdamRule<A> rule;
    rule.step_size = (A)(lr64 / (1.0 - pow(beta1, t)));
    rule.inv_bc2_sqrt = (A)(1.0 / sqrt(1.0 - pow(beta2, t)));
    rule.decay = decoupled ? (A)(1.0 - lr64 * weight_decay) : (A)1;
    rule.l2 = decoupled ? (A)0 : (A)weight_decay;
    rule.b1 = (A)beta1;
    rule.b2 = (A)beta2;
    rule.c1 = (A)(1.0 - beta1);
    rule.c2 = (A)(1.0 - beta2);
    rule.eps = (A)eps;
    rule.amsgrad = vmax != 0;
    update_flat<T>(rule, p, g, m, v, vmax, n, vec);
}

template <typename T>
__global__ void rmsprop_kernel(T* p, const T* g, T* square_avg, T* grad_avg, T* buf,
                               const acc_t<T>* lr, double alpha, double eps,
                               double weight_decay, double momentum, long long n,
                               long long vec) {
    typedef acc_t<T> A;
    RmspropRule<A> rule;
    rule.lr = lr[0];
    rule.alpha = (A)alpha;
    rule.keep = (A)(1.0 - alpha);
    rule.eps = (A)eps;
    rule.wd = (A)weight_decay;
    rule.momentum = (A)momentum;
    rule.centered = grad_avg != 0;
    rule.has_buf = buf != 0;
    update_flat<T>(rule, p, g, square_avg, grad_avg, buf, n, vec);
}

template <typename T>
__global__ void adagrad_kernel(T* p, const T* g, T* state_sum, const acc_t<T>* lr,
                               const acc_t<T>* step, double lr_decay, double weight_decay,
                               double eps, long long n, long long vec) {
    typedef acc_t<T> A;
    AdagradRule<A> rule;
    rule.clr = (A)((double)lr[0] / (1.0 + ((double)step[0] - 1.0) * lr_decay));
    rule.wd = (A)weight_decay;
    rule.eps = (A)eps;
    update_flat<T>(rule, p, g, state_sum, (T*)0, (T*)0, n, vec);
}

template <typename T>
__global__ void lion_kernel(T* p, const T* g, T* m, const acc_t<T>* lr, double beta1,
                            double beta2, double weight_decay, long long n, long long vec) {
    typedef acc_t<T> A;
    double lr64 = (double)lr[0];
    LionRule<A> rule;
    rule.lr = (A)lr64;
    rule.decay = (A)(1.0 - lr64 * weight_decay);
    rule.b1 = (A)beta1;
    rule.b2 = (A)beta2;
    rule.c1 = (A)(1.0 - beta1);
    rule.c2 = (A)(1.0 - beta2);
    update_flat<T>(rule, p, g, m, (T*)0, (T*)0, n, vec);
}

// ----- per-tensor rules --------------------------------------------------------------
// Block (x, k) walks tensor k = [ranges[2k], ranges[2k+1]) with stride gridDim.x * 256.
#define RANGE_LOOP(i, ranges)                                                        \
    for (long long i = ranges[2 * blockIdx.y] + (long long)blockIdx.x * blockDim.x +   \
                       threadIdx.x;                                                   \
         i < ranges[2 * blockIdx.y + 1]; i += (long long)gridDim.x * blockDim.x)

// Adds the block's two partial sums to sums[2k], sums[2k + 1].
__device__ __forceinline__ void add_pair(double a, double b, double* sums) {
    __shared__ double scratch[32];
    a = block_sum(a, scratch);
    b = block_sum(b, scratch);
    if (threadIdx.x == 0) {
        atomicAdd(&sums[2 * blockIdx.y], a);
        atomicAdd(&sums[2 * blockIdx.y + 1], b);
    }
}

template <typename A> struct LambCoefficients {
    A inv_bc1, inv_bc2, b1, b2, c1, c2, eps, wd;
    __device__ LambCoefficients(double t, double beta1, double beta2, double e, double w)
        : inv_bc1((A)(1.0 / (1.0 - pow(beta1, t)))), inv_bc2((A)(1.0 / (1.0 - pow(beta2, t)))),
          b1((A)beta1), b2((A)beta2), c1((A)(1.0 - beta1)), c2((A)(1.0 - beta2)), eps((A)e),
          wd((A)w) {}
    __device__ __forceinline__ A direction(A m, A v, A p) const {
        return (m * inv_bc1) / (m_sqrt(v * inv_bc2) + eps) + wd * p;
    }
};

// Moments update and per-tensor sums of p² and u², u = m̂ / (√v̂ + eps) + wd·p.
template <typename T>
__global__ void lamb_moments_kernel(const T* p, const T* g, T* m, T* v, const long long* ranges,
                                    double* sums, const acc_t<T>* step, double beta1,
                                    double beta2, double eps, double weight_decay) {
    typedef acc_t<T> A;
    LambCoefficients<A> k((double)step[0], beta1, beta2, eps, weight_decay);
    double p_sq = 0.0, u_sq = 0.0;
    RANGE_LOOP(i, ranges) {
        A gi = load_acc(g[i]), pi = load_acc(p[i]);
        T mi = store_as<T>(k.b1 * load_acc(m[i]) + k.c1 * gi);
        T vi = store_as<T>(k.b2 * load_acc(v[i]) + k.c2 * gi * gi);
        m[i] = mi;
        v[i] = vi;
        A u = k.direction(load_acc(mi), load_acc(vi), pi);
        p_sq += (double)pi * (double)pi;
        u_sq += (double)u * (double)u;
    }
    add_pair(p_sq, u_sq, sums);
}

// p -= lr · ‖p‖/‖u‖ · u per tensor (ratio 1 when either norm is zero).
template <typename T>
__global__ void lamb_apply_kernel(T* p, const T* m, const T* v, const long long* ranges,
                                  const double* sums, const acc_t<T>* lr, const acc_t<T>* step,
                                  double beta1, double beta2, double eps, double weight_decay) {
    typedef acc_t<T> A;
    LambCoefficients<A> k((double)step[0], beta1, beta2, eps, weight_decay);
    double p_norm = sqrt(sums[2 * blockIdx.y]), u_norm = sqrt(sums[2 * blockIdx.y + 1]);
    double trust = (p_norm > 0.0 && u_norm > 0.0) ? p_norm / u_norm : 1.0;
    A scale = (A)((double)lr[0] * trust);
    RANGE_LOOP(i, ranges) {
        A pi = load_acc(p[i]);
        p[i] = store_as<T>(pi - scale * k.direction(load_acc(m[i]), load_acc(v[i]), pi));
    }
}

// Per-tensor sums of p² and g².
template <typename T>
__global__ void lars_norms_kernel(const T* p, const T* g, const long long* ranges, double* sums) {
    double p_sq = 0.0, g_sq = 0.0;
    RANGE_LOOP(i, ranges) {
        double pi = (double)load_acc(p[i]), gi = (double)load_acc(g[i]);
        p_sq += pi * pi;
        g_sq += gi * gi;
    }
    add_pair(p_sq, g_sq, sums);
}

// λ = η‖p‖ / (‖g‖ + wd‖p‖ + eps) (1 when a norm is zero); buf = μ·buf + lr·λ·(g + wd·p);
// p -= buf.
template <typename T>
__global__ void lars_apply_kernel(T* p, const T* g, T* buf, const long long* ranges,
                                  const double* sums, const acc_t<T>* lr, double momentum,
                                  double weight_decay, double trust_coefficient, double eps) {
    typedef acc_t<T> A;
    double p_norm = sqrt(sums[2 * blockIdx.y]), g_norm = sqrt(sums[2 * blockIdx.y + 1]);
    double local = (p_norm > 0.0 && g_norm > 0.0)
                       ? trust_coefficient * p_norm / (g_norm + weight_decay * p_norm + eps)
                       : 1.0;
    A scale = (A)((double)lr[0] * local), mom = (A)momentum, wd = (A)weight_decay;
    RANGE_LOOP(i, ranges) {
        A pi = load_acc(p[i]);
        A b = mom * load_acc(buf[i]) + scale * (load_acc(g[i]) + wd * pi);
        buf[i] = store_as<T>(b);
        p[i] = store_as<T>(pi - b);
    }
}
