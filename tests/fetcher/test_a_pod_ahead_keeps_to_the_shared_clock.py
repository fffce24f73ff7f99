"""A pod whose own clock runs ahead keeps to the pods' shared time: a wait a site gives
as a date (``Retry-After: <HTTP-date>``, ``X-RateLimit-Reset``) pauses its host as long as
it asked, and the times of its attempts and polls, which plan a page's next visit and a
timeline's next poll, are the shared time's.

The ``Fetcher`` runs in the test's process against real NATS and a real HTTP server.
The pods' shared time (nats-server's, ``trove_fetcher.clock``) is ``SKEW`` seconds
behind this pod's own clock, and the site's clock agrees with the shared one: the site
dates its wait on the shared time, as a site in time with the world would, and its
response's ``Date`` too, or sends none (then the wait is read on the shared time). The host's
record in the lease bucket, kept on the shared time, is the evidence.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

from tests.fetcher._completions import Completions
from tests.fetcher._servers import Exchange, LocalServer, Route, serving
from trove_fetcher.fetcher import Fetcher, Job
from trove_fetcher.http import FetchLimits
from trove_fetcher.politeness import Politeness, PolitenessConfig
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
from trove_schema.settings import FetcherSettings
from trove_schema.topology import DOMAINS_BUCKET, EVENTS_STREAM, ROBOTS_BUCKET
from trove_schema.urls import canonicalize, domain_of

pytestmark = pytest.mark.usefixtures("clean")

IP = "127.0.0.196"
HOST = "dated-waits.test"
#: How far this pod's clock runs ahead of the others'.
SKEW = 90.0
#: The wait the site asks for, as a date that far ahead of its (and the shared) time.
ASKED = 120.0


class PodAhead:
    """The pods' shared time as this pod reads it: ``SKEW`` seconds behind its own."""

    def now(self) -> float:
        return time.time() - SKEW

    def at(self, local: float) -> float:
        return local - SKEW


CLOCK = PodAhead()


def http_date(seconds_ahead: float) -> str:
    """A moment ``seconds_ahead`` of the site's time (the shared one), as an HTTP-date."""
    return format_datetime(datetime.fromtimestamp(CLOCK.now() + seconds_ahead, UTC), usegmt=True)


def on_site_time(route: Route, dated: bool) -> Route:
    """``route``, its response's ``Date`` on the site's clock (the shared time), as a site
    in time with the world sends it, or without a ``Date``: a dated wait is read against
    the response's own ``Date`` when it has one, else against the shared time."""

    def answer(ex: Exchange) -> None:
        if dated:
            ex.date_time_string = lambda timestamp=None: http_date(0)  # type: ignore[method-assign]
        else:
            send_header = ex.send_header

            def without_date(keyword: str, value: str) -> None:
                if keyword.lower() != "date":
                    send_header(keyword, value)

            ex.send_header = without_date  # type: ignore[method-assign]
        route(ex)

    return answer


def slow_down(status: int, dated: bool) -> Route:
    def answer(ex: Exchange) -> None:
        ex.send(status, b"slow down", {"Retry-After": http_date(ASKED)})

    return on_site_time(answer, dated)


#: The site's responses dated on its clock, or not dated at all.
DATED = pytest.mark.parametrize("dated", [True, False], ids=["dated", "undated"])


@pytest.fixture
def server() -> Iterator[LocalServer]:
    with serving({f"{HOST}/robots.txt": lambda ex: ex.send(404, b"")}, IP) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    settings = FetcherSettings(allowed_networks=(f"{IP}/32",), resolve=(f"{HOST}={IP}",))
    async with build_client(settings) as built:
        yield built


async def fetcher_on(bus: Bus, client: httpx.AsyncClient) -> Fetcher:
    return Fetcher(
        bus=bus,
        clock=CLOCK,
        client=client,
        politeness=Politeness(
            await bus.js.key_value(DOMAINS_BUCKET), PolitenessConfig(min_delay=0.05)
        ),
        robots_kv=await bus.js.key_value(ROBOTS_BUCKET),
        limits=FetchLimits(total_timeout=5.0),
        robots_token="TroveBot",
        robots_max_bytes=64 * 1024,
    )


async def polled_once(bus: Bus, client: httpx.AsyncClient, server: LocalServer) -> Fetcher:
    """The fetcher, after it polled the local timeline of the instance ``server`` plays."""
    fetcher = await fetcher_on(bus, client)
    request = TimelinePollRequested(
        instance=f"http://{HOST}:{server.port}",
        domain=HOST,
        timeline="local",
        follow_id="follow-1",
    )
    try:
        await fetcher.poll(request)
    finally:
        fetcher.close()
    return fetcher


