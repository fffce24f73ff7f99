"""Every page a crawled page claims in the seen set is published, on whichever handling.

A page whose links were claimed but not published (the broker away at the publish, the
pod gone) publishes them all when it comes back: redelivered, redriven from the dead
letters as a new message, or on another replica. Links to pages a replica remembers as
claimed by another cause are dropped before their claim; the page's own claims are not
among them, and each link counts toward the cap on links taken from one page as it did.
"""

from __future__ import annotations

from typing import Any

import pytest
from nats.js.errors import KeyNotFoundError

import trove_discovery.discovery as discovery_module
from tests.discovery.crawl_support import crawled, discoveries, handle
from trove_discovery.discovery import Discovery
from trove_schema.bus import Bus
from trove_schema.events import CrawlCompleted, Event, PageDiscovered, derived_event_id
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import SEEN_BUCKET

pytestmark = pytest.mark.usefixtures("clean")

SITE = "https://site.example"
POSTS = [f"{SITE}/posts/1", f"{SITE}/posts/2", f"{SITE}/posts/3"]
#: The page's links before its posts: a link to a page known already, to itself (it is
#: re-crawled), the same link twice.
SHAPES = {
    "known page": [f"{SITE}/about"],
    "itself": [f"{SITE}/posts/", f"{SITE}/about"],
    "twice": [f"{SITE}/about", f"{SITE}/about"],
}


async def replica(bus: Bus, cap: int) -> Discovery:
    seen = await bus.js.key_value(SEEN_BUCKET)
    return Discovery(bus=bus, seen=seen, settings=DiscoverySettings(max_links_per_page=cap))


async def claimed_by(bus: Bus, page: CrawlCompleted, urls: list[str]) -> list[str]:
    """Those of ``urls`` whose place in the seen set ``page`` holds."""
    seen = await bus.js.key_value(SEEN_BUCKET)
    held = []
    for url in urls:
        try:
            entry = await seen.get(discovery_module._seen_key(url))
        except KeyNotFoundError:
            continue
        if entry.value == derived_event_id(f"{page.id}:{url}", "discovered").encode():
            held.append(url)
    return held


async def handled_with_the_broker_away(
    bus: Bus, discovery: Discovery, page: CrawlCompleted, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish = bus.publish

    async def away_for_pages(event: Event, **options: Any) -> Any:
        if isinstance(event, PageDiscovered):
            raise ConnectionError("the broker is away")
        return await publish(event, **options)

    monkeypatch.setattr(bus, "publish", away_for_pages)
    with pytest.raises(ConnectionError):
        await handle(discovery, bus, page)
    monkeypatch.setattr(bus, "publish", publish)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("again", ["redelivered", "redriven", "on another replica"])
async def test_a_page_handed_back_after_its_claims_publishes_them_all(
    bus: Bus, monkeypatch: pytest.MonkeyPatch, shape: str, again: str
) -> None:
    first = await replica(bus, cap=3)
    # Another page claimed /about, on a replica of its own; this one then learnt it, and
    # claimed /posts/ (from /archive).
    await handle(await replica(bus, cap=3), bus, crawled(f"{SITE}/", f"{SITE}/about"))
    page = crawled(f"{SITE}/posts/", *SHAPES[shape], *POSTS)
    await handle(first, bus, crawled(f"{SITE}/archive", f"{SITE}/about", page.url))
    await handled_with_the_broker_away(bus, first, page, monkeypatch)
    claimed = await claimed_by(bus, page, POSTS)
    assert claimed == POSTS[:2]  # /about counts toward the cap, known or not

    later = await replica(bus, cap=3) if again == "on another replica" else first
    deliveries = 2 if again == "redelivered" else 1
    monkeypatch.setattr(discovery_module, "delivery_count", lambda msg: deliveries)
    await handle(later, bus, page)

    published = [event.url for event in await discoveries(bus)]
    assert set(claimed) <= set(published)
