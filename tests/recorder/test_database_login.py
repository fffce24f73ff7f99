"""Postgres refusing the recorder's login at runtime (a password rotated, the role or the
database gone): the events wait in the stream, nothing is counted against them, and the
recorder ends after a patience so that its restart reads the current URL."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import asyncpg.exceptions as pg
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import exc as sa_exc

from tests.conftest import StackUrls, eventually
from tests.ports import free_port
from tests.recorder.test_database_errors import wrapped
from tests.recorder.test_recorder_service import completed
from trove_recorder.database import UNAVAILABLE_DELAY, as_retry, login_refused
from trove_recorder.errors import LoginRefused
from trove_recorder.recorder import serve
from trove_schema.bus import Bus
from trove_schema.migrate import upgrade
from trove_schema.service import infrastructure_away
from trove_schema.settings import RecorderSettings
from trove_schema.topology import DEAD_STREAM
from trove_stack.postgres import EmbeddedPostgres, PostgresConfig

pytestmark = pytest.mark.usefixtures("clean")

FIRST, SECOND = "first-secret", "second-secret"
#: The recorder's patience with refused logins here (30 s in a pod).
PATIENCE = 3.0

REFUSED = [
    pg.InvalidPasswordError('password authentication failed for user "trove"'),
    pg.InvalidAuthorizationSpecificationError('no pg_hba.conf entry for host "10.0.0.7"'),
    pg.InvalidAuthorizationSpecificationError('role "trove" does not exist'),
    pg.InvalidCatalogNameError('database "trove" does not exist'),
]


@pytest.mark.parametrize("error", REFUSED, ids=lambda e: f"{type(e).__name__}-{e}"[:40])
def test_a_refused_login_is_a_retry_at_runtime_and_the_deployments_mistake_at_start(
    error: Exception,
) -> None:
    retry = as_retry(wrapped(error))
    assert retry is not None
    assert retry.delay == UNAVAILABLE_DELAY
    assert as_retry(error) is not None, "raw, as asyncpg raises it while connecting"
    # A start meets it at every try: it ends at once, not waits as for a server away.
    assert not infrastructure_away(error)
    assert not infrastructure_away(wrapped(error))


@pytest.fixture
def guarded_postgres(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    """A Postgres of this test's own whose role logs in over TCP with ``FIRST``."""
    server = EmbeddedPostgres(
        PostgresConfig(
            data_dir=tmp_path / "pg" / "data", port=free_port("127.0.0.1"), password=FIRST
        )
    ).start()
    try:
        upgrade(server.url)
        yield server
    finally:
        server.stop()


def with_password(server: EmbeddedPostgres, password: str) -> str:
    return server.url.replace(f":{FIRST}@", f":{password}@")


async def as_admin(url: str, sql: str) -> None:
    conn = await asyncpg.connect(url.replace("+asyncpg", ""))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def rotate(server: EmbeddedPostgres, old: str, new: str) -> None:
    """What an operator's rotation does: the role's password changed, then every session
    ended (as a restart or a failover ends them), so the next ones log in anew."""
    await as_admin(with_password(server, old), f"ALTER ROLE trove PASSWORD '{new}'")
    await as_admin(
        with_password(server, new),
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )


async def projected(url: str) -> int:
    conn = await asyncpg.connect(url.replace("+asyncpg", ""))
    try:
        return int(await conn.fetchval("SELECT count(*) FROM projected_events"))
    finally:
        await conn.close()


def ending(name: str) -> float:
    """``trove_messages_total{consumer="recorder"}`` for ``name``, in this process."""
    labels = {"consumer": "recorder", "ending": name}
    return REGISTRY.get_sample_value("trove_messages_total", labels) or 0.0


def since(before: dict[str, float]) -> dict[str, float]:
    return {name: ending(name) - value for name, value in before.items()}


