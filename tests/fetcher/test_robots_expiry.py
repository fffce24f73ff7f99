"""robots.txt grows old on the pods' shared clock, not on the node's.

A policy one pod fetched is read by every pod from the shared bucket, so its age must
be judged on the clock they share (nats-server's, ``trove_fetcher.clock``): a pod whose
own clock ran behind would otherwise obey a robots.txt past its TTL, as long as its
clock is behind. Here the shared time moves on by more than the TTL while the node's
clock does not, and the site's new robots.txt is obeyed at once. The ``Fetcher`` runs
in the test's process against real NATS and a real HTTP server, whose request log is
the evidence.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.fetcher._completions import Completions
from tests.fetcher._servers import LocalServer, serving
from trove_fetcher.fetcher import Fetcher, Job
from trove_fetcher.http import FetchLimits
from trove_fetcher.politeness import Politeness, PolitenessConfig
from trove_fetcher.transport import build_client
from trove_schema.bus import Bus
from trove_schema.events import CrawlOutcome, PageDiscovered, Provenance, Scope
from trove_schema.settings import FetcherSettings
from trove_schema.topology import DOMAINS_BUCKET, ROBOTS_BUCKET
from trove_schema.urls import canonicalize, domain_of

pytestmark = pytest.mark.usefixtures("clean")

IP = "127.0.0.65"
HOST = "robots-clock.test"
TTL = 600.0


class SharedClock:
    """The pods' shared time, moved on by hand while this node's clock stands still."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def now(self) -> float:
        return time.time() + self.ahead

    def at(self, local: float) -> float:
        return local + self.ahead


@pytest.fixture
def site() -> Iterator[tuple[LocalServer, dict[str, bytes]]]:
    robots = {"body": b"User-agent: *\nAllow: /\n"}
    routes = {
        f"{HOST}/robots.txt": lambda ex: ex.send(200, robots["body"], content_type="text/plain"),
        f"{HOST}/first": lambda ex: ex.send(200, b"<title>first</title>"),
        f"{HOST}/second": lambda ex: ex.send(200, b"<title>second</title>"),
    }
    with serving(routes, IP) as running:
        yield running, robots


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    settings = FetcherSettings(allowed_networks=(f"{IP}/32",), resolve=(f"{HOST}={IP}",))
    async with build_client(settings) as built:
        yield built


def work(server: LocalServer, path: str) -> PageDiscovered:
    url = canonicalize(server.url(path, HOST))
    return PageDiscovered(
        url=url, domain=domain_of(url), scope=Scope(value=HOST), provenance=Provenance(kind="seed")
    )


async def test_robots_txt_is_read_again_once_its_ttl_has_passed_on_the_shared_clock(
    bus: Bus, client: httpx.AsyncClient, site: tuple[LocalServer, dict[str, bytes]]
) -> None:
    server, robots = site
    clock = SharedClock()
    fetcher = Fetcher(
        bus=bus,
        client=client,
        politeness=Politeness(
            await bus.js.key_value(DOMAINS_BUCKET), PolitenessConfig(min_delay=0.05)
        ),
        robots_kv=await bus.js.key_value(ROBOTS_BUCKET),
        limits=FetchLimits(total_timeout=5.0),
        robots_token="TroveBot",
        robots_max_bytes=64 * 1024,
        robots_ttl=TTL,
        clock=clock,
    )
    first, second = work(server, "/first"), work(server, "/second")
    try:
        await fetcher.process(Job(first), first.to_wire())
        robots["body"] = b"User-agent: *\nDisallow: /\n"  # the site opts out
        clock.ahead = TTL + 1.0  # the shared time is past the TTL; the node's clock is not
        await fetcher.process(Job(second), second.to_wire())
    finally:
        fetcher.close()

    events = await Completions(bus.js).wait_for(2, timeout=10)
    assert events[first.url].outcome is CrawlOutcome.SUCCESS
    assert events[second.url].outcome is CrawlOutcome.BLOCKED_ROBOTS
    assert len(server.requests_to("/robots.txt", HOST)) == 2
    assert server.requests_to("/second", HOST) == []
