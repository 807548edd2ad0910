// Implicit-GEMM convolution on the tensor cores: forward, input gradient and weight
// gradient of an NCHW convolution as GEMMs whose im2col operand is gathered, tile by
// tile, into shared memory (never written to device memory).
//
// Operands are first packed channels-last by conv_pack_kernel (NHWC, channels padded
// with zeros to Cp, a multiple of 16 bytes, and rounded to TF32 for PREC_TF32), so each
// shared-memory tile row is filled by 16-byte cp.async copies, zero-filled outside the
// image.  STAGES tiles are in flight; one barrier per K tile.
//
//   conv_pack_kernel            dst[n][h][w][c] = src[n, c, h, w] (any strides), c < Cp,
//                               for two tensors in one launch (an activation and a weight):
//                               the rows q = (n, h, w) of dst in tiles of 64 rows x 32
//                               channels transposed through shared memory (tiles span
//                               images, so 3 x 3 weight planes keep every thread busy).
//                               1-D grid of both packs' tiles, block (32, 8).  Memory bound.
//   conv_pack_norm_kernel       the same, the activation normalized on the way (a GroupNorm
//                               + activation folded into the convolution: per-(n, c) scale
//                               and beta from groupnorm_stats.cu).
//   conv_fprop_kernel           out[n, j, y, x] = sum over taps (r, s) and channels c of
//                               act[n][iy][ix][c] * w[j][r][s][c].  GEMM rows are output
//                               pixels (BM per block), columns output channels (BN), K
//                               runs over (tap, channel).  The forward uses
//                               iy = y * stride - pad + r * dilation; the input gradient
//                               runs the same kernel on the packed output gradient with
//                               the weight transposed: the output pixels are split into
//                               sh x sw phases (y = py + sh * u) and a phase only sees the
//                               taps with (py + pad - r * dilation) divisible by sh, for
//                               which iy = u + (py + pad - r * dilation) / sh.  Generic
//                               form per axis: iy = u * step + (nb + phase + r * nd) / div.
//                               Grid (M tiles, N tiles, phases * splits), WM x WN warps,
//                               each a (BM/WM) x (BN/WN) tile of 16 x 8 mma tiles;
//                               registers capped for MINB blocks per SM.  The epilogue
//                               stages the tile in shared memory, then each thread writes
//                               one output pixel across the tile's channels.
//   conv_fprop_wgmma_kernel     the same GEMM on Hopper's warpgroup MMA (sm_90a; compiled
//                               only there): BM / 64 warpgroups of 64 x BN, both tiles
//                               128-byte-swizzled in shared memory and read by wgmma
//                               itself, AHEAD tile copies in flight ahead of the
//                               multiply, or (AHEAD = 0) a warpgroup of its own copying,
//                               a stage refilled as soon as its mbarrier says every
//                               multiplying warpgroup is done with it.  Same arguments,
//                               grid, split-K and epilogue.
//   conv_wgrad_kernel           dw[j][c][r][s] = sum over pixels of grad[n][p][q][j] *
//                               x[n][p*sh - ph + r*dh][q*sw - pw + s*dw][c].  GEMM rows are
//                               output channels, columns (tap, channel), K the N*P*Q
//                               pixels; both tiles are stored K-major ([k][row], ldmatrix
//                               .trans or scalar TF32 fragment loads).  Grid (M tiles,
//                               N tiles, splits).
//   conv_wgrad_wgmma_kernel     the weight gradient on warpgroup MMA (sm_90a), stride 1 and
//                               dilation 1: the same GEMM with both operands pixel-
//                               contiguous (K-major), A the output gradient [Cout][pixels]
//                               and B the input shifted per kernel column by
//                               shift_pack_kernel, so each tap's rows are contiguous runs.
//   upsample_phase_weights_kernel  the 4 x 4 transposed-convolution kernel of a 2x nearest
//                               upsampling into a 3 x 3 convolution: the forward of that
//                               pair runs as an input gradient (phases) of the small image.
//   conv_splitk_reduce_kernel   out[i] = epilogue(sum over splits of part[s][i]): split-K
//                               partials in float32, four outputs per thread, 1-D
//                               grid-stride.  Memory bound.
//
// With splits > 1 the GEMM kernels write float32 partials at the output's own index
// (part[split * total + idx]), every split writing its whole tile, zeros included.
// Bound: tensor-core throughput (the GEMM kernels) when the tiles fill the GPU.
// Indices: the host keeps packed operands and GEMM extents below 2^31 elements; output
// indices are 64-bit.
#include "common.cuh"
#include "conv_igemm.cuh"
#include "wgmma.cuh"

// N consecutive values, moved as one word (four 16-bit outputs: 8 bytes).
template <typename T, int N>
struct alignas(N * sizeof(T)) Word {
    T v[N];
};

// One PACK_ROWS-row x 32-channel tile of a pack: rows q = (n, h, w) of dst [rows][Cp] from
// src[n, c, h, w] read through element strides (sn, sc, sh, sw).  Each thread reads
// PACK_ROWS / 8 elements and writes as many, so that large activations keep enough
// loads in flight per thread.  16-bit types move two elements per access where the
// planes are contiguous (pack_tile_pairs), since a warp's 2-byte accesses cover only
// half a cache line.
#define PACK_ROWS 64

// The tile's row length: one 32-bit bank word of padding, so that a warp reading a
// column touches 32 different banks (2 elements of a 16-bit type, 1 of a 32-bit one).
template <typename T> struct PackTile {
    static const int STRIDE = PACK_ROWS + 4 / (int)sizeof(T);
    typedef T Rows[32][STRIDE];
};

// Two neighbouring 16-bit elements, moved as one 32-bit word.
template <typename T>
struct alignas(2 * sizeof(T)) Two {
    T v[2];
};

template <typename T, typename Load>
__device__ __forceinline__ void pack_tile(const T* __restrict__ src, T* __restrict__ dst,
                                          long long C, long long H, long long W, long long Cp,
                                          long long rows, long long sn, long long sc,
                                          long long sh, long long sw, bool round_tf32, int q0,
                                          int c0, typename PackTile<T>::Rows& tile, Load load) {
    const int hw = (int)(H * W);
    const T zero = store_as<T>((acc_t<T>)0);
#pragma unroll
    for (int r = 0; r < PACK_ROWS / 32; ++r) {  // read: row q = (n, p), channels c0 + y + 8j
        const int q = q0 + threadIdx.x + 32 * r, n = q / hw, p = q - n * hw;
        // a plane with sh == W * sw needs no (h, w) split of p
        const long long at =
            n * sn + (sh == W * sw ? p * sw : (p / (int)W) * sh + (p % (int)W) * sw);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int c = c0 + threadIdx.y + 8 * j;
            tile[threadIdx.y + 8 * j][threadIdx.x + 32 * r] =
                c < C && q < rows ? load(src[at + c * sc], n, c) : zero;
        }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < PACK_ROWS / 8; ++j) {  // write: row q0 + y + 8j, channel c0 + x
        const long long q = q0 + threadIdx.y + 8 * j;
        const int c = c0 + threadIdx.x;
        if (q < rows && c < Cp)
            dst[q * Cp + c] = tf32_if(tile[threadIdx.x][threadIdx.y + 8 * j], round_tf32);
    }
}

