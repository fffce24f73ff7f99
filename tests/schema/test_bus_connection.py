"""A service's NATS connection on a real nats-server: a first one turned away or waited
for, what a closed one does to the service, and what a request that cannot be sent
leaves behind."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import nats.errors
import pytest
import trustme

import trove_schema.bus
from tests.conftest import StackUrls, eventually, reading
from tests.ports import free_port
from tests.relay import relay
from trove_schema.bus import Bus
from trove_schema.errors import BrokerClosed
from trove_schema.metrics import BROKER_CONNECTED
from trove_schema.service import _start_patiently, infrastructure_away
from trove_stack.nats import EmbeddedNats, NatsConfig, listening, nats_server_binary
from trove_stack.processes import Child


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """A nats-server of one user, ``trove``, whose password its config file gives."""
    server = EmbeddedNats(NatsConfig(store_dir=tmp_path / "nats", password="first")).start()
    try:
        yield server
    finally:
        server.stop()


async def test_a_first_connection_the_server_turns_away_ends_the_start(
    guarded: EmbeddedNats,
) -> None:
    # A pod restarted while its Secret still holds the old password: nats-py tries a
    # first connection for ever, and the pod sat alive and never ready, never restarted
    # to read the mended Secret. The start ends, as the deployment's mistake.
    old_password = guarded.url.replace("trove:first@", "trove:old@")
    stop, ready = asyncio.Event(), asyncio.Event()

    async def main(stop: asyncio.Event, ready: asyncio.Event) -> None:
        bus = await Bus.connect(old_password, name="trove-tests", refused_patience=2.0)
        await bus.close()
        ready.set()

    starting = _start_patiently(main, stop, ready, logging.getLogger("test"))
    with pytest.raises(BrokerClosed, match=r"turned this service away .*Authorization") as refused:
        await asyncio.wait_for(starting, timeout=20)
    assert not infrastructure_away(refused.value)
    assert not ready.is_set()


async def test_a_server_away_between_two_refusals_does_not_restart_the_patience(
    guarded: EmbeddedNats,
) -> None:
    # Every other try meets the server away (a connection closed at once), every other
    # one turns the old password away: the turns away are the deployment's mistake still.
    server = urlsplit(guarded.url)
    tries = 0

    async def alternate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal tries
        tries += 1
        if tries % 2 == 0:
            writer.close()
            return
        assert server.hostname is not None
        assert server.port is not None
        await relay(reader, writer, server.hostname, server.port)

    proxy = await asyncio.start_server(alternate, "127.0.0.1", 0)
    port = proxy.sockets[0].getsockname()[1]
    try:
        old_password = f"nats://trove:old@127.0.0.1:{port}"
        with pytest.raises(BrokerClosed, match=r"turned this service away"):
            await asyncio.wait_for(
                Bus.connect(old_password, name="trove-tests", refused_patience=2.0), timeout=20
            )
    finally:
        proxy.close()
    assert tries >= 2


async def test_a_server_certificate_the_deployments_ca_does_not_sign_ends_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server_ca, other_ca = trustme.CA(), trustme.CA()
    issued = server_ca.issue_cert("127.0.0.1")
    issued.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    issued.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    other_ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("TROVE_NATS_TLS_CA", str(tmp_path / "ca.pem"))
    port = free_port("127.0.0.1")
    server = Child(
        "nats-server",
        [
            str(nats_server_binary()),
            *("-a", "127.0.0.1", "-p", str(port)),
            *("--tls", "--tlscert", str(tmp_path / "cert.pem")),
            *("--tlskey", str(tmp_path / "key.pem")),
        ],
        log_path=tmp_path / "nats-server.log",
    )
    try:
        server.wait_until(lambda: listening("127.0.0.1", port), timeout=20, what="listening")
        with pytest.raises(BrokerClosed, match="SSLCertVerificationError") as refused:
            await asyncio.wait_for(
                Bus.connect(f"tls://127.0.0.1:{port}", name="t", refused_patience=2.0),
                timeout=20,
            )
    finally:
        server.stop()
    assert not infrastructure_away(refused.value)


async def test_a_first_connection_waits_for_a_server_that_starts_late(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A server away is not a refusal: however long it takes, the connection waits.
    port = free_port("127.0.0.1")
    url = f"nats://trove:first@127.0.0.1:{port}"
    server = EmbeddedNats(NatsConfig(store_dir=tmp_path / "nats", port=port, password="first"))
    with caplog.at_level(logging.DEBUG, logger="trove_schema.bus"):
        connecting = asyncio.create_task(Bus.connect(url, name="t", refused_patience=1.0))
        try:

            async def tries() -> int:  # said once, then told again at DEBUG only
                return sum("nats:" in record.message for record in caplog.records)

            # Tries refused for longer than the patience: still waiting.
            await eventually(tries, until=lambda n: n >= 3, timeout=20, what="three tries")
            assert not connecting.done()
            server.start()
            bus = await asyncio.wait_for(connecting, timeout=20)
            try:
                assert bus.nc.is_connected
                await bus.js.account_info()
            finally:
                await bus.close()
        finally:
            connecting.cancel()
            server.stop()


async def test_a_lost_connection_shows_in_the_broker_gauge_until_it_is_back(
    tmp_path: Path,
) -> None:
    # A service waits an outage out, ready: the gauge is what an alert can watch.
    port = free_port("127.0.0.1")
    server = EmbeddedNats(NatsConfig(store_dir=tmp_path / "nats", port=port, password="first"))
    server.start()
    try:
        bus = await Bus.connect(server.url, name="t")
        try:

            async def gauge() -> float:
                return float(BROKER_CONNECTED._value.get())

            assert await gauge() == 1
            server.stop()
            await eventually(gauge, until=lambda v: v == 0, timeout=20, what="gauge at 0")
            server.start()
            await eventually(gauge, until=lambda v: v == 1, timeout=30, what="gauge back at 1")
            await bus.js.account_info()
        finally:
            await bus.close()
    finally:
        server.stop()


async def test_an_outage_is_said_once_and_again_after_the_connection_came_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The client tries again every second, and each refused connect was a warning:
    # 3,600 lines an hour a process.
    port = free_port("127.0.0.1")
    server = EmbeddedNats(NatsConfig(store_dir=tmp_path / "nats", port=port, password="first"))
    server.start()

    def said(level: int) -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.levelno == level and r.getMessage().startswith("nats:")
        ]

    async def told_again() -> int:
        return len(said(logging.DEBUG))

    async def reconnections() -> int:
        return said(logging.INFO).count("nats: reconnected")

    async def an_outage(bus: Bus, outage: int) -> list[str]:
        """What was said at WARNING from the server's stop to its answering again."""
        before = len(said(logging.WARNING))
        server.stop()
        tries = 3 * outage  # each told again, at DEBUG
        await eventually(told_again, until=lambda n: n >= tries, timeout=20)
        server.start()
        await eventually(reconnections, until=lambda n: n == outage, timeout=30)
        await bus.js.account_info()
        return said(logging.WARNING)[before:]

    try:
        with caplog.at_level(logging.DEBUG, logger="trove_schema.bus"):
            bus = await Bus.connect(server.url, name="t")
            try:
                for outage in (1, 2):
                    warned = await an_outage(bus, outage)
                    # Each thing said once an outage (the EOF, the disconnection, the
                    # refused connect), and again in the next; no "nats: nats:" either.
                    assert "nats: disconnected" in warned
                    assert len(warned) == len(set(warned)) <= 3, warned
                    assert not any(line.startswith("nats: nats:") for line in warned)
            finally:
                await bus.close()
    finally:
        server.stop()
    # Its own close is no outage.
    assert said(logging.INFO).count("nats: disconnected") == 1
    assert said(logging.WARNING).count("nats: disconnected") == 2


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


