"""Alembic environment: runs migrations over the async engine Trove uses everywhere."""

from __future__ import annotations

import asyncio
import logging
import threading

from alembic import context
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine

from trove_schema.errors import MigrationStopped
from trove_schema.migrate import MIGRATOR_LOCK
from trove_schema.tables import Base

target_metadata = Base.metadata

log = logging.getLogger("trove_schema.migrate")

#: How often a migrator waiting for another tries the lock again.
_LOCK_POLL_SECONDS = 0.5
#: lock_not_available: a migration's own ``lock_timeout`` ran out before it got a table.
_LOCK_NOT_AVAILABLE = "55P03"
#: A migration that gave way so is tried again this many times, this far apart (about
#: two minutes); then the migrator fails, and its caller tries again later (the
#: recorder's start waits and retries, the Job restarts).
_LOCK_ATTEMPTS = 12
_LOCK_PAUSE_SECONDS = 5.0

#: Set by the caller to stop: checked between tries, never within a migration.
_stopping: threading.Event = context.config.attributes.get("stopping") or threading.Event()


def _take_lock(connection: Connection) -> None:
    """The migrators' lock, tried until taken, never waited for by a statement.

    A statement holds a snapshot while it waits, and ``CREATE INDEX CONCURRENTLY`` (in
    the migrator that has the lock) waits for every older snapshot to end: each would
    wait for the other until Postgres ended one, the index build or the waiting
    migrator. Between tries no transaction is open, so a stop ends the wait at once.
    """
    lock = f"SELECT pg_try_advisory_lock({MIGRATOR_LOCK})"
    if _stopping.is_set():  # stopped while it connected: it holds nothing yet
        raise MigrationStopped("stopped before taking the migrators' lock")
    while not connection.exec_driver_sql(lock).scalar():
        connection.commit()
        if _stopping.wait(_LOCK_POLL_SECONDS):
            raise MigrationStopped("stopped while waiting for the migrators' lock")
    connection.commit()


def _nothing_to_apply(migration: MigrationContext) -> bool:
    """Whether an upgrade to head finds the database there, read without the migrators'
    lock: a recorder restarted with its head applied must not wait, not ready, behind
    the Job's hours-long index build. Only an upgrade to head is read so: it is the one
    whose unknown revision the caller tolerates, and any other command goes on as
    Alembic runs it."""
    if migration.opts.get("destination_rev") != "head":
        return False
    script = migration.script
    assert script is not None, "an upgrade is configured with its migrations"
    current = migration.get_current_heads()
    # A newer release's revision raises what Alembic raises for it under the lock.
    script.get_revisions(current)
    return set(current) == set(script.get_heads())


def _gave_way(exc: DBAPIError) -> bool:
    return getattr(exc.orig, "sqlstate", None) == _LOCK_NOT_AVAILABLE


def _run(connection: Connection) -> None:
    # A transaction per migration: one that fails keeps those before it, and a long one
    # (an index on a table of months) holds no lock an earlier one took. The migrators'
    # lock is the session's, so it spans them; committed at once so that no transaction
    # is open when Alembic begins the first.
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        transaction_per_migration=True,
    )
    if _nothing_to_apply(context.get_context()):
        return
    _take_lock(connection)  # and read again under it: another may have migrated meanwhile
    try:
        for attempt in range(1, _LOCK_ATTEMPTS + 1):
            try:
                with context.begin_transaction():
                    context.run_migrations()
                break
            except DBAPIError as exc:
                if not _gave_way(exc) or attempt == _LOCK_ATTEMPTS:
                    raise
                # What went before it is committed: the next try resumes at it.
                connection.rollback()
                log.warning(
                    "a migration did not get its table's lock in time (a long transaction "
                    "holds it): tried again in %.0f s",
                    _LOCK_PAUSE_SECONDS,
                )
                if _stopping.wait(_LOCK_PAUSE_SECONDS):
                    raise MigrationStopped(
                        "stopped while waiting to try again a migration that gave way"
                    ) from exc
    finally:
        connection.rollback()  # whatever a failed migration left open
        connection.exec_driver_sql(f"SELECT pg_advisory_unlock({MIGRATOR_LOCK})")
        connection.commit()


async def _online() -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    assert url, "sqlalchemy.url is not set"
    engine = create_async_engine(url)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(
        url=context.config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_online())
