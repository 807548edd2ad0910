// Softmax family over the last axis of a contiguous [rows, cols] array: softmax /
// log_softmax forward and backward, the scaled + masked softmax of attention, and
// cross-entropy forward / backward.
//
// Bound: memory.  Launch: 256-thread blocks; `tpr` threads cooperate on one row:
// tpr = 32 (one warp per row, 8 rows per block) for cols <= 1024, tpr = 256 (one block
// per row) beyond.  Forward: a row that fits in registers (tpr * ROW_PACKS packs) is read
// once, max and sum come from registers, then it is written; longer rows take one read
// computing the running max and the sum of exp relative to it (online softmax, merged
// across threads) and a second read -- served from L2 -- that writes the output.
#include "common.cuh"

// Online (max, sum of exp(x - max)) state.
template <typename A> struct MaxSum {
    A m, s;
    __device__ __forceinline__ void push(A x) {
        if (x > m) {
            s = s * m_exp(m - x) + (A)1;
            m = x;
        } else if (x == x && x != neg_inf<A>()) {
            s += m_exp(x - m);
        } else if (x != x) {
            m = x;
        }
    }
    __device__ __forceinline__ void merge(A om, A os) {
        if (om != om || m != m) {
            m = om != om ? om : m;
            return;
        }
        A mx = om > m ? om : m;
        if (mx == neg_inf<A>()) return;
        s = s * m_exp(m - mx) + os * m_exp(om - mx);
        m = mx;
    }
};

template <typename A> __device__ __forceinline__ void group_maxsum(MaxSum<A>& st, int tpr, A* scratch) {
    for (int o = 16; o > 0; o >>= 1) {
        A om = __shfl_xor_sync(0xffffffffu, st.m, o);
        A os = __shfl_xor_sync(0xffffffffu, st.s, o);
        st.merge(om, os);
    }
    if (tpr == 32) return;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) {
        scratch[2 * warp] = st.m;
        scratch[2 * warp + 1] = st.s;
    }
    __syncthreads();
    st.m = neg_inf<A>();
    st.s = (A)0;
    if (lane < nwarps) st.merge(scratch[2 * lane], scratch[2 * lane + 1]);
    for (int o = 16; o > 0; o >>= 1) {
        A om = __shfl_xor_sync(0xffffffffu, st.m, o);
        A os = __shfl_xor_sync(0xffffffffu, st.s, o);
        st.merge(om, os);
    }
}

// Row max/sum state of x[row, :] * scale + mask, where the mask is optional.
// The row layout and the packed path are shared by every forward kernel here.
template <typename T>
__device__ __forceinline__ MaxSum<acc_t<T>> row_maxsum(const T* __restrict__ xr, long long cols,
                                                       int t, int tpr, bool vec) {
    typedef acc_t<T> A;
    MaxSum<A> st{neg_inf<A>(), (A)0};
    const Pack<T>* xp = reinterpret_cast<const Pack<T>*>(xr);
    row_packs_then_elements<T>(
        cols, t, tpr, vec,
        [&](long long i) {
            Pack<T> p = xp[i];
#pragma unroll
            for (int k = 0; k < Pack<T>::N; ++k) st.push(load_acc(p.v[k]));
        },
        [&](long long j) { st.push(load_acc(xr[j])); });
    return st;
}

