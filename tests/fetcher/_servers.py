"""Small HTTP(S) servers on loopback for the fetcher's network tests.

A ``LocalServer`` runs ``http.server`` in a thread (independent of the event loop
under test) and dispatches on ``(Host, path)`` to route functions, so one server
plays several sites reached through ``TROVE_RESOLVE``-style names. It records every
request and lets a route signal what it saw (``server.signal(name)``), which a test
waits on with a deadline instead of sleeping.
"""

from __future__ import annotations

import contextlib
import http.server
import ipaddress
import itertools
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpcore
import httpx
import trustme

from trove_fetcher.streams import AsyncioBackend
from trove_fetcher.transport import build_client
from trove_schema.settings import FetcherSettings

Route = Callable[["Exchange"], None]


@dataclass(frozen=True)
class Seen:
    host: str
    path: str
    headers: dict[str, str]
    #: ``time.monotonic()`` when the request arrived.
    at: float = field(default_factory=time.monotonic)


class Exchange(http.server.BaseHTTPRequestHandler):
    """One request; routes call ``send`` or write to ``wfile`` themselves."""

    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def do_GET(self) -> None:
        owner = self.server.owner
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0].strip("[]")
        owner.record(Seen(host, self.path, {k.lower(): v for k, v in self.headers.items()}))
        route = owner.routes.get(f"{host}{self.path}") or owner.routes.get(self.path)
        if route is None:
            self.send(404, b"not found")
            return
        try:
            route(self)
        except (BrokenPipeError, ConnectionResetError):
            owner.signal(f"closed:{self.path}")

    def send(
        self,
        status: int,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        content_type: str = "text/html; charset=utf-8",
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def redirect(self, location: str, status: int = 302) -> None:
        self.send(status, b"", {"Location": location})

    def log_message(self, format: str, *args: object) -> None:
        pass


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], owner: LocalServer) -> None:
        self.owner = owner
        super().__init__(address, Exchange)

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that hangs up mid-response is what several tests do


class LocalServer:
    def __init__(
        self,
        ip: str = "127.0.0.1",
        routes: Mapping[str, Route] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.ip = ip
        self.routes: dict[str, Route] = dict(routes or {})
        self.seen: list[Seen] = []
        #: Set when the server closes: stalled routes wait on it.
        self.stopping = threading.Event()
        self._signals: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._httpd = _HTTPServer((ip, 0), self)
        if ssl_context is not None:
            self._httpd.socket = ssl_context.wrap_socket(self._httpd.socket, server_side=True)
        self.port: int = self._httpd.server_address[1]
        self.scheme = "https" if ssl_context is not None else "http"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> LocalServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def url(self, path: str = "/", host: str | None = None) -> str:
        return f"{self.scheme}://{host or self.ip}:{self.port}{path}"

    def record(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)

    def requests_to(self, path: str, host: str | None = None) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.path == path and (host is None or s.host == host)]

    def requests_for(self, host: str) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.host == host]

    def min_gap(self, host: str) -> float | None:
        """The shortest time between two requests to ``host`` (None for fewer than two)."""
        times = sorted(s.at for s in self.requests_for(host))
        return min((b - a for a, b in itertools.pairwise(times)), default=None)

    def _event(self, name: str) -> threading.Event:
        with self._lock:
            return self._signals.setdefault(name, threading.Event())

    def signal(self, name: str) -> None:
        self._event(name).set()

    def wait_for(self, name: str, timeout: float = 10.0) -> bool:
        """Block until ``signal(name)`` (call through ``asyncio.to_thread``)."""
        return self._event(name).wait(timeout)


def stall(exchange: Exchange, first: bytes = b"<") -> None:
    """Send headers and one byte of a longer body, then nothing until the server stops."""
    exchange.send_response(200)
    exchange.send_header("Content-Type", "text/html")
    exchange.send_header("Content-Length", "100000")
    exchange.end_headers()
    exchange.wfile.write(first)
    exchange.wfile.flush()
    exchange.server.owner.stopping.wait(60)


def stream_body(
    exchange: Exchange, content_type: str, total: int, chunk: bytes = b"x" * 65536
) -> None:
    """Send ``total`` bytes; signals ``closed:<path>`` if the client hangs up first."""
    exchange.send_response(200)
    exchange.send_header("Content-Type", content_type)
    exchange.send_header("Content-Length", str(total))
    exchange.end_headers()
    sent = 0
    while sent < total:
        piece = chunk[: total - sent]
        exchange.wfile.write(piece)
        sent += len(piece)
    exchange.wfile.flush()
    exchange.server.owner.signal(f"complete:{exchange.path}")


@dataclass(frozen=True)
class Certificate:
    cert: Path
    key: Path
    ca: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        return context

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


def self_signed(directory: Path, hostname: str) -> Certificate:
    """A certificate for ``hostname`` from a throwaway CA (trustme: no openssl CLI needed)."""
    authority = trustme.CA()
    issued = authority.issue_cert(hostname)
    cert, key, ca = directory / "cert.pem", directory / "key.pem", directory / "ca.pem"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    for extra in issued.cert_chain_pems[1:]:
        extra.write_to_path(str(cert), append=True)
    issued.private_key_pem.write_to_path(str(key))
    authority.cert_pem.write_to_path(str(ca))
    return Certificate(cert, key, ca)


@contextlib.contextmanager
def serving(
    routes: Mapping[str, Route], ip: str = "127.0.0.1", ssl_context: ssl.SSLContext | None = None
) -> Iterator[LocalServer]:
    with LocalServer(ip, routes, ssl_context) as server:
        yield server


@contextlib.asynccontextmanager
async def loopback_client(host: str) -> AsyncIterator[httpx.AsyncClient]:
    """The fetcher's HTTP client, allowed 127.0.0.1 and resolving ``host`` to it."""
    settings = FetcherSettings(allowed_networks=("127.0.0.1/32",), resolve=(f"{host}=127.0.0.1",))
    async with build_client(settings) as client:
        yield client


def _is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name: the guard must hand over an address, never a name
    return address.is_loopback


class RecordingBackend(httpcore.AsyncNetworkBackend):
    """The real network backend, noting every TCP connection attempted through it.

    Placed under the SSRF guard: an address the guard refuses never shows up here.
    Whatever the code under test does, this backend itself only ever dials loopback:
    any other address is recorded and refused here, so a broken guard fails its
    test without a packet leaving the machine.
    """

    def __init__(self) -> None:
        self.inner = AsyncioBackend()
        self.connects: list[tuple[str, int]] = []

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        self.connects.append((host, port))
        if not _is_loopback(host):
            raise httpcore.ConnectError(f"test backend: {host} is not loopback, not dialled")
        return await self.inner.connect_tcp(
            host, port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise AssertionError("no unix sockets here")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)