def work(server: LocalServer, path: str) -> PageDiscovered:
    url = canonicalize(server.url(path, HOST))
    return PageDiscovered(
        url=url, domain=domain_of(url), scope=Scope(value=HOST), provenance=Provenance(kind="seed")
    )


async def processed(bus: Bus, client: httpx.AsyncClient, discovered: PageDiscovered) -> Fetcher:
    """The fetcher, after it handled ``discovered``."""
    fetcher = await fetcher_on(bus, client)
    try:
        await fetcher.process(Job(discovered), discovered.to_wire())
    finally:
        fetcher.close()
    return fetcher


async def paused_for(fetcher: Fetcher) -> float:
    """Seconds the host is left alone from now, on the shared time."""
    slot = await fetcher.politeness.state(HOST)
    return slot.backoff_until - CLOCK.now()


def as_asked(seconds: float) -> bool:
    # An HTTP-date says whole seconds, and the test takes a moment: on the pod's own
    # clock the wait would be SKEW shorter.
    return ASKED - 5 < seconds <= ASKED


@DATED
async def test_a_pages_dated_retry_after_pauses_its_host_as_long_as_asked(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer, dated: bool
) -> None:
    server.routes[f"{HOST}/limited"] = slow_down(429, dated)
    limited = work(server, "/limited")
    fetcher = await processed(bus, client, limited)
    events = await Completions(bus.js).wait_for(1, timeout=10)
    event = events[limited.url]
    assert event.outcome is CrawlOutcome.BLOCKED_4XX
    assert event.retry_after is not None
    assert as_asked(event.retry_after), event.retry_after
    paused = await paused_for(fetcher)
    assert as_asked(paused), paused


@DATED
async def test_a_robots_txts_dated_retry_after_pauses_its_host_as_long_as_asked(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer, dated: bool
) -> None:
    server.routes[f"{HOST}/robots.txt"] = slow_down(503, dated)
    fetcher = await processed(bus, client, work(server, "/page"))
    assert [seen.path for seen in server.requests_for(HOST)] == ["/robots.txt"]
    paused = await paused_for(fetcher)
    assert as_asked(paused), paused


@pytest.mark.parametrize(
    "answer",
    [
        # The instance refuses, and says until when.
        lambda ex: ex.send(
            429, b"{}", {"Retry-After": http_date(ASKED)}, content_type="application/json"
        ),
        # It answers, its rate limit spent until the reset it dates.
        lambda ex: ex.send(
            200,
            b'{"links": []}',
            {
                "X-RateLimit-Limit": "300",
                "X-RateLimit-Remaining": "0",
                "X-RateLimit-Reset": http_date(ASKED),
            },
            content_type="application/json",
        ),
    ],
    ids=["retry-after", "rate-limit-reset"],
)
@DATED
async def test_a_polls_dated_wait_pauses_its_host_as_long_as_asked(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer, answer: Route, dated: bool
) -> None:
    server.routes[f"{HOST}/.well-known/nodeinfo"] = on_site_time(answer, dated)
    fetcher = await polled_once(bus, client, server)
    assert "/.well-known/nodeinfo" in [seen.path for seen in server.requests_for(HOST)]
    paused = await paused_for(fetcher)
    assert as_asked(paused), paused


def on_the_shared_time(started: datetime, completed: datetime) -> bool:
    # Taken just now by the test's clock: on the pod's own they would be SKEW ahead.
    now = datetime.fromtimestamp(CLOCK.now(), UTC)
    return now - timedelta(seconds=10) <= started <= completed <= now


async def test_a_pages_attempt_is_timed_on_the_shared_clock(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    # Its page's next visit is due a while after ``completed_at``, fired by nats-server's
    # clock: a pod behind would plan every chain it ends early by as much.
    server.routes[f"{HOST}/page"] = lambda ex: ex.send(200, b"<title>A page</title>")
    fetcher = await fetcher_on(bus, client)
    page = work(server, "/page")
    try:
        await fetcher.process(Job(page), page.to_wire())
    finally:
        fetcher.close()
    event = (await Completions(bus.js).wait_for(1, timeout=10))[page.url]
    assert event.outcome is CrawlOutcome.SUCCESS
    assert on_the_shared_time(event.started_at, event.completed_at), event


async def test_a_polls_times_are_on_the_shared_clock(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    # Whatever the poll's outcome (an instance that answers nothing here), its next poll
    # is due a while after its ``completed_at``.
    server.routes[f"{HOST}/.well-known/nodeinfo"] = lambda ex: ex.send(404, b"")
    await polled_once(bus, client, server)
    last = await bus.js.get_last_msg(EVENTS_STREAM, TimelinePolled.SUBJECT)
    assert last.data is not None
    polled = decode_event(last.data)
    assert isinstance(polled, TimelinePolled)
    assert on_the_shared_time(polled.started_at, polled.completed_at), polled
