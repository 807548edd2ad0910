"""The optimizer base: param groups, flat-buffer packing, zero_grad, step, state_dict.

On the first ``step()`` every (device, dtype) of the parameters is packed into one
flat, 256-byte-aligned buffer holding parameters, gradients and state, and each
``Parameter.data`` / ``.grad`` becomes a view of it (see ``flat.py``).  A step then
costs one backend kernel call per (param group, dtype), plus one tiny op that bumps
the device step counter for the optimizers that count steps.  The learning rate and
the step count live on the device, so ``step()`` never waits for the device and can
be captured in a CUDA graph.

Gradients and ``zero_grad``, as in PyTorch:

* ``zero_grad(set_to_none=False)`` zeroes each flat gradient section in one op and
  keeps ``.grad`` a view of it; the next ``backward()`` accumulates straight into the
  buffer.  This is the fast loop: a step reads gradients where they already are.
* ``zero_grad()`` (``set_to_none=True``, the default) sets every ``.grad`` to None;
  ``backward()`` then allocates fresh gradients and the next ``step()`` gathers them
  into the buffer with one concatenation per (group, dtype) before updating.

A parameter whose ``.grad`` is None is skipped, state and step count included.
Parameters with ``bounds`` are clamped right after their update, on the device.
Every check (options, devices, dtypes, shapes) runs before anything is written.

``shard_state()`` (ZeRO stage 1, ``sharding.py``) splits the state and the update over
the ranks of ``tensorcore.distributed``; the parameters are all-gathered after each step.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Iterable

import numpy as np

from tensorcore import Tensor, dtypes, tracing, versions

from .flat import Segment
from .packing import Packing, pack, state_arrays
from .sharding import Shard


class Optimizer:
    """Base class: subclasses name their state, check their options and call the
    backend's fused update for one flat range."""

    uses_step = True  # whether the update reads the step count
    elementwise = True  # whether the update treats each element alone (a sharded slice may cut a parameter)

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]) -> None:
        self.defaults = dict(defaults)
        self.param_groups: list[dict[str, Any]] = []
        self._packing: Packing | None = None
        self._shard: Shard | None = None
        if isinstance(params, Tensor | dict):  # iterating would walk its rows or keys
            raise TypeError(f"{self._name}: params must be an iterable of Parameters or dicts, "
                            f"got a {type(params).__name__} (wrap it in a list)")
        groups = list(params)
        if not groups:
            raise ValueError(f"{self._name}: got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    @property
    def _name(self) -> str:
        return type(self).__name__

    # ----- what a subclass provides -----------------------------------------------
    def state_spec(self, group: dict[str, Any]) -> dict[str, float]:
        """The state roles the group's update uses, with their initial values."""
        return {}

    def check_group(self, group: dict[str, Any]) -> None:
        """Raise ValueError for an invalid option of ``group`` (lr is checked here)."""

    def update(self, backend: Any, segment: Segment, first: int, last: int,
               group: dict[str, Any], step: Any) -> None:
        """One fused backend call updating parameters ``first .. last - 1`` of segment."""
        raise TypeError(f"{self._name} does not define an update")

    # ----- param groups -------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters with its own options (missing ones take the
        defaults).  After the first step this re-packs the buffers, carrying over
        the state of the existing parameters."""
        if not isinstance(param_group, dict):
            raise TypeError(f"{self._name}.add_param_group: expected a dict, got {type(param_group).__name__}")
        group = dict(param_group)
        params = group.get("params")
        params = [params] if isinstance(params, Tensor) else list(params or [])
        if not params:
            raise ValueError(f"{self._name}: a parameter group has no parameters")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"{self._name}: parameters must be Tensors, got {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError(f"{self._name}: can't optimize a non-leaf Tensor")
            if not dtypes.is_floating(p.dtype):
                raise TypeError(f"{self._name}: parameters must be floating point, got {p.dtype}")
            if id(p) in seen:
                raise ValueError(f"{self._name}: a parameter appears more than once in the parameter groups")
            seen.add(id(p))
        devices = {p.device for p in params}
        if len(devices) > 1:
            raise ValueError(f"{self._name}: a parameter group mixes devices {sorted(devices)}; "
                             "put each device's parameters in a group of its own")
        group["params"] = params
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        if self._packing is not None and self._shard is not None:
            raise RuntimeError(f"{self._name}.add_param_group: the state is sharded; add every group before the "
                               "first step")
        self._check(group)
        self.param_groups.append(group)
        if self._packing is not None:
            self._packing = pack(self.param_groups, self.state_spec, self._packing)

    def shard_state(self) -> "Optimizer":
        """Keep and update only this rank's slice of the state, then all-gather the
        parameters (ZeRO stage 1, over the ranks of ``tensorcore.distributed``; the
        gradients must be the same on every rank, as DistributedDataParallel makes them).
        Call it before the first step; returns the optimizer."""
        if not self.elementwise:
            raise ValueError(f"{self._name}.shard_state: its update needs whole parameters (per-parameter norms), "
                             "which a slice of the flat buffer may cut; shard an element-wise optimizer")
        if self._packing is not None:
            raise RuntimeError(f"{self._name}.shard_state: call it before the first step or zero_grad")
        self._shard = Shard.of_process_group(f"{self._name}.shard_state")
        return self

    def _check(self, group: dict[str, Any]) -> None:
        lr = group["lr"]
        if isinstance(lr, Tensor) or not isinstance(lr, (int, float)) or math.isnan(lr) or lr < 0:
            raise ValueError(f"{self._name}: invalid learning rate {lr!r} (expected a float >= 0)")
        self.check_group(group)

    # ----- the step -----------------------------------------------------------------
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update every parameter that has a gradient; returns ``closure()`` if given."""
        loss = None
        if closure is not None:
            from tensorcore import set_grad_enabled

            with set_grad_enabled(True):
                loss = closure()
        for group in self.param_groups:
            self._check(group)
        packing = self._packed()
        bound = [segment.all_bound() for segment in packing.segments]
        for segment, ok in zip(packing.segments, bound):
            if not ok:
                _check_segment(self._name, segment)
        for segment, ok in zip(packing.segments, bound):
            self._step_segment(segment, ok)
        if self._shard is not None:
            for buffer in packing.buffers.values():
                buffer.gather_params()
                versions.bump(buffer.storage)
        return loss

    def _step_segment(self, segment: Segment, bound: bool) -> None:
        """Update one segment; ``bound``: every parameter and gradient is already a view
        of the flat buffer (the fast path: no copies, one run)."""
        backend = segment.buffer.backend
        group = self.param_groups[segment.group_index]
        if not bound:
            for p, view in zip(segment.params, segment.param_views):
                if p.data is not view:  # the parameter was reassigned: take its new values
                    backend.copy_(view, p.data)
                    p.data = view
            if not segment.grads_are_views():
                segment.gather_grads()
        tracing.host_effect(functools.partial(_sync_lr, segment, group))
        for first, last in [(0, len(segment.params))] if bound and segment.uniform else _runs(segment):
            step = None
            if self.uses_step:
                backend.add_(segment.steps[first:last], segment.one)
                step = segment.steps[first:first + 1]
            if segment.owns(first, last):
                self.update(backend, segment, first, last, group, step)
            tracing.host_effect(functools.partial(segment.advance, first, last))
        for view, (low, high) in segment.bounded:
            backend.clip(view, low, high, out=view)
        versions.bump(segment.buffer.storage)  # parameters, gradients and state: views of it

    def _packed(self) -> Packing:
        if self._packing is None:
            self._packing = pack(self.param_groups, self.state_spec, None, self._shard)
        return self._packing

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients: None them (default), or zero the flat buffers in one
        op per (device, dtype) and keep ``.grad`` views of them."""
        if set_to_none:
            for group in self.param_groups:
                for p in group["params"]:
                    p.grad = None
            return
        packing = self._packed()
        for segment in packing.segments:
            if not segment.grads_are_views():
                segment.gather_grads()
        for buffer in packing.buffers.values():
            buffer.backend.copy_(buffer.sections["grad"], buffer.zero)
            versions.bump(buffer.storage)

    # ----- device scalars (used by the LR schedules) ----------------------------------
    def _set_lr(self, group_index: int, host_value: float, device_value: Any) -> None:
        """Set a group's lr: ``device_value`` (a 1-element array on the group's device)
        goes into the device scalars, ``host_value`` into ``group["lr"]``."""
        group = self.param_groups[group_index]
        group["lr"] = host_value
        if self._packing is None:
            return
        for segment in self._packing.by_group[group_index]:
            segment.buffer.backend.copy_(segment.lr, device_value)
            segment.lr_seen = host_value

    # ----- state --------------------------------------------------------------------
    @property
    def state(self) -> dict[Tensor, dict[str, Any]]:
        """Per-parameter state as in PyTorch: ``state[p]["exp_avg"]`` is a Tensor view
        of the flat buffer; ``"step"`` the number of updates ``p`` received."""
        out: dict[Tensor, dict[str, Any]] = {}
        if self._shard is not None:
            raise RuntimeError(f"{self._name}.state: the state is sharded over the ranks; state_dict() gathers it")
        if self._packing is None:
            return out
        for segment in self._packing.segments:
            roles = self.state_spec(self.param_groups[segment.group_index])
            for i, p in enumerate(segment.params):
                if segment.counts[i]:
                    lo, hi = segment.offsets[i], segment.offsets[i] + segment.sizes[i]
                    entry: dict[str, Any] = {"step": segment.counts[i]}
                    for role in roles:
                        flat = segment.buffer.sections[role][lo:hi]
                        entry[role] = Tensor(segment.buffer.backend.reshape(flat, tuple(p.shape)), p.device)
                    out[p] = entry
        return out

    def state_dict(self) -> dict[str, Any]:
        """Options and per-parameter state (host copies), parameters named by their
        index across the groups, as ``torch.optim`` does.  Sharded, the state is gathered
        from every rank: all ranks must call it."""
        groups, state, index = [], {}, 0
        for group in self.param_groups:
            entry = {k: v for k, v in group.items() if k != "params"}
            entry["params"] = list(range(index, index + len(group["params"])))
            index += len(group["params"])
            groups.append(entry)
        if self._packing is not None:
            numbering = {id(p): n for g, e in zip(self.param_groups, groups) for p, n in zip(g["params"], e["params"])}
            wholes: dict[tuple[int, str], Any] = {}  # (buffer, role) -> its whole section, gathered once
            for segment in self._packing.segments:
                sections = {}
                for role in self.state_spec(self.param_groups[segment.group_index]):
                    key = (id(segment.buffer), role)
                    if key not in wholes:
                        wholes[key] = segment.buffer.whole(role)
                    sections[role] = wholes[key]
                for i, p in enumerate(segment.params):
                    if segment.counts[i]:
                        entry = state_arrays(segment, i, sections)
                        entry["step"] = float(segment.counts[i])
                        state[numbering[id(p)]] = entry
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore options and state saved by ``state_dict`` (checked first: nothing
        changes if the groups or the state's shapes do not match)."""
        groups = state_dict["param_groups"]
        saved_state = {int(n): entry for n, entry in state_dict["state"].items()}
        if len(groups) != len(self.param_groups):
            raise ValueError(f"{self._name}.load_state_dict: the state has {len(groups)} parameter groups, "
                             f"the optimizer {len(self.param_groups)}")
        params = [p for g in self.param_groups for p in g["params"]]
        for mine, saved in zip(self.param_groups, groups):
            if len(mine["params"]) != len(saved["params"]):
                raise ValueError(f"{self._name}.load_state_dict: a group of {len(mine['params'])} parameters "
                                 f"does not match a saved group of {len(saved['params'])}")
        for n, entry in saved_state.items():
            if not 0 <= n < len(params):
                raise ValueError(f"{self._name}.load_state_dict: the state names parameter {n}, "
                                 f"the optimizer has {len(params)} (0 to {len(params) - 1})")
            for role, value in entry.items():
                if role != "step" and tuple(np.shape(value)) != tuple(params[n].shape):
                    raise ValueError(f"{self._name}.load_state_dict: state {role!r} of parameter {n} has shape "
                                     f"{tuple(np.shape(value))}, the parameter {tuple(params[n].shape)}")
        for mine, saved in zip(self.param_groups, groups):
            options = {k: v for k, v in saved.items() if k != "params"}
            self._check({**mine, **options})
        for mine, saved in zip(self.param_groups, groups):
            mine.update({k: v for k, v in saved.items() if k != "params"})
        self._packing = pack(self.param_groups, self.state_spec, None, self._shard)
        for n, p in enumerate(params):
            segment, i = self._packing.locate(p)
            if n in saved_state:
                _load_entry(segment, i, saved_state[n])


