"""The recorder's pool against a real Postgres: what a checkout costs and what it checks."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import QueuePool

from tests.conftest import StackUrls, eventually
from trove_recorder.database import make_engine


async def _scalar(engine: AsyncEngine, sql: str, **params: Any) -> Any:
    async with engine.connect() as conn:
        return (await conn.execute(text(sql), params)).scalar_one()


async def test_a_connection_the_server_ended_is_replaced_before_the_next_batch_gets_it(
    stack: StackUrls, engine: AsyncEngine
) -> None:
    recorder = make_engine(stack.database_url)
    try:
        async with recorder.connect() as conn:
            first = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
            driver = (await conn.get_raw_connection()).driver_connection
        assert driver is not None
        assert await _scalar(engine, "SELECT pg_terminate_backend(:pid)", pid=first)

        # The server tells the session it ends it and closes it; the idle connection in
        # the pool reads that.
        async def closed() -> bool:
            return bool(driver.is_closed())

        await eventually(
            closed,
            until=bool,
            timeout=10,
            interval=0.02,
            what="the client seeing the server end the session",
        )
        pool = recorder.sync_engine.pool
        assert isinstance(pool, QueuePool)
        assert pool.checkedin() == 1  # it, idle, is what the next checkout gets

        # Without the look at checkout, this runs on the closed connection and fails.
        second = await _scalar(recorder, "SELECT pg_backend_pid()")
        assert second != first
    finally:
        await recorder.dispose()


async def test_a_checkout_sends_the_database_nothing(stack: StackUrls, engine: AsyncEngine) -> None:
    recorder = make_engine(stack.database_url)
    changed = "SELECT state_change FROM pg_stat_activity WHERE pid = :pid"
    try:
        backend = await _scalar(recorder, "SELECT pg_backend_pid()")
        before = await _scalar(engine, changed, pid=backend)
        for _ in range(5):
            async with recorder.connect():
                pass  # a checkout and a return, no statement
        # A ping (BEGIN, an empty query, ROLLBACK on asyncpg) would move the backend's state.
        assert await _scalar(engine, changed, pid=backend) == before
    finally:
        await recorder.dispose()