// pack_tile for a 16-bit type with contiguous planes (sw = 1, sh = W), an even plane size
// and even strides, Cp and addresses (pairs_fit): each thread reads two neighbouring
// pixels of a channel as one word (a warp: the tile's 64 pixels, 128 bytes) and writes
// two neighbouring channels of a pixel (a warp: two pixels' 32 channels).  A pair never
// straddles two images (the plane size is even) nor the end of the rows (so is rows).
template <typename T, typename Load>
__device__ __forceinline__ void pack_tile_pairs(const T* __restrict__ src, T* __restrict__ dst,
                                                long long C, long long hw, long long Cp,
                                                long long rows, long long sn, long long sc,
                                                int q0, int c0, typename PackTile<T>::Rows& tile,
                                                Load load) {
    static_assert(PACK_ROWS == 64, "a warp's pixel pairs cover the tile's rows");
    const T zero = store_as<T>((acc_t<T>)0);
    const int q = q0 + 2 * threadIdx.x;
    const long long n = q / hw, p = q - n * hw;
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // read: channel c0 + y + 8j, rows q, q + 1
        const int c = c0 + threadIdx.y + 8 * j;
        Two<T> two;
        if (c < C && q < rows) {
            two = *reinterpret_cast<const Two<T>*>(src + n * sn + c * sc + p);
            two.v[0] = load(two.v[0], (int)n, c);
            two.v[1] = load(two.v[1], (int)n, c);
        } else {
            two.v[0] = two.v[1] = zero;
        }
        *reinterpret_cast<Two<T>*>(&tile[threadIdx.y + 8 * j][2 * threadIdx.x]) = two;
    }
    __syncthreads();
    const int t = threadIdx.y * 32 + threadIdx.x;
#pragma unroll
    for (int j = 0; j < PACK_ROWS * 16 / 256; ++j) {  // write: row q0 + i / 16, channels 2 (i % 16) + 0, 1
        const int i = t + 256 * j, row = i >> 4, pair = i & 15;
        const long long r = q0 + row;
        const int c = c0 + 2 * pair;
        if (r < rows && c < Cp) {
            Two<T> two;
            two.v[0] = tile[2 * pair][row];
            two.v[1] = tile[2 * pair + 1][row];
            *reinterpret_cast<Two<T>*>(dst + r * Cp + c) = two;
        }
    }
}

// Whether a pack may take pack_tile_pairs.
template <typename T>
__device__ __forceinline__ bool pairs_fit(const T* src, const T* dst, long long H, long long W,
                                          long long Cp, long long sn, long long sc, long long sh,
                                          long long sw) {
    return sizeof(T) == 2 && sw == 1 && sh == W && (H * W) % 2 == 0 && sn % 2 == 0 &&
           sc % 2 == 0 && Cp % 2 == 0 && ((unsigned long long)src & 3) == 0 &&
           ((unsigned long long)dst & 3) == 0;
}

// One tile of a pack, through pack_tile_pairs where it fits.
template <typename T, typename Load>
__device__ __forceinline__ void pack_any(const T* __restrict__ src, T* __restrict__ dst,
                                         long long C, long long H, long long W, long long Cp,
                                         long long rows, long long sn, long long sc, long long sh,
                                         long long sw, bool round_tf32, int q0, int c0,
                                         typename PackTile<T>::Rows& tile, Load load) {
    if (pairs_fit(src, dst, H, W, Cp, sn, sc, sh, sw))
        pack_tile_pairs(src, dst, C, H * W, Cp, rows, sn, sc, q0, c0, tile, load);
    else
        pack_tile(src, dst, C, H, W, Cp, rows, sn, sc, sh, sw, round_tf32, q0, c0, tile, load);
}

// A pack's elements as they are.
struct AsIs {
    template <typename T> __device__ __forceinline__ T operator()(T v, int, int) const { return v; }
};

// A GroupNorm (+ activation) applied on the way: act((v + shift[n, c]) * scale[n, c] +
// beta[n, c]), the shifted value rounded to T first as the one-pass GroupNorm rounds it.
// coef = [scale | beta], each [N][C] in the accumulation type (groupnorm_stats.cu).
template <typename T> struct Normalize {
    const acc_t<T>* coef;
    const T* shift;
    long long C, NC;
    int act;
    __device__ __forceinline__ T operator()(T v, int n, int c) const {
        const long long nc = n * C + c;
        const acc_t<T> x = load_acc(add_shift(v, shift, nc));
        return store_as<T>(act_fwd(act, x * coef[nc] + coef[NC + nc]));
    }
};

// Two packs in one launch (the second may be empty: rows1 = 0): blocks [0, blocks0) tile
// the first, the rest the second; the first is read through `load0`.
template <typename T, typename Load>
__device__ __forceinline__ void pack_two(const T* __restrict__ src0, T* __restrict__ dst0,
                                         long long C0, long long H0, long long W0, long long Cp0,
                                         long long rows0, long long sn0, long long sc0,
                                         long long sh0, long long sw0, Load load0,
                                         const T* __restrict__ src1, T* __restrict__ dst1,
                                         long long C1, long long H1, long long W1, long long Cp1,
                                         long long rows1, long long sn1, long long sc1,
                                         long long sh1, long long sw1, bool round_tf32) {
    __shared__ __align__(16) typename PackTile<T>::Rows tile;
    const int row_tiles0 = (int)((rows0 + PACK_ROWS - 1) / PACK_ROWS);
    const int blocks0 = row_tiles0 * (int)((Cp0 + 31) / 32);
    int b = blockIdx.x;
    if (b < blocks0) {
        pack_any(src0, dst0, C0, H0, W0, Cp0, rows0, sn0, sc0, sh0, sw0, round_tf32,
                 PACK_ROWS * (b % row_tiles0), 32 * (b / row_tiles0), tile, load0);
    } else {
        b -= blocks0;
        const int row_tiles1 = (int)((rows1 + PACK_ROWS - 1) / PACK_ROWS);
        pack_any(src1, dst1, C1, H1, W1, Cp1, rows1, sn1, sc1, sh1, sw1, round_tf32,
                 PACK_ROWS * (b % row_tiles1), 32 * (b / row_tiles1), tile, AsIs());
    }
}

template <typename T>
__global__ void conv_pack_kernel(const T* __restrict__ src0, T* __restrict__ dst0, long long C0,
                                 long long H0, long long W0, long long Cp0, long long rows0,
                                 long long sn0, long long sc0, long long sh0, long long sw0,
                                 const T* __restrict__ src1, T* __restrict__ dst1, long long C1,
                                 long long H1, long long W1, long long Cp1, long long rows1,
                                 long long sn1, long long sc1, long long sh1, long long sw1,
                                 long long round_tf32) {
    pack_two(src0, dst0, C0, H0, W0, Cp0, rows0, sn0, sc0, sh0, sw0, AsIs(), src1, dst1, C1, H1,
             W1, Cp1, rows1, sn1, sc1, sh1, sw1, round_tf32 != 0);
}

// conv_pack_kernel with the first tensor (an activation [N, C, H, W]) normalized as it is
// packed: a GroupNorm + activation folded into the convolution that reads its result.
template <typename T>
__global__ void conv_pack_norm_kernel(const T* __restrict__ src0, T* __restrict__ dst0,
                                      long long C0, long long H0, long long W0, long long Cp0,
                                      long long rows0, long long sn0, long long sc0,
                                      long long sh0, long long sw0,
                                      const acc_t<T>* __restrict__ coef,
                                      const T* __restrict__ shift, long long N0, long long act,
                                      const T* __restrict__ src1, T* __restrict__ dst1,
                                      long long C1, long long H1, long long W1, long long Cp1,
                                      long long rows1, long long sn1, long long sc1,
                                      long long sh1, long long sw1, long long round_tf32) {
    const Normalize<T> load0{coef, shift, C0, N0 * C0, (int)act};
    pack_two(src0, dst0, C0, H0, W0, Cp0, rows0, sn0, sc0, sh0, sw0, load0, src1, dst1, C1, H1,
             W1, Cp1, rows1, sn1, sc1, sh1, sw1, round_tf32 != 0);
}

