"""The recorder's database boundary: its engine, and which failures are the database's.

A failure that means "the database is away or busy" (restarting, in recovery, shutting
down, unreachable, out of connections, the connection lost mid-transaction, the pool
exhausted, a deadlock or serialization conflict) or "it cannot take writes now" (a full
disk, a failing one, a standby or a read-only primary, a lock held too long, a corrupt
index, the role's rights revoked; ``trove_schema.sqlstates``) becomes a ``Retry``: the
messages go back to the stream untouched and nothing counts against them. So does a
login the server refuses (a password rotated, the role or its pg_hba.conf entry gone, the
database dropped), which no try mends: the recorder ends once every login has been
refused for a patience (``LoginRefusals``), and its restart reads the current URL.
Anything else is about the events themselves and stays an error, which may park a
message in the end.

The exception can take several shapes. SQLAlchemy wraps what asyncpg raises in a
``DBAPIError`` whose ``orig`` carries the SQLSTATE; while connecting, and from the
projection's statements (``trove_recorder.sql``, on asyncpg's own connection), asyncpg's
exceptions arrive unwrapped; a socket that cannot be opened is a plain ``OSError``. So
the whole chain is examined.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

from asyncpg.exceptions import InterfaceError as AsyncpgInterfaceError
from asyncpg.exceptions import InvalidCachedStatementError, OutdatedSchemaCacheError
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from trove_recorder.errors import LoginRefused
from trove_schema import sqlstates
from trove_schema.bus import REFUSED_PATIENCE, Retry

log = logging.getLogger("trove.recorder")

#: Seconds before a batch is tried again while the database is away.
UNAVAILABLE_DELAY = 2.0
#: Seconds before a batch that lost a race runs again.
CONFLICT_DELAY = 0.2
#: Seconds a session of the recorder may sit idle inside a transaction before the server
#: ends it. None does so legitimately for long: a batch's statements follow one another,
#: the locks that span passes (retention's, replay's) are held outside a transaction, and
#: a lock waited for keeps the session active, not idle. A recorder lost with its node
#: mid-batch would otherwise keep its row and advisory locks until TCP gives its socket
#: up (15 minutes to hours), and the batch JetStream redelivers to the other recorder
#: would wait on them all that time.
IDLE_IN_TRANSACTION_TIMEOUT = 60.0
#: Seconds to reach the server and log in: a primary lost with its node answers nothing,
#: and asyncpg's own default is a minute.
CONNECT_TIMEOUT = 10.0
#: Either side of a session probes a peer silent for 30 s every 10 s and ends the
#: session after 3 probes unanswered, or once what it sent has gone unacknowledged for
#: 60 s: so a session ends whatever it was doing when its recorder vanished (the
#: server's side), and a statement sent to a primary gone without a word (its node lost,
#: a partition, a failover whose old address drops everything) fails within about a
#: minute instead of waiting for TCP's own retries, 15 minutes to hours (the client's).
KEEPALIVE_IDLE = 30
KEEPALIVE_INTERVAL = 10
KEEPALIVE_COUNT = 3
USER_TIMEOUT = 60
SERVER_TCP = {
    "tcp_keepalives_idle": f"{KEEPALIVE_IDLE}s",
    "tcp_keepalives_interval": f"{KEEPALIVE_INTERVAL}s",
    "tcp_keepalives_count": str(KEEPALIVE_COUNT),
    "tcp_user_timeout": f"{USER_TIMEOUT}s",
}
#: The same on the recorder's socket; the options other than SO_KEEPALIVE are Linux's
#: (and a few others'), and left to the system's defaults where they are missing.
_CLIENT_TCP = (
    (socket.SOL_SOCKET, "SO_KEEPALIVE", 1),
    (socket.IPPROTO_TCP, "TCP_KEEPIDLE", KEEPALIVE_IDLE),
    (socket.IPPROTO_TCP, "TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
    (socket.IPPROTO_TCP, "TCP_KEEPCNT", KEEPALIVE_COUNT),
    (socket.IPPROTO_TCP, "TCP_USER_TIMEOUT", USER_TIMEOUT * 1000),
)
#: Seconds one of the recorder's transactions (a batch of events, an event of a batch
#: that failed, a batch of retention's rows) may run before its connection is closed
#: under it and its work handed back (``TROVE_BATCH_TIMEOUT_SECONDS``).
BATCH_TIMEOUT = 120.0


def make_engine(
    url: str, *, idle_in_transaction: float = IDLE_IN_TRANSACTION_TIMEOUT
) -> AsyncEngine:
    """The recorder's engine: its pool, and the limits the server holds its sessions to.

    No client-side statement timeout: asyncpg's ``command_timeout`` would raise a
    ``TimeoutError``, a batch handed back whole time after time where a statement
    cancelled by the server (``sqlstates.CANCELED``) is tried an event at a time. A
    transaction the server leaves unanswered ends at a deadline far past any batch's
    time instead (``bounded_transaction``)."""
    settings = {
        **SERVER_TCP,
        "idle_in_transaction_session_timeout": f"{round(idle_in_transaction * 1000)}ms",
    }
    engine = create_async_engine(
        url,
        pool_size=10,
        max_overflow=10,
        connect_args={"timeout": CONNECT_TIMEOUT, "server_settings": settings},
    )
    event.listen(engine.sync_engine, "connect", _probe_the_server)
    event.listen(engine.sync_engine, "checkout", _refuse_closed)
    return engine


def client_socket(driver_connection: Any) -> Any | None:
    """The socket under an asyncpg connection, if it can be reached.

    asyncpg offers no socket options of its own: its transport (private) is the way
    to the socket it connected; None if a release of asyncpg moved it."""
    transport = getattr(driver_connection, "_transport", None)
    return None if transport is None else transport.get_extra_info("socket")


def _probe_the_server(dbapi_connection: Any, record: Any) -> None:
    """Each new TCP connection's socket gets the client's half of the TCP limits
    (``_CLIENT_TCP``). A Unix socket (a server on the same machine, ``?host=/run/...``)
    has none to set: Linux refuses them there, and the connection with them."""
    sock = client_socket(dbapi_connection.driver_connection)
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    for level, name, value in _CLIENT_TCP:
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(level, option, value)


def _refuse_closed(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """A pooled connection the server has closed is replaced before a batch gets it.

    This stands in for SQLAlchemy's ``pool_pre_ping``, which on asyncpg is three round
    trips (BEGIN, an empty query, ROLLBACK) on every checkout: at a polite crawl's
    pace, a batch holds an event or a few, and those were a seventh of its round trips.
    A server that restarts or shuts down tells its sessions so and closes them, and
    asyncpg marks the connection closed when it reads that: the look is local. A
    connection that dies unseen fails its batch, which is retried (``as_retry``) on a
    new one. Raising ``DisconnectionError`` here makes the pool drop the connection
    and check out another.
    """
    connection = dbapi_connection.driver_connection
    if connection is None or connection.is_closed():
        raise sa_exc.DisconnectionError("the database closed this connection")


def as_retry(exc: BaseException) -> Retry | None:
    """The ``Retry`` for a failure that is the database's, or None if it is not."""
    for cause in _chain(exc):
        state = getattr(cause, "sqlstate", None)
        if isinstance(state, str) and state:
            if state in sqlstates.CONFLICT:
                return Retry(f"transaction conflict ({state}): {cause}", delay=CONFLICT_DELAY)
            if sqlstates.away(state):
                return Retry(f"database unavailable ({state}): {cause}", delay=UNAVAILABLE_DELAY)
            if sqlstates.unwritable(state):
                return Retry(f"database cannot write ({state}): {cause}", delay=UNAVAILABLE_DELAY)
            if sqlstates.refused(state):
                return Retry(
                    f"database refused the login ({state}): {cause}", delay=UNAVAILABLE_DELAY
                )
        if isinstance(cause, InvalidCachedStatementError | OutdatedSchemaCacheError):
            # A statement prepared before the schema changed (an upgrade's migration ran
            # while this pod was up). asyncpg drops the connection's cache as it raises
            # this, but cannot run the statement again inside the transaction: the batch
            # can, at once, and it is not the events' fault.
            return Retry(f"statement cached before a schema change: {cause}", delay=CONFLICT_DELAY)
        if isinstance(cause, sa_exc.DBAPIError) and cause.connection_invalidated:
            return Retry(f"database connection lost: {cause.orig}", delay=UNAVAILABLE_DELAY)
        if isinstance(cause, sa_exc.TimeoutError):  # no pooled connection came free in time
            return Retry(f"database pool exhausted: {cause}", delay=UNAVAILABLE_DELAY)
        if isinstance(cause, AsyncpgInterfaceError) and "connection is closed" in str(cause):
            return Retry(f"database connection lost: {cause}", delay=UNAVAILABLE_DELAY)
        if isinstance(cause, OSError):  # refused, reset, unreachable, timed out connecting
            return Retry(
                f"database unreachable: {type(cause).__name__}: {cause}", delay=UNAVAILABLE_DELAY
            )
    return None


