"""robots.txt grows old on the pods' shared clock, not on the node's; and one that
answered "wait" is not asked for again before the wait is over.

A policy one pod fetched is read by every pod from the shared bucket, so its age must
be judged on the clock they share (nats-server's, ``trove_fetcher.clock``): a pod whose
own clock ran behind would otherwise obey a robots.txt past its TTL, as long as its
clock is behind. Here the shared time moves on by more than the TTL while the node's
clock does not, and the site's new robots.txt is obeyed at once. The ``Fetcher`` runs
in the test's process against real NATS and a real HTTP server, whose request log is
the evidence.

A robots.txt answered with a 429 or a 503 disallows everything for a short while
(``RETRY_TTL``), and says the host is busy: the host is paused as after a page's
answer, so when the short while is over robots.txt is not asked again while the site
still said to wait.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.fetcher._completions import Completions
from tests.fetcher._servers import Exchange, LocalServer, serving
from trove_fetcher.fetcher import Fetcher, Job
from trove_fetcher.http import FetchLimits
from trove_fetcher.politeness import POLICY_KEY, Politeness, PolitenessConfig
from trove_fetcher.transport import build_client
from trove_schema.bus import Bus
from trove_schema.events import CrawlOutcome, PageDiscovered, Provenance, Scope
from trove_schema.policy import HostPolicy
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
    robots = {
        "body": b"User-agent: *\nAllow: /\n",
        "status": b"200",
        "retry-after": b"",
        "mitigated": b"",
    }

    def robots_txt(ex: Exchange) -> None:
        wait, mitigated = robots["retry-after"].decode(), robots["mitigated"].decode()
        headers = {"Retry-After": wait} if wait else {}
        if mitigated:
            headers["cf-mitigated"] = mitigated
        ex.send(int(robots["status"]), robots["body"], headers, content_type="text/plain")

    routes = {
        f"{HOST}/robots.txt": robots_txt,
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


async def fetcher_on(
    bus: Bus, client: httpx.AsyncClient, clock: SharedClock, robots_ttl: float = TTL
) -> Fetcher:
    return Fetcher(
        bus=bus,
        client=client,
        politeness=Politeness(
            await bus.js.key_value(DOMAINS_BUCKET), PolitenessConfig(min_delay=0.05)
        ),
        robots_kv=await bus.js.key_value(ROBOTS_BUCKET),
        limits=FetchLimits(total_timeout=5.0),
        robots_token="TroveBot",
        robots_max_bytes=64 * 1024,
        robots_ttl=robots_ttl,
        clock=clock,
    )


async def test_robots_txt_is_read_again_once_its_ttl_has_passed_on_the_shared_clock(
    bus: Bus, client: httpx.AsyncClient, site: tuple[LocalServer, dict[str, bytes]]
) -> None:
    server, robots = site
    clock = SharedClock()
    fetcher = await fetcher_on(bus, client, clock)
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


@pytest.mark.parametrize(
    ("status", "retry_after", "reason"),
    [
        (429, "3600", "rate_limited (Retry-After)"),
        (503, "", "unavailable"),
        (403, "", "blocked_captcha"),  # a challenge (cf-mitigated): a ban's day
    ],
)
async def test_a_robots_txt_that_says_wait_pauses_its_host_past_the_fallbacks_expiry(
    bus: Bus,
    client: httpx.AsyncClient,
    site: tuple[LocalServer, dict[str, bytes]],
    status: int,
    retry_after: str,
    reason: str,
) -> None:
    server, robots = site
    robots["status"], robots["retry-after"] = str(status).encode(), retry_after.encode()
    if status == 403:
        robots["mitigated"] = b"challenge"
    clock = SharedClock()
    # The fallback holds 20 s; the pause is an hour (the Retry-After) or about a minute
    # (a 503's first pause, ``TROVE_RATE_PAUSE_SECONDS``).
    fetcher = await fetcher_on(bus, client, clock, robots_ttl=20.0)
    first, second = work(server, "/first"), work(server, "/second")
    try:
        await fetcher.process(Job(first), first.to_wire())
        clock.ahead = 21.0  # the fallback is over; the pause is not
        await fetcher.process(Job(second), second.to_wire())
    finally:
        fetcher.close()

    events = await Completions(bus.js).wait_for(1, timeout=10)
    assert events[first.url].outcome is CrawlOutcome.FAILED
    assert second.url not in events  # deferred to the pause's end, not failed
    assert len(server.requests_to("/robots.txt", HOST)) == 1
    assert server.requests_for(HOST) == server.requests_to("/robots.txt", HOST)
    entry = await (await bus.js.key_value(DOMAINS_BUCKET)).get(HOST)
    policy = HostPolicy.from_json(json.loads(entry.value or b"{}").get(POLICY_KEY))
    assert policy.pause_reason == reason
    asked = {429: 3600.0, 503: 54.0, 403: 86_400.0}[status]  # 503: a minute, less its jitter
    assert policy.paused_until - time.time() >= asked - 30.0


async def test_a_robots_txt_that_cannot_be_read_keeps_the_crawl_delay_the_last_one_gave(
    bus: Bus, client: httpx.AsyncClient, site: tuple[LocalServer, dict[str, bytes]]
) -> None:
    server, robots = site
    robots["body"] = b"User-agent: *\nCrawl-delay: 5\n"
    clock = SharedClock()
    fetcher = await fetcher_on(bus, client, clock, robots_ttl=20.0)
    first, second = work(server, "/first"), work(server, "/second")
    domains = await bus.js.key_value(DOMAINS_BUCKET)
    try:
        await fetcher.process(Job(first), first.to_wire())
        before = json.loads((await domains.get(HOST)).value or b"{}")
        robots["status"] = b"500"  # the file read again, and unreadable for now
        clock.ahead = 21.0
        await fetcher.process(Job(second), second.to_wire())
    finally:
        fetcher.close()
    after = json.loads((await domains.get(HOST)).value or b"{}")
    assert len(server.requests_to("/robots.txt", HOST)) == 2
    assert before["gap"] == 5.0
    assert after["gap"] == 5.0