// Register-cached softmax of one row (cols a multiple of the pack, at most
// tpr * ROW_PACKS packs): one read, max and sum from registers, one write.
template <typename T>
__device__ __forceinline__ void softmax_row_cached(const T* __restrict__ xr, T* __restrict__ yr,
                                                   long long cols, bool live, bool log, int t,
                                                   int tpr, acc_t<T>* scratch) {
    typedef acc_t<T> A;
    const int P = Pack<T>::N;
    long long npack = live ? cols / P : 0;
    Pack<T> buf[ROW_PACKS];
    load_row(xr, npack, t, tpr, buf);
    A m = neg_inf<A>();
#pragma unroll
    for (int k = 0; k < ROW_PACKS; ++k)
        if (t + (long long)k * tpr < npack)
#pragma unroll
            for (int e = 0; e < P; ++e) m = nan_max(m, load_acc(buf[k].v[e]));
    m = group_max_of(m, tpr, scratch);
    A s = (A)0;
#pragma unroll
    for (int k = 0; k < ROW_PACKS; ++k)
        if (t + (long long)k * tpr < npack)
#pragma unroll
            for (int e = 0; e < P; ++e) s += m_exp(load_acc(buf[k].v[e]) - m);
    s = group_sum_of(s, tpr, scratch);
    A inv = (A)1 / s, logs = m_log(s);
    Pack<T>* yp = reinterpret_cast<Pack<T>*>(yr);
#pragma unroll
    for (int k = 0; k < ROW_PACKS; ++k) {
        long long i = t + (long long)k * tpr;
        if (i < npack) {
#pragma unroll
            for (int e = 0; e < P; ++e) {
                A d = load_acc(buf[k].v[e]) - m;
                buf[k].v[e] = store_as<T>(log ? d - logs : m_exp(d) * inv);
            }
            yp[i] = buf[k];
        }
    }
}

// y = softmax(x) (or log_softmax when `log`) along each row.
template <typename T>
__global__ void softmax_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, long long rows,
                                   long long cols, long long log, long long tpr_, long long vec) {
    typedef acc_t<T> A;
    __shared__ A scratch[64];
    const RowSlot slot = row_slot(rows, tpr_);
    const int t = slot.t, tpr = slot.tpr;
    const long long r = slot.live ? slot.row : 0;
    const T* xr = x + r * cols;
    if (vec && cols <= (long long)tpr * Pack<T>::N * ROW_PACKS) {
        softmax_row_cached(xr, y + r * cols, cols, slot.live, log != 0, t, tpr, scratch);
        return;
    }
    MaxSum<A> st = row_maxsum(xr, slot.live ? cols : 0, t, tpr, vec != 0);
    group_maxsum(st, tpr, scratch);
    if (!slot.live) return;
    T* yr = y + r * cols;
    const A inv = (A)1 / st.s, logs = m_log(st.s);
    auto out = [&](A v) {
        const A d = v - st.m;
        return store_as<T>(log ? d - logs : m_exp(d) * inv);
    };
    const Pack<T>* xp = reinterpret_cast<const Pack<T>*>(xr);
    Pack<T>* yp = reinterpret_cast<Pack<T>*>(yr);
    row_packs_then_elements<T>(
        cols, t, tpr, vec != 0,
        [&](long long i) {
            Pack<T> p = xp[i];
#pragma unroll
            for (int k = 0; k < Pack<T>::N; ++k) p.v[k] = out(load_acc(p.v[k]));
            yp[i] = p;
        },
        [&](long long j) { yr[j] = out(load_acc(xr[j])); });
}

// softmax:     dx = y * (g - sum(g * y))
// log_softmax: dx = g - exp(y) * sum(g)
// The result is multiplied by `scale` (1 except inside attention's backward).
template <typename T>
__global__ void softmax_bwd_kernel(const T* __restrict__ g, const T* __restrict__ y,
                                   T* __restrict__ dx, long long rows, long long cols,
                                   long long log, long long tpr_, double scale) {
    typedef acc_t<T> A;
    __shared__ A scratch[32];
    const RowSlot slot = row_slot(rows, tpr_);
    const int t = slot.t, tpr = slot.tpr;
    const bool live = slot.live;
    const long long base = (live ? slot.row : 0) * cols;
    A acc = (A)0;
    if (live)
        for (long long j = t; j < cols; j += tpr)
            acc += log ? load_acc(g[base + j]) : load_acc(g[base + j]) * load_acc(y[base + j]);
    acc = group_sum_of(acc, tpr, scratch);
    if (!live) return;
    A sc = (A)scale;
    for (long long j = t; j < cols; j += tpr) {
        A gj = load_acc(g[base + j]), yj = load_acc(y[base + j]);
        A d = log ? gj - m_exp(yj) * acc : yj * (gj - acc);
        dx[base + j] = store_as<T>(d * sc);
    }
}