// Four outputs per thread when total is a multiple of four (then every split's partials
// are 16-byte aligned): one 16-byte load per split, evict-first (each partial is read
// once), up to four splits' loads in flight; the outputs past the last whole four (all of
// them otherwise) one per thread.
template <typename T>
__global__ void conv_splitk_reduce_kernel(const float* __restrict__ part, T* __restrict__ out,
                                          const T* __restrict__ bias,
                                          const T* __restrict__ residual, long long total,
                                          long long splits, long long plane, long long nout,
                                          long long act, double scale) {
    typedef acc_t<T> A;
    const long long step = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long fours = total % 4 ? 0 : total / 4;
    const float4* p = reinterpret_cast<const float4*>(part);
    for (long long q = first; q < fours; q += step) {
        float4 a = __ldcs(p + q);
        long long s = 1;
        for (; s + 3 < splits; s += 4) {
            float4 b[3], c = __ldcs(p + s * fours + q);
#pragma unroll
            for (int k = 0; k < 3; ++k) b[k] = __ldcs(p + (s + 1 + k) * fours + q);
            a.x += c.x; a.y += c.y; a.z += c.z; a.w += c.w;
#pragma unroll
            for (int k = 0; k < 3; ++k) {
                a.x += b[k].x; a.y += b[k].y; a.z += b[k].z; a.w += b[k].w;
            }
        }
        for (; s < splits; ++s) {
            const float4 c = __ldcs(p + s * fours + q);
            a.x += c.x; a.y += c.y; a.z += c.z; a.w += c.w;
        }
        const float sum[4] = {a.x, a.y, a.z, a.w};
        const long long i = 4 * q, j = (i / plane) % nout;  // one channel for all four
        Word<T, 4> o;                                        // when plane % 4 == 0
#pragma unroll
        for (int e = 0; e < 4; ++e)
            o.v[e] = conv_epilogue<T>((A)sum[e], bias, residual, i + e,
                                      plane % 4 ? ((i + e) / plane) % nout : j, (int)act, (A)scale);
        *reinterpret_cast<Word<T, 4>*>(out + i) = o;
    }
    for (long long i = 4 * fours + first; i < total; i += step) {
        A v = (A)0;
        for (long long s = 0; s < splits; ++s) v += (A)part[s * total + i];
        out[i] = conv_epilogue<T>(v, bias, residual, i, (i / plane) % nout, (int)act, (A)scale);
    }
}

// The taps of one kernel axis a phase uses: tap(j) = first + j * step for j < count, read
// at input offset (base + tap * nd) / div (exact) from u * (the pixel step).  The offsets
// form a progression too: offset(j) = at0 + j * (step * nd / div).
struct TapAxis {
    int first, count, step, at0, at_step;

    __device__ __forceinline__ TapAxis(int taps, int nb, int nd, int div, int phase, int step_)
        : first(-1), count(0), step(step_), at0(0), at_step(step_ * nd / div) {
        const int base = nb + phase;
        for (int r = 0; r < taps && r < div; ++r)
            if ((base + r * nd) % div == 0) {
                first = r;
                break;
            }
        if (first >= 0) {
            count = (taps - 1 - first) / step_ + 1;
            at0 = (base + first * nd) / div;
        }
    }
    __device__ __forceinline__ int tap(int j) const { return first + j * step; }
    __device__ __forceinline__ int offset(int j) const { return at0 + j * at_step; }
};

// The forward GEMM's problem, as the kernels receive it: packed activation [Nimg][IH][IW][Cp]
// and weights [Nout][R][S][Cp], output [Nimg][Nout][OH][OW], and per axis the phase
// geometry described at the top of the file.
// taps_inner (Cp a multiple of the K tile): K walks the taps inside each K tile's channels
// (channel block outer, tap inner) instead of every channel of a tap before the next tap,
// and the activation's copies allocate in L1, so a block's taps read their shifted
// windows of one channel block while it is still there rather than from L2 again.
struct FpropShape {
    int Nimg, IH, IW, Cp, Nout, OH, OW, R, S, step_h, step_w, nb_h, nb_w, nd_h, nd_w, div_h,
        div_w, rstep, sstep, splits, taps_inner;
};

// The block's place in the grid: its split of K, its output phase (py, px) with U x V
// pixels per image, and the tap axes that phase uses.
struct FpropBlock {
    int split, py, px, U, V, Mp, ktiles;
    TapAxis th, tw;

    __device__ __forceinline__ FpropBlock(const FpropShape& p, int bk)
        : split(blockIdx.z % p.splits),
          py((blockIdx.z / p.splits) / p.div_w),
          px((blockIdx.z / p.splits) % p.div_w),
          U((p.OH - py + p.div_h - 1) / p.div_h),
          V((p.OW - px + p.div_w - 1) / p.div_w),
          Mp(p.Nimg * U * V),
          ktiles(0),
          th(p.R, p.nb_h, p.nd_h, p.div_h, py, p.rstep),
          tw(p.S, p.nb_w, p.nd_w, p.div_w, px, p.sstep) {
        ktiles = (th.count * tw.count * p.Cp + bk - 1) / bk;
    }
};

// The cp.async copies of one thread into the forward's A tile (BM output pixels x BK,
// their im2col rows) and B tile (BN output channels x BK of packed weights): rows
// row0 + i * RPP of chunk column `col`.  Per K tile only one offset common to all rows
// changes, so a copy costs an add, a bounds check and the cp.async.
template <typename T, int BM, int BN, int BK, int RPP>
struct FpropCopy {
    static constexpr int VEC = 16 / (int)sizeof(T);
    static constexpr int A_IT = BM / RPP, B_IT = BN / RPP;
    static_assert(BM % RPP == 0 && BN % RPP == 0, "whole rows per thread");
    const T* act;
    const T* wpk;
    int a_off[A_IT], a_y[A_IT], a_x[A_IT], b_off[B_IT];
    bool b_ok[B_IT];
    int kc, kjr, kjs;  // this thread's K position: channel kc of tap slot (kjr, kjs)
    int IH, IW, Cp, S;
    bool taps_inner;
    const TapAxis* th;
    const TapAxis* tw;

    __device__ __forceinline__ FpropCopy(const T* act_, const T* wpk_, const FpropShape& p,
                                         const FpropBlock& blk, int m0, int n0, int row0,
                                         int col, int kt0, int nk)
        : act(act_), wpk(wpk_), kc(0), kjr(0), kjs(0), IH(p.IH), IW(p.IW), Cp(p.Cp), S(p.S),
          taps_inner(p.taps_inner != 0), th(&blk.th), tw(&blk.tw) {
        const int UV = blk.U * blk.V;
#pragma unroll
        for (int i = 0; i < A_IT; ++i) {  // the output pixel's input pixel at tap (0, 0)
            const int m = m0 + row0 + i * RPP;
            a_y[i] = -(1 << 30);  // outside every image: the copy is zero-filled
            a_x[i] = 0;
            a_off[i] = 0;
            if (m < blk.Mp) {
                const int n = m / UV, rem = m - n * UV, u = rem / blk.V, v = rem - u * blk.V;
                a_y[i] = u * p.step_h;
                a_x[i] = v * p.step_w;
                a_off[i] = ((n * IH + a_y[i]) * IW + a_x[i]) * Cp;
            }
        }
#pragma unroll
        for (int i = 0; i < B_IT; ++i) {
            const int j = n0 + row0 + i * RPP;
            b_ok[i] = j < p.Nout;
            b_off[i] = b_ok[i] ? j * p.R * S * Cp : 0;
        }
        if (nk > 0) {
            int slot;
            if (taps_inner) {  // K tile kt0 = channel block kt0 / taps at tap kt0 % taps
                const int taps = th->count * tw->count;
                slot = kt0 % taps;
                kc = (kt0 / taps) * BK + col * VEC;
            } else {
                const int k = kt0 * BK + col * VEC;
                slot = k / Cp;
                kc = k - slot * Cp;
            }
            kjr = slot / tw->count;
            kjs = slot - kjr * tw->count;
        }
    }

