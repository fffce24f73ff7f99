"""A page named directly (a seed, a shared link) is crawled where it answers, even on
another host; a link found on a page is kept to the crawl's scope and depth, and off
private addresses."""

from __future__ import annotations

import pytest

from tests.discovery.crawl_support import PAGE, discovered_after
from trove_discovery.scope import in_scope, redirected_scope
from trove_schema.bus import Bus
from trove_schema.events import (
    MAX_SAME_PAGE_HOPS,
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
from trove_schema.settings import DiscoverySettings

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


@pytest.mark.parametrize(
    ("target", "own", "other"),
    [
        (
            "https://medium.com/@john.doe",
            "https://medium.com/@john.doe/post",
            "https://medium.com/@someone_else/post",
        ),
        (
            "https://linktr.ee/john.doe",
            "https://linktr.ee/john.doe?tab=links",
            "https://linktr.ee/jane",
        ),
        (
            "https://tilde.example/~ann.lee",
            "https://tilde.example/~ann.lee/notes",
            "https://tilde.example/~bob/notes",
        ),
        # A file's extension still names the site's directory: a page, an action, a feed.
        (
            "https://moved.example/blog/index.html",
            "https://moved.example/blog/post-1",
            "https://moved.example/",
        ),
        (
            "https://www.gov.example/portal/home.do",
            "https://www.gov.example/portal/news.do",
            "https://www.gov.example/other/",
        ),
        (
            "https://new.example/blog/index.xml",
            "https://new.example/blog/posts/hello/",
            "https://new.example/about/",
        ),
    ],
)
def test_a_dot_in_a_users_name_is_no_file_and_keeps_the_scope_to_the_user(
    target: str, own: str, other: str
) -> None:
    host = Scope(kind=ScopeKind.HOST, value="blog.john.example", max_depth=2)
    moved = redirected_scope(host, target)
    assert moved is not None
    assert (in_scope(target, moved), in_scope(own, moved), in_scope(other, moved)) == (
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


def hops(scope: Scope | None, n: int) -> Scope:
    """``scope`` as it goes on after ``n`` of a page's other names in a row."""
    assert scope is not None
    return scope.model_copy(update={"same_page_hops": n})


async def test_a_seed_redirected_to_another_host_is_crawled_there(bus: Bus) -> None:
    seed = Scope(kind=ScopeKind.HOST, value="site.example", max_depth=3)
    found = await discovered_after(bus, TO_MOVED, seed, outcome=CrawlOutcome.REJECTED)
    assert set(found) == {MOVED}
    moved = found[MOVED]
    assert moved.depth == 0
    assert moved.scope == hops(redirected_scope(seed, MOVED), 1)
    assert moved.provenance.kind == "redirect"


async def test_a_seed_redirected_to_a_user_on_a_platform_follows_that_users_links_only(
    bus: Bus,
) -> None:
    seed = Scope(kind=ScopeKind.HOST, value="blog.john.example", max_depth=2)
    user = "https://medium.com/@john.doe"
    to_user = [Link(url=user, kind=LinkKind.REDIRECT)]
    found = await discovered_after(bus, to_user, seed, outcome=CrawlOutcome.REJECTED)
    moved = found[user].scope
    own, other = f"{user}/post", "https://medium.com/@someone_else/post"
    found = await discovered_after(bus, [Link(url=own), Link(url=other)], moved)
    assert set(found) == {user, own}
    assert found[own].scope == hops(moved, 0)  # an ordinary link counts a step again


async def test_a_linked_page_redirected_off_the_scope_is_not_followed(bus: Bus) -> None:
    scope = Scope(kind=ScopeKind.HOST, value="site.example", max_depth=3)
    found = await discovered_after(bus, TO_MOVED, scope, depth=1, outcome=CrawlOutcome.REJECTED)
    assert found == {}


def refreshes(*urls: str) -> list[Link]:
    return [Link(url=url, kind=LinkKind.REDIRECT) for url in urls]


async def test_only_a_pages_first_refresh_is_the_page_under_another_name(bus: Bus) -> None:
    # A seed page carrying many refresh tags: the first is where it answers, each other
    # one an ordinary link, kept to the seed's scope and depth.
    seed = Scope(kind=ScopeKind.HOST, value="site.example", max_depth=1)
    others = [f"https://host{n}.other.example/" for n in range(20)]
    links = refreshes(MOVED, *others, "https://site.example/next")
    found = await discovered_after(bus, links, seed)
    assert {url: e.depth for url, e in found.items()} == {
        MOVED: 0,
        "https://site.example/next": 1,
    }
    assert found[MOVED].scope == hops(redirected_scope(seed, MOVED), 1)
    assert found["https://site.example/next"].scope == seed
    # Recorded as what it was to the page: its redirect, and a link.
    assert found[MOVED].provenance.kind == "redirect"
    assert found["https://site.example/next"].provenance.kind == "link"


async def test_a_refresh_that_names_a_new_url_at_every_visit_does_not_lead_on_at_one_depth(
    bus: Bus,
) -> None:
    # `/live` refreshes to `/live?t=<now>`, which refreshes to the next time, and so on:
    # each is the page under another name, until a chain of them counts a step of depth.
    scope = Scope(kind=ScopeKind.HOST, value="site.example", max_depth=2)
    depth, chain = 1, []
    for n in range(4 * MAX_SAME_PAGE_HOPS):
        target = f"https://site.example/live?t={n}"
        found = await discovered_after(
            bus, refreshes(target), scope, depth=depth, outcome=CrawlOutcome.REJECTED
        )
        if target not in found:
            break
        depth, scope = found[target].depth, found[target].scope
        chain.append((depth, scope.same_page_hops))
    named = range(1, MAX_SAME_PAGE_HOPS + 1)
    # Then the last depth's names, and the next step is past the crawl's depth.
    assert chain == [(1, n) for n in named] + [(2, 0)] + [(2, n) for n in named]


async def test_a_page_not_fetched_redirects_where_it_answered(bus: Bus) -> None:
    # The fetcher adds the redirect it was answered last.
    seed = Scope(kind=ScopeKind.HOST, value="site.example", max_depth=0)
    links = refreshes("https://elsewhere.example/", MOVED)
    found = await discovered_after(bus, links, seed, outcome=CrawlOutcome.REJECTED)
    assert set(found) == {MOVED}
    assert found[MOVED].scope == hops(redirected_scope(seed, MOVED), 1)


async def test_a_nofollow_page_leads_to_its_own_redirect_only(bus: Bus) -> None:
    scope = Scope(kind=ScopeKind.HOST, value="site.example", max_depth=3)
    # Each marked nofollow, as the fetcher marks every link of a nofollow page, its
    # refresh too: the "moved" stub (noindex, nofollow and a refresh) led nowhere.
    links = [
        Link(url=link.url, kind=link.kind, nofollow=True)
        for link in refreshes("https://site.example/moved", "https://site.example/other")
    ]
    found = await discovered_after(bus, links, scope, nofollow=True)
    assert set(found) == {"https://site.example/moved"}


async def test_an_extra_canonical_link_is_an_ordinary_link(bus: Bus) -> None:
    # At the crawl's last depth, only the page's own canonical (the first) is the page.
    scope = Scope(kind=ScopeKind.OPEN, max_depth=2)
    own = "https://site.example/canonical"
    extra = ["https://site.example/extra", "https://other.example/x"]
    links = [Link(url=url, kind=LinkKind.CANONICAL) for url in (own, *extra)]
    found = await discovered_after(bus, links, scope, depth=2, canonical_url=own)
    assert {url: e.depth for url, e in found.items()} == {own: 2}


async def test_an_extra_canonical_link_one_level_up_is_followed_one_level_down(bus: Bus) -> None:
    scope = Scope(kind=ScopeKind.HOST, value="site.example", max_depth=2)
    own, extra = "https://site.example/canonical", "https://site.example/extra"
    links = [Link(url=url, kind=LinkKind.CANONICAL) for url in (own, extra, MOVED)]
    found = await discovered_after(bus, links, scope, depth=1, canonical_url=own)
    assert {url: e.depth for url, e in found.items()} == {own: 1, extra: 2}


PRIVATE = [
    "http://10.1.2.3/",
    "http://192.168.0.9/admin",
    "http://[fd00::1]/",
    "http://127.0.0.1:8080/",
]


async def test_links_to_private_addresses_are_not_discovered(bus: Bus) -> None:
    scope = Scope(kind=ScopeKind.OPEN, max_depth=3)
    links = [Link(url=url) for url in [*PRIVATE, "https://site.example/ok"]]
    links += refreshes("http://10.9.9.9/")
    settings = DiscoverySettings(allowed_networks=())
    found = await discovered_after(bus, links, scope, settings=settings)
    assert set(found) == {"https://site.example/ok"}


async def test_links_inside_the_allowed_networks_are_discovered(bus: Bus) -> None:
    scope = Scope(kind=ScopeKind.OPEN, max_depth=3)
    links = [Link(url=url) for url in PRIVATE]
    settings = DiscoverySettings(allowed_networks=("127.0.0.0/8",))
    found = await discovered_after(bus, links, scope, settings=settings)
    assert set(found) == {"http://127.0.0.1:8080/"}


async def test_a_page_s_link_to_itself_is_no_new_page(bus: Bus) -> None:
    # A forced seed, never discovered: its logo links home. Its own re-crawl asks for it
    # again; a second PageDiscovered would crawl it twice, the second time a level deeper.
    seed = Scope(kind=ScopeKind.HOST, value="site.example", max_depth=1)
    found = await discovered_after(bus, [Link(url=PAGE), Link(url=PAGE + "about")], seed)
    assert set(found) == {PAGE + "about"}
