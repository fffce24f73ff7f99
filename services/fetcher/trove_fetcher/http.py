"""One page fetch: redirects, conditional GET, a bounded body, and an outcome for everything.

``fetch()`` never raises for anything a site can do; it returns a ``FetchResult``
whose ``outcome`` is one of:

=================  ==================================================================
success            2xx with a parseable content type; ``body`` holds at most
                   ``max_body_bytes`` of the decoded body (``truncated`` when cut:
                   a long page is still parsed from its first 2 MiB)
not_modified       304 to a conditional request (``If-None-Match``/``If-Modified-Since``)
rejected           2xx that is not parseable (the body is never read), a redirect to
                   another host (not followed: ``redirect_target`` reports it for
                   discovery), a redirect to a URL longer than ``MAX_URL_LENGTH``, a
                   decompression bomb, an unsupported Content-Encoding
blocked_4xx        4xx, 429 included: its ``retry_after`` is set, and the caller backs
                   off on ``status_code in (429, 503)`` like ``CrawlCompleted.retryable``
blocked_5xx        5xx
blocked_robots     a same-host redirect to a path robots.txt disallows (only when
                   ``robots_allows`` is given)
timeout            connect, read or write timeout, or the whole fetch over ``total_timeout``
failed             connection, TLS and protocol errors, a blocked address (SSRF guard),
                   too many redirects, a redirect loop, a corrupt compressed body
=================  ==================================================================

Redirects are followed only on the same site: same scheme, host and port, or the
``http://host`` -> ``https://host`` upgrade. Another host is another domain's
politeness slot, robots.txt and scope, so its URL goes back to discovery instead.
Every hop goes through the SSRF-guarded client, so each one is checked anyway.

Every hop is a request the site sees, so it is as polite as the first: the caller's
``before_hop`` gate is awaited before each one (the fetcher waits there for the
host's gap, measured from the end of the redirect response). The gate may pause the
chain by raising ``RedirectPaused``; the caller continues it later with ``resume``
(the hops followed so far). Time spent in the gate does not count against
``total_timeout``, which bounds the requests themselves.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
import idna

from trove_fetcher.errors import (
    BlockedAddress,
    CrumbledBody,
    DecompressionBomb,
    HopGateFailed,
    NetworkAway,
    RedirectPaused,
    RobotsUnavailable,
    TooManyRedirects,
    UndecodableBody,
    UnsupportedContent,
)
from trove_fetcher.transport import ANSWER_TIME, MOST_CARRIED, AnswerTime
from trove_schema.events import MAX_URL_LENGTH, CrawlOutcome
from trove_schema.media import GZIP_TYPES, is_gzipped_xml, media_type
from trove_schema.settings import FetcherSettings

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 2 * 1024 * 1024
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
#: A redirect that says the page lives at its target now.
PERMANENT_REDIRECTS = frozenset({301, 308})
#: Only what ``BodyReader`` decodes with a bounded output (no brotli, no zstd).
ACCEPT_ENCODING = "gzip, deflate"
ACCEPT = (
    "text/html,application/xhtml+xml;q=0.9,application/rss+xml;q=0.9,"
    "application/atom+xml;q=0.9,application/xml;q=0.8,*/*;q=0.5"
)
_MAX_MESSAGE = 500
#: Where an error's text starts quoting bytes (``bytearray(b'...')``, ``b'...'``).
_QUOTED_BYTES = re.compile(r"""\b(?:bytearray|memoryview)\(|(?<![^\s(\[{=,:])b['"]""")
#: Characters kept of a protocol error's own text: its kind ("illegal chunk header",
#: "peer closed connection without ...") fits, a line of the peer's quoted in it does not.
_PROTOCOL_TEXT = 120
#: Response headers kept for the audit (``CrawlCompleted.response_headers``): what tells
#: a server, a CDN, a challenge or a rate limit apart. Never Set-Cookie, never a body.
AUDIT_HEADERS = (
    "server",
    "content-type",
    "cf-ray",
    "cf-mitigated",
    "cf-cache-status",
    "retry-after",
    "x-robots-tag",
    "cache-control",
    "via",
    "x-cache",
    "x-served-by",
    "x-amz-cf-id",
    "x-amzn-waf-action",
)
_AUDIT_VALUE_LENGTH = 256
_DEFAULT_PORTS = {"http": 80, "https": 443}

#: Awaited before each redirect hop with the hops so far (the last one about to be
#: requested); returns when it may go, with the longest the hop may take (the time left
#: under its own host's hold; None: no bound of its own), or raises ``RedirectPaused``.
HopGate = Callable[[tuple[str, ...]], Awaitable[float | None]]


async def pass_gate(
    gate: HopGate, hops: Sequence[str], deadline: asyncio.Timeout, permanent: bool = False
) -> None:
    """Wait at ``gate`` for the next hop; the wait is not part of the fetch's timeout,
    and what the gate allows the hop bounds it too. A pause says whether every hop so
    far was ``permanent``, for the chain to carry."""
    loop = asyncio.get_running_loop()
    when = deadline.when()
    remaining = None if when is None else when - loop.time()
    deadline.reschedule(None)
    allowed: float | None = None
    try:
        allowed = await gate(tuple(hops))
    except RedirectPaused as paused:
        paused.permanent = permanent
        raise
    except Exception as exc:
        raise HopGateFailed(f"hop gate: {exc}") from exc
    finally:
        bounds = [bound for bound in (remaining, allowed) if bound is not None]
        if bounds:
            deadline.reschedule(loop.time() + max(0.0, min(bounds)))


@dataclass(frozen=True, kw_only=True, slots=True)
class FetchLimits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: Same-host hops followed; one more is "too many redirects".
    max_redirects: int = 5
    #: Seconds for the whole fetch: every hop, headers and body.
    total_timeout: float = 30.0
    #: A body that inflates past ``max_body_bytes`` faster than this is a bomb.
    max_decompression_ratio: float = 100.0

    @classmethod
    def from_settings(cls, settings: FetcherSettings) -> FetchLimits:
        return cls(
            max_body_bytes=settings.max_body_bytes,
            max_redirects=settings.max_redirects,
            total_timeout=settings.request_timeout,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class FetchResult:
    #: The URL as requested.
    url: str
    outcome: CrawlOutcome
    #: The last URL requested (``url`` unless a same-host redirect was followed).
    final_url: str
    status_code: int | None = None
    #: The decoded body, for ``success`` only.
    body: bytes | None = None
    #: The body was cut at ``max_body_bytes``.
    truncated: bool = False
    #: The Content-Type header as sent (parameters included).
    content_type: str | None = None
    etag: str | None = None
    last_modified: str | None = None
    x_robots_tag: str | None = None
    #: The last request carried a validator (``If-None-Match``/``If-Modified-Since``):
    #: not every request of a page's does (``fetch``'s ``validators_url``).
    conditional: bool = False
    #: Seconds to wait, from Retry-After (delta-seconds or HTTP-date).
    retry_after: float | None = None
    error_message: str | None = None
    #: Where a redirect that was not followed (another host) pointed.
    redirect_target: str | None = None
    #: The same-host hops followed, in order.
    redirects: tuple[str, ...] = ()
    #: Every hop followed was a permanent redirect (301, 308); False without a hop.
    permanent: bool = False
    #: ``time.monotonic()`` when the fetch started and ended.
    started: float
    completed: float
    #: Body bytes received from the network, before content decoding.
    bytes_read: int = 0
    #: Seconds spent waiting at the hop gate (politeness), not requesting.
    waited: float = 0.0
    #: Seconds the requests waited in this pod for a connection of its pool.
    queued: float = 0.0
    #: Seconds the host took to answer the requests as the kernel timed them
    #: (``transport.AnswerTime``); None where it did not time every one.
    answered: float | None = None
    #: When (``time.time()``) the last byte of the final response arrived, as the kernel
    #: timed it, if its body was read to the end (``transport.AnswerTime``).
    received_at: float | None = None
    #: The final response's ``AUDIT_HEADERS`` that were sent (lower-case names).
    response_headers: dict[str, str] = field(default_factory=dict)

    @property
    def elapsed(self) -> float:
        return self.completed - self.started

    @property
    def duration_ms(self) -> int:
        """Milliseconds the host took to answer, not the pod: the learned gap
        (``host_gap``) is a multiple of it. The kernel's time from request sent to
        response received where it has one for every request (``AnswerTime``), which
        no stall of the pod's event loop lengthens. Else the pod's clock, less the
        hop-gate waits and the waits for a free connection in the pod's pool (under
        load those are seconds)."""
        if self.answered is not None:
            return round(self.answered * 1000)
        return max(0, round((self.elapsed - self.waited - self.queued) * 1000))

    def ended_at(self, now: float) -> float:
        """When the host was done with this fetch, ``now`` at the latest: the moment
        its gap counts from. A response read whole ended when its last byte arrived;
        the pod may have read it much later (a busy event loop), and that lag is the
        pod's, not time the host needs to rest. Any other ending is ``now``: a body cut
        short or left unread may still be on its way."""
        if self.received_at is None:
            return now
        return min(now, self.received_at)

    @property
    def retryable(self) -> bool:
        """Worth another attempt later (the same rule as ``CrawlCompleted.retryable``)."""
        return self.outcome in (
            CrawlOutcome.FAILED,
            CrawlOutcome.TIMEOUT,
            CrawlOutcome.BLOCKED_5XX,
        ) or self.status_code in (429, 503)


#: A Retry-After past this (a year) is read as this. Every wait a site may ask is capped
#: far below it downstream; a number too big for a float (400 digits) would be
#: infinite, which an event's JSON cannot carry.
LONGEST_RETRY_AFTER = 365 * 86_400.0
#: The largest ``Age`` read: 2^31 seconds, where RFC 9111 (1.2.2) has a cache stop.
MAX_AGE = 2**31


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds from a Retry-After value: delta-seconds or an HTTP-date; None if invalid."""
    if value is None:
        return None
    value = value.strip()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return min(float(value), LONGEST_RETRY_AFTER)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):  # a year past datetime's
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return min(max(0.0, seconds), LONGEST_RETRY_AFTER)


def response_date(headers: httpx.Headers) -> datetime | None:
    """When the response says it was sent (its first ``Date`` that parses), else None."""
    for value in headers.get_list("date"):
        try:
            said = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):  # a year past datetime's
            continue
        # "-0000": UTC, said to carry no zone.
        return said.replace(tzinfo=UTC) if said.tzinfo is None else said
    return None


def site_now(headers: httpx.Headers, now: datetime | None = None) -> datetime:
    """Now on the site's clock, as the response's ``Date`` tells it, plus its ``Age`` (a
    cache's answer is dated when the site made it, and has waited that long since) as
    far as the ``Date`` is behind ours;
    ``now`` (ours, by default the system's) when it has no ``Date`` that parses, or one
    within the second a ``Date`` counts in: ours is finer then, and a wait read on it
    is not a second long."""
    ours = now or datetime.now(UTC)
    said = response_date(headers)
    if said is None:
        return ours
    # An Age accounts for a Date behind ours, never more: a cache that dated the answer
    # anew and says it kept it an hour would otherwise shorten every wait by that hour.
    behind = (ours - said).total_seconds()
    if behind > 1.0:
        said += timedelta(seconds=min(_age(headers), behind))
    return ours if abs((said - ours).total_seconds()) <= 1.0 else said


def _age(headers: httpx.Headers) -> int:
    """The response's ``Age`` in seconds (RFC 9111 5.1: its first value that is a whole
    number, capped as caches cap it), 0 without one."""
    for value in headers.get_list("age"):
        text = value.strip()
        if text.isascii() and text.isdigit():
            return min(int(text[:12]), MAX_AGE)
    return 0


def retry_after(headers: httpx.Headers, *, now: datetime | None = None) -> float | None:
    """The longest wait the response's Retry-After headers ask for; None if none is valid.

    Each header on its own: joined, as ``headers.get`` joins them ("100, 5"), two were
    read as none, and an HTTP-date has a comma of its own.

    An HTTP-date is read against the site's own now (``site_now``: the response's
    ``Date`` and ``Age``; ``now``, our clock, without a ``Date``): the site wrote both on
    its clock, and their difference is the wait it meant. On ours, a site whose clock
    runs an hour slow asking for two minutes was asked again at once. A ``Date`` that
    lies makes the wait no longer than a Retry-After in seconds could, and every wait is
    capped downstream.
    """
    moment = site_now(headers, now)
    waits = [
        wait
        for value in headers.get_list("retry-after")
        if (wait := parse_retry_after(value, now=moment)) is not None
    ]
    return max(waits, default=None)


def overlong_target(url: httpx.URL) -> str | None:
    """Why a redirect to ``url`` is not followed when it is longer than any URL Trove
    takes: no event could record it, and the hops of a paused chain travel in a deferred
    message's headers, which the server counts against its ``max_payload``."""
    if len(str(url)) > MAX_URL_LENGTH:
        return f"redirect target too long (more than {MAX_URL_LENGTH} characters)"
    return None


def audit_headers(headers: httpx.Headers) -> dict[str, str]:
    """The ``AUDIT_HEADERS`` a response sent, each value cut to 256 characters."""
    return {
        name: value[:_AUDIT_VALUE_LENGTH]
        for name in AUDIT_HEADERS
        if (value := headers.get(name)) is not None
    }


def unusable_location(exc: httpx.RemoteProtocolError) -> bool:
    """Whether ``exc`` is httpx refusing a redirect's Location, which it parses even when
    redirects are not followed: an answer the site gave, not a protocol failure."""
    return str(exc).startswith("Invalid URL in location header")


# --- body ---------------------------------------------------------------------------


class _Identity:
    encoding = "identity"
    #: The body's framing (Content-Length, the last chunk) tells where it ends.
    done = False
    cut = False

    def __init__(self) -> None:
        self.consumed = 0

    def decode(self, data: bytes, limit: int) -> bytes:
        self.consumed += len(data)
        return data[:limit]

    def flush(self) -> bytes:
        return b""


#: How every gzip member starts (RFC 1952).
GZIP_MAGIC = b"\x1f\x8b"
#: Members of a gzip file read at most: a member costs ~1.4 µs to start, and a file of
#: empty ones (20 bytes each) would spend ~280 ms of the loop before the bound on bytes
#: carried. A file appended to a write at a time reads its first 16,384 and is cut.
MOST_MEMBERS = 16_384


class _Zlib:
    """gzip or deflate, never producing more than asked for per call.

    With ``members``, a gzip file rather than a coding: every member is read, as gunzip
    reads ``cat a.gz b.gz``, and the stream ends only at bytes that start no member.
    """

    def __init__(self, encoding: str, *, members: bool = False) -> None:
        self.encoding = encoding
        self.members = members
        self._inflate = self._stream()
        self._fed = 0
        self._started = False
        self._ended = False
        self._members = 1
        #: Bytes after an ended member, moved out of it (``_moved``): kept while too few
        #: to tell the start of a member (``1f 8b``) from trailing bytes.
        self._held = b""
        self._moved = False
        #: Ended at ``MOST_MEMBERS``, with more to read.
        self.cut = False

    def _stream(self) -> Any:
        wbits = 16 + zlib.MAX_WBITS if self.encoding == "gzip" else zlib.MAX_WBITS
        return zlib.decompressobj(wbits)

    @property
    def consumed(self) -> int:
        """Compressed bytes the output came from: not those left in the read after the
        stream (or a member) ended, which would lower a bomb's ratio below its limit."""
        stream = self._inflate
        after = len(stream.unused_data) if stream.eof and not self._moved else len(self._held)
        return self._fed - len(stream.unconsumed_tail) - after

    @property
    def done(self) -> bool:
        """The compressed stream has ended: whatever follows it is never part of the page."""
        return self._ended or (self._inflate.eof and not self.members)

    def decode(self, data: bytes, limit: int) -> bytes:
        self._fed += len(data)
        # Joined once: a piece of the network can hold thousands of small members.
        out: list[bytes] = []
        given = 0
        while not self.done and given < limit:
            if self._inflate.eof:
                # Members only: what follows the last one is the next, or the file's end.
                if not self._moved:
                    self._held, self._moved = self._inflate.unused_data, True
                data, self._held = self._held + data, b""
                if len(data) < len(GZIP_MAGIC) and GZIP_MAGIC.startswith(data):
                    self._held = data  # too few to tell yet: wait for the next read
                    break
                if not data.startswith(GZIP_MAGIC):
                    self._ended = True  # trailing bytes (zero padding): ignored, as gunzip does
                    break
                if self._members == MOST_MEMBERS:
                    self._ended = self.cut = True
                    break
                self._members += 1
                self._inflate = self._stream()
                self._moved = False
            piece = self._inflate_piece(data, limit - given)
            out.append(piece)
            given += len(piece)
            data = b""
            if not self._inflate.eof:
                break
        return out[0] if len(out) == 1 else b"".join(out)

    def flush(self) -> bytes:
        # A stream cut short gives what it held so far, already handed over.
        return b""

    def _inflate_piece(self, data: bytes, limit: int) -> bytes:
        first = not self._started
        self._started = True
        try:
            out: bytes = self._inflate.decompress(data, limit)
        except zlib.error as exc:
            if self.encoding == "deflate" and first:
                # "deflate" is sent both zlib-wrapped (RFC 9110) and raw by old servers.
                self._inflate = zlib.decompressobj(-zlib.MAX_WBITS)
                self.encoding = "raw deflate"
                return self._inflate_piece(data, limit)
            raise UndecodableBody(f"corrupt {self.encoding} body: {exc}") from exc
        return out


class _GzipFile:
    """A body that may be a gzip file (``BodyReader.packed``): unpacked, every member,
    when it starts as gzip does; read as it came otherwise (a server that unpacked it
    on the way, a plain file given the name)."""

    def __init__(self) -> None:
        self._head = b""
        self._body: _Identity | _Zlib | None = None

    @property
    def encoding(self) -> str:
        return "gzip" if isinstance(self._body, _Zlib) else "identity"

    @property
    def consumed(self) -> int:
        return len(self._head) if self._body is None else self._body.consumed

    @property
    def done(self) -> bool:
        return self._body is not None and self._body.done

    @property
    def cut(self) -> bool:
        return self._body is not None and self._body.cut

    def decode(self, data: bytes, limit: int) -> bytes:
        if self._body is None:
            self._head += data
            if len(self._head) < len(GZIP_MAGIC) and GZIP_MAGIC.startswith(self._head):
                return b""  # too short to tell yet
            packed = self._head.startswith(GZIP_MAGIC)
            self._body = _Zlib("gzip", members=True) if packed else _Identity()
            data, self._head = self._head, b""
        return self._body.decode(data, limit)

    def flush(self) -> bytes:
        return self._head  # a body too short to tell is as it came


#: Content codings that change the bytes (RFC 9110's registry): one of these Trove did
#: not ask for cannot be read. Any other token (PHP's copied ``Content-Encoding: none``,
#: a charset sent there) names no coding, and the body is read as it came, as browsers do.
_CODINGS = frozenset({"gzip", "x-gzip", "deflate", "br", "zstd", "compress", "x-compress"})


def _decoder(content_encoding: str | None, *, packed: bool = False) -> _Identity | _Zlib:
    codings = [
        c.strip().lower()
        for c in (content_encoding or "").split(",")
        if c.strip().lower() in _CODINGS
    ]
    if not codings:
        return _Identity()
    if len(codings) == 1 and codings[0] in ("gzip", "x-gzip"):
        # A gzip file whose one layer is also named as the coding: a file's members.
        return _Zlib("gzip", members=packed)
    if len(codings) == 1 and codings[0] == "deflate":
        return _Zlib("deflate")
    raise UnsupportedContent(f"unsupported content encoding {content_encoding!r}")


#: Pieces of a body read between two turns of the event loop: a piece costs ~14 µs of
#: the loop (httpcore, h11 and this reader), and a body of thousands would hold the
#: other pages' tasks between two socket reads.
PIECES_A_TURN = 256
#: After this many pieces, a body whose pieces are ``CRUMB_BYTES`` or shorter on average
#: is given up (``CrumbledBody``): a server sending a chunk a byte would take ~30 s of
#: the loop to fill the size cap. A page streamed a row or a template fragment a chunk
#: (tens of bytes each, a few thousand: ~70 ms) is read; so is any body, past
#: ``MOST_PIECES`` pieces, whose pieces are longer than ``SMALL_PIECE`` on average.
CRUMBS_AFTER = 4096
CRUMB_BYTES = 8
MOST_PIECES = 65_536
SMALL_PIECE = 64


@dataclass(slots=True)
class BodyReader:
    """Reads a streamed response's body, content-decoded, keeping at most ``max_bytes``.

    It decodes gzip and deflate itself from ``aiter_raw()`` with zlib's output bound,
    so a compressed body never inflates in memory past the cap. A body that reaches
    the cap while inflating at more than ``max_ratio`` to one is a decompression bomb
    (``DecompressionBomb``); one that reaches it at an ordinary ratio is cut and marked
    ``truncated``. A bomb that stays under the cap is just a small page. Reading stops
    where the compressed stream ends, as browsers ignore what follows it, and once
    far more than ``max_bytes`` came over the network (``MOST_CARRIED``, ``truncated``).
    """

    max_bytes: int
    max_ratio: float = math.inf
    #: The body may be a gzip file (``media.is_gzipped_xml``): unpacked when it starts as
    #: one does, unless the server also named that coding (Apache's ``AddEncoding x-gzip
    #: .gz`` sends the one layer as both).
    packed: bool = False
    #: Raw body bytes received so far (what the network carried).
    bytes_read: int = field(default=0, init=False)
    truncated: bool = field(default=False, init=False)

    async def read(self, response: httpx.Response) -> bytes:
        coding = response.headers.get("content-encoding")
        # Served as a gzip file and named as the coding too, the one layer is the file's,
        # every member read; served as XML, the coding is a coding, ended by its stream.
        as_file = self.packed and media_type(response.headers.get("content-type")) in GZIP_TYPES
        decoder: _Identity | _Zlib | _GzipFile = _decoder(coding, packed=as_file)
        if self.packed and isinstance(decoder, _Identity):
            decoder = _GzipFile()
        body = bytearray()
        pieces = 0
        async for chunk in response.aiter_raw():
            self.bytes_read += len(chunk)
            pieces += 1
            if pieces % PIECES_A_TURN == 0:
                crumbs = pieces >= CRUMBS_AFTER and self.bytes_read <= pieces * CRUMB_BYTES
                if crumbs or (pieces >= MOST_PIECES and self.bytes_read < pieces * SMALL_PIECE):
                    raise CrumbledBody(
                        f"body sent in {pieces} pieces of {self.bytes_read // pieces} bytes "
                        "on average"
                    )
                await asyncio.sleep(0)
            room = self.max_bytes - len(body)
            # One byte more than fits tells "cut" from "exactly full" without a flush.
            out = decoder.decode(chunk, room + 1)
            if len(out) > room:
                body += out[:room]
                self.truncated = True
                break
            body += out
            if decoder.done:
                # A server that keeps the body open after the stream (or trickles junk
                # after it) would hold the page until the total timeout threw it away.
                self.truncated = decoder.cut
                break
            if self.bytes_read > self.max_bytes * MOST_CARRIED:
                # Far more carried than inflated: a compressed stream that says next to
                # nothing (empty blocks, empty gzip members) would be read, and spend
                # the loop's time, until the total timeout.
                self.truncated = True
                break
        if not self.truncated:
            body += decoder.flush()[: self.max_bytes - len(body)]
        if self.truncated:
            ratio = len(body) / max(decoder.consumed, 1)
            if ratio > self.max_ratio:
                raise DecompressionBomb(
                    f"{decoder.encoding} body inflates past {self.max_bytes} bytes "
                    f"at {ratio:.0f}:1 (limit {self.max_ratio:g}:1)"
                )
        return bytes(body)


# --- fetch --------------------------------------------------------------------------


@dataclass(slots=True)
class _Trace:
    """What is known so far, so that an error mid-way still reports it."""

    url: str
    final_url: str
    status_code: int | None = None
    headers: httpx.Headers | None = None
    redirects: list[str] = field(default_factory=list)
    #: Every hop followed so far was a permanent redirect.
    permanent: bool = True
    redirect_target: str | None = None
    reader: BodyReader | None = None
    #: Seconds spent at the hop gate.
    waited: float = 0.0
    #: Seconds the hops' requests waited for a connection of the pool.
    queued: float = 0.0
    #: Requests sent, and how many of them the kernel timed (``AnswerTime``), in all.
    sent: int = 0
    timed: int = 0
    answered: float = 0.0
    #: The latest response's ``AnswerTime.received_at``.
    received_at: float | None = None
    #: The latest request carried a validator.
    conditional: bool = False

    def answer_seconds(self) -> float | None:
        """What the host took over every request, if the kernel timed each one."""
        return self.answered if self.sent and self.timed == self.sent else None


class _PoolWait:
    """httpcore's ``trace`` extension for one request: the first event it reports (a
    new connection's connect, or the request line on a kept one) is when the request
    left the pool's queue."""

    def __init__(self) -> None:
        self.asked = time.monotonic()
        self.left: float | None = None

    async def __call__(self, name: str, info: dict[str, Any]) -> None:
        if self.left is None:
            self.left = time.monotonic()

    @property
    def seconds(self) -> float:
        """The wait (0 when the transport reports nothing)."""
        return 0.0 if self.left is None else max(0.0, self.left - self.asked)


@dataclass(frozen=True, slots=True)
class _Ending:
    outcome: CrawlOutcome
    error_message: str | None = None
    body: bytes | None = None


def _port(url: httpx.URL) -> int | None:
    return url.port or _DEFAULT_PORTS.get(url.scheme)


def same_site(source: httpx.URL, target: httpx.URL) -> bool:
    """Whether a redirect from ``source`` to ``target`` stays on the site (and is followed)."""
    if source.host != target.host:
        return False
    if source.scheme == target.scheme:
        return _port(source) == _port(target)
    return (
        source.scheme == "http"
        and target.scheme == "https"
        and _port(source) == 80
        and _port(target) == 443
    )


def error_text(exc: BaseException) -> str:
    """``exc``'s type and text for an ``error_message``, which is kept for good, without
    the peer's bytes: h11 (under httpx) quotes the line it could not read, and a body
    sent as chunked that is not makes that line the page itself, which is never stored.
    The text ends where it starts quoting bytes; a protocol error's is cut short anyway."""
    text = str(exc)
    quoted = _QUOTED_BYTES.search(text)
    if quoted is not None:
        text = text[: quoted.start()]
    text = text.strip().rstrip(":").rstrip()
    if isinstance(exc, httpx.ProtocolError):
        text = text[:_PROTOCOL_TEXT]
    message = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return message[:_MAX_MESSAGE]


async def fetch(
    client: httpx.AsyncClient,
    url: str,
    *,
    etag: str | None,
    last_modified: str | None,
    limits: FetchLimits,
    is_parseable: Callable[[str | None], bool],
    validators_url: str | None = None,
    robots_allows: Callable[[str], Awaitable[bool]] | None = None,
    before_hop: HopGate | None = None,
    resume: Sequence[str] = (),
    resumed_permanent: bool = False,
    accept: str = ACCEPT,
    now: Callable[[], float] = time.time,
) -> FetchResult:
    """GET ``url`` and classify what happened. Never raises for what a site can do.

    ``is_parseable`` is called with the media type (``text/html``: lowercase, no
    parameters; None when the header is missing) of a 2xx response; when it says
    no, the body is not read. ``robots_allows``, when given, is asked about every
    same-host redirect target before it is requested, then ``before_hop``, which
    may raise ``RedirectPaused`` (passed on to the caller, as is ``HopGateFailed``).
    ``resume`` continues a paused chain: the hops already followed, the last one
    still to be requested (``resumed_permanent``: all by permanent redirects).
    ``accept`` is the Accept header of every hop (a fetch strategy's,
    ``trove_fetcher.strategies``). ``now`` is the clock a Retry-After date
    is read on (the fetcher's is the pods' shared one, ``trove_fetcher.clock``).
    ``etag`` and ``last_modified`` go only to a request of ``validators_url``, the URL
    whose answer gave them (the page's own, ``url``, when None).
    """
    started = time.monotonic()
    trace = _Trace(url=url, final_url=url)
    if resume:
        trace.redirects = list(resume)
        trace.final_url = resume[-1]
        trace.permanent = resumed_permanent
    try:
        async with asyncio.timeout(limits.total_timeout) as deadline:
            ending = await _follow(
                client,
                trace,
                etag,
                last_modified,
                validators_url,
                limits,
                is_parseable,
                robots_allows,
                before_hop,
                deadline,
                accept,
            )
    except (RedirectPaused, HopGateFailed, NetworkAway):
        raise
    except TimeoutError:
        ending = _Ending(
            CrawlOutcome.TIMEOUT, f"no complete response within {limits.total_timeout:g} s"
        )
    except httpx.TimeoutException as exc:
        ending = _Ending(CrawlOutcome.TIMEOUT, error_text(exc))
    except BlockedAddress as exc:
        ending = _Ending(CrawlOutcome.FAILED, f"blocked address: {exc}")
    except (DecompressionBomb, UnsupportedContent, CrumbledBody) as exc:
        ending = _Ending(CrawlOutcome.REJECTED, str(exc))
    except (TooManyRedirects, UndecodableBody) as exc:
        ending = _Ending(CrawlOutcome.FAILED, str(exc))
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        ending = _Ending(CrawlOutcome.FAILED, error_text(exc))
    except Exception as exc:
        # A bug or a case nobody thought of: one page must not take the worker down.
        log.exception("unexpected error fetching %s", url)
        ending = _Ending(CrawlOutcome.FAILED, f"unexpected error: {error_text(exc)}")
    completed = time.monotonic()
    headers = trace.headers or httpx.Headers()
    reader = trace.reader
    return FetchResult(
        url=url,
        outcome=ending.outcome,
        final_url=trace.final_url,
        status_code=trace.status_code,
        body=ending.body,
        truncated=reader is not None and reader.truncated and ending.body is not None,
        content_type=headers.get("content-type"),
        etag=headers.get("etag"),
        last_modified=headers.get("last-modified"),
        # One line a header: a "name:" prefix aims the rest of its own header only, so
        # "googlebot: nofollow" must not take a later header's "noindex" with it.
        x_robots_tag="\n".join(headers.get_list("x-robots-tag")) or None,
        conditional=trace.conditional,
        retry_after=retry_after(headers, now=datetime.fromtimestamp(now(), UTC)),
        error_message=ending.error_message,
        redirect_target=trace.redirect_target,
        redirects=tuple(trace.redirects),
        permanent=trace.permanent and bool(trace.redirects),
        started=started,
        completed=completed,
        bytes_read=0 if reader is None else reader.bytes_read,
        waited=trace.waited,
        queued=trace.queued,
        answered=trace.answer_seconds(),
        received_at=trace.received_at,
        response_headers=audit_headers(headers),
    )


def _request_headers(
    etag: str | None, last_modified: str | None, accept: str = ACCEPT
) -> dict[str, str]:
    headers = {"Accept": accept, "Accept-Encoding": ACCEPT_ENCODING}
    # A validator a site sent in non-ASCII cannot go back in a header: skip it.
    if etag and etag.isascii():
        headers["If-None-Match"] = etag
    if last_modified and last_modified.isascii():
        headers["If-Modified-Since"] = last_modified
    return headers


async def _follow(
    client: httpx.AsyncClient,
    trace: _Trace,
    etag: str | None,
    last_modified: str | None,
    validators_url: str | None,
    limits: FetchLimits,
    is_parseable: Callable[[str | None], bool],
    robots_allows: Callable[[str], Awaitable[bool]] | None,
    before_hop: HopGate | None,
    deadline: asyncio.Timeout,
    accept: str,
) -> _Ending:
    page = current = httpx.URL(trace.url)
    if current.scheme not in _DEFAULT_PORTS:
        return _Ending(CrawlOutcome.FAILED, f"unsupported URL scheme {current.scheme!r}")
    visited = {current.copy_with(fragment=None)}
    for hop_url in trace.redirects:  # a resumed chain: these were followed already
        current = httpx.URL(hop_url)
        visited.add(current)
    # The validators go only to the URL whose answer gave them: where a redirect leads
    # elsewhere now, a site whose files share one Last-Modified would answer 304 for
    # the new target, and the page would keep the signals of the one it led to before.
    # A request without that URL (an older release's) sends them to the page's own URL
    # only: at worst a page that redirects is read whole once after the upgrade.
    owner = validators_url or trace.url
    while True:
        # Its URL as the event named it (the page's, canonical) or as a hop wrote it.
        if owner == str(current) or (current is page and owner == trace.url):
            validators = etag, last_modified
        else:
            validators = None, None
        headers = _request_headers(*validators, accept)
        trace.conditional = "If-None-Match" in headers or "If-Modified-Since" in headers
        pool_wait = _PoolWait()
        request = client.build_request(
            "GET", current, headers=headers, extensions={"trace": pool_wait}
        )
        trace.sent += 1
        try:
            response = await client.send(request, stream=True)
        except (httpx.InvalidURL, idna.IDNAError) as exc:
            # httpx parses Location even when not following (``next_request``), and
            # decodes a punycode host with idna (``xn--ls8h.la``); the request URL is
            # already valid, so only a redirect's Location gets here.
            return _Ending(CrawlOutcome.REJECTED, f"unusable redirect Location: {exc}")
        except httpx.RemoteProtocolError as exc:
            if not unusable_location(exc):
                raise
            # A Location httpx cannot parse at all (``host:80:80``, a control character):
            # the site's answer, not its network failing.
            return _Ending(CrawlOutcome.REJECTED, f"unusable redirect Location: {exc}")
        finally:
            trace.queued += pool_wait.seconds
        try:
            trace.status_code = response.status_code
            trace.headers = response.headers
            if response.status_code not in REDIRECT_STATUSES:
                return await _final(response, trace, *validators, limits, is_parseable)
            hop = _redirect_target(response, current)
            moved = response.status_code in PERMANENT_REDIRECTS
        finally:
            # Closed before anything else is awaited: a redirect body is never read.
            await response.aclose()
            answer = response.extensions.get(ANSWER_TIME)
            trace.received_at = None
            if isinstance(answer, AnswerTime) and answer.seconds is not None:
                trace.timed += 1
                trace.answered += answer.seconds
                trace.received_at = answer.received_at
        if isinstance(hop, _Ending):
            return hop
        if not same_site(current, hop):
            trace.redirect_target = str(hop)
            return _Ending(CrawlOutcome.REJECTED, "redirected to another host")
        if hop in visited:
            raise TooManyRedirects(f"redirect loop back to {hop}")
        if len(trace.redirects) >= limits.max_redirects:
            raise TooManyRedirects(f"too many redirects (more than {limits.max_redirects})")
        if robots_allows is not None:
            try:
                allowed = await _allowed(robots_allows, str(hop))
            except RobotsUnavailable as exc:
                return _Ending(CrawlOutcome.FAILED, f"robots.txt unavailable: {exc}")
            if not allowed:
                trace.redirect_target = str(hop)
                return _Ending(
                    CrawlOutcome.BLOCKED_ROBOTS, "redirect target disallowed by robots.txt"
                )
        visited.add(hop)
        trace.redirects.append(str(hop))
        trace.permanent = trace.permanent and moved
        trace.final_url = str(hop)
        current = hop
        if before_hop is not None:
            gate_opened = time.monotonic()
            try:
                await pass_gate(before_hop, trace.redirects, deadline, trace.permanent)
            finally:
                trace.waited += time.monotonic() - gate_opened


async def _allowed(robots_allows: Callable[[str], Awaitable[bool]], url: str) -> bool:
    try:
        return await robots_allows(url)
    except RobotsUnavailable:
        raise
    except Exception as exc:
        raise HopGateFailed(f"robots.txt check: {exc}") from exc


def redirect_url(current: httpx.URL, location: str) -> httpx.URL:
    """Where a redirect's ``location`` leads from ``current``: without its fragment, and
    without a user:pass@, which httpx would send on as an Authorization header and which
    no URL Trove keeps carries (``trove_schema.urls``)."""
    return current.join(location).copy_with(fragment=None, userinfo=b"")


def _redirect_target(response: httpx.Response, current: httpx.URL) -> httpx.URL | _Ending:
    location = response.headers.get("location", "").strip()
    if not location:
        return _Ending(CrawlOutcome.FAILED, f"HTTP {response.status_code} without a Location")
    try:
        scheme = urlsplit(location).scheme.lower()
        if scheme and scheme not in _DEFAULT_PORTS:
            return _Ending(CrawlOutcome.REJECTED, f"redirected to a {scheme}: URL")
        target = redirect_url(current, location)
    except (ValueError, httpx.InvalidURL) as exc:
        return _Ending(CrawlOutcome.FAILED, f"invalid redirect Location: {exc}")
    too_long = overlong_target(target)
    return target if too_long is None else _Ending(CrawlOutcome.REJECTED, too_long)


async def _final(
    response: httpx.Response,
    trace: _Trace,
    etag: str | None,
    last_modified: str | None,
    limits: FetchLimits,
    is_parseable: Callable[[str | None], bool],
) -> _Ending:
    status = response.status_code
    if status == 304:
        if etag or last_modified:
            return _Ending(CrawlOutcome.NOT_MODIFIED)
        return _Ending(CrawlOutcome.FAILED, "HTTP 304 to an unconditional request")
    if 200 <= status < 300:
        kind = media_type(response.headers.get("content-type"))
        # A gzipped sitemap is read as the XML it holds, under the same caps.
        packed = is_gzipped_xml(kind, trace.final_url)
        if not is_parseable("application/xml" if packed else kind):
            return _Ending(CrawlOutcome.REJECTED, f"content type {kind or '(none)'} is not parsed")
        trace.reader = BodyReader(
            max_bytes=limits.max_body_bytes,
            max_ratio=limits.max_decompression_ratio,
            packed=packed,
        )
        body = await trace.reader.read(response)
        return _Ending(CrawlOutcome.SUCCESS, body=body)
    if 400 <= status < 500:
        return _Ending(CrawlOutcome.BLOCKED_4XX, f"HTTP {status}")
    if 500 <= status < 600:
        return _Ending(CrawlOutcome.BLOCKED_5XX, f"HTTP {status}")
    return _Ending(CrawlOutcome.REJECTED, f"unexpected HTTP status {status}")
