"""The fetcher: turns work (PageDiscovered, CrawlRequested) into CrawlCompleted, politely.

For each work message: robots.txt (shared cache) -> the domain's lease (shared KV),
which brings the host's learned policy -> the strategy it chooses (``strategies``) ->
the request -> extraction off the event loop -> the lease released with what the
attempt taught (``Politeness.finish`` folds it into the policy) -> publish
CrawlCompleted, wait for its PubAck -> ack the work. A pod killed anywhere before the
ack loses nothing: the work is redelivered and the lease still protects the domain.

Every request takes its host's lease first: the page, robots.txt, each same-host
redirect hop of the page and each robots.txt redirect hop (under the lease of the host
it points to). A request that cannot go within ``LOCAL_WAIT`` is not waited for in
the task: the work message is re-published as a NATS scheduled message for the slot
it was given (``trove_fetcher.deferral``; a paused redirect chain travels in its
headers, and the page keeps its identity, the original URL) and acked, so waiting
costs no consumer capacity. No message is scheduled past the work stream's horizon.

An attempt always ends in a recorded outcome, built within the stream's message size
(``trove_fetcher.completion``), and costs the site one request: an event whose publish
failed is remembered for a while, so its redelivery publishes it without fetching.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import NoReturn, TypeVar, overload
from urllib.parse import urlsplit

import httpx
from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from trove_fetcher.clock import Clock, WallClock
from trove_fetcher.completion import (
    Work,
    completed,
    event_budget,
    fit,
    moved_away,
    rejected,
    robots_refusal,
    unreadable,
    with_canonical_links,
)
from trove_fetcher.deferral import (
    Carried,
    Chain,
    ChainKind,
    horizon,
    message_bytes,
    schedule_at,
)
from trove_fetcher.errors import (
    GateDeferred,
    HopGateFailed,
    NetworkAway,
    NotActivityStreams,
    PodExhausted,
    RedirectPaused,
    ResolverAway,
    RobotsUnavailable,
)
from trove_fetcher.extract import PARSE_THREAD_BYTES, Extraction, ParseThreads
from trove_fetcher.http import FetchLimits, FetchResult, HopGate, fetch
from trove_fetcher.memory import Memory
from trove_fetcher.politeness import CrawlDelay, Deferred, Granted, Moved, Politeness
from trove_fetcher.robots import DEFAULT_TTL, RETRY_TTL, RobotsPolicy, fetch_robots
from trove_fetcher.strategies import STRATEGIES, Strategy, applicable
from trove_fetcher.timeline import TimelinePoller
from trove_schema.bus import (
    Bus,
    Retry,
    broker_trouble,
    jetstream_metadata,
    schedule_header,
)
from trove_schema.events import (
    PRIORITY_HEADER,
    SIBLINGS_HEADER,
    CrawlCompleted,
    CrawlOutcome,
    CrawlRequested,
    PageDiscovered,
    TimelinePolled,
    TimelinePollRequested,
    decode_event,
    derived_event_id,
    explored_attempt_id,
)
from trove_schema.exclusions import NO_EXCLUSIONS, Exclusions, ListedExclusions
from trove_schema.heuristics import is_challenge
from trove_schema.metrics import (
    FETCH_BYTES,
    FETCH_READ_LAG,
    FETCH_SECONDS,
    FETCHES,
    FETCHES_IN_FLIGHT,
    LEASES,
    RESERVATION_HORIZON,
    ROBOTS_CACHE,
    STRATEGY_CHOICES,
    STRATEGY_MISPREDICTIONS,
)
from trove_schema.policy import (
    Choice,
    HostPolicy,
    Observation,
    another_way,
    choose,
    send_validators,
)
from trove_schema.topology import FETCH_DEFERRED, WORK_SCHEDULES_PREFIX
from trove_schema.urls import canonicalize_or_none, domain_of, fetchable, origin_of

log = logging.getLogger("trove.fetcher")

#: An event whose times plan what comes after it (``Fetcher._on_shared_clock``).
Stamped = TypeVar("Stamped", CrawlCompleted, TimelinePolled)

#: Waits shorter than this are spent in the task rather than in a scheduled message
#: (the JetStream scheduler fires with a granularity of a few hundred milliseconds).
LOCAL_WAIT = 1.0
#: The least time a page's or a robots.txt's request is sent with (``_request_time``).
MIN_REQUEST_SECONDS = 1.0
#: What orders a message in a pod's hand; a deferred copy carries them on.
ORDERING_HEADERS = frozenset({PRIORITY_HEADER, SIBLINGS_HEADER})
#: How long a policy read from the shared bucket is trusted without reading it again.
ROBOTS_LOCAL_TTL = 60.0
#: Origins whose robots.txt a pod keeps parsed. An entry lives ROBOTS_LOCAL_TTL at most,
#: so this only needs the origins a pod touches in a minute: ~100 pages/s at the
#: default 10 s gap is ~1,000 hosts, each asked many times while its pages flow.
ROBOTS_MEMORY = 4096
#: Seconds past its slot after which a paused robots.txt chain is no longer taken up by
#: the origin's other pages (``Fetcher._take_up_robots``): they ask from the start.
ROBOTS_HOP_OVERDUE = 120.0
#: ... and at most this many bytes of robots.txt in all (a file may be 512 KiB).
ROBOTS_MEMORY_BYTES = 64 << 20
#: Events whose publish failed, kept for their redelivery (which then does not fetch
#: the page again). Redelivery comes within seconds to this pod or another; each entry
#: may be up to a message (1 MiB), so few are kept.
UNPUBLISHED_MEMORY = 64
UNPUBLISHED_MEMORY_BYTES = 32 << 20
#: Work this pod finished (its CrawlCompleted has its PubAck): an ack lost to a broker
#: restart brings the message back, and it is acked again instead of fetched again.
#: Redeliveries come within ``ack_wait`` (90 s); ~100 bytes an id.
DONE_MEMORY = 20_000
#: How long a finished attempt's publish is tried again in the task while the broker
#: is away (a restart, a cluster electing a leader), as a share of ``ack_wait``: handed
#: back instead, the work could go to another pod, which would fetch the page again.
PUBLISH_PATIENCE_SHARE = 0.5
#: The longest pause between two tries of a write the broker did not take, and while
#: the pod stops.
LATE_WRITE_MAX_PAUSE = 1.0
LATE_WRITE_STOPPING_PAUSE = 0.1
#: Error types that say the chosen strategy was the wrong one for the page.
MISPREDICTIONS = frozenset({"wrong_tool", "empty_content"})


@dataclass(frozen=True, slots=True)
class Job:
    work: Work
    #: The slot this message was given when it was deferred (a ``time.time()``).
    slot: float | None = None
    #: A redirect chain paused before its next hop.
    chain: Chain | None = None
    #: Where the message sits (stream and sequence): a redelivery re-defers it under
    #: the same schedule id, which JetStream's duplicate window drops.
    cause: str = ""
    #: A strategy this page's attempt found wrong: it is asked another way.
    avoid: str | None = None

    @property
    def reserved(self) -> bool:
        return self.slot is not None

    @property
    def url(self) -> str:
        return self.work.url

    @property
    def domain(self) -> str:
        """The page's politeness key, from its URL by today's rule: not the event's
        ``domain``, which a chain of months carries forward as its first event spelled
        it (before ``domain_of`` dropped a trailing dot, say), and which would lease the
        page's host under another record than its first request's."""
        return domain_of(self.work.url)


@dataclass(slots=True)
class _Hold:
    """The lease this task holds now (it moves from host to host along a chain)."""

    domain: str
    grant: Granted | None


class Fetcher:
    """One per pod: the shared HTTP client, KV handles and a thread pool for parsing."""

    def __init__(
        self,
        *,
        bus: Bus,
        client: httpx.AsyncClient,
        politeness: Politeness,
        robots_kv: KeyValue,
        limits: FetchLimits,
        robots_token: str,
        robots_max_bytes: int,
        robots_ttl: float = DEFAULT_TTL,
        work_max_age: float = 0.0,
        max_message_bytes: int = 1 << 20,
        ack_wait: float = 90.0,
        parse_workers: int = 2,
        parse_thread_bytes: int = PARSE_THREAD_BYTES,
        allowed_networks: Sequence[str] = (),
        nat64_prefixes: Sequence[str] = (),
        exclusions: Exclusions = NO_EXCLUSIONS,
        listed: ListedExclusions | None = None,
        clock: Clock | None = None,
        network_away: Callable[[str], NetworkAway | None] = lambda host: None,
        stopping: asyncio.Event | None = None,
        poll_lookback: float = 600.0,
    ) -> None:
        self.bus = bus
        #: Whether work for a host meets the pod's own network away: its nameservers
        #: answer nothing, or its egress is down (``GuardedNetworkBackend.network_away``).
        #: Such work waits, without a lease.
        self.network_away = network_away
        #: Set when the pod stops: a poll waiting for its host's gap in the task ends
        #: then with what it read (``_acquire``), rather than outlast the pod's grace.
        self.stopping = stopping or asyncio.Event()
        #: The time leases and slots are kept on, shared by every pod (``clock``).
        self.clock: Clock = clock or WallClock()
        self.exclusions = exclusions
        #: What keeps ``exclusions`` up to date with the shared list, when there is one.
        self.listed = listed
        self.client = client
        self.politeness = politeness
        self.robots_kv = robots_kv
        self.limits = limits
        self.robots_token = robots_token
        self.robots_max_bytes = robots_max_bytes
        self.robots_ttl = robots_ttl
        self.horizon = horizon(work_max_age)
        #: The most a message this pod publishes may take, headers included: a deferred
        #: work message (``_defer``) as much as an event.
        self.max_message_bytes = max_message_bytes
        self.budget = event_budget(max_message_bytes)
        self.parser = ParseThreads(parse_workers, renew_after=parse_thread_bytes)
        self._robots_local: Memory[str, tuple[float, RobotsPolicy]] = Memory(
            max_entries=ROBOTS_MEMORY, max_weight=ROBOTS_MEMORY_BYTES
        )
        self._unpublished: Memory[str, CrawlCompleted] = Memory(
            max_entries=UNPUBLISHED_MEMORY, max_weight=UNPUBLISHED_MEMORY_BYTES
        )
        self._done: Memory[str, bool] = Memory(max_entries=DONE_MEMORY)
        #: Origins whose robots.txt a chain paused at a redirect is reading: the slot
        #: of its next hop, and its hops so far (``_take_up_robots``).
        self._robots_paused: Memory[str, tuple[float, tuple[str, ...]]] = Memory(
            max_entries=ROBOTS_MEMORY
        )
        self._polled: Memory[str, TimelinePolled] = Memory(
            max_entries=UNPUBLISHED_MEMORY, max_weight=UNPUBLISHED_MEMORY_BYTES
        )
        self.poller = TimelinePoller(
            client=client,
            gate=self._poll_gate,
            limits=limits,
            robots_allows=self._poll_allowed,
            allowed_networks=allowed_networks,
            nat64_prefixes=nat64_prefixes,
            max_message_bytes=max_message_bytes,
            lookback=poll_lookback,
            now=self.clock.now,
            parser=self.parser,
            told=self._poll_told,
        )
        self.publish_patience = ack_wait * PUBLISH_PATIENCE_SHARE
        #: Whether this pod said its writes wait for the broker: once an outage, not
        #: once a fetch in flight and a try (700 lines a pod in a minute's outage).
        self._waiting_said = False
        #: What an attempt taught about its host that the broker, away longer than a
        #: publish's patience, did not take: written in the background when it answers,
        #: each with its host.
        self._late_writes: dict[asyncio.Task[None], str] = {}
        #: The furthest slot this pod has planned (on ``clock``), for the gauge.
        self.furthest_slot = 0.0
        RESERVATION_HORIZON.set_function(lambda: max(0.0, self.furthest_slot - self.clock.now()))

    async def handle(self, msg: Msg) -> None:
        event = decode_event(msg.data)
        if isinstance(event, TimelinePollRequested):
            try:
                # A poll waits for its host's gap between its requests: the consumer
                # marks it in progress meanwhile (``Consumer.hold_refresh``).
                await self.poll(event)
            except NetworkAway as exc:
                raise _waits_for_network(exc) from exc
            except HopGateFailed as exc:  # a robots.txt redirect's hop, as for a page
                _hand_back(exc)
            return
        if not isinstance(event, PageDiscovered | CrawlRequested):
            return  # not work for us; ack it
        carried = Carried.from_headers(msg.headers)
        job = Job(event, carried.slot, carried.chain, _cause(msg), carried.avoid)
        try:
            await self.process(job, msg.data)
        except NetworkAway as exc:
            raise _waits_for_network(exc) from exc
        except (httpx.HTTPError, OSError) as exc:  # defensive: fetch() classifies these itself
            if broker_trouble(exc):
                # nats-py's timeout is an OSError too: the consumer's pause for the
                # broker, which starts no new work meanwhile, not a fetch's retry.
                raise
            raise Retry(f"transient fetch error: {exc}") from exc
        except HopGateFailed as exc:
            _hand_back(exc)

    async def process(self, job: Job, payload: bytes) -> None:
        if _answered_key(job.work) in self._done:
            return  # answered already: only the ack was lost
        built = self._unpublished.get(job.work.id)
        if built is not None:  # fetched already; only its publish failed
            await self._publish(job, built)
            return
        unfetchable = fetchable(job.url)
        if unfetchable is not None:
            # Work accepted before a rule was added (an emoji host): the input's fault,
            # recorded as such; a `failed` attempt would be retried as if the site were away.
            reason = f"not a fetchable URL: {unfetchable}"
            await self._complete(job, rejected(job.work, reason, datetime.now(UTC)))
            return
        refusal = await self._refusal(job.domain)
        if refusal is not None:
            # Queued or scheduled before the operator excluded the host: recorded without
            # a request, robots.txt or a lease, so the page leaves the search (and its
            # chain goes on, to bring it back once the rule is lifted).
            refused = rejected(job.work, refusal, datetime.now(UTC), excluded=True)
            await self._complete(job, refused)
            return
        if job.slot is not None:
            early = job.slot - self.clock.now()
            if early > LOCAL_WAIT:
                # Back from the horizon before its slot: it keeps the slot. Taking the
                # lease now would let it jump the host's queue.
                await self._defer(job, payload, job.slot, job.chain)
                return
            if early > 0:
                await asyncio.sleep(early)
        if job.chain is None and origin_of(job.url) in self._robots_paused:
            job = await self._take_up_robots(job)
        if job.chain is not None and job.chain.kind is ChainKind.ROBOTS:
            policy = await self._cached_robots(job.url)
            if policy is None and await self._resume_robots(job, payload, job.chain) is None:
                return  # paused again
            # robots.txt is known now; the page queues for its own host.
            job = replace(job, slot=None, chain=None)
        page_chain = job.chain  # a page's own redirect chain, if paused
        robots = None
        if page_chain is not None:
            # A paused chain's next hop is judged as any hop of the page is: robots.txt
            # may have changed while it waited. Known no more (it expired while the hop
            # waited for its host), the page starts again from its own URL, robots.txt
            # first, as any page does: no hop goes out unjudged.
            robots = await self._hop_robots(page_chain.next_url, job.url)
            if robots is None:
                job, page_chain = replace(job, chain=None), None
        target = page_chain.next_url if page_chain is not None else job.url
        away = self.network_away(domain_of(target))
        if away is not None:
            raise away  # before the lease: the host's slot is not spent on nothing
        if page_chain is None:
            robots = await self._cached_robots(target)
        if robots is not None and not self._robots_allows(robots, target):
            await self._complete(
                job, robots_refusal(job.work, robots, url=target, token=self.robots_token)
            )
            return
        # A paused chain's next hop is a hop of the page already asked for: it goes on.
        hold = await self._lease(
            job,
            payload,
            domain_of(target),
            job.reserved,
            page_chain,
            follow_moves=page_chain is None,
        )
        if hold is None:
            return
        if robots is None and page_chain is None:
            # Another task or pod may have fetched it while we waited for the lease.
            try:
                robots = await self._cached_robots(job.url)
            except BaseException:
                await self._release(hold)  # the work goes back: not the host's lease too
                raise
            if robots is None:
                # A chain of the origin's robots.txt may have paused while this waited.
                hops = self._paused_hops(job.url)
                if hops and domain_of(hops[-1]) != hold.domain:
                    # Its hop is another host's: that host's lease is asked for instead.
                    await self._release(hold)
                    chain = Chain(ChainKind.ROBOTS, hops)
                    await self.process(replace(job, slot=None, chain=chain), payload)
                    return
                robots = await self._fetch_robots(job, payload, hold, hops)
                if robots is None:
                    return  # its redirect chain is paused
                # robots.txt used this lease; the page waits for the next one.
                if robots.allows(job.url, self.robots_token):
                    hold = await self._lease(
                        job, payload, job.domain, False, None, follow_moves=True
                    )
                    if hold is None:
                        return
            if not robots.allows(job.url, self.robots_token):
                await self._release(hold)
                await self._complete(
                    job, robots_refusal(job.work, robots, url=job.url, token=self.robots_token)
                )
                return
        await self._fetch_page(job, payload, hold)

    # leases -----------------------------------------------------------------------

    @overload
    async def _acquire(
        self,
        domain: str,
        reserved: bool,
        *,
        patience: float = ...,
        until: float | None = ...,
        queue: bool = ...,
    ) -> Granted | Deferred: ...

    @overload
    async def _acquire(
        self, domain: str, reserved: bool, *, follow_moves: bool
    ) -> Granted | Deferred | Moved: ...

    async def _acquire(
        self,
        domain: str,
        reserved: bool,
        *,
        follow_moves: bool = False,
        patience: float = LOCAL_WAIT,
        until: float | None = None,
        queue: bool = True,
    ) -> Granted | Deferred | Moved:
        """The domain's lease now or after a wait in the task of ``patience`` at most
        (each wait, and none past ``until`` on the fetcher's clock); else a far slot.
        With ``follow_moves``, ``Moved`` for a host learned to have moved.

        A lease that can start within ``LOCAL_WAIT`` is taken ahead, for its start, and
        the task sends when it comes: the request leaves at its slot rather than one
        round trip to the bucket after it (under load, tens of milliseconds or more). A
        task is not cancelled in that wait (a stopping consumer lets its tasks finish);
        a pod that dies in it holds the host as one that dies mid-request.
        """
        while True:
            now = self.clock.now()
            decision = await self.politeness.acquire(
                domain,
                now,
                reserved=reserved,
                ahead=LOCAL_WAIT,
                follow_moves=follow_moves,
                queue=queue,
            )
            if isinstance(decision, Moved):
                return decision
            if isinstance(decision, Granted):
                LEASES.labels("granted").inc()
                early = decision.start - self.clock.now()
                if early > 0:
                    LEASES.labels("waited").inc()
                    await asyncio.sleep(early)
                return decision
            # From the clock now, not from ``now``: under load the round trip behind the
            # decision takes a good part of a gap, and sleeping the whole wait after it
            # would send the request that much past its slot.
            now = self.clock.now()
            wait = decision.at - now
            if wait > patience or (until is not None and decision.at > until):
                return decision
            LEASES.labels("waited").inc()
            if wait <= LOCAL_WAIT:
                await asyncio.sleep(max(0.0, wait))
            elif await _set_within(self.stopping, wait):
                return decision  # a poll's longer wait: the pod is stopping
            reserved = True

    async def _lease(
        self,
        job: Job,
        payload: bytes,
        domain: str,
        reserved: bool,
        chain: Chain | None,
        *,
        follow_moves: bool = False,
    ) -> _Hold | None:
        """The lease for ``job``'s next request, or None when it is not to be sent now:
        deferred to a later slot, or (``follow_moves``) its host moved and the page is
        asked for at its new address instead."""
        decision = await self._acquire(domain, reserved, follow_moves=follow_moves)
        if isinstance(decision, Granted):
            return _Hold(domain, decision)
        if isinstance(decision, Moved):
            LEASES.labels("moved").inc()
            await self._complete(job, moved_away(job.work, decision.origin))
            return None
        await self._defer(job, payload, decision.at, chain)
        return None

    async def _release(
        self,
        hold: _Hold,
        end: float | None = None,
        observation: Observation | None = None,
        *,
        delays: tuple[CrawlDelay, ...] = (),
        rest_until: float = 0.0,
    ) -> None:
        """End the lease: the host is free one gap after ``end`` (on the shared clock,
        ``self.clock.at`` of the moment, placed when it was read; now if None), and not
        before ``rest_until``; ``observation`` is folded into the host's policy, and
        ``delays`` (its origins' Crawl-delays) set, in the same write."""
        if hold.grant is None:
            return
        grant, hold.grant = hold.grant, None
        finished = self.clock.at(time.time()) if end is None else end
        if observation is not None:
            observation = self._shared(observation)
        try:
            await self._patiently(
                lambda: self.politeness.finish(
                    hold.domain, grant, finished, observation, delays=delays, rest_until=rest_until
                )
            )
        except Exception as exc:
            # A Crawl-delay that was not written must not be forgotten: the work is
            # handed back and robots.txt read again, the hold keeping the host safe.
            if not broker_trouble(exc) or delays:
                raise
            # The request is done: losing its result would cost the site another. The
            # hold stays in the record until ``busy_until``, which keeps the host safe;
            # what the answer said (a 429's pause, a poll's spent rate limit) must
            # outlast it, so it is kept.
            self._say_waiting(
                "a lease not released (broker away), its hold keeps the host safe: %s",
                exc,
                domain=hold.domain,
            )
            if observation is not None or rest_until > 0:
                shared, asked = observation, rest_until
                self._write_later(
                    hold.domain,
                    lambda: self.politeness.finish(
                        hold.domain, grant, finished, shared, rest_until=asked
                    ),
                )

    def _write_later(self, domain: str, write: Callable[[], Awaitable[object]]) -> None:
        """Keep trying ``write`` (a fold into ``domain``'s policy) until the broker takes it.

        A 429's pause, a ban, lost to an outage longer than the patience of the request
        that met it, would let the host be asked again a gap after its hold expires.
        The fold is written once however often it is tried (``Politeness._folded``)."""

        async def keep_trying() -> None:
            pause = 0.1
            while True:
                try:
                    await write()
                    log.info(
                        "what a request taught about its host written late",
                        extra={"domain": domain},
                    )
                    return
                except Exception as exc:
                    if not broker_trouble(exc):
                        log.exception("a late write to a host's record failed")
                        return
                # Soon after the broker is back: the host's hold may have expired, and
                # another pod's lease would not see the pause until it is written. A
                # stopping pod keeps trying, more often, until ``settle_late_writes``
                # gives up on it.
                if self.stopping.is_set():
                    await asyncio.sleep(LATE_WRITE_STOPPING_PAUSE)
                    continue
                with contextlib.suppress(TimeoutError):  # a stop cuts the pause short
                    await asyncio.wait_for(self.stopping.wait(), pause)
                pause = min(pause * 2, LATE_WRITE_MAX_PAUSE)

        task = asyncio.ensure_future(keep_trying())
        self._late_writes[task] = domain
        task.add_done_callback(lambda done: self._late_writes.pop(done, None))

    def _shared(self, observation: Observation) -> Observation:
        """``observation`` with its instants (this pod's wall clock, from its event) on the
        pods' shared clock, which the host's record keeps: a pause for a Retry-After is
        then as long on every pod as the site asked, however far this pod's clock is."""
        return replace(
            observation,
            started=self.clock.at(observation.started),
            at=self.clock.at(observation.at),
        )

    async def _refusal(self, domain: str) -> str | None:
        """Why the operator's exclusions keep every request from ``domain``, if they do."""
        if self.listed is not None:
            return await self.listed.refusal(domain)
        return self.exclusions.refusal(domain)

    def _request_time(self, hold: _Hold) -> float:
        """``_time_left``, or ``Retry`` when it leaves a request too little to be fair to
        the host: for a while after nats-server's clock was set or its leader moved, the
        shared time is doubted by as much as the two times differ, and a request given
        no time would be recorded as the host's timeout."""
        left = self._time_left(hold)
        if left < min(MIN_REQUEST_SECONDS, self.limits.total_timeout):
            raise Retry(
                f"{left:.1f} s left under the host's hold: the shared time is in doubt "
                "(nats-server's clock set, or its leader moved); the request waits",
                delay=MIN_REQUEST_SECONDS * 10,
                expected=True,
            )
        return left

    def _time_left(self, hold: _Hold) -> float:
        """The longest the request under ``hold`` may take: the fetch's total timeout,
        within what is left of the lease's hold (on the latest the shared time can be).
        The request leaves a moment after its lease's start (the pod's turn on the host,
        round trips to the buckets): run for its whole timeout from there, it could
        outlast the hold, and a pod that took the host once the hold expired would send
        inside the gap. The hold allows for that moment (``HOLD_SLACK``), so the bound
        only shortens a request whose lease came unusually late."""
        total = self.limits.total_timeout
        if hold.grant is None:
            return total
        left = hold.grant.hold_until - self.clock.at(time.time())
        return max(0.0, min(total, left))

    def _gate(
        self, hold: _Hold, lease: Callable[[str], Awaitable[Granted | Deferred]] | None = None
    ) -> HopGate:
        """Before a redirect hop: end the lease of the previous request (the gap counts
        from the end of its response) and take the lease of the hop's host (``lease``,
        a page's by default); the hop may take what is left under it, as a first
        request may (``_request_time``)."""

        async def before_hop(hops: tuple[str, ...]) -> float:
            await self._release(hold)
            domain = domain_of(hops[-1])
            decision = await (lease(domain) if lease else self._acquire(domain, False))
            if isinstance(decision, Deferred):
                raise RedirectPaused(hops, decision.at)
            hold.domain, hold.grant = domain, decision
            return self._request_time(hold)

        return before_hop

    async def _defer(self, job: Job, payload: bytes, slot: float, chain: Chain | None) -> None:
        """Come back at ``slot`` (or at the horizon, keeping the slot), as a scheduled message."""
        LEASES.labels("deferred").inc()
        self.furthest_slot = max(self.furthest_slot, slot)
        at = schedule_at(slot, self.clock.now(), self.horizon)
        carried = Carried(slot, chain, job.avoid)
        hops = len(chain.hops) if chain is not None else 0
        # One schedule per handled message and chain position, whatever slot it got: a
        # redelivery of the message (its ack lost to a broker restart) takes a new slot,
        # and a second schedule would fork the work into two fetches of the page.
        schedule_id = derived_event_id(f"{job.work.id}:{job.cause}:{hops}", "slot")
        headers = {
            **carried.headers(),
            "Nats-Msg-Id": schedule_id,
            "Nats-Schedule": schedule_header(datetime.fromtimestamp(at, UTC)),
            "Nats-Schedule-Target": FETCH_DEFERRED,
        }
        # The hand it comes back to orders it as it ordered the event: by priority, then
        # by its host's queue (the event's own headers, ``Event.headers``).
        ordering = job.work.headers()
        headers.update({k: ordering[k] for k in ORDERING_HEADERS if k in ordering})
        size = message_bytes(payload, headers)
        if size > self.max_message_bytes:
            # nats-server counts the headers against its max_payload, and closes the
            # connection of a client that sends more: the pod would stop, and the work,
            # redelivered, stop the next. The attempt is recorded instead.
            what = "redirect chain" if chain is not None else "work message"
            reason = (
                f"{what} too long to defer ({size} bytes with its headers, more than "
                f"{self.max_message_bytes})"
            )
            await self._complete(job, rejected(job.work, reason, datetime.now(UTC)))
            return
        subject = f"{WORK_SCHEDULES_PREFIX}.{schedule_id}"
        # Patient: a paused chain has already cost the site its hops, and handing the
        # message back would request them again.
        await self._patiently(lambda: self.bus.js.publish(subject, payload, headers=headers))
        log.debug(
            "deferred",
            extra={"url": job.url, "domain": job.domain, "slot": f"{slot:.3f}", "hops": hops},
        )

    # the page -----------------------------------------------------------------------

    async def _fetch_page(self, job: Job, payload: bytes, hold: _Hold) -> None:
        work = job.work
        policy = hold.grant.policy if hold.grant is not None else HostPolicy()
        strategy, choice = self._choose(job.url, policy, job.avoid)
        etag = last_modified = validators_url = None
        # Validators only where the host honours them (or is asked again now and then):
        # elsewhere a 304 never comes and the page is read whole anyway.
        if isinstance(work, CrawlRequested) and send_validators(policy):
            etag, last_modified = work.etag, work.last_modified
            validators_url = work.validators_url
        started = datetime.now(UTC)
        end: float | None = None
        FETCHES_IN_FLIGHT.inc()
        try:
            try:
                result = await fetch(
                    self.client,
                    job.url,
                    etag=etag,
                    last_modified=last_modified,
                    validators_url=validators_url,
                    limits=replace(self.limits, total_timeout=self._request_time(hold)),
                    is_parseable=strategy.is_parseable,
                    accept=strategy.accept,
                    robots_allows=lambda hop: self._redirect_allowed(hop, job.url),
                    before_hop=self._gate(hold),
                    resume=job.chain.hops if job.chain is not None else (),
                    resumed_permanent=job.chain is not None and job.chain.permanent,
                    now=self.clock.now,
                )
            except RedirectPaused as paused:
                await self._release(hold)
                chain = Chain(ChainKind.PAGE, paused.hops, paused.permanent)
                await self._defer(job, payload, paused.at, chain)
                return
            finally:
                FETCHES_IN_FLIGHT.dec()
            # The host's gap runs from when its answer arrived, however late this pod read it,
            # placed on the shared clock now: a step of the pod's wall clock during the
            # extraction would otherwise move it by as much (NTP setting the clock right,
            # a VM resumed), and the next request would go out inside the gap.
            now = time.time()
            arrived = result.ended_at(now)
            end = self.clock.at(arrived)
            if result.received_at is not None:
                FETCH_READ_LAG.observe(now - arrived)
            FETCH_SECONDS.observe(result.elapsed)
            FETCH_BYTES.inc(result.bytes_read)
            event = self._with_sitemaps(
                job, await self._event(job, result, strategy, choice, started)
            )
            # The host's lease is released with what this attempt taught: its gap runs
            # from the end of the response, and a pause it decides holds every pod.
            observation = Observation.of(event)
            if observation.error_type in MISPREDICTIONS:
                STRATEGY_MISPREDICTIONS.labels(strategy.name).inc()
            if observation.error_type == "wrong_tool" and self._other_way(job, hold, event):
                await self._release(hold, end, observation)
                await self._ask_another_way(job, payload, event)
                return
            # The release and the event's publish go to the broker side by side: the
            # release first (the host's next slot waits on it), the publish one step of
            # the loop behind, before the client's flusher runs. Neither waits for the
            # other's answer; the ack waits for both.
            publishing = asyncio.ensure_future(self._complete(job, event))
            try:
                await self._release(hold, end, observation)
            finally:
                await publishing
        finally:
            await self._release(hold, end)

    def _with_sitemaps(self, job: Job, event: CrawlCompleted) -> CrawlCompleted:
        """An attempt at an origin's home page that read it (or found it unchanged)
        carries the ``Sitemap`` lines of the origin's robots.txt, the site's own list of
        its pages, for discovery to follow: once a visit of the home page, so a sitemap
        listed later is found at the next. The policy this pod judged the page by is
        read from its memory, never the bucket: a broker away costs the lines, not the
        attempt."""
        if event.outcome not in (CrawlOutcome.SUCCESS, CrawlOutcome.NOT_MODIFIED):
            return event
        parts = urlsplit(job.url)
        if parts.path not in ("", "/") or parts.query:
            return event
        origin = origin_of(job.url)
        known = self._robots_local.get(origin)
        if known is None:
            return event
        sitemaps = known[1].sitemap_urls(origin)
        return event.model_copy(update={"sitemaps": sitemaps}) if sitemaps else event

    def _choose(
        self, url: str, policy: HostPolicy, avoid: str | None = None
    ) -> tuple[Strategy, Choice]:
        """The strategy for ``url`` on this host, as its policy says, and why."""
        candidates = applicable(url)
        choice = choose(policy, url, candidates, self.politeness.learning)
        if choice.strategy == avoid and len(candidates) > 1:
            others = [name for name in candidates if name != avoid]
            choice = choose(policy, url, others, self.politeness.learning)
        strategy = STRATEGIES[choice.strategy]
        STRATEGY_CHOICES.labels(strategy.name, choice.reason).inc()
        return strategy, choice

    def _other_way(self, job: Job, hold: _Hold, event: CrawlCompleted) -> bool:
        """Whether the page may be asked again another way: once, only if one applies,
        and only while the host's record (as the lease found it) gives that way a fair
        chance (``policy.another_way``)."""
        if job.avoid is not None or hold.grant is None:
            return False
        policy, config = hold.grant.policy, self.politeness.learning
        return another_way(policy, job.url, event.fetcher, applicable(job.url), config)

    async def _ask_another_way(self, job: Job, payload: bytes, event: CrawlCompleted) -> None:
        """A strategy that got the wrong kind of answer (``wrong_tool``: an app shell to
        ``http``, an HTML page to ``activitypub``) costs the host a request, not the page.

        Its attempt is recorded (under an id of its own: the page's attempt is still to
        come), and the page is asked again at the host's next slot, once, another way:
        the strategy to avoid travels with a deferred message (``Trove-Avoid``). A
        learnt choice is wrong on a host whose pages differ, and an exploration is wrong
        often; neither leaves the page without its content this cycle.
        """
        explored = event.model_copy(update={"id": explored_attempt_id(event.id)})
        attempt = fit(self._on_shared_clock(explored), self.budget)
        await self._patiently(lambda: self.bus.publish(attempt))
        FETCHES.labels(attempt.outcome.value).inc()
        job = replace(job, slot=None, chain=None, avoid=event.fetcher)
        hold = await self._lease(job, payload, job.domain, False, None)
        if hold is not None:  # else deferred, carrying the strategy to avoid
            await self._fetch_page(job, payload, hold)

    async def _event(
        self,
        job: Job,
        result: FetchResult,
        strategy: Strategy,
        choice: Choice,
        started: datetime,
    ) -> CrawlCompleted:
        """The attempt's ``CrawlCompleted``, the body parsed off the event loop. It says
        conditional when its last request carried a validator: a redirect that leads
        elsewhere now, or a validator no header can carry, sends none."""
        name, reason, sent = strategy.name, choice.reason, result.conditional
        extraction: Extraction | None = None
        # A challenge sent with a 2xx is not the page, and its extraction is dropped
        # (``completed``): not parsed at all, the host's pause is written as the answer
        # arrives, not after the parse threads' queue, which may outlast the request's
        # hold, and another pod be given the host before the challenge is known.
        if result.body is not None and not is_challenge(
            result.status_code, result.response_headers
        ):
            try:
                loop = asyncio.get_running_loop()
                extraction = await loop.run_in_executor(
                    self.parser.pool(len(result.body)), self._extract, strategy, result
                )
            except Exception as exc:
                # Not a usable answer for this strategy (the audit's wrong_tool) is what
                # learning is for; anything else is a bug worth its traceback.
                if not isinstance(exc, NotActivityStreams):
                    log.exception("extraction failed", extra={"url": job.url})
                return unreadable(
                    job.work,
                    exc,
                    started,
                    result,
                    strategy=name,
                    strategy_reason=reason,
                    conditional=sent,
                )
        return completed(
            job.work,
            result,
            extraction,
            started,
            strategy=name,
            strategy_reason=reason,
            conditional=sent,
            robots_token=self.robots_token,
        )

    async def _redirect_allowed(self, url: str, page: str) -> bool:
        """A same-host redirect hop must be allowed by robots.txt too (``_hop_robots``,
        ``_robots_allows``). One whose robots.txt could not be read says neither yes nor
        no (``RobotsUnavailable``): the attempt fails and is tried again, as a page's
        would."""
        policy = await self._hop_robots(url, page)
        if policy is None:
            # The page's was known when it was asked for: it expired during the request.
            # Unjudged, the hop does not go out.
            raise RobotsUnavailable("robots.txt expired while the page was asked for")
        if policy.temporary:
            raise RobotsUnavailable(policy.error or "disallow all for now")
        return self._robots_allows(policy, url)

    async def _hop_robots(self, url: str, page: str) -> RobotsPolicy | None:
        """The robots.txt a hop of ``page`` to ``url`` is judged by. A hop from http to
        https goes to another origin, whose robots.txt may not be known yet: then the
        page's own origin's rules (the same host's) judge it, never none at all."""
        return await self._cached_robots(url) or await self._cached_robots(page)

    def _robots_allows(self, policy: RobotsPolicy, url: str) -> bool:
        """Whether ``policy`` allows ``url`` as sent and as canonical: httpx resolves
        ``../`` in a Location but not ``%2e%2e/``, which the server resolves, so
        ``/public/%2e%2e/private`` is served as ``/private``."""
        canonical = canonicalize_or_none(url)
        return policy.allows(url, self.robots_token) and (
            canonical is None or canonical == url or policy.allows(canonical, self.robots_token)
        )

    def _extract(self, strategy: Strategy, result: FetchResult) -> Extraction:
        """The body's signals, its links canonical: run in a parse thread."""
        assert result.body is not None
        extraction = strategy.extract(
            result.body,
            url=result.final_url or "",
            content_type=result.content_type,
            x_robots_tag=result.x_robots_tag,
            robots_token=self.robots_token,
        )
        return with_canonical_links(extraction)

    def _on_shared_clock(self, event: Stamped) -> Stamped:
        """``event`` with its times on nats-server's clock, not this pod's.

        The attempt's times plan what comes after it: its page's next visit, a retry, a
        timeline's next poll are due a while after ``completed_at``, and nats-server fires
        them by its own clock. Stamped by a pod whose clock ran an hour behind, every
        chain that pod ended would come due an hour early: at an hour's interval, at
        once, again and again. The event's times are read as this pod's wall clock, as
        they were taken, and moved by its offset from the server's now."""
        local = time.time()
        shift = timedelta(seconds=self.clock.at(local) - local)
        times = {"started_at": event.started_at + shift, "completed_at": event.completed_at + shift}
        return event.model_copy(update=times)

    async def _complete(self, job: Job, event: CrawlCompleted) -> None:
        event = fit(self._on_shared_clock(event), self.budget)
        # Until its PubAck: a redelivery publishes it again rather than fetching again.
        weight = sum(len(link.url) + 48 for link in event.links) + 4096
        self._unpublished.put(job.work.id, event, weight)
        await self._publish(job, event)

    async def _publish(self, job: Job, event: CrawlCompleted) -> None:
        """Publish a finished attempt, riding out a short broker outage in the task."""
        await self._patiently(lambda: self.bus.publish(event))
        self._unpublished.pop(job.work.id)
        self._done.put(_answered_key(job.work), True)
        FETCHES.labels(event.outcome.value).inc()
        said: dict[str, object] = {
            "url": job.url,
            "domain": job.domain,
            "outcome": event.outcome.value,
            "status": event.status_code,
            "event_id": event.id,
        }
        # Why it failed (a DNS error, a timeout, a TLS error), what the site asked: bounded
        # in the event already, and the answer to "why is this page not crawled".
        if event.error_message is not None:
            said["error"] = event.error_message
        if event.retry_after is not None:
            said["retry_after"] = event.retry_after
        log.info("crawled", extra=said)

    async def _patiently(self, publish: Callable[[], Awaitable[object]]) -> None:
        """Publish, trying again in the task while the broker is briefly away."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.publish_patience
        pause = 0.25
        while True:
            try:
                await publish()
            except Exception as exc:
                if not broker_trouble(exc) or loop.time() + pause > give_up:
                    raise
                self._say_waiting("a publish waits for the broker: %s", exc)
            else:
                if self._waiting_said:
                    self._waiting_said = False
                    log.info("publishes go through again")
                return
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)

    def _say_waiting(self, message: str, exc: Exception, **extra: str) -> None:
        """Say at WARNING the first write that waits for the broker, the others at DEBUG,
        until a publish goes through again."""
        level = logging.DEBUG if self._waiting_said else logging.WARNING
        self._waiting_said = True
        log.log(level, message, exc, extra=extra)

    # robots.txt -----------------------------------------------------------------

    async def _cached_robots(self, url: str) -> RobotsPolicy | None:
        origin = origin_of(url)
        # Its age on the pods' shared clock: a policy another pod fetched is as old here
        # as there, whatever this node's own clock says.
        now = self.clock.now()
        local = self._robots_local.get(origin)
        if local is not None and local[0] > now:
            ROBOTS_CACHE.labels("local").inc()
            return local[1]
        try:
            entry = await self.robots_kv.get(_robots_key(origin))
        except KeyNotFoundError:
            ROBOTS_CACHE.labels("miss").inc()
            return None
        if entry.value is None:
            return None
        try:
            policy = RobotsPolicy.from_bytes(entry.value)
        except ValueError:
            return None  # an unreadable cache entry is a miss: fetch robots.txt again
        if policy.expired(now):
            return None
        self._remember(origin, policy)
        ROBOTS_CACHE.labels("shared").inc()
        return policy

    def _remember(self, origin: str, policy: RobotsPolicy) -> None:
        # Never past the policy's own expiry: a pod obeys no robots.txt older than its TTL.
        now = self.clock.now()
        until = min(now + ROBOTS_LOCAL_TTL, policy.expires_at)
        self._robots_local.put(origin, (until, policy), len(policy.body) + 256)
        self._robots_paused.pop(origin)

    async def _take_up_robots(self, job: Job) -> Job:
        """``job``, carrying the robots.txt chain of its origin that this pod paused at a
        redirect, if its origin's robots.txt is not known yet: it takes the chain's next
        hop, under that hop's host's lease, then goes on as a page.

        An ``http://`` origin sending its robots.txt to ``https://`` (or ``www.`` to the
        bare name): the hop waits for its host's gap, behind the pages queued before it,
        and each page of the origin that came first asked for the file again from the
        start and paused at the same hop. The first to come takes the hop instead (in
        its own slot when the hop is on its own host), and the file is known for the
        others; the chain's own message, when its slot comes, finds it known. Not a
        chain long overdue (its hop may have failed, its file changed)."""
        hops = self._paused_hops(job.url)
        if not hops or await self._cached_robots(job.url) is not None:
            return job
        # A slot is its own host's: on another host the hop asks for one of its own.
        own_host = domain_of(hops[-1]) == job.domain
        return replace(
            job, slot=job.slot if own_host else None, chain=Chain(ChainKind.ROBOTS, hops)
        )

    def _paused_hops(self, url: str) -> tuple[str, ...]:
        """The hops so far of a robots.txt chain of ``url``'s origin that this pod paused
        at a redirect, unless long overdue (``_take_up_robots``); empty if none."""
        origin = origin_of(url)
        paused = self._robots_paused.get(origin)
        if paused is None:
            return ()
        at, hops = paused
        if self.clock.now() > at + ROBOTS_HOP_OVERDUE:
            self._robots_paused.pop(origin)
            return ()
        return hops

    async def _resume_robots(self, job: Job, payload: bytes, chain: Chain) -> RobotsPolicy | None:
        domain = domain_of(chain.next_url)
        hold = await self._lease(job, payload, domain, job.reserved, chain)
        if hold is None:
            return None
        try:
            # A page that took up the chain may have read the file while this waited.
            known = await self._cached_robots(job.url)
        except BaseException:
            await self._release(hold)
            raise
        if known is not None:
            await self._release(hold)
            return known
        return await self._fetch_robots(job, payload, hold, chain.hops)

    async def _fetch_robots(
        self, job: Job, payload: bytes, hold: _Hold, resume: tuple[str, ...]
    ) -> RobotsPolicy | None:
        """robots.txt of the job's origin, under ``hold``; None when its chain paused."""
        origin = origin_of(job.url)
        try:
            return await self._read_robots(origin, job.domain, hold, resume)
        except RedirectPaused as paused:
            await self._defer(job, payload, paused.at, Chain(ChainKind.ROBOTS, paused.hops))
            self._robots_paused.put(origin, (paused.at, paused.hops))
            return None

    async def _read_robots(
        self,
        origin: str,
        domain: str,
        hold: _Hold,
        resume: tuple[str, ...],
        lease: Callable[[str], Awaitable[Granted | Deferred]] | None = None,
    ) -> RobotsPolicy:
        """Fetch ``origin``'s robots.txt under ``hold`` (released here), its redirect
        hops under ``lease`` (``_gate``), set the host's Crawl-delay and share the policy
        with every pod. Raises ``RedirectPaused``."""
        started = time.time()
        gate = self._gate(hold, lease)
        last_hop = resume[-1] if resume else None

        async def before_hop(hops: tuple[str, ...]) -> float | None:
            nonlocal last_hop
            last_hop = hops[-1]
            return await gate(hops)

        try:
            policy = await fetch_robots(
                self.client,
                origin,
                max_bytes=self.robots_max_bytes,
                ttl=self.robots_ttl,
                # An unreachable robots.txt is asked for again soon, and never later
                # than a readable one would be.
                retry_ttl=min(RETRY_TTL, self.robots_ttl),
                total_timeout=self._request_time(hold),
                before_hop=before_hop,
                resume=resume,
                now=self.clock.now,
                excluded=self._refusal,
            )
        except RedirectPaused:
            raise
        except BaseException:
            await self._release(hold)
            raise
        end = time.time()
        # The host's gap as its Crawl-delay sets it, written with the release. A
        # robots.txt redirected to another host (www. to the bare domain) is the file
        # of both: the lease released is the last hop's, so the origin's is set too.
        # A file that could not be read (a 5xx, a timeout) says nothing of the
        # Crawl-delay: the host keeps the one it has, not the default.
        # But only the last hop's own robots.txt is its file: one redirected to a home
        # page, or to any other path, says nothing of that host's Crawl-delay (its own
        # file may ask for more).
        # The Crawl-delay is kept per origin (``http://`` and ``https://`` of a host
        # may serve two files) and the host's gap is the largest.
        released = hold.domain
        own_file = last_hop is None or _is_robots_txt(last_hop)
        asked: CrawlDelay | None = None
        answered: tuple[CrawlDelay, ...] = ()
        if not policy.temporary:
            gap = self.politeness.clamp_gap(policy.crawl_delay(self.robots_token) or 0.0)
            until = policy.expires_at
            asked = CrawlDelay(origin, gap, until)
            if own_file and last_hop is not None and origin_of(last_hop) != origin:
                answered = (CrawlDelay(origin_of(last_hop), gap, until),)
        # A 429, a 503, a timeout: the answering host (the last hop's) is left alone as
        # after a page's, not asked for robots.txt again when the fallback expires.
        observation = _robots_observation(policy, hold.domain, started, end)
        on_hold = answered + ((asked,) if asked is not None and released == domain else ())
        finished = self.clock.at(end)
        await self._release(hold, finished, observation, delays=on_hold)
        if released != domain and asked is not None:
            crawl_delay = asked
            await self._patiently(lambda: self.politeness.set_delay(domain, crawl_delay, finished))
        await self._patiently(lambda: self.robots_kv.put(_robots_key(origin), policy.to_bytes()))
        self._remember(origin, policy)
        return policy

    # followed timelines -----------------------------------------------------------

    async def poll(self, request: TimelinePollRequested) -> None:
        """Answer a poll of a followed timeline with its ``TimelinePolled``: every request
        under the instance host's lease, robots.txt obeyed, and what the last answer said
        about the host (a rate limit, a failure) folded into its policy."""
        if request.id in self._done:
            return  # answered already: only the ack was lost
        polled = self._polled.get(request.id)
        if polled is None:  # else read already; only its publish failed
            deadline = self.clock.now() + self.politeness.config.max_delay
            sent = _Sent()
            token, sent_token = _POLL_DEADLINE.set(deadline), _POLL_SENT.set(sent)
            try:
                read = await self.poller.poll(request)
            finally:
                _POLL_SENT.reset(sent_token)
                _POLL_DEADLINE.reset(token)
            polled = self._on_shared_clock(read)
            self._polled.put(request.id, polled, 512 * len(polled.posts) + 4096)
            # Timed on this pod's clock, as its observations are (``_shared``).
            observation = _poll_observation(read)
            if observation is not None:
                shared = self._shared(observation)
                if sent.start is not None:
                    # Its answer was in flight before the host's last escalation only if
                    # its own request was: the poll started long before it, maybe, and
                    # waited out gaps and pauses between its requests.
                    shared = replace(shared, started=sent.start)
                try:
                    await self._patiently(lambda: self.politeness.observe(request.domain, shared))
                except Exception as exc:
                    # Handed back, the poll's redelivery publishes what was read
                    # without folding it again: the fold waits for the broker here.
                    if broker_trouble(exc):
                        self._write_later(
                            request.domain,
                            lambda: self.politeness.observe(request.domain, shared),
                        )
                    raise
        await self._patiently(lambda: self.bus.publish(polled))
        self._polled.pop(request.id)
        self._done.put(request.id, True)
        log.info(
            "polled",
            extra={
                "instance": request.instance,
                "timeline": request.timeline,
                "outcome": polled.outcome.value,
                "posts": len(polled.posts),
                "event_id": polled.id,
            },
        )

    async def _poll_lease(self, domain: str) -> Granted | Deferred:
        """A poll's lease: the host's next free moment, waited for in the task when it
        is a gap away at most (the longest gap, ``TROVE_MAX_DOMAIN_DELAY_SECONDS``). A
        poll is a few requests to one host, and one in a chain that must read on: ending
        it at each gap, coming back for a place in the host's queue of pages, it would
        be behind the place it took itself each time (NodeInfo, then the API, never
        reached). Its place is none: it takes the moment the host is free, as work that
        comes back for its slot does, the gap kept as for any request. A longer wait (a
        pause the host asked for) ends the poll with ``GateDeferred``, as does a poll that
        waited that long in all (``_POLL_DEADLINE``: its slot in the consumer is not held
        for ever by a host whose free moments other work keeps taking)."""
        longest = self.politeness.config.max_delay
        deadline = _POLL_DEADLINE.get()
        return await self._acquire(domain, True, patience=longest, until=deadline, queue=False)

    @contextlib.asynccontextmanager
    async def _poll_gate(self, url: str) -> AsyncIterator[float]:
        """One request of a poll: the host's lease (``_poll_lease``), and the longest the
        request may take under it (``_time_left``); else ``GateDeferred``: the poll ends
        with what it read and comes back at the slot."""
        domain = domain_of(url)
        decision = await self._poll_lease(domain)
        if isinstance(decision, Deferred):
            raise GateDeferred(decision.at - self.clock.now())
        sent = _POLL_SENT.get()
        if sent is not None:
            sent.start = decision.start
        hold = _Hold(domain, decision)
        try:
            left = self._time_left(hold)
            if left < min(MIN_REQUEST_SECONDS, self.limits.total_timeout):
                # As ``_request_time``: a request sent with no time would be the host's
                # timeout; the poll ends with what it read and comes back.
                raise GateDeferred(MIN_REQUEST_SECONDS * 10)
            yield left
        finally:
            rest_until = 0.0
            if sent is not None:  # what this request's answer asked, for this host alone
                rest_until, sent.told_until = sent.told_until, 0.0
            await self._release(hold, rest_until=rest_until)

    def _poll_told(self, seconds: float) -> None:
        """An answer of the poll this task runs asked its host be left alone ``seconds``
        (a rate limit spent, a 429): kept in the host's record as the request's lease is
        let go (``_poll_gate``). The poll's end folds the same answer into the host's
        policy, but another poll of the instance may take the host before that."""
        sent = _POLL_SENT.get()
        if sent is not None:
            sent.told_until = max(sent.told_until, self.clock.at(time.time()) + seconds)

    async def _poll_allowed(self, url: str) -> bool:
        """robots.txt of an API URL: the shared one, else fetched under the host's lease,
        and its redirect hops under a poll's. A page's hop waits a second at most, and
        a paused page keeps its hops to come back to; a poll keeps none. Ended at each
        hop (an instance followed as http:// whose robots.txt sends it to https://, the
        same host a gap later), it came back to the first request each time, and never
        read the timeline."""
        policy = await self._cached_robots(url)
        if policy is None:
            domain = domain_of(url)
            decision = await self._poll_lease(domain)
            if isinstance(decision, Deferred):
                raise GateDeferred(decision.at - self.clock.now())
            try:
                policy = await self._read_robots(
                    origin_of(url), domain, _Hold(domain, decision), (), self._poll_lease
                )
            except RedirectPaused as paused:
                raise GateDeferred(paused.at - self.clock.now()) from paused
        return policy.allows(url, self.robots_token)

    async def settle_late_writes(self, grace: float) -> None:
        """Give the writes still waiting for the broker ``grace`` seconds to land (tried
        every 0.1 s, the pod stopping); say which hosts' are lost."""
        if not self._late_writes:
            return
        _, pending = await asyncio.wait(set(self._late_writes), timeout=grace)
        if pending:
            log.warning(
                "what requests taught about their hosts is lost: pod stopping, broker away",
                extra={
                    "writes": len(pending),
                    "hosts": sorted({self._late_writes[task] for task in pending}),
                },
            )
            for task in pending:
                task.cancel()

    def close(self) -> None:
        for task in self._late_writes:
            task.cancel()
        self.parser.shutdown()


def _poll_observation(polled: TimelinePolled) -> Observation | None:
    """What a poll's last answer says about the instance's host, when it says anything:
    a bot challenge, a rate limit (a 429, a 503, or the limit nearly spent: a pause until
    its reset), a refusal (a 403), or a failure (refused, timed out, 5xx), whether the
    poll failed there or had read posts before it (``stopped_by``: else a timeline whose
    first page always has new posts would cost its host a failing request each poll, at
    once after the last, with nothing counted). Nothing about fetch strategies, nor a
    poll cut short by the host's own lease (its ``retry_after`` is ours, not the
    instance's), nor a healthy one: the API answering says nothing of how the host takes
    its pages, which may be refused while it answers (a healthy poll forgiving them
    would have a host that refuses pages asked again at every poll's interval). Its
    ``started`` is the poll's; ``Fetcher.poll`` sets its last request's."""
    ended = polled.stopped_by or polled.outcome
    status: int | None
    if polled.challenged:
        # The host's defence, as to a page: left alone for a ban's pause.
        status, error = polled.status_code, "blocked_captcha"
    elif polled.status_code in (429, 503):
        status, error = (
            (503, "server_error") if polled.status_code == 503 else (429, "rate_limited")
        )
    elif ended is CrawlOutcome.TIMEOUT:
        status, error = polled.status_code, "timeout"
    elif ended is CrawlOutcome.FAILED:
        status, error = polled.status_code, "network_error"
    elif ended is CrawlOutcome.BLOCKED_5XX:
        # Its pause is at least the reset its headers named, if they said the limit was
        # spent (``retry_after``).
        status, error = polled.status_code, "server_error"
    elif polled.status_code == 403:
        # The instance refusing Trove: its host left alone as after a page's 403 (pauses
        # doubling), not asked again at the poll's own interval.
        status, error = 403, "blocked_403"
    elif polled.rate_limited:
        # Answered, its limit nearly spent (the answer read on, refused for its posts,
        # or a 404): left alone until the reset it named; nothing was refused, so no
        # run of refusals grows, and nothing is forgiven either.
        status, error = polled.status_code, "rate_spent"
    else:
        return None
    return Observation(
        started=polled.started_at.timestamp(),
        at=polled.completed_at.timestamp(),
        url=polled.instance,
        strategy="mastodon_api",
        success=False,
        is_banned=polled.challenged or status == 403,
        error_type=error,
        status=status,
        retry_after=polled.retry_after,
        duration_ms=None,
    )


#: When the poll this task runs must stop waiting for its host in the task (on the
#: fetcher's clock); None outside a poll.
_POLL_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "poll_deadline", default=None
)


