"""A server of the embedded stack that dies is noticed, not waited for in silence, and
one cut short in its first start starts the next time."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import httpx
import nats
import nats.errors
import pytest

from tests.conftest import StackUrls
from tests.ports import free_port
from trove_schema.errors import StackError
from trove_stack import postgres
from trove_stack.nats import EmbeddedNats, NatsConfig
from trove_stack.postgres import EmbeddedPostgres, PostgresConfig, postgres_bin_dir
from trove_stack.stack import Stack


async def select_one(server: EmbeddedPostgres) -> object:
    """What ``server`` answers to ``SELECT 1``, over a connection of its own."""
    connection = await asyncpg.connect(server.url.replace("+asyncpg", ""))
    try:
        return await connection.fetchval("SELECT 1")
    finally:
        await connection.close()


def test_a_dead_nats_server_is_said_with_its_last_log_lines(
    tmp_path: Path, stack: StackUrls
) -> None:
    # The OOM killer took it: the services would wait for it for ever.
    local = Stack(state_dir=tmp_path, database_url=stack.database_url).start()
    try:
        local.check_servers()  # both there: nothing to say
        assert local.nats is not None
        local.nats._child.proc.kill()  # type: ignore[union-attr]
        local.nats._child.proc.wait(10)  # type: ignore[union-attr]
        with pytest.raises(StackError, match=r"nats-server exited \(code -9: .*"):
            local.check_servers()
    finally:
        local.stop()


def test_an_initdb_cut_short_leaves_nothing_the_next_start_cannot_use(tmp_path: Path) -> None:
    # The first start's initdb killed once it wrote its files (Ctrl-C, the machine off):
    # the folder is not taken for a database, and the next start makes one.
    real = postgres_bin_dir(None)
    cut = tmp_path / "bin"
    cut.mkdir()
    for tool in real.iterdir():
        (cut / tool.name).symlink_to(tool)
    (cut / "initdb").unlink()
    (cut / "initdb").write_text(f'#!/bin/sh\n"{real / "initdb"}" "$@" >/dev/null\nkill -9 $$\n')
    (cut / "initdb").chmod(0o755)
    data = tmp_path / "postgres" / "data"
    config = PostgresConfig(data_dir=data, fast_and_unsafe=True, bin_dir=str(cut))

    with pytest.raises(StackError, match="initdb failed"):
        EmbeddedPostgres(config).start()
    assert not (data / "PG_VERSION").exists()

    server = EmbeddedPostgres(replace(config, bin_dir=str(real))).start()
    try:
        assert (data / "PG_VERSION").exists()
        assert server.exited() is None
    finally:
        server.stop()


async def test_postgres_starts_in_a_folder_deeper_than_a_socket_path_may_be(
    tmp_path: Path,
) -> None:
    # A Unix socket's path is limited to ~107 bytes: a checkout a little deep, or a
    # temporary folder on macOS, passed it, and Postgres refused to start. Trove's
    # clients all connect over TCP.
    data = tmp_path / ("deep" * 20) / "postgres" / "data"
    assert len(str(data / ".s.PGSQL.54321")) > 108
    server = EmbeddedPostgres(PostgresConfig(data_dir=data, fast_and_unsafe=True)).start()
    try:
        assert await select_one(server) == 1
    finally:
        server.stop()


async def test_the_embedded_servers_ask_for_their_passwords(tmp_path: Path) -> None:
    # Another user of the machine reaches 127.0.0.1 too; Postgres's superuser runs
    # programs (COPY ... TO PROGRAM), and NATS takes seeds and exclusions.
    local = Stack(state_dir=tmp_path, fast_and_unsafe=True).start()
    try:
        nats_url = urlsplit(local.nats_url)
        db_url = urlsplit(local.database_url)
        assert nats_url.password
        assert db_url.password
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(
                f"nats://{nats_url.hostname}:{nats_url.port}",
                allow_reconnect=False,
                max_reconnect_attempts=0,
                connect_timeout=2,
            )
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(
                host=db_url.hostname, port=db_url.port, user="trove", database="trove"
            )
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(
                host=db_url.hostname, port=db_url.port, user="trove", password="guess"
            )
        connection = await asyncpg.connect(local.database_url.replace("+asyncpg", ""))
        await connection.close()
        client = await nats.connect(local.nats_url, allow_reconnect=False)
        await client.close()
        secret = tmp_path / "postgres" / "password"
        assert secret.stat().st_mode & 0o077 == 0
        # Its folder's too (under root, Postgres's user may pass through it, no more).
        assert secret.parent.stat().st_mode & 0o066 == 0
    finally:
        local.stop()
    again = Stack(state_dir=tmp_path, fast_and_unsafe=True).start()  # the same password
    try:
        connection = await asyncpg.connect(again.database_url.replace("+asyncpg", ""))
        await connection.close()
    finally:
        again.stop()


async def test_a_cluster_made_before_passwords_asks_for_one_from_then_on(tmp_path: Path) -> None:
    # A state folder of a release before: its cluster let anyone in over TCP (trust).
    config = PostgresConfig(data_dir=tmp_path / "postgres" / "data", fast_and_unsafe=True)
    EmbeddedPostgres(config).start().stop()

    server = EmbeddedPostgres(replace(config, password="kept-secret")).start()
    try:
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(host="127.0.0.1", port=server.port, user="trove")
        connection = await asyncpg.connect(server.url.replace("+asyncpg", ""))
        await connection.close()
    finally:
        server.stop()


def test_a_data_folder_of_files_but_no_cluster_is_said_not_overwritten(tmp_path: Path) -> None:
    data = tmp_path / "postgres" / "data"
    data.mkdir(parents=True)
    (data / "someones.txt").write_text("kept")
    with pytest.raises(StackError, match="holds files but no Postgres cluster"):
        EmbeddedPostgres(PostgresConfig(data_dir=data, fast_and_unsafe=True)).start()
    assert (data / "someones.txt").read_text() == "kept"


def test_the_nats_password_is_written_to_a_new_file_only_this_user_can_read(
    tmp_path: Path, stack: StackUrls
) -> None:
    # A file rewritten in place keeps its inode: a handle another user opened on it
    # while it was readable would read every password after.
    state = tmp_path / "state"
    conf = state / "nats" / "nats-server.conf"
    inodes = []
    for _ in range(2):
        local = Stack(state_dir=state, database_url=stack.database_url).start()
        try:
            assert local.nats is not None
            assert local.nats.config.password is not None
            assert local.nats.config.password in conf.read_text()
            found = conf.stat()
            assert found.st_mode & 0o077 == 0
            inodes.append(found.st_ino)
        finally:
            local.stop()
    assert inodes[0] != inodes[1]
    assert [p.name for p in conf.parent.iterdir() if "conf" in p.name] == [conf.name]
    for folder in (state, state / "nats"):
        assert folder.stat().st_mode & 0o077 == 0, folder


def test_nats_is_not_taken_for_ready_on_a_port_another_listener_holds(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = other.getsockname()[1]
        server = EmbeddedNats(NatsConfig(store_dir=tmp_path / "nats", port=taken))
        try:
            with pytest.raises(
                StackError, match=r"(?s)nats-server exited .*address already in use"
            ):
                server.start()
        finally:
            server.stop()
    # Its own ports, picked by nats-server: the monitor's is never the client's.
    server = EmbeddedNats(NatsConfig(store_dir=tmp_path / "nats")).start()
    try:
        client, monitor = urlsplit(server.url).port, urlsplit(server.monitor_url).port
        assert client != monitor
        assert httpx.get(f"{server.monitor_url}/varz", timeout=5).json()["port"] == client
    finally:
        server.stop()


def test_nats_serves_go_profiles_only_when_asked(tmp_path: Path) -> None:
    server = EmbeddedNats(NatsConfig(store_dir=tmp_path / "plain")).start()
    try:
        assert server.profile_url == ""
    finally:
        server.stop()
    server = EmbeddedNats(NatsConfig(store_dir=tmp_path / "profiled", profile=True)).start()
    try:
        profiles = urlsplit(server.profile_url)
        assert profiles.hostname == "127.0.0.1"
        assert profiles.port not in (urlsplit(server.url).port, urlsplit(server.monitor_url).port)
        answer = httpx.get(f"{server.profile_url}/debug/pprof/", timeout=5)
        assert answer.status_code == 200
        assert "goroutine" in answer.text
    finally:
        server.stop()


async def test_postgres_takes_another_port_when_the_one_picked_free_was_taken_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Between the pick and Postgres's bind, another program listened on the port (or a
    # connection took it as its own): the start is made again on another, not failed.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = other.getsockname()[1]
        picks = iter([taken, taken, free_port()])
        monkeypatch.setattr(postgres, "free_port", lambda host: next(picks))
        data = tmp_path / "postgres" / "data"
        server = EmbeddedPostgres(PostgresConfig(data_dir=data, fast_and_unsafe=True)).start()
        try:
            assert server.port != taken
            assert await select_one(server) == 1
        finally:
            server.stop()
        log = (data.parent / "postgres.log").read_text()
        assert log.count("could not create any TCP/IP sockets") == 2

        # A port the operator chose is not swapped for another.
        chosen = PostgresConfig(data_dir=data, port=taken, fast_and_unsafe=True)
        with pytest.raises(StackError, match="could not create any TCP/IP sockets"):
            EmbeddedPostgres(chosen).start()