    // Issue this thread's copies of the next K tile: A row i to a_dst + i * row_step,
    // B row i to b_dst + i * row_step (shared byte addresses).
    __device__ __forceinline__ void copy(unsigned a_dst, unsigned b_dst, unsigned row_step) {
        const bool kvalid = kjr < th->count && kc < Cp;
        int dy = 0, dx = 0, tap = 0;
        if (kvalid) {
            dy = th->offset(kjr);
            dx = tw->offset(kjs);
            tap = th->tap(kjr) * S + tw->tap(kjs);
        }
        const int a_delta = (dy * IW + dx) * Cp + kc, b_delta = tap * Cp + kc;
#pragma unroll
        for (int i = 0; i < A_IT; ++i) {
            const bool ok = kvalid && (unsigned)(a_y[i] + dy) < (unsigned)IH &&
                            (unsigned)(a_x[i] + dx) < (unsigned)IW;
            const T* src = act + (ok ? a_off[i] + a_delta : 0);
            if (taps_inner)
                cp_async16_l1(a_dst + i * row_step, src, ok);
            else
                cp_async16(a_dst + i * row_step, src, ok);
        }
#pragma unroll
        for (int i = 0; i < B_IT; ++i) {
            const bool ok = kvalid && b_ok[i];
            cp_async16(b_dst + i * row_step, wpk + (ok ? b_off[i] + b_delta : 0), ok);
        }
        if (taps_inner) {  // the next tap, or the first tap of the next channel block
            if (++kjs == tw->count) {
                kjs = 0;
                if (++kjr == th->count) {
                    kjr = 0;
                    kc += BK;
                }
            }
            return;
        }
        kc += BK;  // the next K tile
        while (kc >= Cp) {
            kc -= Cp;
            if (++kjs == tw->count) {
                kjs = 0;
                ++kjr;
            }
        }
    }
};

// Whether `ptr` (null or not) is aligned to `bytes`.
__device__ __forceinline__ bool aligned_to(const void* ptr, unsigned bytes) {
    return ((unsigned long long)ptr & (bytes - 1)) == 0;
}

// fprop_store's walk with PIX neighbouring output pixels per thread (PIX = 4: one 8- or
// 16-byte store per channel, only for an unphased output whose rows are whole fours, so
// that the tile's fours never straddle a row, with every array aligned to them).
template <typename T, int BM, int BN, int THREADS, int PIX>
__device__ __forceinline__ void fprop_store_pixels(const float* staged, int LDO,
                                                   const FpropShape& p, const FpropBlock& blk,
                                                   int m0, int n0, T* __restrict__ out,
                                                   float* __restrict__ part,
                                                   const T* __restrict__ bias,
                                                   const T* __restrict__ residual,
                                                   int act_code, float scale) {
    constexpr int GROUPS = BM / PIX, CH_LANES = THREADS >= GROUPS ? THREADS / GROUPS : 1;
    const long long plane = (long long)p.OH * p.OW;
    const long long total = (long long)p.Nimg * p.Nout * plane;
    const int nch = imin(BN, p.Nout - n0), UV = blk.U * blk.V, tid = threadIdx.x;
    for (int g = tid % GROUPS; g < GROUPS; g += THREADS) {
        const int mm = PIX * g, m = m0 + mm;
        if (m >= blk.Mp) break;
        const int n = m / UV, rem = m - n * UV, u = rem / blk.V, v = rem - u * blk.V;
        const long long row = ((long long)n * p.Nout + n0) * plane +
                              (long long)(blk.py + u * p.div_h) * p.OW + (blk.px + v * p.div_w);
        for (int c = tid / GROUPS; c < nch; c += CH_LANES) {
            const long long idx = row + (long long)c * plane;
            typedef Word<float, PIX> Staged;
            const Staged vals = *reinterpret_cast<const Staged*>(staged + c * LDO + mm);
            if (p.splits > 1) {
                *reinterpret_cast<Staged*>(part + blk.split * total + idx) = vals;
            } else {
                Word<T, PIX> o;
#pragma unroll
                for (int e = 0; e < PIX; ++e)
                    o.v[e] = conv_epilogue<T>(vals.v[e], bias, residual, idx + e, n0 + c, act_code,
                                              scale);
                *reinterpret_cast<Word<T, PIX>*>(out + idx) = o;
            }
        }
    }
}

// The forward's epilogue from a tile staged channel-major in shared memory
// (staged[c * LDO + m] for the tile's channel c and pixel m, LDO a multiple of 4): each
// thread takes one output pixel (four where they fit) and walks the channels, so a warp
// writes consecutive pixels of a channel (coalesced stores) and the pixels' (n, y, x) is
// decoded once.  With splits the float32 partials are written instead.
template <typename T, int BM, int BN, int THREADS>
__device__ __forceinline__ void fprop_store(const float* staged, int LDO, const FpropShape& p,
                                            const FpropBlock& blk, int m0, int n0,
                                            T* __restrict__ out, float* __restrict__ part,
                                            const T* __restrict__ bias,
                                            const T* __restrict__ residual, int act_code,
                                            float scale) {
    if (p.div_h == 1 && p.div_w == 1 && p.OW % 4 == 0 && aligned_to(out, 4 * sizeof(T)) &&
        aligned_to(residual, 4 * sizeof(T)) && aligned_to(part, 16))
        fprop_store_pixels<T, BM, BN, THREADS, 4>(staged, LDO, p, blk, m0, n0, out, part, bias,
                                                  residual, act_code, scale);
    else
        fprop_store_pixels<T, BM, BN, THREADS, 1>(staged, LDO, p, blk, m0, n0, out, part, bias,
                                                  residual, act_code, scale);
}

// This block's K tiles [kt0, kt0 + nk) of its split.
__device__ __forceinline__ void split_range(int ktiles, int splits, int split, int& kt0, int& nk) {
    const int kper = (ktiles + splits - 1) / splits;
    kt0 = imin(ktiles, split * kper);
    nk = imin(ktiles, kt0 + kper) - kt0;
}

