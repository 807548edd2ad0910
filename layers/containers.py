"""Containers: Sequential, ModuleList and ModuleDict (named as in PyTorch, so state dicts match)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable, Iterator, Mapping

from .module import Module


class Sequential(Module):
    """Calls its modules in order, each on the previous one's output.

    ``Sequential(a, b, c)`` names them "0", "1", "2"; ``Sequential(OrderedDict(...))`` keeps the names.
    """

    def __init__(self, *modules: Any) -> None:
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], Mapping):
            for name, module in modules[0].items():
                self.add_module(name, module)
        else:
            for index, module in enumerate(modules):
                self.add_module(str(index), module)

    def forward(self, x: Any) -> Any:
        for module in self._modules.values():
            x = module(x)
        return x

    def append(self, module: Module) -> "Sequential":
        self.add_module(str(len(self._modules)), module)
        return self

    def __getitem__(self, index: int | slice) -> Any:
        items = list(self._modules.items())
        if isinstance(index, slice):
            return Sequential(OrderedDict(items[index]))
        return items[_checked_index(index, len(items), "Sequential")][1]

    def __setitem__(self, index: int, module: Module) -> None:
        names = list(self._modules)
        self.add_module(names[_checked_index(index, len(names), "Sequential")], module)

    def __delitem__(self, index: int) -> None:
        names = list(self._modules)
        delattr(self, names[_checked_index(index, len(names), "Sequential")])

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(list(self._modules.values()))


class ModuleList(Module):
    """A list of modules, registered under "0", "1", ... (renumbered on insert/delete)."""

    def __init__(self, modules: Iterable[Module] = ()) -> None:
        super().__init__()
        self.extend(modules)

    def _reset(self, modules: list[Module]) -> None:
        for name in list(self._modules):
            delattr(self, name)
        for index, module in enumerate(modules):
            self.add_module(str(index), module)

    def append(self, module: Module) -> "ModuleList":
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> "ModuleList":
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        modules = list(self._modules.values())
        modules.insert(index, module)
        self._reset(modules)

    def __getitem__(self, index: int | slice) -> Any:
        modules = list(self._modules.values())
        if isinstance(index, slice):
            return ModuleList(modules[index])
        return modules[_checked_index(index, len(modules), "ModuleList")]

    def __setitem__(self, index: int, module: Module) -> None:
        self.add_module(str(_checked_index(index, len(self._modules), "ModuleList")), module)

    def __delitem__(self, index: int | slice) -> None:
        modules = list(self._modules.values())
        del modules[index if isinstance(index, slice) else _checked_index(index, len(modules), "ModuleList")]
        self._reset(modules)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(list(self._modules.values()))


class ModuleDict(Module):
    """A dict of modules keyed by name."""

    def __init__(self, modules: Mapping[str, Module] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def update(self, modules: Mapping[str, Module]) -> None:
        for name, module in modules.items():
            self.add_module(name, module)

    def __getitem__(self, name: str) -> Module:
        return self._modules[name]

    def __setitem__(self, name: str, module: Module) -> None:
        self.add_module(name, module)

    def __delitem__(self, name: str) -> None:
        delattr(self, name)

    def __contains__(self, name: str) -> bool:
        return name in self._modules

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._modules))

    def keys(self) -> list[str]:
        return list(self._modules)

    def values(self) -> list[Module]:
        return list(self._modules.values())

    def items(self) -> list[tuple[str, Module]]:
        return list(self._modules.items())

    def pop(self, name: str) -> Module:
        module = self._modules[name]
        delattr(self, name)
        return module


def _checked_index(index: int, length: int, kind: str) -> int:
    if not -length <= index < length:
        raise IndexError(f"{kind}: index {index} is out of range for length {length}")
    return index % length