def _sync_lr(segment: Segment, group: dict[str, Any]) -> None:
    """Copy a changed ``group["lr"]`` into the segment's device scalar."""
    if group["lr"] != segment.lr_seen:
        backend = segment.buffer.backend
        backend.copy_(segment.lr, backend.full((1,), group["lr"], segment.lr.dtype))
        segment.lr_seen = group["lr"]


def _load_entry(segment: Segment, i: int, entry: dict[str, Any]) -> None:
    buffer = segment.buffer
    lo, hi = segment.offsets[i], segment.offsets[i] + segment.sizes[i]
    start, stop = buffer.owned_range(lo, hi)
    for role, value in entry.items():
        if role == "step":
            continue
        host = np.ascontiguousarray(value, dtype=buffer.dtype).reshape(-1)[start - lo:stop - lo]
        buffer.backend.copy_(buffer.owned(role, lo, hi), buffer.backend.from_numpy(host))
    versions.bump(segment.buffer.storage)
    segment.set_count(i, int(entry["step"]))


def _runs(segment: Segment) -> list[tuple[int, int]]:
    """Maximal runs of consecutive parameters that have a gradient and the same step
    count: each run is one kernel call (one run when every parameter has a grad)."""
    runs, first = [], None
    counts, params = segment.counts, segment.params
    for i, p in enumerate(params):
        active = p.grad is not None
        if first is not None and (not active or counts[i] != counts[first]):
            runs.append((first, i))
            first = None
        if active and first is None:
            first = i
    if first is not None:
        runs.append((first, len(params)))
    return runs


def _check_segment(name: str, segment: Segment) -> None:
    """Every parameter and gradient still fits its place in the flat buffer (only the
    ones that are no longer views of it need a look)."""
    for i, (p, view, grad_view) in enumerate(zip(segment.params, segment.param_views, segment.grad_views)):
        if p.data is not view:
            _check_fits(name, segment, i, "parameter", p, tuple(view.shape))
        if p.grad is not None and p.grad.data is not grad_view:
            _check_fits(name, segment, i, "gradient", p.grad, tuple(view.shape))


def _check_fits(name: str, segment: Segment, i: int, what: str, t: Tensor, shape: tuple[int, ...]) -> None:
    dtype, device = segment.buffer.dtype, segment.device
    if t.device != device or np.dtype(t.dtype) != dtype or tuple(t.shape) != shape:
        raise ValueError(f"{name}.step: the {what} of parameter {i} in group {segment.group_index} is "
                         f"{t.dtype} {tuple(t.shape)} on {t.device}, its group holds {dtype} {shape} on {device}")
