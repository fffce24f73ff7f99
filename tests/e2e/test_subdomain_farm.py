"""A farm of subdomains: one server that answers every name under its domain, whose pages
link to a dozen of its made-up hosts. Crawled on the open web, it gets pages asked of its
first ``TROVE_SITE_HOST_BUDGET`` names only, where a gap a name would have let every name
ask at once; a blog platform's users on the same kind of server are each their own site.

Discovery, the fetcher and the recorder run as real processes against real NATS and
Postgres; one real HTTP server on one address plays every host, and its own log is the
witness."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.discovery.test_discovery_service import publish_raw
from tests.fetcher._servers import Exchange, LocalServer, serving
from tests.support import outcomes, query, services
from trove_schema.bus import Bus
from trove_schema.topology import DISCOVERY_LINKS, EVENTS_STREAM

pytestmark = pytest.mark.usefixtures("clean")

IP = "127.0.0.186"
FARM = [f"n{k}.farm.test" for k in range(12)]
PLATFORM = [f"user{k}.platform.test" for k in range(6)]
SITE_HOSTS = 4
#: The seed's host and four more of the farm's twelve, and every platform user: more
#: than the site host budget, which they would get if the platform were not one.
EXPECTED = 1 + SITE_HOSTS + len(PLATFORM)


def home(server: LocalServer) -> None:
    links = "".join(f'<a href="{server.url("/", host)}">{host}</a>' for host in FARM + PLATFORM)

    def route(exchange: Exchange) -> None:
        exchange.send(200, f"<title>a farm page</title><p>{links}</p>".encode())

    server.routes["/"] = route
    server.routes["/robots.txt"] = lambda ex: ex.send(
        200, b"User-agent: *\nAllow: /\n", content_type="text/plain"
    )


async def settled(bus: Bus, engine: AsyncEngine) -> bool:
    """Every page discovered is crawled and every crawl's links handled: nothing more
    can come."""
    info = await bus.js.consumer_info(EVENTS_STREAM, DISCOVERY_LINKS)
    rows = await query(
        engine,
        "SELECT count(*) FILTER (WHERE discovered_at IS NOT NULL) AS discovered,"
        " count(*) FILTER (WHERE id IN (SELECT page_id FROM page_crawls)) AS crawled FROM pages",
    )
    handled = info.num_pending == 0 and info.num_ack_pending == 0
    discovered, crawled = int(rows[0].discovered), int(rows[0].crawled)
    return handled and discovered > 1 and discovered == crawled


async def test_a_farm_of_subdomains_is_asked_at_its_first_hosts_only(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    with serving({}, IP) as server:
        home(server)
        env = {
            "TROVE_RESOLVE": ",".join(f"{host}={IP}" for host in FARM + PLATFORM),
            "TROVE_ALLOWED_NETWORKS": f"{IP}/32",
            "TROVE_MIN_DOMAIN_DELAY_SECONDS": "0.2",
            "TROVE_SITE_HOST_BUDGET": str(SITE_HOSTS),
            "TROVE_PLATFORM_DOMAINS": "platform.test",
        }
        async with services(stack, state_dir, env):
            seed = {"url": server.url("/", FARM[0]), "scope": "open"}
            await publish_raw(stack, json.dumps(seed).encode())
            await eventually(
                lambda: outcomes(engine),
                until=lambda r: len(r) >= EXPECTED,
                timeout=60,
                what="the crawls",
            )
            await eventually(
                lambda: settled(bus, engine), until=bool, timeout=60, what="the crawl settled"
            )
            crawled = await outcomes(engine)
        asked = {seen.host for seen in server.seen if seen.path == "/"}

    farm_asked = asked & set(FARM)
    assert FARM[0] in farm_asked
    assert len(farm_asked) == 1 + SITE_HOSTS, sorted(farm_asked)
    assert asked & set(PLATFORM) == set(PLATFORM)
    assert len(crawled) == EXPECTED
    assert set(crawled.values()) == {"success"}