template <typename T, int PREC, int BM, int BN, int BK, int WM, int WN, int STAGES, int MINB>
__global__ void __launch_bounds__(WM * WN * 32, MINB)
conv_fprop_kernel(const T* __restrict__ act, const T* __restrict__ wpk, T* __restrict__ out,
                  float* __restrict__ part, const T* __restrict__ bias,
                  const T* __restrict__ residual, FpropShape p, int act_code, float scale) {
    constexpr int THREADS = WM * WN * 32;
    constexpr int VEC = 16 / (int)sizeof(T);   // elements per 16-byte chunk
    constexpr int KMMA = 2 * VEC;              // K of one mma
    constexpr int CPR = BK / VEC;              // chunks per tile row
    constexpr int LDK = BK + VEC;              // row stride: +16 bytes, no ldmatrix conflicts
    constexpr int RPP = THREADS / CPR;         // tile rows one pass of the block copies
    constexpr int WTM = BM / WM, WTN = BN / WN, MT = WTM / 16, NT = WTN / 8;
    constexpr int STAGE = (BM + BN) * LDK;
    static_assert(THREADS % CPR == 0 && BM % RPP == 0 && BN % RPP == 0, "copy layout");
    static_assert(WTM % 16 == 0 && WTN % 16 == 0 && BK % KMMA == 0, "warp tile");

    extern __shared__ uint4 smem_words[];  // 16-byte aligned
    T* smem = reinterpret_cast<T*>(smem_words);

    const FpropBlock blk(p, BK);
    if (blk.U <= 0 || blk.V <= 0) return;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    if (m0 >= blk.Mp) return;
    int kt0, nk;
    split_range(blk.ktiles, p.splits, blk.split, kt0, nk);

    const int tid = threadIdx.x, col = tid % CPR, row0 = tid / CPR;
    FpropCopy<T, BM, BN, BK, RPP> copies(act, wpk, p, blk, m0, n0, row0, col, kt0, nk);

    // shared-memory byte addresses: stage s of this thread's copy destinations starts
    // at *_dst + s * STAGE_BYTES, row i of them i * ROW_STEP further
    constexpr unsigned STAGE_BYTES = STAGE * sizeof(T), ROW_STEP = RPP * LDK * sizeof(T);
    const unsigned smem_base = smem_addr(smem);
    const unsigned a_dst = smem_base + (row0 * LDK + col * VEC) * sizeof(T);
    const unsigned b_dst = a_dst + BM * LDK * sizeof(T);
    auto load_tile = [&](int stage) {
        const unsigned so = stage * STAGE_BYTES;
        copies.copy(a_dst + so, b_dst + so, ROW_STEP);
    };

    const int lane = tid & 31, warp = tid >> 5, wm = warp % WM, wn = warp / WM;
    float acc[MT][NT][4];
    zero(acc);

    // ldmatrix row addresses of this lane: A rows i * 16 + (lane & 15), chunk lane >> 4;
    // B rows j * 8 + (lane & 7) + 8 * (lane >> 4), chunk (lane >> 3) & 1
    const unsigned a_ld = smem_base + ((wm * WTM + (lane & 15)) * LDK + (lane >> 4) * VEC) * sizeof(T);
    const unsigned b_ld = smem_base + ((BM + wn * WTN + (lane & 7) + ((lane >> 4) << 3)) * LDK +
                                       ((lane >> 3) & 1) * VEC) * sizeof(T);

    unsigned a[2][MT][4], b[2][NT][2];  // fragments of two slices
    auto load_frag = [&](int buf, int stage, int ks) {
        const unsigned at = stage * STAGE_BYTES + ks * KMMA * sizeof(T);
#pragma unroll
        for (int i = 0; i < MT; ++i) ldsm_x4(a[buf][i], a_ld + at + i * 16 * LDK * sizeof(T));
#pragma unroll
        for (int j = 0; j < NT; j += 2) {
            unsigned r[4];
            ldsm_x4(r, b_ld + at + j * 8 * LDK * sizeof(T));
            b[buf][j][0] = r[0];
            b[buf][j][1] = r[1];
            b[buf][j + 1][0] = r[2];
            b[buf][j + 1][1] = r[3];
        }
    };
    auto mma = [&](int buf) { mma_slice<T, PREC, MT, NT>(acc, a[buf], b[buf]); };

    multistage<STAGES, BK / KMMA>(nk, load_tile, load_frag, mma);

    // the accumulators staged channel-major ([BN][BM + 4] floats, over the pipeline's
    // buffers) for fprop_store
    constexpr int LDO = BM + 4;  // 4 mod 32 words: the fragment stores hit 32 banks
    static_assert(BN * LDO * 4 <= STAGES * STAGE * (int)sizeof(T), "staging fits the pipeline");
    float* staged = reinterpret_cast<float*>(smem_words);
    const int g = lane >> 2, t4 = lane & 3;
    __syncthreads();  // every warp is done reading the last stage
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                staged[(wn * WTN + j * 8 + 2 * t4 + (e & 1)) * LDO + wm * WTM + i * 16 + g +
                       (e >> 1) * 8] = acc[i][j][e];
    __syncthreads();
    fprop_store<T, BM, BN, THREADS>(staged, LDO, p, blk, m0, n0, out, part, bias, residual,
                                    act_code, scale);
}

// Warpgroup wg's multiply of the K tile in the stage at `stage`: its 64 rows of A times
// B, four wgmma of 32 bytes of K each, committed as one group.
template <typename T, int BM, int BN>
__device__ __forceinline__ void wgmma_tile(float (&acc)[BN / 2], unsigned stage, int wg) {
    const unsigned a_tile = stage + wg * 64 * 128, b_tile = stage + BM * 128;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
        Wgmma<T, BN>::run(acc, wgmma_desc(a_tile + 32 * ks), wgmma_desc(b_tile + 32 * ks));
    wgmma_commit();
}

// The main loop of the wgmma kernels (sm_90a): BM / 64 warpgroups, each accumulating a
// 64 x BN tile of D += A B^T over nk K tiles of 128 bytes, both operands read by wgmma
// straight from shared memory (128-byte-swizzled K-major tiles; stages from `base`, a
// 1024-byte boundary), so no thread loads fragments.  `copies.copy(a_dst, b_dst,
// row_step)` issues this thread's cp.async of the next K tile: chunk tid % 8 of rows
// tid / 8 + i * (THREADS / 8).  AHEAD tile copies are in flight ahead of the tile being
// multiplied and BEHIND = STAGES - 1 - AHEAD wgmma groups behind it (1: the multiplies
// of consecutive tiles overlap; 0: each waits for the last, so one more stage is free
// for copies): a stage is refilled BEHIND + 1 tiles after it was multiplied, once the
// barrier has shown that every warpgroup finished with it.
template <typename T, int BM, int BN, int STAGES, int AHEAD, typename Copies>
__device__ __forceinline__ void wgmma_mainloop(Copies& copies, int nk, unsigned base,
                                               float (&acc)[BN / 2]) {
    constexpr int THREADS = BM * 2, RPP = THREADS / 8, BEHIND = STAGES - 1 - AHEAD;
    constexpr unsigned STAGE_BYTES = (BM + BN) * 128, ROW_STEP = RPP * 128;
    static_assert(BM % 64 == 0 && BN % 32 == 0 && BN <= 256 && STAGES >= 3, "tile");
    static_assert(AHEAD >= 1 && (BEHIND == 0 || BEHIND == 1), "pipeline");
    const int tid = threadIdx.x, col = tid % 8, row0 = tid / 8, wg = tid / 128;
    const unsigned swizzled = row0 * 128 + ((col ^ (row0 & 7)) << 4);  // RPP % 8 == 0
    auto load_tile = [&](int stage) {
        const unsigned so = base + stage * STAGE_BYTES + swizzled;
        copies.copy(so, so + BM * 128, ROW_STEP);
    };
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
#pragma unroll
    for (int s = 0; s < AHEAD; ++s) {
        if (s < nk) load_tile(s);
        cp_async_commit();
    }
    for (int kt = 0; kt < nk; ++kt) {
        cp_async_wait<AHEAD - 1>();  // tile kt has landed (this thread's copies) ...
        fence_async_shared();        // ... where wgmma can see it ...
        __syncthreads();             // ... for every thread; and tile kt - 1 - BEHIND is done
        wgmma_tile<T, BM, BN>(acc, base + (kt % STAGES) * STAGE_BYTES, wg);
        const int next = kt + AHEAD;  // into the stage of tile kt - 1 - BEHIND
        if (next < nk) load_tile(next % STAGES);
        cp_async_commit();
        wgmma_wait<BEHIND>();  // this warpgroup's tile kt - BEHIND is done
    }
    wgmma_wait<0>();
    wgmma_hold(acc);
    cp_async_wait<0>();
}

// A copy's row step as a type, for make_copies(RowStep<RPP>(), row0, col).
template <int RPP> struct RowStep {
    static constexpr int value = RPP;
};

