"""Implicit-GEMM convolution on the tensor cores (cuda/conv_igemm.cu): the host side.

Each pass is one GEMM whose im2col operand is gathered tile by tile into shared
memory, never written to device memory:

    forward       out [pixels x Cout] = im2col(x) [pixels x (R, S, C)] . w [(R, S, C) x Cout]
    input grad    dx  [pixels x C]    = the same kernel over grad, w transposed; a stride
                                        becomes sh x sw output phases, each with the taps
                                        that reach it (a transposed convolution)
    weight grad   dw  [Cout x (R, S, C)] = grad [Cout x pixels] . im2col(x) [pixels x (R, S, C)]

Operands are first packed channels-last by one transpose kernel (NHWC, channels padded
with zeros to a 16-byte multiple, rounded to TF32 when the matmul precision is "high"),
so every global-to-shared copy is a 16-byte ``cp.async``; any input strides are read
as they are.  A forward weight stored channels-last (``Module.to(memory_format=
tc.channels_last)``) with no padding needed is read where it lies; otherwise a CUDA-graph
plan being captured keeps the forward's packed weights itself when they are its
modules' parameters (``weight_packs``).  Outputs are written NCHW through shared memory (the forward's
accumulators staged there so that stores coalesce), with bias, activation, residual
add and scale fused in.  Problems whose output tiles would not
fill the GPU split K into float32 partials, summed (and finished by the epilogue) in a
reduce kernel.  Float32 without TF32 runs as 3xTF32 (big * big + big * small +
small * big), accurate to float32.  On Hopper (sm_90) the forward and input-gradient
GEMMs in TF32 and 16-bit run on warpgroup MMA (``wgmma``) tiles.  A forward to at most
8 channels (stride 1) runs conv_halo's kernel on the same packed operands instead.

Scratch memory (packed operands, partials) comes from one buffer per (device, stream),
so the kernels allocate nothing and can be captured in a CUDA graph once a call of the
same size has run; a plan's capture takes it from the plan's own pool instead
(``_scratch_arrays``).  Calls the kernels do not cover return None and
are counted (``tc.cuda.conv_stats()``); the caller runs the im2col + GEMM path.
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass
from typing import Any

import cupy
import numpy

from ... import settings
from .. import report
from . import loader
from .elementwise import ACT_CODES
from .util import NULL, contiguous
from . import conv_halo, conv_norm, conv_plan, counters, pools, weight_packs
from .conv_norm import GroupNormIn
from .conv_plan import FPROP, PREC_16, PREC_3XTF32, PREC_TF32, SOURCE, WGRAD, Plan

_CTYPES = {"float32": "float", "float16": "half_t", "bfloat16": "bf16_t"}
_INT32 = 2**31 - 1
_GRID_Z = 65535
_ALIGN = 256  # bytes between scratch arrays
PACK_ROWS = 64  # rows of a pack tile (PACK_ROWS in cuda/conv_igemm.cu)
# cuda/conv_igemm.cu's FpropShape and WgradShape, passed by value: int32 extents
_FPROP_SHAPE = numpy.dtype([("extents", numpy.int32, (21,))])
_WGRAD_SHAPE = numpy.dtype([("extents", numpy.int32, (9,))])

Pair = tuple[int, int]


# ----- coverage and bookkeeping ------------------------------------------------------------
def _reason(arrays: tuple, groups: int, extents: tuple[int, ...]) -> str | None:
    """Why the kernels do not cover a call, or None: CuPy arrays of one float32 / float16
    / bfloat16 dtype, groups 1, sm_80 or newer, every packed operand and GEMM extent in
    ``extents`` below 2**31."""
    dtype = arrays[0].dtype
    for a in arrays:
        if type(a) is not cupy.ndarray:
            return "not CuPy arrays"
        if a.dtype != dtype:
            return "mixed dtypes"
        if a.size == 0:
            return "empty tensor"
    if dtype.name not in _CTYPES:
        return f"dtype {dtype.name}"
    if groups != 1:
        return "groups > 1"
    if loader.compute_capability() < 80:
        return "compute capability below 8.0"
    if max(extents) > _INT32:
        return "too large for 32-bit tile indices"
    return None


def _covered(op: str, reason: str | None) -> bool:
    if reason is None:
        conv_plan.record("implicit_gemm", op)
        return True
    conv_plan.record("fallback", f"{op}: {reason}")
    if settings.debug_level:
        print(f"[tensorcore] conv2d {op}: im2col + GEMM fallback ({reason})")
    return False


def _precision(dtype: Any) -> int:
    if dtype.itemsize == 2:
        return PREC_16
    return PREC_TF32 if settings.get_matmul_precision() == "high" else PREC_3XTF32


def _padded(channels: int, itemsize: int) -> int:
    """Channels rounded up to a 16-byte multiple."""
    vec = 16 // itemsize
    return -(-channels // vec) * vec


# ----- scratch memory ----------------------------------------------------------------------
_scratch: dict[tuple[int, int], list[Any]] = {}
_scratch_lock = threading.Lock()
_captured: set[tuple[int, int]] = set()  # (device, stream) keys used inside a capture


def _scratch_arrays(*layout: tuple[tuple[int, ...], Any]) -> list[Any]:
    """Arrays of the given (shape, dtype) for one call, carved from one buffer: the
    stream's kept scratch buffer, or while a plan is captured into its own pool
    (``pools.capturing_plan``) a block of that pool, freed after the call so that later
    captured kernels reuse it in stream order.  (Per-call blocks of the default pool
    would not do for eager calls: once other arrays split the freed blocks, the large
    requests reach cudaMalloc, which synchronizes: the SD-1.5 UNet's eager forward went
    from 47 to 72 ms.)"""
    sizes = [-(-math.prod(shape) * numpy.dtype(dtype).itemsize // _ALIGN) * _ALIGN
             for shape, dtype in layout]
    if pools.plan_capture():
        buffer = cupy.empty(sum(sizes), dtype=numpy.uint8)
    else:
        buffer = _stream_scratch(sum(sizes))
    arrays, offset = [], 0
    for (shape, dtype), size in zip(layout, sizes):
        arrays.append(cupy.ndarray(shape, dtype, memptr=buffer.data + offset))
        offset += size
    return arrays


def _stream_scratch(nbytes: int) -> Any:
    """The current stream's scratch buffer, grown to at least ``nbytes``.  A buffer
    outgrown on a stream ever captured into a CUDA graph stays alive (the graph may still
    use it; doubling bounds what the kept buffers add up to); on any other stream it is
    dropped and the new one is just large enough."""
    stream = cupy.cuda.get_current_stream()
    key = (cupy.cuda.runtime.getDevice(), stream.ptr)
    if stream.ptr != 0 and key not in _captured and stream.is_capturing():
        _captured.add(key)
    held = _scratch.get(key)
    if held is None or held[-1].nbytes < nbytes:
        with _scratch_lock:
            held = _scratch.setdefault(key, [])
            if key in _captured:
                grown = max(nbytes, 2 * held[-1].nbytes if held else 0, 1 << 20)
            else:
                grown = max(nbytes, 1 << 20)
                held.clear()
            held.append(cupy.empty(grown, dtype=numpy.uint8))
    return held[-1]


def release_uncaptured_scratch() -> None:
    """Drop the scratch buffers of the streams never captured into a CUDA graph (the next
    eager call there grows one again).  A compiled plan calls this once it is captured: its
    trace grew them to its largest convolution's packs and split-K partials (about 70 MB for
    SD-1.5's UNet at batch 2), and its replays take theirs from the plan's own pool."""
    with _scratch_lock:
        for key in [k for k in _scratch if k not in _captured]:
            del _scratch[key]


def clear_scratch(stream: int | None = None) -> None:
    """Drop the scratch buffers (and GroupNorm counters) of one stream (a handle), or of
    every stream."""
    with _scratch_lock:
        for key in [k for k in _scratch if stream is None or k[1] == stream]:
            del _scratch[key]
            _captured.discard(key)
    counters.clear(stream)


# ----- kernels ------------------------------------------------------------------------------
def _strides(a: Any) -> tuple[int, ...]:
    return tuple(s // a.itemsize for s in a.strides)


@dataclass(frozen=True)
class _Pack:
    """dst [images][height][width][Cp] = src[image, channel, h, w] read through element
    ``strides`` (image, channel, h, w); channels from ``channels`` to Cp = dst.shape[-1]
    are zero."""

    src: Any
    dst: Any
    channels: int
    height: int
    width: int
    strides: tuple[int, int, int, int]

    def args(self) -> tuple:
        return (self.src, self.dst, self.channels, self.height, self.width, self.dst.shape[-1],
                math.prod(self.dst.shape[:-1]), *self.strides)

    def blocks(self) -> int:
        """PACK_ROWS-row x 32-channel tiles of dst."""
        return -(-math.prod(self.dst.shape[:-1]) // PACK_ROWS) * -(-self.dst.shape[-1] // 32)


def _pack(first: _Pack, second: _Pack | None, round_tf32: bool, norm: tuple = ()) -> None:
    """One launch packing one or two tensors, the first normalized on the way when
    ``norm`` holds conv_norm.pack_args."""
    rest = second.args() if second else (first.src, first.dst, 0, 1, 1, 1, 0, 0, 0, 0, 0)
    blocks = first.blocks() + (second.blocks() if second else 0)
    name = "conv_pack_norm_kernel" if norm else "conv_pack_kernel"
    loader.kernel(SOURCE, name, first.src.dtype)(
        (blocks,), (32, 8), (*first.args(), *norm, *rest, int(round_tf32)))


def _launch(kernel: str, plan: Plan, dtype: Any, prec: int, grid: tuple, args: tuple) -> None:
    tile = plan.tile
    smem = tile.smem_bytes(kernel, dtype.itemsize)
    expression = tile.expression(kernel, _CTYPES[dtype.name], prec)
    if report.active:
        report.note_kernel(expression)
    loader.sized_instance(SOURCE, expression, smem)(
        grid, (tile.threads,), args, shared_mem=smem)


def _reduce(part: Any, out: Any, splits: int, plane: int, nout: int, bias: Any = None,
            residual: Any = None, act: str = "none", scale: float = 1.0) -> None:
    """out = epilogue(sum of the splits' float32 partials)."""
    loader.launch(SOURCE, "conv_splitk_reduce_kernel", out.dtype, -(-out.size // 4),
                       (part, out, NULL if bias is None else bias,
                        NULL if residual is None else residual, out.size, splits, plane, nout,
                        ACT_CODES[act], float(scale)))


def _int32(*values: int) -> tuple:
    return tuple(numpy.int32(v) for v in values)


def _partials(plan: Plan | None, out_size: int) -> tuple[tuple[int, int], Any]:
    """The (shape, dtype) of the split-K partials (empty without a split or a GEMM)."""
    return (plan.splits if plan is not None and plan.splits > 1 else 0, out_size), numpy.float32


def _fprop(act: Any, wpk: Any, out: Any, part: Any, plan: Plan, prec: int, kernel_hw: Pair,
           step: Pair, base: Pair, tap_delta: Pair, phases: Pair, tap_step: Pair,
           bias: Any, act_name: str, residual: Any, scale: float) -> None:
    """out (NCHW) from packed act [N][IH][IW][Cp] and packed weights [Nout][R][S][Cp];
    per axis, phase p's output u reads input u * step + (base + p + tap * tap_delta) /
    phases for the taps where that division is exact (tap_step apart)."""
    n, ih, iw, cp = act.shape
    nout, oh, ow = out.shape[1:]
    tile, splits = plan.tile, plan.splits
    rows = n * -(-oh // phases[0]) * -(-ow // phases[1])  # phase (0, 0) is the largest
    grid = (-(-rows // tile.bm), -(-nout // tile.bn), phases[0] * phases[1] * splits)
    if splits > 1:  # the GEMM writes partials, the reduce kernel the epilogue
        epilogue = (part, NULL, NULL, 0, 1.0)
    else:
        epilogue = (NULL, NULL if bias is None else bias, NULL if residual is None else residual,
                    ACT_CODES[act_name], scale)
    shape = numpy.array((n, ih, iw, cp, nout, oh, ow, *kernel_hw, *step, *base, *tap_delta,
                         *phases, *tap_step, splits, plan.walks_taps_inner and cp % tile.bk == 0),
                        numpy.int32).view(_FPROP_SHAPE)
    _launch(FPROP, plan, out.dtype, prec, grid,
            (act, wpk, out, *epilogue[:3], shape, numpy.int32(epilogue[3]),
             numpy.float32(epilogue[4])))
    if splits > 1:
        _reduce(part, out, splits, oh * ow, nout, bias, residual, act_name, scale)


# ----- the three passes -------------------------------------------------------------------
def forward(x: Any, w: Any, out_hw: Pair, stride: Pair, padding: Pair, dilation: Pair,
            groups: int, bias: Any = None, act: str = "none", residual: Any = None,
            residual_scale: float = 1.0, norm: GroupNormIn | None = None, out: Any = None) -> Any | None:
    """(act(conv2d(x, w) + bias) + residual) * residual_scale, or None when the kernels
    do not cover the call.  bias / residual (when given) have x's dtype; residual has the
    output's shape.  ``norm``: x is first normalized by that GroupNorm (+ activation),
    inside the pack, as ``conv_norm.covered`` returned it.  ``out``: a C-contiguous
    array of the result's shape and dtype to write into (the caller checks it)."""
    n, c, h, wd = x.shape
    cout, r, s = w.shape[0], w.shape[2], w.shape[3]
    (ho, wo), itemsize = out_hw, x.dtype.itemsize
    cp = _padded(c, itemsize)
    epilogue = tuple(a for a in (bias, residual) if a is not None)
    normed = norm.arrays() if norm is not None else ()
    reason = _reason((x, w, *epilogue, *normed), groups, (n * h * wd * cp, cout * r * s * cp, n * ho * wo))
    if not _covered("forward", reason):
        return None
    prec = _precision(x.dtype)
    rounded = prec == PREC_TF32
    halo = not conv_plan.is_forced(FPROP) and conv_halo.covers(cout, (r, s), stride, dilation, x.dtype.name,
                                                               prec == PREC_3XTF32)
    plan = None if halo else conv_plan.choose(FPROP, prec, itemsize, n * ho * wo, cout, r * s * cp, 1,
                                              n * cout * ho * wo, loader.sm_count(), loader.has_wgmma())
    w_rsc = w.transpose(0, 2, 3, 1)  # [Cout][R][S][C]: the packed layout when dense
    reuse_w = cp == c and not rounded and w_rsc.flags.c_contiguous and w.data.ptr % 16 == 0
    kept = None if reuse_w else _kept_weight(w, (cout, r, s, cp), rounded)
    pack_w = not reuse_w and kept is None  # packed here, into scratch
    if out is None:
        out = cupy.empty((n, cout, ho, wo), dtype=x.dtype)
    xh, wp, part, *stats = _scratch_arrays(((n, h, wd, cp), x.dtype),
                                           ((cout, r, s, cp) if pack_w else (0,), x.dtype),
                                           _partials(plan, out.size),
                                           *(conv_norm.scratch_layout(x, norm) if norm else ()))
    packed_w = _Pack(w, wp, c, r, s, _strides(w)) if pack_w else None
    if norm is not None:
        conv_norm.coefficients(x, norm, *stats)
    _pack(_Pack(x, xh, c, h, wd, _strides(x)), packed_w, rounded,
          conv_norm.pack_args(norm, stats[0], n) if norm else ())
    if reuse_w:  # a 1x1 weight, or one stored channels-last, is already packed
        wp = w_rsc
    elif kept is not None:
        wp = kept
    bias = None if bias is None else contiguous(bias)  # the kernels index both densely
    residual = None if residual is None else contiguous(residual)
    if halo:
        conv_halo.launch(xh, wp, out, padding, bias, ACT_CODES[act], residual, residual_scale)
    else:
        _fprop(xh, wp, out, part, plan, prec, (r, s), stride, (-padding[0], -padding[1]), dilation,
               (1, 1), (1, 1), bias, act, residual, residual_scale)
    return out


def _kept_weight(w: Any, shape: tuple[int, ...], rounded: bool, fill: Any = None) -> Any | None:
    """The packed copy of shape ``shape`` ([Cout][R][S][Cp]) of a forward's weight that
    the plan being captured keeps (``weight_packs``), made by ``fill(w, rounded, copy)``
    (default: packed as it is), or None: no such plan, or a weight it writes or computes."""
    packs = weight_packs.active()
    if packs is None:
        return None
    fill = fill or _pack_weight
    key = (fill.__name__, w.data.ptr, w.shape, w.strides, w.dtype.str, rounded)
    return packs.held(w, key, shape, functools.partial(fill, w, rounded))


def _pack_weight(w: Any, rounded: bool, packed: Any) -> None:
    _pack(_Pack(w, packed, w.shape[1], w.shape[2], w.shape[3], _strides(w)), None, rounded)


def upsample_forward(x: Any, w: Any, bias: Any = None, act: str = "none", residual: Any = None,
                     residual_scale: float = 1.0, out: Any = None) -> Any | None:
    """conv2d(upsample_nearest2d(x, 2x), w) for a 3x3 w with padding 1 (stride 1, one
    group) and the forward's epilogue, or None when the kernels do not cover the call.

    Per axis, output 2u + p of the upsampled convolution reads input rows u - 1, u (p = 0)
    or u, u + 1 (p = 1) with the 3 taps summed onto those 2: a stride-2 transposed
    convolution of x with the 4x4 kernel ``upsample_phase_weights_kernel`` makes, run as
    ``input_grad`` runs one (one GEMM per output phase of 2x2 taps).  The upsampled
    image is never made; 4 of the 9 taps' multiply-adds per output remain.

    Returns None too inside a captured plan where the phase weights it would keep for the
    plan's life outweigh the upsampled image they spare (a UNet's deep upsamplers: wide
    weights, small images); the caller then runs the two calls."""
    n, c, h, wd = x.shape
    cout = w.shape[0]
    itemsize = x.dtype.itemsize
    cp = _padded(c, itemsize)
    if weight_packs.active() is not None and cout * 16 * cp > n * c * 4 * h * wd:
        return None
    epilogue = tuple(a for a in (bias, residual) if a is not None)
    reason = _reason((x, w, *epilogue), 1, (n * h * wd * cp, cout * 16 * cp, 4 * n * h * wd))
    if not _covered("upsample_forward", reason):
        return None
    prec = _precision(x.dtype)
    rounded = prec == PREC_TF32
    plan = conv_plan.choose(FPROP, prec, itemsize, n * h * wd, cout, 4 * cp, 4, 4 * n * cout * h * wd,
                            loader.sm_count(), loader.has_wgmma())
    kept = _kept_weight(w, (cout, 4, 4, cp), rounded, _phase_weights)
    if out is None:
        out = cupy.empty((n, cout, 2 * h, 2 * wd), dtype=x.dtype)
    xh, wt, part = _scratch_arrays(((n, h, wd, cp), x.dtype),
                                   ((cout, 4, 4, cp) if kept is None else (0,), x.dtype),
                                   _partials(plan, out.size))
    _pack(_Pack(x, xh, c, h, wd, _strides(x)), None, rounded)
    if kept is None:
        _phase_weights(w, rounded, wt)
    else:
        wt = kept
    bias = None if bias is None else contiguous(bias)
    residual = None if residual is None else contiguous(residual)
    _fprop(xh, wt, out, part, plan, prec, (4, 4), (1, 1), (1, 1), (-1, -1), (2, 2), (2, 2), bias, act,
           residual, residual_scale)
    return out


def _phase_weights(w: Any, rounded: bool, wt: Any) -> None:
    """wt [Cout][4][4][Cp] = the transposed-convolution kernel of a 2x upsampling into the
    3x3 weight w (``upsample_phase_weights_kernel``)."""
    loader.launch(SOURCE, "upsample_phase_weights_kernel", w.dtype, wt.size,
                  (w, wt, *_int32(w.shape[0], w.shape[1], wt.shape[-1]),
                   *(numpy.int64(s) for s in _strides(w)), numpy.int32(rounded)))


def input_grad(grad: Any, w: Any, x_shape: tuple, stride: Pair, padding: Pair,
               dilation: Pair, groups: int) -> Any | None:
    """d conv2d / d x (also conv_transpose2d's forward), or None when not covered."""
    n, cout, ho, wo = grad.shape
    c, h, wd = x_shape[1:]
    r, s = w.shape[2], w.shape[3]
    itemsize = grad.dtype.itemsize
    cop = _padded(cout, itemsize)
    reason = _reason((grad, w), groups, (n * ho * wo * cop, c * r * s * cop, n * h * wd))
    if reason is None and stride[0] * stride[1] * conv_plan.MAX_SPLITS > _GRID_Z:
        reason = "stride phases beyond the grid"
    if not _covered("input_grad", reason):
        return None
    prec = _precision(grad.dtype)
    rounded = prec == PREC_TF32
    tap_step = tuple(st // math.gcd(st, d) for st, d in zip(stride, dilation))
    taps = math.ceil(r / tap_step[0]) * math.ceil(s / tap_step[1])
    phases = stride[0] * stride[1]
    plan = conv_plan.choose(FPROP, prec, itemsize, n * -(-h // stride[0]) * -(-wd // stride[1]),
                            c, taps * cop, phases, n * c * h * wd, loader.sm_count(),
                            loader.has_wgmma())
    dx = cupy.empty(tuple(x_shape), dtype=grad.dtype)
    gh, wt, part = _scratch_arrays(((n, ho, wo, cop), grad.dtype), ((c, r, s, cop), grad.dtype),
                                   _partials(plan, dx.size))
    ws = _strides(w)  # wt[c][r][s][j] = w[j, c, r, s]
    _pack(_Pack(grad, gh, cout, ho, wo, _strides(grad)),
          _Pack(w, wt, cout, r, s, (ws[1], ws[0], ws[2], ws[3])), rounded)
    _fprop(gh, wt, dx, part, plan, prec, (r, s), (1, 1), padding, (-dilation[0], -dilation[1]),
           stride, tap_step, None, "none", None, 1.0)
    return dx


def weight_grad(grad: Any, x: Any, w_shape: tuple, stride: Pair, padding: Pair,
                dilation: Pair, groups: int) -> Any | None:
    """d conv2d / d w, or None when not covered."""
    n, cout, ho, wo = grad.shape
    c, h, wd = x.shape[1:]
    r, s = w_shape[2], w_shape[3]
    itemsize = x.dtype.itemsize
    cp, cop = _padded(c, itemsize), _padded(cout, itemsize)
    reason = _reason((grad, x), groups, (n * ho * wo * cop, n * h * wd * cp, r * s * cp))
    if not _covered("weight_grad", reason):
        return None
    prec = _precision(x.dtype)
    if _wgmma_weight_grad(grad, x, w_shape, stride, dilation, prec):
        return _weight_grad_wgmma(grad, x, w_shape, padding, prec)
    rounded = prec == PREC_TF32
    dw = cupy.empty(tuple(w_shape), dtype=x.dtype)
    plan = conv_plan.choose(WGRAD, prec, itemsize, cout, r * s * cp, n * ho * wo, 1, dw.size,
                            loader.sm_count())
    tile, splits = plan.tile, plan.splits
    gh, xh, part = _scratch_arrays(((n, ho, wo, cop), x.dtype), ((n, h, wd, cp), x.dtype),
                                   _partials(plan, dw.size))
    _pack(_Pack(grad, gh, cout, ho, wo, _strides(grad)), _Pack(x, xh, c, h, wd, _strides(x)),
          rounded)
    grid = (-(-cout // tile.bm), -(-(r * s * cp) // tile.bn), splits)
    _launch(WGRAD, plan, x.dtype, prec, grid,
            (gh, xh, dw, part if splits > 1 else NULL,
             *_int32(n, ho, wo, h, wd, cout, cop, c, cp, r, s, *stride, *padding, *dilation,
                     splits)))
    if splits > 1:
        _reduce(part, dw, splits, 1, 1)
    return dw


def _wgmma_weight_grad(grad: Any, x: Any, w_shape: tuple, stride: Pair, dilation: Pair,
                       prec: int) -> bool:
    """Whether the weight gradient runs conv_wgrad_wgmma_kernel: on sm_90, TF32 or 16-bit,
    stride 1 and dilation 1, output rows a whole number of 16-byte chunks and output
    planes of whole K tiles (128 bytes), the shifted input below 2**31 elements."""
    if prec == PREC_3XTF32 or stride != (1, 1) or dilation != (1, 1) or not loader.has_wgmma():
        return False
    itemsize, (n, _, ho, wo) = grad.dtype.itemsize, grad.shape
    shifted = w_shape[3] * n * x.shape[1] * (ho + w_shape[2] - 1) * wo
    return wo % (16 // itemsize) == 0 and (ho * wo) % (128 // itemsize) == 0 and shifted <= _INT32


def _shift_pack(x: Any, xs: Any, padding: Pair, round_tf32: bool) -> None:
    """xs [S][N][C][Hp][Q] = x shifted by each kernel column, padded (shift_pack_kernel,
    one 16-byte chunk of xs per thread and step)."""
    loader.launch(SOURCE, "shift_pack_kernel", x.dtype, xs.nbytes // 16,
                  (x, xs, *_int32(*x.shape), *_strides(x),
                   *_int32(xs.shape[0], *xs.shape[3:], *padding, int(round_tf32))))


def _weight_grad_wgmma(grad: Any, x: Any, w_shape: tuple, padding: Pair, prec: int) -> Any:
    """d conv2d / d w on warpgroup MMA (stride 1, dilation 1): both GEMM operands
    pixel-contiguous, the input shifted once per kernel column."""
    n, cout, ho, wo = grad.shape
    c, r, s = x.shape[1], w_shape[2], w_shape[3]
    hp, rounded = ho + r - 1, prec == PREC_TF32
    dw = cupy.empty(tuple(w_shape), dtype=x.dtype)
    plan = conv_plan.choose(WGRAD, prec, x.dtype.itemsize, cout, r * s * c, n * ho * wo, 1,
                            dw.size, loader.sm_count(), True)
    dense = not rounded and grad.flags.c_contiguous and grad.data.ptr % 16 == 0
    gd, xs, part = _scratch_arrays(((0,) if dense else (1, n, cout, ho, wo), x.dtype),
                                   ((s, n, c, hp, wo), x.dtype), _partials(plan, dw.size))
    if dense:
        gd = grad
    else:  # a dense copy, rounded to TF32 when the precision asks
        _shift_pack(grad, gd, (0, 0), rounded)
    _shift_pack(x, xs, padding, rounded)
    tile, splits = plan.tile, plan.splits
    shape = numpy.array((n, cout, c, ho * wo, wo, hp, r, s, splits),
                        numpy.int32).view(_WGRAD_SHAPE)
    _launch(WGRAD, plan, x.dtype, prec, (-(-cout // tile.bm), -(-(r * s * c) // tile.bn), splits),
            (gd, xs, dw, part if splits > 1 else NULL, shape))
    if splits > 1:
        _reduce(part, dw, splits, 1, 1)
    return dw
