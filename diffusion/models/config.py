"""Model configs as data: the constructor arguments, frozen, saved as diffusers' config.json.

``@register_to_config`` on a model's ``__init__`` records every argument (defaults
included) in ``model.config``, so a model can be rebuilt from its config alone
(``from_config``) and a diffusers config.json maps one key to one argument.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, Callable, Iterator, Mapping, TypeVar

from .bounds import check_config

T = TypeVar("T")


class FrozenConfig(Mapping[str, Any]):
    """A read-only mapping with attribute access (``config.block_out_channels``); lists become tuples."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_values", {k: _frozen(v) for k, v in values.items()})

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(f"config has no key {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a model config is frozen; build a new model with from_config(...)")

    def __repr__(self) -> str:
        return f"FrozenConfig({self._values!r})"

    def to_json_dict(self) -> dict[str, Any]:
        """Plain JSON values (tuples as lists)."""
        return {k: _jsonable(v) for k, v in self._values.items()}


def _frozen(value: Any) -> Any:
    return tuple(_frozen(v) for v in value) if isinstance(value, list | tuple) else value


def _jsonable(value: Any) -> Any:
    return [_jsonable(v) for v in value] if isinstance(value, tuple | list) else value


def register_to_config(init: Callable[..., None]) -> Callable[..., None]:
    """Decorate ``__init__`` so the bound arguments (with defaults) become ``self.config``.

    Before ``__init__`` runs, the arguments pass the class's ``config_bounds`` and
    ``parameter_shares`` (see ``bounds.check_config``), so an absurd config builds nothing.
    """
    signature = inspect.signature(init)

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        values = {k: v for k, v in bound.arguments.items() if k != "self"}
        cls = type(self)
        check_config(cls.__name__, values, getattr(cls, "config_bounds", {}), getattr(cls, "parameter_shares", None))
        init(self, *args, **kwargs)
        object.__setattr__(self, "config", FrozenConfig(values))

    return wrapper


def config_keys(cls: type) -> list[str]:
    """The config keys ``cls`` takes: its constructor's keyword arguments."""
    return [name for name in inspect.signature(cls.__init__).parameters if name != "self"]


def init_kwargs(cls: type[T], config: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``config`` that ``cls`` takes; other keys warn (private ``_`` keys are skipped)."""
    known = set(config_keys(cls))
    unknown = sorted(k for k in config if k not in known and not k.startswith("_"))
    if unknown:
        warnings.warn(f"{cls.__name__}: ignoring unknown config keys {unknown}", stacklevel=3)
    return {k: v for k, v in config.items() if k in known}
