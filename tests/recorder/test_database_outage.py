"""Postgres away (stopped, crashed, restarting, in recovery) or unable to take writes (a
full disk, a primary that became a read-only standby in a failover): the recorder
waits and catches up, loses nothing, and counts none of it against the events."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tests.conftest import StackUrls, eventually
from tests.ports import free_port
from tests.recorder.test_recorder_service import completed
from tests.support import scraped, services
from trove_schema.bus import Bus
from trove_schema.migrate import upgrade
from trove_schema.topology import DEAD_STREAM
from trove_stack.nats import listening
from trove_stack.postgres import SYSTEM_USER, EmbeddedPostgres, PostgresConfig, postgres_bin_dir
from trove_stack.processes import Child, as_user

pytestmark = pytest.mark.usefixtures("clean")


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    """A Postgres of this test's own, on a fixed port so it can come back at the same URL."""
    server = EmbeddedPostgres(
        PostgresConfig(data_dir=tmp_path / "pg" / "data", port=free_port("127.0.0.1"))
    ).start()
    try:
        upgrade(server.url)
        yield server
    finally:
        server.stop()


@pytest.fixture
async def own_engine(own_postgres: EmbeddedPostgres) -> AsyncIterator[AsyncEngine]:
    """The test's own look at ``own_postgres`` (``engine`` is the shared database's)."""
    engine = create_async_engine(own_postgres.url, pool_pre_ping=True)
    yield engine
    await engine.dispose()


@pytest.fixture
def own_stack(stack: StackUrls, own_postgres: EmbeddedPostgres) -> StackUrls:
    """The stack, with ``own_postgres`` for its database."""
    return StackUrls(stack.nats_url, own_postgres.url, stack.kind)


