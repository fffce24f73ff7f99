"""Seeds in the seen set on real NATS: an operator's seed against what links claimed."""

from __future__ import annotations

import json
import time

import pytest

from tests.discovery.crawl_support import PAGE, discoveries, handle, seed
from trove_discovery.discovery import Discovery
from trove_schema.bus import Bus
from trove_schema.events import (
    CrawlCompleted,
    CrawlOutcome,
    Link,
    Scope,
    ScopeKind,
    utcnow,
)
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import SEEN_BUCKET

pytestmark = pytest.mark.usefixtures("clean")

POST = "https://site.example/post"


async def replica(bus: Bus) -> Discovery:
    return Discovery(
        bus=bus, seen=await bus.js.key_value(SEEN_BUCKET), settings=DiscoverySettings()
    )


def linking_to_post() -> CrawlCompleted:
    now = utcnow()
    return CrawlCompleted(
        url=PAGE,
        domain="site.example",
        scope=Scope(kind=ScopeKind.HOST, value="site.example", max_depth=3),
        request_id="work-1",
        outcome=CrawlOutcome.SUCCESS,
        started_at=now,
        completed_at=now,
        links=(Link(url=POST),),
    )


async def test_a_seed_takes_the_place_its_hosts_budget_refused_to_links(bus: Bus) -> None:
    # Links filled the host's budget this cycle and marked the page refused: that says
    # links wait, not that the operator's seed was seen.
    discovery = await replica(bus)
    await discovery._refuse(POST, time.time() + 3600)
    await seed(bus, discovery, POST)
    assert [e.url for e in await discoveries(bus)] == [POST]
    # Its place is the seed's now, for this replica and any other.
    assert not await discovery._first_sighting(POST, "a-link")
    assert not await (await replica(bus))._first_sighting(POST, "another-link")


async def test_a_forced_seed_holds_its_page_against_links_found_before_it_is_fetched(
    bus: Bus,
) -> None:
    # A page never seen (or forgotten): the forced seed is published without asking the
    # seen set. A page linking to it, fetched before it, finds its place taken: one
    # fetch this cycle, at the seed's depth.
    discovery = await replica(bus)
    await seed(bus, discovery, json.dumps({"url": POST, "force": True}))
    await handle(discovery, bus, linking_to_post())
    await handle(await replica(bus), bus, linking_to_post())
    found = await discoveries(bus)
    assert [(e.url, e.depth, e.force) for e in found] == [(POST, 0, True)]
