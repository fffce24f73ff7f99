"""Migrations run while the recorder writes (it migrates at start, beside the Job): they
never hold its writes up for long, and two migrators never deadlock each other."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from tests.conftest import eventually
from trove_schema.migrate import MIGRATOR_LOCK, alembic_config, upgrade


@asynccontextmanager
async def database(url: str) -> AsyncIterator[AsyncEngine]:
    db = create_async_engine(url)
    try:
        yield db
    finally:
        await db.dispose()


async def index(db: AsyncEngine, name: str) -> tuple[bool, str] | None:
    """Whether the index is valid, and its definition; None when there is none."""
    async with db.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT indisvalid, pg_get_indexdef(indexrelid) FROM pg_index "
                    "WHERE indexrelid = to_regclass(:name)"
                ),
                {"name": name},
            )
        ).one_or_none()
    return None if row is None else (row[0], row[1])


async def cut_short(db: AsyncEngine, name: str, table: str, column: str) -> None:
    """What a concurrent build of ``name`` killed halfway leaves: an invalid index."""
    async with db.connect() as conn:
        autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
        with pytest.raises(DBAPIError, match="division by zero"):
            await autocommit.execute(
                text(
                    f"CREATE INDEX CONCURRENTLY {name} ON {table} "
                    f"((length(CAST({column} AS text)) / 0))"
                )
            )
    assert (await index(db, name) or (True, ""))[0] is False


async def test_an_index_build_cut_short_is_built_again_and_a_built_one_kept(
    scratch_database: str,
) -> None:
    await asyncio.to_thread(upgrade, scratch_database, "0008")
    async with database(scratch_database) as db:
        async with db.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO projected_events (event_id, event_type) "
                    "VALUES (gen_random_uuid(), 'PageDiscovered')"
                )
            )
            page = (
                await conn.execute(
                    text(
                        "INSERT INTO pages (url, domain) VALUES ('https://a.test/', 'a.test') "
                        "RETURNING id"
                    )
                )
            ).scalar_one()
            await conn.execute(
                text(
                    "INSERT INTO page_crawls (page_id, domain, outcome, started_at, "
                    "completed_at, duration_ms, event_id) VALUES (:page, 'a.test', 'success', "
                    "now(), now(), 5, gen_random_uuid())"
                ),
                {"page": page},
            )
        await cut_short(db, "ix_projected_events_projected_at", "projected_events", "event_id")
        await cut_short(db, "ix_page_crawls_completed_at", "page_crawls", "event_id")

        await asyncio.to_thread(upgrade, scratch_database, "0010")

        assert await index(db, "ix_projected_events_projected_at") == (
            True,
            "CREATE INDEX ix_projected_events_projected_at ON public.projected_events "
            "USING btree (projected_at)",
        )
        assert await index(db, "ix_page_crawls_completed_at") == (
            True,
            "CREATE INDEX ix_page_crawls_completed_at ON public.page_crawls "
            "USING btree (completed_at)",
        )
        # Killed after the builds, before its revision was recorded: run again, it keeps them.
        await asyncio.to_thread(command.stamp, alembic_config(scratch_database), "0008")
        await asyncio.to_thread(upgrade, scratch_database, "0010")
        assert (await index(db, "ix_page_crawls_completed_at") or (False, ""))[0] is True


async def test_the_change_feeds_migration_cut_short_in_its_index_build_runs_again(
    scratch_database: str,
) -> None:
    # 0019 commits its column and trigger before the index is built outside the
    # transaction: killed in the build, the revision is unrecorded and they are there.
    await asyncio.to_thread(upgrade, scratch_database, "0019")
    async with database(scratch_database) as db:
        async with db.connect() as conn:
            autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await autocommit.execute(text("DROP INDEX ix_pages_changed_xact"))
            await autocommit.execute(
                text("INSERT INTO pages (url, domain) VALUES ('https://c.test/', 'c.test')")
            )
            inserted = await autocommit.execute(text("SELECT changed_xact FROM pages"))
            before = inserted.scalar_one()
        await cut_short(db, "ix_pages_changed_xact", "pages", "url")
        await asyncio.to_thread(command.stamp, alembic_config(scratch_database), "0018")

        await asyncio.to_thread(upgrade, scratch_database, "0019")

        assert await index(db, "ix_pages_changed_xact") == (
            True,
            "CREATE INDEX ix_pages_changed_xact ON public.pages USING btree (changed_xact)",
        )
        async with db.begin() as conn:
            await conn.execute(text("UPDATE pages SET status = 'fetched'"))
            changed = await conn.execute(
                text("SELECT changed_xact, pg_current_xact_id()::text::bigint FROM pages")
            )
            after, writer = changed.one()
        assert before is not None
        assert after == writer > before
        async with db.connect() as conn:
            triggers = await conn.execute(
                text("SELECT count(*) FROM pg_trigger WHERE tgname = 'pages_changed'")
            )
            assert triggers.scalar_one() == 1


async def alters_queued(conn: AsyncConnection) -> int:
    """Sessions of this database whose ``ALTER TABLE pages`` waits for a lock (a
    migration queued behind a long reader)."""
    found = await conn.execute(
        text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE 'ALTER TABLE pages%'"
        )
    )
    await conn.commit()  # the next look sees the sessions anew
    return int(found.scalar_one())


async def sessions_trying_the_lock(conn: AsyncConnection) -> int:
    """Other sessions of this database asking for the migrators' lock, or committed after
    trying it (what a migrator that tries it again and again shows between tries)."""
    found = await conn.execute(
        text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND (query LIKE :lock OR query = 'COMMIT;')"
        ),
        {"lock": f"%advisory_lock({MIGRATOR_LOCK})%"},
    )
    return int(found.scalar_one())


async def test_a_migrator_waiting_for_another_does_not_deadlock_its_index_build(
    scratch_database: str,
) -> None:
    # Two replicas (the Job and a recorder starting) migrating at once: the one that has
    # the lock builds an index concurrently while the other waits for the lock.
    async with database(scratch_database) as db, db.connect() as conn:
        first = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await first.execute(text("CREATE TABLE history (at timestamptz)"))
        await first.execute(text(f"SELECT pg_advisory_lock({MIGRATOR_LOCK})"))
        second = asyncio.create_task(asyncio.to_thread(upgrade, scratch_database, "head"))
        try:
            await eventually(
                lambda: sessions_trying_the_lock(first),
                until=lambda n: n == 1,
                timeout=30,
                what="the second migrator waiting",
            )
            # Postgres looks for a deadlock once a wait outlasts this: at once, here.
            await first.execute(text("SET deadlock_timeout = '10ms'"))
            await first.execute(text("CREATE INDEX CONCURRENTLY ix_history_at ON history (at)"))
        finally:
            await first.execute(text(f"SELECT pg_advisory_unlock({MIGRATOR_LOCK})"))
            await second
        assert (await index(db, "ix_history_at") or (False, ""))[0] is True
        version = await first.execute(text("SELECT version_num FROM alembic_version"))
        head = ScriptDirectory.from_config(alembic_config("")).get_current_head()
        assert version.scalar_one() == head


async def test_a_schema_change_behind_a_long_reader_lets_the_writers_through(
    scratch_database: str,
) -> None:
    await asyncio.to_thread(upgrade, scratch_database, "0010")
    async with (
        database(scratch_database) as db,
        db.connect() as reader,
        db.connect() as watcher,
    ):
        await reader.execute(text("SELECT count(*) FROM pages"))  # its transaction stays open
        migrating = asyncio.create_task(asyncio.to_thread(upgrade, scratch_database, "0011"))
        await eventually(
            lambda: alters_queued(watcher),
            until=lambda n: n == 1,
            timeout=30,
            what="the ALTER queued",
        )

        async def write() -> None:
            async with db.begin() as conn:
                await conn.execute(
                    text("INSERT INTO pages (url, domain) VALUES ('https://b.test/', 'b.test')")
                )

        # Queued behind the reader, the ALTER holds the writer up only until it gives way.
        await asyncio.wait_for(write(), timeout=30)
        assert not migrating.done()
        await reader.rollback()
        await migrating  # tried again once the reader is gone
        async with db.connect() as conn:
            columns = await conn.execute(
                text(
                    "SELECT count(*) FROM information_schema.columns "
                    "WHERE table_name = 'pages' AND column_name IN ('content_at', 'linked_at')"
                )
            )
            assert columns.scalar_one() == 2
