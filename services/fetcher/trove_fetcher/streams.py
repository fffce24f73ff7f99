"""httpcore's network streams on asyncio's own transports.

httpcore's stock backend for asyncio goes through anyio: every read and write enters an
anyio cancel scope, and every look at an idle connection (``has_expired``, made for each
connection of a pool on every request and every release) builds anyio's table of socket
attributes, a ``getpeername`` system call among them. With a connection a request, the
crawl's case at a 10 s gap, that was 13-19% of a request's CPU in the client
(``bench/bench_transport.py --set backends``). Here a connection is
``asyncio.open_connection``'s reader and writer, TLS is ``StreamWriter.start_tls`` and
a timeout is ``asyncio.timeout``: the standard library's code for the same job.

Errors come out as httpcore's, as from its own backends: ``ConnectTimeout`` and
``ConnectError`` from connecting and the TLS handshake, ``ReadTimeout`` and
``ReadError``, ``WriteTimeout`` and ``WriteError``; but the pod's own shortage of
descriptors or buffers (EMFILE, ENOBUFS, ...) is ``PodExhausted``, not the host's.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore

from trove_fetcher.errors import PodExhausted

#: The reader's limit: the event loop stops reading a connection that holds twice this
#: unread, so a body that never ends costs at most that much memory until it is read.
READ_LIMIT = 64 * 1024


def _text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One TCP connection (or TLS over it) as httpcore reads and writes it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109 (httpcore's interface)
        try:
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)
        except TimeoutError:
            raise httpcore.ReadTimeout("timed out reading the response") from None
        except OSError as exc:
            raise PodExhausted.of(exc) or httpcore.ReadError(_text(exc)) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109 (httpcore's interface)
        if not buffer:
            return
        try:
            self._writer.write(buffer)
            async with asyncio.timeout(timeout):
                await self._writer.drain()
        except TimeoutError:
            raise httpcore.WriteTimeout("timed out sending the request") from None
        except OSError as exc:
            raise PodExhausted.of(exc) or httpcore.WriteError(_text(exc)) from exc

    async def aclose(self) -> None:
        # As anyio does: close (TLS's goodbye, the buffered bytes out) if it goes at
        # once, then abort, so a peer that stops reading cannot hold the socket open.
        transport = self._writer.transport
        if not transport.is_closing():
            transport.close()
            await asyncio.sleep(0)
        transport.abort()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                await self._writer.start_tls(ssl_context, server_hostname=server_hostname)
        except TimeoutError:
            await self.aclose()
            raise httpcore.ConnectTimeout("timed out in the TLS handshake") from None
        except (OSError, EOFError) as exc:  # ssl.SSLError is an OSError
            await self.aclose()
            raise PodExhausted.of(exc) or httpcore.ConnectError(_text(exc)) from exc
        except BaseException:
            await self.aclose()
            raise
        return self

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            # Asked of an idle connection before it is used again: has the server
            # closed it? The event loop reads every connection as data comes, so a close
            # that has arrived is the reader's end already, and looking costs no system
            # call. (Bytes an idle connection was sent unasked would be read as the next
            # answer; only the server that sent them could be fooled by that, about
            # itself, as h11 does already with bytes that came with the answer before.)
            return self._reader.at_eof() or self._writer.transport.is_closing()
        if info == "ssl_object":
            return self._writer.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._writer.get_extra_info("sockname")
        if info == "server_addr":
            return self._writer.get_extra_info("peername")
        if info == "socket":
            return self._writer.get_extra_info("socket")
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """Connects ``AsyncioStream``s (TCP_NODELAY set, as asyncio does for every TCP socket)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    host,
                    port,
                    limit=READ_LIMIT,
                    local_addr=None if local_address is None else (local_address, 0),
                )
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"timed out connecting to {host}:{port}") from None
        except OSError as exc:
            raise PodExhausted.of(exc) or httpcore.ConnectError(_text(exc)) from exc
        stream = AsyncioStream(reader, writer)
        try:
            sock = writer.get_extra_info("socket")
            for option in socket_options or ():
                sock.setsockopt(*option)
        except OSError as exc:
            await stream.aclose()
            raise PodExhausted.of(exc) or httpcore.ConnectError(_text(exc)) from exc
        return stream

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("the fetcher speaks TCP only")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
