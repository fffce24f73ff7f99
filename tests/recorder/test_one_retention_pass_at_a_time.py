"""Retention runs on one recorder replica at a time: a pass begun while another runs
skips, and a pass whose connection is lost stops, its lock gone with it, for the next
one to run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, async_sessionmaker

from tests.conftest import eventually
from tests.recorder.test_projections import POLICY, rows
from tests.recorder.test_retention import attempt
from trove_recorder.projections import apply_batch
from trove_recorder.retention import RETENTION_LOCK, Pruned, Retention, retention_pass

pytestmark = pytest.mark.usefixtures("clean")

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
RETENTION = Retention(window=timedelta(days=90), batch=4)


async def expired(engine: AsyncEngine) -> None:
    """Ten attempts past the audit's window, and three outbox rows published days ago."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO outbox (event_id, subject, payload, created_at, published_at) "
                "SELECT gen_random_uuid(), 'crawl.requested', '\\x7b7d', :at, :at "
                "FROM generate_series(1, 3)"
            ),
            {"at": NOW - timedelta(days=2)},
        )
    old = [attempt(n, NOW - timedelta(days=91, minutes=n)) for n in range(10)]
    async with async_sessionmaker(engine).begin() as session:
        await apply_batch(session, old, POLICY)


async def counts(engine: AsyncEngine) -> tuple[int, int]:
    (audit,) = await rows(engine, "SELECT count(*) AS n FROM fetcher_attempts")
    (outbox,) = await rows(engine, "SELECT count(*) AS n FROM outbox")
    return int(audit.n), int(outbox.n)


@asynccontextmanager
async def an_attempt_locked(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """The oldest expired attempt locked by another transaction, until the block ends:
    the audit's first batch waits on it."""
    async with engine.connect() as conn:
        await conn.execute(
            text("SELECT id FROM fetcher_attempts ORDER BY attempted_at LIMIT 1 FOR UPDATE")
        )
        yield conn
        await conn.rollback()


async def lock_holder(engine: AsyncEngine) -> int | None:
    """The server process holding the retention's lock, if one does."""
    found = await rows(
        engine,
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
        "AND (CAST(classid AS bigint) << 32 | CAST(objid AS bigint)) = :lock",
        lock=RETENTION_LOCK,
    )
    return int(found[0].pid) if found else None


async def waiting_on_the_row(engine: AsyncEngine) -> list[int]:
    """The server processes of the audit's deletes waiting on a row lock."""
    found = await rows(
        engine,
        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND query LIKE 'DELETE FROM fetcher_attempts %'",
    )
    return [int(r.pid) for r in found]


async def a_pass_waiting(engine: AsyncEngine) -> tuple[asyncio.Task[Pruned | None], int]:
    """A pass begun, its audit's first batch waiting on the locked attempt; its server
    process."""
    running = asyncio.create_task(retention_pass(engine, RETENTION, lambda: NOW))
    (pid,) = await eventually(
        lambda: waiting_on_the_row(engine),
        until=lambda pids: len(pids) == 1,
        timeout=10,
        what="the pass waits on the locked attempt",
    )
    return running, pid


async def test_a_pass_begun_while_another_runs_skips_and_the_first_deletes_everything_once(
    engine: AsyncEngine,
) -> None:
    await expired(engine)
    async with an_attempt_locked(engine):
        first, pid = await a_pass_waiting(engine)
        # The other replica's pass, meanwhile: it does not wait on the first's rows.
        second = await asyncio.wait_for(retention_pass(engine, RETENTION, lambda: NOW), 30)
        assert second is None
        assert await lock_holder(engine) == pid
        assert await counts(engine) == (10, 3)
    pruned = await asyncio.wait_for(first, 30)
    assert pruned is not None
    assert (sum(pruned.audit), pruned.published) == (10, 3)
    assert await counts(engine) == (0, 0)
    assert await lock_holder(engine) is None  # let go with the pass


async def test_a_pass_whose_connection_is_lost_stops_and_the_next_one_runs(
    engine: AsyncEngine,
) -> None:
    await expired(engine)
    async with an_attempt_locked(engine):
        first, pid = await a_pass_waiting(engine)
        assert await lock_holder(engine) == pid
        async with engine.connect() as admin:
            await admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        lost = await asyncio.wait_for(first, 30)
    # Its audit step failed with the connection, and its later steps did not run on
    # another one, without the lock.
    assert lost is not None
    assert (lost.audit, lost.published) == ([], 0)
    assert await counts(engine) == (10, 3)
    assert await lock_holder(engine) is None
    pruned = await asyncio.wait_for(retention_pass(engine, RETENTION, lambda: NOW), 30)
    assert pruned is not None
    assert (sum(pruned.audit), pruned.published) == (10, 3)
    assert await counts(engine) == (0, 0)
