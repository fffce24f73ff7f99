"""A host's next request leaves at its slot, however slowly the lease store answers.

Under load a round trip to the KV bucket takes a good part of a short gap. The
``Fetcher`` runs in the test's process against real NATS and a real HTTP server; the
bucket is the real one, reached through a seam that answers each call late.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.fetcher._completions import Completions
from tests.fetcher._servers import LocalServer, Route, serving
from trove_fetcher.fetcher import Fetcher, Job
from trove_fetcher.http import FetchLimits
from trove_fetcher.politeness import KV, Politeness, PolitenessConfig
from trove_fetcher.transport import build_client
from trove_schema.bus import Bus
from trove_schema.events import PageDiscovered, Provenance, Scope
from trove_schema.settings import FetcherSettings
from trove_schema.topology import DOMAINS_BUCKET, ROBOTS_BUCKET
from trove_schema.urls import canonicalize, domain_of

pytestmark = pytest.mark.usefixtures("clean")

IP = "127.0.0.183"
HOST = "slow-lease.timing.test"
GAP = 1.0
#: Each call to the bucket answers this late: a request that waited for a round trip
#: after its slot would show it in the gap the site sees.
ROUND_TRIP = 0.4


class LateKV:
    """The real bucket, each answer ``ROUND_TRIP`` late (a broker under load)."""

    def __init__(self, kv: KV) -> None:
        self.kv = kv

    async def get(self, key: str) -> object:
        await asyncio.sleep(ROUND_TRIP)
        return await self.kv.get(key)

    async def create(self, key: str, value: bytes) -> int:
        await asyncio.sleep(ROUND_TRIP)
        return await self.kv.create(key, value)

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        await asyncio.sleep(ROUND_TRIP)
        return await self.kv.update(key, value, last=last)


@pytest.fixture
def server() -> Iterator[LocalServer]:
    page: Route = lambda ex: ex.send(200, b"<title>a page</title><p>text</p>")  # noqa: E731
    routes: dict[str, Route] = {
        f"{HOST}/robots.txt": lambda ex: ex.send(200, b"User-agent: *\nAllow: /\n"),
        f"{HOST}/one": page,
        f"{HOST}/two": page,
    }
    with serving(routes, IP) as running:
        yield running


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


async def test_a_hosts_next_request_goes_at_its_slot_not_a_round_trip_after_it(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    kv = LateKV(await bus.js.key_value(DOMAINS_BUCKET))
    fetcher = Fetcher(
        bus=bus,
        client=client,
        politeness=Politeness(kv, PolitenessConfig(min_delay=GAP, request_timeout=5.0)),
        robots_kv=await bus.js.key_value(ROBOTS_BUCKET),
        limits=FetchLimits(total_timeout=5.0),
        robots_token="TroveBot",
        robots_max_bytes=64 * 1024,
    )
    one, two = work(server, "/one"), work(server, "/two")
    try:
        # robots.txt, then /one a gap later; /two is handed over when /one is done.
        await fetcher.process(Job(one), one.to_wire())
        await fetcher.process(Job(two), two.to_wire())
    finally:
        fetcher.close()
    await Completions(bus.js).wait_for(2, timeout=10)
    times = sorted(seen.at for seen in server.requests_for(HOST))
    assert len(times) == 3  # robots.txt, /one, /two
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    # Never closer than the gap (it counts from the end of each answer), and not a
    # round trip to the bucket past it: each lease was taken ahead, for its start.
    assert all(GAP <= gap < GAP + ROUND_TRIP / 2 for gap in gaps), gaps
