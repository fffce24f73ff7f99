"""A page named directly (a seed, a shared link) is crawled where it answers, even on
another host; a link found on a page is kept to the crawl's scope."""

from __future__ import annotations

import pytest

from tests.discovery.crawl_support import discovered_after
from trove_discovery.scope import redirected_scope
from trove_schema.bus import Bus
from trove_schema.events import CrawlOutcome, Link, LinkKind, Scope, ScopeKind

pytestmark = pytest.mark.usefixtures("clean")

MOVED = "https://example.org/blog/"
TO_MOVED = [Link(url=MOVED, kind=LinkKind.REDIRECT)]


def test_a_host_or_domain_scope_moves_with_the_redirect_and_a_pattern_stays() -> None:
    host = Scope(kind=ScopeKind.HOST, value="blog.example.net", max_depth=2)
    assert redirected_scope(host, "https://www.example.co.uk/x") == Scope(
        kind=ScopeKind.HOST, value="www.example.co.uk", max_depth=2
    )
    domain = Scope(kind=ScopeKind.DOMAIN, value="example.net", max_depth=2)
    assert redirected_scope(domain, "https://blog.example.co.uk/x") == Scope(
        kind=ScopeKind.DOMAIN, value="example.co.uk", max_depth=2
    )
    pattern = Scope(kind=ScopeKind.PATTERN, value="^https://blog[.]example[.]net/", max_depth=2)
    assert redirected_scope(pattern, MOVED) is None


async def test_a_seed_redirected_to_another_host_is_crawled_there(bus: Bus) -> None:
    seed = Scope(kind=ScopeKind.HOST, value="site.example", max_depth=3)
    found = await discovered_after(bus, TO_MOVED, seed, outcome=CrawlOutcome.REJECTED)
    assert set(found) == {MOVED}
    moved = found[MOVED]
    assert moved.depth == 0
    assert moved.scope == Scope(kind=ScopeKind.HOST, value="example.org", max_depth=3)
    assert moved.provenance.kind == "redirect"


async def test_a_linked_page_redirected_off_the_scope_is_not_followed(bus: Bus) -> None:
    scope = Scope(kind=ScopeKind.HOST, value="site.example", max_depth=3)
    found = await discovered_after(bus, TO_MOVED, scope, depth=1, outcome=CrawlOutcome.REJECTED)
    assert found == {}
