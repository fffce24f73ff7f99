"""Which IndieWeb links discovery follows: rel=me within the scope, Webmention endpoints never.

Real NATS: discovery handles a ``CrawlCompleted`` and what it publishes is read back
from the events stream; then the whole pipeline, as processes, against a sandbox page.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import nats
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.discovery.crawl_support import PAGE, discovered_after
from tests.support import outcomes, query, sandbox_env, services
from trove_discovery.discovery import FOLLOWED_KINDS
from trove_sandbox.server import serve_sandbox
from trove_sandbox.web import SandboxWeb
from trove_schema.bus import Bus
from trove_schema.events import (
    Link,
    LinkKind,
    Scope,
    ScopeKind,
)
from trove_schema.topology import SEEDS_SUBJECT

pytestmark = pytest.mark.usefixtures("clean")

HOST = Scope(kind=ScopeKind.HOST, value="site.example", max_depth=3)
OPEN = Scope(kind=ScopeKind.OPEN, max_depth=3)


def test_rel_me_is_followed_and_webmention_never() -> None:
    assert LinkKind.ME in FOLLOWED_KINDS
    assert LinkKind.WEBMENTION not in FOLLOWED_KINDS


async def test_me_links_are_followed_like_a_links_within_the_scope(bus: Bus) -> None:
    found = await discovered_after(
        bus,
        [
            Link(url="https://site.example/about", kind=LinkKind.ME),
            Link(url="https://social.example/@ann", kind=LinkKind.ME),
            Link(url="https://site.example/hidden", kind=LinkKind.ME, nofollow=True),
            Link(url="https://site.example/wm", kind=LinkKind.WEBMENTION),
            Link(url="https://site.example/post", kind=LinkKind.A),
        ],
        HOST,
    )
    assert set(found) == {"https://site.example/about", "https://site.example/post"}
    about = found["https://site.example/about"]
    assert about.depth == 1
    assert about.provenance.kind == "link"
    assert about.provenance.source_url == PAGE


async def test_an_open_crawl_follows_me_to_other_sites_but_not_webmention(bus: Bus) -> None:
    found = await discovered_after(
        bus,
        [
            Link(url="https://social.example/@ann", kind=LinkKind.ME),
            Link(url="https://hooks.example/webmention", kind=LinkKind.WEBMENTION),
        ],
        OPEN,
    )
    assert set(found) == {"https://social.example/@ann"}


INDIE_PAGE = """<!DOCTYPE html><html><head><title>Ann</title>
<link rel="me" href="/about.html"><link rel="webmention" href="/webmention">
</head><body><p>Notes from Ann's garden.</p>
<a rel="me nofollow" href="/hidden.html">elsewhere</a> <a href="/post.html">a post</a>
</body></html>"""


async def test_a_crawl_records_me_and_webmention_and_never_fetches_the_endpoint(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    web = SandboxWeb.generate(hosts=1, pages_per_host=1)
    host = web.hosts[0].name
    web.set_robots(host, "User-agent: *\nAllow: /\n")
    for path in ("/about.html", "/hidden.html", "/post.html", "/webmention"):
        web.add_page(host, path, f"<title>{path}</title><p>page {path}</p>")
    web.add_page(host, "/indie.html", INDIE_PAGE)
    async with serve_sandbox(web) as running, services(stack, state_dir, sandbox_env(web, 0.1)):
        seed = web.url(host, "/indie.html")
        nc = await nats.connect(stack.nats_url)
        await nc.publish(SEEDS_SUBJECT, json.dumps({"url": seed}).encode())
        await nc.flush()
        await nc.close()

        async def fetched() -> set[str]:
            return {urlsplit(url).path for url in await outcomes(engine)}

        await eventually(
            fetched,
            until=lambda paths: {"/indie.html", "/about.html", "/post.html"} <= paths,
            timeout=60,
            what="the seed and the pages it links to fetched",
        )
        # The post is the page's last link: by its crawl, discovery had passed the rest.
        edges = await query(
            engine,
            "SELECT t.url, l.kind, l.nofollow FROM page_links l "
            "JOIN pages f ON f.id = l.from_page_id JOIN pages t ON t.id = l.to_page_id "
            "WHERE f.url = :seed",
            seed=seed,
        )
        never = await query(
            engine,
            "SELECT url FROM pages WHERE discovered_at IS NOT NULL AND url LIKE ANY(:paths)",
            paths=["%/webmention", "%/hidden.html"],
        )
        requested = running.witness.paths(host)
    assert {(urlsplit(url).path, kind, nofollow) for url, kind, nofollow in edges} == {
        ("/about.html", "me", False),
        ("/webmention", "webmention", False),
        ("/hidden.html", "me", True),
        ("/post.html", "a", False),
    }
    assert never == []
    assert "/webmention" not in requested
    assert "/hidden.html" not in requested
