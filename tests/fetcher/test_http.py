"""fetch(): outcomes for what real servers on loopback do, within the limits given."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import random
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
import nats.errors
import pytest

from tests.conftest import eventually
from tests.fetcher._servers import (
    Exchange,
    LocalServer,
    RecordingBackend,
    serving,
    stall,
    stream_body,
)
from tests.ports import free_port
from trove_fetcher.errors import (
    DecompressionBomb,
    HopGateFailed,
    RedirectPaused,
    RobotsUnavailable,
)
from trove_fetcher.extract import extract
from trove_fetcher.http import (
    MOST_MEMBERS,
    BodyReader,
    FetchLimits,
    FetchResult,
    fetch,
    parse_retry_after,
    retry_after,
    same_site,
)
from trove_fetcher.strategies import HTTP
from trove_fetcher.transport import MOST_CARRIED, PoolConfig, build_client
from trove_schema.events import CrawlOutcome
from trove_schema.settings import FetcherSettings

MIB = 1024 * 1024
PAGE = b"<html><head><title>Hello</title></head><body>small web</body></html>"
HTML_TYPES = {"text/html", "application/xhtml+xml"}


def is_html(content_type: str | None) -> bool:
    return content_type in HTML_TYPES


def _words(size: int) -> bytes:
    rng = random.Random(7)
    vocabulary = [f"word{n}" for n in range(5000)]
    out = bytearray(b"<html><body>")
    while len(out) < size:
        out += " ".join(rng.choices(vocabulary, k=1000)).encode() + b"\n"
    return bytes(out[:size])


BIG = b"<html><body>" + b"a" * (10 * MIB)
TEXT_4MIB = _words(4 * MIB)
GZIP_TEXT_4MIB = gzip.compress(TEXT_4MIB, compresslevel=6)
BOMB = gzip.compress(b"\0" * (32 * MIB), compresslevel=9)
STREAMED_BOMB_BYTES = 1024 * MIB
SMALL_BOMB = gzip.compress(b"\0" * (100 * 1024), compresslevel=9)
SITEMAP = (
    b'<?xml version="1.0" encoding="UTF-8"?>'
    b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
    b"<url><loc>http://a.trove.test/post/1</loc></url></urlset>"
)
EXACT_CAP = 64 * 1024
#: How long ``/slow`` takes to answer.
SLOW_ANSWER = 0.5


def _page(exchange: Exchange) -> None:
    exchange.send(
        200,
        PAGE,
        {
            "ETag": '"v1"',
            "Last-Modified": "Wed, 01 Jan 2025 00:00:00 GMT",
            "X-Robots-Tag": "noarchive",
        },
    )


def _conditional(exchange: Exchange) -> None:
    if exchange.headers.get("If-None-Match") == '"v1"':
        exchange.send(304, b"", {"ETag": '"v1"'})
    else:
        exchange.send(200, PAGE, {"ETag": '"v1"'})


def _encoded(body: bytes, encoding: str, content_type: str = "text/html") -> Any:
    def route(exchange: Exchange) -> None:
        exchange.send(200, body, {"Content-Encoding": encoding}, content_type=content_type)

    return route


def _gzip_file(
    body: bytes, content_type: str, encoding: str | None = None, *, packed: bytes | None = None
) -> Any:
    """A ``.gz`` file as a static server sends it: gzip bytes (``packed``, or ``body``
    compressed) of the media type it was given, and with ``encoding``, the same one layer
    also named as a content coding (Apache's ``AddType application/x-gzip .gz`` beside
    ``AddEncoding x-gzip .gz``)."""

    def route(exchange: Exchange) -> None:
        headers = {"Content-Encoding": encoding} if encoding else None
        file = gzip.compress(body) if packed is None else packed
        exchange.send(200, file, headers, content_type=content_type)

    return route


def _crumbs(exchange: Exchange) -> None:
    """A chunked body a byte a chunk, as long as the client reads."""
    exchange.send_response(200)
    exchange.send_header("Content-Type", "text/html")
    exchange.send_header("Transfer-Encoding", "chunked")
    exchange.end_headers()
    crumbs = b"1\r\nx\r\n" * 1024
    for _ in range(2048):  # 2 MiB: the size cap, at ~30 s of the loop to read
        exchange.wfile.write(crumbs)
    exchange.wfile.write(b"0\r\n\r\n")


def _pieces(exchange: Exchange) -> None:
    """A page streamed a row a chunk (a template rendered as it goes): 5,000 of 43 bytes."""
    exchange.send_response(200)
    exchange.send_header("Content-Type", "text/html")
    exchange.send_header("Transfer-Encoding", "chunked")
    exchange.end_headers()
    piece = b"<p>" + b"x" * 36 + b"</p>"
    for _ in range(5000):
        exchange.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
    exchange.wfile.write(b"0\r\n\r\n")


def _early_hints_for_ever(exchange: Exchange) -> None:
    """A 103 after another and never the answer, as long as the client reads."""
    hints = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n" * 1000
    with contextlib.suppress(OSError):
        while not exchange.server.owner.stopping.is_set():
            exchange.wfile.write(hints)


def _padded_chunks(exchange: Exchange) -> None:
    """Chunks of 16 bytes, each behind 90 KiB of chunk extension (h11 drops it unread),
    as long as the client reads."""
    exchange.send_response(200)
    exchange.send_header("Content-Type", "text/html")
    exchange.send_header("Transfer-Encoding", "chunked")
    exchange.end_headers()
    chunk = b"10;" + b"x" * 90 * 1024 + b"\r\n" + b"y" * 16 + b"\r\n"
    with contextlib.suppress(OSError):
        while not exchange.server.owner.stopping.is_set():
            exchange.wfile.write(chunk)


def _slow(exchange: Exchange) -> None:
    time.sleep(SLOW_ANSWER)
    _page(exchange)


def _streamed_bomb(exchange: Exchange) -> None:
    """1 GiB of zeros, gzipped on the fly: about 1 MiB on the wire if all of it is sent."""
    exchange.send_response(200)
    exchange.send_header("Content-Type", "text/html")
    exchange.send_header("Content-Encoding", "gzip")
    exchange.send_header("Transfer-Encoding", "chunked")
    exchange.end_headers()
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = b"\0" * MIB
    sent = 0

    def chunk(data: bytes) -> None:
        nonlocal sent
        if data:
            exchange.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            sent += len(data)

    for _ in range(STREAMED_BOMB_BYTES // MIB):
        chunk(compressor.compress(zeros))
    chunk(compressor.flush())
    exchange.wfile.write(b"0\r\n\r\n")
    exchange.server.owner.signal(f"complete:{exchange.path}:{sent}")


def _gzip_then_held_open(exchange: Exchange) -> None:
    """A whole gzip page in a chunked body, junk after it, and no last chunk: the body
    stays open until the server stops."""
    exchange.send_response(200)
    exchange.send_header("Content-Type", "text/html")
    exchange.send_header("Content-Encoding", "gzip")
    exchange.send_header("Transfer-Encoding", "chunked")
    exchange.end_headers()
    for data in (gzip.compress(PAGE), b"junk after the stream"):
        exchange.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    exchange.wfile.flush()
    exchange.server.owner.stopping.wait(60)


def _redirect(location: str, status: int = 302) -> Any:
    def route(exchange: Exchange) -> None:
        port = exchange.server.server_address[1]
        exchange.redirect(location.format(port=port), status)

    return route


def _status(status: int, headers: dict[str, str] | None = None) -> Any:
    def route(exchange: Exchange) -> None:
        exchange.send(status, b"status page", headers)

    return route


def _retry_at(exchange: Exchange) -> None:
    when = datetime.now(UTC) + timedelta(seconds=90)
    exchange.send(429, b"slow down", {"Retry-After": format_datetime(when, usegmt=True)})


def _two_retry_afters(exchange: Exchange) -> None:
    # Two headers, the longer first, then a date: each read on its own.
    when = datetime.now(UTC) + timedelta(seconds=30)
    exchange.send_response(429)
    for value in ("100", "5", format_datetime(when, usegmt=True)):
        exchange.send_header("Retry-After", value)
    exchange.send_header("Content-Length", "0")
    exchange.end_headers()


def _retry_on_a_slow_clock(exchange: Exchange) -> None:
    # A site whose clock is an hour slow asks for two minutes, as a date on its clock.
    its_now = datetime.now(UTC) - timedelta(hours=1)
    exchange.send_response_only(429)
    exchange.send_header("Date", format_datetime(its_now, usegmt=True))
    exchange.send_header(
        "Retry-After", format_datetime(its_now + timedelta(seconds=120), usegmt=True)
    )
    exchange.send_header("Content-Length", "0")
    exchange.end_headers()


ROUTES: dict[str, Any] = {
    "/page": _page,
    "/conditional": _conditional,
    "/big": lambda ex: ex.send(200, BIG),
    "/exact": lambda ex: ex.send(200, b"x" * EXACT_CAP),
    "/gzip-exact": _encoded(gzip.compress(b"x" * EXACT_CAP), "gzip"),
    "/gzip-text": _encoded(GZIP_TEXT_4MIB, "gzip"),
    "/gzip-page": _encoded(gzip.compress(PAGE), "gzip"),
    "/deflate-page": _encoded(zlib.compress(PAGE), "deflate"),
    "/raw-deflate-page": _encoded(zlib.compress(PAGE)[2:-4], "deflate"),
    "/bomb": _streamed_bomb,
    "/small-bomb": _encoded(SMALL_BOMB, "gzip"),
    "/gzip-held-open": _gzip_then_held_open,
    "/corrupt-gzip": _encoded(b"\x1f\x8b\x08\x00garbage-not-gzip" * 10, "gzip"),
    "/brotli": _encoded(b"\x0b\x02\x80hello\x03", "br"),
    "/coding-none": _encoded(PAGE, "none"),
    "/crumbs": _crumbs,
    "/pieces": _pieces,
    "/early-hints-for-ever": _early_hints_for_ever,
    "/padded-chunks": _padded_chunks,
    "/port-twice": _redirect("http://b.trove.test:80:80/page", 301),
    "/coding-charset": _encoded(PAGE, "utf-8"),
    "/stall": stall,
    "/pdf": lambda ex: stream_body(ex, "application/pdf", 64 * MIB),
    "/release.tar.gz": lambda ex: stream_body(ex, "application/gzip", 64 * MIB),
    "/sitemap.xml.gz": _gzip_file(SITEMAP, "application/gzip"),
    "/sitemap-x.xml.GZ": _gzip_file(SITEMAP, "application/x-gzip"),
    "/sitemap-octets.xml.gz": _gzip_file(SITEMAP, "application/octet-stream"),
    "/sitemap-named-twice.xml.gz": _gzip_file(SITEMAP, "application/x-gzip", "x-gzip"),
    # Typed by the name inside (Python's mimetypes), or by S3's default.
    "/sitemap-typed.xml.gz": _gzip_file(SITEMAP, "text/xml"),
    "/sitemap-s3.xml.gz": _gzip_file(SITEMAP, "binary/octet-stream"),
    # Two members, as ``cat a.gz b.gz`` makes: gunzip reads both.
    "/sitemap-members.xml.gz": _gzip_file(
        SITEMAP,
        "application/gzip",
        packed=gzip.compress(SITEMAP[:90]) + gzip.compress(SITEMAP[90:]),
    ),
    "/sitemap-members-named-twice.xml.gz": _gzip_file(
        SITEMAP,
        "application/x-gzip",
        "x-gzip",
        packed=gzip.compress(SITEMAP[:90]) + gzip.compress(SITEMAP[90:]),
    ),
    # Not packed after all: unpacked on the way, or a plain file given the name.
    "/sitemap-unpacked.xml.gz": _gzip_file(SITEMAP, "application/xml", packed=SITEMAP),
    "/sitemap-plain.xml.gz": _gzip_file(SITEMAP, "application/octet-stream", packed=SITEMAP),
    "/sitemap-bomb.xml.gz": _gzip_file(b"<urlset>" + b" " * (8 * MIB), "application/gzip"),
    "/no-type": lambda ex: ex.send(200, PAGE, content_type=""),
    "/loop-a": _redirect("/loop-b"),
    "/loop-b": _redirect("/loop-a"),
    "/self": _redirect("/self#again", 301),
    "/chain/0": _page,
    "/chain/1": _redirect("/chain/0", 301),
    "/chain/2": _redirect("/chain/1", 302),
    "/chain/3": _redirect("/chain/2", 303),
    "/chain/4": _redirect("/chain/3", 307),
    "/chain/5": _redirect("/chain/4", 308),
    "/chain/6": _redirect("/chain/5", 301),
    "/cross": _redirect("http://b.trove.test:{port}/page", 301),
    "/to-metadata": _redirect("http://169.254.169.254/latest/meta-data/"),
    "/to-private": _redirect("/page"),
    "/to-mailto": _redirect("mailto:webmaster@example.org"),
    "/no-location": _status(302),
    "/bad-location": _redirect("http://[not-an-address/x"),
    "/to-disallowed": _redirect("/private/page"),
    "/private/page": _page,
    "/404": _status(404),
    "/410": _status(410),
    "/429-seconds": _status(429, {"Retry-After": "120"}),
    "/429-date": _retry_at,
    "/429-twice": _two_retry_afters,
    "/429-slow-clock": _retry_on_a_slow_clock,
    "/503": _status(503, {"Retry-After": "30"}),
    "/500": _status(500),
    "/unconditional-304": _status(304),
    "/slow": _slow,
    "/redirect-to-slow": _redirect("/slow"),
}

LIMITS = FetchLimits(max_body_bytes=2 * MIB, max_redirects=5, total_timeout=5.0)


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    with serving(ROUTES) as running:
        yield running


@pytest.fixture
def recorder() -> RecordingBackend:
    return RecordingBackend()


def _settings(**overrides: Any) -> FetcherSettings:
    values: dict[str, Any] = {
        "allowed_networks": ("127.0.0.1/32",),
        "resolve": (
            "a.trove.test=127.0.0.1",
            "b.trove.test=127.0.0.1",
            "evil.trove.test=10.0.0.1",
        ),
    }
    values.update(overrides)
    return FetcherSettings(**values)


@pytest.fixture
async def client(recorder: RecordingBackend) -> AsyncIterator[httpx.AsyncClient]:
    async with build_client(_settings(), network_backend=recorder) as built:
        yield built


async def get(
    client: httpx.AsyncClient,
    url: str,
    *,
    limits: FetchLimits = LIMITS,
    etag: str | None = None,
    last_modified: str | None = None,
    is_parseable: Callable[[str | None], bool] = is_html,
    **kwargs: Any,
) -> FetchResult:
    return await fetch(
        client,
        url,
        etag=etag,
        last_modified=last_modified,
        limits=limits,
        is_parseable=is_parseable,
        **kwargs,
    )


def url(server: LocalServer, path: str) -> str:
    return server.url(path, host="a.trove.test")


async def test_html_page_is_a_success_with_its_body_and_validators(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result = await get(client, url(server, "/page"))
    assert result.outcome is CrawlOutcome.SUCCESS
    assert result.status_code == 200
    assert result.body == PAGE
    assert not result.truncated
    assert result.final_url == url(server, "/page")
    assert result.content_type == "text/html; charset=utf-8"
    assert result.etag == '"v1"'
    assert result.last_modified == "Wed, 01 Jan 2025 00:00:00 GMT"
    assert result.x_robots_tag == "noarchive"
    assert result.bytes_read == len(PAGE)
    assert result.error_message is None
    assert result.completed >= result.started
    assert not result.retryable


async def test_conditional_get_with_a_matching_etag_is_not_modified(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result = await get(client, url(server, "/conditional"), etag='"v1"')
    assert result.outcome is CrawlOutcome.NOT_MODIFIED
    assert result.status_code == 304
    assert result.body is None
    sent = server.requests_to("/conditional")[-1].headers
    assert sent["if-none-match"] == '"v1"'


async def test_last_modified_is_sent_as_if_modified_since(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    stamp = "Tue, 01 Apr 2025 10:00:00 GMT"
    result = await get(client, url(server, "/conditional"), last_modified=stamp)
    assert result.outcome is CrawlOutcome.SUCCESS
    assert server.requests_to("/conditional")[-1].headers["if-modified-since"] == stamp


async def test_validator_that_cannot_be_sent_is_left_out(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result = await get(client, url(server, "/conditional"), etag='"caf\u00e9"')
    assert result.outcome is CrawlOutcome.SUCCESS
    assert "if-none-match" not in server.requests_to("/conditional")[-1].headers


async def test_unconditional_request_answered_304_is_a_failure(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result = await get(client, url(server, "/unconditional-304"))
    assert result.outcome is CrawlOutcome.FAILED


async def test_page_over_the_cap_is_cut_and_still_a_success(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result = await get(client, url(server, "/big"))
    assert result.outcome is CrawlOutcome.SUCCESS
    assert result.truncated
    assert result.body is not None
    assert len(result.body) == 2 * MIB
    assert result.body.startswith(b"<html><body>aaa")
    # Reading stopped near the cap, not at the 10 MiB the server offered.
    assert result.bytes_read < 2 * MIB + 256 * 1024


async def test_body_exactly_at_the_cap_is_not_truncated(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    limits = FetchLimits(max_body_bytes=EXACT_CAP, total_timeout=5.0)
    for path in ("/exact", "/gzip-exact"):
        result = await get(client, url(server, path), limits=limits)
        assert result.outcome is CrawlOutcome.SUCCESS, path
        assert result.body == b"x" * EXACT_CAP
        assert not result.truncated, path


@pytest.mark.parametrize("path", ["/gzip-page", "/deflate-page", "/raw-deflate-page"])
async def test_compressed_page_is_decoded(
    client: httpx.AsyncClient, server: LocalServer, path: str
) -> None:
    result = await get(client, url(server, path))
    assert result.outcome is CrawlOutcome.SUCCESS
    assert result.body == PAGE
    assert server.requests_to(path)[-1].headers["accept-encoding"] == "gzip, deflate"


async def test_compressed_page_over_the_cap_at_an_ordinary_ratio_is_cut(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    limits = FetchLimits(max_body_bytes=1 * MIB, total_timeout=5.0)
    result = await get(client, url(server, "/gzip-text"), limits=limits)
    assert result.outcome is CrawlOutcome.SUCCESS
    assert result.truncated
    assert result.body == TEXT_4MIB[: 1 * MIB]


async def test_gzip_bomb_is_refused(client: httpx.AsyncClient, server: LocalServer) -> None:
    result = await get(client, url(server, "/bomb"))
    assert result.outcome is CrawlOutcome.REJECTED
    assert result.body is None
    assert result.error_message is not None
    assert "inflates past" in result.error_message
    # 1 GiB of zeros is about 1 MiB gzipped; reading stopped after the first chunks.
    assert 0 < result.bytes_read < 256 * 1024


async def test_small_highly_compressed_page_is_not_a_bomb(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result = await get(client, url(server, "/small-bomb"))
    assert result.outcome is CrawlOutcome.SUCCESS
    assert result.body == b"\0" * (100 * 1024)


async def test_a_gzip_body_is_the_page_once_its_stream_ends_though_the_body_stays_open(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    # Read on until the body closed, it came out a timeout and the page was thrown away.
    limits = FetchLimits(max_body_bytes=2 * MIB, total_timeout=2.0)
    result = await get(client, url(server, "/gzip-held-open"), limits=limits)
    assert result.outcome is CrawlOutcome.SUCCESS, result.error_message
    assert result.body == PAGE
    assert b"<title>Hello</title>" in result.body
    assert not result.truncated


async def test_corrupt_gzip_is_a_failure(client: httpx.AsyncClient, server: LocalServer) -> None:
    result = await get(client, url(server, "/corrupt-gzip"))
    assert result.outcome is CrawlOutcome.FAILED
    assert result.error_message is not None
    assert "corrupt gzip" in result.error_message


async def test_encoding_that_was_not_offered_is_rejected(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result = await get(client, url(server, "/brotli"))
    assert result.outcome is CrawlOutcome.REJECTED
    assert result.error_message is not None
    assert "'br'" in result.error_message


async def test_a_redirect_to_a_location_httpx_cannot_parse_is_the_sites_answer(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    # Not the host's network failing, which would pause it at every attempt.
    result = await get(client, url(server, "/port-twice"))
    assert result.outcome is CrawlOutcome.REJECTED
    assert result.error_message is not None
    assert result.error_message.startswith("unusable redirect Location")


async def test_a_body_sent_a_byte_a_chunk_is_given_up_before_it_holds_the_loop(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result = await get(client, url(server, "/crumbs"))
    assert result.outcome is CrawlOutcome.REJECTED
    assert result.error_message is not None
    assert "pieces of 1 bytes on average" in result.error_message
    assert result.bytes_read < 64 * 4096
    # A page streamed a row a chunk: read whole.
    streamed = await get(client, url(server, "/pieces"))
    assert streamed.outcome is CrawlOutcome.SUCCESS, streamed.error_message
    assert streamed.body is not None
    assert len(streamed.body) == 5000 * 43


@pytest.mark.parametrize("path", ["/early-hints-for-ever", "/padded-chunks"])
async def test_an_answer_that_carries_more_than_its_bound_on_the_wire_is_given_up(
    client: httpx.AsyncClient, server: LocalServer, path: str
) -> None:
    """Bytes the body reader never counts: a 103 after another before any final answer
    (httpcore reads them as long as they come), a chunk's extensions (h11 drops them).
    One kept a core busy for the request's whole timeout, the other carried gigabytes."""
    result = await get(client, url(server, path))
    assert result.outcome is CrawlOutcome.FAILED
    assert result.error_message is not None
    assert "in answer to one request" in result.error_message


