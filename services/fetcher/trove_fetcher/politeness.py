"""Per-domain politeness shared by every fetcher pod, kept in NATS KV.

Each domain has one small record (``DomainSlot``) updated only by compare-and-set on
the KV revision, so among all pods exactly one wins each lease. The fetcher takes a
lease for every request it sends: a page, robots.txt, and each redirect hop (a hop's
lease is its own host's, taken once the previous response has ended).

* ``free_at``: no request may start before this; ``finish`` sets it to ``end + gap``.
  The gap is measured from the end of the previous response, so the site never sees
  two requests closer than the gap, whatever the network latency.
* ``busy_until``: a request is in flight. Taking the lease sets it to
  ``now + request_timeout`` (the longest a request can take), so a pod that dies
  mid-fetch still leaves the domain alone until then; ``finish`` clears it.
* ``next``: the reservation frontier. A message that cannot go now is given the next
  free slot (``next`` advances by one gap) and comes back at that time as a NATS
  scheduled message: waiting costs no consumer capacity and no delivery attempts, so
  a domain with thousands of queued pages never holds up the others.
* ``gap``: the domain's delay (the configured minimum, raised by robots.txt
  Crawl-delay, capped by the configured maximum).
* ``backoff_until``: a 429/503 Retry-After pauses the whole domain for every pod.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, replace
from typing import Protocol

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

FIELDS = ("free_at", "busy_until", "next", "gap", "backoff_until")
#: Domains whose last written record a pod remembers (see ``Politeness._written``).
WRITTEN_MEMORY = 10_000
#: While another request to the domain is in flight, a reserved job looks again after
#: a gap, but never sooner than this: with a gap near 0 it read the record in a loop
#: (about 12 NATS messages a page from the fetchers in the throughput benchmark).
BUSY_RECHECK = 0.05
KEY_OK = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")


class KV(Protocol):
    """The part of nats-py's KeyValue this module needs (the injected seam)."""

    async def get(self, key: str) -> object: ...
    async def create(self, key: str, value: bytes) -> int: ...
    async def update(self, key: str, value: bytes, last: int | None = None) -> int: ...


@dataclass(slots=True)
class DomainSlot:
    free_at: float = 0.0
    busy_until: float = 0.0
    next: float = 0.0
    gap: float = 0.0
    backoff_until: float = 0.0

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes | None, default_gap: float) -> DomainSlot:
        if not data:
            return cls(gap=default_gap)
        try:
            raw = json.loads(data)
            return cls(**{k: float(raw.get(k, 0.0)) for k in FIELDS})
        except (ValueError, TypeError):
            return cls(gap=default_gap)


@dataclass(frozen=True, slots=True)
class Granted:
    """The lease is ours: send the request now. ``hold_until`` identifies our hold."""

    hold_until: float
    gap: float


@dataclass(frozen=True, slots=True)
class Deferred:
    """Not now: come back at ``at`` (a reserved slot, or when the domain frees up)."""

    at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PolitenessConfig:
    min_delay: float = 10.0
    max_delay: float = 120.0
    #: Longest a request may take (the fetch's total timeout): the pessimistic hold.
    request_timeout: float = 30.0
    max_backoff: float = 3600.0