async def start_recorder(
    stack: StackUrls, url: str, patience: float = PATIENCE
) -> tuple[asyncio.Task[None], asyncio.Event]:
    """The recorder's service, run in this process with a short patience."""
    settings = RecorderSettings(nats_url=stack.nats_url, database_url=url)
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(settings, stop, ready, refused_patience=patience))
    readying = asyncio.ensure_future(ready.wait())
    await asyncio.wait({task, readying}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    readying.cancel()
    if task.done():
        task.result()  # its error, if it failed to start
    assert ready.is_set(), "the recorder did not become ready"
    return task, stop


async def stopped(task: asyncio.Task[None], stop: asyncio.Event) -> None:
    stop.set()
    await asyncio.wait_for(task, timeout=30)


async def publish(bus: Bus, pages: range) -> None:
    await asyncio.gather(*(bus.publish(completed(n)) for n in pages))


async def met_a_refusal(caplog: pytest.LogCaptureFixture) -> None:
    async def said() -> bool:
        return "refused the login" in caplog.text

    await eventually(
        said,
        until=bool,
        timeout=30,
        what="a batch handed back for a refused login",
    )


async def test_a_recorder_started_with_a_refused_login_ends_as_the_deployments_mistake(
    stack: StackUrls, guarded_postgres: EmbeddedPostgres
) -> None:
    settings = RecorderSettings(
        nats_url=stack.nats_url, database_url=with_password(guarded_postgres, "not-the-secret")
    )
    with pytest.raises(sa_exc.DBAPIError, match="password authentication failed") as refused:
        await asyncio.wait_for(serve(settings, asyncio.Event(), asyncio.Event()), timeout=60)
    assert login_refused(refused.value), refused.value
    assert not infrastructure_away(refused.value)  # the process exits, no wait for a server


async def test_a_rotated_password_parks_nothing_and_ends_the_recorder_after_the_patience(
    stack: StackUrls,
    bus: Bus,
    guarded_postgres: EmbeddedPostgres,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    first, second = with_password(guarded_postgres, FIRST), with_password(guarded_postgres, SECOND)
    before = {name: ending(name) for name in ("retried", "failed", "parked")}
    task, stop = await start_recorder(stack, first)
    try:
        await publish(bus, range(10))
        await eventually(lambda: projected(first), until=lambda n: n == 10, timeout=30, what="10")
        await rotate(guarded_postgres, FIRST, SECOND)
        rotated = time.monotonic()
        await publish(bus, range(10, 20))
        await met_a_refusal(caplog)
        done, _ = await asyncio.wait({task}, timeout=PATIENCE + 30)
        ended = time.monotonic()
        assert done, f"the recorder still runs: {since(before)}"
    finally:
        if not task.done():
            await stopped(task, stop)
    with pytest.raises(LoginRefused, match="TROVE_DATABASE_URL"):
        task.result()
    assert ended - rotated >= PATIENCE  # no sooner than the patience
    counted = since(before)
    assert counted["retried"] > 0, counted
    assert counted["failed"] == counted["parked"] == 0, counted
    assert "one by one" not in caplog.text
    assert (await bus.js.stream_info(DEAD_STREAM)).state.messages == 0
    assert await projected(second) == 10

    # Restarted, it reads the current password: the events waited in the stream.
    task, stop = await start_recorder(stack, second)
    try:
        await eventually(lambda: projected(second), until=lambda n: n == 20, timeout=60, what="20")
    finally:
        await stopped(task, stop)
    assert since(before)["parked"] == 0


async def test_logins_refused_for_less_than_the_patience_are_waited_out(
    stack: StackUrls,
    bus: Bus,
    guarded_postgres: EmbeddedPostgres,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    first = with_password(guarded_postgres, FIRST)
    before = {name: ending(name) for name in ("failed", "parked")}
    patience = 2 * PATIENCE  # room for the password to come back within it
    task, stop = await start_recorder(stack, first, patience)
    try:
        await publish(bus, range(5))
        await eventually(lambda: projected(first), until=lambda n: n == 5, timeout=30, what="5")
        await rotate(guarded_postgres, FIRST, SECOND)
        rotated = time.monotonic()
        await publish(bus, range(5, 10))
        await met_a_refusal(caplog)
        await as_admin(
            with_password(guarded_postgres, SECOND), f"ALTER ROLE trove PASSWORD '{FIRST}'"
        )
        await eventually(lambda: projected(first), until=lambda n: n == 10, timeout=60, what="10")
        # Still running past the patience counted from the first refusal.
        left = rotated + patience + 2 - time.monotonic()
        done, _ = await asyncio.wait({task}, timeout=max(0.0, left))
        assert not done, task.exception()
    finally:
        await stopped(task, stop)
    assert since(before) == {"failed": 0, "parked": 0}