// wgmma_mainloop with the copies on a warpgroup of their own (AHEAD = 0): the block's
// last 128 threads copy, the BM / 64 warpgroups before them multiply.  Stage s has two
// mbarriers after the stages (from base + STAGES * (BM + BN) * 128): full[s], completed
// when every copying thread's cp.async of the stage has landed, and empty[s], when every
// multiplying warpgroup's wgmma of it is done.  A stage is refilled as soon as it is
// empty, so up to STAGES - 1 tiles are in flight while one is multiplied, and no barrier
// of the whole block runs inside the loop.  make_copies(RowStep<16>(), row0, col) builds
// a copying thread's copies (rows row0 + i * 16).  The copying threads' acc stay zero.
template <typename T, int BM, int BN, int STAGES, typename MakeCopies>
__device__ __forceinline__ void wgmma_mainloop_producer(const MakeCopies& make_copies, int nk,
                                                        unsigned base, float (&acc)[BN / 2]) {
    constexpr int CONSUMERS = BM / 64;
    constexpr unsigned STAGE_BYTES = (BM + BN) * 128, ROW_STEP = 16 * 128;
    static_assert(BM % 64 == 0 && BN % 32 == 0 && BN <= 256 && STAGES >= 2, "tile");
    const unsigned full = base + STAGES * STAGE_BYTES, empty = full + STAGES * 8;
    const int tid = threadIdx.x, wg = tid / 128;
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full + 8 * s, 128);
            mbar_init(empty + 8 * s, CONSUMERS);
        }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
    if (wg == CONSUMERS) {
        const int col = tid % 8, row0 = (tid % 128) / 8;
        auto copies = make_copies(RowStep<16>(), row0, col);
        const unsigned swizzled = row0 * 128 + ((col ^ (row0 & 7)) << 4);  // 16 % 8 == 0
        for (int kt = 0; kt < nk; ++kt) {
            const int s = kt % STAGES;
            if (kt >= STAGES) mbar_wait(empty + 8 * s, ((kt / STAGES) & 1) ^ 1);
            const unsigned so = base + s * STAGE_BYTES + swizzled;
            copies.copy(so, so + BM * 128, ROW_STEP);
            mbar_arrive_on_copies(full + 8 * s);
        }
        cp_async_wait<0>();
        return;
    }
    for (int kt = 0; kt < nk; ++kt) {
        const int s = kt % STAGES;
        mbar_wait(full + 8 * s, (kt / STAGES) & 1);  // tile kt has landed ...
        fence_async_shared();                          // ... where wgmma can see it
        wgmma_tile<T, BM, BN>(acc, base + s * STAGE_BYTES, wg);
        wgmma_wait<1>();  // this warpgroup's tile kt - 1 is done: its stage may be refilled
        if (kt > 0 && tid % 128 == 0) mbar_arrive(empty + 8 * ((kt - 1) % STAGES));
    }
    wgmma_wait<0>();
    wgmma_hold(acc);
}

// A wgmma kernel's threads: BM / 64 multiplying warpgroups, and with AHEAD = 0 one
// copying warpgroup more.
template <int BM, int AHEAD> struct WgmmaThreads {
    static constexpr int value = BM * 2 + (AHEAD == 0 ? 128 : 0);
};

// The main loop a wgmma kernel's AHEAD asks for: copies in the multiplying threads
// (AHEAD > 0) or on a warpgroup of their own (AHEAD = 0).  make_copies(RowStep<RPP>(),
// row0, col) builds one thread's copies, rows RPP apart.
template <typename T, int BM, int BN, int STAGES, int AHEAD, typename MakeCopies>
__device__ __forceinline__ void wgmma_pipeline(const MakeCopies& make_copies, int nk,
                                               unsigned base, float (&acc)[BN / 2]) {
    if constexpr (AHEAD == 0) {
        wgmma_mainloop_producer<T, BM, BN, STAGES>(make_copies, nk, base, acc);
    } else {
        const int tid = threadIdx.x;
        auto copies = make_copies(RowStep<BM * 2 / 8>(), tid / 8, tid % 8);
        wgmma_mainloop<T, BM, BN, STAGES, AHEAD>(copies, nk, base, acc);
    }
}

// The first 1024-byte boundary of the dynamic shared memory (the host adds 1024 bytes).
__device__ __forceinline__ unsigned aligned_smem_base(const void* smem) {
    return (smem_addr(smem) + 1023) & ~1023u;
}

// conv_fprop_kernel on Hopper's warpgroup MMA: wgmma_mainloop over the same copies, then
// the same epilogue.
template <typename T, int PREC, int BM, int BN, int STAGES, int AHEAD>
__global__ void __launch_bounds__(WgmmaThreads<BM, AHEAD>::value, 1)
conv_fprop_wgmma_kernel(const T* __restrict__ act, const T* __restrict__ wpk, T* __restrict__ out,
                        float* __restrict__ part, const T* __restrict__ bias,
                        const T* __restrict__ residual, FpropShape p, int act_code, float scale) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int THREADS = WgmmaThreads<BM, AHEAD>::value;  // BM / 64 multiplying warpgroups
    constexpr int BK = 128 / (int)sizeof(T);              // one 128-byte swizzle row of K
    static_assert(PREC != PREC_3XTF32, "3xTF32 runs on conv_fprop_kernel");

    extern __shared__ uint4 smem_words[];
    const FpropBlock blk(p, BK);
    if (blk.U <= 0 || blk.V <= 0) return;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    if (m0 >= blk.Mp) return;
    int kt0, nk;
    split_range(blk.ktiles, p.splits, blk.split, kt0, nk);

    const int tid = threadIdx.x;
    const unsigned base = aligned_smem_base(smem_words);
    float acc[BN / 2];
    wgmma_pipeline<T, BM, BN, STAGES, AHEAD>(
        [&](auto rows, int row0, int col) {
            return FpropCopy<T, BM, BN, BK, decltype(rows)::value>(act, wpk, p, blk, m0, n0, row0,
                                                                   col, kt0, nk);
        },
        nk, base, acc);

    // the accumulators staged channel-major ([BN][BM + 4] floats) for fprop_store
    constexpr int LDO = BM + 4;
    static_assert(BN * LDO * 4 <= STAGES * (BM + BN) * 128, "staging fits the pipeline");
    float* staged = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(smem_words) +
                                             (base - smem_addr(smem_words)));
    const int lane = tid & 31, wg = tid / 128, w = (tid >> 5) & 3, g = lane >> 2, t4 = lane & 3;
    __syncthreads();  // every warpgroup is done reading the stages
    if (wg < BM / 64) {
#pragma unroll
        for (int i = 0; i < BN / 8; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                staged[(8 * i + 2 * t4 + (e & 1)) * LDO + wg * 64 + 16 * w + g + 8 * (e >> 1)] =
                    acc[4 * i + e];
    }
    __syncthreads();
    fprop_store<T, BM, BN, THREADS>(staged, LDO, p, blk, m0, n0, out, part, bias, residual,
                                    act_code, scale);
#endif
}

// The weight gradient's problem for conv_wgrad_wgmma_kernel (stride 1, dilation 1):
// grad [Nimg][Cout][PQ] (P x Q output pixels), xs [S][Nimg][C][Hp * Q] = the input shifted
// by each kernel column s and padded by whole rows (shift_pack_kernel), so that tap
// (r, s) of output pixel t reads xs[s][n][c][t + r * Q]; dw [Cout][C][R][S].
struct WgradShape {
    int Nimg, Cout, C, PQ, Q, Hp, R, S, splits;
};

// The cp.async copies of one thread into the weight gradient's A tile (BM output
// channels x BK pixels of grad) and B tile (BN columns (c, tap) x BK pixels of xs), both
// pixel-contiguous (K-major): rows row0 + i * RPP, 16-byte chunk `col` of the K tile.  A
// K tile never spans two images (PQ % BK == 0), so a copy adds the image's offset and the
// tile's pixel to a per-row base.
template <typename T, int BM, int BN, int BK, int RPP>
struct WgradCopy {
    static constexpr int VEC = 16 / (int)sizeof(T);
    static constexpr int A_IT = BM / RPP, B_IT = BN / RPP;
    static_assert(BM % RPP == 0 && BN % RPP == 0, "whole rows per thread");
    const T* grad;
    const T* xs;
    int a_off[A_IT], b_off[B_IT];  // the row's element offset in image 0, -1: outside
    int a_image, b_image;          // elements between two images' rows
    int n, pixel, PQ;              // the next K tile: image n, pixels [pixel, pixel + BK)

