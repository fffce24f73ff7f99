"""The recorder's pool against a real Postgres: what a checkout costs and what it checks."""

from __future__ import annotations

import asyncio
import time

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import QueuePool

from tests.conftest import StackUrls
from trove_recorder.database import make_engine

BACKEND = text("SELECT pg_backend_pid()")


async def _backend(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(BACKEND)).scalar_one())


async def test_a_connection_the_server_ended_is_replaced_before_the_next_batch_gets_it(
    stack: StackUrls, engine: AsyncEngine
) -> None:
    recorder = make_engine(stack.database_url)
    try:
        first = await _backend(recorder)  # back in the pool, idle
        async with engine.connect() as admin:
            await admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first})
        # The server tells the session it ends it; the idle connection reads that.
        pool = recorder.sync_engine.pool
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            async with engine.connect() as admin:
                gone = (
                    await admin.execute(
                        text("SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = :pid"),
                        {"pid": first},
                    )
                ).scalar_one()
            if gone:
                break
            await asyncio.sleep(0.05)
        assert gone, "the backend was not terminated"
        assert isinstance(pool, QueuePool)
        assert pool.checkedin() == 1  # it, idle, is what the next checkout gets

        # Without the check at checkout, this query runs on the dead connection and fails.
        second = await _backend(recorder)
        assert second != first
    finally:
        await recorder.dispose()


async def test_a_checkout_sends_the_database_nothing(stack: StackUrls, engine: AsyncEngine) -> None:
    recorder = make_engine(stack.database_url)
    try:
        backend = await _backend(recorder)
        async with engine.connect() as admin:
            before = (
                await admin.execute(
                    text("SELECT state_change FROM pg_stat_activity WHERE pid = :pid"),
                    {"pid": backend},
                )
            ).scalar_one()
        for _ in range(5):
            async with recorder.connect():
                pass  # a checkout and a return, no statement
        async with engine.connect() as admin:
            after = (
                await admin.execute(
                    text("SELECT state_change FROM pg_stat_activity WHERE pid = :pid"),
                    {"pid": backend},
                )
            ).scalar_one()
        # A ping (BEGIN; ROLLBACK on asyncpg) would have moved the backend's state.
        assert after == before
    finally:
        await recorder.dispose()
