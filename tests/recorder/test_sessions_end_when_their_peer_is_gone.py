"""The recorder's Postgres sessions end when their peer is gone, and free what they hold."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls
from tests.relay import relay
from trove_recorder.database import (
    CONNECT_TIMEOUT,
    KEEPALIVE_COUNT,
    KEEPALIVE_IDLE,
    KEEPALIVE_INTERVAL,
    USER_TIMEOUT,
    as_retry,
    client_socket,
    make_engine,
)

# The projection's own insert (``projections``): a redelivered batch writes the same ids.
_APPLIED = text(
    "INSERT INTO projected_events (event_id, event_type) VALUES (:id, 'test') "
    "ON CONFLICT DO NOTHING"
)


async def test_a_session_left_idle_in_a_transaction_frees_its_row_locks(
    stack: StackUrls, engine: AsyncEngine
) -> None:
    # The recorder that went quiet mid-batch: its node lost, or cut off from the server.
    lost = make_engine(stack.database_url, idle_in_transaction=1.0)
    key = uuid.uuid4()
    try:
        async with lost.connect() as stalled:
            await stalled.execute(_APPLIED, {"id": key})  # holds the row, says no more

            # The other recorder, given the batch again: its insert of the same id waits
            # on the row until the server ends the quiet session.
            async with asyncio.timeout(15), engine.begin() as other:
                written = await other.execute(_APPLIED, {"id": key})
            assert written.rowcount == 1  # the lost batch's row was rolled back

            # Had the quiet recorder come back, it would meet an ended session, which is
            # the database's trouble (a Retry), never the events'.
            with pytest.raises(DBAPIError) as ended:
                await stalled.execute(text("SELECT 1"))
            assert as_retry(ended.value) is not None, ended.value
    finally:
        await lost.dispose()
        async with engine.begin() as conn:
            await conn.execute(
                text("DELETE FROM projected_events WHERE event_id = :id"), {"id": key}
            )


async def test_the_server_probes_the_recorders_sessions_for_a_peer_that_is_gone(
    stack: StackUrls,
) -> None:
    recorder = make_engine(stack.database_url)
    names = (
        "tcp_keepalives_idle",
        "tcp_keepalives_interval",
        "tcp_keepalives_count",
        "tcp_user_timeout",
        "idle_in_transaction_session_timeout",
    )
    try:
        async with recorder.connect() as conn:
            shown = {
                name: (await conn.execute(text(f"SHOW {name}"))).scalar_one() for name in names
            }
    finally:
        await recorder.dispose()
    # The socket's own values: what the server set on its side of the connection.
    assert shown == {
        "tcp_keepalives_idle": "30",
        "tcp_keepalives_interval": "10",
        "tcp_keepalives_count": "3",
        "tcp_user_timeout": "60000",
        "idle_in_transaction_session_timeout": "1min",
    }


async def test_the_recorder_probes_its_own_sockets_for_a_server_that_is_gone(
    stack: StackUrls,
) -> None:
    recorder = make_engine(stack.database_url)
    try:
        async with recorder.connect() as conn:
            raw = await conn.get_raw_connection()
            sock = client_socket(raw.driver_connection)
            assert sock is not None
            options = {
                "SO_KEEPALIVE": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                "TCP_KEEPIDLE": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                "TCP_KEEPINTVL": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                "TCP_KEEPCNT": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
                "TCP_USER_TIMEOUT": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
            }
    finally:
        await recorder.dispose()
    # The server's values (``SERVER_TCP``), on the recorder's side of the connection.
    assert options == {
        "SO_KEEPALIVE": 1,
        "TCP_KEEPIDLE": KEEPALIVE_IDLE,
        "TCP_KEEPINTVL": KEEPALIVE_INTERVAL,
        "TCP_KEEPCNT": KEEPALIVE_COUNT,
        "TCP_USER_TIMEOUT": USER_TIMEOUT * 1000,
    }


async def test_the_recorder_reaches_a_server_on_a_unix_socket(
    stack: StackUrls, tmp_path: Path
) -> None:
    """``?host=/run/postgresql``: a server on the recorder's own machine. Played here by a
    Unix socket whose every connection goes on to the test server."""
    tcp = make_url(stack.database_url)
    assert tcp.host is not None
    assert tcp.port is not None
    host, port = tcp.host, tcp.port

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await relay(reader, writer, host, port)

    server = await asyncio.start_unix_server(forward, path=str(tmp_path / f".s.PGSQL.{port}"))
    url = tcp.set(host=None).update_query_dict({"host": str(tmp_path), "port": str(port)})
    recorder = make_engine(url.render_as_string(hide_password=False))
    try:
        async with recorder.connect() as conn:
            raw = await conn.get_raw_connection()
            sock = client_socket(raw.driver_connection)
            answer = (await conn.execute(text("SELECT 1"))).scalar()
    finally:
        await recorder.dispose()
        server.close()
    assert sock is not None
    assert sock.family == socket.AF_UNIX
    assert answer == 1


async def test_a_server_that_answers_nothing_fails_a_connect_within_seconds() -> None:
    # A primary lost with its node: nothing comes back, so the login waits on nothing.
    silent: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        silent.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    recorder = make_engine(f"postgresql+asyncpg://trove:trove@127.0.0.1:{port}/trove")
    started = time.monotonic()
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT + 10):
            with pytest.raises(TimeoutError) as timed_out:
                async with recorder.connect():
                    pass
        assert as_retry(timed_out.value) is not None, timed_out.value
        assert time.monotonic() - started < CONNECT_TIMEOUT + 5
    finally:
        await recorder.dispose()
        for writer in silent:
            writer.close()
        server.close()
        await server.wait_closed()
