"""A hostile page costs the site one request per attempt and ends in a recorded outcome.

The ``Fetcher`` runs in the test's process against real NATS and a real HTTP server;
the faults (an extractor that breaks, a broker that refuses one publish or answers
late) are injected around it, never into it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any, TypeVar

import httpx
import pytest
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import KeyNotFoundError

from tests.conftest import eventually
from tests.discovery.follow_support import polled
from tests.fetcher._completions import Completions
from tests.fetcher._servers import LocalServer, Route, serving
from trove_fetcher import fetcher as fetcher_module
from trove_fetcher.clock import Clock
from trove_fetcher.deferral import Carried
from trove_fetcher.errors import EgressAway, RobotsUnavailable
from trove_fetcher.extract import Extraction
from trove_fetcher.fetcher import LOCAL_WAIT, Fetcher, Job
from trove_fetcher.http import FetchLimits
from trove_fetcher.politeness import (
    KV,
    Deferred,
    DomainSlot,
    Granted,
    Moved,
    Politeness,
    PolitenessConfig,
)
from trove_fetcher.robots import DEFAULT_TTL, RobotsPolicy, RobotsRule
from trove_fetcher.strategies import STRATEGIES
from trove_fetcher.transport import build_client
from trove_schema.bus import Bus, Retry, broker_trouble
from trove_schema.events import (
    CrawlOutcome,
    CrawlRequested,
    Event,
    PageDiscovered,
    Provenance,
    RequestReason,
    Scope,
    TimelinePollRequested,
    utcnow,
)
from trove_schema.policy import HostPolicy, LearningConfig, observe
from trove_schema.settings import FetcherSettings
from trove_schema.topology import (
    DOMAINS_BUCKET,
    ROBOTS_BUCKET,
    WORK_SCHEDULES_PREFIX,
    WORK_STREAM,
)
from trove_schema.urls import canonicalize, domain_of

pytestmark = pytest.mark.usefixtures("clean")

T = TypeVar("T")

IP = "127.0.0.182"
HOST = "hostile.outcomes.test"


class FlakyBus(Bus):
    """The real bus, except that the broker times out on the first ``failures`` publishes."""

    failures = 1

    async def publish(self, event: Event, *, subject: str | None = None) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise NatsTimeoutError
        await super().publish(event, subject=subject)


class LateKV:
    """The real lease bucket, each answer ``delay`` late (a broker under load)."""

    def __init__(self, kv: KV, delay: float) -> None:
        self.kv, self.delay = kv, delay

    async def _late(self, answer: Awaitable[T]) -> T:
        await asyncio.sleep(self.delay)  # the late answer is the condition under test
        return await answer

    async def get(self, key: str) -> object:
        return await self._late(self.kv.get(key))

    async def create(self, key: str, value: bytes) -> int:
        return await self._late(self.kv.create(key, value))

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        return await self._late(self.kv.update(key, value, last=last))


@pytest.fixture
def server() -> Iterator[LocalServer]:
    routes: dict[str, Route] = {
        f"{HOST}/limited": lambda ex: ex.send(429, b"slow down", {"Retry-After": "60"}),
        f"{HOST}/robots.txt": lambda ex: ex.send(200, b"User-agent: *\nAllow: /\n"),
        f"{HOST}/page": lambda ex: ex.send(200, b"<title>a page</title><p>text</p>"),
        f"{HOST}/moved": lambda ex: ex.redirect("/hop"),
        f"{HOST}/hop": lambda ex: ex.send(200, b"<title>moved here</title>"),
    }
    with serving(routes, IP) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    settings = FetcherSettings(allowed_networks=(f"{IP}/32",), resolve=(f"{HOST}={IP}",))
    async with build_client(settings) as built:
        yield built


async def fetcher_on(
    bus: Bus,
    client: httpx.AsyncClient,
    *,
    ack_wait: float = 90.0,
    gap: float = 0.05,
    politeness: Politeness | None = None,
    clock: Clock | None = None,
    robots_token: str = "TroveBot",  # noqa: S107 - a robots.txt token, not a secret
) -> Fetcher:
    return Fetcher(
        bus=bus,
        clock=clock,
        client=client,
        politeness=politeness
        or Politeness(await bus.js.key_value(DOMAINS_BUCKET), PolitenessConfig(min_delay=gap)),
        robots_kv=await bus.js.key_value(ROBOTS_BUCKET),
        limits=FetchLimits(total_timeout=5.0),
        robots_token=robots_token,
        robots_max_bytes=64 * 1024,
        ack_wait=ack_wait,
    )


def work(server: LocalServer, path: str = "/page") -> PageDiscovered:
    url = canonicalize(server.url(path, HOST))
    return PageDiscovered(
        url=url,
        domain=domain_of(url),
        scope=Scope(value=HOST),
        provenance=Provenance(kind="seed"),
    )


async def test_a_page_that_breaks_extraction_is_a_rejected_attempt_fetched_once(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def breaks(*args: object, **kwargs: object) -> Extraction:
        raise RecursionError("maximum recursion depth exceeded")  # a deeply nested page

    broken = {name: replace(s, extractor=breaks) for name, s in STRATEGIES.items()}
    monkeypatch.setattr(fetcher_module, "STRATEGIES", broken)
    fetcher = await fetcher_on(bus, client)
    page = work(server)
    try:
        await fetcher.process(Job(page), page.to_wire())
    finally:
        fetcher.close()
    events = await Completions(bus.js).wait_for(1, timeout=10)
    event = events[page.url]
    assert event.outcome.value == "rejected"
    assert event.error_message is not None
    assert "extraction failed: RecursionError" in event.error_message
    assert len(server.requests_to("/page", HOST)) == 1


async def test_an_event_whose_publish_failed_is_published_again_without_fetching_again(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    flaky = FlakyBus(bus.nc, bus.js)
    # An ack wait too short to wait for the broker in the task: the message goes back.
    fetcher = await fetcher_on(flaky, client, ack_wait=0.1)
    page = work(server)
    try:
        with pytest.raises(NatsTimeoutError):
            await fetcher.process(Job(page), page.to_wire())
        await fetcher.process(Job(page), page.to_wire())  # the redelivery
    finally:
        fetcher.close()
    events = await Completions(bus.js).wait_for(1, timeout=10)
    assert events[page.url].outcome.value == "success"
    assert len(server.requests_to("/page", HOST)) == 1


async def test_a_publish_refused_while_the_broker_is_away_is_tried_again_in_the_task(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    flaky = FlakyBus(bus.nc, bus.js)
    flaky.failures = 3
    fetcher = await fetcher_on(flaky, client)
    page = work(server)
    try:
        await fetcher.process(Job(page), page.to_wire())
    finally:
        fetcher.close()
    assert flaky.failures == 0
    events = await Completions(bus.js).wait_for(1, timeout=10)
    assert events[page.url].outcome.value == "success"
    assert len(server.requests_to("/page", HOST)) == 1


async def test_finished_work_delivered_again_is_not_fetched_again(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """An ack lost to a broker restart brings the message back after the attempt."""
    fetcher = await fetcher_on(bus, client)
    page = work(server)
    try:
        await fetcher.process(Job(page), page.to_wire())
        await fetcher.process(Job(page), page.to_wire())  # the redelivery
    finally:
        fetcher.close()
    events = await Completions(bus.js).wait_for(1, timeout=10)
    assert events[page.url].outcome.value == "success"
    assert len(server.requests_to("/page", HOST)) == 1


async def test_a_visit_planned_again_under_the_id_of_one_fetched_is_fetched(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """A late copy of a page's attempt (its work fetched again after the fetchers were
    away longer than the page's interval) plans the page's next visit again, under the
    id of the visit that already followed it and due later: a request of its own, which
    skipped as answered would leave the page without any."""
    fetcher = await fetcher_on(bus, client)
    page = work(server)
    due = utcnow()
    visit = CrawlRequested(
        url=page.url,
        domain=page.domain,
        scope=page.scope,
        reason=RequestReason.RECRAWL,
        not_before=due,
        caused_by="attempt-0",
    )
    again = visit.model_copy(update={"not_before": due + timedelta(hours=1)})
    try:
        await fetcher.process(Job(visit), visit.to_wire())
        await fetcher.process(Job(visit), visit.to_wire())  # delivered again: answered
        await fetcher.process(Job(again), again.to_wire())  # planned again: a new request
    finally:
        fetcher.close()
    assert len(server.requests_to("/page", HOST)) == 2


async def test_deferred_work_delivered_twice_is_scheduled_once(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """A redelivery takes a new slot; a second schedule would fetch the page twice."""
    fetcher = await fetcher_on(bus, client, gap=30.0)
    page = work(server)
    job = Job(page, cause="TROVE_EVENTS:7")
    try:
        await fetcher.process(job, page.to_wire())  # robots.txt takes the lease: deferred
        await fetcher.process(job, page.to_wire())  # the same message, delivered again
    finally:
        fetcher.close()
    info = await bus.js.stream_info(WORK_STREAM, subjects_filter=f"{WORK_SCHEDULES_PREFIX}.>")
    assert sum((info.state.subjects or {}).values()) == 1
    assert len(server.requests_to("/page", HOST)) == 0


async def test_deferred_work_keeps_its_place_among_the_work_in_hand(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """The copy that comes back at its slot is ordered as the event was: by its
    priority, then by its host's queue (``Trove-Priority``, ``Trove-Siblings``)."""
    fetcher = await fetcher_on(bus, client, gap=30.0)
    page = work(server).model_copy(update={"priority": 7, "siblings": 12})
    try:
        await fetcher.process(Job(page, cause="TROVE_EVENTS:8"), page.to_wire())
    finally:
        fetcher.close()
    info = await bus.js.stream_info(WORK_STREAM, subjects_filter=f"{WORK_SCHEDULES_PREFIX}.>")
    (subject,) = info.state.subjects or {}
    deferred = await bus.js.get_last_msg(WORK_STREAM, subject)
    headers = deferred.headers or {}
    assert headers["Trove-Priority"] == "7"
    assert headers["Trove-Siblings"] == "12"
    assert float(headers["Trove-Slot"]) > 0