async def test_an_error_that_goes_on_while_connected_is_said_again_now_and_then(
    stack: StackUrls, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A slow consumer drops messages while the connection stays up: said once, then told
    # at DEBUG, and said again after a while with how often it came meanwhile.
    bus = await Bus.connect(stack.nats_url, name="t")
    held = asyncio.Event()

    async def stuck(_msg: object) -> None:
        await held.wait()

    def said(level: int) -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.levelno == level and "slow consumer" in r.getMessage()
        ]

    async def drop(count: int) -> None:
        for _ in range(count):
            await bus.nc.publish("slow.test", b"x")
        await bus.nc.flush()

    try:
        with caplog.at_level(logging.DEBUG, logger="trove_schema.bus"):
            await bus.nc.subscribe("slow.test", cb=stuck, pending_msgs_limit=1)
            await drop(10)
            await eventually(
                reading(lambda: len(said(logging.DEBUG))),
                until=lambda n: n >= 5,
                timeout=20,
                what="drops told at DEBUG",
            )
            assert len(said(logging.WARNING)) == 1

            monkeypatch.setattr(trove_schema.bus, "SAY_AGAIN_SECONDS", 0.0)
            await drop(3)
            await eventually(
                reading(lambda: said(logging.WARNING)),
                until=lambda lines: len(lines) >= 2,
                timeout=20,
                what="said again",
            )
            # Told at DEBUG between the two: each one counted.
            levels = [r.levelno for r in caplog.records if "slow consumer" in r.getMessage()]
            first, second, *_ = (n for n, level in enumerate(levels) if level == logging.WARNING)
            told = second - first - 1
            assert told >= 5
            assert said(logging.WARNING)[1].endswith(f"({told} times more since it was last said)")
    finally:
        held.set()
        await bus.close()
