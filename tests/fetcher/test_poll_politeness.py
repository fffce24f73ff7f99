"""A timeline poll's answers teach the instance's host as a page's would, and no request
outlasts the lease it was sent under.

The ``Fetcher`` runs in the test's process against real NATS and a real HTTP server that
plays a Mastodon instance's client API (and a page or two of the same host); the host's
record in the real lease bucket, and what the server saw, are the evidence.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import httpx
import pytest
from nats.js import JetStreamContext

from tests.conftest import eventually
from tests.fetcher._completions import Completions
from tests.fetcher._servers import Exchange, LocalServer, Route, serving
from tests.fetcher.test_fetcher_outcomes import PauseWritesAway
from trove_fetcher.fetcher import LOCAL_WAIT, Fetcher, Job
from trove_fetcher.http import FetchLimits
from trove_fetcher.politeness import KV, DomainSlot, Politeness, PolitenessConfig
from trove_fetcher.transport import build_client
from trove_schema.bus import Bus
from trove_schema.events import (
    CrawlOutcome,
    PageDiscovered,
    Provenance,
    Scope,
    TimelinePolled,
    TimelinePollRequested,
    decode_event,
)
from trove_schema.policy import HostPolicy, LearningConfig, Observation
from trove_schema.settings import FetcherSettings
from trove_schema.topology import DOMAINS_BUCKET, EVENTS_STREAM, ROBOTS_BUCKET
from trove_schema.urls import canonicalize, domain_of

pytestmark = pytest.mark.usefixtures("clean")

T = TypeVar("T")

IP = "127.0.0.184"
HOST = "polls.outcomes.test"
#: The local timeline's pages from a cursor, as the poller asks for them (40 a page).
TIMELINE = "/api/v1/timelines/public?local=true&limit=40&min_id="


def statuses(first: int, count: int) -> bytes:
    """A timeline page: ``count`` public posts from id ``first`` on, newest first."""
    return json.dumps(
        [
            {
                "id": str(i),
                "uri": f"https://{HOST}/users/ada/statuses/{i}",
                "url": f"https://{HOST}/@ada/{i}",
                "visibility": "public",
                "reblog": None,
                "account": {"acct": "ada"},
                "content": f'<p><a href="https://blog.example/{i}">a post</a></p>',
            }
            for i in reversed(range(first, first + count))
        ]
    ).encode()


def api(body: bytes, status: int = 200) -> Route:
    return lambda ex: ex.send(status, body, content_type="application/json")


def spent(reset_in: float) -> Route:
    """A timeline page whose answer says the instance's rate limit is spent until a
    reset ``reset_in`` seconds away."""

    def answer(ex: Exchange) -> None:
        reset = datetime.now(UTC) + timedelta(seconds=reset_in)
        ex.send(
            200,
            statuses(101, 5),
            {
                "X-RateLimit-Limit": "300",
                "X-RateLimit-Remaining": "0",
                "X-RateLimit-Reset": reset.isoformat(timespec="milliseconds"),
            },
            content_type="application/json",
        )

    return answer


@pytest.fixture
def server() -> Iterator[LocalServer]:
    routes: dict[str, Route] = {
        f"{HOST}/robots.txt": lambda ex: ex.send(200, b"User-agent: *\nAllow: /\n"),
        f"{HOST}/page": lambda ex: ex.send(200, b"<title>a page</title><p>text</p>"),
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
    politeness: Politeness,
    *,
    total_timeout: float = 5.0,
    ack_wait: float = 90.0,
) -> Fetcher:
    return Fetcher(
        bus=bus,
        client=client,
        politeness=politeness,
        robots_kv=await bus.js.key_value(ROBOTS_BUCKET),
        limits=FetchLimits(total_timeout=total_timeout),
        robots_token="TroveBot",
        robots_max_bytes=64 * 1024,
        ack_wait=ack_wait,
    )


def poll_of(
    server: LocalServer, cursor: str, *, api: bool = True, poll: int = 1
) -> TimelinePollRequested:
    origin = f"http://{HOST}:{server.port}"
    return TimelinePollRequested(
        instance=origin,
        domain=HOST,
        timeline="local",
        follow_id="follow-1",
        cursor=cursor,
        api=origin if api else None,
        poll=poll,
    )


def work(server: LocalServer, path: str) -> PageDiscovered:
    url = canonicalize(server.url(path, HOST))
    return PageDiscovered(
        url=url, domain=domain_of(url), scope=Scope(value=HOST), provenance=Provenance(kind="seed")
    )


async def polled(js: JetStreamContext, count: int) -> list[TimelinePolled]:
    """The first ``count`` ``TimelinePolled`` on the stream, in order."""
    sub = await js.pull_subscribe(TimelinePolled.SUBJECT, durable=None, stream=EVENTS_STREAM)
    found: list[TimelinePolled] = []

    async def more() -> list[TimelinePolled]:
        try:
            msgs = await sub.fetch(count - len(found), timeout=0.3)
        except TimeoutError:
            msgs = []
        for msg in msgs:
            event = decode_event(msg.data)
            assert isinstance(event, TimelinePolled)
            found.append(event)
            await msg.ack()
        return found

    try:
        return await eventually(
            more, until=lambda f: len(f) >= count, timeout=10, what=f"{count} polls"
        )
    finally:
        await sub.unsubscribe()


def bad_gateway(ex: Exchange) -> None:
    ex.send(502, b'{"error":"Bad gateway"}', content_type="application/json")


def stalled(ex: Exchange) -> None:
    """The start of a timeline page, then nothing until the server stops."""
    ex.send_response(200)
    ex.send_header("Content-Type", "application/json")
    ex.send_header("Content-Length", "100000")
    ex.end_headers()
    ex.wfile.write(b"[")
    ex.wfile.flush()
    ex.server.owner.stopping.wait(60)


@pytest.mark.parametrize(
    ("cut_short", "stopped_by", "reason"),
    [
        (bad_gateway, CrawlOutcome.BLOCKED_5XX, "server_error"),
        (stalled, CrawlOutcome.TIMEOUT, "timeout"),
    ],
)
async def test_a_poll_that_read_new_posts_and_then_failed_counts_against_the_instances_host(
    bus: Bus,
    client: httpx.AsyncClient,
    server: LocalServer,
    cut_short: Route,
    stopped_by: CrawlOutcome,
    reason: str,
) -> None:
    """A busy timeline whose first page always has new posts and whose next one fails:
    the posts are kept and the cursor moves, and the failure pauses the host as a failed
    poll's would, so the next poll (asked at once: there is ``more``) waits for it
    instead of costing the host another failing request."""
    server.routes[f"{HOST}{TIMELINE}100"] = api(statuses(101, 40))
    server.routes[f"{HOST}{TIMELINE}140"] = cut_short
    # A poll waits a second at most for its host in the task: a pause is waited for
    # in a scheduled message instead.
    polite = Politeness(
        await bus.js.key_value(DOMAINS_BUCKET), PolitenessConfig(min_delay=0.05, max_delay=1.0)
    )
    fetcher = await fetcher_on(bus, client, polite, total_timeout=1.0)
    try:
        await fetcher.poll(poll_of(server, "100"))
        slot = await polite.state(HOST)
        asked = len(server.requests_for(HOST))
        await fetcher.poll(poll_of(server, "140", poll=2))
    finally:
        fetcher.close()
    first, second = await polled(bus.js, 2)
    assert first.outcome is CrawlOutcome.SUCCESS, first.error_message
    assert (len(first.posts), first.cursor_after, first.more) == (40, "140", True)
    assert first.stopped_by is stopped_by
    assert (slot.policy.risk_level, slot.policy.pause_reason) == (1, reason)
    assert slot.backoff_until - time.time() > 30.0
    # The next poll asked nothing of the paused host.
    assert len(server.requests_for(HOST)) == asked
    assert (second.requests, second.posts, second.more) == (0, (), True)
    assert second.retry_after is not None
    assert second.retry_after > 30.0


async def test_a_bot_challenge_answered_to_the_api_leaves_the_host_alone_as_a_pages_would(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """AWS WAF answers a bot with a 202 and a challenge page: not an answer the poll can
    read, and the host's defence, paused for as long as after one answered to a page."""
    server.routes[f"{HOST}{TIMELINE}100"] = lambda ex: ex.send(
        202, b"<html><script>challenge()</script></html>", {"x-amzn-waf-action": "challenge"}
    )
    polite = Politeness(await bus.js.key_value(DOMAINS_BUCKET), PolitenessConfig(min_delay=0.05))
    fetcher = await fetcher_on(bus, client, polite)
    try:
        await fetcher.poll(poll_of(server, "100"))
    finally:
        fetcher.close()
    (event,) = await polled(bus.js, 1)
    assert (event.outcome, event.status_code, event.challenged) == (
        CrawlOutcome.BLOCKED_4XX,
        202,
        True,
    )
    assert (event.posts, event.cursor_after) == ((), "100")
    slot = await polite.state(HOST)
    assert slot.policy.pause_reason == "blocked_captcha"
    assert slot.policy.banned_at > 0
    assert slot.backoff_until - time.time() > LearningConfig().ban_pause / 2


