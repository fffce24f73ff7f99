"""Several X-Robots-Tag headers are read one by one: a ``name:`` prefix aims the rest of
its own header at one crawler, never the headers after it (httpx joins repeated headers
with ", ", which made "googlebot: nofollow" swallow a later "noindex" meant for all)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.fetcher._servers import Exchange, LocalServer, Route, loopback_client, serving
from trove_fetcher.extract import x_robots_directives
from trove_fetcher.http import FetchLimits, fetch
from trove_schema.events import CrawlOutcome

HOST = "tags.trove.test"
PAGE = b"<html><head><title>Tagged</title></head><body>text</body></html>"


def _tagged(*values: str) -> Route:
    def route(exchange: Exchange) -> None:
        exchange.send_response(200)
        exchange.send_header("Content-Type", "text/html")
        exchange.send_header("Content-Length", str(len(PAGE)))
        for value in values:
            exchange.send_header("X-Robots-Tag", value)
        exchange.end_headers()
        exchange.wfile.write(PAGE)

    return route


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    routes = {
        "/aimed-then-all": _tagged("googlebot: nofollow", "noindex"),
        "/all-then-aimed": _tagged("nofollow", "otherbot: noindex"),
        "/ours": _tagged("otherbot: noindex", "TroveBot: nofollow"),
    }
    with serving(routes) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with loopback_client(HOST) as built:
        yield built


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/aimed-then-all", (True, False)),
        ("/all-then-aimed", (False, True)),
        ("/ours", (False, True)),
    ],
)
async def test_each_x_robots_tag_header_aims_its_own_directives(
    client: httpx.AsyncClient, server: LocalServer, path: str, expected: tuple[bool, bool]
) -> None:
    result = await fetch(
        client,
        server.url(path, host=HOST),
        etag=None,
        last_modified=None,
        limits=FetchLimits(total_timeout=5.0),
        is_parseable=lambda kind: kind == "text/html",
    )
    assert result.outcome is CrawlOutcome.SUCCESS, result.error_message
    assert x_robots_directives(result.x_robots_tag) == expected
