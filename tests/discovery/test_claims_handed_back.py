"""A page whose links were claimed in the seen set but not published (the broker away
at the publish, the pod gone) publishes them all when it comes back: redelivered, or
redriven from the dead letters as a new message, on the replica that remembers its
claims. Most of a page's links are to pages known already and are dropped early; a
page's own claims are not "known", and the links that lead to them still fit within
the cap on links taken from one page."""

from __future__ import annotations

from typing import Any

import pytest
from nats.js.errors import KeyNotFoundError

import trove_discovery.discovery as discovery_module
from tests.discovery.crawl_support import crawled, discoveries, handle
from trove_discovery.discovery import Discovery
from trove_schema.bus import Bus
from trove_schema.events import Event, PageDiscovered, derived_event_id
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import SEEN_BUCKET

pytestmark = pytest.mark.usefixtures("clean")

SITE = "https://site.example"


@pytest.mark.parametrize("deliveries", [2, 1], ids=["redelivered", "redriven"])
async def test_a_page_handed_back_after_its_claims_publishes_them_all(
    bus: Bus, monkeypatch: pytest.MonkeyPatch, deliveries: int
) -> None:
    discovery = Discovery(
        bus=bus,
        seen=await bus.js.key_value(SEEN_BUCKET),
        settings=DiscoverySettings(max_links_per_page=4),
    )
    menu = [f"{SITE}/about", f"{SITE}/archive", f"{SITE}/tags"]
    await handle(discovery, bus, crawled(f"{SITE}/", *menu))
    posts = [f"{SITE}/posts/1", f"{SITE}/posts/2"]
    page = crawled(f"{SITE}/posts/", *menu, *posts)

    publish = bus.publish
    away = True

    async def broker_away_for_pages(event: Event, **options: Any) -> Any:
        if away and isinstance(event, PageDiscovered):
            raise ConnectionError("the broker is away")
        return await publish(event, **options)

    monkeypatch.setattr(bus, "publish", broker_away_for_pages)
    with pytest.raises(ConnectionError):
        await handle(discovery, bus, page)  # the posts claimed, not published
    away = False
    monkeypatch.setattr(discovery_module, "delivery_count", lambda msg: deliveries)
    await handle(discovery, bus, page)

    seen = await bus.js.key_value(SEEN_BUCKET)

    async def claimed_by_the_page(post: str) -> bool:
        try:
            entry = await seen.get(discovery_module._seen_key(post))
        except KeyNotFoundError:
            return False
        return entry.value == derived_event_id(f"{page.id}:{post}", "discovered").encode()

    claimed = [post for post in posts if await claimed_by_the_page(post)]
    assert claimed  # the cap left room for some
    found = [event.url for event in await discoveries(bus)]
    assert found == [*menu, *claimed]
