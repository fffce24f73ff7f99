"""A page named directly (a seed, a shared link) is crawled where it answers, even on
another host; a link found on a page is kept to the crawl's scope."""

from __future__ import annotations

import pytest

from tests.discovery.crawl_support import discovered_after
from trove_discovery.scope import in_scope, redirected_scope
from trove_schema.bus import Bus
from trove_schema.events import CrawlOutcome, Link, LinkKind, Scope, ScopeKind

pytestmark = pytest.mark.usefixtures("clean")

MOVED = "https://example.org/blog/"
TO_MOVED = [Link(url=MOVED, kind=LinkKind.REDIRECT)]


def test_a_scope_moves_to_the_targets_host_and_directory_once() -> None:
    host = Scope(kind=ScopeKind.HOST, value="blog.example.net", max_depth=2)
    moved = redirected_scope(host, MOVED)
    assert moved is not None
    assert (moved.kind, moved.max_depth) == (ScopeKind.PATTERN, 2)
    inside = [f"{MOVED}post", "http://www.example.org:8080/blog/x", MOVED]
    outside = ["https://example.org/other", "https://example.org/blogx", "https://evil.org/blog/"]
    assert [in_scope(url, moved) for url in inside + outside] == [True] * 3 + [False] * 3
    # A platform's other sites stay out; a domain scope moves the same way.
    domain = Scope(kind=ScopeKind.DOMAIN, value="example.net", max_depth=2)
    platform = redirected_scope(domain, "https://sites.example/view/x/")
    assert platform is not None
    assert in_scope("https://sites.example/view/x/about", platform)
    assert not in_scope("https://sites.example/view/y/", platform)
    # Moved once: a redirect on from there is not followed off the pattern.
    assert redirected_scope(moved, "https://elsewhere.example/") is None


async def test_a_seed_redirected_to_another_host_is_crawled_there(bus: Bus) -> None:
    seed = Scope(kind=ScopeKind.HOST, value="site.example", max_depth=3)
    found = await discovered_after(bus, TO_MOVED, seed, outcome=CrawlOutcome.REJECTED)
    assert set(found) == {MOVED}
    moved = found[MOVED]
    assert moved.depth == 0
    assert moved.scope == redirected_scope(seed, MOVED)
    assert moved.provenance.kind == "redirect"


async def test_a_linked_page_redirected_off_the_scope_is_not_followed(bus: Bus) -> None:
    scope = Scope(kind=ScopeKind.HOST, value="site.example", max_depth=3)
    found = await discovered_after(bus, TO_MOVED, scope, depth=1, outcome=CrawlOutcome.REJECTED)
    assert found == {}
