"""A service's NATS connection on a real nats-server: what a closed one does to the
service, and what a request that cannot be sent leaves behind."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import nats.errors
import pytest

from tests.conftest import StackUrls
from trove_schema.bus import Bus
from trove_schema.errors import BrokerClosed
from trove_stack.nats import EmbeddedNats, NatsConfig


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """A nats-server of one user, ``trove``, whose password its config file gives."""
    server = EmbeddedNats(NatsConfig(store_dir=tmp_path / "nats", password="first")).start()
    try:
        yield server
    finally:
        server.stop()


async def test_a_user_the_server_turns_away_at_every_reconnect_ends_the_service(
    guarded: EmbeddedNats,
) -> None:
    # A reload that changes the password: the server turns the client away at every
    # reconnect, which nats-py tries for ever. The pod would idle, ready, for ever: its
    # ``until_closed`` part ends the service instead, and its restart reads the new one.
    bus = await Bus.connect(guarded.url, name="trove-tests", refused_patience=2.0)
    stop = asyncio.Event()
    try:
        watch = asyncio.create_task(bus.until_closed(stop))
        config = guarded.config.store_dir / "nats-server.conf"
        config.write_text(config.read_text().replace('"first"', '"second"'))
        assert guarded.pid is not None
        os.kill(guarded.pid, signal.SIGHUP)  # nats-server reloads its configuration

        with pytest.raises(BrokerClosed, match=r"(?i)authorization"):
            await asyncio.wait_for(watch, timeout=20)
    finally:
        await bus.close()


async def test_a_connection_the_client_closes_for_good_ends_the_service(
    stack: StackUrls,
) -> None:
    # nats-py closes the connection on a server's -ERR (other than a stale connection's)
    # and never reconnects: every pull and publish would fail from then on.
    bus = await Bus.connect(stack.nats_url, name="trove-tests")
    watch = asyncio.create_task(bus.until_closed(asyncio.Event()))
    await bus.nc.close()
    with pytest.raises(BrokerClosed, match="closed the connection"):
        await asyncio.wait_for(watch, timeout=5)


async def test_a_stop_ends_the_watch_on_the_connection_quietly(stack: StackUrls) -> None:
    bus = await Bus.connect(stack.nats_url, name="trove-tests")
    stop = asyncio.Event()
    watch = asyncio.create_task(bus.until_closed(stop))
    stop.set()
    await asyncio.wait_for(watch, timeout=5)
    await bus.close()  # closed after the stop, as a service closes it: not an error
    assert watch.exception() is None


async def test_a_request_that_cannot_be_sent_leaves_nothing_behind(stack: StackUrls) -> None:
    # nats-py files a request's reply future before it publishes; a publish that fails
    # (the connection closed, its buffer full while the broker is away) left it filed.
    bus = await Bus.connect(stack.nats_url, name="trove-tests")
    await bus.js.account_info()  # a request answered: the reply subscription is set up
    filed = len(bus.nc._resp_map)
    await bus.nc.close()

    for _ in range(100):
        with pytest.raises(nats.errors.ConnectionClosedError):
            await bus.nc.request("trove.nowhere", b"x", timeout=1)

    assert len(bus.nc._resp_map) == filed