class BrokenGate(Politeness):
    """The real leases, except that once ``armed``, the lease a redirect hop asks for (the
    first after a release) fails with ``error``."""

    error: Exception = ValueError("a bug in the lease")
    armed = False
    released = False

    async def acquire(
        self,
        domain: str,
        now: float,
        *,
        reserved: bool = False,
        ahead: float = 0.0,
        follow_moves: bool = False,
        queue: bool = True,
    ) -> Granted | Deferred | Moved:
        if self.armed and self.released:
            raise self.error
        return await super().acquire(
            domain, now, reserved=reserved, ahead=ahead, follow_moves=follow_moves, queue=queue
        )

    async def finish(self, *args: Any, **kwargs: Any) -> HostPolicy:
        self.released = True
        return await super().finish(*args, **kwargs)


@pytest.mark.parametrize(
    ("error", "handed_back"),
    [(NatsTimeoutError(), True), (ValueError("a bug in the lease"), False)],
    ids=["broker-away", "bug"],
)
async def test_a_redirect_hop_whose_lease_fails_is_handed_back_only_for_the_brokers_trouble(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer, error: Exception, handed_back: bool
) -> None:
    """A hand-back (``Retry``) is not counted: a lease that fails for any other reason,
    handed back, would send the message round for ever, requesting the hops before it
    each time. It is a failure the consumer counts, backs off and parks."""
    gate = BrokenGate(await bus.js.key_value(DOMAINS_BUCKET), PolitenessConfig(min_delay=0.05))
    gate.error = error
    fetcher = await fetcher_on(bus, client, politeness=gate)
    warm_up = work(server)  # robots.txt known: the next leases are the page's and its hop's
    moved = work(server, "/moved")
    try:
        await fetcher.process(Job(warm_up, cause="TROVE_EVENTS:1"), warm_up.to_wire())
        gate.armed, gate.released = True, False
        with pytest.raises(type(error)) as raised:
            await fetcher.handle(Msg(_client=bus.nc, subject="work", data=moved.to_wire()))
    finally:
        fetcher.close()
    # What the consumer does with it (``bus.Consumer._handle``): broker trouble is
    # handed back, anything else is counted.
    assert broker_trouble(raised.value) is handed_back
    assert not isinstance(raised.value, Retry)
    assert len(server.requests_to("/moved", HOST)) == 1
    assert server.requests_to("/hop", HOST) == []


