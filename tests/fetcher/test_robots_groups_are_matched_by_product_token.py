"""robots.txt groups are TroveBot's when their product token is TroveBot (RFC 9309 2.2.1).

A group applies to TroveBot when its user-agent's product token (the value up to the
first character that is not a letter, "_" or "-") is ``TroveBot``, in any case and in
any spelling of the field protego reads; several such groups are one; with none, the
``*`` group applies. A group named after a prefix of the token (``Trove``, ``T``) is
another crawler's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.fetcher._servers import Exchange, LocalServer, Route, serving
from trove_fetcher.robots import RobotsPolicy, RobotsRule, fetch_robots
from trove_fetcher.transport import build_client
from trove_schema.settings import FetcherSettings
from trove_schema.urls import canonicalize

SITE = "https://site.example"
CAP = 512 * 1024

# A site that keeps every crawler out but one it names after a prefix of TroveBot.
PREFIX_GROUP_AFTER_STAR = b"""\
User-agent: *
Disallow: /
Crawl-delay: 60

User-agent: Trove
Allow: /
Crawl-delay: 1
"""


def policy_of(body: bytes) -> RobotsPolicy:
    return RobotsPolicy(origin=SITE, rule=RobotsRule.PARSED, fetched_at=0.0, body=body)


def test_a_group_named_after_a_prefix_of_trovebot_is_another_crawlers() -> None:
    policy = policy_of(PREFIX_GROUP_AFTER_STAR)
    assert not policy.allows(f"{SITE}/")
    assert not policy.allows(f"{SITE}/blog/post")
    assert policy.crawl_delay() == 60.0
    # The crawler it names keeps its own group.
    assert policy.allows(f"{SITE}/blog/post", "Trove")
    assert policy.crawl_delay("Trove") == 1.0


def test_a_one_letter_group_before_the_star_group_is_another_crawlers() -> None:
    policy = policy_of(b"User-agent: T\nAllow: /\n\nUser-agent: *\nDisallow: /\n")
    assert not policy.allows(f"{SITE}/page")


@pytest.mark.parametrize("name", ["Trove", "Trove*", "*TroveBot", "Tr*veBot", "T"])
def test_the_star_group_alone_applies_when_no_group_is_trovebots(name: str) -> None:
    body = f"User-agent: {name}\nAllow: /\n\nUser-agent: *\nDisallow: /private/\n"
    policy = policy_of(body.encode())
    assert not policy.allows(f"{SITE}/private/page")
    assert policy.allows(f"{SITE}/public/page")


def test_no_group_applies_when_none_is_trovebots_and_there_is_no_star_group() -> None:
    policy = policy_of(b"User-agent: Trove\nDisallow: /\nCrawl-delay: 30\n")
    assert policy.allows(f"{SITE}/page")
    assert policy.crawl_delay() is None


@pytest.mark.parametrize(
    "line",
    [
        "Useragent: TroveBot/1.0",
        "User agent: TroveBot/1.0",
        "user agent TroveBot/1.0",
        "USERAGENT:trovebot/2.1 (+https://example.org/bot)",
    ],
)
def test_a_versioned_trovebot_group_is_trovebots_in_any_spelling_of_user_agent(
    line: str,
) -> None:
    body = f"User-agent: *\nAllow: /\n\n{line}\nDisallow: /\nCrawl-delay: 30\n"
    policy = policy_of(body.encode())
    assert not policy.allows(f"{SITE}/page")
    assert policy.crawl_delay() == 30.0
    assert policy.allows(f"{SITE}/page", "OtherBot")


def test_a_trovebot_group_wins_over_the_star_group_and_a_prefix_group_before_it() -> None:
    body = (
        b"User-agent: Trove\nAllow: /\n\n"
        b"User-agent: *\nAllow: /\nCrawl-delay: 60\n\n"
        b"User agent TroveBot/3\nDisallow: /drafts/\nCrawl-delay: 5\n"
    )
    policy = policy_of(body)
    assert not policy.allows(f"{SITE}/drafts/one")
    assert policy.allows(f"{SITE}/posts/one")
    assert policy.crawl_delay() == 5.0


def test_two_trovebot_groups_are_combined() -> None:
    body = (
        b"User-agent: TroveBot\nDisallow: /a/\n\n"
        b"User-agent: *\nDisallow: /\n\n"
        b"Useragent: trovebot/1.0\nDisallow: /b/\n"
    )
    policy = policy_of(body)
    assert not policy.allows(f"{SITE}/a/page")
    assert not policy.allows(f"{SITE}/b/page")
    assert policy.allows(f"{SITE}/c/page")


def test_the_query_orders_are_checked_against_the_star_group_too() -> None:
    """The canonical order ``page=2&q=cats`` passes ``*``'s rule; the linked order
    ``q=cats&page=2`` does not, and is checked in the same group."""
    body = b"User-agent: Trove\nDisallow: /nothing\n\nUser-agent: *\nDisallow: /search?q=\n"
    policy = policy_of(body)
    url = canonicalize(f"{SITE}/search?q=cats&page=2")
    assert url == f"{SITE}/search?page=2&q=cats"
    assert not policy.allows(url)
    assert policy.allows(f"{SITE}/search?page=2&sort=new")


# Through a real server: the file as fetched and stored ---------------------------


def _text(body: bytes) -> Route:
    def route(exchange: Exchange) -> None:
        exchange.send(200, body, content_type="text/plain")

    return route


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    with serving({"prefix.trove.test/robots.txt": _text(PREFIX_GROUP_AFTER_STAR)}) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    settings = FetcherSettings(
        allowed_networks=("127.0.0.1/32",), resolve=("prefix.trove.test=127.0.0.1",)
    )
    async with build_client(settings) as built:
        yield built


async def test_a_fetched_robots_txt_with_a_prefix_group_is_read_by_its_star_group(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    origin = f"http://prefix.trove.test:{server.port}"
    fetched = await fetch_robots(client, origin, max_bytes=CAP)
    assert fetched.rule is RobotsRule.PARSED
    for policy in (fetched, RobotsPolicy.from_bytes(fetched.to_bytes())):
        assert not policy.allows(f"{origin}/blog/post", "TroveBot")
        assert policy.crawl_delay("TroveBot") == 60.0
