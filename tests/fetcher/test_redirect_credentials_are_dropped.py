"""A redirect whose Location carries user:pass@ is followed without it: httpx would send
the pair on as an Authorization header, and the URL would be kept for good
(``final_url``, a paused chain's hops). No URL Trove keeps carries credentials."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.fetcher._servers import Exchange, LocalServer, Route, loopback_client, serving
from tests.fetcher.test_timeline import GapGate, poller
from trove_fetcher.http import FetchLimits, fetch
from trove_fetcher.timeline import timeline_url
from trove_schema.events import CrawlOutcome, TimelinePollRequested

HOST = "a.trove.test"
PAGE_LIMIT = 40
CURSOR = "110"
PAGE = b"<html><head><title>Account</title></head><body>account</body></html>"
LIMITS = FetchLimits(total_timeout=5.0)


def _redirect_with_credentials(path: str) -> Route:
    def route(exchange: Exchange) -> None:
        port = exchange.server.server_address[1]
        exchange.redirect(f"http://alice:hunter2@{HOST}:{port}{path}")

    return route


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    routes = {
        "/login": _redirect_with_credentials("/account"),
        "/account": lambda exchange: exchange.send(200, PAGE),
        timeline_url("", "local", limit=PAGE_LIMIT, min_id=CURSOR): _redirect_with_credentials(
            "/moved"
        ),
        "/moved": lambda exchange: exchange.send(200, b"[]", content_type="application/json"),
    }
    with serving(routes) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with loopback_client(HOST) as built:
        yield built


async def test_a_redirect_to_a_url_with_credentials_is_followed_without_them(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    hops_at_the_gate: list[tuple[str, ...]] = []

    async def before_hop(hops: tuple[str, ...]) -> None:
        hops_at_the_gate.append(hops)

    result = await fetch(
        client,
        server.url("/login", host=HOST),
        etag=None,
        last_modified=None,
        limits=LIMITS,
        is_parseable=lambda kind: kind == "text/html",
        before_hop=before_hop,
    )

    assert result.outcome is CrawlOutcome.SUCCESS, result.error_message
    assert result.body == PAGE
    followed = server.requests_to("/account")
    assert len(followed) == 1
    assert "authorization" not in followed[0].headers
    account = server.url("/account", host=HOST)
    assert result.final_url == account
    assert result.redirects == (account,)
    # What a paused chain would carry in its Trove-Hops header.
    assert hops_at_the_gate == [(account,)]


async def test_a_timeline_redirect_to_a_url_with_credentials_is_followed_without_them(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    asked: list[str] = []

    async def robots_allows(url: str) -> bool:
        asked.append(url)
        return True

    api = server.url("", host=HOST)
    timeline = poller(
        client,
        GapGate(0.0),
        limits=LIMITS,
        page_limit=PAGE_LIMIT,
        robots_allows=robots_allows,
    )
    event = await timeline.poll(
        TimelinePollRequested(
            instance=api,
            domain=HOST,
            timeline="local",
            follow_id="follow-1",
            cursor=CURSOR,
            api=api,
        )
    )

    assert event.outcome is CrawlOutcome.SUCCESS, event.error_message
    followed = server.requests_to("/moved")
    assert len(followed) == 1
    assert "authorization" not in followed[0].headers
    assert server.url("/moved", host=HOST) in asked
    assert not any("hunter2" in url for url in asked)
