"""Each host's learned URL aliases, shared by every discovery replica through KV.

One record per host in ``trove_url_rules`` (``trove_schema.aliases.HostAliases``),
learned from the ``CrawlCompleted`` events discovery already reads and written by
compare-and-set, so replicas that learn from the same host at once never lose each
other's evidence. Discovery rewrites every link and seed with its host's rules before
the seen check, so a spelling known to be an alias is never discovered as a page.

Reading the bucket once per link would double discovery's round trips, so each record
is kept here for ``ttl`` seconds at most: a rule learned by one replica reaches every
other within that time, and a host costs one read per ``ttl`` however many links point
at it. Concurrent handlers wanting the same host share one read, and a replica's own
writes to a host go one at a time (a lock per host while it learns), so they do not
fail each other's compare-and-set.

Links fetched before a rule is learned would all be fetched, so a spelling whose keys
are still undecided goes out only as one of the few probes they need (``probe``); the
page's other such links wait while the probes teach (``Holds``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from trove_discovery.sightings import Recent
from trove_schema.aliases import (
    DEFAULT_LIMITS,
    EMPTY,
    NO_RULES,
    AliasLimits,
    HostAliases,
    Rules,
    observe,
    undecided,
    untaught,
)
from trove_schema.events import CrawlCompleted, CrawlOutcome
from trove_schema.heuristics import usable
from trove_schema.turns import Turns

log = logging.getLogger("trove.discovery")

#: Hosts whose record a replica keeps between reads (only those seen within ``ttl``).
CACHE_HOSTS = 4_096
#: Compare-and-set attempts before a fetch's evidence is given up (it is only evidence).
WRITE_ATTEMPTS = 10
#: (host, key) pairs whose probes a replica counts, and for how long (seconds): long
#: enough for a probe to be fetched behind its host's queue, short enough that a probe
#: that never taught anything (a 404) is followed by others.
PROBE_MEMORY = 100_000
PROBE_TTL = 1_800.0


class UrlRules:
    def __init__(
        self,
        kv: KeyValue,
        *,
        ttl: float,
        limits: AliasLimits = DEFAULT_LIMITS,
        capacity: int = CACHE_HOSTS,
        clock: Callable[[], float] = time.monotonic,
        refresh: float = 0.0,
    ) -> None:
        self.kv = kv
        self.limits = limits
        #: host -> (record, its rules, the bucket revision it was read or written at).
        self._cache: Recent[tuple[HostAliases, Rules, int | None]] = Recent(
            capacity, ttl=ttl, clock=clock
        )
        self._reading: dict[str, asyncio.Future[tuple[HostAliases, Rules, int | None]]] = {}
        #: One fold of a host's evidence at a time in this replica (``trove_schema.turns``).
        self._learning = Turns()
        #: "host key" -> spellings this replica let through to teach ``key`` (probes).
        self._probes: Recent[int] = Recent(PROBE_MEMORY, ttl=PROBE_TTL, clock=clock)
        #: Reads of the bucket this replica made (for tests and the curious).
        self.reads = 0
        #: Hosts whose record this replica wrote within ``refresh`` seconds (an entry
        #: lives a half to a whole of it). The bucket forgets a record its TTL after its
        #: last write; a host fetched meanwhile keeps it, though its fetches teach
        #: nothing new (304s, pages already sampled). 0: never written but to learn.
        self._kept: Recent[bool] | None = (
            Recent(capacity, ttl=refresh / 2, clock=clock) if refresh > 0 else None
        )

    async def rules_for(self, host: str) -> Rules:
        """The host's rules, as the bucket held them at most ``ttl`` seconds ago."""
        return (await self._load(host))[1]

    def undecided(self, host: str, url: str) -> list[str]:
        """The keys of ``url`` its host's record cannot decide yet (read by ``rules_for``)."""
        cached = self._cache.get(host)
        return undecided(cached[0] if cached else EMPTY, url, self.limits)

    def probe(self, host: str, keys: list[str]) -> bool:
        """Let another spelling go out to teach ``keys``, if it may: as many as it takes
        to learn them, and no more until what those teach has been read (one whose value
        showed another value's page taught nothing, and is given back by ``learn``)."""
        wanted = self.limits.confirmations
        if any((self._probes.get(f"{host} {key}") or 0) >= wanted for key in keys):
            return False
        self.probed(host, keys)
        return True

    def probed(self, host: str, keys: list[str], *, count: int = 1) -> None:
        for key in keys:
            name = f"{host} {key}"
            self._probes.remember(name, max(0, (self._probes.get(name) or 0) + count))

    async def learn(self, event: CrawlCompleted) -> None:
        """Fold a fetch's evidence into its host's record (compare-and-set). Only the
        page's own content is evidence: a maintenance page, a login wall or an app
        shell served for every URL has one hash for all, and would teach that every
        parameter is noise, for good (no spelling carrying one is asked again)."""
        if event.outcome not in (CrawlOutcome.SUCCESS, CrawlOutcome.NOT_MODIFIED):
            return
        host = event.domain
        # What a followed redirect led to is another page's: a shop sending withdrawn
        # products' `?id=` to its catalogue says nothing of the products still there.
        redirected = event.final_url is not None and event.final_url != event.url
        evidence = (
            event.outcome is CrawlOutcome.SUCCESS and bool(event.content_hash) and not redirected
        )
        async with self._learning.of(host):
            if evidence and usable(event):
                await self._learn(host, event)
            elif event.url in (await self._load(host))[1].probes:
                # A probe has come back all the same: still out, it would keep its name's
                # re-test waiting, and its spelling a page of its own, crawled again.
                await self._learn(host, event, evidence=False)
            await self._keep(host)

    async def _keep(self, host: str) -> None:
        """Write the host's record again, as it is, if this replica has not written it
        within ``refresh``: the host is still crawled, so its rules stay."""
        if self._kept is None or self._kept.get(host):
            return
        record, rules, revision = await self._load(host)
        if revision is not None:
            try:
                written = await self.kv.update(record_key(host), record.to_json(), last=revision)
            except KeyWrongLastSequenceError:
                self._cache.forget(host)  # another replica wrote it: as good as kept
            else:
                self._cache.remember(host, (record, rules, written))
        self._kept.remember(host, True)

    async def _learn(self, host: str, event: CrawlCompleted, *, evidence: bool = True) -> None:
        """``evidence``: whether the page is the URL's own; if not, its fetch only counts."""
        record, rules, revision = await self._load(host)
        links = sendable(event) if evidence else []
        for _ in range(WRITE_ATTEMPTS):
            new = observe(
                record,
                url=event.url,
                canonical=event.canonical_url if evidence else None,
                content_hash=event.content_hash if evidence else None,
                links=links,
                event_id=event.id,
                limits=self.limits,
            )
            if new is record:
                return
            try:
                if revision is None:
                    written = await self.kv.create(record_key(host), new.to_json())
                else:
                    written = await self.kv.update(record_key(host), new.to_json(), last=revision)
            except KeyWrongLastSequenceError:
                # Another replica wrote first (or this one's copy was stale): read again.
                record, rules, revision = await self._read(host)
                continue
            learned = new.rules(self.limits)
            self._cache.remember(host, (new, learned, written))
            # A value that showed another value's page taught nothing: its probe is owed,
            # or the page's other spellings would wait for what no probe can now teach.
            owed = untaught(record, new, event.url, self.limits)
            if owed:
                self.probed(host, owed, count=-1)
            if self._kept is not None:
                self._kept.remember(host, True)
            if learned != rules:
                log.info(
                    "url rules changed",
                    extra={"domain": host, "rules": learned.describe(), "url": event.url},
                )
            return
        log.warning("url rules not updated: too many concurrent writers", extra={"domain": host})

    async def _load(self, host: str) -> tuple[HostAliases, Rules, int | None]:
        cached = self._cache.get(host)
        if cached is not None:
            return cached
        pending = self._reading.get(host)
        if pending is None:
            pending = asyncio.ensure_future(self._read(host))
            self._reading[host] = pending
            pending.add_done_callback(lambda _: self._reading.pop(host, None))
        return await asyncio.shield(pending)

    async def _read(self, host: str) -> tuple[HostAliases, Rules, int | None]:
        self.reads += 1
        try:
            entry = await self.kv.get(record_key(host))
        except KeyNotFoundError:
            found: tuple[HostAliases, Rules, int | None] = (EMPTY, NO_RULES, None)
        else:
            record = HostAliases.from_json(entry.value)
            found = (record, record.rules(self.limits), entry.revision)
        self._cache.remember(host, found)
        return found


