"""httpcore's streams on asyncio: what a misbehaving server gets, seen through the client.

Each server here is a real one on 127.0.0.1, written for the one way it misbehaves.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpcore
import httpx
import pytest

from tests.conftest import eventually
from trove_fetcher.streams import AsyncioBackend
from trove_fetcher.transport import build_client
from trove_schema.settings import FetcherSettings

Handler = Callable[["Server", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[Any]]

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


class Server:
    """A TCP server on 127.0.0.1 that runs one handler for each connection it accepts.

    ``release`` is set when the test is over: a handler that holds a connection waits
    on it, so that none outlives its test."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.release = asyncio.Event()
        self.accepted = 0
        self.finished = 0  # connections the server is done with and has closed
        self.port = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            await self.handler(self, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self.finished += 1

    def url(self, path: str = "/", scheme: str = "http") -> str:
        return f"{scheme}://site.trove.test:{self.port}{path}"


@contextlib.asynccontextmanager
async def running(
    handler: Handler,
) -> AsyncIterator[Server]:
    server = Server(handler)
    listening = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    server.port = listening.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        server.release.set()
        listening.close()
        await listening.wait_closed()


def _settings(**overrides: Any) -> FetcherSettings:
    values: dict[str, Any] = {
        "allowed_networks": ("127.0.0.1/32",),
        "resolve": ("site.trove.test=127.0.0.1",),
        "min_domain_delay_seconds": 0.5,  # below keep-alive: connections are kept
    }
    values.update(overrides)
    return FetcherSettings(**values)


async def _answer_once(
    server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(ANSWER)
    await writer.drain()


async def _hold(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers nothing: takes what comes until the client closes, or the test ends."""
    closed = asyncio.ensure_future(reader.read())
    released = asyncio.ensure_future(server.release.wait())
    await asyncio.wait((closed, released), return_when=asyncio.FIRST_COMPLETED)
    closed.cancel()
    released.cancel()


async def _until_released(
    server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Reads nothing and answers nothing; closes the connection when the test says so."""
    await server.release.wait()


async def _finished(server: Server) -> int:
    return server.finished


class KeepingBackend(AsyncioBackend):
    """The fetcher's backend, keeping each stream it connects for the test to look at."""

    def __init__(self) -> None:
        self.streams: list[httpcore.AsyncNetworkStream] = []

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        stream = await super().connect_tcp(*args, **kwargs)
        self.streams.append(stream)
        return stream


async def _readable(stream: httpcore.AsyncNetworkStream) -> bool:
    return bool(stream.get_extra_info("is_readable"))


async def test_an_idle_connection_the_server_closed_is_not_used_again() -> None:
    # A keep-alive answer, then the server closes the connection while it is idle in the
    # pool. Once the pod has seen that, the next request connects afresh rather than
    # sending on a dead socket.
    backend = KeepingBackend()
    async with running(_answer_once) as server:
        async with build_client(_settings(), network_backend=backend) as client:
            assert (await client.get(server.url())).text == "ok"
            (first,) = backend.streams
            await eventually(lambda: _readable(first), until=bool, timeout=10, what="the close")
            assert (await client.get(server.url())).text == "ok"
        assert server.accepted == 2
        assert len(backend.streams) == 2


async def test_an_idle_stream_is_readable_once_its_server_closes_it_and_not_before() -> None:
    async with running(_until_released) as server:
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", server.port, timeout=5)
        try:
            assert stream.get_extra_info("is_readable") is False
            server.release.set()

            await eventually(
                lambda: _readable(stream), until=bool, timeout=5, what="the close seen"
            )
            assert await stream.read(100, timeout=5) == b""
        finally:
            await stream.aclose()


async def test_a_server_that_never_answers_is_a_read_timeout() -> None:
    async def never_answer(
        server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await _hold(server, reader, writer)

    settings = _settings(read_timeout=0.3)
    async with running(never_answer) as server, build_client(settings) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.get(server.url())


async def test_a_tls_handshake_the_server_never_answers_is_a_connect_timeout() -> None:
    async with running(_hold) as server, build_client(_settings(connect_timeout=0.3)) as client:
        with pytest.raises(httpx.ConnectTimeout):
            await client.get(server.url(scheme="https"))
        # The client closed its socket: the server saw its end, not the test's.
        await eventually(lambda: _finished(server), until=bool, timeout=5, what="a close")


async def test_an_answer_to_a_tls_hello_that_is_not_tls_is_a_connect_error() -> None:
    async def plain_http(
        server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await reader.read(1)
        writer.write(ANSWER)
        await writer.drain()

    async with running(plain_http) as server, build_client(_settings()) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(server.url(scheme="https"))


async def test_a_port_nobody_listens_on_is_a_connect_error() -> None:
    async with running(_hold) as server:
        url = server.url()
    async with build_client(_settings()) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(url)


async def test_a_peer_that_stops_reading_is_a_write_timeout_and_closing_does_not_wait() -> None:
    async with running(_until_released) as server:
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", server.port, timeout=5)

        async def fill() -> None:
            for _ in range(1000):  # until the kernel's buffers on both ends are full
                await stream.write(b"x" * 1_000_000, timeout=0.2)

        with pytest.raises(httpcore.WriteTimeout):
            await fill()
        await asyncio.wait_for(stream.aclose(), timeout=2)
