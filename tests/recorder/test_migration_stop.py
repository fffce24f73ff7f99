"""A recorder stopped while its start-up migration waits (for the Job's index build, for
a long reader) leaves at once: a pod that waits is killed only after its grace period."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.conftest import StackUrls, eventually
from tests.recorder.test_migrations_online import (
    alters_queued,
    database,
    sessions_trying_the_lock,
)
from trove_schema.migrate import MIGRATOR_LOCK, upgrade, upgrade_async
from trove_stack.processes import Child


async def stopped_within(child: Child, seconds: float) -> int | None:
    """The exit status of ``child`` if it ends within ``seconds``; None if it runs on."""
    try:
        return await asyncio.to_thread(child.proc.wait, seconds)
    except subprocess.TimeoutExpired:
        return None


async def test_a_recorder_waiting_for_the_migrators_lock_stops_on_sigterm(
    stack: StackUrls, scratch_database: str, tmp_path: Path
) -> None:
    async with database(scratch_database) as db, db.connect() as conn:
        job = await conn.execution_options(isolation_level="AUTOCOMMIT")
        # The migrate Job, hours into an online index build.
        await job.execute(text(f"SELECT pg_advisory_lock({MIGRATOR_LOCK})"))
        env = {
            **os.environ,
            "TROVE_NATS_URL": stack.nats_url,
            "TROVE_DATABASE_URL": scratch_database,
            "TROVE_LOG_FORMAT": "json",
            "PYTHONUNBUFFERED": "1",
        }
        recorder = Child(
            "recorder",
            [sys.executable, "-m", "trove_recorder"],
            log_path=tmp_path / "recorder.log",
            env=env,
        )
        try:
            await eventually(
                lambda: sessions_trying_the_lock(job),
                until=lambda n: n == 1,
                timeout=30,
                what="the recorder waiting for the migrators' lock",
            )
            recorder.proc.send_signal(signal.SIGTERM)
            code = await stopped_within(recorder, 10)
            assert code == 0, f"still running 10 s after SIGTERM: {recorder.tail()}"
            await eventually(
                lambda: sessions_trying_the_lock(job),
                until=lambda n: n == 0,
                timeout=10,
                what="the recorder's session gone",
            )
        finally:
            await asyncio.to_thread(recorder.stop)
            await job.execute(text(f"SELECT pg_advisory_unlock({MIGRATOR_LOCK})"))


async def migrators_lock_free(conn: AsyncConnection) -> bool:
    """Whether the migrators' lock is free (taken and given back at once if it is)."""
    taken = (await conn.execute(text(f"SELECT pg_try_advisory_lock({MIGRATOR_LOCK})"))).scalar_one()
    if taken:
        await conn.execute(text(f"SELECT pg_advisory_unlock({MIGRATOR_LOCK})"))
    return bool(taken)


async def test_a_migrator_stopped_while_its_migration_gives_way_lets_go_of_the_lock(
    scratch_database: str,
) -> None:
    await asyncio.to_thread(upgrade, scratch_database, "0010")
    async with (
        database(scratch_database) as db,
        db.connect() as reader,
        db.connect() as conn,
    ):
        watcher = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await reader.execute(text("SELECT count(*) FROM pages"))  # its transaction stays open
        migrating = asyncio.create_task(upgrade_async(scratch_database, "0011"))

        await eventually(
            lambda: alters_queued(watcher),
            until=lambda n: n == 1,
            timeout=30,
            what="the ALTER queued",
        )
        migrating.cancel()  # as the recorder's start is cancelled on SIGTERM
        await asyncio.wait({migrating})
        # The ALTER gives way within its 5 s lock_timeout; the migrator then leaves rather
        # than holding the lock through its next tries (about two minutes).
        assert await eventually(
            lambda: migrators_lock_free(watcher),
            until=bool,
            timeout=15,
            what="the migrators' lock given back",
        )
        await reader.rollback()
        version = await watcher.execute(text("SELECT version_num FROM alembic_version"))
        assert version.scalar_one() == "0010"
