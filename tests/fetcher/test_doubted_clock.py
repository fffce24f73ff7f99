"""A request is not sent while the shared time is doubted by nearly its host's hold.

For a while after nats-server's clock is set, or the work stream's leader moves to a
server whose clock differs, a pod keeps to the safe side of both times (``now`` the
earlier, ``at`` the later: ``trove_fetcher.clock``). A request's time is what is left of
its hold on the later one; doubted by more than the hold, no time is left, and a request
sent with none would be recorded as the host's timeout. It waits instead.

The ``Fetcher`` runs in the test's process against real NATS and a real HTTP server,
with a shared clock doubted by ``DOUBT`` seconds.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.fetcher._servers import LocalServer, serving
from trove_fetcher import fetcher as fetcher_module
from trove_fetcher.fetcher import Fetcher, Job
from trove_fetcher.http import FetchLimits
from trove_fetcher.politeness import Politeness, PolitenessConfig
from trove_fetcher.robots import RobotsPolicy, RobotsRule
from trove_fetcher.transport import build_client
from trove_schema.bus import Bus, Retry
from trove_schema.events import PageDiscovered, Provenance, Scope, TimelinePollRequested
from trove_schema.settings import FetcherSettings
from trove_schema.topology import DOMAINS_BUCKET, EVENTS_STREAM, ROBOTS_BUCKET
from trove_schema.urls import canonicalize, domain_of

pytestmark = pytest.mark.usefixtures("clean")

IP = "127.0.0.197"
HOST = "doubted-clock.test"
#: How far apart the two times a pod keeps to are: more than a request's hold.
DOUBT = 60.0


class Doubted:
    """The earliest the shared time can be, and the latest: ``DOUBT`` apart."""

    def now(self) -> float:
        return time.time()

    def at(self, local: float) -> float:
        return local + DOUBT


@pytest.fixture
def server() -> Iterator[LocalServer]:
    routes = {
        f"{HOST}/robots.txt": lambda ex: ex.send(404, b""),
        f"{HOST}/page": lambda ex: ex.send(200, b"<title>a page</title>"),
    }
    with serving(routes, IP) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    settings = FetcherSettings(allowed_networks=(f"{IP}/32",), resolve=(f"{HOST}={IP}",))
    async with build_client(settings) as built:
        yield built


async def doubted_fetcher(bus: Bus, client: httpx.AsyncClient) -> Fetcher:
    return Fetcher(
        bus=bus,
        clock=Doubted(),
        client=client,
        politeness=Politeness(
            await bus.js.key_value(DOMAINS_BUCKET), PolitenessConfig(min_delay=0.05)
        ),
        robots_kv=await bus.js.key_value(ROBOTS_BUCKET),
        limits=FetchLimits(total_timeout=5.0),
        robots_token="TroveBot",
        robots_max_bytes=64 * 1024,
    )


async def test_a_request_waits_while_the_shared_time_is_doubted_by_more_than_its_hold(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    fetcher = await doubted_fetcher(bus, client)
    url = canonicalize(server.url("/page", HOST))
    page = PageDiscovered(
        url=url, domain=domain_of(url), scope=Scope(value=HOST), provenance=Provenance(kind="seed")
    )
    try:
        with pytest.raises(Retry, match="the shared time is in doubt"):
            await fetcher.process(Job(page), page.to_wire())
    finally:
        fetcher.close()
    # Neither robots.txt nor the page was asked with no time to answer, and nothing was
    # recorded against the host: the work goes back to its stream.
    assert server.requests_for(HOST) == []
    assert (await bus.js.stream_info(EVENTS_STREAM)).state.messages == 0


async def test_a_poll_waits_while_the_shared_time_is_doubted_by_more_than_its_hold(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    # The instance's robots.txt read a moment ago: the poll's own request is the one.
    allowed = RobotsPolicy(
        origin=f"http://{HOST}:{server.port}", rule=RobotsRule.ALLOW_ALL, fetched_at=time.time()
    )
    robots = await bus.js.key_value(ROBOTS_BUCKET)
    await robots.put(fetcher_module._robots_key(allowed.origin), allowed.to_bytes())
    fetcher = await doubted_fetcher(bus, client)
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
    # Nothing asked of the instance with no time to answer, nothing recorded against its
    # host: the poll comes back at its slot.
    assert server.requests_for(HOST) == []
    slot = await fetcher.politeness.state(HOST)
    assert slot.backoff_until <= time.time()
