"""A page named directly (a seed, a shared link) is crawled where it answers, even on
another host; a link found on a page is kept to the crawl's scope."""

from __future__ import annotations

import pytest

from tests.discovery.crawl_support import discovered_after
from trove_discovery.scope import in_scope, redirected_scope
from trove_schema.bus import Bus
from trove_schema.events import (
    MAX_SCOPE_MOVES,
    CrawlOutcome,
    Link,
    LinkKind,
    PageDiscovered,
    Provenance,
    Scope,
    ScopeKind,
    decode_event,
)

pytestmark = pytest.mark.usefixtures("clean")

MOVED = "https://example.org/blog/"
TO_MOVED = [Link(url=MOVED, kind=LinkKind.REDIRECT)]
SEED = Provenance(kind="seed")


def test_a_scope_moves_to_the_targets_host_and_subtree() -> None:
    host = Scope(kind=ScopeKind.HOST, value="blog.example.net", max_depth=2)
    moved = redirected_scope(host, MOVED)
    assert moved is not None
    assert (moved.kind, moved.max_depth, moved.moves) == (ScopeKind.PATTERN, 2, 1)
    inside = [f"{MOVED}post", "http://www.example.org:8080/blog/x", MOVED]
    outside = ["https://example.org/other", "https://example.org/blogx", "https://evil.org/blog/"]
    assert [in_scope(url, moved) for url in inside + outside] == [True] * 3 + [False] * 3


@pytest.mark.parametrize(
    ("target", "inside", "outside"),
    [
        # A platform's other sites stay out, whether the target ends in a slash or not.
        (
            "https://sites.example/view/x",
            "https://sites.example/view/x/about",
            "https://sites.example/view/xy",
        ),
        (
            "https://social.example/@ann",
            "https://social.example/@ann?page=2",
            "https://social.example/@bob",
        ),
        (
            "http://[2001:db8::1]/blog/",
            "http://[2001:db8::1]:8080/blog/p",
            "http://[2001:db8::2]/blog/",
        ),
        # A file's directory: the site it is the home page of.
        (
            "https://moved.example/blog/index.html",
            "https://moved.example/blog/post-1",
            "https://moved.example/shop/",
        ),
    ],
)
def test_a_moved_scope_holds_the_target_and_what_lies_under_it(
    target: str, inside: str, outside: str
) -> None:
    domain = Scope(kind=ScopeKind.DOMAIN, value="example.net", max_depth=2)
    moved = redirected_scope(domain, target)
    assert moved is not None
    assert (in_scope(target, moved), in_scope(inside, moved), in_scope(outside, moved)) == (
        True,
        True,
        False,
    )


def test_a_scope_moves_along_a_chain_of_redirects_a_few_times_and_a_pattern_given_never() -> None:
    scope: Scope | None = Scope(kind=ScopeKind.HOST, value="short.example", max_depth=0)
    hops = [f"https://hop{n}.example/x" for n in range(MAX_SCOPE_MOVES + 1)]
    moves = []
    for hop in hops:
        assert scope is not None
        scope = redirected_scope(scope, hop)
        moves.append(None if scope is None else scope.moves)
    assert moves == [*range(1, MAX_SCOPE_MOVES + 1), None]
    given = Scope(kind=ScopeKind.PATTERN, value="^https://blog[.]example[.]net/", max_depth=2)
    assert redirected_scope(given, MOVED) is None


def test_a_scope_moved_more_often_than_this_release_allows_is_read_and_moves_no_more() -> None:
    # Written by a release with a higher bound: read, not parked; a scope never moved is
    # written as before, without the count.
    moved = Scope(kind=ScopeKind.PATTERN, value="^https://x[.]example/", moves=MAX_SCOPE_MOVES + 4)
    event = PageDiscovered(url=MOVED, domain="example.org", scope=moved, provenance=SEED)
    read = decode_event(event.to_wire())
    assert isinstance(read, PageDiscovered)
    assert read.scope == moved
    assert redirected_scope(read.scope, "https://y.example/") is None
    plain = PageDiscovered(url=MOVED, domain="example.org", scope=Scope(), provenance=SEED)
    assert b"moves" not in plain.to_wire()


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
