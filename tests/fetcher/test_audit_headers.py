"""The fetcher fills the audit fields of CrawlCompleted from a real response."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import httpx
import pytest

from tests.fetcher._servers import Exchange, LocalServer, serving
from trove_fetcher.completion import completed
from trove_fetcher.extract import Extraction
from trove_fetcher.http import AUDIT_HEADERS, FetchLimits, fetch
from trove_fetcher.transport import build_client
from trove_schema.events import MAX_AUDIT_HEADERS, PageDiscovered, Provenance, Scope
from trove_schema.settings import FetcherSettings

PAGE = b"<html><head><title>Hello</title></head><body>small web</body></html>"


def _behind_a_cdn(exchange: Exchange) -> None:
    # Written raw: http.server would add a Server header of its own.
    body = b"<html>checking your browser</html>"
    exchange.wfile.write(
        b"HTTP/1.1 403 Forbidden\r\n"
        b"Server: cloudflare\r\n"
        b"CF-Ray: 8f00aa-AMS\r\n"
        b"CF-Mitigated: challenge\r\n"
        b"Set-Cookie: __cf_bm=secret; path=/\r\n"
        b"Cache-Control: no-store\r\n"
        b"X-Secret-Token: never-kept\r\n"
        b"Content-Type: text/html; charset=utf-8\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


def _page(exchange: Exchange) -> None:
    exchange.send(200, PAGE, {"Server": "nginx/1.25", "Set-Cookie": "session=abc"})


def _hop(exchange: Exchange) -> None:
    exchange.send(302, b"", {"Location": "/page"})


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    with serving({"/challenge": _behind_a_cdn, "/page": _page, "/hop": _hop}) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    settings = FetcherSettings(allowed_networks=("127.0.0.1/32",))
    async with build_client(settings) as built:
        yield built


def work(url: str) -> PageDiscovered:
    return PageDiscovered(
        url=url, domain="127.0.0.1", scope=Scope(), provenance=Provenance(kind="seed")
    )


async def test_selected_headers_are_kept_and_cookies_never(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    url = server.url("/challenge")
    started = datetime.now(UTC)
    result = await fetch(
        client,
        url,
        etag=None,
        last_modified=None,
        limits=FetchLimits(),
        is_parseable=lambda kind: kind == "text/html",
    )
    event = completed(work(url), result, None, started)
    assert event.response_headers == {
        "server": "cloudflare",
        "content-type": "text/html; charset=utf-8",
        "cf-ray": "8f00aa-AMS",
        "cf-mitigated": "challenge",
        "cache-control": "no-store",
    }
    assert "__cf_bm" not in event.to_wire().decode()
    assert "never-kept" not in event.to_wire().decode()
    assert event.fetcher == "http"
    assert event.duration_ms is not None
    assert 0 <= event.duration_ms < 5_000


async def test_duration_leaves_out_the_wait_between_redirect_hops(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    async def polite_gate(hops: tuple[str, ...]) -> None:
        await asyncio.sleep(0.5)  # the politeness gap itself, not a synchronisation

    url = server.url("/hop")
    started = datetime.now(UTC)
    result = await fetch(
        client,
        url,
        etag=None,
        last_modified=None,
        limits=FetchLimits(),
        is_parseable=lambda kind: kind == "text/html",
        before_hop=polite_gate,
    )
    event = completed(work(url), result, Extraction(content_hash="0" * 64, title="Hello"), started)
    assert event.response_headers["server"].endswith("nginx/1.25")
    assert "set-cookie" not in event.response_headers
    assert result.elapsed >= 0.5
    assert event.duration_ms is not None
    assert event.duration_ms < 400


def test_the_audit_headers_fit_in_the_event() -> None:
    assert len(AUDIT_HEADERS) <= MAX_AUDIT_HEADERS
    assert "set-cookie" not in AUDIT_HEADERS
    assert "cookie" not in AUDIT_HEADERS