// Attention probabilities: softmax over the last axis of s (scores already scaled),
// rows = B*H*Lq, after adding mask[b, h, i, j] (element strides sm*, 0 where the mask
// broadcasts; mask may be null) and masking j > i when `causal` (top-left aligned).
template <typename T>
__global__ void attn_softmax_kernel(const T* __restrict__ s, const T* __restrict__ mask,
                                    T* __restrict__ p, long long rows, long long cols,
                                    long long H, long long Lq, long long causal,
                                    long long smb, long long smh, long long smi, long long smj,
                                    long long tpr_) {
    typedef acc_t<T> A;
    __shared__ A scratch[64];
    const RowSlot slot = row_slot(rows, tpr_);
    const int t = slot.t, tpr = slot.tpr;
    const bool live = slot.live;
    const long long r = live ? slot.row : 0;
    long long i = r % Lq, bh = r / Lq, h = bh % H, b = bh / H;
    const T* sr = s + r * cols;
    const T* mr = mask ? mask + b * smb + h * smh + i * smi : mask;
    long long limit = causal ? i : cols;  // last visible column
    MaxSum<A> st{neg_inf<A>(), (A)0};
    if (live)
        for (long long j = t; j < cols; j += tpr) {
            A v = j > limit ? neg_inf<A>() : load_acc(sr[j]) + (mr ? load_acc(mr[j * smj]) : (A)0);
            st.push(v);
        }
    group_maxsum(st, tpr, scratch);
    if (!live) return;
    A inv = (A)1 / st.s;
    for (long long j = t; j < cols; j += tpr) {
        A v = j > limit ? neg_inf<A>() : load_acc(sr[j]) + (mr ? load_acc(mr[j * smj]) : (A)0);
        p[r * cols + j] = store_as<T>(m_exp(v - st.m) * inv);
    }
}

// loss[row] = -((1 - ls) * logp[t] + ls / C * sum(logp)), 0 where target == ignore;
// logp = log_softmax(logits) is written too.
template <typename T>
__global__ void cross_entropy_fwd_kernel(const T* __restrict__ x, const long long* __restrict__ target,
                                         T* __restrict__ logp, T* __restrict__ loss,
                                         long long rows, long long cols, long long ignore_index,
                                         double smoothing, long long tpr_) {
    typedef acc_t<T> A;
    __shared__ A scratch[64];
    const RowSlot slot = row_slot(rows, tpr_);
    const int t = slot.t, tpr = slot.tpr;
    const bool live = slot.live;
    const long long row = slot.row;
    const T* xr = x + (live ? row : 0) * cols;
    MaxSum<A> st = row_maxsum(xr, live ? cols : 0, t, tpr, false);
    group_maxsum(st, tpr, scratch);
    A logs = m_log(st.s);
    A total = (A)0;
    if (live)
        for (long long j = t; j < cols; j += tpr) {
            A lp = load_acc(xr[j]) - st.m - logs;
            logp[row * cols + j] = store_as<T>(lp);
            total += lp;
        }
    total = group_sum_of(total, tpr, scratch);
    if (!live || t != 0) return;
    long long tg = target[row];
    if (tg == ignore_index) {
        loss[row] = store_as<T>((A)0);
        return;
    }
    A lp_t = load_acc(xr[tg]) - st.m - logs;
    A ls = (A)smoothing;
    loss[row] = store_as<T>(-(((A)1 - ls) * lp_t + ls / (A)cols * total));
}

// dlogits[row, j] = grad_rows[row] * (exp(logp) - (1 - ls) * [j == t] - ls / C);
// rows whose target is ignore_index get 0.  One thread per element.
template <typename T>
__global__ void cross_entropy_bwd_kernel(const T* __restrict__ grad_rows, const T* __restrict__ logp,
                                         const long long* __restrict__ target, T* __restrict__ dx,
                                         long long rows, long long cols, long long ignore_index,
                                         double smoothing) {
    typedef acc_t<T> A;
    long long n = rows * cols;
    long long stride = (long long)gridDim.x * blockDim.x;
    A ls = (A)smoothing;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        long long row = i / cols, j = i - row * cols;
        long long tg = target[row];
        A d = (A)0;
        if (tg != ignore_index) {
            A onehot = j == tg ? (A)1 - ls : (A)0;
            d = load_acc(grad_rows[row]) * (m_exp(load_acc(logp[i])) - onehot - ls / (A)cols);
        }
        dx[i] = store_as<T>(d);
    }
}
