"""A page's validators go only to the URL whose answer gave them. A site whose files all
share one deploy time (and send no ETag) answers a conditional request to any of them
with 304: sent to the page a redirect leads to now, not the one it led to last time,
they would keep the old page's signals for the page."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.fetcher._completions import Completions
from tests.fetcher._servers import Exchange, LocalServer, Route, loopback_client, serving
from tests.fetcher.test_fetcher_outcomes import fetcher_on
from trove_fetcher.fetcher import Job
from trove_fetcher.http import FetchLimits, FetchResult, fetch
from trove_schema.bus import Bus
from trove_schema.events import CrawlOutcome, CrawlRequested, RequestReason, Scope
from trove_schema.urls import canonicalize, domain_of

HOST = "a.trove.test"
#: Every file's Last-Modified: the site's deploy time.
DEPLOYED = "Wed, 01 Jan 2025 00:00:00 GMT"
ENGLISH = b"<html><head><title>Hello</title></head><body>english</body></html>"
FRENCH = b"<html><head><title>Bonjour</title></head><body>francais</body></html>"
LIMITS = FetchLimits(total_timeout=5.0)
VALIDATORS = ("if-modified-since", "if-none-match")


def _static(body: bytes) -> Route:
    def route(exchange: Exchange) -> None:
        if exchange.headers.get("If-Modified-Since") == DEPLOYED:
            exchange.send(304, b"", {"Last-Modified": DEPLOYED})
        else:
            exchange.send(200, body, {"Last-Modified": DEPLOYED})

    return route


def _to_french(exchange: Exchange) -> None:
    port = exchange.server.server_address[1]
    exchange.redirect(f"http://{HOST}:{port}/fr/", 301)


@pytest.fixture
def server() -> Iterator[LocalServer]:
    # The home page redirected to /en/ last time; it sends visitors to /fr/ now.
    routes = {
        "/": _to_french,
        "/en/": _static(ENGLISH),
        "/fr/": _static(FRENCH),
        # A server that answers 304 whatever it is asked.
        "/to-a-304": lambda exchange: exchange.redirect("/always-304", 301),
        "/always-304": lambda exchange: exchange.send(304),
    }
    with serving(routes) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with loopback_client(HOST) as built:
        yield built


async def _fetch(
    client: httpx.AsyncClient, server: LocalServer, validators_url: str | None, path: str = "/"
) -> FetchResult:
    return await fetch(
        client,
        server.url(path, host=HOST),
        etag=None,
        last_modified=DEPLOYED,
        validators_url=validators_url,
        limits=LIMITS,
        is_parseable=lambda kind: kind == "text/html",
    )


def _conditional(server: LocalServer, path: str) -> list[bool]:
    """For each request to ``path``, whether it carried a validator."""
    return [any(name in seen.headers for name in VALIDATORS) for seen in server.requests_to(path)]


async def test_validators_of_the_page_a_redirect_led_to_before_are_not_sent_to_its_new_target(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result = await _fetch(client, server, validators_url=server.url("/en/", host=HOST))

    assert _conditional(server, "/fr/") == [False]
    assert result.outcome is CrawlOutcome.SUCCESS, result.error_message
    assert result.body == FRENCH
    assert result.final_url == server.url("/fr/", host=HOST)
    assert _conditional(server, "/") == [False]
    assert result.conditional is False


async def test_validators_go_to_the_redirect_target_they_came_from(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    # Last time's final_url, as the fetcher wrote the hop.
    result = await _fetch(client, server, validators_url=server.url("/fr/", host=HOST))

    assert _conditional(server, "/") == [False]
    assert _conditional(server, "/fr/") == [True]
    assert server.requests_to("/fr/")[0].headers["if-modified-since"] == DEPLOYED
    assert result.outcome is CrawlOutcome.NOT_MODIFIED, result.error_message
    assert result.body is None
    assert result.conditional is True


async def test_validators_of_an_older_request_go_only_to_the_pages_own_url(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    # A request of a release that did not say where its validators came from.
    result = await _fetch(client, server, validators_url=None)

    assert _conditional(server, "/") == [True]
    assert _conditional(server, "/fr/") == [False]
    assert result.outcome is CrawlOutcome.SUCCESS, result.error_message
    assert result.body == FRENCH


async def test_validators_of_a_page_that_was_not_redirected_go_to_it(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    # Last time's url, as discovery carries it when the attempt had no final_url.
    page = server.url("/en/", host=HOST)
    result = await _fetch(client, server, validators_url=page, path="/en/")

    assert _conditional(server, "/en/") == [True]
    assert result.outcome is CrawlOutcome.NOT_MODIFIED, result.error_message


async def test_a_304_to_a_hop_the_validators_did_not_go_to_is_a_failure(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result = await _fetch(client, server, validators_url=None, path="/to-a-304")

    assert _conditional(server, "/to-a-304") == [True]
    assert _conditional(server, "/always-304") == [False]
    assert result.outcome is CrawlOutcome.FAILED
    assert result.error_message == "HTTP 304 to an unconditional request"


def _recrawl(server: LocalServer, validators_url: str) -> CrawlRequested:
    url = canonicalize(server.url("/", HOST))
    return CrawlRequested(
        url=url,
        domain=domain_of(url),
        scope=Scope(value=HOST),
        reason=RequestReason.RECRAWL,
        last_modified=DEPLOYED,
        validators_url=validators_url,
    )


@pytest.mark.usefixtures("clean")
@pytest.mark.parametrize(
    ("came_from", "outcome", "title"),
    [("/en/", CrawlOutcome.SUCCESS, "Bonjour"), ("/fr/", CrawlOutcome.NOT_MODIFIED, None)],
)
async def test_a_recrawl_sends_its_validators_where_its_request_says_they_came_from(
    bus: Bus,
    client: httpx.AsyncClient,
    server: LocalServer,
    came_from: str,
    outcome: CrawlOutcome,
    title: str | None,
) -> None:
    fetcher = await fetcher_on(bus, client)
    request = _recrawl(server, server.url(came_from, host=HOST))
    try:
        await fetcher.process(Job(request), request.to_wire())
    finally:
        fetcher.close()

    event = (await Completions(bus.js).wait_for(1, timeout=10))[request.url]
    assert _conditional(server, "/fr/") == [came_from == "/fr/"]
    assert (event.outcome, event.title) == (outcome, title)
    assert _conditional(server, "/") == [False]
    # The attempt says conditional only when its last request carried the validators.
    assert event.conditional is (came_from == "/fr/")
