"""Device names: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` and ``tc.device`` objects.

Tensors record their device as a plain name, ``"cpu"`` or ``"cuda"``; ``"cuda"`` is the
current CUDA device (CuPy's, device 0 unless changed).  Everywhere a device is taken,
``"cuda:N"`` and ``tc.device("cuda", N)`` are accepted too: N is checked against the
visible devices and must be the current one, since one process runs on one GPU
(choose it with ``CUDA_VISIBLE_DEVICES`` or ``cupy.cuda.Device(N).use()``).
"""

from __future__ import annotations

from typing import Any

TYPES = ("cpu", "cuda")


class device:  # noqa: N801  (lower case, as torch.device)
    """A device type and optional index: ``device("cuda")``, ``device("cuda", 0)``,
    ``device("cuda:0")``.  Compares equal to a device of the same type and index, or
    to the string naming it (``device("cuda:0") == "cuda:0"``)."""

    __slots__ = ("type", "index")

    def __init__(self, spec: "str | device", index: int | None = None) -> None:
        if isinstance(spec, device):
            kind, parsed = spec.type, spec.index
        elif isinstance(spec, str):
            kind, parsed = _parse(spec)
        else:
            raise TypeError(f"device: expected a device name such as 'cpu', 'cuda' or 'cuda:0', got {type(spec).__name__}")
        if index is not None and parsed is not None:
            raise ValueError(f"device: {spec!r} already names an index; got index={index} too")
        index = parsed if index is None else index
        if index is not None and (not isinstance(index, int) or isinstance(index, bool) or index < 0):
            raise ValueError(f"device: the index must be an int >= 0, got {index!r}")
        self.type, self.index = kind, index

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        return f"device(type={self.type!r}" + ("" if self.index is None else f", index={self.index}") + ")"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            try:
                other = device(other)
            except ValueError:
                return False
        return isinstance(other, device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))


def _parse(name: str) -> tuple[str, int | None]:
    kind, colon, number = name.partition(":")
    if kind not in TYPES or (colon and not number.isdigit()):
        raise ValueError(f"unknown device {name!r}; valid devices: 'cpu', 'cuda', 'cuda:N'")
    return kind, int(number) if colon else None


def canonical(spec: "str | device") -> str:
    """The name tensors record for ``spec``: "cpu" or "cuda", after checking its index."""
    if isinstance(spec, str) and spec in TYPES:  # the common case, without parsing
        return spec
    d = device(spec)
    if d.index is not None:
        _check_index(d)
    return d.type


def _check_index(d: device) -> None:
    if d.type == "cpu":
        if d.index != 0:
            raise ValueError(f"device {str(d)!r}: there is one CPU device, 'cpu' (or 'cpu:0')")
        return
    try:
        import cupy
    except ImportError:
        return  # the CUDA backend itself reports that CuPy is missing, with the install command
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:
        count = 0
    if d.index >= count:
        visible = "no CUDA device is visible" if count == 0 else f"the visible CUDA devices are cuda:0..cuda:{count - 1}"
        raise ValueError(f"device {str(d)!r}: {visible}")
    current = cupy.cuda.runtime.getDevice()
    if d.index != current:
        raise ValueError(f"device {str(d)!r}: tensorcore runs on the current CUDA device, cuda:{current}; "
                         f"make cuda:{d.index} current with cupy.cuda.Device({d.index}).use() (or "
                         f"CUDA_VISIBLE_DEVICES={d.index}) before creating tensors")


def is_device(value: Any) -> bool:
    """Whether ``value`` names a device (a str or a ``device``) rather than, say, a dtype."""
    return isinstance(value, str | device)
