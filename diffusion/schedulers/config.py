"""Scheduler configuration as data: diffusers' keys, their checks, ``scheduler_config.json``.

A scheduler's constructor keywords are its configuration.  ``ConfigMixin`` records
them (validated, as plain JSON-able values), hands them out as ``scheduler.config``,
rebuilds a scheduler from such a dict (``from_config``) and reads and writes the
``scheduler_config.json`` that diffusers reads and writes.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import numbers
import os
import warnings
from typing import Any, Callable, ClassVar, Mapping, TypeVar

import numpy as np

from layers.files import read_json
from tensorcore.atomic import write_atomic

CONFIG_NAME = "scheduler_config.json"

# Keys of diffusers' other schedulers that share these schedulers' configs (DEIS, Heun, EDM,
# ...): a config written for one of them loads here without a warning.
_SIBLING_KEYS = frozenset({"rho", "sigma_data", "sigma_schedule"})

Self = TypeVar("Self", bound="ConfigMixin")


class Config(dict):
    """A scheduler's configuration: a plain dict whose keys also read as attributes."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"config has no key {name!r}") from None


def _integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)


def _flag(value: Any) -> bool:
    return isinstance(value, bool | np.bool_)


def _betas(value: Any) -> bool:
    if value is None:
        return True
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    return array.ndim == 1 and array.size > 0 and bool(np.all((array >= 0) & (array < 1)))


# key -> (check, what the value must be); keys with a fixed set of values are in ``_choices``.
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "num_train_timesteps": (lambda v: _integer(v) and v >= 2, "an int >= 2"),
    "beta_start": (lambda v: _real(v) and 0 <= v < 1, "a float in [0, 1)"),
    "beta_end": (lambda v: _real(v) and 0 <= v < 1, "a float in [0, 1)"),
    "trained_betas": (_betas, "None or a non-empty list of betas in [0, 1)"),
    "steps_offset": (lambda v: _integer(v) and v >= 0, "an int >= 0"),
    "original_inference_steps": (lambda v: _integer(v) and v >= 1, "an int >= 1"),
    "timestep_scaling": (lambda v: _real(v) and v > 0, "a float > 0"),
    "disable_corrector": (lambda v: isinstance(v, list) and all(_integer(i) for i in v), "a list of step indices"),
    "clip_sample_range": (lambda v: _real(v) and v > 0, "a float > 0"),
    "dynamic_thresholding_ratio": (lambda v: _real(v) and 0 < v <= 1, "a float in (0, 1]"),
    "sample_max_value": (lambda v: _real(v) and v > 0, "a float > 0"),
    "lambda_min_clipped": (lambda v: _real(v) and not math.isnan(v), "a float (-inf allowed)"),
    "flow_shift": (lambda v: _real(v) and v > 0, "a float > 0"),
    "sigma_min": (lambda v: v is None or (_real(v) and v > 0), "None or a float > 0"),
    "sigma_max": (lambda v: v is None or (_real(v) and v > 0), "None or a float > 0"),
    # DPM-Solver reads only "learned" / "learned_range" and, as diffusers, takes any other
    # name (a DDPM config's "fixed_small") as a fixed variance
    "variance_type": (lambda v: v is None or isinstance(v, str), "None or a str"),
}


def _plain(value: Any) -> Any:
    """``value`` as a plain Python (JSON-able) value: NumPy scalars and arrays unwrapped."""
    if isinstance(value, np.ndarray | list | tuple):  # a list of plain numbers (ints stay ints)
        return [_plain(v) for v in (value.tolist() if isinstance(value, np.ndarray) else value)]
    if isinstance(value, np.generic):
        return value.item()
    return value


