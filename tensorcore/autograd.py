"""Reverse-mode automatic differentiation.

A differentiable op is a ``Function`` subclass whose ``forward`` computes on backend
arrays and whose ``backward`` maps the output gradient to one gradient per forward
argument (``None`` for arguments that need none).  ``Function.apply`` wraps the
result in a Tensor and links it to its inputs; ``backward`` walks that graph in
reverse topological order without recursion.  As in PyTorch, a backward pass frees
what each Function saved for it, so a second backward through the same graph raises
unless the first was given ``retain_graph=True``.

Two hooks let code act while a backward pass runs (data-parallel training starts
averaging gradients over the processes while the rest of backward still runs):
``register_post_accumulate_grad_hook(leaf, hook)`` calls ``hook(leaf)`` once the
leaf's gradient of this pass is complete in ``.grad``, and ``queue_callback(fn)``, called
during a pass, runs ``fn()`` (once) when the pass has finished.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterator

from . import versions

if TYPE_CHECKING:
    from .tensor import Tensor

class _GradMode(threading.local):
    """Per-thread grad mode.  The class default serves threads that never set it,
    without the AttributeError a ``getattr`` default would raise and catch per op."""

    enabled = True


_state = _GradMode()


class _Pass(threading.local):
    """The callbacks queued by the backward pass running in this thread (None outside one)."""

    callbacks: list[Callable[[], None]] | None = None


_pass = _Pass()
_post_accumulate_hooks: dict[int, list[Callable[["Tensor"], None]]] = {}  # id(leaf) -> its hooks


class RemovableHandle:
    """What ``register_post_accumulate_grad_hook`` returns: ``remove()`` unregisters the hook."""

    def __init__(self, hooks: list[Callable[["Tensor"], None]], hook: Callable[["Tensor"], None]) -> None:
        self._hooks, self._hook = hooks, hook

    def remove(self) -> None:
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)


def register_post_accumulate_grad_hook(leaf: "Tensor", hook: Callable[["Tensor"], None]) -> RemovableHandle:
    """Call ``hook(leaf)`` in every backward pass, right after the leaf's gradient has been
    accumulated into ``leaf.grad`` (as PyTorch's hook of that name)."""
    if not leaf.is_leaf:
        raise RuntimeError("register_post_accumulate_grad_hook: the tensor is not a leaf (only leaves "
                           "accumulate gradients into .grad)")
    if not callable(hook):
        raise TypeError(f"register_post_accumulate_grad_hook: expected a callable, got {type(hook).__name__}")
    hooks = _post_accumulate_hooks.get(id(leaf))
    if hooks is None:
        hooks = _post_accumulate_hooks[id(leaf)] = []
        weakref.finalize(leaf, _post_accumulate_hooks.pop, id(leaf), None)
    hooks.append(hook)
    return RemovableHandle(hooks, hook)


def queue_callback(callback: Callable[[], None]) -> bool:
    """Run ``callback()`` once the backward pass now running in this thread has finished;
    False (and nothing queued) when an equal callback is queued already."""
    if _pass.callbacks is None:
        raise RuntimeError("queue_callback: no backward pass is running in this thread")
    if callback in _pass.callbacks:
        return False
    _pass.callbacks.append(callback)
    return True


def is_grad_enabled() -> bool:
    return _state.enabled


@contextlib.contextmanager
def set_grad_enabled(mode: bool) -> Iterator[None]:
    previous = is_grad_enabled()
    _state.enabled = mode
    try:
        yield
    finally:
        _state.enabled = previous


def no_grad() -> contextlib.AbstractContextManager:
    """Context manager (and decorator) that records no graph."""
    return _NoGrad()


class _NoGrad(contextlib.ContextDecorator):
    def __enter__(self) -> None:
        self.previous = is_grad_enabled()
        _state.enabled = False

    def __exit__(self, *exc: Any) -> None:
        _state.enabled = self.previous


class Function:
    """Base class of differentiable ops.  Subclasses define forward and backward.

    Inside both, ``self.backend`` is the backend serving the inputs' device; only
    its methods touch arrays, so every op flows through one protocol.
    """

    backend: Any
    inputs: tuple
    released = False  # set once a backward pass has freed what forward saved

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{type(self).__name__} defines no forward")

    def backward(self, grad: Any) -> tuple:
        raise TypeError(f"{type(self).__name__} is not differentiable")

    def needs_grad(self, position: int) -> bool:
        """Whether forward argument ``position`` wants a gradient (skip the work if not)."""
        arg = self.inputs[position]
        return isinstance(arg, Tensor) and arg.requires_grad

    def release(self) -> None:
        """Free what forward saved and the links to the inputs (after its backward ran)."""
        self.__dict__.clear()
        self.released = True

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> "Tensor":
        device = None
        requires_grad = False
        arrays = []
        for arg in args:
            if isinstance(arg, Tensor):
                if device is None:
                    device = arg.device
                elif arg.device != device:
                    raise ValueError(f"{cls.__name__}: inputs are on different devices ({device} and {arg.device})")
                requires_grad = requires_grad or arg.requires_grad
                arrays.append(arg.data)
            else:
                arrays.append(arg)
        fn = cls.__new__(cls)
        fn.backend = backend_for(device or backends.default_device)
        if settings.debug_level:
            out = _debug_forward(fn, arrays, kwargs)
        else:
            out = fn.forward(*arrays, **kwargs)
        result = Tensor._wrap(out, fn.backend.device)
        if requires_grad and is_grad_enabled():
            fn.inputs = args
            result.requires_grad = True
            result._ctx = fn
        return result


def _debug_forward(fn: Function, arrays: list, kwargs: dict) -> Any:
    """DEBUG=1: print each op with its backend, input shapes and wall time."""
    start = time.perf_counter()
    out = fn.forward(*arrays, **kwargs)
    shapes = [tuple(a.shape) for a in arrays if hasattr(a, "shape")]
    print(f"[tensorcore] {type(fn).__name__:<16} {fn.backend.name:<6} {shapes} -> {tuple(out.shape)} "
          f"{(time.perf_counter() - start) * 1e6:.1f} us")
    return out


def backward(root: "Tensor", gradient: Any = None, retain_graph: bool = False) -> None:
    """Accumulate d root / d leaf into every leaf's ``.grad``.

    Each Function's saved arrays are freed once its backward has run, unless
    ``retain_graph`` keeps the graph for another backward pass.
    """
    if not root.requires_grad:
        raise RuntimeError("backward: the tensor does not require grad and has no graph")
    backend = root.backend
    if gradient is None:
        if root.data.size != 1:
            raise ValueError(f"backward: gradient must be given for a non-scalar output of shape {root.shape}")
        grad = backend.full(root.shape, 1, root.dtype)
    else:
        grad = gradient.data if isinstance(gradient, Tensor) else backend.array(gradient, root.dtype)
        if tuple(grad.shape) != root.shape:
            raise ValueError(f"backward: gradient shape {tuple(grad.shape)} does not match output shape {root.shape}")
    grads: dict[int, Any] = {id(root): grad}
    handed_out: set[int] = {id(versions.storage(grad))}  # buffers a leaf may not keep without copying
    order = _topological_order(root)
    outer, _pass.callbacks = _pass.callbacks, []
    try:
        _walk(order, grads, handed_out, retain_graph)
        callbacks = _pass.callbacks
    finally:
        _pass.callbacks = outer
    for callback in callbacks:
        callback()


def _walk(order: list["Tensor"], grads: dict[int, Any], handed_out: set[int], retain_graph: bool) -> None:
    """Propagate ``grads`` through ``order`` (reverse topological), into the leaves."""
    for node in order:
        g = grads.pop(id(node), None)
        if g is None:
            continue
        fn = node._ctx
        if fn is None:
            _accumulate_leaf(node, g, handed_out)
            continue
        if node._retains_grad:
            _accumulate_leaf(node, g, handed_out)
        parent_grads = fn.backward(g)
        parents = fn.inputs
        if not retain_graph:
            fn.release()
        for parent, pg in zip(parents, parent_grads):
            if pg is None or not isinstance(parent, Tensor) or not parent.requires_grad:
                continue
            if pg.dtype != parent.dtype:
                pg = parent.backend.astype(pg, parent.dtype)
            key = id(parent)
            if key in grads:
                grads[key] = parent.backend.binary("add", grads[key], pg)
            else:
                grads[key] = pg


def _accumulate_leaf(leaf: "Tensor", g: Any, handed_out: set[int]) -> None:
    """Add into an existing grad buffer in place (optimizers may own that buffer).

    A new ``.grad`` must own its memory: a contiguous array spanning its whole buffer
    (a fresh result, or a reshape or transpose-back of one) is kept as it is; a partial
    or strided view, or an array whose buffer was already given to another leaf or
    to the caller, is copied.
    """
    if leaf.grad is not None:
        leaf.backend.add_(leaf.grad.data, g)
        versions.bump(leaf.grad.data)
    else:
        flags = getattr(g, "flags", None)
        owner = versions.storage(g)
        if (id(owner) in handed_out or flags is None or not flags.c_contiguous
                or not getattr(flags, "writeable", True) or g.nbytes != owner.nbytes):
            g = owner = leaf.backend.copy(g)
        handed_out.add(id(owner))
        leaf.grad = Tensor._wrap(g, leaf.device)
    for hook in _post_accumulate_hooks.get(id(leaf), ()):
        hook(leaf)


def _topological_order(root: "Tensor") -> list["Tensor"]:
    """Tensors reachable from root, each after every tensor that depends on it.

    Raises before any gradient is computed if part of the graph was freed by an
    earlier backward pass.
    """
    order: list[Tensor] = []
    visited: set[int] = set()
    stack: list[tuple[Tensor, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        if node._ctx is not None:
            if node._ctx.released:
                raise RuntimeError(f"backward: the graph through {type(node._ctx).__name__} was already freed by an "
                                   "earlier backward(); pass retain_graph=True to the first backward() to run "
                                   "backward through it again")
            for parent in node._ctx.inputs:
                if isinstance(parent, Tensor) and parent.requires_grad and id(parent) not in visited:
                    stack.append((parent, False))
    order.reverse()
    return order


from . import backends, settings  # noqa: E402  (bound last: backends and tensor import this module)
from .backends import backend_for  # noqa: E402
from .tensor import Tensor  # noqa: E402
