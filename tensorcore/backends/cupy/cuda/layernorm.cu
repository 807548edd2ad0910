// LayerNorm over the last axis of a contiguous [rows, cols] array, forward and backward.
//
// Bound: memory.  Launch (forward and the dx backward): 256-thread blocks, `tpr`
// threads per row (32 = one warp per row for cols <= 1024, a block per row beyond).
// Forward: rows that fit in registers (tpr * ROW_PACKS packs) are read once and
// normalised with an exact two-pass mean / variance (layer_norm_fwd_cached_kernel);
// longer rows (layer_norm_fwd_kernel) use one read computing
// Welford statistics (merged across threads with Chan's formula) and a second read
// (from L2) writing y.  Backward dx: one read of
// (g, x) for the two row sums, a second writing dx.  The parameter gradients use
// layer_norm_params_kernel: blocks of (32, 8) threads, 32 columns by 8 row lanes, each
// blockIdx.y a chunk of rows, writing acc-typed partials that the host sums over chunks.
#include "common.cuh"

template <typename A> __device__ __forceinline__ void group_welford(Welford<A>& w, int tpr, A* scratch) {
    if (tpr == 32) warp_welford(w);
    else block_welford(w, scratch);
}

// Register-cached row (cols a multiple of the pack, at most tpr * ROW_PACKS packs): one
// read, exact two-pass mean and variance from registers, one write.
template <typename T>
__device__ __forceinline__ void layer_norm_row_cached(
        const T* __restrict__ xr, const T* __restrict__ w, const T* __restrict__ b,
        T* __restrict__ yr, acc_t<T>* mean, acc_t<T>* rstd, long long cols, bool live, int t,
        int tpr, double eps, acc_t<T>* scratch) {
    typedef acc_t<T> A;
    const int P = Pack<T>::N;
    long long npack = live ? cols / P : 0;
    Pack<T> buf[ROW_PACKS];
    load_row(xr, npack, t, tpr, buf);
    A s = (A)0;
#pragma unroll
    for (int k = 0; k < ROW_PACKS; ++k)
        if (t + (long long)k * tpr < npack)
#pragma unroll
            for (int e = 0; e < P; ++e) s += load_acc(buf[k].v[e]);
    A mu = group_sum_of(s, tpr, scratch) / (A)cols;
    A q = (A)0;
#pragma unroll
    for (int k = 0; k < ROW_PACKS; ++k)
        if (t + (long long)k * tpr < npack)
#pragma unroll
            for (int e = 0; e < P; ++e) {
                A d = load_acc(buf[k].v[e]) - mu;
                q += d * d;
            }
    A rs = m_rsqrt(group_sum_of(q, tpr, scratch) / (A)cols + (A)eps);
    if (!live) return;
    if (t == 0) {
        *mean = mu;
        *rstd = rs;
    }
    Pack<T>* yp = reinterpret_cast<Pack<T>*>(yr);
#pragma unroll
    for (int k = 0; k < ROW_PACKS; ++k) {
        long long i = t + (long long)k * tpr;
        if (i < npack) {
            Pack<T> wp, bp;  // w and b are contiguous and aligned like x (checked by the host)
            if (w) wp = reinterpret_cast<const Pack<T>*>(w)[i];
            if (b) bp = reinterpret_cast<const Pack<T>*>(b)[i];
#pragma unroll
            for (int e = 0; e < P; ++e) {
                A v = (load_acc(buf[k].v[e]) - mu) * rs;
                if (w) v *= load_acc(wp.v[e]);
                if (b) v += load_acc(bp.v[e]);
                buf[k].v[e] = store_as<T>(v);
            }
            yp[i] = buf[k];
        }
    }
}

// Rows that fit in registers (vec, cols <= tpr * ROW_PACKS packs, tpr <= 256): a kernel
// of its own, so its register count is not set by the long-row path, and capped for four
// 256-thread blocks per SM (more rows in flight per SM).
template <typename T>
__global__ void __launch_bounds__(256, 4) layer_norm_fwd_cached_kernel(
        const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
        T* __restrict__ y, acc_t<T>* __restrict__ mean, acc_t<T>* __restrict__ rstd,
        long long rows, long long cols, double eps, long long tpr_) {
    __shared__ acc_t<T> scratch[96];
    const RowSlot slot = row_slot(rows, tpr_);
    const long long r = slot.live ? slot.row : 0;
    layer_norm_row_cached(x + r * cols, w, b, y + r * cols, mean + r, rstd + r, cols, slot.live,
                          slot.t, slot.tpr, eps, scratch);
}