@pytest.mark.parametrize("path", ["/coding-none", "/coding-charset"])
async def test_a_content_encoding_that_names_no_coding_is_read_as_it_came(
    client: httpx.AsyncClient, server: LocalServer, path: str
) -> None:
    # PHP's widely copied `Content-Encoding: none`, or a charset sent there: browsers
    # read the body as it came.
    result = await get(client, url(server, path))
    assert result.outcome is CrawlOutcome.SUCCESS, result.error_message
    assert result.body == PAGE


async def test_stalled_body_times_out_within_the_total_timeout(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    # read timeout (10 s) longer than the total: the total is what must stop it.
    limits = FetchLimits(total_timeout=1.0)
    result = await get(client, url(server, "/stall"), limits=limits)
    assert result.outcome is CrawlOutcome.TIMEOUT
    assert result.status_code == 200
    assert result.bytes_read == 1
    assert result.body is None
    assert 1.0 <= result.elapsed < 3.0
    assert result.retryable


async def test_stalled_body_hits_the_read_timeout(
    recorder: RecordingBackend, server: LocalServer
) -> None:
    async with build_client(_settings(read_timeout=0.3), network_backend=recorder) as client:
        result = await get(client, url(server, "/stall"), limits=FetchLimits(total_timeout=10.0))
    assert result.outcome is CrawlOutcome.TIMEOUT
    assert result.error_message is not None
    assert "ReadTimeout" in result.error_message
    assert result.elapsed < 3.0


async def test_non_html_is_rejected_without_reading_the_body(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result = await get(client, url(server, "/pdf"))
    assert result.outcome is CrawlOutcome.REJECTED
    assert result.content_type == "application/pdf"
    assert result.bytes_read == 0
    assert result.body is None
    # The server saw the connection close long before its 64 MiB were sent.
    assert await asyncio.to_thread(server.wait_for, "closed:/pdf", 10.0)
    assert not await asyncio.to_thread(server.wait_for, "complete:/pdf", 0.0)


@pytest.mark.parametrize(
    "path",
    [
        "/sitemap.xml.gz",
        "/sitemap-x.xml.GZ",
        "/sitemap-octets.xml.gz",
        "/sitemap-named-twice.xml.gz",
        "/sitemap-typed.xml.gz",
        "/sitemap-s3.xml.gz",
        "/sitemap-members.xml.gz",
        "/sitemap-members-named-twice.xml.gz",
        "/sitemap-unpacked.xml.gz",
        "/sitemap-plain.xml.gz",
    ],
)
async def test_a_gzipped_sitemap_is_read_as_the_xml_it_holds(
    client: httpx.AsyncClient, server: LocalServer, path: str
) -> None:
    result = await get(client, url(server, path), is_parseable=HTTP.is_parseable)
    assert result.outcome is CrawlOutcome.SUCCESS, result.error_message
    assert result.body == SITEMAP
    links = extract(result.body, url=result.final_url, content_type=result.content_type).links
    assert [link.url for link in links] == ["http://a.trove.test/post/1"]


async def test_a_gzip_file_not_named_as_xml_is_never_downloaded(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result = await get(client, url(server, "/release.tar.gz"), is_parseable=HTTP.is_parseable)
    assert result.outcome is CrawlOutcome.REJECTED
    assert result.error_message == "content type application/gzip is not parsed"
    assert result.bytes_read == 0
    assert await asyncio.to_thread(server.wait_for, "closed:/release.tar.gz", 10.0)


async def test_a_gzipped_sitemap_that_inflates_past_the_cap_is_a_bomb(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result = await get(client, url(server, "/sitemap-bomb.xml.gz"), is_parseable=HTTP.is_parseable)
    assert result.outcome is CrawlOutcome.REJECTED
    assert result.body is None
    assert result.error_message is not None
    assert "inflates past" in result.error_message


async def test_missing_content_type_is_left_to_the_parseable_check(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    asked: list[str | None] = []

    def anything(content_type: str | None) -> bool:
        asked.append(content_type)
        return True

    result = await fetch(
        client,
        url(server, "/no-type"),
        etag=None,
        last_modified=None,
        limits=LIMITS,
        is_parseable=anything,
    )
    assert asked == [None]
    assert result.outcome is CrawlOutcome.SUCCESS


async def test_redirect_loop_is_a_failure(client: httpx.AsyncClient, server: LocalServer) -> None:
    result = await get(client, url(server, "/loop-a"))
    assert result.outcome is CrawlOutcome.FAILED
    assert result.error_message is not None
    assert "redirect loop" in result.error_message
    assert len(server.requests_to("/loop-a")) == 1


async def test_redirect_to_itself_is_a_loop(client: httpx.AsyncClient, server: LocalServer) -> None:
    result = await get(client, url(server, "/self"))
    assert result.outcome is CrawlOutcome.FAILED
    assert result.error_message is not None
    assert "redirect loop" in result.error_message


async def test_redirect_chain_within_the_limit_ends_at_the_final_url(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result = await get(client, url(server, "/chain/5"))
    assert result.outcome is CrawlOutcome.SUCCESS
    assert result.body == PAGE
    assert result.final_url == url(server, "/chain/0")
    assert result.redirects == tuple(url(server, f"/chain/{n}") for n in (4, 3, 2, 1, 0))
    assert result.etag == '"v1"'


async def test_each_redirect_hop_passes_the_gate_after_the_previous_response(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    gated: list[tuple[tuple[str, ...], int]] = []

    def seen(hop: str) -> int:
        return len(server.requests_to(urlsplit(hop).path))

    async def before_hop(hops: tuple[str, ...]) -> None:
        gated.append((hops, seen(hops[-1])))

    hops = tuple(url(server, f"/chain/{n}") for n in (2, 1, 0))
    before = [seen(hop) for hop in hops]
    result = await get(client, url(server, "/chain/3"), before_hop=before_hop)
    assert result.outcome is CrawlOutcome.SUCCESS
    assert [g[0] for g in gated] == [hops[:1], hops[:2], hops[:3]]
    # The gate is asked before its hop is requested, never after.
    assert [g[1] for g in gated] == before
    assert result.redirects == hops


async def test_a_paused_chain_resumes_at_its_next_hop(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    async def pause(hops: tuple[str, ...]) -> None:
        raise RedirectPaused(hops, at=123.0)

    before = len(server.requests_to("/chain/3"))
    with pytest.raises(RedirectPaused) as paused:
        await get(client, url(server, "/chain/4"), before_hop=pause)
    assert paused.value.hops == (url(server, "/chain/3"),)
    assert len(server.requests_to("/chain/3")) == before  # never requested while paused
    result = await get(client, url(server, "/chain/4"), resume=paused.value.hops)
    assert result.outcome is CrawlOutcome.SUCCESS
    assert result.url == url(server, "/chain/4")
    assert result.final_url == url(server, "/chain/0")
    assert result.redirects == tuple(url(server, f"/chain/{n}") for n in (3, 2, 1, 0))


async def test_a_resumed_chain_still_counts_every_hop_against_the_limit(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    followed = tuple(url(server, f"/chain/{n}") for n in (5, 4, 3, 2, 1))
    result = await get(client, url(server, "/chain/6"), resume=followed)
    assert result.outcome is CrawlOutcome.FAILED
    assert result.error_message == "too many redirects (more than 5)"


async def test_time_spent_at_the_gate_is_not_part_of_the_timeout(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    async def slow_gate(hops: tuple[str, ...]) -> None:
        await asyncio.sleep(0.4)

    limits = FetchLimits(total_timeout=0.5)
    result = await get(client, url(server, "/chain/3"), limits=limits, before_hop=slow_gate)
    assert result.outcome is CrawlOutcome.SUCCESS


async def test_one_redirect_more_than_the_limit_is_a_failure(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    before = len(server.requests_to("/chain/0"))
    result = await get(client, url(server, "/chain/6"))
    assert result.outcome is CrawlOutcome.FAILED
    assert result.error_message == "too many redirects (more than 5)"
    assert result.final_url == url(server, "/chain/1")
    assert len(server.requests_to("/chain/0")) == before


async def test_redirect_to_another_host_is_reported_not_followed(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    before = len(server.requests_to("/page", host="b.trove.test"))
    result = await get(client, url(server, "/cross"))
    assert result.outcome is CrawlOutcome.REJECTED
    assert result.error_message == "redirected to another host"
    assert result.status_code == 301
    assert result.redirect_target == f"http://b.trove.test:{server.port}/page"
    assert result.final_url == url(server, "/cross")
    assert len(server.requests_to("/page", host="b.trove.test")) == before


async def test_redirect_to_metadata_address_is_never_connected(
    client: httpx.AsyncClient, recorder: RecordingBackend, server: LocalServer
) -> None:
    result = await get(client, url(server, "/to-metadata"))
    assert result.outcome is CrawlOutcome.REJECTED
    assert result.redirect_target == "http://169.254.169.254/latest/meta-data/"
    assert recorder.connects == [("127.0.0.1", server.port)]


async def test_redirect_to_a_non_http_scheme_is_rejected(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result = await get(client, url(server, "/to-mailto"))
    assert result.outcome is CrawlOutcome.REJECTED
    assert result.redirect_target is None


async def test_unparseable_redirect_location_is_a_failure_not_an_exception(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result = await get(client, url(server, "/bad-location"))
    assert result.outcome is CrawlOutcome.FAILED
    assert result.error_message is not None
    assert "location" in result.error_message.lower()


async def test_redirect_without_location_is_a_failure(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result = await get(client, url(server, "/no-location"))
    assert result.outcome is CrawlOutcome.FAILED
    assert result.status_code == 302


async def test_same_host_redirect_to_a_disallowed_path_is_blocked_by_robots(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    async def robots_allows(target: str) -> bool:
        return "/private/" not in target

    result = await get(client, url(server, "/to-disallowed"), robots_allows=robots_allows)
    assert result.outcome is CrawlOutcome.BLOCKED_ROBOTS
    assert server.requests_to("/private/page") == []


async def test_a_hop_whose_robots_txt_is_unavailable_fails_the_attempt_without_asking_it(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    async def robots_allows(target: str) -> bool:
        raise RobotsUnavailable("HTTP 503")

    result = await get(client, url(server, "/to-disallowed"), robots_allows=robots_allows)
    assert result.outcome is CrawlOutcome.FAILED
    assert result.error_message == "robots.txt unavailable: HTTP 503"
    assert server.requests_to("/private/page") == []


async def test_a_robots_check_that_fails_between_hops_is_not_blamed_on_the_site(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    # robots.txt is read from the shared KV between hops: a read that times out (the
    # broker's trouble) raises a TimeoutError, which is not the site timing out.
    async def robots_allows(target: str) -> bool:
        raise nats.errors.TimeoutError

    with pytest.raises(HopGateFailed) as failed:
        await get(client, url(server, "/to-disallowed"), robots_allows=robots_allows)
    assert isinstance(failed.value.__cause__, nats.errors.TimeoutError)
    assert server.requests_to("/private/page") == []


@pytest.mark.parametrize(
    "target",
    [
        "http://10.0.0.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:{port}/page",
        "http://127.0.0.2:{port}/page",
        "http://0.0.0.0:{port}/page",
        "http://[::ffff:10.0.0.1]/",
        "http://evil.trove.test/",
    ],
)
async def test_link_to_a_refused_address_fails_without_a_connection(
    client: httpx.AsyncClient, recorder: RecordingBackend, server: LocalServer, target: str
) -> None:
    result = await get(client, target.format(port=server.port))
    assert result.outcome is CrawlOutcome.FAILED
    assert result.error_message is not None
    assert result.error_message.startswith("blocked address: ")
    assert recorder.connects == []


async def test_unreachable_port_is_a_failure(client: httpx.AsyncClient) -> None:
    result = await get(client, f"http://a.trove.test:{free_port()}/")
    assert result.outcome is CrawlOutcome.FAILED
    assert result.error_message is not None
    assert "ConnectError" in result.error_message


async def test_url_with_an_unsupported_scheme_is_a_failure(client: httpx.AsyncClient) -> None:
    result = await get(client, "ftp://a.trove.test/file")
    assert result.outcome is CrawlOutcome.FAILED


@pytest.mark.parametrize(("path", "status"), [("/404", 404), ("/410", 410)])
async def test_client_error_is_blocked_4xx(
    client: httpx.AsyncClient, server: LocalServer, path: str, status: int
) -> None:
    result = await get(client, url(server, path))
    assert result.outcome is CrawlOutcome.BLOCKED_4XX
    assert result.status_code == status
    assert result.body is None
    assert not result.retryable


async def test_429_carries_retry_after_in_seconds(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result = await get(client, url(server, "/429-seconds"))
    assert result.outcome is CrawlOutcome.BLOCKED_4XX
    assert result.status_code == 429
    assert result.retry_after == 120.0
    assert result.retryable


async def test_a_429_with_two_retry_afters_waits_for_the_longest(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    # Joined ("100, 5, Wed, ...") they were no number and no date: the default pause.
    result = await get(client, url(server, "/429-twice"))
    assert result.status_code == 429
    assert result.retry_after == 100.0


async def test_429_carries_retry_after_as_an_http_date(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result = await get(client, url(server, "/429-date"))
    assert result.status_code == 429
    assert result.retry_after is not None
    assert 80.0 <= result.retry_after <= 90.0


async def test_a_429_dated_on_a_slow_clock_waits_what_the_site_asked(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    # Read on our clock, the date was an hour past: a wait of 0, the site asked again.
    result = await get(client, url(server, "/429-slow-clock"))
    assert result.status_code == 429
    assert result.retry_after == 120.0


async def test_503_is_blocked_5xx_with_retry_after(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result = await get(client, url(server, "/503"))
    assert result.outcome is CrawlOutcome.BLOCKED_5XX
    assert result.retry_after == 30.0
    assert result.retryable


async def test_500_is_blocked_5xx(client: httpx.AsyncClient, server: LocalServer) -> None:
    result = await get(client, url(server, "/500"))
    assert result.outcome is CrawlOutcome.BLOCKED_5XX
    assert result.retry_after is None


def test_retry_after_parses_seconds_dates_and_refuses_garbage() -> None:
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("0") == 0.0
    assert parse_retry_after(" 3600 ") == 3600.0
    assert parse_retry_after("Wed, 01 Jan 2025 12:02:00 GMT", now=now) == 120.0
    assert parse_retry_after("Wednesday, 01-Jan-25 12:00:30 GMT", now=now) == 30.0
    assert parse_retry_after("Wed, 01 Jan 2025 11:00:00 GMT", now=now) == 0.0
    for garbage in (
        "soon",
        "-5",
        "",
        "1e9",
        "Wed, 99 Foo 2025",
        "Fri, 31 Dec 9999999999 23:59:59 GMT",
    ):
        assert parse_retry_after(garbage, now=now) is None, garbage
    assert parse_retry_after(None) is None
    # Longer than anything is a year: a finite number an event carries.
    year = 365 * 86_400.0
    assert parse_retry_after("1" * 400) == year
    assert parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now=now) == year


def test_a_dated_retry_after_is_read_on_the_sites_own_clock() -> None:
    """Date and Retry-After are both the site's clock: a site an hour slow asking for two
    minutes is left two minutes, not asked again at once (its date read as past)."""
    ours = datetime(2025, 1, 1, 13, 0, 0, tzinfo=UTC)
    asked = "Wed, 01 Jan 2025 12:02:00 GMT"
    assert retry_after(httpx.Headers({"retry-after": asked}), now=ours) == 0.0
    slow = httpx.Headers([("date", "Wed, 01 Jan 2025 12:00:00 GMT"), ("retry-after", asked)])
    assert retry_after(slow, now=ours) == 120.0
    # A Date that does not parse is no clock: the first that does is the site's.
    for date in ("yesterday", "Mon, 01 Jan 99999999999 00:00:00 GMT"):
        garbled = httpx.Headers([("date", date), ("retry-after", asked)])
        assert retry_after(garbled, now=ours) == 0.0, date
    twice = httpx.Headers(
        [("date", "soon"), ("date", "Wed, 01 Jan 2025 12:01:00 GMT"), ("retry-after", asked)]
    )
    assert retry_after(twice, now=ours) == 60.0
    # Seconds are seconds whatever the clocks say.
    seconds = httpx.Headers([("date", "Wed, 01 Jan 2025 12:00:00 GMT"), ("retry-after", "30")])
    assert retry_after(seconds, now=ours) == 30.0


def test_a_cached_answers_dated_retry_after_counts_the_time_it_was_kept() -> None:
    """A cache hands on the site's answer as the site dated it, an hour ago, and says so
    (``Age``): the site's now is an hour after its ``Date``, and its two minutes are two
    minutes from now, not an hour and two minutes."""
    ours = datetime(2025, 1, 1, 13, 0, 0, tzinfo=UTC)
    cached = [
        ("date", "Wed, 01 Jan 2025 12:00:00 GMT"),
        ("retry-after", "Wed, 01 Jan 2025 13:02:00 GMT"),
    ]
    assert retry_after(httpx.Headers([*cached, ("age", "3600")]), now=ours) == 120.0
    assert retry_after(httpx.Headers(cached), now=ours) == 3720.0
    # An Age accounts for a Date behind ours, never more: a cache that dates its answer
    # anew and says it kept it an hour asks for the hour it says.
    fresh = [("date", "Wed, 01 Jan 2025 13:00:00 GMT"), ("age", "3599")]
    later = ("retry-after", "Wed, 01 Jan 2025 14:00:00 GMT")
    assert retry_after(httpx.Headers([*fresh, later]), now=ours) == 3600.0
    # An Age that is no whole number is none; a Date at the end of time takes none.
    assert retry_after(httpx.Headers([*cached, ("age", "an hour")]), now=ours) == 3720.0
    end = [("date", "Fri, 31 Dec 9999 23:00:00 GMT"), ("age", "99999999999999")]
    assert (
        retry_after(
            httpx.Headers([*end, ("retry-after", "Fri, 31 Dec 9999 23:30:00 GMT")]), now=ours
        )
        == 1800.0
    )


@pytest.mark.parametrize(
    ("source", "target", "followed"),
    [
        ("http://a.test/x", "http://a.test/y", True),
        ("http://a.test/x", "https://a.test/y", True),
        ("http://a.test/x", "http://a.test:80/y", True),
        ("https://a.test/x", "http://a.test/y", False),
        ("http://a.test/x", "http://www.a.test/y", False),
        ("http://a.test:8080/x", "http://a.test:8081/y", False),
        ("http://a.test:8080/x", "https://a.test:8443/y", False),
        ("http://A.test/x", "http://a.TEST/y", True),
    ],
)
def test_same_site_allows_only_the_same_origin_or_its_https_upgrade(
    source: str, target: str, followed: bool
) -> None:
    assert same_site(httpx.URL(source), httpx.URL(target)) is followed


async def test_body_reader_never_decodes_past_the_cap_even_for_one_huge_chunk() -> None:
    # One network chunk holding the whole bomb: zlib's output bound still applies.
    class OneChunk(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield BOMB

    response = httpx.Response(200, headers={"Content-Encoding": "gzip"}, stream=OneChunk())
    reader = BodyReader(max_bytes=MIB)
    body = await reader.read(response)
    assert len(body) == MIB
    assert reader.truncated
    assert reader.bytes_read == len(BOMB)


class _Pieces(httpx.AsyncByteStream):
    """A body as the network hands it over: ``size`` bytes a piece."""

    def __init__(self, data: bytes, size: int) -> None:
        self.data, self.size = data, size

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for at in range(0, len(self.data), self.size):
            yield self.data[at : at + self.size]


@pytest.mark.parametrize("size", [1, 2, 3, 11, 4096])
@pytest.mark.parametrize(
    ("file", "held"),
    [
        (gzip.compress(SITEMAP), SITEMAP),
        (gzip.compress(SITEMAP[:7]) + gzip.compress(SITEMAP[7:]), SITEMAP),
        # Zero padding after the last member (a tape's block, a fixed-size upload).
        (gzip.compress(SITEMAP) + b"\0" * 512, SITEMAP),
        # Trailing bytes whose first is the first of a member's: ignored however cut.
        (gzip.compress(SITEMAP) + b"\x1f\x00 trailing", SITEMAP),
        (b"\x1f", b"\x1f"),
        (SITEMAP, SITEMAP),
    ],
    ids=["one-member", "two-members", "padded", "trailing-1f", "one-byte", "not-packed"],
)
async def test_a_gzip_file_is_unpacked_whole_wherever_the_network_cuts_it(
    file: bytes, held: bytes, size: int
) -> None:
    response = httpx.Response(200, stream=_Pieces(file, size))
    reader = BodyReader(max_bytes=MIB, packed=True)
    assert await reader.read(response) == held
    assert not reader.truncated


def _saying_nothing(size: int) -> list[tuple[str | None, bool, bytes]]:
    """Compressed bodies of ``size`` bytes or more that inflate to nothing: a gzip coding
    of empty flushed blocks, and a gzip file of empty members."""
    coding = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    opened = coding.flush(zlib.Z_FULL_FLUSH)  # gzip's header, then an empty stored block
    block = opened[-5:]  # 00 00 00 ff ff: a stored block of no bytes, not the last
    empty_blocks = opened + block * (size // len(block) + 1)
    member = gzip.compress(b"", mtime=0)
    empty_members = member * (size // len(member) + 1)
    return [("gzip", False, empty_blocks), (None, True, empty_members)]


@pytest.mark.parametrize(("coding", "packed", "body"), _saying_nothing(size=MIB))
async def test_a_compressed_body_is_read_no_further_than_the_cap_of_bytes_carried(
    coding: str | None, packed: bool, body: bytes
) -> None:
    cap = 64 * 1024
    headers = {"Content-Encoding": coding} if coding else {}
    response = httpx.Response(200, headers=headers, stream=_Pieces(body, 4096))
    reader = BodyReader(max_bytes=cap, max_ratio=100, packed=packed)
    assert await reader.read(response) == b""
    assert reader.truncated
    assert reader.bytes_read <= cap * MOST_CARRIED + 4096


def _compressed(data: bytes, coding: str, flush_every: int | None = None) -> bytes:
    """``data`` in ``coding`` (``raw``: deflate without zlib's wrapper), flushed every
    ``flush_every`` bytes as a server streaming a page may."""
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS, "raw": -zlib.MAX_WBITS}
    packer = zlib.compressobj(6, zlib.DEFLATED, wbits[coding])
    step = flush_every or len(data)
    out = b"".join(
        packer.compress(data[at : at + step]) + packer.flush(zlib.Z_SYNC_FLUSH)
        for at in range(0, len(data), step)
    )
    return out + packer.flush()


@pytest.mark.parametrize("extra", [0, 1, 500])
async def test_a_gzip_file_of_more_members_than_read_is_cut_after_the_last_read(
    extra: int,
) -> None:
    # A file appended to an entry at a time: each entry its own member.
    entries = [b"<url><loc>https://blog.example/%d</loc></url>" % n for n in range(MOST_MEMBERS)]
    member = gzip.compress(b"<url><loc>https://blog.example/more</loc></url>", mtime=0)
    file = b"".join(gzip.compress(entry, mtime=0) for entry in entries) + member * extra
    response = httpx.Response(200, stream=_Pieces(file, 64 * 1024))
    reader = BodyReader(max_bytes=8 * MIB, max_ratio=100, packed=True)
    assert await reader.read(response) == b"".join(entries)
    assert reader.truncated is (extra > 0)


@pytest.mark.parametrize("packed", [False, True], ids=["coding", "file"])
async def test_a_bomb_is_a_bomb_whatever_follows_it_in_the_same_read(packed: bool) -> None:
    # The bomb's stream ends just past the cap; what follows (junk after a coding, empty
    # members in a file) came in the same read and inflates nothing.
    cap = 256 * 1024
    after = gzip.compress(b"", mtime=0) * 3000
    body = gzip.compress(b"\0" * (cap + 1), compresslevel=9) + after
    headers = {"Content-Encoding": "gzip"} if not packed else {}
    response = httpx.Response(200, headers=headers, stream=_Pieces(body, len(body)))
    reader = BodyReader(max_bytes=cap, max_ratio=100, packed=packed)
    with pytest.raises(DecompressionBomb):
        await reader.read(response)


async def test_a_gzip_coded_xml_file_ends_with_its_stream() -> None:
    """Served as XML with a gzip coding, a ``.xml.gz``'s layer is a coding, read to its
    stream's end; a server keeping the body open after it is not waited for."""

    class HeldOpen(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield gzip.compress(SITEMAP)
            await asyncio.Event().wait()  # never set
            yield b""

    headers = {"Content-Type": "text/xml", "Content-Encoding": "gzip"}
    response = httpx.Response(200, headers=headers, stream=HeldOpen())
    reader = BodyReader(max_bytes=MIB, packed=True)
    assert await asyncio.wait_for(reader.read(response), timeout=10) == SITEMAP


_NOISE = random.Random(7).randbytes(64 * 1024)


@pytest.mark.parametrize(
    ("coding", "flush_every", "text"),
    [
        ("gzip", None, _NOISE),
        ("deflate", None, _NOISE),
        ("raw", None, _NOISE),
        # Text that compresses a quarter, flushed every 64 bytes: 9% more, not less.
        ("gzip", 64, base64.b64encode(_NOISE)),
    ],
    ids=["gzip", "deflate", "raw-deflate", "gzip-flushed"],
)
async def test_a_page_just_under_the_cap_that_does_not_compress_is_read_whole(
    coding: str, flush_every: int | None, text: bytes
) -> None:
    # Compressed, it carries more than it holds (by 5 bytes a flush or a stored block):
    # more than the cap, before the stream's last bytes, which the network hands over
    # apart.
    cap = 64 * 1024
    page = text[: cap - 8]
    body = _compressed(page, coding, flush_every)
    assert len(body) - 4 > cap
    header = "deflate" if coding == "raw" else coding
    pieces = _Pieces(body, len(body) - 4)
    response = httpx.Response(200, headers={"Content-Encoding": header}, stream=pieces)
    reader = BodyReader(max_bytes=cap, max_ratio=100)
    assert await reader.read(response) == page
    assert not reader.truncated


async def test_wait_for_a_free_connection_in_the_pod_is_not_the_hosts_answer_time(
    server: LocalServer, recorder: RecordingBackend
) -> None:
    # One connection for two requests: the second waits for the first in the pool. The
    # host answers each in SLOW_ANSWER; the learned gap multiplies what it is said to take.
    one = PoolConfig(max_connections=1, max_keepalive_connections=1, shards=1)
    async with build_client(_settings(), network_backend=recorder, pool=one) as client:
        results = await asyncio.gather(*(get(client, url(server, "/slow")) for _ in range(2)))
    first, second = sorted(results, key=lambda r: r.elapsed)
    assert first.outcome is second.outcome is CrawlOutcome.SUCCESS
    assert second.elapsed >= 2 * SLOW_ANSWER - 0.05  # it did wait for the connection
    for result in (first, second):
        assert SLOW_ANSWER * 1000 - 50 <= result.duration_ms < SLOW_ANSWER * 1000 + 300


async def test_a_stall_of_the_pods_event_loop_is_not_the_hosts_answer_time(
    server: LocalServer,
) -> None:
    # The host answers in SLOW_ANSWER. While it works on it, the fetcher's event loop
    # stalls (a burst of parsing, a long callback) for longer than that: the response
    # waits in the socket. The kernel saw when it came; the pod's clock did not.
    stall = 3 * SLOW_ANSWER
    loop = asyncio.get_running_loop()
    loop.call_later(SLOW_ANSWER / 5, time.sleep, stall)
    async with build_client(_settings()) as client:
        result = await get(client, url(server, "/slow"))
    assert result.outcome is CrawlOutcome.SUCCESS
    assert result.elapsed >= stall  # the pod did take that long to see the answer
    assert SLOW_ANSWER * 1000 - 50 <= result.duration_ms < SLOW_ANSWER * 1000 + 200
    assert result.answered is not None


async def test_a_body_the_pod_read_late_ended_when_its_last_byte_arrived(
    server: LocalServer,
) -> None:
    # As above: the host answers in SLOW_ANSWER while the pod's loop stands still. The
    # host's gap counts from when the answer arrived, not from when the pod read it.
    stall = 3 * SLOW_ANSWER
    async with build_client(_settings()) as client:
        asked = time.time()
        asyncio.get_running_loop().call_later(SLOW_ANSWER / 5, time.sleep, stall)
        result = await get(client, url(server, "/slow"))
        read = time.time()
    assert result.outcome is CrawlOutcome.SUCCESS
    ended = result.ended_at(read)
    assert read - asked >= stall
    # Never before the last byte came (the server sent it SLOW_ANSWER after the request).
    assert asked + SLOW_ANSWER <= ended < asked + SLOW_ANSWER + 0.2


@pytest.mark.parametrize("framing", ["until the close", "with a length"])
async def test_a_body_that_ends_with_the_close_ended_when_the_host_closed(framing: str) -> None:
    # An HTTP/1.0 answer without a length ends when the host closes the connection: a
    # host holding it seconds after its last byte is answering until then. The close
    # carries no data, so the kernel's stamp of the last data would end it early.
    hold = 1.0
    closed: list[float] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        body = b"<html><title>Held</title><p>A page.</p></html>"
        length = f"Content-Length: {len(body)}\r\n" if framing == "with a length" else ""
        head = f"HTTP/1.0 200 OK\r\nContent-Type: text/html\r\n{length}\r\n"
        writer.write(head.encode() + body)
        await writer.drain()
        await asyncio.sleep(hold)  # the host's own behaviour: it holds the socket
        closed.append(time.time())
        writer.close()

    async def closed_yet() -> bool:
        return bool(closed)

    host = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = host.sockets[0].getsockname()[1]
    try:
        async with build_client(_settings()) as client:
            asked = time.time()
            result = await get(client, f"http://a.trove.test:{port}/held")
            await eventually(closed_yet, until=bool, timeout=10, interval=0.05)
    finally:
        host.close()
        await host.wait_closed()
    assert result.outcome is CrawlOutcome.SUCCESS
    assert result.received_at is not None
    if framing == "until the close":
        assert result.received_at >= closed[0]
    else:
        # A length ends the body at its last byte: the host's hold after it is idle.
        assert result.received_at < asked + hold / 2


@pytest.mark.parametrize("path", ["/big", "/no-type"])
async def test_a_body_cut_short_or_left_unread_ends_when_the_pod_lets_go_of_it(
    client: httpx.AsyncClient, server: LocalServer, path: str
) -> None:
    # The rest of such a body may still be on its way: the host is not done yet.
    result = await get(client, url(server, path))
    assert result.received_at is None
    assert result.ended_at(1234.5) == 1234.5


async def test_an_answer_through_redirects_is_timed_over_every_request(
    server: LocalServer,
) -> None:
    async with build_client(_settings()) as client:
        result = await get(client, url(server, "/redirect-to-slow"))
    assert result.outcome is CrawlOutcome.SUCCESS
    assert result.redirects
    assert result.answered is not None
    assert SLOW_ANSWER * 1000 - 50 <= result.duration_ms < SLOW_ANSWER * 1000 + 200


def test_the_fetch_limits_are_the_ones_the_settings_give() -> None:
    limits = FetchLimits.from_settings(
        _settings(max_body_bytes=4096, max_redirects=1, request_timeout=7.5)
    )
    assert (limits.max_body_bytes, limits.max_redirects, limits.total_timeout) == (4096, 1, 7.5)
