"""Turns: one read-modify-write of a shared key at a time within a process.

Handlers running side by side often update the same key of a bucket (a host's lease,
its page budget, its URL evidence): a page's links name one host many times, and a
host's pages come back together. Written against the same remembered revision, all
but one compare-and-set fail, and each failure costs a read and another write: for n
writers, n(n+1)/2 writes and n(n-1)/2 reads instead of n writes. Worse, a writer that
lost must read before it writes again while the winners write at once from what they
remember, so under a steady stream of writers the same one can lose again and again.
In turns, each writes against what the one before it left, and only another process's
write can still make a compare-and-set fail.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class Turns:
    """An asyncio lock a key, dropped when nobody holds or awaits it, so the table is as
    large as the operations in flight."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def of(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users > 1:
                self._locks[key] = (lock, users - 1)
            else:
                del self._locks[key]

    def __len__(self) -> int:
        return len(self._locks)
