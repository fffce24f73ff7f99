"""A host's record in ``trove_domains`` (its politeness state, its learned policy) goes
``TROVE_HOST_RECORD_TTL_SECONDS`` after the last request to it, so a crawl that runs for
months keeps the hosts of its recent months, not every host it ever met; a host asked
again meanwhile keeps its record, and one asked after it went starts again from its
priors, never closer to its last request than the gap. Months in seconds here.

The fetcher runs as a real process against real NATS and a real HTTP server that plays
three hosts on one address; the server's own request log is the witness."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from nats.js.errors import KeyNotFoundError

from tests.conftest import StackUrls, eventually
from tests.fetcher._completions import Completions
from tests.fetcher._servers import serving
from tests.support import publish_work, services
from trove_schema.bus import Bus
from trove_schema.events import CrawlOutcome
from trove_schema.topology import DOMAINS_BUCKET
from trove_schema.urls import canonicalize

pytestmark = pytest.mark.usefixtures("clean")

IP = "127.0.0.187"
HOSTS = ("a.records.test", "b.records.test", "c.records.test")
GAP = 2.0
#: Longer than a's two pages take after b's and c's, a gap apart, with seconds to spare
#: for a machine that stalls: b's and c's records are still there when a's are done.
TTL = 14.0


async def test_a_hosts_record_goes_after_its_last_request_and_comes_back_with_the_next(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    routes = {
        "/robots.txt": lambda ex: ex.send(
            200, b"User-agent: *\nAllow: /\n", content_type="text/plain"
        ),
        "/p/1": lambda ex: ex.send(200, b"<title>one</title><p>one</p>"),
        "/p/2": lambda ex: ex.send(200, b"<title>two</title><p>two</p>"),
    }
    with serving(routes, IP) as server:
        a, b, c = ([canonicalize(server.url(p, host)) for p in ("/p/1", "/p/2")] for host in HOSTS)
        env = {
            "TROVE_RESOLVE": ",".join(f"{host}={IP}" for host in HOSTS),
            "TROVE_ALLOWED_NETWORKS": f"{IP}/32",
            "TROVE_MIN_DOMAIN_DELAY_SECONDS": str(GAP),
            "TROVE_MAX_DOMAIN_DELAY_SECONDS": str(GAP),
            "TROVE_GAP_RESPONSE_FACTOR": "0",
            "TROVE_HOST_RECORD_TTL_SECONDS": str(TTL),
            # What a record holds must be shorter than its life, and a pause no
            # shorter than the gap (both checked at start).
            "TROVE_HOST_PAUSE_SECONDS": str(GAP),
            "TROVE_HOST_PAUSE_MAX_SECONDS": str(GAP),
            "TROVE_BAN_PAUSE_SECONDS": str(GAP),
            "TROVE_RATE_PAUSE_SECONDS": str(GAP),
            "TROVE_MAX_BACKOFF_SECONDS": str(GAP),
            "TROVE_HOST_MOVE_RECHECK_SECONDS": "1",
            "TROVE_ROBOTS_TTL_SECONDS": "4",
        }
        completions = Completions(bus.js)
        domains = await bus.js.key_value(DOMAINS_BUCKET)

        async def recorded() -> set[str]:
            # Each host's key read by itself: listing the keys gives up after a short
            # wait for the server's answer, and on a loaded machine said "none" of a
            # bucket that held one.
            held = set()
            for host in HOSTS:
                with contextlib.suppress(KeyNotFoundError):
                    await domains.get(host)
                    held.add(host)
            return held

        async with services(stack, state_dir, env, only=("fetcher",)) as local:
            await publish_work(bus, [b[0], c[0]])
            await completions.wait_for(2)
            # a's two pages, a gap apart: its record is written after b's and c's.
            await publish_work(bus, a)
            await completions.wait_for(4)
            assert await recorded() == set(HOSTS)
            # b and c were left alone for the TTL: gone; a, asked since, still there.
            await eventually(
                recorded, until=lambda keys: keys == {HOSTS[0]}, timeout=30, what="b and c gone"
            )
            await eventually(recorded, until=lambda keys: not keys, timeout=30, what="a gone")
            # Asked again, b starts from its priors, and is crawled as before.
            await publish_work(bus, b[1:])
            events = await completions.wait_for(5)
            assert await recorded() == {HOSTS[1]}
            local.check_alive()

    assert all(event.outcome is CrawlOutcome.SUCCESS for event in events.values()), events
    for host in HOSTS:
        shortest = server.min_gap(host)
        assert shortest is None or shortest >= GAP, host
    # Its robots.txt (and Crawl-delay) went before its record: read again before its page.
    paths = [s.path for s in server.requests_for(HOSTS[1])]
    assert paths == ["/robots.txt", "/p/1", "/robots.txt", "/p/2"]
