"""Which failures are the database's (a Retry) and which are the event's, over the real
exception classes of asyncpg, raw and as SQLAlchemy wraps them."""

from __future__ import annotations

import asyncpg.exceptions as pg
import asyncpg.exceptions._base as pg_client
import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql.asyncpg import (
    AsyncAdapt_asyncpg_connection,
    AsyncAdapt_asyncpg_dbapi,
)

from trove_recorder.database import (
    UNAVAILABLE_DELAY,
    as_retry,
    database_trouble_is_retried,
    takes_no_writes,
)
from trove_schema.bus import Retry
from trove_schema.errors import MalformedEvent

DBAPI = AsyncAdapt_asyncpg_dbapi(pg)  # type: ignore[no-untyped-call]

AWAY = [
    pg.CannotConnectNowError("the database system is starting up"),
    pg.CannotConnectNowError("the database system is in recovery mode"),
    pg.AdminShutdownError("terminating connection due to administrator command"),
    pg.CrashShutdownError("terminating connection because of crash of another server process"),
    pg.TooManyConnectionsError("sorry, too many clients already"),
    pg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
    pg.ConnectionFailureError("connection failure"),
    pg.ClientCannotConnectError("could not connect"),
    pg.PostgresConnectionError("connection exception"),
    pg.ProtocolViolationError("protocol violation"),
    pg.DeadlockDetectedError("deadlock detected"),
    pg.SerializationError("could not serialize access"),
    # A migration ran while the pod was up: its prepared statements went stale.
    pg.InvalidCachedStatementError("cached plan must not change result type"),
    pg_client.OutdatedSchemaCacheError("type 'x' was changed"),
]

#: The server is there and cannot take the writes, whatever the events say.
UNWRITABLE = [
    pg.DiskFullError('could not extend file "base/5/16386": No space left on device'),
    pg.InsufficientResourcesError("insufficient resources"),
    pg.PostgresIOError('could not read block 7 in file "base/5/16386": Input/output error'),
    pg.PostgresSystemError("could not open file: Too many open files in system"),
    pg.ReadOnlySQLTransactionError("cannot execute INSERT in a read-only transaction"),
    pg.LockNotAvailableError("canceling statement due to lock timeout"),
    pg.DataCorruptedError("invalid page in block 7 of relation base/5/16386"),
    pg.IndexCorruptedError('index "pages_url_key" contains unexpected zero page'),
    pg.InsufficientPrivilegeError("permission denied for table pages"),
]

THE_EVENTS_FAULT = [
    pg.UniqueViolationError("duplicate key value violates unique constraint"),
    pg.NotNullViolationError("null value in column"),
    pg.InvalidTextRepresentationError("invalid input syntax for type uuid"),
    pg.NumericValueOutOfRangeError("value out of range"),
    pg.UndefinedColumnError("column does not exist"),
    pg.OutOfMemoryError("out of memory"),  # a batch too big would fail again, whole
    pg.QueryCanceledError("canceling statement due to statement timeout"),
    pg.DataError("invalid data"),
    pg_client.DataError("invalid input for query argument $1"),  # asyncpg's own encoding
    pg.InterfaceError("cannot perform operation: another operation is in progress"),
]


def wrapped(error: Exception) -> sa_exc.DBAPIError:
    """``error`` as SQLAlchemy raises it from a statement: the dialect's translation, then
    ``DBAPIError.instance`` (the same functions the engine calls)."""
    try:
        AsyncAdapt_asyncpg_connection._handle_exception_no_connection(DBAPI, error)
    except DBAPI.Error as translated:
        made = sa_exc.DBAPIError.instance(
            "SELECT 1", {}, translated, DBAPI.Error, connection_invalidated=False
        )
        assert isinstance(made, sa_exc.DBAPIError)
        made.__cause__ = translated
        return made
    raise AssertionError("the dialect did not translate the error")


@pytest.mark.parametrize("error", AWAY, ids=lambda e: type(e).__name__)
def test_the_database_being_away_or_busy_is_a_retry(error: Exception) -> None:
    assert as_retry(error) is not None, "raw, as asyncpg raises it while connecting"
    assert as_retry(wrapped(error)) is not None, "wrapped by SQLAlchemy"


@pytest.mark.parametrize("error", UNWRITABLE, ids=lambda e: type(e).__name__)
def test_a_database_that_cannot_take_writes_now_is_a_retry(error: Exception) -> None:
    retry = as_retry(wrapped(error))
    assert retry is not None
    assert retry.delay == UNAVAILABLE_DELAY  # it waits as for an outage, not as for a race
    assert as_retry(error) is not None


def test_only_a_read_only_server_has_its_connection_dropped() -> None:
    assert takes_no_writes(wrapped(pg.ReadOnlySQLTransactionError("read-only transaction")))
    assert takes_no_writes(pg.ReadOnlySQLTransactionError("read-only transaction"))
    assert not takes_no_writes(wrapped(pg.DiskFullError("No space left on device")))
    assert not takes_no_writes(wrapped(pg.AdminShutdownError("shutting down")))
    assert not takes_no_writes(ValueError("not the database's"))


@pytest.mark.parametrize("error", THE_EVENTS_FAULT, ids=lambda e: type(e).__name__)
def test_an_error_about_the_statement_is_not_a_retry(error: Exception) -> None:
    assert as_retry(error) is None
    assert as_retry(wrapped(error)) is None


def test_a_race_lost_is_retried_sooner_than_an_outage() -> None:
    conflict = as_retry(wrapped(pg.DeadlockDetectedError("deadlock detected")))
    outage = as_retry(wrapped(pg.CannotConnectNowError("the database system is starting up")))
    assert conflict is not None
    assert outage is not None
    assert conflict.delay < outage.delay


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)"),
        ConnectionResetError(104, "Connection reset by peer"),
        TimeoutError(),
        OSError(113, "No route to host"),
        pg.InterfaceError("cannot call Connection.fetch(): connection is closed"),
        sa_exc.TimeoutError("QueuePool limit of size 10 overflow 10 reached"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_unreachable_server_a_closed_connection_and_an_empty_pool_are_retries(
    error: Exception,
) -> None:
    assert as_retry(error) is not None


def test_a_connection_sqlalchemy_saw_invalidated_is_a_retry() -> None:
    lost = sa_exc.DBAPIError.instance(
        "SELECT 1",
        {},
        DBAPI.InterfaceError("connection is closed"),  # type: ignore[no-untyped-call]
        DBAPI.Error,
        connection_invalidated=True,
    )
    assert as_retry(lost) is not None


def test_the_boundary_raises_retry_from_the_cause_and_lets_the_rest_through() -> None:
    cause = wrapped(pg.AdminShutdownError("terminating connection due to administrator command"))
    with pytest.raises(Retry) as retried, database_trouble_is_retried():
        raise cause
    assert retried.value.__cause__ is cause
    bad = wrapped(pg.UniqueViolationError("duplicate key"))
    with pytest.raises(sa_exc.DBAPIError), database_trouble_is_retried():
        raise bad
    with pytest.raises(MalformedEvent), database_trouble_is_retried():
        raise MalformedEvent("not an event")