class RecorderWatch:
    """What the recorder process says about itself: its /metrics and its log."""

    def __init__(self, port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path

    @property
    def env(self) -> dict[str, str]:
        return {"TROVE_HTTP_PORT": str(self.port)}

    async def endings(self) -> dict[str, float]:
        """``trove_messages_total{consumer="recorder"}`` by ending."""
        return {
            sample.labels["ending"]: sample.value
            for sample in await scraped(self.port)
            if sample.name == "trove_messages_total" and sample.labels["consumer"] == "recorder"
        }

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def assert_nothing_counted_against_the_events(self, bus: Bus) -> None:
        endings = await self.endings()
        assert endings.get("retried", 0) > 0, f"the outage was never seen: {endings}"
        assert endings.get("failed", 0) == 0, endings
        assert endings.get("parked", 0) == 0, endings
        log = self.log()
        assert "handler failed" not in log, _lines_with(log, "handler failed")
        assert "one by one" not in log, _lines_with(log, "one by one")
        dead = await bus.js.stream_info(DEAD_STREAM)
        assert dead.state.messages == 0


def _lines_with(log: str, needle: str) -> str:
    return "\n".join(line for line in log.splitlines() if needle in line)[:4000]


def watch_recorder(state_dir: Path) -> RecorderWatch:
    """For a recorder run alone in ``state_dir`` (the HTTP port is for its process only)."""
    return RecorderWatch(free_port("127.0.0.1"), state_dir / "logs" / "recorder-0.log")


async def count(engine: AsyncEngine, sql: str) -> int:
    try:
        async with engine.connect() as conn:
            return int((await conn.execute(text(sql))).scalar_one())
    except Exception:
        return -1  # the database is away


PROJECTED = "SELECT count(*) FROM projected_events"


async def publish(bus: Bus, pages: range) -> None:
    await asyncio.gather(*(bus.publish(completed(n)) for n in pages))


async def projected(engine: AsyncEngine, total: int, timeout: float = 60) -> None:
    await eventually(
        lambda: count(engine, PROJECTED),
        until=lambda n: n == total,
        timeout=timeout,
        what=f"{total} events projected",
    )


async def assert_whole(engine: AsyncEngine, total: int, watch: RecorderWatch, bus: Bus) -> None:
    """Every event projected, each attempt once, and none of the wait counted against any."""
    await projected(engine, total)
    await watch.assert_nothing_counted_against_the_events(bus)
    assert await count(engine, "SELECT count(*) FROM page_crawls") == total


class SteadyFlow:
    """Publishes ``CrawlCompleted`` events in small bursts until stopped, as a busy crawl does."""

    def __init__(self, bus: Bus, burst: int = 10, pause: float = 0.05) -> None:
        self.bus = bus
        self.burst = burst
        self.pause = pause
        self.published = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while not self._stop.is_set():
            events = [completed(self.published + k) for k in range(self.burst)]
            await asyncio.gather(*(self.bus.publish(event) for event in events))
            self.published += len(events)
            with contextlib.suppress(TimeoutError):  # a pace, not a wait for anything
                await asyncio.wait_for(self._stop.wait(), timeout=self.pause)

    async def __aenter__(self) -> SteadyFlow:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def count(self) -> int:
        return self.published


async def test_postgres_stopped_crashed_and_restarted_while_events_flow_loses_and_blames_nothing(
    bus: Bus,
    own_stack: StackUrls,
    own_engine: AsyncEngine,
    own_postgres: EmbeddedPostgres,
    state_dir: Path,
) -> None:
    watch = watch_recorder(state_dir)
    crawls = "SELECT count(*) FROM page_crawls"

    async def outage(take_down: str) -> None:
        """Take Postgres away while events go on arriving, then bring it back."""
        before = flow.published
        # Fast shutdown ends the recorder's sessions mid-transaction (57P01); a kill
        # leaves crash recovery to the next start, which answers 57P03 meanwhile.
        await asyncio.to_thread(getattr(own_postgres, take_down))
        await eventually(flow.count, until=lambda n: n >= before + 100, timeout=30, what="flow")
        recorder.check_alive()  # the recorder waits; it does not crash
        await asyncio.to_thread(own_postgres.start)
        reached = await count(own_engine, crawls)
        await eventually(
            lambda: count(own_engine, crawls),
            until=lambda n: n > reached,
            timeout=30,
            what="recording again",
        )

    async with services(own_stack, state_dir, watch.env, only=("recorder",)) as recorder:
        async with SteadyFlow(bus) as flow:
            await eventually(
                lambda: count(own_engine, crawls), until=lambda n: n >= 50, timeout=30, what="rows"
            )
            await outage("stop")
            await outage("kill")
        await eventually(
            lambda: count(own_engine, "SELECT count(*) FROM projected_events"),
            until=lambda n: n == flow.published,
            timeout=60,
            what="every event projected",
        )
        recorder.check_alive()
        await watch.assert_nothing_counted_against_the_events(bus)
    assert await count(own_engine, crawls) == flow.published
    assert await count(own_engine, "SELECT count(DISTINCT event_id) FROM page_crawls") == (
        flow.published
    )


@asynccontextmanager
async def held_in_recovery(server: EmbeddedPostgres) -> AsyncIterator[Child]:
    """The server restarted as a standby with no primary and hot standby off: it stays in
    recovery, refusing every connection with 57P03, until ``promote`` ends recovery."""
    await asyncio.to_thread(server.stop)
    config = server.config
    data = config.data_dir.resolve()
    user = SYSTEM_USER if os.geteuid() == 0 else None
    (data / "standby.signal").touch()
    argv = [str(postgres_bin_dir(config.bin_dir) / "postgres"), "-D", str(data), "-h"]
    argv += [config.host, "-p", str(server.port), "-c", "unix_socket_directories="]
    argv += ["-c", "hot_standby=off"]
    child = Child(
        "postgres-standby",
        argv,
        log_path=data.parent / "standby.log",
        user=user,
        stop_signal=signal.SIGINT,
    )
    try:
        await asyncio.to_thread(
            child.wait_until,
            lambda: listening(config.host, server.port),
            timeout=60,
            what="listening",
        )
        yield child
    finally:
        await asyncio.to_thread(child.stop, 30)


async def promote(server: EmbeddedPostgres) -> None:
    data = server.config.data_dir.resolve()
    pg_ctl = postgres_bin_dir(server.config.bin_dir) / "pg_ctl"
    user = SYSTEM_USER if os.geteuid() == 0 else None
    argv = [str(pg_ctl), "promote", "-D", str(data), "-w", "-t", "60"]
    await asyncio.to_thread(
        lambda: subprocess.run(argv, check=True, capture_output=True, **as_user(user))
    )


async def test_a_database_in_recovery_is_waited_for_and_not_counted_against_the_events(
    bus: Bus,
    own_stack: StackUrls,
    own_engine: AsyncEngine,
    own_postgres: EmbeddedPostgres,
    state_dir: Path,
) -> None:
    watch = watch_recorder(state_dir)
    async with services(own_stack, state_dir, watch.env, only=("recorder",)):
        await publish(bus, range(20))
        await projected(own_engine, 20, timeout=30)
        async with held_in_recovery(own_postgres):
            dsn = own_postgres.url.replace("postgresql+asyncpg", "postgresql")
            with pytest.raises(asyncpg.CannotConnectNowError):
                await asyncpg.connect(dsn)  # what the recorder is told meanwhile
            await publish(bus, range(20, 50))

            async def attempts() -> float:
                endings = await watch.endings()
                return endings.get("retried", 0) + endings.get("failed", 0)

            await eventually(
                attempts, until=lambda n: n > 0, timeout=30, what="the recorder turned away"
            )

            async def log() -> str:
                return watch.log()

            await eventually(  # the reason it was given: the database is in recovery
                log, until=lambda text: "57P03" in text, timeout=30, what="57P03 in its log"
            )
            assert await count(own_engine, PROJECTED) == -1  # still away
            await promote(own_postgres)
            await assert_whole(own_engine, 50, watch, bus)


async def superuser_execute(server: EmbeddedPostgres, *statements: str) -> None:
    """Statements run one at a time outside a transaction (``ALTER SYSTEM`` must be)."""
    connection = await asyncpg.connect(server.url.replace("postgresql+asyncpg", "postgresql"))
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


#: What a full disk answers (53100, the hint and all; checked against a tablespace on a
#: filesystem filled up) to the first write of every batch, so the test needs no mount.
DISK_FULL = (
    """CREATE FUNCTION disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      RAISE EXCEPTION 'could not extend file "base/5/16386": No space left on device'
        USING ERRCODE = 'disk_full', HINT = 'Check free disk space.';
    END $$""",
    "CREATE TRIGGER disk_full BEFORE INSERT ON projected_events "
    "FOR EACH STATEMENT EXECUTE FUNCTION disk_full()",
)
ROOM_AGAIN = ("DROP TRIGGER disk_full ON projected_events", "DROP FUNCTION disk_full()")


async def test_a_full_disk_keeps_the_events_in_the_stream_until_there_is_room_again(
    bus: Bus,
    own_stack: StackUrls,
    own_engine: AsyncEngine,
    own_postgres: EmbeddedPostgres,
    state_dir: Path,
) -> None:
    watch = watch_recorder(state_dir)
    async with services(own_stack, state_dir, watch.env, only=("recorder",)) as recorder:
        await publish(bus, range(20))
        await projected(own_engine, 20, timeout=30)
        await superuser_execute(own_postgres, *DISK_FULL)
        await publish(bus, range(20, 50))

        # Five tries of the thirty events: as many as would park each one, were a
        # full disk counted against them (a failure counted ends the wait at once).
        await eventually(
            watch.endings,
            until=lambda e: e.get("retried", 0) >= 150 or e.get("failed", 0) > 0,
            timeout=60,
            what="five tries of 30",
        )
        await watch.assert_nothing_counted_against_the_events(bus)
        recorder.check_alive()
        assert "53100" in watch.log()
        assert await count(own_engine, PROJECTED) == 20
        await superuser_execute(own_postgres, *ROOM_AGAIN)
        await assert_whole(own_engine, 50, watch, bus)


class Address:
    """A database's address, as a TCP forwarder on loopback: each new connection goes to
    the server ``port`` names at the time, and a connection made stays where it went.
    A failover moves the address (a managed database's writer endpoint), not the pool."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> int:
        self._server = await asyncio.start_server(self._forward, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for pipe in self._pipes:
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            writer.close()
            return
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            pipe = asyncio.create_task(self._pipe(source, sink))
            self._pipes.add(pipe)
            pipe.add_done_callback(self._pipes.discard)

    async def cut(self) -> None:
        """End every connection made, as a server does that goes down."""
        pipes = list(self._pipes)
        for pipe in pipes:
            pipe.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        except OSError:
            pass
        finally:
            sink.close()


@dataclass
class Failover:
    """A standby to promote, lagging all the way (none of the primary's pages), and the
    primary's address as a forwarder the recorder connects through."""

    promoted: EmbeddedPostgres
    new: AsyncEngine
    address: Address
    database: StackUrls


#: Attempts each on its own page: an id remembered from the old primary would have put
#: one on whichever page has that id on the new one. (``completed(n)`` is page n, asked
#: for by a request id that ends in n.)
OWN_PAGE = (
    "SELECT count(*) FROM page_crawls c JOIN pages p ON p.id = c.page_id "
    "WHERE p.url = 'https://blog.example/' || right(c.request_id::text, 12)::bigint"
)


@pytest.fixture
async def failover(
    stack: StackUrls, own_postgres: EmbeddedPostgres, tmp_path: Path
) -> AsyncIterator[Failover]:
    promoted = EmbeddedPostgres(
        PostgresConfig(data_dir=tmp_path / "promoted" / "data", port=free_port("127.0.0.1"))
    ).start()
    new = create_async_engine(promoted.url, pool_pre_ping=True)
    try:
        await asyncio.to_thread(upgrade, promoted.url)
        address = Address(own_postgres.port)
        async with address as port:
            url = own_postgres.url.replace(f":{own_postgres.port}/", f":{port}/")
            assert url != own_postgres.url
            yield Failover(promoted, new, address, StackUrls(stack.nats_url, url, stack.kind))
    finally:
        await new.dispose()
        promoted.stop()


async def test_after_a_failover_the_pool_leaves_the_old_primary_and_nothing_is_blamed(
    bus: Bus,
    own_engine: AsyncEngine,
    own_postgres: EmbeddedPostgres,
    state_dir: Path,
    failover: Failover,
) -> None:
    """The address moves to a promoted standby and the old primary stays up, read-only,
    holding the recorder's pooled connections."""
    watch = watch_recorder(state_dir)
    async with services(failover.database, state_dir, watch.env, only=("recorder",)):
        await publish(bus, range(20))
        await projected(own_engine, 20, timeout=30)
        failover.address.port = failover.promoted.port
        await superuser_execute(
            own_postgres,
            "ALTER SYSTEM SET default_transaction_read_only = on",
            "SELECT pg_reload_conf()",
        )

        async def old_primary_setting() -> str:
            dsn = own_postgres.url.replace("postgresql+asyncpg", "postgresql")
            connection = await asyncpg.connect(dsn)
            try:
                return str(await connection.fetchval("SHOW default_transaction_read_only"))
            finally:
                await connection.close()

        # The postmaster signals every session as it reloads: once a new session reads
        # "on", the recorder's sessions have been told before their next batch.
        await eventually(
            old_primary_setting, until=lambda v: v == "on", timeout=10, what="read-only"
        )
        # Pages 20 to 22 were linked from the first twenty: the recorder knows their ids
        # on the old primary.
        await publish(bus, range(20, 50))
        await assert_whole(failover.new, 30, watch, bus)  # on the promoted standby
        assert "25006" in watch.log()
    assert await count(own_engine, PROJECTED) == 20
    assert await count(failover.new, OWN_PAGE) == 30


async def test_a_failover_that_closed_every_connection_leaves_no_remembered_id_behind(
    bus: Bus, own_engine: AsyncEngine, state_dir: Path, failover: Failover
) -> None:
    """The old primary went down, closing the recorder's connections while it was idle:
    the pool replaces them with connections to the promoted standby, and no batch fails
    to say so."""
    watch = watch_recorder(state_dir)
    async with services(failover.database, state_dir, watch.env, only=("recorder",)):
        await publish(bus, range(20))
        await projected(own_engine, 20, timeout=30)
        failover.address.port = failover.promoted.port
        await failover.address.cut()
        # Pages 20 to 22 were linked from the first twenty: the recorder knows their ids
        # on the old primary.
        await publish(bus, range(20, 50))
        await projected(failover.new, 30)
        endings = await watch.endings()
    # Nothing failed, and no batch was turned away either: only the server's start time,
    # read by every batch, told the recorder its ids were another server's.
    assert endings == {"acked": 50}, endings
    assert await count(failover.new, "SELECT count(*) FROM page_crawls") == 30
    assert await count(failover.new, OWN_PAGE) == 30


#: What a statement past ``statement_timeout`` answers (57014) to every write of a batch,
#: as a server slowed by throttled I/O or a lock held by a long transaction does.
TIMED_OUT = (
    """CREATE FUNCTION timed_out() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      RAISE EXCEPTION 'canceling statement due to statement timeout'
        USING ERRCODE = 'query_canceled';
    END $$""",
    "CREATE TRIGGER timed_out BEFORE INSERT ON projected_events "
    "FOR EACH STATEMENT EXECUTE FUNCTION timed_out()",
)
IN_TIME_AGAIN = ("DROP TRIGGER timed_out ON projected_events", "DROP FUNCTION timed_out()")


async def test_a_statement_timeout_even_for_one_event_waits_and_parks_nothing(
    bus: Bus,
    own_stack: StackUrls,
    own_engine: AsyncEngine,
    own_postgres: EmbeddedPostgres,
    state_dir: Path,
) -> None:
    watch = watch_recorder(state_dir)
    async with services(own_stack, state_dir, watch.env, only=("recorder",)) as recorder:
        await publish(bus, range(5))
        await projected(own_engine, 5, timeout=30)
        await superuser_execute(own_postgres, *TIMED_OUT)
        await publish(bus, range(5, 10))

        # Two tries of the five events, each tried alone after its batch failed: a
        # failure counted against one (five park it) would end the wait at once.
        await eventually(
            watch.endings,
            until=lambda e: e.get("retried", 0) >= 10 or e.get("failed", 0) > 0,
            timeout=60,
            what="two tries of 5",
        )
        endings = await watch.endings()
        assert endings.get("failed", 0) == 0, endings
        assert endings.get("parked", 0) == 0, endings
        assert "57014" in watch.log()
        recorder.check_alive()
        await superuser_execute(own_postgres, *IN_TIME_AGAIN)
        await projected(own_engine, 10)
        assert (await bus.js.stream_info(DEAD_STREAM)).state.messages == 0
        assert await count(own_engine, "SELECT count(*) FROM page_crawls") == 10