class ConfigMixin:
    """Configuration handling shared by the schedulers (diffusers' ``ConfigMixin`` surface)."""

    config_name: ClassVar[str] = CONFIG_NAME
    # key -> allowed values, for keys with a fixed set of values (set per scheduler class)
    _choices: ClassVar[dict[str, tuple]] = {}
    _subclasses: ClassVar[list[type]] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        ConfigMixin._subclasses.append(cls)

    @classmethod
    def config_defaults(cls) -> dict[str, Any]:
        """Every configuration key of this class with its default value."""
        params = inspect.signature(cls.__init__).parameters
        return {name: p.default for name, p in params.items() if name != "self"}

    def _register_config(self, values: Mapping[str, Any], explicit: set[str]) -> None:
        """Check and record the configuration; ``explicit`` names the keys the caller passed."""
        config = Config()
        for key, value in values.items():
            config[key] = self._checked(key, _plain(value))
        config["_use_default_values"] = sorted(set(values) - explicit)
        self._config = config

    @classmethod
    def _checked(cls, key: str, value: Any) -> Any:
        """``value`` if it is valid for ``key`` (a choice as the allowed value itself), else ValueError."""
        if key in cls._choices:
            allowed = cls._choices[key]
            for choice in allowed:
                if _same(value, choice):
                    return choice
            raise ValueError(f"{cls.__name__}: {key} must be one of {allowed}, got {value!r}")
        check, expected = _RULES.get(key, (_flag, "a bool"))  # keys with no rule are flags
        if not check(value):
            raise ValueError(f"{cls.__name__}: {key} must be {expected}, got {value!r}")
        return value

    @property
    def config(self) -> Config:
        """The configuration (a copy: editing it changes nothing; build a new scheduler instead)."""
        return Config({k: list(v) if isinstance(v, list) else v for k, v in self._config.items()})

    @classmethod
    def from_config(cls: type[Self], config: Mapping[str, Any] | None = None, **kwargs: Any) -> Self:
        """A scheduler built from a config dict (any scheduler's ``.config`` or a loaded JSON).

        ``kwargs`` override the dict.  Keys that kept their defaults in the source config
        (``_use_default_values``) take this class's defaults, as in diffusers; keys of other
        schedulers are dropped quietly and unknown keys with one warning.
        """
        if config is not None and not isinstance(config, Mapping):
            raise TypeError(f"{cls.__name__}.from_config: config must be a dict, got {type(config).__name__}")
        source = dict(config or {})
        defaulted = set(source.pop("_use_default_values", None) or ())
        source = {k: v for k, v in source.items() if k not in defaulted and not k.startswith("_")}
        source.update(kwargs)
        own = cls.config_defaults()
        siblings = _SIBLING_KEYS.union(*(c.config_defaults() for c in ConfigMixin._subclasses))
        unknown = sorted(k for k in source if k not in own and k not in siblings)
        if unknown:
            warnings.warn(f"{cls.__name__}: config keys {unknown} are not {cls.__name__} options "
                          f"and are ignored", UserWarning, stacklevel=2)
        return cls(**{k: v for k, v in source.items() if k in own})

    @classmethod
    def from_pretrained(cls: type[Self], path: str | os.PathLike, subfolder: str | None = None,
                        **kwargs: Any) -> Self:
        """A scheduler from ``path/[subfolder/]scheduler_config.json`` (or a JSON file path)."""
        path = os.fspath(path)
        if subfolder:
            path = os.path.join(path, subfolder)
        file = path if os.path.isfile(path) else os.path.join(path, cls.config_name)
        if not os.path.isfile(file):
            raise FileNotFoundError(f"{cls.__name__}.from_pretrained: no {cls.config_name} at {path!r}")
        data = read_json(file, f"{cls.__name__}.from_pretrained")  # a regular file, bounded in size and depth
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__name__}.from_pretrained: {file!r} holds a {type(data).__name__}, "
                             f"expected a JSON object")
        return cls.from_config(data, **kwargs)

    def save_config(self, save_directory: str | os.PathLike) -> None:
        """Write ``scheduler_config.json`` into ``save_directory`` (created if needed), atomically."""
        directory = os.fspath(save_directory)
        if os.path.isfile(directory):
            raise ValueError(f"save_config: {directory!r} is a file; expected a directory")
        os.makedirs(directory, exist_ok=True)
        data = {k: v for k, v in self._config.items() if not k.startswith("_")}
        data["_class_name"] = type(self).__name__
        text = json.dumps(data, indent=2, sort_keys=True) + "\n"
        write_atomic(os.path.join(directory, self.config_name), text.encode("utf-8"))

    save_pretrained = save_config

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={v!r}" for k, v in self._config.items() if not k.startswith("_"))
        return f"{type(self).__name__}({items})"


def _same(a: Any, b: Any) -> bool:
    """Config values equal in value and kind (``True`` is not ``1``)."""
    return _flag(a) == _flag(b) and a == b


def register_to_config(init: Callable[..., None]) -> Callable[..., None]:
    """Decorate a scheduler's ``__init__``: its keyword arguments become the checked config.

    The config is recorded before the body runs, so the body reads ``self.config``.
    Keys the caller left out are listed in ``config["_use_default_values"]``.
    """
    signature = inspect.signature(init)

    @functools.wraps(init)
    def wrapper(self: ConfigMixin, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        explicit = set(bound.arguments) - {"self"}
        bound.apply_defaults()
        self._register_config({k: v for k, v in bound.arguments.items() if k != "self"}, explicit)
        init(self, *args, **kwargs)

    return wrapper