    __device__ __forceinline__ WgradCopy(const T* grad_, const T* xs_, const WgradShape& p,
                                         int m0, int n0, int row0, int col, int kt0)
        : grad(grad_), xs(xs_), a_image(p.Cout * p.PQ), b_image(p.C * p.Hp * p.Q), PQ(p.PQ) {
        const int plane = p.Hp * p.Q;
#pragma unroll
        for (int i = 0; i < A_IT; ++i) {
            const int co = m0 + row0 + i * RPP;
            a_off[i] = co < p.Cout ? co * p.PQ + col * VEC : -1;
        }
#pragma unroll
        for (int i = 0; i < B_IT; ++i) {
            const int j = n0 + row0 + i * RPP, c = j / (p.R * p.S), tap = j - c * (p.R * p.S);
            const int r = tap / p.S, s = tap - r * p.S;
            b_off[i] = c < p.C ? ((s * p.Nimg) * p.C + c) * plane + r * p.Q + col * VEC : -1;
        }
        const int k = kt0 * BK;
        n = k / PQ;
        pixel = k - n * PQ;
    }

    __device__ __forceinline__ void copy(unsigned a_dst, unsigned b_dst, unsigned row_step) {
        const int a_at = n * a_image + pixel, b_at = n * b_image + pixel;
#pragma unroll
        for (int i = 0; i < A_IT; ++i)
            cp_async16(a_dst + i * row_step, grad + (a_off[i] >= 0 ? a_off[i] + a_at : 0),
                       a_off[i] >= 0);
#pragma unroll
        for (int i = 0; i < B_IT; ++i)
            cp_async16(b_dst + i * row_step, xs + (b_off[i] >= 0 ? b_off[i] + b_at : 0),
                       b_off[i] >= 0);
        pixel += BK;
        if (pixel == PQ) {
            pixel = 0;
            ++n;
        }
    }
};

// dw[j][c][r][s] = sum over images and output pixels t of grad[n][j][t] *
// xs[s][n][c][t + r * Q] (stride 1, dilation 1) on Hopper's warpgroup MMA: GEMM rows are
// output channels (BM per block), columns (channel, tap) (BN) -- dw's own order, so the
// accumulators are stored in pairs of neighbours -- and K the pixels; grid (M tiles,
// N tiles, splits), split-K partials as in conv_wgrad_kernel.
template <typename T, int PREC, int BM, int BN, int STAGES, int AHEAD>
__global__ void __launch_bounds__(WgmmaThreads<BM, AHEAD>::value, 1)
conv_wgrad_wgmma_kernel(const T* __restrict__ grad, const T* __restrict__ xs, T* __restrict__ dw,
                        float* __restrict__ part, WgradShape p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BK = 128 / (int)sizeof(T);
    static_assert(PREC != PREC_3XTF32, "3xTF32 runs on conv_wgrad_kernel");

    extern __shared__ uint4 smem_words[];
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN, split = blockIdx.z;
    int kt0, nk;
    split_range(p.Nimg * (p.PQ / BK), p.splits, split, kt0, nk);
    const int tid = threadIdx.x;
    float acc[BN / 2];
    wgmma_pipeline<T, BM, BN, STAGES, AHEAD>(
        [&](auto rows, int row0, int col) {
            return WgradCopy<T, BM, BN, BK, decltype(rows)::value>(grad, xs, p, m0, n0, row0, col,
                                                                   kt0);
        },
        nk, aligned_smem_base(smem_words), acc);
    if (tid >= BM * 2) return;  // the copying warpgroup holds no accumulators

    // columns j = c * R * S + tap: dw's own layout, row co at co * Ncols
    const int Ncols = p.C * p.R * p.S, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int row = m0 + (tid / 128) * 64 + 16 * ((tid >> 5) & 3) + g;
    const long long total = (long long)p.Cout * Ncols;
#pragma unroll
    for (int i = 0; i < BN / 8; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int co = row + 8 * h, j = n0 + 8 * i + 2 * t4;
            if (co >= p.Cout) continue;
            const long long idx = (long long)co * Ncols + j;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                if (j + e >= Ncols) continue;
                if (p.splits > 1)
                    part[split * total + idx + e] = acc[4 * i + 2 * h + e];
                else
                    dw[idx + e] = store_as<T>(acc[4 * i + 2 * h + e]);
            }
        }
#endif
}

// wt[j][a][b][c] = the sum of w[j, c, t, s] over the 3 x 3 taps (t, s) that reach tap
// (a, b) of the 4 x 4 kernel, zero for c >= C (w read through element strides; sums in
// acc_t, rounded once, to TF32 when asked).  A 2x nearest upsampling followed by a 3 x 3
// convolution with padding 1 is the stride-2 transposed convolution of the small image
// with this kernel: per axis, output 2u + p reads input u + (p + 1 - a) / 2 for the a
// of p's parity, and tap t of the 3 lands on a = 2 - t and a = 3 - t.  One output per
// thread, grid-stride.  Memory bound (a weight's worth).
template <typename T>
__global__ void upsample_phase_weights_kernel(const T* __restrict__ w, T* __restrict__ wt, int Co,
                                              int C, int Cp, long long sj, long long sc,
                                              long long st, long long ss, int round_tf32) {
    const int total = Co * 16 * Cp;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const int c = i % Cp, ab = (i / Cp) % 16, j = i / (16 * Cp), a = ab / 4, b = ab % 4;
        acc_t<T> sum = (acc_t<T>)0;
        if (c < C) {
            for (int t = max(0, 2 - a); t <= min(2, 3 - a); ++t)
                for (int s = max(0, 2 - b); s <= min(2, 3 - b); ++s)
                    sum += load_acc(w[j * sj + c * sc + t * st + s * ss]);
        }
        wt[i] = tf32_if(store_as<T>(sum), round_tf32 != 0);
    }
}

// xs[s][n][c][y][q] = x[n, c, y - ph, q - pw + s] (zero outside x), rounded to TF32 when
// asked, for s < S, y < Hp, q < Q: the weight gradient's shifted copies of its input
// (with S = 1 and no padding, a dense copy of the output gradient).  x is read through
// element strides.  Each thread writes 16-byte chunks of a row (Q is a whole number of
// chunks), grid-stride; the chunk's row (s, n, c, y) is decoded with 32-bit divisions
// (host: xs below 2**31 elements).  Memory bound.
template <typename T>
__global__ void shift_pack_kernel(const T* __restrict__ x, T* __restrict__ xs, int Nimg, int C,
                                  int H, int W, long long sn, long long sc, long long sh,
                                  long long sw, int S, int Hp, int Q, int ph, int pw,
                                  int round_tf32) {
    constexpr int VEC = 16 / (int)sizeof(T);
    const int per_row = Q / VEC, chunks = S * Nimg * C * Hp * per_row;
    const T zero = store_as<T>((acc_t<T>)0);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < chunks; i += gridDim.x * blockDim.x) {
        const int row = i / per_row, q0 = (i - row * per_row) * VEC;
        const int y = row % Hp, nc = (row / Hp) % (Nimg * C), s = row / (Hp * Nimg * C);
        const int n = nc / C, c = nc - n * C, iy = y - ph;
        const T* src = x + n * sn + c * sc + iy * sh;
        Pack<T> out;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            const int ix = q0 + e - pw + s;
            out.v[e] = iy >= 0 && iy < H && ix >= 0 && ix < W
                           ? tf32_if(src[ix * sw], round_tf32 != 0) : zero;
        }
        *reinterpret_cast<Pack<T>*>(xs + (long long)row * Q + q0) = out;
    }
}

