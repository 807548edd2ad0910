"""The backend protocol: what every backend must provide.

A backend is one object that holds kernels and the caches they need (no autograd);
``dispatch.py`` says how each backend states which function serves each method.  Arrays are the backend's native arrays (``numpy.ndarray`` on the
CPU, ``cupy.ndarray`` on the GPU); images are NCHW.  Every method returns a new
array unless its name ends in ``_`` (then it writes into its first argument).

The protocol has two halves:

* **primitives** (allocation, elementwise, reductions, movement, indexing): small and
  generic; the NumPy backend writes them against ``self.xp`` so a backend whose
  array module mimics NumPy (CuPy) inherits them;
* **fused ops** (matmul, convolution, pooling, upsampling, softmax, normalisation,
  bias+activation, attention, embedding backward, optimizer updates, RNG): the hot
  kernels.  The NumPy backend holds the reference implementation of each; the Numba
  and CuPy backends override the ones they make faster.

Optional ``out=``
-----------------
A backend may let a method write its result into a given array: ``unary``, ``binary``,
``where``, ``clip``, ``matmul``, ``concatenate`` and ``lora_linear`` of the NumPy
reference take ``out=None``.  Compiled replay (``tensorcore.compile``) passes its
planned buffer through ``out=`` wherever the method in use declares the parameter and
copies the result into it otherwise, so a backend that overrides one of these without
``out`` is still correct, only not allocation-free on that op.  ``conv2d``,
``group_norm_conv2d`` and ``upsample_conv2d`` must take it: a compiled plan may have
them write straight into a slice of a concatenation's buffer (the ``place_concat`` pass).

Compiled replay first asks ``prepare(op, args, kwargs, out)`` (optional): a backend
may return a no-argument callable that performs that exact call -- arrays, shapes and
options fixed, every check done once -- writing the result into ``out``, or None to
have the method called as usual.  The callable must compute bit for bit what the
method computes.

Compiled plans run on the backend's executor: ``executor(plan, roots, objects)`` binds
a lowered plan (``tensorcore/compile/plan.py``) to memory -- ``roots`` the program's
own arrays by storage, ``objects`` the random generators' states by position -- and
returns an object with ``run(arrays, fresh) -> outputs`` (copy the inputs in, replay,
return new output arrays, or the plan's own buffers when not ``fresh``) and
``release()`` (free the plan's memory; nothing runs after it).  The NumPy backend's
replays a loop of pre-bound calls (``numpy/executor.py``), the CuPy backend's a CUDA
graph (``cupy/executor.py``).  ``async_stream()`` gives asynchronous compiled calls a
stream of their own to launch on (``cupy/streams.py``), or None where they run on a
worker thread instead (the CPU backends).

Conventions for the fused ops
-----------------------------
``act`` names an activation: ``"none" | "relu" | "gelu" | "gelu_tanh" | "silu" |
"sigmoid" | "tanh"``.  Convolution geometry is given as ``(sh, sw)`` stride,
``(ph, pw)`` padding, ``(dh, dw)`` dilation and ``groups``.  Backward kernels take
the forward's inputs (or saved outputs) explicitly, so a backend keeps no state
between forward and backward.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from .opcodes import ACTIVATIONS  # the names ``act`` may take (re-exported)

__all__ = ["ACTIVATIONS", "Array", "Backend"]

Array = Any  # numpy.ndarray | cupy.ndarray
Shape = tuple[int, ...]
Axes = tuple[int, ...] | None
Pair = tuple[int, int]


@runtime_checkable
class Backend(Protocol):
    name: str  # "numpy" | "numba" | "cupy"
    device: str  # "cpu" | "cuda"

    # ----- allocation and transfer -------------------------------------------------
    def array(self, obj: Any, dtype: Any = None) -> Array: ...
    def empty(self, shape: Shape, dtype: Any) -> Array: ...
    def zeros(self, shape: Shape, dtype: Any) -> Array: ...
    def full(self, shape: Shape, value: Any, dtype: Any) -> Array: ...
    def arange(self, start: float, stop: float, step: float, dtype: Any) -> Array: ...
    def linspace(self, start: float, stop: float, num: int, dtype: Any) -> Array: ...
    def eye(self, n: int, m: int, dtype: Any) -> Array: ...
    def to_numpy(self, a: Array) -> Any: ...
    def from_numpy(self, a: Any) -> Array: ...
    def from_dlpack(self, obj: Any) -> Array:
        """Zero-copy import of a DLPack-capable array on this backend's device."""
    def astype(self, a: Array, dtype: Any) -> Array: ...
    def copy(self, a: Array) -> Array: ...
    def copy_(self, dst: Array, src: Array) -> None: ...
    def add_(self, dst: Array, src: Array) -> None: ...
    def empty_cache(self) -> None:
        """Free the buffers the backend keeps between calls (scratch space, counters);
        they are made again when next needed."""

    def release_stream(self, stream: int) -> None:
        """Free the buffers kept for the stream with handle ``stream`` (a released CUDA
        graph's private stream: nothing will run on it again)."""

    def kernels_pending(self) -> bool:
        """Whether kernels are still compiling elsewhere while some calls run a slower
        reference instead (Numba on a cold cache): ``tc.compile`` binds no plan then."""

    # ----- elementwise -------------------------------------------------------------
    def unary(self, op: str, a: Array) -> Array:
        """op in: neg abs sign exp log log1p sqrt rsqrt sin cos tanh sigmoid relu
        erf gelu gelu_tanh silu softplus floor ceil round logical_not isnan isinf."""
    def binary(self, op: str, a: Array, b: Array) -> Array:
        """op in: add sub mul div pow maximum minimum eq ne lt le gt ge
        logical_and logical_or floordiv mod.  Broadcasts like NumPy."""
    def where(self, cond: Array, a: Array, b: Array) -> Array: ...
    def clip(self, a: Array, lo: float | None, hi: float | None) -> Array: ...
    def leaky_relu(self, a: Array, slope: float) -> Array: ...
    def activation_grad(self, act: str, x: Array, grad: Array) -> Array:
        """d act(x)/dx * grad for the activations listed in the module doc."""
    def fused_elementwise(self, program: tuple, inputs: Sequence[Array]) -> Array:
        """A chain of elementwise ops as one call (``backends/fused_program.py``):
        C-contiguous, of the inputs' broadcast shape; what the chain's calls compute."""

    # ----- reductions --------------------------------------------------------------
    def reduce(self, op: str, a: Array, axes: Axes, keepdims: bool) -> Array:
        """op in: sum max min prod any all."""
    def arg_reduce(self, op: str, a: Array, axis: int | None, keepdims: bool) -> Array:
        """op in: argmax argmin (int64 result)."""

    # ----- movement and indexing ---------------------------------------------------
    def reshape(self, a: Array, shape: Shape) -> Array: ...
    def transpose(self, a: Array, axes: Sequence[int]) -> Array: ...
    def broadcast_to(self, a: Array, shape: Shape) -> Array: ...
    def concatenate(self, arrays: Sequence[Array], axis: int, out: Array | None = None) -> Array:
        """The arrays joined along ``axis``, written into ``out`` when given."""
    def stack(self, arrays: Sequence[Array], axis: int) -> Array: ...
    def pad(self, a: Array, widths: Sequence[Pair], value: float) -> Array: ...
    def flip(self, a: Array, axes: Sequence[int]) -> Array: ...
    def getitem(self, a: Array, index: Any) -> Array: ...
    def setitem_(self, a: Array, index: Any, value: Array) -> None: ...
    def index_add_(self, dst: Array, index: Any, value: Array) -> None:
        """dst[index] += value with repeated indices accumulated (scatter-add)."""

    # ----- linear algebra ----------------------------------------------------------
    def matmul(self, a: Array, b: Array) -> Array:
        """Batched, broadcasting matrix product (NumPy ``@`` semantics)."""
    def matmul_bias_act(self, a: Array, b: Array, bias: Array | None, act: str,
                        residual: Array | None = None) -> Array:
        """``bias_act(matmul(a, b), bias, act, axis=-1)`` in one call, bit for bit as
        those two calls: the GEMM epilogue ``tc.compile``'s epilogue fusion rewrites a
        product followed by a bias + activation into (never called by eager code).  With
        ``residual`` (of the result's shape and dtype), that result plus it, as a
        following ``binary("add", y, residual)`` computes it (a transformer's skip)."""
    def matmul_bias_act_group(self, a: Array, products: Sequence[tuple[Array, Array | None, str]]
                              ) -> tuple[Array, ...]:
        """``matmul_bias_act(a, b, bias, act)`` for each (b, bias, act) of ``products``,
        bit for bit: products of one input that a backend may run together (a UNet's
        time-embedding projections, one per ResBlock, as one launch).  Only compiled
        plans call it (``tc.compile``'s ``group_linear`` pass)."""
    def lora_linear(self, x: Array, weight_t: Array, bias: Array | None, lora_a: Array,
                    lora_b: Array, scale: float) -> Array:
        """A Linear with a low-rank update, one call: ``x @ weight_t + bias +
        ((x @ lora_a) @ lora_b) * scale`` for x [..., in], weight_t [in, out] (a
        Linear's weight transposed, usually a view), bias [out] or None, lora_a
        [in, rank], lora_b [rank, out].  Only compiled plans call it (the LoRA rewrite)."""

    # ----- convolution (NCHW, weight [Cout, Cin/groups, kh, kw]) -------------------
    def conv2d(self, x: Array, w: Array, stride: Pair, padding: Pair,
               dilation: Pair, groups: int, bias: Array | None = None, act: str = "none",
               residual: Array | None = None, residual_scale: float = 1.0,
               out: Array | None = None) -> Array:
        """Cross-correlation with a fused epilogue:
        ``(act(conv(x, w) + bias[None, :, None, None]) + residual) * residual_scale``,
        terms left out when not given; residual has the output's shape.  ``out``: a
        C-contiguous array of the result's shape and dtype to write it into (a compiled
        plan's slice of a concatenation), returned."""
    def group_norm_conv2d(self, x: Array, norm: tuple, w: Array, stride: Pair, padding: Pair,
                          dilation: Pair, groups: int, bias: Array | None = None,
                          act: str = "none", residual: Array | None = None,
                          residual_scale: float = 1.0, out: Array | None = None) -> Array:
        """``conv2d(group_norm(x, *norm)[0], w, ...)`` in one call, ``norm`` being
        group_norm's arguments after x: (weight, bias, groups, eps, act, shift).  A backend
        may normalize x as the convolution reads it, never writing the normalized
        tensor.  Only compiled plans call it (a GroupNorm whose one reader is a conv)."""
    def upsample_conv2d(self, x: Array, out_hw: Pair, w: Array, stride: Pair, padding: Pair,
                        dilation: Pair, groups: int, bias: Array | None = None,
                        act: str = "none", residual: Array | None = None,
                        residual_scale: float = 1.0, out: Array | None = None) -> Array:
        """``conv2d(upsample_nearest2d(x, out_hw), w, ...)`` in one call.  A backend may
        convolve the small image directly, never writing the upsampled one.  Only
        compiled plans call it (an upsampling whose one reader is a conv)."""
    def conv2d_grad_input(self, grad: Array, w: Array, x_shape: Shape, stride: Pair,
                          padding: Pair, dilation: Pair, groups: int) -> Array:
        """Gradient of conv2d w.r.t. its input; also the forward of conv_transpose2d."""
    def conv2d_grad_weight(self, grad: Array, x: Array, w_shape: Shape, stride: Pair,
                           padding: Pair, dilation: Pair, groups: int) -> Array: ...

    # ----- pooling and resampling --------------------------------------------------
    def max_pool2d(self, x: Array, kernel: Pair, stride: Pair,
                   padding: Pair) -> tuple[Array, Array]:
        """Returns (out, argmax) where argmax is the flat index into each H*W plane."""
    def max_pool2d_backward(self, grad: Array, argmax: Array, x_shape: Shape) -> Array: ...
    def avg_pool2d(self, x: Array, kernel: Pair, stride: Pair, padding: Pair) -> Array:
        """Zero padding counted in the divisor (PyTorch's count_include_pad=True)."""
    def avg_pool2d_backward(self, grad: Array, x_shape: Shape, kernel: Pair,
                            stride: Pair, padding: Pair) -> Array: ...
    def upsample_nearest2d(self, x: Array, out_hw: Pair) -> Array: ...
    def upsample_nearest2d_backward(self, grad: Array, x_shape: Shape) -> Array: ...
    def upsample_bilinear2d(self, x: Array, out_hw: Pair, align_corners: bool) -> Array: ...
    def upsample_bilinear2d_backward(self, grad: Array, x_shape: Shape,
                                     align_corners: bool) -> Array: ...

    # ----- softmax family (over the last axis) -------------------------------------
    def softmax(self, x: Array) -> Array: ...
    def softmax_backward(self, grad: Array, y: Array) -> Array: ...
    def log_softmax(self, x: Array) -> Array: ...
    def log_softmax_backward(self, grad: Array, y: Array) -> Array: ...
    def cross_entropy(self, logits: Array, target: Array, ignore_index: int,
                      label_smoothing: float) -> tuple[Array, Array]:
        """logits [N, C], target int [N].  Returns (per-row loss [N] with ignored
        rows 0, log_softmax [N, C]) -- the second is reused by the backward."""
    def cross_entropy_backward(self, grad_rows: Array, logp: Array, target: Array,
                               ignore_index: int, label_smoothing: float) -> Array:
        """grad_rows [N] (d loss / d per-row loss) -> d logits [N, C]."""
    def cross_entropy_reduced(self, logits: Array, target: Array, ignore_index: int,
                              label_smoothing: float, reduction: str
                              ) -> tuple[Array, Array, Array]:
        """``reduction`` "sum" | "mean" of ``cross_entropy``'s per-row losses (the mean
        over the rows not ignored, NaN when all are).  Returns (loss 0-d, log_softmax
        [N, C], divisor: a float64 0-d array, 1 or the count of kept rows).  The
        reference composes ``cross_entropy`` with primitives (written against ``xp``,
        so CuPy inherits it); Numba runs one kernel."""
    def cross_entropy_reduced_backward(self, grad: Array, logp: Array, target: Array,
                                       ignore_index: int, label_smoothing: float,
                                       divisor: Array) -> Array:
        """grad 0-d (d loss) -> d logits [N, C]: each row's gradient is grad / divisor."""

    # ----- normalisation -----------------------------------------------------------
    def layer_norm(self, x: Array, weight: Array | None, bias: Array | None,
                   n_norm: int, eps: float) -> tuple[Array, Array, Array]:
        """Normalise over the last ``n_norm`` axes; returns (y, mean, rstd) with
        mean/rstd shaped [rows]."""
    def layer_norm_backward(self, grad: Array, x: Array, weight: Array | None,
                            mean: Array, rstd: Array, n_norm: int
                            ) -> tuple[Array, Array | None, Array | None]: ...
    def group_norm(self, x: Array, weight: Array | None, bias: Array | None,
                   groups: int, eps: float, act: str = "none", shift: Array | None = None
                   ) -> tuple[Array, Array, Array]:
        """x [N, C, *]; returns (act(y), mean, rstd), mean/rstd shaped [N, groups].
        ``shift`` [N, C] (optional) is added to x first, rounded to x's dtype as a
        separate add would be, and the statistics are those of the sum: the time
        embedding add of a ResBlock, fused by ``tc.compile`` (eager code never passes
        it, and ``group_norm_backward`` does not take it)."""
    def group_norm_backward(self, grad: Array, x: Array, weight: Array | None,
                            bias: Array | None, mean: Array, rstd: Array, groups: int,
                            act: str = "none"
                            ) -> tuple[Array, Array | None, Array | None]: ...
    def batch_norm(self, x: Array, weight: Array | None, bias: Array | None,
                   running_mean: Array | None, running_var: Array | None,
                   training: bool, momentum: float, eps: float
                   ) -> tuple[Array, Array, Array]:
        """x [N, C, *].  Training: batch statistics, running stats updated in place
        (unbiased variance, as PyTorch).  Returns (y, mean[C], rstd[C])."""
    def batch_norm_backward(self, grad: Array, x: Array, weight: Array | None,
                            mean: Array, rstd: Array, training: bool
                            ) -> tuple[Array, Array | None, Array | None]: ...

    # ----- fused elementwise -------------------------------------------------------
    def bias_act(self, x: Array, bias: Array | None, act: str, axis: int) -> Array:
        """act(x + bias) where bias is 1-D and lies along ``axis`` of x."""
    def bias_act_backward(self, grad: Array, x: Array, bias: Array | None, act: str,
                          axis: int) -> tuple[Array, Array | None]: ...

    # ----- attention ([B, H, L, D]) ------------------------------------------------
    def attention(self, q: Array, k: Array, v: Array, mask: Array | None,
                  causal: bool, scale: float) -> tuple[Array, Array]:
        """softmax(q kᵀ * scale + mask) v.  ``mask`` is additive (float, -inf
        where masked) and broadcasts to [B, H, Lq, Lk].  Returns (out, probs)."""
    def attention_backward(self, grad: Array, q: Array, k: Array, v: Array,
                           probs: Array, scale: float) -> tuple[Array, Array, Array]: ...
    def gated_activation(self, x: Array, act: str, bias: Array | None = None) -> Array:
        """``x[..., :N] * act(x[..., N:])`` for x [..., 2N] (GEGLU's gate with "gelu"), for calls
        that need no gradient: a backend may make it one pass over x.  With ``bias`` [2N],
        the gate of ``x + bias`` (rounded to x's dtype, as the bias add alone would round
        it): the projection's bias, added in the same pass."""
    def attention_output(self, q: Array, k: Array, v: Array, mask: Array | None,
                         causal: bool, scale: float) -> Array:
        """``attention``'s output alone, for calls that need no gradient: a backend may
        compute it without the probabilities (flash attention)."""
    def attention_lse(self, q: Array, k: Array, v: Array, mask: Array | None,
                      causal: bool, scale: float) -> tuple[Array, Array] | None:
        """For calls that need gradients: (out, lse), ``attention``'s output and each
        row's log-sum-exp of the scaled scores in base 2 (lse [B, H, Lq] float32,
        log2 Σ_j 2^(s_ij · log2 e)), when the backend computes attention without the
        probabilities (flash attention) -- ``attention_lse_backward`` then recomputes
        them; None where it keeps them (``attention`` serves the call)."""
    def attention_lse_backward(self, grad: Array, q: Array, k: Array, v: Array, out: Array,
                               lse: Array, causal: bool, scale: float) -> tuple[Array, Array, Array]:
        """(dq, dk, dv) of an ``attention_lse`` call without a mask."""

    # ----- embedding ---------------------------------------------------------------
    def embedding_backward(self, grad: Array, indices: Array, num_embeddings: int
                           ) -> Array:
        """Scatter-add rows of grad [*, D] into a [num_embeddings, D] array."""

    # ----- RNG (a backend generator object per tc.Generator) -----------------------
    def rng(self, seed: int) -> Any: ...
    def uniform(self, rng: Any, shape: Shape, low: float, high: float, dtype: Any) -> Array: ...
    def normal(self, rng: Any, shape: Shape, mean: float, std: float, dtype: Any) -> Array: ...
    def integers(self, rng: Any, shape: Shape, low: int, high: int, dtype: Any) -> Array: ...

    # ----- optimizer updates (flat 1-D buffers, in place) --------------------------
    def sgd_update_(self, p: Array, g: Array, buf: Array | None, lr: Array,
                    momentum: float, dampening: float, nesterov: bool,
                    weight_decay: float, first_step: Array) -> None:
        """``lr`` and ``first_step`` are 1-element device arrays, so no host
        round trip is needed per step."""
    def adam_update_(self, p: Array, g: Array, m: Array, v: Array, vmax: Array | None,
                     lr: Array, step: Array, beta1: float, beta2: float, eps: float,
                     weight_decay: float, decoupled: bool) -> None:
        """Adam (decoupled=False) / AdamW (True); ``step`` is a 1-element device
        array holding the (already incremented) step count; ``vmax`` enables amsgrad."""
    def rmsprop_update_(self, p: Array, g: Array, square_avg: Array, grad_avg: Array | None,
                        buf: Array | None, lr: Array, alpha: float, eps: float,
                        weight_decay: float, momentum: float, centered: bool) -> None: ...
    def adagrad_update_(self, p: Array, g: Array, state_sum: Array, lr: Array, step: Array,
                        lr_decay: float, weight_decay: float, eps: float) -> None: ...
    def lamb_update_(self, p: Array, g: Array, m: Array, v: Array, ranges: Array, lr: Array,
                     step: Array, beta1: float, beta2: float, eps: float,
                     weight_decay: float) -> None:
        """``ranges`` [n, 2] holds each parameter's [start, stop) in the flat buffer:
        the trust ratio is per parameter."""
    def lars_update_(self, p: Array, g: Array, buf: Array, ranges: Array, lr: Array,
                     momentum: float, weight_decay: float, trust_coefficient: float,
                     eps: float) -> None: ...
    def lion_update_(self, p: Array, g: Array, m: Array, lr: Array, beta1: float, beta2: float,
                     weight_decay: float) -> None: ...

    # ----- collectives (tensorcore.distributed) --------------------------------------
    def collective_(self, dst: Array, src: Array | None, communicator: Any, op: str,
                    reduce: str = "sum", root: int = 0, overlap: bool = False) -> None:
        """Collective ``op`` of a ``tensorcore.distributed`` communicator, writing ``dst``
        (``"wait"``: ``dst`` holds the arrays the overlapped collectives write).  A backend
        call like any kernel, so a compiled plan records and replays it (a node of the
        CUDA graph on the GPU); the communicator does the work on the current stream."""

    # ----- compiled replay (see the module doc; prepare is optional) ----------------
    def executor(self, plan: Any, roots: dict[int, Array], objects: list[Any]) -> Any: ...
    def async_stream(self) -> Any | None: ...
    def prepare(self, op: str, args: tuple, kwargs: dict, out: Array) -> Callable[[], Any] | None: ...
