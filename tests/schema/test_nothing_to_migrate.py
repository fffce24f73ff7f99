"""A start with nothing to migrate (its head applied, or a newer release's) goes on at
once, beside the migrate Job that holds the migrators' lock hours into an index build;
a start with a migration pending still waits for the lock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.conftest import eventually
from tests.recorder.test_migrations_online import database, sessions_trying_the_lock
from trove_schema.migrate import MIGRATOR_LOCK, alembic_config, upgrade, upgrade_async

#: Far less than the lock is held for, far more than reading the version takes.
WITHIN_SECONDS = 5


@asynccontextmanager
async def the_job_migrating(url: str) -> AsyncIterator[AsyncConnection]:
    """A session of the database holding the migrators' lock, as the Job does."""
    async with database(url) as db, db.connect() as conn:
        job = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await job.execute(text(f"SELECT pg_advisory_lock({MIGRATOR_LOCK})"))
        try:
            yield job
        finally:
            await job.execute(text(f"SELECT pg_advisory_unlock({MIGRATOR_LOCK})"))


async def version(conn: AsyncConnection) -> str:
    return str((await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar_one())


async def started(url: str) -> None:
    """The recorder's start-up migration, which must end within ``WITHIN_SECONDS``
    (cancelled at the deadline, it stops waiting for the lock and holds nothing)."""
    try:
        await asyncio.wait_for(upgrade_async(url), timeout=WITHIN_SECONDS)
    except TimeoutError:
        pytest.fail(f"still waiting for the migrators' lock after {WITHIN_SECONDS} s")


async def test_a_start_at_head_does_not_wait_for_the_migrators_lock(
    scratch_database: str,
) -> None:
    await asyncio.to_thread(upgrade, scratch_database, "head")
    async with the_job_migrating(scratch_database) as job:
        await started(scratch_database)
        head = ScriptDirectory.from_config(alembic_config("")).get_current_head()
        assert await version(job) == head


async def test_a_start_on_a_newer_releases_schema_does_not_wait_for_the_migrators_lock(
    scratch_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    await asyncio.to_thread(upgrade, scratch_database, "head")
    async with the_job_migrating(scratch_database) as job:
        # A rollback's recorder restarting while the newer release's Job migrates.
        await job.execute(text("UPDATE alembic_version SET version_num = '0099'"))
        await started(scratch_database)
        assert await version(job) == "0099"
    assert "does not know" in caplog.text


async def test_a_start_with_a_migration_pending_waits_for_the_migrators_lock(
    scratch_database: str,
) -> None:
    script = ScriptDirectory.from_config(alembic_config(""))
    head = script.get_current_head()
    assert head is not None
    before = script.get_revision(head).down_revision
    assert isinstance(before, str)
    await asyncio.to_thread(upgrade, scratch_database, before)
    async with the_job_migrating(scratch_database) as job:
        starting = asyncio.create_task(upgrade_async(scratch_database))
        try:
            await eventually(
                lambda: sessions_trying_the_lock(job),
                until=lambda n: n == 1,
                timeout=30,
                what="the start waiting for the migrators' lock",
            )
            assert not starting.done()
            assert await version(job) == before
        except BaseException:
            starting.cancel()
            await asyncio.wait({starting})
            raise
    await asyncio.wait_for(starting, timeout=60)  # the lock given back: it migrates
    async with database(scratch_database) as db, db.connect() as conn:
        assert await version(conn) == head
