"""The in-memory LRU of a compiled callable's plans."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class LRU(Generic[T]):
    """At most ``capacity`` items; the least recently used goes first.  The most recent
    (key, item) is also kept aside: a call repeating the last key (a loop replaying one
    plan) costs one comparison, not two hashes and lookups of the nested key."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[Any, T] = OrderedDict()
        self._last: tuple[Any, T] | None = None  # the newest item, last in _items

    def get(self, key: Any) -> T | None:
        last = self._last
        if last is not None and last[0] == key:
            return last[1]
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
            self._last = (key, item)
        return item

    def peek(self, key: Any) -> T | None:
        """The item under ``key``, leaving the order as it is."""
        return self._items.get(key)

    def put(self, key: Any, item: T) -> list[T]:
        """Insert; returns the items pushed out (a replaced one included)."""
        out = [self._items.pop(key)] if key in self._items else []
        self._items[key] = item
        self._last = (key, item)
        while len(self._items) > self.capacity:
            out.append(self._items.popitem(last=False)[1])
        return out

    def pop(self, key: Any) -> T | None:
        if self._last is not None and self._last[0] == key:
            self._last = None
        return self._items.pop(key, None)

    def values(self) -> list[T]:
        return list(self._items.values())

    def items(self) -> list[tuple[Any, T]]:
        return list(self._items.items())

    def clear(self) -> None:
        self._items.clear()
        self._last = None

    def __len__(self) -> int:
        return len(self._items)