@dataclass(slots=True)
class _Sent:
    """When the latest request of a poll left: its lease's start, on the fetcher's clock;
    and until when an answer of the poll asked the host be left alone (0: none asked)."""

    start: float | None = None
    told_until: float = 0.0


#: The poll this task runs: its latest request, whose answer is the one the poll's
#: observation tells of (``_poll_gate`` sets it); None outside a poll.
_POLL_SENT: contextvars.ContextVar[_Sent | None] = contextvars.ContextVar("poll_sent", default=None)


async def _set_within(event: asyncio.Event, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``event``; whether it was set."""
    try:
        await asyncio.wait_for(event.wait(), timeout=max(0.0, seconds))
    except TimeoutError:
        return False
    return True


def _is_robots_txt(url: str) -> bool:
    """Whether ``url`` is its origin's robots.txt."""
    parts = urlsplit(url)
    return parts.path == "/robots.txt" and not parts.query


def _robots_observation(
    policy: RobotsPolicy, domain: str, started: float, end: float
) -> Observation | None:
    """What a robots.txt answer says about ``domain``'s host, when it says it is unwell
    or asks to slow down; None for the file, a 4xx, or our own refusal."""
    if policy.failure is None:
        return None
    return Observation(
        started=started,
        at=end,
        # The answering host's (a redirect's last hop may be another origin's file).
        url=f"http://{domain}/robots.txt",
        strategy="http",
        success=False,
        is_banned=policy.failure == "blocked_captcha",
        error_type=policy.failure,
        # No answer came (a timeout, a refusal): the status of a redirect before it is
        # not this host's answer, and would read as one (forgetting a move).
        status=None if policy.failure in ("timeout", "network_error") else policy.status_code,
        retry_after=policy.retry_after,
        duration_ms=None,
    )


def _robots_key(origin: str) -> str:
    return hashlib.sha1(origin.encode(), usedforsecurity=False).hexdigest()


def _answered_key(work: PageDiscovered | CrawlRequested) -> str:
    """What a pod remembers answered work by (``Fetcher._done``): its id and, for a
    request for later, when it was due. A request delivered again (its ack lost), or its
    deferred copy, is the same message: answered, it is not fetched again. But a page's
    next visit planned again from a late copy of the attempt before it (that attempt's
    work fetched once more after the fetchers were away longer than the page's interval)
    has the id of the visit that followed it, due later: skipped as answered, the page
    would have no request left, and its chain would end there."""
    not_before = work.not_before if isinstance(work, CrawlRequested) else None
    return work.id if not_before is None else f"{work.id}@{not_before.isoformat()}"


def _cause(msg: Msg) -> str:
    meta = jetstream_metadata(msg)
    return "" if meta is None else f"{meta.stream}:{meta.sequence.stream}"


def _hand_back(exc: HopGateFailed) -> NoReturn:
    """Raise what a redirect hop's gate failed with, for the consumer to judge as it
    judges the handler's own errors: the broker's trouble is handed back (not counted);
    anything else is a failure it counts, backs off and parks. Handed back every time, a
    gate that keeps failing would request the hops before it again and again. The pod's
    network away (robots.txt of a hop's host unreachable) is neither."""
    cause = exc.__cause__
    if isinstance(cause, NetworkAway):
        raise _waits_for_network(cause) from cause
    if isinstance(cause, Exception):
        raise cause from None
    raise exc


def _waits_for_network(exc: NetworkAway) -> Retry:
    """The work goes back to the stream, not counted: nothing is blamed on the host (the
    resolver or the egress watch logs the outage once, and ``trove_nameservers_away`` or
    ``trove_egress_away`` shows it). It comes back when the watch that saw the outage
    looks again. The pod's own shortage has no watch: each hand-back says so."""
    if isinstance(exc, PodExhausted):
        return Retry(f"the pod is short: {exc}", delay=exc.retry_after)
    what = "the nameservers are away" if isinstance(exc, ResolverAway) else "egress is away"
    return Retry(f"{what}: {exc}", delay=exc.retry_after, expected=True)