def record_key(host: str) -> str:
    return "h." + hashlib.sha256(host.encode()).hexdigest()[:40]


def sendable(event: CrawlCompleted) -> list[str]:
    """The page's links discovery follows whatever its settings, among which a probe is
    chosen: one it never sends (an image, a nofollow link) would keep its name's re-test
    waiting."""
    # Discovery's own definition; it imports this module, so it is read once both are.
    from trove_discovery.discovery import FOLLOWED_KINDS

    if event.nofollow:
        return []
    return [link.url for link in event.links if link.kind in FOLLOWED_KINDS and not link.nofollow]


class Holds:
    """Pages handed back (``Retry``) while links of theirs wait for aliases to be learned.

    A spelling that might be an alias goes out only as one of the few probes its
    undecided keys need; the page's other such links wait, and the page comes back after
    ``first`` seconds, doubled each round, to look at them again with what the probes
    taught. After ``rounds`` rounds, or while ``capacity`` pages are already waiting in
    this replica (each holds a place in the consumer's ``max_ack_pending``), nothing
    waits: every link goes out as it is, as without rules.
    """

    def __init__(
        self,
        *,
        first: float,
        rounds: int,
        capacity: int = 200,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.first = first
        self.rounds = rounds
        self.capacity = capacity
        self._clock = clock
        #: event id -> (hashes of the links it held, when it is due back at the latest,
        #: the delivery that held them): a page holds up to TROVE_MAX_LINKS_PER_PAGE
        #: links, so not the URLs themselves.
        self._held: dict[str, tuple[frozenset[int], float, int]] = {}

    def may_hold(self, deliveries: int) -> bool:
        if self.first <= 0 or deliveries > self.rounds:
            return False
        now = self._clock()
        for event_id in [e for e, (_, due, _) in self._held.items() if due < now]:
            del self._held[event_id]
        return len(self._held) < self.capacity

    def hold(self, event_id: str, links: list[str], deliveries: int) -> float:
        """Remember what ``event_id`` held; the delay to hand it back with."""
        delay = self.first * 2.0 ** (deliveries - 1)
        # Due back after the delay; kept a little longer for a busy consumer.
        due = self._clock() + 2 * delay + 30.0
        self._held[event_id] = (frozenset(map(hash, links)), due, deliveries)
        return delay

    def take(self, event_id: str, deliveries: int) -> frozenset[int] | None:
        """Hashes of the links ``event_id`` held here at its delivery before this one
        (``deliveries``); None if it held none here then. A hold from an earlier round
        says nothing of the latest: handled in between on another replica (scaled out, a
        pod replaced), the page's links were decided there, counted and published or
        held again, and only a round that reads them all takes up what that one held."""
        found = self._held.pop(event_id, None)
        return found[0] if found and found[2] == deliveries - 1 else None
