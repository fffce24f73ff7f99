"""A command whose broker or database cannot be reached says so once, and exits 1, at once.

nats-py's defaults (sixty tries, two seconds apart, a traceback each) had an operator's
command against a wrong address sit two minutes printing tracebacks."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import eventually
from tests.ports import free_port
from tests.support import run_trove
from trove_cli.broker import shown
from trove_stack.nats import listening, nats_server_binary


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("status",), "cannot reach NATS at nats://***@127.0.0.1:"),
        (("seed", "https://example.org/"), "cannot reach NATS at nats://***@"),
        (("dead",), "cannot reach NATS at nats://***@"),
        (("exclusions",), "cannot reach NATS at nats://***@"),
        (("search", "bread"), "error: ConnectionRefusedError"),
    ],
    ids=["status", "seed", "dead", "exclusions", "search"],
)
async def test_a_server_that_cannot_be_reached_is_one_line_and_exit_1(
    argv: tuple[str, ...], says: str
) -> None:
    closed = free_port()  # nothing listens there
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TROVE_")},
        "TROVE_NATS_URL": f"nats://operator:secret@127.0.0.1:{closed}",
        "TROVE_DATABASE_URL": f"postgresql+asyncpg://trove:secret@127.0.0.1:{closed}/trove",
    }
    # Within the run's own deadline: the defaults took two minutes.
    code, out = await run_trove(*argv, env=env, timeout=20)
    assert code == 1, out
    assert says in " ".join(out.split()), out
    assert "Traceback" not in out
    assert "secret" not in out


async def test_a_database_that_takes_the_connection_and_never_answers_is_given_up_on(
    tmp_path: Path,
) -> None:
    # A port a proxy or a firewall holds open: the connection is taken, nothing is said.
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TROVE_")},
        "TROVE_DATABASE_URL": f"postgresql+asyncpg://trove:secret@127.0.0.1:{port}/trove",
        "TROVE_STATE_DIR": str(tmp_path / "state"),
    }
    try:
        began = time.monotonic()
        # Within the run's own deadline, under asyncpg's own 60 s.
        code, out = await run_trove("search", "bread", env=env, timeout=40)
        took = time.monotonic() - began
    finally:
        server.close()
        for writer in held:
            writer.close()
    assert code == 1, out
    assert "error: TimeoutError: no answer in time" in " ".join(out.split()), out
    assert took < 40
    assert held, "the command never connected"
    assert "Traceback" not in out
    assert "secret" not in out


@pytest.mark.parametrize(
    ("url", "printed"),
    [
        ("nats://operator:s3cr3t@nats:4222", "nats://***@nats:4222"),
        ("nats://s3cr3ttoken@nats:4222", "nats://***@nats:4222"),
        ("nats://:s3cr3t@nats", "nats://***@nats"),
        # The host is after the last "@": all before it is the password.
        ("nats://operator:s3@cr3t@nats", "nats://***@nats"),
        (
            "nats://a:s3cr3t@n1:4222,nats://b:s3cr3t@n2:4222",
            "nats://***@n1:4222,nats://***@n2:4222",
        ),
        ("postgresql://db/trove?password=s3cr3t", "postgresql://db/trove?password=***"),
        (
            "postgresql+asyncpg://trove:s3cr3t@db/trove?sslmode=verify-full&sslpassword=s3cr3t",
            "postgresql+asyncpg://***@db/trove?sslmode=verify-full&sslpassword=***",
        ),
        # A generated password with a "/", "?" or "#", which SQLAlchemy reads raw.
        ("postgresql+asyncpg://trove:Zx9+/k=@db/trove", "postgresql+asyncpg://***@db/trove"),
        ("postgresql://trove:a?b#c@db:5432/trove", "postgresql://***@db:5432/trove"),
        # Neither a port SQLAlchemy cannot read nor an "@" of the password's shows it.
        (
            "postgresql+asyncpg://trove:s3cr3t@db:54a32/trove",
            "postgresql+asyncpg://***@db:54a32/trove",
        ),
        ("postgresql+asyncpg://trove:s3@cr3t@db/trove", "postgresql+asyncpg://***@db/trove"),
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        # nats-py takes a server without its scheme, and reads a password's "/" raw.
        ("fetcher:hunter2@nats:4222", "***@nats:4222"),
        ("nats://box:hun/ter2@h:4222", "nats://***@h:4222"),
        ("nats://a:b?c#d@h:4222, b:p/w@h2", "nats://***@h:4222, ***@h2"),
        ("POSTGRESQL://u:p@h/db?sslpassword=x", "POSTGRESQL://***@h/db?sslpassword=***"),
    ],
)
def test_a_server_url_is_printed_without_its_credentials(url: str, printed: str) -> None:
    assert shown(url) == printed


@pytest.mark.parametrize("argv", [("status",), ("dead",)], ids=["status", "dead"])
async def test_a_broker_without_jetstream_is_one_line_and_exit_1(
    argv: tuple[str, ...], tmp_path: Path
) -> None:
    # nats-server answers, JetStream does not: not enabled, or a cluster without a
    # meta leader while it elects one.
    port = free_port()
    server = subprocess.Popen(
        [str(nats_server_binary()), "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        async def up() -> bool:
            return listening("127.0.0.1", port)

        await eventually(up, until=bool, timeout=10, what="nats-server listening")
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("TROVE_")},
            "TROVE_NATS_URL": f"nats://127.0.0.1:{port}",
            "TROVE_DATABASE_URL": f"postgresql+asyncpg://trove@127.0.0.1:{free_port()}/trove",
            "TROVE_STATE_DIR": str(tmp_path),
        }
        code, out = await run_trove(*argv, env=env, timeout=30)
    finally:
        server.terminate()
        server.wait(10)
    assert code == 1, out
    assert "error: NATS:" in out, out
    assert "Traceback" not in out


@pytest.mark.parametrize(
    ("wrong", "says"),
    [
        ({"TROVE_REPLICAS": "abc"}, "TROVE_REPLICAS='abc'"),
        ({"TROVE_EVENTS_MAX_AGE_SECONDS": "86400"}, "TROVE_EVENTS_MAX_AGE_SECONDS (86400)"),
    ],
    ids=["a value that does not parse", "settings that contradict each other"],
)
async def test_a_settings_error_is_one_line_that_never_shows_a_password(
    wrong: dict[str, str], says: str
) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TROVE_")},
        "TROVE_NATS_URL": f"nats://operator:secret@127.0.0.1:{free_port()}",
        "TROVE_DATABASE_URL": "postgresql+asyncpg://trove:secret@127.0.0.1:1/trove",
        **wrong,
    }
    code, out = await run_trove("status", env=env, timeout=20)
    assert code == 2, out
    assert says in " ".join(out.split()), out
    assert "Traceback" not in out
    assert "secret" not in out
