"""Migrations: they build what the models declare, and 0004 carries every edge over."""

from __future__ import annotations

import asyncio
import os

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Connection, text
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tests.support import run_trove
from trove_schema.migrate import alembic_config, upgrade
from trove_schema.tables import Base


async def test_migrations_build_exactly_what_the_models_declare(engine: AsyncEngine) -> None:
    def differences(connection: Connection) -> list[object]:
        return list(compare_metadata(MigrationContext.configure(connection), Base.metadata))

    async with engine.connect() as conn:
        assert await conn.run_sync(differences) == []


EDGES = "SELECT from_page_id, to_page_id, kind, nofollow FROM page_links ORDER BY 1, 2, 3"


async def test_migration_0004_keeps_every_edge_both_ways(scratch_database: str) -> None:
    await asyncio.to_thread(upgrade, scratch_database, "0003")
    db = create_async_engine(scratch_database)
    try:
        async with db.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO pages (id, url, domain) VALUES "
                    "(1, 'https://a.test/', 'a.test'), (2, 'https://b.test/', 'b.test'), "
                    "(3, 'https://c.test/', 'c.test')"
                )
            )
            await conn.execute(
                text(
                    "INSERT INTO page_links (from_page_id, to_page_id, kind, nofollow) VALUES "
                    "(1, 2, 'a', false), (1, 2, 'img', false), (1, 3, 'a', true), "
                    "(2, 1, 'feed', false)"
                )
            )
            before = (await conn.execute(text(EDGES))).all()
        await db.dispose()

        await asyncio.to_thread(upgrade, scratch_database, "head")
        async with db.connect() as conn:
            assert (await conn.execute(text(EDGES))).all() == before
            rows = (await conn.execute(text("SELECT count(*) FROM page_outlinks"))).scalar_one()
            assert rows == 2  # one row per linking page
        await db.dispose()

        await asyncio.to_thread(command.downgrade, alembic_config(scratch_database), "0003")
        async with db.connect() as conn:
            assert (await conn.execute(text(EDGES))).all() == before
    finally:
        await db.dispose()


async def test_a_release_rolled_back_to_starts_on_the_schema_a_newer_one_migrated(
    scratch_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    await asyncio.to_thread(upgrade, scratch_database, "head")
    db = create_async_engine(scratch_database)
    try:
        async with db.begin() as conn:  # what a newer release's migration leaves
            await conn.execute(text("UPDATE alembic_version SET version_num = '0099'"))
        await asyncio.to_thread(upgrade, scratch_database, "head")
        async with db.connect() as conn:
            version = await conn.execute(text("SELECT version_num FROM alembic_version"))
            assert version.scalar_one() == "0099"  # left as the newer release made it
    finally:
        await db.dispose()
    assert "does not know" in caplog.text
    # A revision asked for by name that this release does not have is still an error.
    with pytest.raises(CommandError):
        await asyncio.to_thread(upgrade, scratch_database, "0098")


async def test_a_migration_that_fails_keeps_those_before_it(scratch_database: str) -> None:
    # A transaction each: an upgrade over several releases that fails halfway (here on
    # a table in 0007's way) resumes from where it stopped, and a long one holds no
    # lock an earlier one took.
    await asyncio.to_thread(upgrade, scratch_database, "0005")
    db = create_async_engine(scratch_database)
    try:
        async with db.begin() as conn:
            await conn.execute(text("CREATE TABLE instances (in_the_way int)"))
        with pytest.raises(ProgrammingError, match="instances"):
            await asyncio.to_thread(upgrade, scratch_database, "head")
        async with db.connect() as conn:
            version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).one()
        assert version == ("0006",)
    finally:
        await db.dispose()


async def test_replicas_migrating_together_take_turns(scratch_database: str) -> None:
    # Three recorders (their own processes) starting at once on an empty database.
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TROVE_")},
        "TROVE_DATABASE_URL": scratch_database,
    }
    results = await asyncio.gather(*(run_trove("migrate", env=env) for _ in range(3)))
    assert [code for code, _ in results] == [0, 0, 0], results
    db = create_async_engine(scratch_database)
    try:
        async with db.connect() as conn:
            version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).one()
        assert version == (ScriptDirectory.from_config(alembic_config("")).get_current_head(),)
    finally:
        await db.dispose()


INDEXES = (
    "SELECT c.relname, i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i "
    "JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid "
    "WHERE t.relname IN ('pages', 'page_crawls', 'fetcher_attempts') ORDER BY 1"
)
ADDED_IN_0015 = {"ix_pages_discovered_at", "ix_fetcher_attempts_host_attempted_at_verdict"}
DROPPED_IN_0015 = {
    "ix_page_crawls_page_id_created_at",
    "ix_fetcher_attempts_host_attempted_at",
    "ix_fetcher_attempts_url",
    "ix_fetcher_attempts_page_id",
}


async def test_migration_0015_indexes_what_the_reports_read_and_drops_what_nothing_reads(
    scratch_database: str,
) -> None:
    await asyncio.to_thread(upgrade, scratch_database, "0014")
    db = create_async_engine(scratch_database)
    try:
        async with db.connect() as conn:
            before = {name: (valid, sql) for name, valid, sql in await conn.execute(text(INDEXES))}
        assert before.keys() >= DROPPED_IN_0015
        assert not ADDED_IN_0015 & before.keys()

        await asyncio.to_thread(upgrade, scratch_database, "0015")
        async with db.connect() as conn:
            after = {name: (valid, sql) for name, valid, sql in await conn.execute(text(INDEXES))}
        assert after.keys() == before.keys() - DROPPED_IN_0015 | ADDED_IN_0015
        assert all(valid for valid, _ in after.values())
        verdict = after["ix_fetcher_attempts_host_attempted_at_verdict"][1]
        assert verdict.endswith("(host, attempted_at) INCLUDE (success, is_banned, error_type)")

        await asyncio.to_thread(command.downgrade, alembic_config(scratch_database), "0014")
        async with db.connect() as conn:
            again = {name: (valid, sql) for name, valid, sql in await conn.execute(text(INDEXES))}
        assert again == before
    finally:
        await db.dispose()