async def test_the_brokers_timeout_on_a_pages_own_lease_reaches_the_consumer_as_its_trouble(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """nats-py's timeout is an OSError too: it was handed back as "a transient fetch
    error" (a warning a fetch in flight, the site blamed), and the consumer's one pause
    for the broker's trouble, which stops new work from starting, never began."""
    gate = BrokenGate(await bus.js.key_value(DOMAINS_BUCKET), PolitenessConfig(min_delay=0.05))
    gate.error = NatsTimeoutError()
    fetcher = await fetcher_on(bus, client, politeness=gate)
    page = work(server)
    try:
        gate.armed, gate.released = True, True
        with pytest.raises(NatsTimeoutError) as raised:
            await fetcher.handle(Msg(_client=bus.nc, subject="work", data=page.to_wire()))
    finally:
        fetcher.close()
    assert broker_trouble(raised.value)
    assert server.requests_to("/", HOST) == []


async def test_a_redirect_hop_that_meets_the_pods_network_away_is_handed_back_uncounted(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """What is asked before a hop (its lease, its robots.txt, read again when it expired
    while the hop waited for the gap) may meet the pod's egress or nameservers away.
    That is nobody's failure: handed back, not counted, so a long outage parks nothing.
    (Raised here by the hop's lease; the fetcher judges the cause, not the call.)"""
    gate = BrokenGate(await bus.js.key_value(DOMAINS_BUCKET), PolitenessConfig(min_delay=0.05))
    gate.error = EgressAway("8 addresses failed to connect in a row", retry_after=3.0)
    fetcher = await fetcher_on(bus, client, politeness=gate)
    warm_up = work(server)
    moved = work(server, "/moved")
    try:
        await fetcher.process(Job(warm_up, cause="TROVE_EVENTS:1"), warm_up.to_wire())
        gate.armed, gate.released = True, False
        with pytest.raises(Retry) as raised:
            await fetcher.handle(Msg(_client=bus.nc, subject="work", data=moved.to_wire()))
    finally:
        fetcher.close()
    assert raised.value.expected
    assert str(raised.value).startswith("egress is away")
    assert raised.value.delay == 3.0  # back when the egress watch looks again
    assert server.requests_to("/hop", HOST) == []


class RobotsReadFails:
    """The real robots.txt bucket, whose reads time out from the ``fails_from``-th on."""

    def __init__(self, kv: Any, fails_from: int) -> None:
        self.kv, self.fails_from, self.reads = kv, fails_from, 0

    async def get(self, key: str) -> Any:
        self.reads += 1
        if self.reads >= self.fails_from:
            raise NatsTimeoutError
        return await self.kv.get(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kv, name)


async def test_a_robots_txt_read_that_fails_under_the_lease_leaves_the_host_free(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """robots.txt is read again from the bucket once the lease is taken (another pod may
    have fetched it meanwhile). When that read fails, the work goes back, and the lease
    with it: held until its hold ran out, the host's every page would wait for nothing."""
    fetcher = await fetcher_on(bus, client, gap=0.05)
    # The first read (before the lease) is a real miss; the second, under the lease, fails.
    fetcher.robots_kv = RobotsReadFails(fetcher.robots_kv, fails_from=2)  # type: ignore[assignment]
    page = work(server)
    try:
        with pytest.raises(NatsTimeoutError):
            await fetcher.process(Job(page), page.to_wire())
        slot = await fetcher.politeness.state(HOST)
    finally:
        fetcher.close()
    assert fetcher.robots_kv.reads == 2  # type: ignore[attr-defined]
    assert slot.busy_until == 0.0  # no hold left on the host
    assert server.requests_to("/robots.txt", HOST) == []
    assert server.requests_to("/page", HOST) == []


async def test_a_hosts_next_request_goes_at_its_slot_not_a_round_trip_after_it(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """Under load a round trip to the lease bucket takes a good part of a short gap."""
    gap, round_trip = 1.0, 0.4
    late = LateKV(await bus.js.key_value(DOMAINS_BUCKET), round_trip)
    polite = Politeness(late, PolitenessConfig(min_delay=gap, request_timeout=5.0))
    fetcher = await fetcher_on(bus, client, politeness=polite)
    one, two = work(server), work(server, "/hop")
    try:
        # robots.txt, then /page a gap later; /hop is handed over when /page is done.
        await fetcher.process(Job(one), one.to_wire())
        await fetcher.process(Job(two), two.to_wire())
    finally:
        fetcher.close()
    await Completions(bus.js).wait_for(2, timeout=10)
    times = sorted(seen.at for seen in server.requests_for(HOST))
    assert len(times) == 3  # robots.txt, /page, /hop
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    # Never closer than the gap (it counts from the end of each answer), and not a
    # round trip to the bucket past it: each lease was taken ahead, for its start.
    assert all(gap <= waited < gap + round_trip / 2 for waited in gaps), gaps


class ServerAhead:
    """nats-server's time an hour ahead of this pod's clock, as a skewed node sees it."""

    def now(self) -> float:
        return time.time() + 3600.0

    def at(self, local: float) -> float:
        return local + 3600.0


async def test_a_pause_a_site_asks_for_is_as_long_on_the_shared_clock_as_it_asked(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """The lease record keeps nats-server's time; the attempt's instants are the pod's.
    A 429's Retry-After: 60 must hold the host 60 s on the record's clock."""
    clock = ServerAhead()
    polite = Politeness(await bus.js.key_value(DOMAINS_BUCKET), PolitenessConfig(min_delay=0.05))
    fetcher = await fetcher_on(bus, client, politeness=polite, clock=clock)
    limited = work(server, "/limited")
    try:
        await fetcher.process(Job(limited), limited.to_wire())
    finally:
        fetcher.close()
    slot = await polite.state(domain_of(limited.url))
    assert slot.backoff_until - clock.now() > 55.0, slot.backoff_until - clock.now()


async def test_a_challenge_sent_with_a_2xx_pauses_its_host_without_waiting_for_a_parse(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AWS WAF's 202 challenge, its body read: its extraction would be dropped, and it
    is not parsed, so the host's pause is written as the answer arrives. Behind a queue
    of parses longer than the request's hold, another pod was given the host before
    the challenge was known. The parse is held here until the test ends."""
    parsing, held = threading.Event(), threading.Event()

    def slow(*args: object, **kwargs: object) -> Extraction:
        parsing.set()
        held.wait(30)
        raise RuntimeError("the parse was held")

    slowed = {name: replace(s, extractor=slow) for name, s in STRATEGIES.items()}
    monkeypatch.setattr(fetcher_module, "STRATEGIES", slowed)
    server.routes[f"{HOST}/walled"] = lambda ex: ex.send(
        202, b"<html><title>Human?</title></html>", {"x-amzn-waf-action": "challenge"}
    )
    fetcher = await fetcher_on(bus, client)
    walled = work(server, "/walled")
    try:
        await asyncio.wait_for(fetcher.process(Job(walled), walled.to_wire()), timeout=10)
        slot = await fetcher.politeness.state(HOST)
    finally:
        held.set()
        fetcher.close()
    assert not parsing.is_set()
    assert slot.policy.pause_reason == "blocked_captcha"
    assert slot.backoff_until - fetcher.clock.now() > 3600
    (event,) = (await Completions(bus.js).wait_for(1, timeout=10)).values()
    assert (event.outcome, event.status_code) == (CrawlOutcome.BLOCKED_4XX, 202)


async def test_a_page_is_leased_by_its_urls_host_whatever_its_event_calls_it(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """An event whose ``domain`` a chain carried from an older rule (not what
    ``domain_of`` makes of its URL now): robots.txt and then the page, both under the
    record of the URL's host, a gap apart; the event's spelling has no record, and
    the attempt's event carries the host's name by today's rule."""
    gap = 0.5
    page = work(server).model_copy(update={"domain": "stale.spelling.test"})
    fetcher = await fetcher_on(bus, client, gap=gap)
    try:
        await fetcher.process(Job(page), page.to_wire())
    finally:
        fetcher.close()
    assert [seen.path for seen in server.requests_for(HOST)] == ["/robots.txt", "/page"]
    shortest = server.min_gap(HOST)
    assert shortest is not None
    assert shortest >= gap
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    with pytest.raises(KeyNotFoundError):
        await kv.get(fetcher.politeness.key("stale.spelling.test"))
    await kv.get(fetcher.politeness.key(HOST))
    # The attempt's event names the host by today's rule: the chain goes on under it.
    (event,) = (await Completions(bus.js).wait_for(1, timeout=10)).values()
    assert event.domain == HOST


class PauseWritesAway:
    """The real lease bucket; while ``away`` is set, a write that pauses a host times out
    (the broker gone just as the answer that decides a pause arrived)."""

    def __init__(self, kv: KV) -> None:
        self.kv = kv
        self.away = asyncio.Event()
        self.refused = 0

    async def get(self, key: str) -> object:
        return await self.kv.get(key)

    async def create(self, key: str, value: bytes) -> int:
        return await self.kv.create(key, value)

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        if self.away.is_set() and json.loads(value)["backoff_until"] > 0:
            self.refused += 1
            raise NatsTimeoutError
        return await self.kv.update(key, value, last=last)

    async def back(self, polite: Politeness, host: str, *, timeout: float) -> DomainSlot:
        """The broker back, having refused a write that pauses ``host`` and left its
        record unpaused: the record once a late write has paused it."""
        assert self.refused >= 1
        assert (await polite.state(host)).backoff_until == 0.0
        self.away.clear()
        return await eventually(
            lambda: polite.state(host),
            until=lambda slot: slot.backoff_until > 0,
            timeout=timeout,
            what="the pause written",
        )


async def test_a_pause_the_broker_did_not_take_is_written_when_it_answers_again(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """A 429's release is given up after the request's patience (the page's result is
    published, the work done); the pause it asked for is not: the host would be asked
    again a gap after its hold expired."""
    kv = PauseWritesAway(await bus.js.key_value(DOMAINS_BUCKET))
    polite = Politeness(kv, PolitenessConfig(min_delay=0.05))
    fetcher = await fetcher_on(bus, client, politeness=polite, ack_wait=1.0)
    page, limited = work(server), work(server, "/limited")
    try:
        await fetcher.process(Job(page), page.to_wire())  # robots.txt read, and a page
        kv.away.set()
        await fetcher.process(Job(limited), limited.to_wire())
        slot = await kv.back(polite, HOST, timeout=30)
    finally:
        fetcher.close()
    assert slot.backoff_until - fetcher.clock.now() > 50.0
    assert slot.policy.attempts == 2  # the 429 folded once


async def _a_pause_left_late(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> tuple[Fetcher, Politeness, PauseWritesAway]:
    """A fetcher whose release of a 429 the broker (away) did not take."""
    kv = PauseWritesAway(await bus.js.key_value(DOMAINS_BUCKET))
    polite = Politeness(kv, PolitenessConfig(min_delay=0.05))
    fetcher = await fetcher_on(bus, client, politeness=polite, ack_wait=1.0)
    page, limited = work(server), work(server, "/limited")
    await fetcher.process(Job(page), page.to_wire())
    kv.away.set()
    await fetcher.process(Job(limited), limited.to_wire())
    return fetcher, polite, kv


async def test_a_stopping_pod_writes_a_late_pause_if_the_broker_is_back_within_its_grace(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    fetcher, polite, kv = await _a_pause_left_late(bus, client, server)
    try:
        fetcher.stopping.set()
        # The broker back 0.3 s into the stop (the duration under test).
        asyncio.get_running_loop().call_later(0.3, kv.away.clear)
        await fetcher.settle_late_writes(5.0)
        slot = await polite.state(HOST)
    finally:
        fetcher.close()
    assert slot.backoff_until - fetcher.clock.now() > 50.0


async def test_a_stopping_pod_keeps_trying_its_late_writes_for_its_grace_and_says_what_is_lost(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer, caplog: pytest.LogCaptureFixture
) -> None:
    fetcher, polite, kv = await _a_pause_left_late(bus, client, server)
    try:
        tried = kv.refused
        fetcher.stopping.set()
        with caplog.at_level(logging.WARNING, logger="trove.fetcher"):
            await fetcher.settle_late_writes(0.5)
    finally:
        fetcher.close()
    assert kv.refused - tried >= 3  # every 0.1 s
    (lost,) = [r for r in caplog.records if "is lost" in r.getMessage()]
    assert getattr(lost, "writes", None) == 1
    assert (await polite.state(HOST)).backoff_until == 0.0


#: A poll of a followed timeline, as discovery asks for it.
POLL = TimelinePollRequested(
    instance="https://social.example",
    domain="social.example",
    timeline="local",
    follow_id="follow-1",
)


def test_a_poll_cut_short_by_the_hosts_own_lease_teaches_the_host_nothing() -> None:
    """Its ``retry_after`` is how long until our lease is free: no rate limit to learn."""
    asked = POLL
    ours = polled(asked, status_code=200, more=True, retry_after=40.0)
    assert fetcher_module._poll_observation(ours) is None
    spent = polled(asked, status_code=200, more=True, retry_after=40.0, rate_limited=True)
    theirs = fetcher_module._poll_observation(spent)
    assert theirs is not None
    assert (theirs.error_type, theirs.retry_after) == ("rate_spent", 40.0)


@pytest.mark.usefixtures("clean")
async def test_a_poll_waiting_for_its_hosts_gap_gives_up_when_the_pod_stops_or_waited_enough(
    bus: Bus, client: httpx.AsyncClient
) -> None:
    fetcher = await fetcher_on(bus, client, gap=30.0)
    try:
        held = await fetcher.politeness.acquire("social.example", fetcher.clock.now())
        assert isinstance(held, Granted)
        await fetcher.politeness.finish("social.example", held, fetcher.clock.now())
        # The host is free in 30 s, within a poll's patience: the poll waits in its task
        # ... until the pod stops, and then ends at once with what it read.
        waiting = asyncio.create_task(fetcher._poll_lease("social.example"))
        fetcher.stopping.set()
        assert isinstance(await asyncio.wait_for(waiting, timeout=5), Deferred)
        # A poll that has waited its whole allowance is not held longer.
        fetcher.stopping.clear()
        token = fetcher_module._POLL_DEADLINE.set(fetcher.clock.now() + 2.0)
        try:
            later = await asyncio.wait_for(fetcher._poll_lease("social.example"), timeout=5)
        finally:
            fetcher_module._POLL_DEADLINE.reset(token)
        assert isinstance(later, Deferred)
    finally:
        fetcher.close()


def test_a_robots_txt_that_timed_out_after_a_redirect_is_no_answer_of_its_host() -> None:
    # The 301 was the first hop's; the host it led to answered nothing.
    policy = RobotsPolicy(
        origin="http://www.example.org",
        rule=RobotsRule.DISALLOW_ALL,
        fetched_at=1000.0,
        status_code=301,
        failure="timeout",
    )
    observation = fetcher_module._robots_observation(policy, "example.org", 990.0, 1000.0)
    assert observation is not None
    assert (observation.status, observation.error_type) == (None, "timeout")
    busy = replace(policy, status_code=429, failure="rate_limited", retry_after=60.0)
    answered = fetcher_module._robots_observation(busy, "example.org", 990.0, 1000.0)
    assert answered is not None
    assert (answered.status, answered.retry_after) == (429, 60.0)


def test_a_poll_the_instance_refused_leaves_its_host_alone_as_a_pages_403_would() -> None:
    asked = POLL
    refused = polled(asked, outcome=CrawlOutcome.BLOCKED_4XX, status_code=403)
    observation = fetcher_module._poll_observation(refused)
    assert observation is not None
    policy = observe(HostPolicy(), observation, LearningConfig())
    assert (policy.pause_reason, policy.risk_level) == ("forbidden", 1)
    assert policy.paused_until > observation.at
    # A 404 (no such timeline) says nothing of the host.
    missing = polled(asked, outcome=CrawlOutcome.BLOCKED_4XX, status_code=404)
    assert fetcher_module._poll_observation(missing) is None


def test_an_error_answer_that_spent_the_rate_limit_is_judged_by_its_status_and_its_reset() -> None:
    # Not a refusal: no run of refusals grows. The host waits for the reset the answer's
    # headers named, and a 5xx counts as the server failing.
    config = LearningConfig()
    broken = polled(
        POLL, outcome=CrawlOutcome.BLOCKED_5XX, status_code=502, retry_after=55.0, rate_limited=True
    )
    failing = fetcher_module._poll_observation(broken)
    assert failing is not None
    assert (failing.status, failing.error_type) == (502, "server_error")
    policy = observe(HostPolicy(), failing, config)
    assert (policy.rate_level, policy.risk_level) == (0, 1)
    assert policy.paused_until >= failing.at + 55.0
    missing = polled(
        POLL, outcome=CrawlOutcome.BLOCKED_4XX, status_code=404, retry_after=55.0, rate_limited=True
    )
    spent = fetcher_module._poll_observation(missing)
    assert spent is not None
    assert (spent.status, spent.error_type) == (404, "rate_spent")
    policy = observe(HostPolicy(), spent, config)
    assert (policy.rate_level, policy.risk_level) == (0, 0)
    assert policy.paused_until == pytest.approx(spent.at + 55.0)


async def test_a_hop_to_https_of_the_same_host_obeys_the_pages_robots_until_its_own_are_known(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """http://host/x -> https://host/x is followed in the request (the same site), and
    https://host is an origin whose robots.txt nothing has read yet."""
    server.routes[f"{HOST}/robots.txt"] = lambda ex: ex.send(
        200, b"User-agent: *\nDisallow: /private\n", content_type="text/plain"
    )
    fetcher = await fetcher_on(bus, client)
    page = work(server)
    try:
        await fetcher.process(Job(page), page.to_wire())  # reads the page's robots.txt
        assert not await fetcher._redirect_allowed(f"https://{HOST}/private/1", page.url)
        assert await fetcher._redirect_allowed(f"https://{HOST}/public/1", page.url)
    finally:
        fetcher.close()


async def test_a_hop_whose_robots_txt_could_not_be_read_is_neither_allowed_nor_refused(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """https://host answered its robots.txt with a 503 a moment ago: a hop there from
    http://host is no refusal of the site's (the page would never be asked again this
    cycle) but a failure, tried again later."""
    unread = RobotsPolicy(
        origin=f"https://{HOST}",
        rule=RobotsRule.DISALLOW_ALL,
        fetched_at=time.time(),
        status_code=503,
        error="HTTP 503",
        failure="server_error",
    )
    robots = await bus.js.key_value(ROBOTS_BUCKET)
    await robots.put(fetcher_module._robots_key(unread.origin), unread.to_bytes())
    fetcher = await fetcher_on(bus, client)
    try:
        with pytest.raises(RobotsUnavailable, match="HTTP 503"):
            await fetcher._redirect_allowed(f"https://{HOST}/page", work(server).url)
    finally:
        fetcher.close()


async def test_a_page_robots_txt_disallows_as_linked_is_never_requested_in_its_sorted_spelling(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """The site links ``/search?q=cats&page=2`` and disallows ``/search?q=``; the page
    is known by its canonical spelling, ``/search?page=2&q=cats``."""
    server.routes[f"{HOST}/robots.txt"] = lambda ex: ex.send(
        200, b"User-agent: *\nDisallow: /search?q=\n", content_type="text/plain"
    )
    server.routes[f"{HOST}/search?page=2&q=cats"] = lambda ex: ex.send(200, b"<title>hits</title>")
    fetcher = await fetcher_on(bus, client)
    page = work(server, "/search?q=cats&page=2")
    assert page.url.endswith("/search?page=2&q=cats")
    try:
        await fetcher.process(Job(page), page.to_wire())
    finally:
        fetcher.close()
    events = await Completions(bus.js).wait_for(1, timeout=10)
    assert events[page.url].outcome is CrawlOutcome.BLOCKED_ROBOTS
    assert [seen.path for seen in server.requests_for(HOST)] == ["/robots.txt"]


async def test_a_same_host_redirect_through_an_encoded_dot_segment_obeys_robots_txt(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """httpx resolves ``../`` in a Location but sends ``%2e%2e/`` as it is, and the
    server serves ``/public/%2e%2e/private/x`` as ``/private/x``."""
    server.routes[f"{HOST}/robots.txt"] = lambda ex: ex.send(
        200, b"User-agent: *\nDisallow: /private\n", content_type="text/plain"
    )
    server.routes[f"{HOST}/up"] = lambda ex: ex.redirect("/public/%2e%2e/private/x")
    server.routes[f"{HOST}/public/%2e%2e/private/x"] = lambda ex: ex.send(200, b"<p>private</p>")
    fetcher = await fetcher_on(bus, client)
    page = work(server, "/up")
    try:
        await fetcher.process(Job(page), page.to_wire())
    finally:
        fetcher.close()
    events = await Completions(bus.js).wait_for(1, timeout=10)
    assert events[page.url].outcome is CrawlOutcome.BLOCKED_ROBOTS
    assert [seen.path for seen in server.requests_for(HOST)] == ["/robots.txt", "/up"]


class MovedClock:
    """The pods' shared time, moved on by hand: a host's gap, or a robots.txt's TTL,
    passes at once."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def now(self) -> float:
        return time.time() + self.ahead

    def at(self, local: float) -> float:
        return local + self.ahead


async def paused_chains(bus: Bus) -> list[Msg]:
    """The scheduled work messages that carry a paused redirect chain, as they come back."""
    return [m for m in await scheduled_work(bus) if Carried.from_headers(m.headers).chain]


def robots_that_change(server: LocalServer) -> dict[str, bytes]:
    """The host's robots.txt served from ``rules["body"]`` (all allowed at first), which
    the test changes while a chain waits."""
    rules = {"body": b"User-agent: *\nAllow: /\n"}
    server.routes[f"{HOST}/robots.txt"] = lambda ex: ex.send(
        200, rules["body"], content_type="text/plain"
    )
    return rules


async def test_a_paused_redirect_hop_obeys_robots_txt_read_while_it_waited_as_canonical_too(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """/up redirects to /public/%2e%2e/private/x and the chain waits for the host's gap
    in a scheduled message. Meanwhile robots.txt expires and is read again, now
    disallowing /private: the hop, which the server serves as /private/x, is judged when
    the chain resumes as when it was followed, as sent and as canonical."""
    rules = robots_that_change(server)
    server.routes[f"{HOST}/up"] = lambda ex: ex.redirect("/public/%2e%2e/private/x")
    server.routes[f"{HOST}/public/%2e%2e/private/x"] = lambda ex: ex.send(200, b"<p>private</p>")
    clock = MovedClock()
    gap = 5 * LOCAL_WAIT  # each wait for the host goes to a scheduled message
    fetcher = await fetcher_on(bus, client, gap=gap, clock=clock)
    first, up, later = work(server), work(server, "/up"), work(server, "/hop")
    try:
        await fetcher.process(Job(first), first.to_wire())  # robots.txt; the page waits
        clock.ahead += 3 * gap
        await fetcher.process(Job(up), up.to_wire())  # /up; its hop waits
        (paused,) = await paused_chains(bus)
        rules["body"] = b"User-agent: *\nDisallow: /private\n"
        clock.ahead += DEFAULT_TTL
        await fetcher.process(Job(later), later.to_wire())  # robots.txt read again
        clock.ahead += 3 * gap
        await fetcher.handle(paused)
    finally:
        fetcher.close()
    events = await Completions(bus.js).wait_for(1, timeout=10)
    assert events[up.url].outcome is CrawlOutcome.BLOCKED_ROBOTS
    paths = [seen.path for seen in server.requests_for(HOST)]
    assert paths == ["/robots.txt", "/up", "/robots.txt"]


async def test_a_paused_redirect_hop_whose_robots_txt_expired_meanwhile_waits_for_it_again(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """The chain waits for the host's gap while robots.txt expires and nothing reads it
    again: no hop goes out unjudged. The page starts again, robots.txt first, then its
    own URL, and the hop is judged by the robots.txt read then."""
    rules = robots_that_change(server)
    server.routes[f"{HOST}/up"] = lambda ex: ex.redirect("/private/x")
    server.routes[f"{HOST}/private/x"] = lambda ex: ex.send(200, b"<p>private</p>")
    clock = MovedClock()
    gap = 5 * LOCAL_WAIT  # each wait for the host goes to a scheduled message
    fetcher = await fetcher_on(bus, client, gap=gap, clock=clock)
    first, up = work(server), work(server, "/up")
    try:
        await fetcher.process(Job(first), first.to_wire())  # robots.txt; the page waits
        clock.ahead += 3 * gap
        await fetcher.process(Job(up), up.to_wire())  # /up; its hop waits
        (paused,) = await paused_chains(bus)
        rules["body"] = b"User-agent: *\nDisallow: /private\n"
        clock.ahead += DEFAULT_TTL + 3 * gap
        await fetcher.handle(paused)  # robots.txt read again; the page waits once more
        paths = [seen.path for seen in server.requests_for(HOST)]
        assert paths == ["/robots.txt", "/up", "/robots.txt"]
        # The page's own work, deferred to the host's next slot (no chain any more).
        (again,) = [
            m
            for m in await scheduled_work(bus)
            if Carried.from_headers(m.headers).chain is None and m.data == up.to_wire()
        ]
        clock.ahead += 3 * gap
        await fetcher.handle(again)
    finally:
        fetcher.close()
    events = await Completions(bus.js).wait_for(1, timeout=10)
    assert events[up.url].outcome is CrawlOutcome.BLOCKED_ROBOTS
    paths = [seen.path for seen in server.requests_for(HOST)]
    assert paths == ["/robots.txt", "/up", "/robots.txt", "/up"]


async def scheduled_work(bus: Bus) -> list[Msg]:
    """Every scheduled work message, as it comes back when it fires."""
    info = await bus.js.stream_info(WORK_STREAM, subjects_filter=f"{WORK_SCHEDULES_PREFIX}.>")
    found = []
    for subject in info.state.subjects or {}:
        stored = await bus.js.get_last_msg(WORK_STREAM, subject)
        found.append(
            Msg(_client=bus.nc, subject=subject, data=stored.data or b"", headers=stored.headers)
        )
    return found


async def test_a_redirect_hop_whose_robots_txt_expired_during_the_request_does_not_go_out(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """robots.txt judged the page when it was asked for and expired before its answer, a
    redirect, came: the hop is not sent unjudged; the attempt fails, to be tried again."""
    clock = MovedClock()

    def up(ex: Any) -> None:
        clock.ahead += DEFAULT_TTL  # the day passes while the page answers
        ex.redirect("/next")

    server.routes[f"{HOST}/up"] = up
    server.routes[f"{HOST}/next"] = lambda ex: ex.send(200, b"<p>next</p>")
    fetcher = await fetcher_on(bus, client, clock=clock)
    first, page = work(server), work(server, "/up")
    try:
        await fetcher.process(Job(first), first.to_wire())  # robots.txt, then the page
        await fetcher.process(Job(page), page.to_wire())
    finally:
        fetcher.close()
    events = await Completions(bus.js).wait_for(2, timeout=10)
    assert events[page.url].outcome is CrawlOutcome.FAILED
    assert "robots.txt expired" in (events[page.url].error_message or "")
    assert server.requests_to("/next", HOST) == []


async def test_writes_waiting_for_the_broker_are_said_once_until_one_goes_through(
    bus: Bus, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Each fetch in flight said each try: 700 warnings a pod in a minute's outage."""
    fetcher = await fetcher_on(bus, client)
    answers: dict[str, list[Exception | None]] = {
        page: [NatsTimeoutError(), NatsTimeoutError(), None] for page in ("a", "b", "c")
    }

    def publishing(page: str) -> Any:
        async def publish() -> None:  # the broker's answers to this page's publish
            answer = answers[page].pop(0)
            if answer is not None:
                raise answer

        return publish

    try:
        with caplog.at_level(logging.DEBUG, logger="trove.fetcher"):
            await asyncio.gather(*(fetcher._patiently(publishing(page)) for page in answers))
    finally:
        fetcher.close()
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "trove.fetcher"]
    waits = [level for level, message in said if message.startswith("a publish waits")]
    assert waits.count(logging.WARNING) == 1
    assert waits.count(logging.DEBUG) == 5
    assert [m for _, m in said].count("publishes go through again") == 1


async def test_the_crawled_line_says_what_the_site_asked_and_why_it_failed(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer, caplog: pytest.LogCaptureFixture
) -> None:
    # A timeout, a TLS error, a 429's wait: the line said the outcome alone.
    fetcher = await fetcher_on(bus, client)
    page = work(server, "/limited")
    try:
        with caplog.at_level(logging.INFO, logger="trove.fetcher"):
            await fetcher.process(Job(page, cause="TROVE_EVENTS:1"), page.to_wire())
    finally:
        fetcher.close()
    (crawled,) = [r for r in caplog.records if r.getMessage() == "crawled"]
    assert (getattr(crawled, "status", None), getattr(crawled, "retry_after", None)) == (429, 60.0)
    assert getattr(crawled, "error", None) == "HTTP 429"
