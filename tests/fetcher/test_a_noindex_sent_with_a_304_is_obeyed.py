"""A site that starts saying noindex while its page stays the same answers every visit
with a 304 (nginx's add_header sends the X-Robots-Tag with it): the attempt says noindex,
or the page would stay searchable until it is next read whole, months later."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import httpx
import pytest

from tests.fetcher._completions import Completions
from tests.fetcher._servers import Exchange, LocalServer, Route, loopback_client, serving
from tests.fetcher.test_fetcher_outcomes import fetcher_on
from trove_fetcher.completion import completed
from trove_fetcher.fetcher import Job
from trove_fetcher.http import FetchLimits, fetch
from trove_schema.bus import Bus
from trove_schema.events import CrawlCompleted, CrawlOutcome, CrawlRequested, RequestReason, Scope
from trove_schema.urls import canonicalize

HOST = "unchanged.trove.test"
ETAG = '"v1"'
PAGE = b"<html><head><title>Same</title></head><body>text</body></html>"


def _unchanged(*tags: str) -> Route:
    def route(exchange: Exchange) -> None:
        headers = {"ETag": ETAG}
        if exchange.headers.get("If-None-Match") != ETAG:
            exchange.send(200, PAGE, headers)
            return
        exchange.send_response(304)
        exchange.send_header("ETag", ETAG)
        for tag in tags:
            exchange.send_header("X-Robots-Tag", tag)
        exchange.end_headers()

    return route


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    routes = {
        "/noindex": _unchanged("noindex"),
        "/silent": _unchanged(),
        "/elsewhere": _unchanged("otherbot: noindex"),
        "/ours": _unchanged("otherbot: nofollow", "ExampleBot: noindex"),
    }
    with serving(routes) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with loopback_client(HOST) as built:
        yield built


async def _recrawl(
    client: httpx.AsyncClient, server: LocalServer, path: str, **options: str
) -> CrawlCompleted:
    url = server.url(path, host=HOST)
    work = CrawlRequested(
        url=url,
        domain=HOST,
        scope=Scope(value=HOST),
        reason=RequestReason.RECRAWL,
        etag=ETAG,
    )
    started = datetime.now(UTC)
    result = await fetch(
        client,
        url,
        etag=ETAG,
        last_modified=None,
        limits=FetchLimits(total_timeout=5.0),
        is_parseable=lambda kind: kind == "text/html",
    )
    assert server.requests_to(path)[-1].headers["if-none-match"] == ETAG
    return completed(work, result, None, started, conditional=True, **options)


async def test_a_304_saying_noindex_makes_the_attempt_noindex(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    event = await _recrawl(client, server, "/noindex")
    assert (event.outcome, event.status_code, event.etag) == (
        CrawlOutcome.NOT_MODIFIED,
        304,
        ETAG,
    )
    assert event.noindex


async def test_a_304_without_an_x_robots_tag_says_nothing_of_noindex(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    event = await _recrawl(client, server, "/silent")
    assert event.outcome is CrawlOutcome.NOT_MODIFIED
    assert not event.noindex


async def test_a_304s_noindex_aimed_at_another_crawler_is_not_ours(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    event = await _recrawl(client, server, "/elsewhere")
    assert event.outcome is CrawlOutcome.NOT_MODIFIED
    assert not event.noindex


async def test_a_304s_noindex_aimed_at_our_token_is_obeyed(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    assert not (await _recrawl(client, server, "/ours")).noindex  # aimed at ExampleBot
    event = await _recrawl(client, server, "/ours", robots_token="ExampleBot")
    assert event.outcome is CrawlOutcome.NOT_MODIFIED
    assert event.noindex


@pytest.mark.usefixtures("clean")
async def test_a_fetcher_reads_a_304s_noindex_for_its_own_robots_token(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    fetcher = await fetcher_on(bus, client, robots_token="ExampleBot")
    url = canonicalize(server.url("/ours", host=HOST))
    request = CrawlRequested(
        url=url, domain=HOST, scope=Scope(value=HOST), reason=RequestReason.RECRAWL, etag=ETAG
    )
    try:
        await fetcher.process(Job(request), request.to_wire())
    finally:
        fetcher.close()
    event = (await Completions(bus.js).wait_for(1, timeout=10))[url]
    assert event.outcome is CrawlOutcome.NOT_MODIFIED
    assert event.noindex  # "ExampleBot: noindex", this fetcher's token
