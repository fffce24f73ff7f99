"""What the sandbox answers for one URL, independent of the socket that carries it."""

from __future__ import annotations

import hashlib
import html
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from email.utils import format_datetime

Headers = tuple[tuple[str, str], ...]
BodyStream = Callable[[], AsyncGenerator[bytes, None]]

HTML = "text/html; charset=utf-8"


@dataclass(slots=True, frozen=True)
class Response:
    """One answer of the sandbox web, kept apart from HTTP framing.

    The model (``SandboxWeb.page``) decides *what* a URL is; the server only
    decides *how* to put it on the wire. That split lets the model be checked
    without sockets and lets misbehaving answers (slow, huge, streamed) be plain
    data: a ``delay`` before the head and an async ``stream`` for the body.
    """

    status: int
    headers: Headers = ()
    body: bytes = b""
    #: When set, the body is produced by this async generator instead of ``body``.
    stream: BodyStream | None = None
    #: Content-Length announced for ``stream``; None means chunked (or close-delimited).
    length: int | None = None
    #: When set, awaited once to get the body (one expensive body built off the loop).
    lazy: Callable[[], Awaitable[bytes]] | None = None
    #: Seconds to wait before sending anything (slow headers, a robots.txt timeout).
    delay: float = 0.0

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), or None."""
        wanted = name.lower()
        for key, value in self.headers:
            if key.lower() == wanted:
                return value
        return None

    @property
    def content_type(self) -> str | None:
        return self.header("Content-Type")

    @property
    def etag(self) -> str | None:
        return self.header("ETag")

    @property
    def last_modified(self) -> str | None:
        return self.header("Last-Modified")

    @property
    def text(self) -> str:
        """The body decoded as UTF-8 (replacing undecodable bytes); streams give ''."""
        return self.body.decode("utf-8", errors="replace")


def etag_of(body: bytes) -> str:
    """A strong ETag derived from the body, so equal bodies share a validator."""
    return '"' + hashlib.sha256(body).hexdigest()[:24] + '"'


def http_date(when: datetime) -> str:
    return format_datetime(when, usegmt=True)


def ok(
    body: bytes | str,
    content_type: str = HTML,
    *,
    modified: datetime | None = None,
    extra: Headers = (),
    status: int = 200,
) -> Response:
    """A complete in-memory answer with an ETag and, when known, a Last-Modified."""
    data = body.encode("utf-8") if isinstance(body, str) else body
    headers: list[tuple[str, str]] = [("Content-Type", content_type), ("ETag", etag_of(data))]
    if modified is not None:
        headers.append(("Last-Modified", http_date(modified)))
    headers.extend(extra)
    return Response(status=status, headers=tuple(headers), body=data)


def not_found(path: str) -> Response:
    body = (
        "<!DOCTYPE html><html><head><title>Not found</title></head>"
        f"<body><p>Nothing at {html.escape(path)}</p></body></html>"
    )
    return Response(status=404, headers=(("Content-Type", HTML),), body=body.encode())


def redirect(location: str, status: int = 302) -> Response:
    href = html.escape(location)
    body = f'<!DOCTYPE html><html><body><a href="{href}">moved</a></body></html>'
    return Response(
        status=status,
        headers=(("Location", location), ("Content-Type", HTML)),
        body=body.encode("utf-8", errors="replace"),
    )