async def test_a_polls_answer_sent_after_its_hosts_last_escalation_escalates_it_again(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """The poll started before the host was escalated (a page's 429, while the poll's
    NodeInfo request was out), then waited out the pause and sent its API request: the
    429 it got back was no answer in flight, and counts as a 429 in a row."""
    asked, answer = threading.Event(), threading.Event()

    def nodeinfo(ex: Exchange) -> None:
        asked.set()
        answer.wait(10)  # until the host is escalated: the order under test
        ex.send(404, b'{"error":"Not found"}', content_type="application/json")

    server.routes[f"{HOST}/.well-known/nodeinfo"] = nodeinfo
    server.routes[f"{HOST}{TIMELINE}100"] = api(b'{"error":"Too many requests"}', 429)
    learning = LearningConfig(rate_base=1.0)  # a first pause of about a second
    polite = Politeness(
        await bus.js.key_value(DOMAINS_BUCKET), PolitenessConfig(min_delay=0.05), learning
    )
    fetcher = await fetcher_on(bus, client, polite)
    try:
        polling = asyncio.create_task(fetcher.poll(poll_of(server, "100", api=False)))
        assert await asyncio.to_thread(asked.wait, 10)
        now = time.time()
        escalation = Observation(
            started=now - 0.1,
            at=now,
            url=f"http://{HOST}/page",
            strategy="http",
            success=False,
            is_banned=False,
            error_type="rate_limited",
            status=429,
            retry_after=None,
            duration_ms=None,
        )
        first = await polite.observe(HOST, escalation)
        answer.set()
        await asyncio.wait_for(polling, timeout=20)
    finally:
        answer.set()
        fetcher.close()
    (event,) = await polled(bus.js, 1)
    assert (event.outcome, event.status_code) == (CrawlOutcome.BLOCKED_4XX, 429)
    assert first.rate_level == 1
    slot = await polite.state(HOST)
    assert slot.policy.rate_level == 2
    assert slot.backoff_until > event.completed_at.timestamp()


class SlowKV:
    """The real lease bucket, each answer ``delay`` late once set (a broker under load);
    every record it took is kept, in order."""

    def __init__(self, kv: KV) -> None:
        self.kv = kv
        self.delay = 0.0
        self.written: list[dict[str, float]] = []

    async def _late(self, answer: Awaitable[T]) -> T:
        if self.delay:
            await asyncio.sleep(self.delay)  # the late answer is the condition under test
        return await answer

    async def get(self, key: str) -> object:
        return await self._late(self.kv.get(key))

    async def create(self, key: str, value: bytes) -> int:
        revision = await self._late(self.kv.create(key, value))
        self.written.append(json.loads(value))
        return revision

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        revision = await self._late(self.kv.update(key, value, last=last))
        self.written.append(json.loads(value))
        return revision


def endless(content_type: str, ends: list[float]) -> Route:
    """A body that never ends, a byte at a time; ``ends`` gets when the client hung up."""

    def route(ex: Exchange) -> None:
        ex.send_response(200)
        ex.send_header("Content-Type", content_type)
        ex.send_header("Content-Length", "1000000")
        ex.end_headers()
        try:
            while not ex.server.owner.stopping.wait(0.05):
                ex.wfile.write(b" ")
                ex.wfile.flush()
        except OSError:
            ends.append(time.time())
            ex.server.owner.signal("hung up")

    return route


@pytest.mark.parametrize("kind", ["page", "poll", "redirect hop", "robots.txt hop"])
async def test_a_request_whose_lease_came_late_ends_within_the_leases_hold(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer, kind: str
) -> None:
    """The hold counts from the lease's start; the lease answered 2 s after it (past what
    the hold allows for), and the host's answer never ends. Run for its whole timeout, the
    request would end a second after its hold: another pod, finding the hold expired,
    could send then, inside the gap. A redirect's hop takes a lease of its own, and is
    bounded by it, not by what its first request left."""
    ends: list[float] = []
    server.routes[f"{HOST}/endless"] = endless("text/html", ends)
    server.routes[f"{HOST}{TIMELINE}100"] = endless("application/json", ends)
    kv = SlowKV(await bus.js.key_value(DOMAINS_BUCKET))

    def moved(ex: Exchange) -> None:
        kv.delay = 2.0  # the first request's lease came in time; the hop's comes late
        ex.redirect("/endless")

    server.routes[f"{HOST}/moved"] = moved

    def robots_moved(ex: Exchange) -> None:
        kv.delay = 2.0  # as above, for a robots.txt that redirects
        ex.redirect("/robots-here.txt")

    if kind == "robots.txt hop":
        server.routes[f"{HOST}/robots.txt"] = robots_moved
        server.routes[f"{HOST}/robots-here.txt"] = endless("text/plain", ends)
    polite = Politeness(kv, PolitenessConfig(min_delay=0.05, request_timeout=3.0))
    fetcher = await fetcher_on(bus, client, polite, total_timeout=3.0)
    page, endless_page = work(server, "/page"), work(server, "/endless")
    try:
        if kind != "robots.txt hop":
            await fetcher.process(Job(page), page.to_wire())  # robots.txt read, and a page
        kv.delay, kv.written = (0.0 if kind.endswith("hop") else 2.0), []
        if kind == "robots.txt hop":
            await fetcher.process(Job(page), page.to_wire())
        elif kind == "page":
            await fetcher.process(Job(endless_page), endless_page.to_wire())
        elif kind == "poll":
            await fetcher.poll(poll_of(server, "100"))
        else:
            hop = work(server, "/moved")
            await fetcher.process(Job(hop), hop.to_wire())
        assert await asyncio.to_thread(server.wait_for, "hung up", 10)
    finally:
        fetcher.close()
    # The hold of the request that never ended: the last one taken.
    *_, hold = [r["busy_until"] for r in kv.written if r["busy_until"] > 0]
    (end,) = ends
    assert end <= hold + 0.3, end - hold


async def test_a_lease_that_came_a_moment_late_does_not_shorten_its_request(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """The lease answered 0.8 s after its start (a broker under load); the page takes 3.5 s
    of its 4 s timeout. The hold allows for the lease's lateness: the page is read."""

    def slow(ex: Exchange) -> None:
        time.sleep(3.5)  # a slow answer is the condition under test
        ex.send(200, b"<title>slow</title><p>read at last</p>")

    server.routes[f"{HOST}/slow"] = slow
    kv = SlowKV(await bus.js.key_value(DOMAINS_BUCKET))
    polite = Politeness(kv, PolitenessConfig(min_delay=0.05, request_timeout=4.0))
    fetcher = await fetcher_on(bus, client, polite, total_timeout=4.0)
    page, slow_page = work(server, "/page"), work(server, "/slow")
    try:
        await fetcher.process(Job(page), page.to_wire())
        kv.delay = 0.8
        await fetcher.process(Job(slow_page), slow_page.to_wire())
    finally:
        fetcher.close()
    events = await Completions(bus.js).wait_for(2, timeout=10)
    assert events[slow_page.url].outcome is CrawlOutcome.SUCCESS, events[
        slow_page.url
    ].error_message


class FoldsWatched(Politeness):
    """The bucket's politeness, noting the host's record each time a poll's answer is
    about to be folded into it: what another poll of the instance found meanwhile."""

    def __init__(self, kv: KV, config: PolitenessConfig) -> None:
        super().__init__(kv, config)
        self.before_folds: list[DomainSlot] = []

    async def observe(self, domain: str, observation: Observation) -> HostPolicy:
        self.before_folds.append(await self.state(domain))
        return await super().observe(domain, observation)


async def test_a_rate_limit_an_answer_spent_holds_the_host_from_its_requests_release(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """The instance's answer says its limit is spent until a reset 30 s away. The poll
    lets go of the request's lease before it ends (its posts parsed, its event built: on
    a busy pod, seconds), and another poll of the instance takes the host a gap after
    the lease: the reset is in the host's record from the lease's release on."""
    reset_in = 30.0
    server.routes[f"{HOST}{TIMELINE}100"] = spent(reset_in)
    polite = FoldsWatched(await bus.js.key_value(DOMAINS_BUCKET), PolitenessConfig(min_delay=0.05))
    fetcher = await fetcher_on(bus, client, polite)
    try:
        asked = time.time()
        await fetcher.poll(poll_of(server, "100"))
    finally:
        fetcher.close()
    (event,) = await polled(bus.js, 1)
    assert event.rate_limited
    assert event.retry_after is not None
    (found,) = polite.before_folds
    assert found.backoff_until >= asked + reset_in - 1.0


class FoldsHeld(Politeness):
    """The real politeness; a poll's closing fold (``observe``) waits until ``folds`` is
    set, so that what the host's record holds before it can be read."""

    def __init__(self, kv: KV, config: PolitenessConfig) -> None:
        super().__init__(kv, config)
        self.reached = asyncio.Event()
        self.folds = asyncio.Event()

    async def observe(self, domain: str, observation: Observation) -> HostPolicy:
        self.reached.set()
        await self.folds.wait()
        return await super().observe(domain, observation)


async def test_a_rate_limit_spent_while_the_broker_is_away_holds_the_host_once_it_is_back(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """The broker is away as the poll lets go of the request's lease, longer than the
    request's patience: the wait the answer asked is written when the broker is back,
    without waiting for the poll's closing fold (which another poll of the instance
    could come before)."""
    reset_in = 30.0
    server.routes[f"{HOST}{TIMELINE}100"] = spent(reset_in)
    kv = PauseWritesAway(await bus.js.key_value(DOMAINS_BUCKET))
    polite = FoldsHeld(kv, PolitenessConfig(min_delay=0.05))
    fetcher = await fetcher_on(bus, client, polite, ack_wait=1.0)
    kv.away.set()
    asked = time.time()
    polling = asyncio.create_task(fetcher.poll(poll_of(server, "100")))
    try:
        # The poll at its closing fold: its request's release was given up.
        await asyncio.wait_for(polite.reached.wait(), timeout=10)
        slot = await kv.back(polite, HOST, timeout=10)
        assert not polling.done()  # the fold is still held: the release wrote it
        polite.folds.set()
        await asyncio.wait_for(polling, timeout=10)
    finally:
        polite.folds.set()
        polling.cancel()
        fetcher.close()
    assert slot.backoff_until >= asked + reset_in - 1.0
    (event,) = await polled(bus.js, 1)
    assert event.rate_limited


async def test_a_poll_whose_robots_txt_redirects_on_its_host_reads_the_timeline(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """robots.txt sent elsewhere on the same host (as an instance followed as http://
    sends it to https://): the hop waits a gap in the poll, which then reads the
    timeline, each request a gap after the last. A hop that ended the poll came back
    to the first robots.txt every time, and the timeline was never read. The gap is
    longer than a page's hop waits in its task (``LOCAL_WAIT``), as the default's is."""
    gap = 2 * LOCAL_WAIT
    server.routes[f"{HOST}/robots.txt"] = lambda ex: ex.redirect("/robots-real.txt", 301)
    server.routes[f"{HOST}/robots-real.txt"] = lambda ex: ex.send(200, b"User-agent: *\nAllow: /\n")
    server.routes[f"{HOST}{TIMELINE}100"] = api(statuses(101, 5))
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    fetcher = await fetcher_on(bus, client, Politeness(kv, PolitenessConfig(min_delay=gap)))
    try:
        await fetcher.poll(poll_of(server, "100"))
    finally:
        fetcher.close()
    (event,) = await polled(bus.js, 1)
    assert event.outcome is CrawlOutcome.SUCCESS, event.error_message
    assert len(event.posts) == 5
    assert [seen.path for seen in server.requests_for(HOST)] == [
        "/robots.txt",
        "/robots-real.txt",
        f"{TIMELINE}100",
    ]
    shortest = server.min_gap(HOST)
    assert shortest is not None
    assert shortest >= gap
