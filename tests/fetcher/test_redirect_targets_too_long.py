"""A hostile site's redirect to a huge URL, or a chain too long for a work message, ends
in a recorded outcome: it never reaches the headers of a deferred message, which
nats-server counts against its ``max_payload`` (a client that sends more is cut off).

The ``Fetcher`` runs in the test's process against real NATS and a real HTTP server,
whose request log is the evidence.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from nats.aio.msg import Msg

from tests.conftest import bucket_keys
from tests.fetcher._completions import Completions
from tests.fetcher._servers import LocalServer, Route, serving
from trove_fetcher.deferral import Carried, Chain, ChainKind
from trove_fetcher.fetcher import LOCAL_WAIT, Fetcher, Job
from trove_fetcher.http import FetchLimits
from trove_fetcher.politeness import Politeness, PolitenessConfig
from trove_fetcher.robots import RobotsPolicy, RobotsRule
from trove_fetcher.transport import build_client
from trove_schema.bus import Bus
from trove_schema.events import MAX_URL_LENGTH, CrawlOutcome, PageDiscovered, Provenance, Scope
from trove_schema.settings import FetcherSettings
from trove_schema.topology import DOMAINS_BUCKET, ROBOTS_BUCKET, WORK_SCHEDULES_PREFIX, WORK_STREAM
from trove_schema.urls import canonicalize, domain_of

pytestmark = pytest.mark.usefixtures("clean")

IP = "127.0.0.195"
HOST = "long-hops.test"
#: What the hostile site sent: a Location just short of what httpx reads of a header.
HUGE = "/" + "x" * 60_000
#: Each waits for the host's gap in a scheduled message.
GAP = 5 * LOCAL_WAIT


def page(title: str) -> Route:
    return lambda ex: ex.send(200, f"<title>{title}</title><p>{title}</p>".encode())


def hop(n: int) -> str:
    """A same-host path making a URL of nearly ``MAX_URL_LENGTH`` characters: allowed."""
    return f"/hop{n}/" + "y" * (MAX_URL_LENGTH - 100)


@pytest.fixture
def server() -> Iterator[LocalServer]:
    routes: dict[str, Route] = {
        f"{HOST}/robots.txt": lambda ex: ex.send(
            200, b"User-agent: *\nAllow: /\n", content_type="text/plain"
        ),
        f"{HOST}/page": page("first"),
        f"{HOST}/huge": lambda ex: ex.redirect(HUGE),
        f"{HOST}{HUGE}": page("huge"),
        f"{HOST}{hop(1)}": lambda ex: ex.redirect(hop(2)),
        f"{HOST}{hop(2)}": lambda ex: ex.redirect(hop(3)),
        f"{HOST}{hop(3)}": page("end of the chain"),
    }
    with serving(routes, IP) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    settings = FetcherSettings(allowed_networks=(f"{IP}/32",), resolve=(f"{HOST}={IP}",))
    async with build_client(settings) as built:
        yield built


class MovedClock:
    """The pods' shared time, moved on by hand: a host's gap passes at once."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def now(self) -> float:
        return time.time() + self.ahead

    def at(self, local: float) -> float:
        return local + self.ahead


async def fetcher_on(
    bus: Bus, client: httpx.AsyncClient, clock: MovedClock, max_message_bytes: int = 1 << 20
) -> Fetcher:
    return Fetcher(
        bus=bus,
        clock=clock,
        client=client,
        politeness=Politeness(
            await bus.js.key_value(DOMAINS_BUCKET), PolitenessConfig(min_delay=GAP)
        ),
        robots_kv=await bus.js.key_value(ROBOTS_BUCKET),
        limits=FetchLimits(total_timeout=5.0),
        robots_token="TroveBot",
        robots_max_bytes=64 * 1024,
        max_message_bytes=max_message_bytes,
    )


def work(server: LocalServer, path: str) -> PageDiscovered:
    url = canonicalize(server.url(path, HOST))
    return PageDiscovered(
        url=url, domain=domain_of(url), scope=Scope(value=HOST), provenance=Provenance(kind="seed")
    )


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


async def paused_chains(bus: Bus) -> list[Msg]:
    return [m for m in await scheduled_work(bus) if Carried.from_headers(m.headers).chain]


async def test_a_redirect_to_a_url_longer_than_trove_takes_is_rejected_and_never_deferred(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """The hop would wait for the host's gap in a scheduled message carrying its URL
    (60 KB; five such hops made a 325 KB header, and the server cut the pod off)."""
    clock = MovedClock()
    fetcher = await fetcher_on(bus, client, clock)
    first, huge = work(server, "/page"), work(server, "/huge")
    try:
        await fetcher.process(Job(first), first.to_wire())  # robots.txt; the page waits
        clock.ahead += 3 * GAP
        await fetcher.process(Job(huge), huge.to_wire())  # /huge; its hop is refused
    finally:
        fetcher.close()
    assert await paused_chains(bus) == []
    events = await Completions(bus.js).wait_for(1, timeout=10)
    event = events[huge.url]
    assert event.outcome is CrawlOutcome.REJECTED
    assert event.error_message is not None
    assert event.error_message.startswith("redirect target too long")
    assert [seen.path for seen in server.requests_for(HOST)] == ["/robots.txt", "/huge"]


async def test_a_robots_txt_redirected_to_a_url_longer_than_trove_takes_is_a_missing_file(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """As a redirect to a Location no request can go to: allow all, and say why."""
    server.routes[f"{HOST}/robots.txt"] = lambda ex: ex.redirect(HUGE, 301)
    clock = MovedClock()
    fetcher = await fetcher_on(bus, client, clock)
    first = work(server, "/page")
    try:
        await fetcher.process(Job(first), first.to_wire())  # robots.txt; the page waits
    finally:
        fetcher.close()
    assert await paused_chains(bus) == []
    kv = await bus.js.key_value(ROBOTS_BUCKET)
    (key,) = await bucket_keys(bus, ROBOTS_BUCKET)
    entry = await kv.get(key)
    assert entry.value is not None
    policy = RobotsPolicy.from_bytes(entry.value)
    assert policy.rule is RobotsRule.ALLOW_ALL
    assert policy.error is not None
    assert policy.error.startswith("redirect target too long")
    assert [seen.path for seen in server.requests_for(HOST)] == ["/robots.txt"]


async def test_a_paused_chain_too_long_for_a_work_message_is_recorded_not_scheduled(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """Hops of allowed length, but more of them than a message of the pod's limit holds
    beside the work: the chain's next pause is recorded, never published."""
    clock = MovedClock()
    # Room for the work and two hops in the headers, not three.
    fetcher = await fetcher_on(bus, client, clock, max_message_bytes=6 * 1024)
    first, start = work(server, "/page"), work(server, "/chain")
    followed = tuple(canonicalize(server.url(hop(n), HOST)) for n in (1, 2))
    resumed = Job(start, chain=Chain(ChainKind.PAGE, followed))
    try:
        await fetcher.process(Job(first), first.to_wire())  # robots.txt; the page waits
        clock.ahead += 3 * GAP
        # The chain comes back for its third hop, which redirects once more.
        await fetcher.process(resumed, start.to_wire())
    finally:
        fetcher.close()
    assert await paused_chains(bus) == []
    events = await Completions(bus.js).wait_for(1, timeout=10)
    event = events[start.url]
    assert event.outcome is CrawlOutcome.REJECTED
    assert event.error_message is not None
    assert event.error_message.startswith("redirect chain too long to defer")
    paths = [seen.path for seen in server.requests_for(HOST)]
    assert paths == ["/robots.txt", hop(2)]
