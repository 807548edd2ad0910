"""Random numbers: ``tc.manual_seed`` and ``tc.Generator`` (same seed -> same numbers)."""

from __future__ import annotations

import json
import threading
import weakref
from typing import Any

import numpy as np

from . import dtypes
from .backends import backend_for, default_device_name
from .devices import canonical
from .sizes import check_size

_OP_NAMES = {"uniform": "rand", "normal": "randn", "integers": "randint"}


class Generator:
    """A seeded stream of random numbers on one device."""

    def __init__(self, device: str = "cpu", seed: int | None = None) -> None:
        self.device = canonical(device)
        self._lock = threading.Lock()
        self.manual_seed(_default_seed[0] if seed is None else seed)
        _generators.add(self)

    def manual_seed(self, seed: int) -> "Generator":
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"manual_seed: seed must be a non-negative int, got {seed!r}")
        self.seed = seed
        self._state = backend_for(self.device).rng(seed)
        return self

    @property
    def state_object(self) -> Any:
        """The backend's state object the draws advance (a compiled plan binds it; a
        reseed to another seed replaces it)."""
        return self._state

    def initial_seed(self) -> int:
        return self.seed

    def get_state(self) -> np.ndarray:
        """The generator's position as a uint8 array (for checkpoints), as ``torch.Generator.get_state``."""
        with self._lock:
            if hasattr(self._state, "bit_generator"):  # NumPy: the bit generator's state dict
                return np.frombuffer(json.dumps(self._state.bit_generator.state).encode(), np.uint8).copy()
            words = np.concatenate([[np.uint64(self._state.seed)], self._state.state.get()])  # CUDA: seed, Philox
            return words.astype(np.uint64).view(np.uint8)

    def set_state(self, state: Any) -> None:
        """Return to a position saved by ``get_state`` (on a generator of the same device)."""
        raw = np.ascontiguousarray(np.asarray(state), dtype=np.uint8)
        with self._lock:
            if hasattr(self._state, "bit_generator"):
                try:
                    self._state.bit_generator.state = json.loads(raw.tobytes().decode())
                except (ValueError, TypeError, KeyError) as exc:
                    raise ValueError(f"Generator.set_state: not a state of a {self.device} generator ({exc})") from exc
                return
            if raw.size != 24:
                raise ValueError(f"Generator.set_state: a {self.device} generator's state is 24 bytes, got {raw.size}")
            words = raw.view(np.uint64)
            if int(words[0]) != int(self._state.seed):
                # the kernels take the seed by value, so a captured CUDA graph holds it:
                # a new seed gets a new state object, which compiled plans see and retrace
                self._state = backend_for(self.device).rng(int(words[0]))
            self._state.state.set(words[1:].copy())

    def draw(self, kind: str, shape: tuple[int, ...], a: float, b: float, dtype: Any) -> Any:
        """Backend array of ``kind`` in (uniform, normal, integers) with parameters a, b."""
        with self._lock:
            return getattr(backend_for(self.device), kind)(self._state, shape, a, b, dtype)


_default: dict[str, Generator] = {}
_generators: "weakref.WeakSet[Generator]" = weakref.WeakSet()  # compiled plans find a state's generator here
_default_seed = [0x5EED]


def manual_seed(seed: int) -> None:
    """Seed the default generator of every device (and those created later)."""
    Generator("cpu", seed)  # validates the seed before any state changes
    _default_seed[0] = seed
    for generator in _default.values():
        generator.manual_seed(seed)


def default_generators() -> dict[str, Generator]:
    """The default generator of each device made so far, by device."""
    return dict(_default)


def live_generators() -> list[Generator]:
    """Every generator still alive (compiled plans find a state object's generator here)."""
    return list(_generators)


def default_generator(device: str) -> Generator:
    if device not in _default:
        _default[device] = Generator(device, _default_seed[0])
    return _default[device]


def _generator(device: str, generator: Generator | None) -> Generator:
    if generator is None:
        return default_generator(device)
    if generator.device != device:
        raise ValueError(f"random: generator is on {generator.device}, requested device {device}")
    return generator


def _random(kind: str, shape: tuple, a: float, b: float, dtype: Any, device: str | None,
            generator: Generator | None, requires_grad: bool = False) -> "Tensor":
    device = canonical(device) if device is not None else default_device_name()
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple | list) else tuple(shape)
    dtype = dtypes.as_dtype(dtype)
    shape = check_size(_OP_NAMES[kind], shape, dtype, device)
    data = _generator(device, generator).draw(kind, shape, a, b, dtype)
    return Tensor(data, device, requires_grad)


def rand(*shape: Any, dtype: Any = dtypes.float32, device: str | None = None,
         generator: Generator | None = None, requires_grad: bool = False) -> "Tensor":
    """Uniform on [0, 1)."""
    return _random("uniform", shape, 0.0, 1.0, dtype, device, generator, requires_grad)


def randn(*shape: Any, dtype: Any = dtypes.float32, device: str | None = None,
          generator: Generator | None = None, requires_grad: bool = False) -> "Tensor":
    """Standard normal."""
    return _random("normal", shape, 0.0, 1.0, dtype, device, generator, requires_grad)


def randint(low: int, high: int | None = None, size: tuple[int, ...] = (), dtype: Any = dtypes.int64,
            device: str | None = None, generator: Generator | None = None) -> "Tensor":
    """Integers uniform on [low, high) (``randint(high, size=...)`` also works)."""
    if high is None:
        low, high = 0, low
    if high <= low:
        raise ValueError(f"randint: high ({high}) must be greater than low ({low})")
    return _random("integers", size, low, high, dtype, device, generator)


def rand_like(t: "Tensor", dtype: Any = None, generator: Generator | None = None) -> "Tensor":
    return rand(*t.shape, dtype=dtype or t.dtype, device=t.device, generator=generator)


def randn_like(t: "Tensor", dtype: Any = None, generator: Generator | None = None) -> "Tensor":
    return randn(*t.shape, dtype=dtype or t.dtype, device=t.device, generator=generator)


from .tensor import Tensor  # noqa: E402