// y = (x - mean) * rstd * w + b; mean / rstd (acc type) per row.  w, b may be null.
template <typename T>
__global__ void layer_norm_fwd_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                      const T* __restrict__ b, T* __restrict__ y,
                                      acc_t<T>* __restrict__ mean, acc_t<T>* __restrict__ rstd,
                                      long long rows, long long cols, double eps,
                                      long long tpr_, long long vec) {
    typedef acc_t<T> A;
    __shared__ A scratch[96];
    const RowSlot slot = row_slot(rows, tpr_);
    const int t = slot.t, tpr = slot.tpr;
    const T* xr = x + (slot.live ? slot.row : 0) * cols;
    const Pack<T>* xp = reinterpret_cast<const Pack<T>*>(xr);
    Welford<A> st{(A)0, (A)0, (A)0};
    row_packs_then_elements<T>(
        slot.live ? cols : 0, t, tpr, vec != 0,
        [&](long long i) {
            Pack<T> p = xp[i];
#pragma unroll
            for (int k = 0; k < Pack<T>::N; ++k) st.push(load_acc(p.v[k]));
        },
        [&](long long j) { st.push(load_acc(xr[j])); });
    group_welford(st, tpr, scratch);
    if (!slot.live) return;
    const long long row = slot.row;
    A mu = st.mean;
    A rs = m_rsqrt(st.m2 / (A)cols + (A)eps);
    if (t == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
    T* yr = y + row * cols;
    Pack<T>* yp = reinterpret_cast<Pack<T>*>(yr);
    // (x - mean) * rstd, times w[j] and plus b[j] where given
    auto normed = [&](A v, long long j) {
        v = (v - mu) * rs;
        if (w) v *= load_acc(w[j]);
        if (b) v += load_acc(b[j]);
        return store_as<T>(v);
    };
    row_packs_then_elements<T>(
        cols, t, tpr, vec != 0,
        [&](long long i) {
            Pack<T> p = xp[i];
#pragma unroll
            for (int k = 0; k < Pack<T>::N; ++k) p.v[k] = normed(load_acc(p.v[k]), i * Pack<T>::N + k);
            yp[i] = p;
        },
        [&](long long j) { yr[j] = normed(load_acc(xr[j]), j); });
}

// dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)),  gw = g * w.
template <typename T>
__global__ void layer_norm_bwd_kernel(const T* __restrict__ g, const T* __restrict__ x,
                                      const T* __restrict__ w, const acc_t<T>* __restrict__ mean,
                                      const acc_t<T>* __restrict__ rstd, T* __restrict__ dx,
                                      long long rows, long long cols, long long tpr_) {
    typedef acc_t<T> A;
    __shared__ A scratch[32];
    const RowSlot slot = row_slot(rows, tpr_);
    const int t = slot.t, tpr = slot.tpr;
    const bool live = slot.live;
    const long long r = live ? slot.row : 0, base = r * cols;
    A mu = mean[r], rs = rstd[r];
    A s1 = (A)0, s2 = (A)0;
    if (live)
        for (long long j = t; j < cols; j += tpr) {
            A gw = load_acc(g[base + j]) * (w ? load_acc(w[j]) : (A)1);
            s1 += gw;
            s2 += gw * (load_acc(x[base + j]) - mu) * rs;
        }
    s1 = group_sum_of(s1, tpr, scratch);
    s2 = group_sum_of(s2, tpr, scratch);
    if (!live) return;
    A inv_n = (A)1 / (A)cols;
    for (long long j = t; j < cols; j += tpr) {
        A gw = load_acc(g[base + j]) * (w ? load_acc(w[j]) : (A)1);
        A xh = (load_acc(x[base + j]) - mu) * rs;
        dx[base + j] = store_as<T>(rs * (gw - s1 * inv_n - xh * s2 * inv_n));
    }
}

// Partials of dw = sum_rows g * xhat and db = sum_rows g over a chunk of rows:
// dw_part / db_part are [chunks, cols] in the acc type.
template <typename T>
__global__ void layer_norm_params_kernel(const T* __restrict__ g, const T* __restrict__ x,
                                         const acc_t<T>* __restrict__ mean,
                                         const acc_t<T>* __restrict__ rstd,
                                         acc_t<T>* __restrict__ dw_part, acc_t<T>* __restrict__ db_part,
                                         long long rows, long long cols, long long rows_per_chunk) {
    typedef acc_t<T> A;
    __shared__ A tw[8][33], tb[8][33];
    long long col = (long long)blockIdx.x * 32 + threadIdx.x;
    long long r0 = (long long)blockIdx.y * rows_per_chunk;
    long long r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
    A sw = (A)0, sb = (A)0;
    if (col < cols)
        for (long long r = r0 + threadIdx.y; r < r1; r += 8) {
            A gv = load_acc(g[r * cols + col]);
            sw += gv * (load_acc(x[r * cols + col]) - mean[r]) * rstd[r];
            sb += gv;
        }
    tw[threadIdx.y][threadIdx.x] = sw;
    tb[threadIdx.y][threadIdx.x] = sb;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        for (int k = 1; k < 8; ++k) {
            sw += tw[k][threadIdx.x];
            sb += tb[k][threadIdx.x];
        }
        dw_part[(long long)blockIdx.y * cols + col] = sw;
        db_part[(long long)blockIdx.y * cols + col] = sb;
    }
}
