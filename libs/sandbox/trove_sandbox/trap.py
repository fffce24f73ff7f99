"""The misbehaving host: every way a real server can hurt a crawler, on demand.

Nothing on the normal sandbox web links here; fetcher tests request these paths
directly to prove that timeouts, size limits, redirect rules, charset handling
and politeness signals hold up against hostile or broken servers.
"""

from __future__ import annotations

import asyncio
import calendar
import html
import re
import threading
import zlib
from collections.abc import AsyncGenerator, Mapping
from datetime import UTC, datetime
from http import HTTPStatus

from trove_sandbox.response import HTML, Response, ok, redirect

TRAP_HOST = "trap.trove.test"

#: Seconds /slow-headers waits before its head; /slow-body lasts as long (one byte a second).
SLOW_HEADERS_SECONDS = 60.0
SLOW_BODY_SECONDS = 120
#: Exact size of /huge.
HUGE_BYTES = 10 * 1024 * 1024
#: Decompressed size of /gzip-bomb (about 100 KB on the wire).
BOMB_BYTES = 100 * 1024 * 1024
#: Longest /redirect-chain/<n> served; larger n is a 404, not a memory hazard.
MAX_CHAIN = 1000
#: The fixed validator of /etag.
FIXED_ETAG = '"trove-sandbox-fixed-etag"'
DEFAULT_PRIVATE_TARGET = "http://127.0.0.1:1/"

_MODIFIED = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)
_CHUNK = 64 * 1024

_bomb_lock = threading.Lock()
_bomb: bytes | None = None
_huge: bytes | None = None


def gzip_bomb() -> bytes:
    """The gzip bomb, built once per process (about 0.3 s) and then reused."""
    global _bomb
    with _bomb_lock:
        if _bomb is None:
            squeezer = zlib.compressobj(9, zlib.DEFLATED, 31)
            head = b"<!DOCTYPE html><html><head><title>Bomb</title></head><body>"
            parts = [squeezer.compress(head)]
            block = b" " * (1024 * 1024)
            remaining = BOMB_BYTES - len(head)
            while remaining > 0:
                piece = block[: min(remaining, len(block))]
                parts.append(squeezer.compress(piece))
                remaining -= len(piece)
            parts.append(squeezer.flush())
            _bomb = b"".join(parts)
        return _bomb


def huge_page() -> bytes:
    """Exactly ``HUGE_BYTES`` of valid HTML, built once per process."""
    global _huge
    if _huge is None:
        head = b"<!DOCTYPE html><html><head><title>Huge</title></head><body>\n"
        tail = b"</body></html>\n"
        para = b"<p>This page goes on and on, far beyond what any small web page needs.</p>\n"
        count, rest = divmod(HUGE_BYTES - len(head) - len(tail), len(para))
        _huge = head + para * count + b" " * rest + tail
    return _huge


async def _bomb_body() -> bytes:
    return await asyncio.to_thread(gzip_bomb)


async def _slow_body() -> AsyncGenerator[bytes, None]:
    text = b"<!DOCTYPE html><html><body><p>" + b"." * SLOW_BODY_SECONDS
    yield text[:1]
    for index in range(1, SLOW_BODY_SECONDS):
        await asyncio.sleep(1.0)
        yield text[index : index + 1]


def _chunks_of(data: bytes) -> AsyncGenerator[bytes, None]:
    async def chunks() -> AsyncGenerator[bytes, None]:
        view = memoryview(data)
        for start in range(0, len(data), _CHUNK):
            yield bytes(view[start : start + _CHUNK])

    return chunks()


def _page(title: str, body: str, *, head: str = "", lang: str = "en") -> str:
    return (
        f'<!DOCTYPE html>\n<html lang="{lang}"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title>{head}</head>\n<body>\n{body}\n</body></html>\n"
    )


_INDEX_PATHS = (
    "/slow-body",
    "/slow-headers",
    "/huge",
    "/huge?chunked=1",
    "/gzip-bomb",
    "/redirect-loop",
    "/redirect-self",
    "/redirect-chain/3",
    "/redirect-cross",
    "/redirect-private",
    "/binary.pdf",
    "/bad-charset",
    "/bogus-charset",
    "/status/503?after=5",
    "/etag",
    "/calendar/2024/01",
    "/feed.atom",
    "/noindex",
    "/xrobots",
)

_PDF = (
    b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n"
    b"2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj\n"
    b"3 0 obj<</Type/Page/Parent 2 0 R/MediaBox[0 0 200 200]>>endobj\n"
    b"trailer<</Root 1 0 R>>\n%%EOF\n"
)

_LATIN1_TEXT = (
    "Le café de la gare a fermé, mais la boulangère près de l'église vend encore des"
    " gâteaux à la crème le dimanche matin, et l'été on mange des glaces à l'ombre des"
    " platanes en écoutant les cigales."
)


