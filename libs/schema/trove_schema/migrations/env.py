"""Alembic environment: runs migrations over the async engine Trove uses everywhere."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from trove_schema.tables import Base

target_metadata = Base.metadata


#: The advisory lock that makes one migrator at a time of replicas starting together.
_MIGRATOR_LOCK = 7340032


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
    connection.exec_driver_sql(f"SELECT pg_advisory_lock({_MIGRATOR_LOCK})")
    connection.commit()
    try:
        with context.begin_transaction():
            context.run_migrations()
    finally:
        connection.rollback()  # whatever a failed migration left open
        connection.exec_driver_sql(f"SELECT pg_advisory_unlock({_MIGRATOR_LOCK})")
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
