"""An asyncio HTTP/1.1 server for a ``SandboxWeb``, one loopback IP per host.

Crawlers resolve each sandbox host to its own IP, so per-IP politeness and
connection reuse behave as on the real web. Every request is written down by a
``Witness``: tests judge a crawler by what the server saw, not by what the
crawler claims it did.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC
from email.utils import formatdate, parsedate_to_datetime
from http import HTTPStatus
from typing import IO, Protocol
from urllib.parse import urlsplit

from trove_sandbox.response import Response
from trove_sandbox.trap import gzip_bomb
from trove_sandbox.web import SandboxWeb

log = logging.getLogger("trove_sandbox")

SERVER_NAME = "trove-sandbox"
#: Longest request head accepted; longer heads get a 400.
MAX_HEAD_BYTES = 32 * 1024
#: Largest request body read (and discarded); larger ones get a 413.
MAX_BODY_BYTES = 1024 * 1024
_BIND_ATTEMPTS = 20
_CHUNK = 64 * 1024
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(r"[\x21-\x7e]+")


@dataclass(slots=True, frozen=True)
class WitnessRecord:
    """One request as the server saw it: the evidence politeness tests rest on.

    A request too malformed to parse is recorded with an empty method and path,
    under the host of the IP it arrived on.
    """

    host: str
    path: str
    method: str
    monotonic: float
    wall: float
    status: int
    user_agent: str | None = None
    if_none_match: str | None = None
    if_modified_since: str | None = None
    #: The local IP the request arrived on.
    ip: str = ""
    #: What the client asked for (tells a crawler's fetch strategies apart).
    accept: str | None = None


class Witness:
    """The server's own log of every request, so crawler tests need no trust in the crawler.

    Records live in memory (and, when a path is given, in a JSONL file written
    as requests arrive, for watching a demo with ``tail -f``).
    """

    __slots__ = ("_file", "_records", "_waiters")

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self._records: list[WitnessRecord] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._file: IO[str] | None = None
        if path is not None:
            self._file = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115

    def record(self, entry: WitnessRecord) -> None:
        self._records.append(entry)
        if self._file is not None:
            self._file.write(json.dumps(asdict(entry), sort_keys=True) + "\n")
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    def requests(self, host: str | None = None) -> list[WitnessRecord]:
        """Every request so far, in arrival order, optionally only those for ``host``."""
        if host is None:
            return list(self._records)
        return [r for r in self._records if r.host == host]

    def paths(self, host: str) -> list[str]:
        """The paths (with query) requested on ``host``, in arrival order."""
        return [r.path for r in self._records if r.host == host]

    def min_gap(self, host: str) -> float | None:
        """The shortest time between two consecutive requests to ``host`` (None if < 2)."""
        times = [r.monotonic for r in self._records if r.host == host]
        if len(times) < 2:
            return None
        return min(b - a for a, b in itertools.pairwise(times))

    def clear(self) -> None:
        self._records.clear()

    async def wait_for(self, predicate: Callable[[Witness], bool], within: float = 10.0) -> None:
        """Return once ``predicate(self)`` holds; TimeoutError after ``within`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not predicate(self):
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"witness condition not met within {within} s")
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, remaining)
            except TimeoutError:
                continue
            finally:
                self._waiters.remove(waiter)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclass(slots=True, frozen=True)
class RunningSandbox:
    """A served sandbox: where it listens and what it saw."""

    web: SandboxWeb
    port: int
    witness: Witness
    seeds: list[str] = field(default_factory=list)
    resolve_map: dict[str, str] = field(default_factory=dict)

    def base_url(self, host: str) -> str:
        """``http://host:port``, the URL a crawler resolving ``resolve_map`` uses."""
        return f"http://{host}:{self.port}"

    def url(self, host: str, path: str = "/") -> str:
        return self.base_url(host) + path

    def ip_url(self, host: str, path: str = "/") -> str:
        """The same page addressed by IP (send ``Host: host`` with it)."""
        return f"http://{self.resolve_map[host]}:{self.port}{path}"


class _BadRequest(Exception):
    def __init__(self, status: int = 400) -> None:
        super().__init__(status)
        self.status = status


@dataclass(slots=True, frozen=True)
class _Request:
    method: str
    target: str
    version: str
    headers: dict[str, str]

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    @property
    def keep_alive(self) -> bool:
        tokens = {t.strip().lower() for t in (self.header("connection") or "").split(",")}
        if self.version == "HTTP/1.0":
            return "keep-alive" in tokens
        return "close" not in tokens


def _parse_head(data: bytes) -> _Request:
    lines = data.lstrip(b"\r\n").split(b"\r\n")
    while lines and lines[-1] == b"":
        lines.pop()
    if not lines:
        raise _BadRequest
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]):
        raise _BadRequest
    method, raw_target, raw_version = parts
    if raw_version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise _BadRequest(505 if raw_version.startswith(b"HTTP/") else 400)
    try:
        target = raw_target.decode("ascii")
    except UnicodeDecodeError:
        raise _BadRequest from None
    if not _TARGET.fullmatch(target) or not (
        target.startswith("/") or target.lower().startswith(("http://", "https://"))
    ):
        raise _BadRequest
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.fullmatch(name):
            raise _BadRequest  # also refuses obsolete line folding (leading whitespace)
        text = value.strip(b" \t").decode("latin-1")
        if any(c in text for c in "\r\n\x00"):
            raise _BadRequest
        key = name.decode("ascii").lower()
        if key in headers:
            if key in ("host", "content-length"):
                if headers[key] != text:
                    raise _BadRequest
                continue
            headers[key] = f"{headers[key]}, {text}"
        else:
            headers[key] = text
    return _Request(method.decode("ascii"), target, raw_version.decode("ascii"), headers)


def _not_modified(response: Response, request: _Request) -> bool:
    if response.status != 200 or response.stream is not None or response.lazy is not None:
        return False
    if_none_match = request.header("if-none-match")
    if if_none_match is not None:
        etag = response.etag
        if etag is None:
            return False
        tags = {_weak_stripped(t.strip()) for t in if_none_match.split(",")}
        return "*" in tags or _weak_stripped(etag) in tags
    since_text = request.header("if-modified-since")
    modified_text = response.last_modified
    if since_text is None or modified_text is None:
        return False
    try:
        since = parsedate_to_datetime(since_text)
        modified = parsedate_to_datetime(modified_text)
    except (TypeError, ValueError, IndexError):
        return False
    if since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    return modified <= since


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Half-close, then drain what the client still sends, so the error is not lost.

    Closing a socket with unread input makes the kernel send a reset, which can
    destroy the response before the client reads it.
    """
    with contextlib.suppress(Exception):
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(1.0):
            drained = 0
            while drained < MAX_BODY_BYTES:
                data = await reader.read(_CHUNK)
                if not data:
                    break
                drained += len(data)


def _weak_stripped(tag: str) -> str:
    return tag[2:] if tag.startswith("W/") else tag


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def _clean(value: str) -> str:
    return value.replace("\r", "").replace("\n", "")


class Site(Protocol):
    """What a ``SiteServer`` serves: its loopback IPs, its host names and its answers."""

    def listen_ips(self) -> list[str]: ...

    def host_for_ip(self, ip: str) -> str | None: ...

    def is_host(self, name: str) -> bool: ...

    def respond(self, host: str, path: str, headers: Mapping[str, str]) -> Response:
        """The answer for ``path`` (with query) on ``host``; ``headers`` are lower-cased."""
        ...


@dataclass(slots=True, frozen=True)
class _WebSite:
    """A ``SandboxWeb`` as a ``Site``: its pages do not depend on request headers."""

    web: SandboxWeb

    def listen_ips(self) -> list[str]:
        return [h.ip for h in self.web.hosts]

    def host_for_ip(self, ip: str) -> str | None:
        return self.web.host_for_ip(ip)

    def is_host(self, name: str) -> bool:
        return self.web.is_host(name)

    def respond(self, host: str, path: str, headers: Mapping[str, str]) -> Response:
        return self.web.page(host, path)


class SiteServer:
    """The sockets and connection tasks of one served site."""

    __slots__ = ("_date", "_servers", "_tasks", "idle_timeout", "port", "site", "witness")

    def __init__(self, site: Site, witness: Witness, idle_timeout: float) -> None:
        self.site = site
        self.witness = witness
        self.idle_timeout = idle_timeout
        self.port = 0
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._date: tuple[int, str] = (0, "")

    async def start(self, port: int) -> None:
        ips = self.site.listen_ips()
        attempts = 1 if port else _BIND_ATTEMPTS
        for attempt in range(attempts):
            servers: list[asyncio.Server] = []
            try:
                first = await self._listen(ips[0], port)
                servers.append(first)
                chosen = int(first.sockets[0].getsockname()[1])
                for ip in ips[1:]:
                    servers.append(await self._listen(ip, chosen))
            except OSError as exc:
                for server in servers:
                    server.close()
                    await server.wait_closed()
                if exc.errno == errno.EADDRNOTAVAIL:
                    raise OSError(
                        exc.errno,
                        f"cannot bind {ips}: this system does not route all of 127.0.0.0/8 "
                        "to loopback (on macOS add aliases: ifconfig lo0 alias 127.0.0.N)",
                    ) from exc
                if port or exc.errno != errno.EADDRINUSE or attempt == attempts - 1:
                    raise
                continue
            self._servers = servers
            self.port = chosen
            return

    async def _listen(self, ip: str, port: int) -> asyncio.Server:
        return await asyncio.start_server(
            self._connection, ip, port, limit=MAX_HEAD_BYTES, backlog=1024, reuse_address=True
        )

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        self._servers = []

    # ------------------------------------------------------------------ connections

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        sockname = writer.get_extra_info("sockname")
        local_ip = str(sockname[0]) if sockname else ""
        clean = False
        try:
            clean = await self._serve_requests(reader, writer, local_ip)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # Only close() cancels connections. Ending the task normally matters:
            # Python 3.11's stream callback calls task.exception() on it and logs
            # a spurious traceback for a cancelled task. An idle connection gets a
            # polite FIN; one with unsent bytes is reset rather than waited on.
            clean = writer.transport.get_write_buffer_size() == 0
        except Exception:
            log.exception("sandbox connection failed")
        finally:
            self._tasks.discard(task)
            if clean:
                writer.close()
            else:
                writer.transport.abort()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 5.0)

    async def _serve_requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, local_ip: str
    ) -> bool:
        """Serve requests until the connection should end; True if it ended cleanly."""
        while True:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.idle_timeout)
            except (TimeoutError, asyncio.IncompleteReadError):
                return True
            except (asyncio.LimitOverrunError, ValueError):
                await self._refuse(reader, writer, local_ip, 400)
                return True
            arrived = time.monotonic(), time.time()
            try:
                request = _parse_head(head)
                await self._discard_body(reader, request)
            except _BadRequest as bad:
                await self._refuse(reader, writer, local_ip, bad.status, arrived)
                return True
            keep = await self._answer(request, writer, local_ip, arrived)
            if not keep:
                return True

    async def _discard_body(self, reader: asyncio.StreamReader, request: _Request) -> None:
        if request.header("transfer-encoding") is not None:
            raise _BadRequest
        length_text = request.header("content-length")
        if length_text is None:
            return
        if not re.fullmatch(r"[0-9]{1,18}", length_text):
            raise _BadRequest
        length = int(length_text)
        if length > MAX_BODY_BYTES:
            raise _BadRequest(413)
        if length:
            await reader.readexactly(length)

    async def _refuse(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        local_ip: str,
        status: int,
        arrived: tuple[float, float] | None = None,
    ) -> None:
        mono, wall = arrived or (time.monotonic(), time.time())
        host = self.site.host_for_ip(local_ip) or local_ip
        self.witness.record(WitnessRecord(host, "", "", mono, wall, status, ip=local_ip))
        body = f"{status} {_reason(status)}\n".encode()
        headers = (("Content-Type", "text/plain; charset=utf-8"),)
        writer.write(self._head(status, headers, len(body), keep_alive=False) + body)
        await writer.drain()
        await _linger(reader, writer)

    def _host_of(self, request: _Request, local_ip: str) -> str:
        candidates: list[str] = []
        if not request.target.startswith("/"):
            candidates.append(urlsplit(request.target).hostname or "")
        host_header = request.header("host")
        if host_header:
            name = host_header.strip().lower()
            if name.startswith("["):
                name = name.split("]", 1)[0] + "]"
            else:
                name = name.rsplit(":", 1)[0] if ":" in name else name
            candidates.append(name.rstrip("."))
        for name in candidates:
            if self.site.is_host(name):
                return name
        return self.site.host_for_ip(local_ip) or local_ip

    async def _answer(
        self,
        request: _Request,
        writer: asyncio.StreamWriter,
        local_ip: str,
        arrived: tuple[float, float],
    ) -> bool:
        host = self._host_of(request, local_ip)
        if request.target.startswith("/"):
            path = request.target
        else:
            parts = urlsplit(request.target)
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        keep_alive = request.keep_alive
        if request.method in ("GET", "HEAD"):
            try:
                response = self.site.respond(host, path, request.headers)
            except Exception:
                log.exception("sandbox page %s%s failed", host, path)
                response = Response(500, (("Content-Type", "text/plain"),), b"sandbox bug\n")
            if _not_modified(response, request):
                validators = tuple(
                    (k, v) for k, v in response.headers if k.lower() in ("etag", "last-modified")
                )
                response = Response(304, validators)
        else:
            response = Response(
                405, (("Allow", "GET, HEAD"), ("Content-Type", "text/plain")), b"GET or HEAD\n"
            )
        self.witness.record(
            WitnessRecord(
                host=host,
                path=path,
                method=request.method,
                monotonic=arrived[0],
                wall=arrived[1],
                status=response.status,
                user_agent=request.header("user-agent"),
                if_none_match=request.header("if-none-match"),
                if_modified_since=request.header("if-modified-since"),
                ip=local_ip,
                accept=request.header("accept"),
            )
        )
        if response.delay:
            await asyncio.sleep(response.delay)
        return await self._send(response, request, writer, keep_alive)

    async def _send(
        self,
        response: Response,
        request: _Request,
        writer: asyncio.StreamWriter,
        keep_alive: bool,
    ) -> bool:
        head_only = request.method == "HEAD"
        no_body = response.status in (204, 304) or response.status < 200
        if response.stream is None:
            body = await response.lazy() if response.lazy is not None else response.body
            length = None if no_body else len(body)
            writer.write(self._head(response.status, response.headers, length, keep_alive))
            if not (head_only or no_body) and body:
                writer.write(body)
            await writer.drain()
            return keep_alive
        chunked = response.length is None and request.version == "HTTP/1.1"
        if response.length is None and not chunked:
            keep_alive = False  # an HTTP/1.0 body without a length ends at close
        writer.write(
            self._head(response.status, response.headers, response.length, keep_alive, chunked)
        )
        await writer.drain()
        if head_only:
            return keep_alive
        async with contextlib.aclosing(response.stream()) as chunks:
            async for chunk in chunks:
                if not chunk:
                    continue
                if writer.is_closing():
                    return False
                if chunked:
                    writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                else:
                    writer.write(chunk)
                await writer.drain()
        if chunked:
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        return keep_alive

    def _head(
        self,
        status: int,
        headers: tuple[tuple[str, str], ...],
        length: int | None,
        keep_alive: bool,
        chunked: bool = False,
    ) -> bytes:
        now = int(time.time())
        if self._date[0] != now:
            self._date = (now, formatdate(now, usegmt=True))
        # A site that says its own time (a clock that runs fast) says it instead.
        date = next((v for k, v in headers if k.lower() == "date"), self._date[1])
        lines = [
            f"HTTP/1.1 {status} {_reason(status)}",
            f"Date: {_clean(date)}",
            f"Server: {SERVER_NAME}",
        ]
        lines.extend(
            f"{_clean(k)}: {_clean(v)}"
            for k, v in headers
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "date")
        )
        if chunked:
            lines.append("Transfer-Encoding: chunked")
        elif length is not None:
            lines.append(f"Content-Length: {length}")
        lines.append("Connection: keep-alive" if keep_alive else "Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", errors="replace")


@contextlib.asynccontextmanager
async def serve_sandbox(
    web: SandboxWeb,
    *,
    witness_path: str | os.PathLike[str] | None = None,
    port: int | None = None,
    idle_timeout: float = 30.0,
) -> AsyncIterator[RunningSandbox]:
    """Serve ``web`` on every host IP (one shared port) for the life of the block.

    ``port`` defaults to ``web.port``; 0 picks a free one. The web's URLs
    (``web.seeds()`` and so on) use the bound port while the block runs.
    """
    witness = Witness(witness_path)
    server = SiteServer(_WebSite(web), witness, idle_timeout)
    if web.trap_host is not None:
        # Built before the first request, not while a fetcher waits for it: on a loaded
        # machine its seconds would be the answer's, and the bomb a timeout.
        await asyncio.to_thread(gzip_bomb)
    try:
        await server.start(web.port if port is None else port)
        web.port = server.port
        yield RunningSandbox(
            web=web,
            port=server.port,
            witness=witness,
            seeds=web.seeds(),
            resolve_map=web.resolve_map(),
        )
    finally:
        await server.close()
        witness.close()