def canceled(exc: BaseException) -> bool:
    """Whether ``exc`` says a statement was cancelled (``sqlstates.CANCELED``)."""
    return any(getattr(cause, "sqlstate", None) == sqlstates.CANCELED for cause in _chain(exc))


def takes_no_writes(exc: BaseException) -> bool:
    """Whether ``exc`` says this connection's server is a standby or was made read-only."""
    return any(getattr(cause, "sqlstate", None) == sqlstates.READ_ONLY for cause in _chain(exc))


def login_refused(exc: BaseException) -> bool:
    """Whether ``exc`` says the server refused this recorder's login (``sqlstates.refused``)."""
    return any(
        isinstance(state := getattr(cause, "sqlstate", None), str) and sqlstates.refused(state)
        for cause in _chain(exc)
    )


class LoginRefusals:
    """Ends the recorder once Postgres has refused its logins for ``patience`` seconds.

    A rotated password leaves the pooled connections working until the server restarts
    or ends them; from then on every new connection is refused, and the URL is read
    only at start. Meanwhile the batches are handed back (``as_retry``), never parked.
    As with NATS turning a service away (``trove_schema.bus.Bus.connect``), a timer
    started by the first of the refusals in a row ends the patience, and any other
    outcome (a batch applied, the server away) cancels it.
    """

    __slots__ = ("_timer", "given_up", "last", "patience")

    def __init__(self, patience: float = REFUSED_PATIENCE) -> None:
        self.patience = patience
        #: Set when the patience has run out.
        self.given_up = asyncio.Event()
        #: The latest refusal, for the error that ends the recorder.
        self.last: BaseException | None = None
        self._timer: asyncio.TimerHandle | None = None

    def met(self, exc: BaseException | None) -> None:
        """How a try at the database ended: ``exc``, or None if it went through."""
        if exc is None or not login_refused(exc):
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
                self.last = None
            return
        self.last = exc
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.patience, self.given_up.set)

    async def until_given_up(self, stop: asyncio.Event) -> None:
        """A recorder's part (``trove_schema.service.together``): returns at ``stop``, and
        raises ``LoginRefused`` if every login is refused for the patience before."""
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self.given_up.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            if self._timer is not None:
                self._timer.cancel()
        if self.given_up.is_set() and not stop.is_set():
            raise LoginRefused(
                f"Postgres refused every login for {self.patience:.0f} s ({self.last}): the "
                "user and password in TROVE_DATABASE_URL, or the database it names, are not "
                "the server's; a restart reads them anew"
            ) from self.last


