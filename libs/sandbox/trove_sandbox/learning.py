"""A web of hosts that each behave one way, for teaching and testing Trove's learning.

Every host answers all its paths the same way, so a test can say what a polite,
learning crawler must end up doing there (``LearningWeb.content_strategy``) and judge
it from the server's own log (the ``Witness``):

============  ======================================================================
html          plain pages with text and links
fast          the same, a second host to compare gaps with
spa           an empty JavaScript shell as HTML; the article as ActivityStreams JSON
              to ``Accept: application/activity+json`` (a Mastodon-like post page)
pdf           small real PDF documents (a title and a line of text)
challenge     403 with a bot challenge (``Server: cloudflare``, ``cf-mitigated:
              challenge``), robots.txt included unless ``challenge_robots`` is off
slow          plain pages, each after ``slow_delay`` seconds
ratelimit     429 while ``limiting`` (with ``Retry-After: retry_after`` when set,
              without one otherwise), plain pages after
down          the connection reset before any byte while ``down_now``, pages after
flaky         a share ``flaky_share`` of requests reset or stalled (``flaky_stall``
              seconds), plain pages otherwise
drift         plain pages until ``drifted`` is set, then the ``spa`` behaviour
aliases       pages /p/N/ also reachable as /p/N/index.html and with ``?ref=``,
              ``?from=`` and ``?share=`` added, each saying rel=canonical /p/N/; and
              /list?page=N, a different page for every N
mixed         plain pages, but every third (/a/0, /a/3, ...) the ``spa`` behaviour
changing      /c/<rate>/N whose text changes as a Poisson process (mean period
              ``CHANGE_PERIODS[rate]`` seconds on ``clock``), with ETag and
              Last-Modified, so an unchanged page answers a conditional GET with 304
scripts       an empty JavaScript shell as HTML, whatever is asked for: no strategy
              gets its content
paced         a strict rate limiter: one request (robots.txt included) every
              ``pace_window`` seconds, counted from the last it let through; 429 to any
              sooner, without Retry-After; plain pages otherwise
============  ======================================================================

Hosts listen on 127.0.0.40 onwards, one IP each, and are named ``<kind>.learn.test``.
Serve with ``serve_learning_web``; every host's robots.txt allows everything.
"""

from __future__ import annotations

import contextlib
import html
import json
import math
import os
import random
import time
import zlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final
from urllib.parse import parse_qsl, urlsplit

from trove_sandbox.response import HTML, Response, not_found, ok
from trove_sandbox.server import SiteServer, Witness
from trove_sandbox.texts import LANGUAGE_ORDER, TEXTS

KINDS: Final = (
    "html",
    "fast",
    "spa",
    "pdf",
    "challenge",
    "slow",
    "ratelimit",
    "down",
    "flaky",
    "drift",
    "aliases",
    "changing",
    "mixed",
    "scripts",
    "paced",
)
FIRST_IP = 40
DOMAIN = "learn.test"
ACTIVITY_JSON = "application/activity+json; charset=utf-8"
PDF = "application/pdf"
#: Mean seconds between changes of the ``changing`` host's pages, by rate name (None:
#: never). Scaled down by ``LearningWeb.time_scale`` for tests.
CHANGE_PERIODS: Final[Mapping[str, float | None]] = {
    "hourly": 3_600.0,
    "daily": 86_400.0,
    "weekly": 7 * 86_400.0,
    "never": None,
}
_SHELL = (
    "<!DOCTYPE html><html><head><meta charset='utf-8'><title>Loading…</title>"
    "<script src='/static/js/app.js' defer></script></head>"
    "<body><div id='root'></div><noscript>You need to enable JavaScript to run this "
    "app.</noscript></body></html>"
)
_CHALLENGE = (
    "<!DOCTYPE html><html><head><title>Just a moment...</title></head><body>"
    "<noscript>Enable JavaScript and cookies to continue</noscript></body></html>"
)


