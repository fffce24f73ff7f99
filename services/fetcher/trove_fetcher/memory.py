"""A small least-recently-used memory with a bound on entries and on bytes.

Every piece of per-host or per-URL memory in a pod that runs for months needs a bound:
a dict keyed by origin grows with the crawl and shows as a leak only after weeks.
``Memory`` forgets the least recently used entries first, when either the number of
entries or their total weight (their size in bytes, as the caller measures it) passes
its limit.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Memory(Generic[K, V]):
    """An LRU of at most ``max_entries`` entries weighing at most ``max_weight`` in all."""

    def __init__(self, *, max_entries: int, max_weight: int | None = None) -> None:
        if max_entries < 1:
            raise ValueError("a memory holds at least one entry")
        self.max_entries = max_entries
        self.max_weight = max_weight
        self.weight = 0
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: K) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: K, value: V, weight: int = 0) -> None:
        self.pop(key)
        if self.max_weight is not None and weight > self.max_weight:
            return  # heavier than the whole memory: not kept at all
        self._items[key] = (value, weight)
        self.weight += weight
        while len(self._items) > self.max_entries or (
            self.max_weight is not None and self.weight > self.max_weight
        ):
            _, (_, dropped) = self._items.popitem(last=False)
            self.weight -= dropped

    def pop(self, key: K) -> V | None:
        item = self._items.pop(key, None)
        if item is None:
            return None
        self.weight -= item[1]
        return item[0]
