"""What this process already learned from the seen bucket, so it need not ask again.

Most links on a page point at URLs discovered long ago (navigation, tags, the site's
other posts). Asking the shared bucket about each one cost two NATS round trips per
link (a refused ``create``, then a ``get``); the answer never changes while the key
lives, because a key is written once, by ``create``. So each answer is remembered here.

Two generations of a plain dict: lookups check both, writes go to the newer one, and
the older one is dropped when the newer one is full or ``ttl`` has passed. An entry
therefore lives between ``ttl / 2`` and ``ttl`` and at most ``capacity`` are kept,
with no per-entry timestamps. ``ttl`` is far below the bucket's own (days), so a key
that expired there is forgotten here soon after.

The bucket's per-host budget counters are remembered the same way (``Recent``), but
differently trusted: they change, so a remembered counter is only the revision to
compare-and-set against, and a refusal is never taken from memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class Recent(Generic[V]):
    """A bounded, time-limited memory: key -> value, in two generations of a dict."""

    def __init__(
        self, capacity: int, ttl: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.capacity = capacity
        self.ttl = ttl
        self._clock = clock
        self._new: dict[str, V] = {}
        self._old: dict[str, V] = {}
        self._rotated_at = clock()

    def __len__(self) -> int:
        return len(self._new) + len(self._old)

    def get(self, key: str) -> V | None:
        self._maybe_rotate()
        found = self._new.get(key)
        return found if found is not None else self._old.get(key)

    def remember(self, key: str, value: V) -> None:
        if self.capacity <= 0:
            return
        self._maybe_rotate()
        self._new[key] = value
        if len(self._new) >= max(1, self.capacity // 2):
            self._rotate()

    def forget(self, key: str) -> None:
        self._new.pop(key, None)
        self._old.pop(key, None)

    def _maybe_rotate(self) -> None:
        idle = self._clock() - self._rotated_at
        if idle >= self.ttl:
            # Both generations are older than the TTL: one rotation would keep the newer
            # one, however long ago it was written (a quiet night, then a page).
            self._old, self._new = {}, {}
            self._rotated_at = self._clock()
        elif idle >= self.ttl / 2:
            self._rotate()

    def _rotate(self) -> None:
        self._old, self._new = self._new, {}
        self._rotated_at = self._clock()


class Sightings(Recent[bytes]):
    """Seen-bucket key -> the id of the event that claimed it."""

    def claimed_by(self, key: str) -> bytes | None:
        return self.get(key)
