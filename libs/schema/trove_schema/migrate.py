"""Schema migrations (Alembic), run by ``trove migrate`` and by the recorder at start."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.util.exc import CommandError

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).parent / "migrations"
#: The advisory lock that makes one migrator at a time of replicas starting together
#: (taken in ``migrations/env.py``).
MIGRATOR_LOCK = 7340032


def alembic_config(database_url: str, stopping: threading.Event | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    if stopping is not None:
        config.attributes["stopping"] = stopping  # read by migrations/env.py
    return config


def upgrade(
    database_url: str, revision: str = "head", stopping: threading.Event | None = None
) -> None:
    """Bring the database to ``revision``. Blocking: call it off the event loop.

    Once ``stopping`` is set, a migrator that waits (for the migrators' lock, or to try
    again a migration that gave way) raises ``MigrationStopped``; a migration that runs
    is not cut short (a concurrent index build would be left invalid, to build again).
    A database already at head, or at a revision this code does not know, is read so
    without the lock: a start with nothing to apply does not wait behind the Job's build.

    A database at a revision this code does not know was migrated by a newer release:
    this one was rolled back to. Its head is left as it is, with a warning, and the
    service starts: migrations since 0005 only add (a column with a default, a table, an
    index), so an older release works on a newer schema, and refusing would keep every
    pod of a rollback from starting."""
    try:
        command.upgrade(alembic_config(database_url, stopping), revision)
    except CommandError as exc:
        if revision != "head" or "Can't locate revision" not in str(exc):
            raise
        log.warning(
            "the database is at a revision this release does not know (%s): left as "
            "it is, as a newer release migrated it",
            exc,
        )


async def upgrade_async(database_url: str, revision: str = "head") -> None:
    """``upgrade`` in a thread of its own (env.py runs its own event loop). Cancelled, it
    tells the thread to stop: a thread is not cancelled, and the process's exit waits for
    it, so a start waiting for the lock of a migrator hours into an index build would
    hold a SIGTERM until the SIGKILL."""
    stopping = threading.Event()
    try:
        await asyncio.to_thread(upgrade, database_url, revision, stopping)
    except asyncio.CancelledError:
        stopping.set()
        raise


def create_index_online(name: str, table: str, columns: str, include: str = "") -> None:
    """In a migration: index ``table`` (``columns``, SQL; ``include``, columns the index
    carries for index-only reads) concurrently, outside the migration's transaction, so
    the recorder's writes go on while it is built (hours on a table of months: a plain
    build would hold every insert as long). A build cut short (the process killed, a
    deadlock) leaves an invalid index of the name, which is dropped and built again.
    Kept as it is: the migrations that call it ran with it."""
    from alembic import op  # the migration's context, only inside one
    from sqlalchemy import text

    with op.get_context().autocommit_block():
        invalid = op.get_bind().execute(
            text("SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:name)"),
            {"name": name},
        )
        if invalid.scalar():
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        carried = f" INCLUDE ({include})" if include else ""
        op.execute(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} ({columns}){carried}"
        )
