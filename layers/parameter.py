"""Parameter: a Tensor that a Module registers as trainable."""

from __future__ import annotations

from typing import Any

from tensorcore import Tensor
from tensorcore.tensor import note_rebind

_STORAGE = Tensor.__dict__["data"]  # the slot holding a tensor's backend array
_REQUIRES_GRAD = Tensor.__dict__["requires_grad"]  # the slot of the requires_grad flag


class Parameter(Tensor):
    """A leaf tensor that requires grad by default and is found by ``Module.parameters()``.

    ``bounds`` = (low, high) (either may be None) is a constraint the optimizers apply
    inside their fused step, e.g. DiffusionConv keeps its diffusion times >= 1e-6.

    ``p.data = t`` replaces the values with those of a tensor (or backend array) of the
    same shape, dtype and device, checked at assignment; ``Module.to`` changes dtype
    and device.  Every such change is announced (``tensorcore.tensor.note_rebind``), so a
    compiled plan bound to the old storage notices it without checking every parameter
    on every call.
    """

    announces_rebinds = True

    def __init__(self, data: Any, requires_grad: bool = True, bounds: tuple[float | None, float | None] | None = None) -> None:
        if isinstance(data, Tensor):
            device, data = data.device, data.data
        else:
            device = "cpu"
        super().__init__(data, device, requires_grad)
        self.bounds = bounds

    @property
    def data(self) -> Any:
        return _STORAGE.__get__(self)

    @data.setter
    def data(self, value: Any) -> None:
        try:
            current = _STORAGE.__get__(self)
        except AttributeError:  # being constructed
            _STORAGE.__set__(self, value)
            return
        _STORAGE.__set__(self, _checked_storage(current, self.device, value))
        note_rebind()

    @property
    def requires_grad(self) -> bool:
        return _REQUIRES_GRAD.__get__(self)

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        _REQUIRES_GRAD.__set__(self, value)
        note_rebind()

    def _set_storage(self, data: Any, device: str) -> None:
        """Swap in an array of another dtype or device (``Module.to``), keeping identity."""
        _STORAGE.__set__(self, data)
        self.device = device
        note_rebind()

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


def _checked_storage(current: Any, device: str, value: Any) -> Any:
    """The backend array of ``value`` if it can replace ``current`` as it is, else raise."""
    if isinstance(value, Tensor):
        if value.device != device:
            raise ValueError(f"Parameter.data: the parameter is on {device!r}, the new value on {value.device!r}; "
                             "use Module.to() to move parameters")
        value = value.data
    elif not isinstance(value, type(current)):
        raise TypeError(f"Parameter.data: expected a Tensor of shape {tuple(current.shape)} on {device!r}, "
                        f"got {type(value).__name__}")
    if tuple(value.shape) != tuple(current.shape):
        raise ValueError(f"Parameter.data: the parameter has shape {tuple(current.shape)}, "
                         f"the new value {tuple(value.shape)}")
    if value.dtype != current.dtype:
        raise TypeError(f"Parameter.data: the parameter is {current.dtype}, the new value {value.dtype}; "
                        "use Module.to(dtype=...) to change parameter dtypes")
    return value