def trap_response(path: str, query: Mapping[str, str], *, origin: str, elsewhere: str) -> Response:
    """What the trap host answers for ``path`` (no query) given its decoded ``query``.

    ``origin`` is the trap's own ``http://host:port`` and ``elsewhere`` a page on
    a normal host (the target of ``/redirect-cross``).
    """
    if path == "/":
        items = "".join(
            f'<li><a href="{html.escape(p)}">{html.escape(p)}</a></li>' for p in _INDEX_PATHS
        )
        return ok(
            _page("Trap host", f"<h1>Misbehaving host</h1><ul>{items}</ul>"), modified=_MODIFIED
        )
    if path == "/robots.txt":
        return ok("User-agent: *\nAllow: /\n", "text/plain; charset=utf-8", modified=_MODIFIED)
    if path == "/slow-body":
        return Response(200, (("Content-Type", HTML),), stream=_slow_body)
    if path == "/slow-headers":
        return Response(
            200,
            (("Content-Type", HTML),),
            body=_page("Finally", "<p>Sorry for the wait.</p>").encode(),
            delay=SLOW_HEADERS_SECONDS,
        )
    if path == "/huge":
        data = huge_page()
        chunked = query.get("chunked", "") not in ("", "0")
        return Response(
            200,
            (("Content-Type", HTML),),
            stream=lambda: _chunks_of(data),
            length=None if chunked else len(data),
        )
    if path == "/gzip-bomb":
        return Response(
            200,
            (("Content-Type", HTML), ("Content-Encoding", "gzip")),
            lazy=_bomb_body,
        )
    if path == "/redirect-loop":
        return redirect("/redirect-loop/b")
    if path == "/redirect-loop/b":
        return redirect("/redirect-loop")
    if path == "/redirect-self":
        return redirect("/redirect-self")
    if match := re.fullmatch(r"/redirect-chain/(\d{1,4})", path):
        hops = int(match.group(1))
        if hops > MAX_CHAIN:
            return _missing(path)
        if hops == 0:
            return ok(
                _page("End of the chain", "<p>You followed every hop.</p>"), modified=_MODIFIED
            )
        return redirect(f"/redirect-chain/{hops - 1}")
    if path == "/redirect-cross":
        return redirect(elsewhere)
    if path == "/redirect-private":
        return redirect(query.get("to", DEFAULT_PRIVATE_TARGET))
    if path == "/binary.pdf":
        return ok(_PDF, "application/pdf", modified=_MODIFIED)
    if path == "/bad-charset":
        body = _page("Café", f"<p>{_LATIN1_TEXT}</p>", lang="fr")
        return ok(body.encode("latin-1"), HTML, modified=_MODIFIED)
    if path == "/bogus-charset":
        body = _page(
            "Bogus charset",
            "<p>This page names a character set that does not exist.</p>",
        ).replace('<meta charset="utf-8">', '<meta charset="x-nonsense">')
        return ok(body, "text/html; charset=x-nonsense", modified=_MODIFIED)
    if match := re.fullmatch(r"/status/(\d{3})", path):
        return _status(int(match.group(1)), query)
    if path == "/etag":
        fixed = _page("Unchanged", "<p>This page never changes.</p>").encode()
        return Response(200, (("Content-Type", HTML), ("ETag", FIXED_ETAG)), body=fixed)
    if match := re.fullmatch(r"/calendar/(\d{4})/(\d{2})", path):
        return _calendar(int(match.group(1)), int(match.group(2)), path)
    if path == "/feed.atom":
        return ok(_atom(origin), "application/atom+xml", modified=_MODIFIED)
    if path == "/noindex":
        body = _page(
            "Do not index me",
            '<p>Please forget this page.</p><p><a href="/calendar/2024/01">calendar</a></p>',
            head='<meta name="robots" content="noindex,nofollow">',
        )
        return ok(body, modified=_MODIFIED)
    if path == "/xrobots":
        body = _page("Header says noindex", "<p>The header asks engines not to index this.</p>")
        return ok(body, modified=_MODIFIED, extra=(("X-Robots-Tag", "noindex"),))
    return _missing(path)


def _missing(path: str) -> Response:
    body = _page("Not found", f"<p>Nothing at {html.escape(path)}</p>")
    return Response(404, (("Content-Type", HTML),), body=body.encode())


def _status(code: int, query: Mapping[str, str]) -> Response:
    if not 200 <= code <= 599:
        return Response(400, (("Content-Type", "text/plain"),), body=b"status must be 200-599\n")
    try:
        reason = HTTPStatus(code).phrase
    except ValueError:
        reason = "Unknown"
    headers: list[tuple[str, str]] = [("Content-Type", HTML)]
    if code in (429, 503):
        headers.append(("Retry-After", query.get("after", "5")))
    if 300 <= code < 400 and code != 304:
        headers.append(("Location", query.get("to", "/")))
    body = (
        b"" if code in (204, 304) else _page(f"{code} {reason}", f"<p>{code} {reason}</p>").encode()
    )
    return Response(code, tuple(headers), body=body)


def _calendar(year: int, month: int, path: str) -> Response:
    if not (1 <= month <= 12 and 1 <= year <= 9999):
        return _missing(path)
    prev_y, prev_m = (year, month - 1) if month > 1 else (year - 1, 12)
    next_y, next_m = (year, month + 1) if month < 12 else (year + 1, 1)
    links = []
    if prev_y >= 1:
        links.append(f'<a href="/calendar/{prev_y:04d}/{prev_m:02d}">previous month</a>')
    if next_y <= 9999:
        links.append(f'<a href="/calendar/{next_y:04d}/{next_m:02d}">next month</a>')
    table = calendar.HTMLCalendar().formatmonth(year, month)
    body = _page(f"Events in {year:04d}-{month:02d}", f"{table}\n<p>{' | '.join(links)}</p>")
    return ok(body, modified=_MODIFIED)


def _atom(origin: str) -> str:
    targets = ("/calendar/2024/01", "/noindex", "/xrobots", "/etag", "/redirect-chain/2")
    entries = "".join(
        f'<entry><title>Trap {html.escape(t)}</title><link href="{origin}{t}"/>'
        f"<id>{origin}{t}</id><updated>2024-01-01T12:00:00Z</updated></entry>\n"
        for t in targets
    )
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n'
        '<feed xmlns="http://www.w3.org/2005/Atom">\n'
        f"<title>Trap feed</title><id>{origin}/feed.atom</id>"
        f'<link rel="self" href="{origin}/feed.atom"/><link href="{origin}/"/>'
        "<updated>2024-01-01T12:00:00Z</updated>\n"
        f"{entries}</feed>\n"
    )
