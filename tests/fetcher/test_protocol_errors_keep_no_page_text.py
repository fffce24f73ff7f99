"""A protocol error's message says what kind of error it was and nothing of what the
peer sent: h11 quotes the line it could not read, and when a server says
``Transfer-Encoding: chunked`` over a body that is not (a proxy's misconfiguration),
that line is the page itself, which ``error_message`` would keep for good."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.fetcher._servers import Exchange, LocalServer, Route, loopback_client, serving
from tests.fetcher.test_timeline import GapGate, poller
from trove_fetcher.http import FetchLimits, error_text, fetch
from trove_fetcher.timeline import timeline_url
from trove_schema.events import CrawlOutcome, TimelinePollRequested

HOST = "a.trove.test"
PAGE_LIMIT = 40
CURSOR = "110"
PATIENT_RECORD = (
    b"<!doctype html><title>Patient record</title>Name: Jane Doe, born 1970-01-01\r\n"
    b"<p>Diagnosis: confidential</p>\r\n"
)
LIMITS = FetchLimits(total_timeout=5.0)


def _chunked_in_name_only(content_type: str) -> Route:
    def route(exchange: Exchange) -> None:
        exchange.send_response(200)
        exchange.send_header("Content-Type", content_type)
        exchange.send_header("Transfer-Encoding", "chunked")
        exchange.end_headers()
        exchange.wfile.write(PATIENT_RECORD)
        exchange.wfile.flush()

    return route


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    routes = {
        "/record": _chunked_in_name_only("text/html"),
        timeline_url("", "local", limit=PAGE_LIMIT, min_id=CURSOR): _chunked_in_name_only(
            "application/json"
        ),
    }
    with serving(routes) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with loopback_client(HOST) as built:
        yield built


def says_its_kind_and_nothing_of_the_page(message: str | None) -> None:
    assert message is not None
    assert "RemoteProtocolError" in message
    assert "illegal chunk header" in message
    for text in ("Jane Doe", "Patient record", "doctype", "bytearray"):
        assert text not in message


async def test_a_body_sent_as_chunked_that_is_not_fails_without_its_text(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result = await fetch(
        client,
        server.url("/record", host=HOST),
        etag=None,
        last_modified=None,
        limits=LIMITS,
        is_parseable=lambda kind: kind == "text/html",
    )

    assert result.outcome is CrawlOutcome.FAILED
    says_its_kind_and_nothing_of_the_page(result.error_message)


async def test_a_timeline_page_sent_as_chunked_that_is_not_fails_the_poll_without_its_text(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    api = server.url("", host=HOST)
    timeline = poller(
        client,
        GapGate(0.0),
        limits=LIMITS,
        page_limit=PAGE_LIMIT,
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

    assert server.requests_to(timeline_url("", "local", limit=PAGE_LIMIT, min_id=CURSOR))
    assert event.outcome is CrawlOutcome.FAILED
    assert event.cursor_after == CURSOR
    says_its_kind_and_nothing_of_the_page(event.error_message)


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (
            httpx.RemoteProtocolError("illegal status line: bytearray(b'Name: Jane Doe')"),
            "RemoteProtocolError: illegal status line",
        ),
        (
            httpx.RemoteProtocolError("illegal header line: b'Name: Jane Doe'"),
            "RemoteProtocolError: illegal header line",
        ),
        (
            httpx.RemoteProtocolError("malformed chunk footer: b'Ja' (expected b'\\r\\n')"),
            "RemoteProtocolError: malformed chunk footer",
        ),
        # What quotes no bytes is kept as it is.
        (
            httpx.ConnectError("[Errno 111] Connection refused"),
            "ConnectError: [Errno 111] Connection refused",
        ),
        (
            ValueError("Invalid URL 'http://a.trove.test/b'"),
            "ValueError: Invalid URL 'http://a.trove.test/b'",
        ),
    ],
)
def test_an_errors_text_ends_where_it_quotes_bytes(error: Exception, message: str) -> None:
    assert error_text(error) == message


def test_a_protocol_errors_text_is_cut_short_whatever_it_quotes() -> None:
    error = httpx.RemoteProtocolError("unexpected reply " + "Jane Doe " * 50)
    assert len(error_text(error)) <= len("RemoteProtocolError: ") + 120
