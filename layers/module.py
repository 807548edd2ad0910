"""Module: the base class of every layer.

A Module owns parameters, buffers and submodules, registered by plain attribute
assignment (``self.weight = Parameter(...)``, ``self.block = Linear(...)``).  It knows
how to walk that tree (``named_parameters``, ``named_modules`` ...), how to export and
import its values (``state_dict`` / ``load_state_dict``, ``save`` / ``load``), and it
counts structural changes in ``structure_version`` so a compiled plan keyed on it is
rebuilt when a parameter or a submodule is added, removed or replaced.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Iterator, Mapping, NamedTuple

import tensorcore as tc
from tensorcore import Tensor
from tensorcore import memory_format as formats
from tensorcore.devices import canonical, is_device

from . import serialization
from .parameter import Parameter

_version_counter = itertools.count(1)
_version_lock = threading.Lock()


def _next_version() -> int:
    with _version_lock:
        return next(_version_counter)


_mode_changes = 0  # train()/eval() calls and `training` assignments, on any module


def _note_mode_change() -> None:
    global _mode_changes
    with _version_lock:
        _mode_changes += 1


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict(strict=False)`` skipped."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class Module:
    """Base class of layers; subclasses set attributes in ``__init__`` and define ``forward``."""

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_parents", weakref.WeakSet())
        object.__setattr__(self, "_version", _next_version())
        object.__setattr__(self, "training", True)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{type(self).__name__} defines no forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.__dict__.get("_auto_compile") and not self.training and not tc.is_grad_enabled():
            return self._inference_plan()(*args, **kwargs)
        return self.forward(*args, **kwargs)

    def _inference_plan(self) -> Any:
        """The compiled ``forward`` of ``eval(auto_compile=True)``."""
        return self._compiled("forward", self.forward)

    def _compiled(self, name: str, fn: Callable) -> Any:
        """``tc.compile(fn)`` kept on this module under ``name``, made on first use (plans
        are bound to this instance's memory: copies and pickles leave them out)."""
        calls = self.__dict__.get("_compiled_calls")
        if calls is None:
            calls = self.__dict__.setdefault("_compiled_calls", {})
        found = calls.get(name)
        if found is None:
            found = calls.setdefault(name, tc.compile(fn, fallback="eager"))
        return found

    # ----- structure version -----------------------------------------------------------
    @property
    def mode_version(self) -> int:
        """Changes whenever any module's ``training`` flag is set (``train()``, ``eval()``,
        assignment): what was read of the flags since the last change still holds."""
        return _mode_changes

    @property
    def structure_version(self) -> int:
        """Changes whenever a parameter, buffer or submodule anywhere in this tree is
        added, removed or replaced (values changing in place do not count)."""
        return self._version

    def _structure_changed(self) -> None:
        """Give this module and every module containing it a new, never-seen version."""
        version = _next_version()
        pending, seen = [self], set()
        while pending:
            module = pending.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            object.__setattr__(module, "_version", version)
            pending.extend(module._parents)

    # ----- registration ----------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}: call super().__init__() before assigning {name!r}")
        if isinstance(value, Parameter):
            self._register("_parameters", name, value)
        elif isinstance(value, Module):
            self._register("_modules", name, value)
        elif name in self._buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"{type(self).__name__}.{name} is a buffer; assign a Tensor or None, got {type(value).__name__}")
            self._register("_buffers", name, value)
        elif name in self._parameters or name in self._modules:
            if value is not None:
                kind = "parameter" if name in self._parameters else "submodule"
                raise TypeError(f"{type(self).__name__}.{name} is a {kind}; assign a {'Parameter' if kind == 'parameter' else 'Module'} or None, got {type(value).__name__}")
            self._register("_parameters" if name in self._parameters else "_modules", name, None)
        else:
            object.__setattr__(self, name, value)
            if name == "training":
                _note_mode_change()

    def __getattr__(self, name: str) -> Any:
        for store in ("_parameters", "_buffers", "_modules"):
            values = self.__dict__.get(store)
            if values is not None and name in values:
                return values[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        for store in ("_parameters", "_buffers", "_modules"):
            values = self.__dict__[store]
            if name in values:
                self._unlink(values.pop(name))
                self._non_persistent.discard(name)
                self._structure_changed()
                return
        object.__delattr__(self, name)

    def _register(self, store: str, name: str, value: Any) -> None:
        """Put ``value`` under ``name`` in one store, dropping it from the others."""
        if "." in name or not name:
            raise ValueError(f"{type(self).__name__}: invalid attribute name {name!r}")
        values = self.__dict__[store]
        if name in values and values[name] is value:
            return
        replaced = [self.__dict__[other].pop(name) for other in ("_parameters", "_buffers", "_modules")
                    if other != store and name in self.__dict__[other]]
        replaced.append(values.get(name))
        self.__dict__.pop(name, None)
        values[name] = value  # a replacement keeps its place in the order
        if isinstance(value, Module):
            value._parents.add(self)
        for old in replaced:
            self._unlink(old)
        self._structure_changed()

    def _unlink(self, old: Any) -> None:
        """Forget being ``old``'s parent unless it is still registered under another name."""
        if isinstance(old, Module) and not any(m is old for m in self._modules.values()):
            old._parents.discard(self)

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """A tensor that belongs to the module's state but is not trained (e.g. running stats).

        Non-persistent buffers move with ``to()`` but are left out of ``state_dict``.
        """
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"register_buffer: {name!r} must be a Tensor or None, got {type(tensor).__name__}")
        if name in self._parameters or name in self._modules:
            raise KeyError(f"register_buffer: {name!r} is already a parameter or submodule")
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)
        self._register("_buffers", name, tensor)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"register_parameter: {name!r} must be a Parameter or None, got {type(param).__name__}")
        self._register("_parameters", name, param)

    def add_module(self, name: str, module: "Module | None") -> None:
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"add_module: {name!r} must be a Module or None, got {type(module).__name__}")
        self._register("_modules", name, module)

    # ----- walking the tree ------------------------------------------------------------
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, "Module"]]:
        """(dotted name, module) for this module and every descendant, each once."""
        seen: set[int] = set()
        stack: list[tuple[str, Module]] = [(prefix, self)]
        while stack:
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield name, module
            children = [(f"{name}.{child_name}" if name else child_name, child)
                        for child_name, child in module._modules.items() if child is not None]
            stack.extend(reversed(children))

    def modules(self) -> Iterator["Module"]:
        return (module for _, module in self.named_modules())

    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        return ((name, m) for name, m in self._modules.items() if m is not None)

    def children(self) -> Iterator["Module"]:
        return (m for _, m in self.named_children())

    def _named_members(self, store: str, prefix: str, recurse: bool) -> Iterator[tuple[str, Any]]:
        seen: set[int] = set()
        modules = self.named_modules(prefix) if recurse else iter([(prefix, self)])
        for module_name, module in modules:
            for name, value in module.__dict__[store].items():
                if value is None or id(value) in seen:
                    continue
                seen.add(id(value))
                yield (f"{module_name}.{name}" if module_name else name), value

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Parameter]]:
        return self._named_members("_parameters", prefix, recurse)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        return (p for _, p in self.named_parameters(recurse=recurse))

    def named_buffers(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        return self._named_members("_buffers", prefix, recurse)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        return (b for _, b in self.named_buffers(recurse=recurse))

    def apply(self, fn: Callable[["Module"], None]) -> "Module":
        """Call ``fn`` on every submodule (children first) and then on self."""
        for module in reversed(list(self.modules())):
            fn(module)
        return self

    # ----- modes and gradients ---------------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        for module in self.modules():
            object.__setattr__(module, "training", bool(mode))
        _note_mode_change()
        return self

    def eval(self, auto_compile: bool | None = None) -> "Module":
        """Evaluation mode.  ``auto_compile=True``: calls of this module made in eval mode
        under ``tc.no_grad()`` run ``forward`` through ``tc.compile`` -- the next such call
        traces the inference plan, later ones replay it (the training flags are part of the
        plan's key, so a train -> eval round trip replays the same plan).  ``False`` turns
        that off and frees the plans; None keeps the current choice."""
        if auto_compile is not None:
            if not isinstance(auto_compile, bool):
                raise TypeError(f"{type(self).__name__}.eval: auto_compile must be a bool or None, "
                                f"got {auto_compile!r}")
            object.__setattr__(self, "_auto_compile", auto_compile)
            if not auto_compile:
                compiled = self.__dict__.get("_compiled_calls", {}).pop("forward", None)
                if compiled is not None:
                    compiled.release()
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                with tc.no_grad():
                    p.grad.zero_()

    # ----- device and dtype ------------------------------------------------------------
    def to(self, device: Any = None, dtype: Any = None, memory_format: Any = None) -> "Module":
        """Move every parameter and buffer to ``device`` and/or cast floating ones to
        ``dtype``; with ``memory_format`` (``tc.channels_last``, ``tc.contiguous_format``)
        also lay the 4-D ones out in memory so (convolution weights channels-last are
        what the GPU's convolution kernels read, with no packed copy).

        Parameters keep their identity (their data is swapped), so references held
        elsewhere stay valid.  ``to(tc.float64)`` is accepted as a dtype-only call.
        """
        if device is not None and not is_device(device):
            device, dtype = None, device
        device = canonical(device) if device is not None else None
        if memory_format is not None:
            memory_format = formats.check(memory_format, "Module.to")
        moved, gpu = False, device == "cuda"
        for module in self.modules():
            for p in module._parameters.values():
                if p is not None:
                    gpu = gpu or p.device == "cuda"
                    _release_freed_blocks(gpu)
                    moved |= _move_parameter(p, device, dtype, memory_format)
            for name, b in module._buffers.items():
                if b is not None:
                    gpu = gpu or b.device == "cuda"
                    _release_freed_blocks(gpu)
                    new = _moved(b, device, dtype, memory_format)
                    if new is not b:
                        module._buffers[name] = new
                        moved = True
        _release_freed_blocks(gpu)
        if moved:
            self._structure_changed()
        return self

    def cpu(self) -> "Module": return self.to("cpu")
    def cuda(self) -> "Module": return self.to("cuda")
    def float(self) -> "Module": return self.to(dtype=tc.float32)
    def double(self) -> "Module": return self.to(dtype=tc.float64)
    def half(self) -> "Module": return self.to(dtype=tc.float16)
    def bfloat16(self) -> "Module": return self.to(dtype=tc.bfloat16)

    # ----- state -----------------------------------------------------------------------
    def state_dict(self) -> "OrderedDict[str, Tensor]":
        """Every parameter and persistent buffer by dotted name, detached (sharing memory)."""
        state: OrderedDict[str, Tensor] = OrderedDict()
        for module_name, module in self.named_modules():
            dot = f"{module_name}." if module_name else ""
            for name, p in module._parameters.items():
                if p is not None:
                    state[dot + name] = p.detach()
            for name, b in module._buffers.items():
                if b is not None and name not in module._non_persistent:
                    state[dot + name] = b.detach()
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> IncompatibleKeys:
        """Copy values into the parameters and buffers, in place and all or nothing.

        Values may be Tensors or array-likes and are cast to each target's dtype.
        With ``strict``, missing and unexpected keys raise; a wrong shape always raises.
        Every check runs before the first copy, so a failure leaves the module as it was.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"load_state_dict for {type(self).__name__}: expected a mapping of names to tensors "
                            f"(such as state_dict() returns), got {type(state_dict).__name__}")
        bad_keys = [k for k in state_dict if not isinstance(k, str)]
        if bad_keys:
            raise TypeError(f"load_state_dict for {type(self).__name__}: keys must be parameter and buffer names "
                            f"(str), got {bad_keys[0]!r} of type {type(bad_keys[0]).__name__}")
        targets = self.state_dict()
        missing = [k for k in targets if k not in state_dict]
        unexpected = [k for k in state_dict if k not in targets]
        problems = []
        if strict and missing:
            problems.append(f"missing keys: {', '.join(missing)}")
        if strict and unexpected:
            problems.append(f"unexpected keys: {', '.join(unexpected)}")
        staged: list[tuple[Tensor, Tensor]] = []
        wrong_shape = []
        for key, target in targets.items():
            if key not in state_dict:
                continue
            value = _as_tensor(state_dict[key], target, key)
            if value.shape != target.shape:
                wrong_shape.append(f"{key} (expected {target.shape}, got {value.shape})")
                continue
            staged.append((target, value.to(target.device, dtype=target.dtype)))
        if wrong_shape:
            problems.append(f"wrong shapes: {', '.join(wrong_shape)}")
        if problems:
            raise ValueError(f"load_state_dict for {type(self).__name__}: " + "; ".join(problems))
        with tc.no_grad():
            for target, value in staged:
                target.copy_(value)
        return IncompatibleKeys(missing, unexpected)

    def save(self, path: str) -> None:
        """Write ``state_dict()`` to ``path`` as safetensors, atomically (all or nothing)."""
        serialization.save_file({k: v.numpy() for k, v in self.state_dict().items()}, path)

    def load(self, path: str, strict: bool = True) -> IncompatibleKeys:
        """Load a safetensors file written by ``save`` (or by torch/safetensors)."""
        return self.load_state_dict(serialization.load_file(path), strict=strict)

    # ----- printing --------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"({name}): " + repr(child).replace("\n", "\n  ") for name, child in self.named_children()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not lines:
            return head + ")"
        return head + "\n  " + "\n  ".join(lines) + "\n)"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_parents"]  # weak links are rebuilt by the containing module
        state.pop("_compiled_calls", None)  # plans are bound to this instance's memory
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        object.__setattr__(self, "_parents", weakref.WeakSet())
        for child in self._modules.values():
            if child is not None:
                child._parents.add(self)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules))


def _moved(t: Tensor, device: str | None, dtype: Any, memory_format: Any = None) -> Tensor:
    """``t`` on ``device`` with floating values cast to ``dtype`` and, when 4-D, laid out
    in ``memory_format`` (``t`` itself if unchanged)."""
    cast = dtype if dtype is not None and tc.dtypes.is_floating(t.dtype) and tc.dtypes.as_dtype(dtype) != t.dtype else None
    device = None if device == t.device else device
    if memory_format is not None and t.ndim == 4:
        with tc.no_grad():  # laid out on the way: the target device holds one copy
            return formats.laid_out(t, memory_format, device, cast)
    if device is not None or cast is not None:
        return t.detach().to(device, dtype=cast)
    return t


def _release_freed_blocks(gpu: bool) -> None:
    """Before a tensor is copied on or onto the GPU (``gpu``), and after the last: return
    the memory pool's free blocks to the driver.  Otherwise the new copy may be carved out
    of a larger block that earlier copies (or the weights just loaded) freed, and as the
    pool gives back only wholly free blocks, that block's remainder stays held for good:
    460 MB of the SD-1.5 UNet's memory once it was cast to fp16 and laid out channels-last
    on the GPU."""
    if gpu:
        tc.cuda.release_cached_blocks()


def _move_parameter(p: Parameter, device: str | None, dtype: Any, memory_format: Any = None) -> bool:
    new = _moved(p, device, dtype, memory_format)
    if new is p:
        return False
    p._set_storage(new.data, new.device)
    if p.grad is not None:
        p.grad = _moved(p.grad, device, dtype, memory_format)
    return True


def _as_tensor(value: Any, like: Tensor, key: str) -> Tensor:
    if isinstance(value, Tensor):
        return value.detach()
    if value is None:
        raise TypeError(f"load_state_dict: value for {key!r} is None; expected a tensor or array of shape {like.shape}")
    try:
        return tc.tensor(value, device="cpu", dtype=like.dtype)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"load_state_dict: value for {key!r} is not array-like ({type(value).__name__})") from exc