@dataclass
class LearningWeb:
    """The model: what each host answers, its knobs, and what a crawler should learn."""

    pages: int = 30
    seed: int = 1
    port: int = 0
    #: Divides every change period of the ``changing`` host (a month in minutes).
    time_scale: float = 1.0
    slow_delay: float = 2.0
    limiting: bool = True
    retry_after: float | None = None
    down_now: bool = True
    flaky_share: float = 0.3
    flaky_stall: float = 60.0
    drifted: bool = False
    #: Whether the ``challenge`` host challenges robots.txt too (as a site behind a
    #: challenge for everything does); off, its pages' challenges are what is met.
    challenge_robots: bool = True
    #: The clock the ``changing`` pages change on (seconds); the wall clock by default.
    clock: Callable[[], float] = time.time
    #: When the clock started (change times count from here).
    epoch: float = 0.0
    #: The ``paced`` host's window (seconds of the monotonic clock).
    pace_window: float = 1.0

    def __post_init__(self) -> None:
        if self.epoch == 0.0:
            self.epoch = self.clock()
        self._rng = random.Random(self.seed)
        self._changes: dict[str, list[float]] = {}
        self._let_through_at = -math.inf

    # -------------------------------------------------------------- names and URLs

    @staticmethod
    def host(kind: str) -> str:
        if kind not in KINDS:
            raise ValueError(f"no {kind!r} host (one of {', '.join(KINDS)})")
        return f"{kind}.{DOMAIN}"

    @staticmethod
    def ip(kind: str) -> str:
        return f"127.0.0.{FIRST_IP + KINDS.index(kind)}"

    def origin(self, kind: str) -> str:
        port = f":{self.port}" if self.port not in (0, 80) else ""
        return f"http://{self.host(kind)}{port}"

    def url(self, kind: str, path: str = "/") -> str:
        return self.origin(kind) + path

    def paths(self, kind: str) -> list[str]:
        """The host's pages, as a crawler should know them (one spelling each)."""
        if kind == "pdf":
            return [f"/docs/{n}.pdf" for n in range(self.pages)]
        if kind == "aliases":
            return [f"/p/{n}/" for n in range(self.pages)]
        if kind == "changing":
            return [f"/c/{rate}/{n}" for rate in CHANGE_PERIODS for n in range(self.pages)]
        return [f"/a/{n}" for n in range(self.pages)]

    def urls(self, kind: str) -> list[str]:
        return [self.url(kind, path) for path in self.paths(kind)]

    def resolve_map(self) -> dict[str, str]:
        return {self.host(kind): self.ip(kind) for kind in KINDS}

    def resolve_setting(self) -> str:
        """The fetcher's TROVE_RESOLVE value for these hosts."""
        return ",".join(f"{name}={ip}" for name, ip in self.resolve_map().items())

    @staticmethod
    def content_strategy(kind: str) -> str | None:
        """The strategy that gets this host's content; None where nothing may be tried."""
        if kind in ("spa",):
            return "activitypub"
        if kind in ("challenge", "scripts"):
            return None
        return "http"

    # -------------------------------------------------------------------- the Site

    def listen_ips(self) -> list[str]:
        return [self.ip(kind) for kind in KINDS]

    def host_for_ip(self, ip: str) -> str | None:
        for kind in KINDS:
            if self.ip(kind) == ip:
                return self.host(kind)
        return None

    def is_host(self, name: str) -> bool:
        return name.endswith("." + DOMAIN) and name.split(".", 1)[0] in KINDS

    def respond(self, host: str, path: str, headers: Mapping[str, str]) -> Response:
        kind = host.split(".", 1)[0]
        if kind == "challenge" and (self.challenge_robots or path != "/robots.txt"):
            return _challenge()
        if kind == "down" and self.down_now:
            return _reset()
        if kind == "ratelimit" and self.limiting:
            extra = () if self.retry_after is None else (("Retry-After", f"{self.retry_after:g}"),)
            return Response(429, (("Content-Type", "text/plain"), *extra), b"slow down\n")
        if kind == "paced":
            now = time.monotonic()
            if now - self._let_through_at < self.pace_window:
                return Response(429, (("Content-Type", "text/plain"),), b"slow down\n")
            self._let_through_at = now
        if kind == "flaky" and self._rng.random() < self.flaky_share:
            return _reset() if self._rng.random() < 0.5 else Response(200, delay=self.flaky_stall)
        if path == "/robots.txt":
            return ok("User-agent: *\nAllow: /\n", "text/plain; charset=utf-8")
        parts = urlsplit(path)
        if kind == "pdf":
            return self._pdf(parts.path)
        if kind == "aliases":
            return self._alias_page(parts.path, parts.query)
        if kind == "changing":
            return self._changing_page(parts.path)
        n = self._number(parts.path, "/a/") if kind == "mixed" else None
        shell = n is not None and n % 3 == 0
        if kind == "scripts":
            if self._number(parts.path, "/a/") is None:
                return not_found(path)
            return ok(_SHELL, extra=(("Vary", "Accept"),))
        if kind == "spa" or (kind == "drift" and self.drifted) or shell:
            return self._app_page(host, parts.path, headers.get("accept", ""))
        response = self._article(kind, parts.path)
        if kind == "slow" and response.status == 200:
            return Response(response.status, response.headers, response.body, delay=self.slow_delay)
        return response

    # ------------------------------------------------------------------ the pages

    def _number(self, path: str, prefix: str, suffix: str = "") -> int | None:
        if not (path.startswith(prefix) and path.endswith(suffix)):
            return None
        middle = path[len(prefix) : len(path) - len(suffix) if suffix else None]
        if not middle.isdigit() or int(middle) >= self.pages:
            return None
        return int(middle)

    def _text(self, n: int, version: int = 0) -> tuple[str, str, list[str]]:
        language = TEXTS[LANGUAGE_ORDER[n % len(LANGUAGE_ORDER)]]
        topic = language.topics[(n + version) % len(language.topics)]
        sentences = [
            language.sentences[(n + version + i) % len(language.sentences)] for i in range(6)
        ]
        return language.code, f"{topic} ({n})", sentences

    def _article(self, kind: str, path: str) -> Response:
        if path == "/":
            links = "".join(f'<li><a href="{p}">{p}</a></li>' for p in self.paths(kind))
            return ok(
                f"<!DOCTYPE html><html><head><title>{kind}</title></head>"
                f"<body><ul>{links}</ul></body></html>"
            )
        n = self._number(path, "/a/")
        if n is None:
            return not_found(path)
        language, title, sentences = self._text(n)
        nxt = f"/a/{(n + 1) % self.pages}"
        body = "".join(f"<p>{html.escape(s)}</p>" for s in sentences)
        return ok(
            f'<!DOCTYPE html><html lang="{language}"><head><title>{html.escape(title)}</title>'
            f"</head><body><article><h1>{html.escape(title)}</h1>{body}"
            f'<a href="{nxt}">next</a></article></body></html>'
        )

    def _app_page(self, host: str, path: str, accept: str) -> Response:
        n = self._number(path, "/a/")
        if n is None:
            return not_found(path)
        if not _wants_activity_json(accept):
            return ok(_SHELL, extra=(("Vary", "Accept"),))
        language, _, sentences = self._text(n)
        origin = f"http://{host}" + (f":{self.port}" if self.port not in (0, 80) else "")
        nxt = f"{origin}/a/{(n + 1) % self.pages}"
        content = "".join(f"<p>{html.escape(s)}</p>" for s in sentences)
        content += f'<p><a href="{nxt}">{html.escape(nxt)}</a></p>'
        note = {
            "@context": "https://www.w3.org/ns/activitystreams",
            "id": f"{origin}{path}",
            "type": "Note",
            "url": f"{origin}{path}",
            "attributedTo": f"{origin}/users/writer",
            "published": "2026-01-05T08:00:00Z",
            "summary": None,
            "content": content,
            "contentMap": {language: content},
            "to": ["https://www.w3.org/ns/activitystreams#Public"],
            "tag": [],
            "attachment": [],
        }
        return ok(json.dumps(note, ensure_ascii=False), ACTIVITY_JSON, extra=(("Vary", "Accept"),))

    def _pdf(self, path: str) -> Response:
        n = self._number(path, "/docs/", ".pdf")
        if n is None:
            return not_found(path)
        _, title, sentences = self._text(n)
        return ok(pdf_document(title, sentences[0]), PDF)

    def _alias_page(self, path: str, query: str) -> Response:
        if path == "/list":
            params = dict(parse_qsl(query))
            page = params.get("page", "1")
            if not page.isdigit() or not 1 <= int(page) <= max(1, self.pages // 5):
                return not_found(path)
            k = int(page)
            items = range((k - 1) * 5, min(self.pages, k * 5))
            links = "".join(f'<li><a href="/p/{i}/">post {i}</a></li>' for i in items)
            more = f'<a href="/list?page={k + 1}">older</a>' if k * 5 < self.pages else ""
            return ok(
                f"<!DOCTYPE html><html><head><title>Posts, page {k}</title>"
                f'<link rel="canonical" href="/list?page={k}"></head>'
                f"<body><ul>{links}</ul>{more}</body></html>"
            )
        if path == "/":
            return ok(
                "<!DOCTYPE html><html><head><title>aliases</title></head><body>"
                '<a href="/list?page=1">posts</a> <a href="/p/0/index.html">first</a>'
                "</body></html>"
            )
        n = self._number(path.removesuffix("index.html"), "/p/", "/")
        if n is None:
            return not_found(path)
        _, title, sentences = self._text(n)
        body = "".join(f"<p>{html.escape(s)}</p>" for s in sentences)
        m = (n + 1) % self.pages
        variants = (
            f'<a href="/p/{m}/?ref=p{n}">next</a> '
            f'<a href="/p/{m}/index.html">next again</a> '
            f'<a href="/p/{(n + 2) % self.pages}/?from=sidebar">related</a> '
            f'<a href="/p/{(n + 3) % self.pages}/?share=mastodon">shared</a> '
            f'<a href="/list?page={n // 5 + 1}">list</a>'
        )
        return ok(
            f"<!DOCTYPE html><html><head><title>{html.escape(title)}</title>"
            f'<link rel="canonical" href="/p/{n}/"></head>'
            f"<body>{body}{variants}</body></html>"
        )

    def _changing_page(self, path: str) -> Response:
        parts = path.split("/")
        if len(parts) != 4 or parts[1] != "c" or parts[2] not in CHANGE_PERIODS:
            return not_found(path)
        n = self._number("/" + parts[3], "/")
        if n is None:
            return not_found(path)
        version, changed_at = self.version(parts[2], n)
        _, title, sentences = self._text(n, version)
        body = "".join(f"<p>{html.escape(s)}</p>" for s in sentences)
        return ok(
            f"<!DOCTYPE html><html><head><title>{html.escape(title)}</title></head>"
            f"<body>{body}<p>revision {version}</p></body></html>",
            modified=datetime.fromtimestamp(changed_at, UTC),
        )

    def version(self, rate: str, n: int) -> tuple[int, float]:
        """How many times ``/c/<rate>/<n>`` has changed by now, and when it last did."""
        times = self._change_times(rate, n, self.clock())
        now = self.clock()
        done = [t for t in times if t <= now]
        return len(done), done[-1] if done else self.epoch

    def _change_times(self, rate: str, n: int, until: float) -> list[float]:
        period = CHANGE_PERIODS[rate]
        key = f"{rate}/{n}"
        times = self._changes.setdefault(key, [])
        if period is None:
            return times
        mean = period / self.time_scale
        rng = random.Random(f"{self.seed}:{key}:{len(times)}")
        last = times[-1] if times else self.epoch
        while last <= until:
            last += rng.expovariate(1.0 / mean)
            times.append(last)
        return times

    def true_rate(self, rate: str) -> float:
        """Changes per second of the ``changing`` pages of ``rate`` (0 for never)."""
        period = CHANGE_PERIODS[rate]
        return 0.0 if period is None else self.time_scale / period


def _wants_activity_json(accept: str) -> bool:
    for item in accept.split(","):
        media = item.split(";", 1)[0].strip().lower()
        if media in ("application/activity+json", "application/ld+json"):
            return True
    return False


def _challenge() -> Response:
    return Response(
        403,
        (
            ("Content-Type", HTML),
            ("Server", "cloudflare"),
            ("cf-mitigated", "challenge"),
            ("CF-Ray", "8f00000000000000-AMS"),
            ("Cache-Control", "no-store"),
        ),
        _CHALLENGE.encode(),
    )


def _reset() -> Response:
    async def refuse() -> bytes:
        raise ConnectionResetError("the learning web's host is down")

    return Response(200, lazy=refuse)


def pdf_document(title: str, text: str) -> bytes:
    """A minimal valid PDF (one page, one line of text, a title in its Info dictionary)."""

    def escape(value: str) -> str:
        raw = value.encode("latin-1", errors="replace").decode("latin-1")
        return raw.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    stream = f"BT /F1 12 Tf 72 720 Td ({escape(text[:90])}) Tj ET".encode("latin-1")
    compressed = zlib.compress(stream)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        b"/Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(compressed)
        + compressed
        + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        f"<< /Title ({escape(title)}) /Producer (trove-sandbox) >>".encode("latin-1"),
    ]
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R /Info %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        len(objects),
        xref,
    )
    return bytes(out)


@dataclass(slots=True, frozen=True)
class RunningLearningWeb:
    web: LearningWeb
    port: int
    witness: Witness


@contextlib.asynccontextmanager
async def serve_learning_web(
    web: LearningWeb,
    *,
    witness: Witness | None = None,
    witness_path: str | os.PathLike[str] | None = None,
    idle_timeout: float = 30.0,
) -> AsyncIterator[RunningLearningWeb]:
    """Serve ``web`` on its IPs (one shared port, ``web.port`` or a free one) for the block."""
    own = witness is None
    log = Witness(witness_path) if witness is None else witness
    server = SiteServer(web, log, idle_timeout)
    try:
        await server.start(web.port)
        web.port = server.port
        yield RunningLearningWeb(web=web, port=server.port, witness=log)
    finally:
        await server.close()
        if own:
            log.close()


__all__ = [
    "CHANGE_PERIODS",
    "KINDS",
    "LearningWeb",
    "RunningLearningWeb",
    "pdf_document",
    "serve_learning_web",
]
