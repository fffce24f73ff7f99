"""The cap on the links taken from one page (``TROVE_MAX_LINKS_PER_PAGE``) counts the
links that may bring a page, not those to pages known already: a blog's every page
links to its menu and archive, which would otherwise use up the cap before its posts."""

from __future__ import annotations

import pytest

from tests.discovery.crawl_support import crawled, discoveries, handle
from trove_discovery.discovery import Discovery
from trove_schema.bus import Bus
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import SEEN_BUCKET

pytestmark = pytest.mark.usefixtures("clean")

SITE = "https://site.example"


async def test_links_to_known_pages_do_not_use_up_a_pages_cap(bus: Bus) -> None:
    discovery = Discovery(
        bus=bus,
        seen=await bus.js.key_value(SEEN_BUCKET),
        settings=DiscoverySettings(max_links_per_page=3),
    )
    menu = [f"{SITE}/about", f"{SITE}/archive", f"{SITE}/tags"]
    await handle(discovery, bus, crawled(f"{SITE}/", *menu))
    posts = [f"{SITE}/posts/1", f"{SITE}/posts/2", f"{SITE}/posts/3", f"{SITE}/posts/4"]
    await handle(discovery, bus, crawled(f"{SITE}/archive", *menu, *posts))

    found = [event.url for event in await discoveries(bus)]
    assert found == [*menu, *posts[:3]]  # the cap still holds for new pages