template <typename T, int PREC, int BM, int BN, int BK, int WM, int WN, int STAGES, int MINB>
__global__ void __launch_bounds__(WM * WN * 32, MINB)
conv_wgrad_kernel(const T* __restrict__ gh, const T* __restrict__ xh, T* __restrict__ dw,
                  float* __restrict__ part, int Nimg, int P, int Q, int IH, int IW, int Co,
                  int Cop, int C, int Cp, int R, int S, int sh, int sw, int ph, int pw, int dh,
                  int dwl, int splits) {
    constexpr int THREADS = WM * WN * 32;
    constexpr int VEC = 16 / (int)sizeof(T);
    constexpr int KMMA = 2 * VEC;
    constexpr int LDA = BM + 8, LDB = BN + 8;  // [k][row] tiles; +8 elements: no conflicts
    constexpr int A_CPR = BM / VEC, B_CPR = BN / VEC;
    constexpr int A_RPP = THREADS / A_CPR, B_RPP = THREADS / B_CPR;
    constexpr int A_IT = BK / A_RPP, B_IT = BK / B_RPP;
    constexpr int WTM = BM / WM, WTN = BN / WN, MT = WTM / 16, NT = WTN / 8;
    constexpr int STAGE = BK * (LDA + LDB);
    static_assert(THREADS % A_CPR == 0 && THREADS % B_CPR == 0, "copy layout");
    static_assert(BK % A_RPP == 0 && BK % B_RPP == 0, "copy layout");
    static_assert(WTM % 16 == 0 && WTN % 16 == 0 && BK % KMMA == 0, "warp tile");

    extern __shared__ uint4 smem_words[];  // 16-byte aligned
    T* smem = reinterpret_cast<T*>(smem_words);

    const int split = blockIdx.z;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int PQ = P * Q, Kpix = Nimg * PQ, Ncols = R * S * Cp;
    int kt0, nk;
    split_range((Kpix + BK - 1) / BK, splits, split, kt0, nk);

    const int tid = threadIdx.x;
    // A: chunk a_col of output channels at pixels k
    const int a_col = tid % A_CPR, a_row0 = tid / A_CPR, a_co = m0 + a_col * VEC;
    const bool a_ok = a_co < Cop;
    int a_k = kt0 * BK + a_row0;
    // B: chunk b_col of (tap, channel) columns, fixed for the whole K loop
    const int b_col = tid % B_CPR, b_row0 = tid / B_CPR, nn = n0 + b_col * VEC;
    const bool b_ok = nn < Ncols;
    const int tap = nn / Cp, bc = nn - tap * Cp, tr = tap / S, ts = tap - tr * S;
    const int offy = tr * dh - ph, offx = ts * dwl - pw;
    int b_n[B_IT], b_p[B_IT], b_q[B_IT];  // pixel (n, p, q) of each row this thread copies
#pragma unroll
    for (int i = 0; i < B_IT; ++i) {
        const int k = kt0 * BK + b_row0 + i * B_RPP;
        b_n[i] = k / PQ;
        const int rem = k - b_n[i] * PQ;
        b_p[i] = rem / Q;
        b_q[i] = rem - b_p[i] * Q;
    }

    // shared-memory byte addresses of this thread's copy destinations in stage 0
    constexpr unsigned STAGE_BYTES = STAGE * sizeof(T);
    const unsigned smem_base = smem_addr(smem);
    const unsigned a_dst = smem_base + (a_row0 * LDA + a_col * VEC) * sizeof(T);
    const unsigned b_dst = smem_base + (BK * LDA + b_row0 * LDB + b_col * VEC) * sizeof(T);

    auto load_tile = [&](int stage) {
        const unsigned so = stage * STAGE_BYTES;
#pragma unroll
        for (int i = 0; i < A_IT; ++i) {
            const int k = a_k + i * A_RPP;
            const bool p = a_ok && k < Kpix;
            cp_async16(a_dst + so + i * A_RPP * LDA * sizeof(T), gh + (p ? k * Cop + a_co : 0), p);
        }
        a_k += BK;
#pragma unroll
        for (int i = 0; i < B_IT; ++i) {
            const int iy = b_p[i] * sh + offy, ix = b_q[i] * sw + offx;
            const bool p = b_ok && b_n[i] < Nimg && (unsigned)iy < (unsigned)IH &&
                           (unsigned)ix < (unsigned)IW;
            cp_async16(b_dst + so + i * B_RPP * LDB * sizeof(T),
                       xh + (p ? ((b_n[i] * IH + iy) * IW + ix) * Cp + bc : 0), p);
            b_q[i] += BK;  // the same row of the next K tile
            if (b_q[i] >= Q) {
                const int carry = b_q[i] / Q;
                b_q[i] -= carry * Q;
                b_p[i] += carry;
                if (b_p[i] >= P) {
                    const int carry_p = b_p[i] / P;
                    b_p[i] -= carry_p * P;
                    b_n[i] += carry_p;
                }
            }
        }
    };

    const int lane = tid & 31, warp = tid >> 5, wm = warp % WM, wn = warp / WM;
    const int g = lane >> 2, t4 = lane & 3;
    float acc[MT][NT][4];
    zero(acc);

    // ldmatrix (.trans) row addresses of this lane in stage 0, 16-bit operands: A rows
    // k = (lane & 7) + 8 * (lane >> 4), chunk (lane >> 3) & 1; B rows k = (lane & 7) +
    // 8 * ((lane >> 3) & 1), chunk lane >> 4
    const unsigned a_ld = smem_base + (((lane & 7) + ((lane >> 4) << 3)) * LDA + wm * WTM +
                                       ((lane >> 3) & 1) * 8) * sizeof(T);
    const unsigned b_ld = smem_base + (BK * LDA + ((lane & 7) + (((lane >> 3) & 1) << 3)) * LDB +
                                       wn * WTN + (lane >> 4) * 8) * sizeof(T);

    unsigned a[2][MT][4], b[2][NT][2];  // fragments of two slices
    auto load_frag = [&](int buf, int stage, int slice) {
        const int ks = slice * KMMA;
        if constexpr (PREC == PREC_16) {
            const unsigned so = stage * STAGE_BYTES;
#pragma unroll
            for (int i = 0; i < MT; ++i)
                ldsm_x4_t(a[buf][i], a_ld + so + (ks * LDA + i * 16) * sizeof(T));
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                unsigned r[4];
                ldsm_x4_t(r, b_ld + so + (ks * LDB + j * 8) * sizeof(T));
                b[buf][j][0] = r[0];
                b[buf][j][1] = r[1];
                b[buf][j + 1][0] = r[2];
                b[buf][j + 1][1] = r[3];
            }
        } else {  // 32-bit words: scalar loads, conflict-free as LDA, LDB = 8 mod 32
            const unsigned* wa = reinterpret_cast<const unsigned*>(smem + stage * STAGE + wm * WTM);
            const unsigned* wb = reinterpret_cast<const unsigned*>(smem + stage * STAGE + BK * LDA +
                                                                   wn * WTN);
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                const int c = i * 16 + g;
                a[buf][i][0] = wa[(ks + t4) * LDA + c];
                a[buf][i][1] = wa[(ks + t4) * LDA + c + 8];
                a[buf][i][2] = wa[(ks + t4 + 4) * LDA + c];
                a[buf][i][3] = wa[(ks + t4 + 4) * LDA + c + 8];
            }
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                b[buf][j][0] = wb[(ks + t4) * LDB + j * 8 + g];
                b[buf][j][1] = wb[(ks + t4 + 4) * LDB + j * 8 + g];
            }
        }
    };
    auto mma = [&](int buf) { mma_slice<T, PREC, MT, NT>(acc, a[buf], b[buf]); };

    multistage<STAGES, BK / KMMA>(nk, load_tile, load_frag, mma);

    const int RS = R * S;
    const long long total = (long long)Co * C * RS;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int col = n0 + wn * WTN + j * 8 + 2 * t4 + e;
            const int ctap = col / Cp, c = col - ctap * Cp;
            if (col >= Ncols || c >= C) continue;
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int co = m0 + wm * WTM + i * 16 + g + h * 8;
                    if (co >= Co) continue;
                    const long long idx = ((long long)co * C + c) * RS + ctap;
                    const float val = acc[i][j][2 * h + e];
                    if (splits > 1)
                        part[split * total + idx] = val;
                    else
                        dw[idx] = store_as<T>(val);
                }
        }
}
