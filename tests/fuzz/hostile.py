"""Hostile inputs: a misbehaving HTTP server on loopback, and the pages and seeds it serves.

Every generator takes a ``random.Random`` so a run is repeatable from its seed. The
server speaks raw bytes over asyncio streams rather than through an HTTP library, so it
can break the protocol: invalid status lines, resets mid-header and mid-body, endless
headers, lying lengths, broken gzip. Each case is one path (``/c/<n>``) on one of a few
host names that ``TROVE_RESOLVE`` maps to 127.0.0.1; every link and redirect a case
holds points at those names or at names no stage may accept, never at the outside world.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import random
import socket
import struct
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

#: The names the cases are served under (each its own politeness domain).
FUZZ_DOMAIN = "fuzz.test"
#: Hosts no stage may accept: discovery must reject them, a page's link to one is dropped.
UNFETCHABLE_HOSTS = (
    "xn--ls8h.la",  # an emoji, IDNA 2008 says no
    "\U0001f4a9.la",
    "www.\u2615.example",
    "xn--a.example",
    "exa mple.example",
    "[::1",
    "a..b.example",
    "-.example",
)
#: How much of an endless answer the server writes before giving up on the client.
ENDLESS_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Case:
    """What the server answers on one path: bytes to write, then how to end."""

    kind: str
    data: bytes
    #: "close" (FIN), "reset" (RST after ``data``), "endless" (repeat ``tail``).
    ending: str = "close"
    tail: bytes = b""


def host_name(n: int) -> str:
    return f"h{n}.{FUZZ_DOMAIN}"


# --- building blocks -------------------------------------------------------------


def _response(status: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
    head = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    return status + b"\r\n" + head + b"Connection: close\r\n\r\n" + body


def _ok(body: bytes, content_type: bytes = b"text/html", *extra: tuple[bytes, bytes]) -> bytes:
    headers = [(b"Content-Type", content_type), (b"Content-Length", str(len(body)).encode())]
    return _response(b"HTTP/1.1 200 OK", [*headers, *extra], body)


def _hostile_text(rng: random.Random, size: int = 40) -> str:
    """Text with NULs, controls, surrogate-ish and non-BMP characters, entities."""
    pieces = [
        "\x00",
        "\x01",
        "\x1b[31m",
        "\x7f",
        "\u200b",
        "\U0001f4a9",
        "é",
        "&#0;",
        "&#xD800;",
        "&#x110000;",
        "&bogus;",
        "<",
        "]]>",
        "\ufeff",
        "title",
        " ",
    ]
    return "".join(rng.choice(pieces) for _ in range(rng.randrange(size)))


def _link_target(rng: random.Random, hosts: int, port: int) -> str:
    own = f"http://{host_name(rng.randrange(hosts))}:{port}"
    return rng.choice(
        [
            own + "/c/none",
            own + "/a\x00b",
            own + "/%zz/" + "x" * rng.randrange(5000),
            f"http://{rng.choice(UNFETCHABLE_HOSTS)}/",
            "javascript:alert(1)",
            "mailto:x@example.invalid",
            "\x00",
            "",
            "//" + rng.choice(UNFETCHABLE_HOSTS),
            "http://",
            "http://[::1]:0/",
            own + "/#" + _hostile_text(rng),
            _hostile_text(rng),
        ]
    )


def _html(rng: random.Random, hosts: int, port: int) -> bytes:
    links = "".join(
        f'<a href="{_link_target(rng, hosts, port)}" rel="{rng.choice(["", "nofollow"])}">'
        f"{_hostile_text(rng)}</a>"
        for _ in range(rng.randrange(30))
    )
    charset = rng.choice(["", '<meta charset="utf-8">', '<meta charset="x-bogus\x00">'])
    canonical = f'<link rel="canonical" href="{_link_target(rng, hosts, port)}">'
    html = (
        f"<!doctype html><html><head>{charset}<title>{_hostile_text(rng, 80)}</title>"
        f'{canonical}<meta name="robots" content="{_hostile_text(rng, 5)}">'
        f'<meta name="description" content="{_hostile_text(rng)}"></head>'
        f"<body><p>{_hostile_text(rng, 200)}</p>{links}</body></html>"
    )
    return html.encode("utf-8", "surrogatepass")


def _feed(rng: random.Random, hosts: int, port: int) -> bytes:
    items = "".join(
        f"<item><title>{_hostile_text(rng)}</title>"
        f"<link>{_link_target(rng, hosts, port)}</link></item>"
        for _ in range(rng.randrange(10))
    )
    declaration = rng.choice(
        [
            '<?xml version="1.0" encoding="utf-8"?>',
            '<?xml version="1.0" encoding="ebcdic-cp-us"?>',
            '<?xml version="1.0" encoding="x-unknown"?>',
            "",
        ]
    )
    entity = '<!DOCTYPE r [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;">]>'
    doc = (
        f'{declaration}{rng.choice(["", entity])}<rss version="2.0"><channel>'
        f"<title>{_hostile_text(rng)}&b;</title>{items}</channel></rss>"
    )
    return doc.encode("utf-8", "surrogatepass")


# --- the cases -------------------------------------------------------------------

Family = Callable[[random.Random, int, int], Case]


def _random_bytes(rng: random.Random, hosts: int, port: int) -> Case:
    content_type = rng.choice([b"text/html", b"application/rss+xml", b"application/xhtml+xml"])
    return Case("random-bytes", _ok(rng.randbytes(rng.randrange(1, 20_000)), content_type))


def _truncated_html(rng: random.Random, hosts: int, port: int) -> Case:
    body = _html(rng, hosts, port)
    return Case("truncated-html", _ok(body[: rng.randrange(len(body) + 1)]))


def _truncated_feed(rng: random.Random, hosts: int, port: int) -> Case:
    body = _feed(rng, hosts, port)
    content_type = rng.choice([b"application/rss+xml", b"application/atom+xml", b"text/xml"])
    return Case("truncated-feed", _ok(body[: rng.randrange(len(body) + 1)], content_type))


def _hostile_charset(rng: random.Random, hosts: int, port: int) -> Case:
    charset = rng.choice(
        [b"utf-7", b"x-bogus", b"utf-16", b"utf-32", b"\x01", b"utf-8\x7f", b"cp1252" * 60,
         b"iso-8859-1;;;", b'"utf-8', b"ebcdic-cp-us", b"utf-16le", b"punycode", b"rot13",
         b"idna", b"base64", b"zlib"]
    )  # fmt: skip
    body = _html(rng, hosts, port)
    encoded = rng.choice(
        [body, body.decode("utf-8", "ignore").encode("utf-16", "surrogatepass"),
         b"\xef\xbb\xbf" + body, b"\xff\xfe" + body, b"\xfe\xff\x00<\x00h" + body]
    )  # fmt: skip
    return Case("hostile-charset", _ok(encoded, b"text/html; charset=" + charset))


def _hostile_headers(rng: random.Random, hosts: int, port: int) -> Case:
    body = _html(rng, hosts, port)
    values = [
        b"\x01\x02",
        b"\xff\xfe\xfd",
        b'W/"' + b"e" * 9000 + b'"',
        b"\x7f",
        b" ",
        b"\xed\xa0\x80",
    ]
    extra = [
        (b"ETag", rng.choice(values)),
        (b"Last-Modified", rng.choice([*values, b"Mon, 99 Foo 9999 99:99:99 GMT"])),
        (b"X-Robots-Tag", rng.choice([*values, b"noindex, nofollow", b"TroveBot: \x00"])),
        (b"Retry-After", rng.choice([b"-1", b"1e400", b"soon", b"99999999999999999"])),
    ]
    content_type = rng.choice(
        [b"text/html", b"text/html\x7f", b"text/\xffhtml", b"text/html; x=\x01"]
    )
    return Case("hostile-headers", _ok(body, content_type, *rng.sample(extra, rng.randrange(1, 5))))


def _enormous(rng: random.Random, hosts: int, port: int) -> Case:
    size = rng.choice([100_000, 1_000_000, 3_000_000])
    body = rng.choice(
        [
            b'<html><title>big</title><a href="/' + b"x" * size + b'">x</a>',
            b"<html><title>" + b"t\x00" * (size // 2) + b"</title>",
            b'<html><body data-x="' + b"\x00" * size + b'">',
            b"<div>" * (size // 5),
            b"<html><head><title>" + b"<b>" * 50_000 + b"deep</title>",
        ]
    )
    return Case("enormous-or-deep", _ok(body))


def _lying_type(rng: random.Random, hosts: int, port: int) -> Case:
    body = rng.choice([_html(rng, hosts, port), b"\x89PNG\r\n\x1a\n" + rng.randbytes(500)])
    content_type = rng.choice(
        [b"image/png", b"text/html", b"application/octet-stream", b"", b"text/html; charset"]
    )
    headers = [(b"Content-Length", str(len(body)).encode())]
    if content_type:
        headers.append((b"Content-Type", content_type))
    return Case("lying-content-type", _response(b"HTTP/1.1 200 OK", headers, body))


def _lying_length(rng: random.Random, hosts: int, port: int) -> Case:
    body = _html(rng, hosts, port)
    length = rng.choice(
        [str(len(body) * 2).encode(), str(len(body) // 2).encode(), b"abc", b"-5",
         b"99999999999999999999", str(len(body)).encode() + b", 7"]
    )  # fmt: skip
    headers = [(b"Content-Type", b"text/html"), (b"Content-Length", length)]
    return Case("lying-content-length", _response(b"HTTP/1.1 200 OK", headers, body))


def _broken_gzip(rng: random.Random, hosts: int, port: int) -> Case:
    packed = gzip.compress(_html(rng, hosts, port))
    body, encoding = rng.choice(
        [(rng.randbytes(300), b"gzip"), (packed[: len(packed) // 2], b"gzip"),
         (packed + rng.randbytes(20), b"gzip"), (rng.randbytes(300), b"deflate"),
         (packed, b"br"), (packed, b"gzip, gzip, gzip"),
         (gzip.compress(b"\x00" * 8_000_000), b"gzip")]
    )  # fmt: skip
    return Case("broken-gzip", _ok(body, b"text/html", (b"Content-Encoding", encoding)))


def _reset(rng: random.Random, hosts: int, port: int) -> Case:
    whole = _ok(_html(rng, hosts, port))
    head_end = whole.index(b"\r\n\r\n")
    cut = rng.choice([rng.randrange(1, head_end), rng.randrange(head_end + 4, len(whole))])
    kind = "reset-mid-header" if cut < head_end else "reset-mid-body"
    return Case(kind, whole[:cut], ending=rng.choice(["reset", "close"]))


def _bad_status(rng: random.Random, hosts: int, port: int) -> Case:
    line = rng.choice(
        [b"HTTP/1.1 abc OK", b"ICY 200 OK", b"HTTP/1.1 200", b"HTTP/9.9 200 OK", b"\x00\x01\x02",
         b"HTTP/1.1 999 Whatever", b"HTTP/1.1 -1 No", b"HTTP/1.1 200 OK\x00", b"",
         b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK", b"HTTP/1.1 0200 OK",
         b"HTTP/1.1 200 " + b"O" * 70_000]
    )  # fmt: skip
    body = _html(rng, hosts, port)
    headers = [(b"Content-Type", b"text/html"), (b"Content-Length", str(len(body)).encode())]
    return Case("invalid-status-line", _response(line, headers, body))


def _endless(rng: random.Random, hosts: int, port: int) -> Case:
    if rng.random() < 0.5:
        return Case(
            "endless-headers",
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n",
            ending="endless",
            tail=b"X-Again: " + b"a" * rng.randrange(1, 200) + b"\r\n",
        )
    return Case(
        "endless-body",
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\n\r\n<html>",
        ending="endless",
        tail=b"<p>" + rng.randbytes(64) + b"</p>",
    )


def _bad_redirect(rng: random.Random, hosts: int, port: int) -> Case:
    own = f"http://{host_name(rng.randrange(hosts))}:{port}"
    location = rng.choice(
        [b"http://[::1", f"http://{rng.choice(UNFETCHABLE_HOSTS)}/".encode(), b"\x00",
         b"javascript:alert(1)", b"/%zz", b"//", b"http://" + b"a" * 5000 + b".example/",
         b"", b"\xff\xfe", f"{own}/c/nowhere".encode(), b"/c/" + b"\x7f" * 10,
         f"{own}/{'x' * 3000}".encode(), b"http://xn--ls8h.la:99999/", b"ftp://example.invalid/"]
    )  # fmt: skip
    status = rng.choice([b"HTTP/1.1 301 Moved", b"HTTP/1.1 302 Found", b"HTTP/1.1 308 X"])
    headers = [(b"Content-Length", b"0")]
    if rng.random() < 0.9:
        headers.append((b"Location", location))
    return Case("redirect-to-unparseable", _response(status, headers, b""))


FAMILIES: tuple[Family, ...] = (
    _random_bytes,
    _truncated_html,
    _truncated_feed,
    _hostile_charset,
    _hostile_headers,
    _enormous,
    _lying_type,
    _lying_length,
    _broken_gzip,
    _reset,
    _bad_status,
    _endless,
    _bad_redirect,
)


def _found() -> list[Case]:
    """Cases that once broke a stage, served in every round whatever the random draw."""
    feed = (
        b'<?xml version="1.0"?><rss version="2.0"><channel><title>a&#xD800;</title>'
        b"<item><link>http://h0.fuzz.test/&#55296;</link></item></channel></rss>"
    )
    return [
        # httpx decodes the Location's punycode host with idna and raised from send().
        Case("found: redirect to an emoji host", _response(
            b"HTTP/1.1 302 Found", [(b"Location", b"http://xn--ls8h.la/")], b"")),
        # libxml2 kept the surrogate as bytes lxml could not decode: extraction raised.
        Case("found: feed referring to a surrogate", _ok(feed, b"application/rss+xml")),
        # A title with a NUL: Postgres refuses 0x00 in text.
        Case("found: NUL in the title", _ok(b"<title>a\x00b</title><a href='/\x00'>x</a>")),
    ]  # fmt: skip


def page_cases(rng: random.Random, count: int, *, hosts: int, port: int) -> list[Case]:
    """``count`` cases: the ones found before, then every family in turn, drawn at random."""
    found = _found()[:count]
    drawn = [FAMILIES[n % len(FAMILIES)](rng, hosts, port) for n in range(count - len(found))]
    return found + drawn


# --- seeds -----------------------------------------------------------------------


def seed_messages(rng: random.Random, count: int, *, hosts: int, port: int) -> list[bytes]:
    """Seed messages in every form, mostly wrong: types, sizes, encodings, NULs, hosts."""

    def url() -> str:
        own = f"http://{host_name(rng.randrange(hosts))}:{port}"
        return rng.choice(
            [
                f"{own}/c/none{rng.randrange(1000)}",
                f"{own}/\x00{rng.randrange(1000)}",
                f"http://{rng.choice(UNFETCHABLE_HOSTS)}/",
                f"http://bücher-{rng.randrange(1000)}.invalid/",
                f"http://x{rng.randrange(10**6)}.invalid/{_hostile_text(rng, 8)}",
                "http://127.0.0.1:1/",
                "http://169.254.169.254/latest/meta-data/",
                "ftp://example.invalid/",
                _hostile_text(rng, 20),
                "http://" + "a" * rng.choice([10, 3000]) + ".invalid/",
                f"{own}/" + "p" * 3000,
            ]
        )

    def json_value() -> object:
        return rng.choice(
            [url(), 5, None, True, [], {}, 1e400 if rng.random() < 0.1 else -1, "x" * 600]
        )

    def message() -> bytes:
        form = rng.randrange(9)
        if form == 0:
            return rng.randbytes(rng.randrange(2000))
        if form == 1:
            return url().encode("utf-8", "surrogatepass")
        if form == 2:
            lines = [rng.choice([url(), "# comment", "", " \t "]) for _ in range(rng.randrange(8))]
            return rng.choice(["\n", "\r\n", "\r"]).join(lines).encode("utf-8", "surrogatepass")
        if form == 3:
            document: object = {"url": json_value()}
        elif form == 4:
            document = {"urls": [json_value() for _ in range(rng.randrange(10))]}
        elif form == 5:
            keys = ["url", "urls", "priority", "scope", "pattern", "force", "max_depth", "nope",
                    "URL", "\x00"]  # fmt: skip
            fields = {rng.choice(keys): json_value() for _ in range(rng.randrange(1, 6))}
            fields.setdefault("max_depth", 0)
            document = fields
        elif form == 6:
            document = [json_value() for _ in range(rng.randrange(10))]
        elif form == 7:
            return rng.choice(
                [b"[" * 100_000, b"{" * 50_000, b'{"url":"' + b"\\u0000" * 1000 + b'"}',
                 b'{"url":"\\ud800"}', b"\xef\xbb\xbf" + url().encode("utf-8", "surrogatepass"),
                 url().encode("utf-16"), url().encode("latin-1", "replace"), b"\x00" * 100,
                 b'{"urls":[' + b",".join([b'"http://x.invalid/"'] * 10_050) + b"]}"]
            )  # fmt: skip
        else:
            document = {
                "url": url(),
                "scope": rng.choice(["pattern", "host", "domain", "open", "bogus", 3]),
                "pattern": rng.choice(["(", ".*", "\x00", "a" * 600, None, "[", "(?P<x>"]),
                "max_depth": 0,
            }
        text = json.dumps(document, ensure_ascii=rng.random() < 0.5, allow_nan=True)
        return text.encode("utf-8", "surrogatepass")

    return [message() for _ in range(count)]


# --- the server ------------------------------------------------------------------


@dataclass
class HostileServer:
    port: int
    cases: list[Case]
    #: Requests for each case, by its number (the ``n`` of ``/c/<n>``), counted as each
    #: request's head arrives: the server's own account of how often a page was asked.
    requests: Counter[int] = field(default_factory=Counter)

    def url(self, n: int, hosts: int) -> str:
        return f"http://{host_name(n % hosts)}:{self.port}/c/{n}"


async def _answer(
    cases: list[Case],
    requests: Counter[int],
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    with contextlib.suppress(Exception):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
        target = head.split(b" ", 2)[1].decode("latin-1") if head.count(b" ") >= 2 else "/"
        path = urlsplit(target).path
        number = path.split("/")[2] if path.startswith("/c/") else ""
        if not number.isdigit() or int(number) >= len(cases):
            writer.write(_response(b"HTTP/1.1 404 Not Found", [(b"Content-Length", b"0")], b""))
            await writer.drain()
            return
        requests[int(number)] += 1
        case = cases[int(number)]
        writer.write(case.data)
        await writer.drain()
        if case.ending == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return
        if case.ending == "endless":
            sent = 0
            while sent < ENDLESS_BYTES:
                writer.write(case.tail * 64)
                sent += len(case.tail) * 64
                await writer.drain()
    with contextlib.suppress(Exception):
        writer.close()


@contextlib.asynccontextmanager
async def serve_hostile(cases: list[Case]) -> AsyncIterator[HostileServer]:
    """Serve ``cases`` on 127.0.0.1 (any port), counting the requests for each;
    robots.txt and unknown paths are 404."""
    requests: Counter[int] = Counter()
    server = await asyncio.start_server(
        lambda r, w: _answer(cases, requests, r, w), "127.0.0.1", 0, limit=128 * 1024
    )
    port = server.sockets[0].getsockname()[1]
    try:
        yield HostileServer(port=port, cases=cases, requests=requests)
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), timeout=5)
