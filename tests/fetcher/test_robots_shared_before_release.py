"""A robots.txt a pod read is in the shared bucket before the host's lease is free again,
and taken back if the release that carries its Crawl-delay fails.

The pod that takes the host's next lease looks for the policy under it: had the
policy been written after the release, a write slower than the gap would leave that
pod without it, and the site asked for robots.txt a second time. And a policy left
shared when the release carrying its Crawl-delay failed would be trusted by the retry
of the work, the Crawl-delay lost until robots.txt is read again the next day. The
``Fetcher`` runs in the test's process against real NATS and a real HTTP server; the
buckets are the real ones, the robots bucket seen through a wrapper that reads the
host's lease record at the moment of each write, and the broker's absence played by a
politeness whose release carrying a Crawl-delay fails.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import nats.errors
import pytest
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from tests.fetcher._completions import Completions
from tests.fetcher._servers import LocalServer, serving
from trove_fetcher.fetcher import Fetcher, Job, _robots_key
from trove_fetcher.http import FetchLimits
from trove_fetcher.politeness import DomainSlot, Granted, Politeness, PolitenessConfig
from trove_fetcher.transport import build_client
from trove_schema.bus import Bus
from trove_schema.events import CrawlOutcome, PageDiscovered, Provenance, Scope
from trove_schema.policy import HostPolicy, Observation
from trove_schema.settings import FetcherSettings
from trove_schema.topology import DOMAINS_BUCKET, ROBOTS_BUCKET
from trove_schema.urls import canonicalize, domain_of, origin_of

pytestmark = pytest.mark.usefixtures("clean")

IP = "127.0.0.63"
HOST = "robots-shared.test"


class LeaseAtWrite:
    """The robots bucket, noting whether the host's lease was held at each write."""

    def __init__(self, robots: KeyValue, leases: KeyValue) -> None:
        self.robots = robots
        self.leases = leases
        self.held: list[bool] = []

    async def get(self, key: str) -> object:
        return await self.robots.get(key)

    async def put(self, key: str, value: bytes) -> int:
        lease = await self.leases.get(Politeness.key(HOST))
        self.held.append(DomainSlot.decode(lease.value, 0.05).busy_until > 0)
        return await self.robots.put(key, value)


class ReleaseAway(Politeness):
    """Shared leases whose release carrying a Crawl-delay the broker does not take."""

    async def finish(
        self,
        domain: str,
        grant: Granted,
        end: float,
        observation: Observation | None = None,
        *,
        gap: float | None = None,
    ) -> HostPolicy:
        if gap is not None:
            raise nats.errors.TimeoutError
        return await super().finish(domain, grant, end, observation, gap=gap)


@pytest.fixture
def site() -> Iterator[LocalServer]:
    routes = {
        f"{HOST}/robots.txt": lambda ex: ex.send(
            200, b"User-agent: *\nCrawl-delay: 3\nAllow: /\n", content_type="text/plain"
        ),
        f"{HOST}/page": lambda ex: ex.send(200, b"<title>page</title>"),
    }
    with serving(routes, IP) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    settings = FetcherSettings(allowed_networks=(f"{IP}/32",), resolve=(f"{HOST}={IP}",))
    async with build_client(settings) as built:
        yield built


def page(site: LocalServer) -> PageDiscovered:
    url = canonicalize(site.url("/page", HOST))
    return PageDiscovered(
        url=url, domain=domain_of(url), scope=Scope(value=HOST), provenance=Provenance(kind="seed")
    )


async def test_a_read_robots_txt_is_shared_while_its_hosts_lease_is_still_held(
    bus: Bus, client: httpx.AsyncClient, site: LocalServer
) -> None:
    leases = await bus.js.key_value(DOMAINS_BUCKET)
    robots = LeaseAtWrite(await bus.js.key_value(ROBOTS_BUCKET), leases)
    fetcher = Fetcher(
        bus=bus,
        client=client,
        politeness=Politeness(leases, PolitenessConfig(min_delay=0.05, max_delay=0.05)),
        robots_kv=robots,  # type: ignore[arg-type]
        limits=FetchLimits(total_timeout=5.0),
        robots_token="TroveBot",
        robots_max_bytes=64 * 1024,
    )
    work = page(site)
    url = work.url
    try:
        await fetcher.process(Job(work), work.to_wire())
    finally:
        fetcher.close()

    events = await Completions(bus.js).wait_for(1, timeout=10)
    assert events[url].outcome is CrawlOutcome.SUCCESS
    assert len(site.requests_to("/robots.txt", HOST)) == 1
    assert robots.held == [True]
    released = DomainSlot.decode((await leases.get(Politeness.key(HOST))).value, 0.05)
    assert released.busy_until == 0


async def test_a_crawl_delay_the_broker_did_not_take_leaves_no_policy_and_no_free_host(
    bus: Bus, client: httpx.AsyncClient, site: LocalServer
) -> None:
    leases = await bus.js.key_value(DOMAINS_BUCKET)
    policies = await bus.js.key_value(ROBOTS_BUCKET)
    fetcher = Fetcher(
        bus=bus,
        client=client,
        politeness=ReleaseAway(leases, PolitenessConfig(min_delay=0.0, max_delay=10.0)),
        robots_kv=policies,
        limits=FetchLimits(total_timeout=5.0),
        robots_token="TroveBot",
        robots_max_bytes=64 * 1024,
        ack_wait=1.0,  # the pod tries a write again for half of it
    )
    work = page(site)
    try:
        # The work is handed back, to be read again from robots.txt...
        with pytest.raises(nats.errors.TimeoutError):
            await fetcher.process(Job(work), work.to_wire())
        # ... for no policy is left, here or shared, that it would trust without its
        # Crawl-delay...
        assert await fetcher._cached_robots(work.url) is None
    finally:
        fetcher.close()
    assert len(site.requests_to("/robots.txt", HOST)) == 1
    with pytest.raises(KeyNotFoundError):
        await policies.get(_robots_key(origin_of(work.url)))
    # ... and the host is not free without its Crawl-delay: the hold keeps it.
    record = DomainSlot.decode((await leases.get(Politeness.key(HOST))).value, 0.0)
    assert record.busy_until > 0