class Politeness:
    """Leases and slots for domains, over a KV bucket (one instance per pod)."""

    def __init__(self, kv: KV, config: PolitenessConfig) -> None:
        self.kv = kv
        self.config = config
        #: The record and revision of each domain as this pod last wrote it. A guess to
        #: write against: when it is current (the usual case, one pod per domain at a
        #: time) a lease or a finish costs one KV round trip instead of two; when it is
        #: stale the compare-and-set fails and the record is read. Decisions that write
        #: nothing are never taken from it.
        self._written: dict[str, tuple[DomainSlot, int]] = {}

    @staticmethod
    def key(domain: str) -> str:
        if KEY_OK.match(domain):
            return domain
        return "h." + hashlib.sha1(domain.encode(), usedforsecurity=False).hexdigest()

    def clamp_gap(self, gap: float) -> float:
        return min(
            max(gap, self.config.min_delay), max(self.config.max_delay, self.config.min_delay)
        )

    async def acquire(
        self, domain: str, now: float, *, reserved: bool = False
    ) -> Granted | Deferred:
        """Take the domain's lease at ``now``, or say when to come back.

        ``reserved`` messages already hold a slot (they were deferred once); fresh ones
        queue behind every reservation.
        """
        key = self.key(domain)
        guess = self._guess(key)
        while True:
            slot, revision = guess if guess is not None else await self._read(key)
            free = max(slot.free_at, slot.backoff_until)
            earliest = max(free, slot.busy_until)
            if not reserved:
                earliest = max(earliest, slot.next)
            if now >= earliest:
                hold = now + self.config.request_timeout
                slot.busy_until = hold
                slot.free_at = now + slot.gap
                slot.next = max(slot.next, now + slot.gap)
                if await self._write(key, slot, revision):
                    return Granted(hold_until=hold, gap=slot.gap)
                guess = None
                continue
            if guess is not None:  # deciding to wait: only on what the bucket says now
                guess = None
                continue
            if reserved:
                # Keep our place: the domain is busy or cooling down a little longer. While
                # a request is in flight we cannot know when it ends: look again a gap on.
                if slot.busy_until > now:
                    return Deferred(at=max(free, now + max(slot.gap, BUSY_RECHECK)))
                return Deferred(at=free)
            # The in-flight hold is pessimistic; slots are planned one gap apart and
            # checked again when they come due.
            at = max(slot.next, free, now)
            slot.next = at + slot.gap
            if await self._write(key, slot, revision):
                return Deferred(at=at)
            guess = None

    async def finish(self, domain: str, grant: Granted, end: float) -> None:
        """The request ended at ``end``: the domain is free again one gap later."""
        key = self.key(domain)
        guess = self._guess(key)
        while True:
            slot, revision = guess if guess is not None else await self._read(key)
            slot.free_at = max(slot.free_at, end + slot.gap)
            if slot.busy_until == grant.hold_until:
                slot.busy_until = 0.0
            if await self._write(key, slot, revision):
                return
            guess = None

    async def back_off(self, domain: str, until: float, now: float) -> None:
        """Pause the domain for every pod (a 429/503 Retry-After), capped."""
        until = min(until, now + self.config.max_backoff)
        await self._modify(
            domain, lambda s: setattr(s, "backoff_until", max(s.backoff_until, until))
        )

    async def set_gap(self, domain: str, crawl_delay: float | None) -> float:
        gap = self.clamp_gap(crawl_delay or 0.0)
        await self._modify(domain, lambda s: setattr(s, "gap", gap))
        return gap

    async def state(self, domain: str) -> DomainSlot:
        slot, _ = await self._read(self.key(domain))
        return slot

    async def _modify(self, domain: str, change: object) -> None:
        key = self.key(domain)
        assert callable(change)
        while True:
            slot, revision = await self._read(key)
            change(slot)
            if await self._write(key, slot, revision):
                return

    async def _read(self, key: str) -> tuple[DomainSlot, int | None]:
        try:
            entry = await self.kv.get(key)
        except KeyNotFoundError:
            return DomainSlot(gap=self.config.min_delay), None
        value = getattr(entry, "value", None)
        revision = getattr(entry, "revision", None)
        return DomainSlot.decode(value, self.config.min_delay), revision

    async def _write(self, key: str, slot: DomainSlot, revision: int | None) -> bool:
        """Compare-and-set: False when another pod changed the record first."""
        try:
            if revision is None:
                written = await self.kv.create(key, slot.encode())
            else:
                written = await self.kv.update(key, slot.encode(), last=revision)
        except KeyWrongLastSequenceError:
            self._written.pop(key, None)
            return False
        if len(self._written) >= WRITTEN_MEMORY and key not in self._written:
            del self._written[next(iter(self._written))]
        self._written[key] = (replace(slot), written)
        return True

    def _guess(self, key: str) -> tuple[DomainSlot, int] | None:
        """A copy of the record as this pod last wrote it, if it remembers one."""
        known = self._written.get(key)
        return None if known is None else (replace(known[0]), known[1])