async def drop_connection(session: AsyncSession, exc: BaseException) -> None:
    """Take the session's connection out of the pool, closed, once its transaction ends.

    For a connection to a server that takes no writes: after a failover, the pool still
    holds connections to the server that was the primary and now serves reads (a managed
    database's writer endpoint moves; the old writer stays up). Each would fail every
    batch it is given; dropped, it is replaced by a new connection to whatever the URL
    names now.
    """
    connection = await session.connection()
    await connection.invalidate(exc)


@contextlib.asynccontextmanager
async def bounded_transaction(
    sessions: async_sessionmaker[AsyncSession], seconds: float, what: str
) -> AsyncIterator[AsyncSession]:
    """A session in a transaction, committed at the end, whose connection is closed
    under it if it lasts more than ``seconds``: then it raises ``Retry``.

    A statement sent to a primary that went silent after it arrived waits for a reply
    that never comes, and nothing else ends it: there is no client-side statement
    timeout (``make_engine``), and the TCP limits are blind to a peer whose kernel
    still answers for a server that does not (a proxy or a pooler left up, a process
    stopped behind a live address). A batch of events waits so for ever, its messages
    marked in progress, out of every other recorder's reach. Closed at the deadline,
    the connection fails the statement at once and leaves the pool (its state is
    unknown), and the work is handed back whole. Cancelling the task would not end it:
    the session's close still waits for its rollback on the silent connection, run to
    completion (SQLAlchemy shields it).

    The checkout comes before the deadline starts: a login is bounded on its own
    (``CONNECT_TIMEOUT``), and a pool exhausted fails in its own time.
    """
    loop = asyncio.get_running_loop()
    timer: asyncio.TimerHandle | None = None
    expired = False

    def expire(driver: Any) -> None:
        nonlocal expired
        expired = True
        log.warning(
            "%s ran past %.0f s: its database connection is closed and the work handed back",
            what,
            seconds,
        )
        driver.terminate()

    try:
        async with sessions() as session:
            connection = await session.connection()
            driver = (await connection.get_raw_connection()).driver_connection
            timer = loop.call_later(seconds, expire, driver)
            try:
                yield session
                await session.commit()
            except BaseException as exc:
                if expired:
                    await connection.invalidate(exc)  # never back into the pool
                raise
    except Exception as exc:
        if not expired:
            raise
        reason = f"{what}: the database did not answer for {seconds:g} s ({exc})"
        raise Retry(reason, delay=UNAVAILABLE_DELAY) from exc
    finally:
        if timer is not None:
            timer.cancel()


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, what it wraps (``orig``), and what it was raised from or during."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending and len(seen) < 16:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        orig = getattr(current, "orig", None)
        for linked in (orig, current.__cause__, current.__context__):
            if isinstance(linked, BaseException):
                pending.append(linked)


@contextlib.contextmanager
def database_trouble_is_retried() -> Iterator[None]:
    """Raise the database's failures as ``Retry``; let every other error through."""
    try:
        yield
    except Retry:
        raise
    except Exception as exc:
        retry = as_retry(exc)
        if retry is None:
            raise
        raise retry from exc
