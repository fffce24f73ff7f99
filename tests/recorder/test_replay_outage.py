"""A replay across a NATS outage, on a nats-server of its own stopped and started again
mid-replay: the replay waits for the broker, resumes where it was, and applies every
event; one whose broker stays away ends with its reason."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    async_sessionmaker,
    create_async_engine,
)

from tests.conftest import eventually
from tests.ports import free_port
from tests.support import query
from trove_recorder.errors import RebuildUnfinished, RecordIncomplete, ReplayStalled
from trove_recorder.replay import ReplayStats, rebuilding, release_abandoned_holds, replay
from trove_recorder.retries import RetryPolicy
from trove_schema.bus import Bus
from trove_schema.events import Provenance, SeedRejected
from trove_schema.migrate import upgrade_async
from trove_schema.topology import EVENTS_STREAM, ensure_topology
from trove_stack.nats import EmbeddedNats, NatsConfig

POLICY = RetryPolicy(max_attempts=3, delay_seconds=1.0)
#: nats-server sends an ordered consumer about 2 MB past what the client has read (its
#: flow control): a record of 6 MB leaves most of it at the server when the replay is
#: held, so the outage leaves the replay with nothing to read.
RECORD = 3000
REASON = "r" * 1900


@dataclass
class Broker:
    server: EmbeddedNats
    bus: Bus


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    """A nats-server of this test's own, on a port it keeps across a restart."""
    server = EmbeddedNats(NatsConfig(store_dir=tmp_path / "nats", port=free_port("127.0.0.1")))
    server.start()
    try:
        bus = await Bus.connect(server.url, name="trove-tests")
        try:
            await ensure_topology(bus.js)
            yield Broker(server, bus)
        finally:
            await bus.close()
    finally:
        server.stop()


@pytest.fixture
async def target(scratch_database: str) -> AsyncIterator[AsyncEngine]:
    """An engine on the replay's database, for the test's own looks at it."""
    engine = create_async_engine(scratch_database)
    try:
        yield engine
    finally:
        await engine.dispose()


async def publish_rejections(bus: Bus, count: int, tag: str) -> list[SeedRejected]:
    events = [
        SeedRejected(
            raw=f"ftp://{tag}-{n}.example/", reason=REASON, provenance=Provenance(kind="seed")
        )
        for n in range(count)
    ]
    for event in events:
        await bus.publish(event)
    return events


async def hold(held: AsyncConnection, event: SeedRejected) -> None:
    """``event``'s id taken first, uncommitted: the replay's batch of it waits."""
    await held.execute(
        text("INSERT INTO projected_events (event_id, event_type) VALUES (:id, 'x')"),
        {"id": event.id},
    )


async def until_it_waits(running: asyncio.Task[ReplayStats], database_url: str) -> None:
    """Returns once ``running`` waits for a lock on ``database_url`` (the hold)."""
    engine = create_async_engine(database_url)
    try:

        async def waiting() -> int:
            (row,) = await query(
                engine,
                "SELECT count(*) AS n FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            return int(row.n)

        await eventually(
            waiting, until=lambda n: n == 1 or running.done(), timeout=30, what="replay waits"
        )
    finally:
        await engine.dispose()
    assert not running.done(), running


async def test_a_replay_waits_out_a_broker_outage_and_applies_every_event(
    broker: Broker,
    scratch_database: str,
    target: AsyncEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trove.recorder.replay")
    events = await publish_rejections(broker.bus, RECORD, "all")
    await upgrade_async(scratch_database)
    async with target.connect() as held:
        await hold(held, events[1])
        running = asyncio.create_task(
            replay(broker.server.url, scratch_database, POLICY, batch=100, read_wait=1.0)
        )
        await until_it_waits(running, scratch_database)
        broker.server.stop()
        await held.rollback()  # the replay reads what it holds, then nothing comes

    # Past the second a read waits for a message: the replay is still there, waiting.
    async def state() -> tuple[bool, bool]:
        waiting = any("waiting for NATS" in r.getMessage() for r in caplog.records)
        return waiting, running.done()

    await eventually(state, until=any, timeout=60, what="the replay waits or ends")
    assert not running.done(), running
    broker.server.start()
    stats = await asyncio.wait_for(running, timeout=120)

    assert (stats.events, stats.applied, stats.malformed, stats.failed) == (
        RECORD,
        RECORD,
        0,
        0,
    )
    (row,) = await query(target, "SELECT count(DISTINCT raw) AS n FROM seed_rejections")
    assert row.n == RECORD


async def test_a_replay_since_a_time_resumes_across_a_server_restart(
    broker: Broker, scratch_database: str, target: AsyncEngine
) -> None:
    before = await publish_rejections(broker.bus, 5, "before")
    since = datetime.now(UTC)
    window = await publish_rejections(broker.bus, RECORD, "window")
    await upgrade_async(scratch_database)
    async with target.connect() as held:
        await hold(held, window[1])
        running = asyncio.create_task(
            replay(broker.server.url, scratch_database, POLICY, batch=100, since=since, patience=90)
        )
        await until_it_waits(running, scratch_database)
        # A restart (an upgrade, a leader moved): the replay's consumer is gone, and
        # nats-py makes it again from the sequence after the last one delivered.
        broker.server.stop()
        broker.server.start()
        await held.rollback()
    stats = await asyncio.wait_for(running, timeout=150)

    assert (stats.events, stats.applied, stats.failed) == (len(window), len(window), 0)
    rows = await query(target, "SELECT raw FROM seed_rejections")
    assert sorted(r.raw for r in rows) == sorted(e.raw for e in window)
    assert not {e.raw for e in before} & {r.raw for r in rows}


async def stalled_whole_replay(
    broker: Broker, database_url: str, target: AsyncEngine
) -> tuple[list[SeedRejected], ReplayStalled]:
    """A whole replay of ``RECORD`` events whose broker goes away for good midway: the
    events, and what it ended with."""
    events = await publish_rejections(broker.bus, RECORD, "all")
    await upgrade_async(database_url)
    async with target.connect() as held:
        await hold(held, events[1])
        running = asyncio.create_task(
            replay(broker.server.url, database_url, POLICY, batch=100, patience=4, read_wait=1.0)
        )
        await until_it_waits(running, database_url)
        broker.server.stop()
        await held.rollback()
    with pytest.raises(ReplayStalled, match=f"no event from NATS for 4 s.* of {RECORD}") as e:
        await asyncio.wait_for(running, timeout=90)
    return events, e.value


async def test_a_replay_whose_broker_stays_away_ends_with_the_reason(
    broker: Broker, scratch_database: str, target: AsyncEngine
) -> None:
    _, stalled = await stalled_whole_replay(broker, scratch_database, target)
    # Everything it read before the broker went is applied, the batch it was reading
    # too (the record is these events alone: sequence n is the n-th), and the error
    # says from when to run it again.
    read = int(re.search(r"at sequence (\d+)", str(stalled)).group(1))  # type: ignore[union-attr]
    (row,) = await query(target, "SELECT count(*) AS n FROM seed_rejections")
    assert 0 < row.n == read < RECORD
    assert stalled.applied_until is not None


async def rebuilding_now(target: AsyncEngine) -> str | None:
    """What a live recorder's batch would be told, in a transaction of its own."""
    async with async_sessionmaker(target).begin() as session:
        return await rebuilding(session)


async def test_a_whole_replay_stopped_partway_holds_the_live_recorders_until_one_finishes_it(
    broker: Broker, scratch_database: str, target: AsyncEngine
) -> None:
    events, stalled = await stalled_whole_replay(broker, scratch_database, target)
    until = stalled.applied_until
    assert until is not None
    # Its lock went with it, and the tables are half rebuilt: the live recorders
    # are told to wait, and how the rebuild is finished.
    (mark,) = await query(target, "SELECT applied_until FROM rebuild_marks")
    assert mark.applied_until == until
    why = await rebuilding_now(target)
    assert why is not None
    assert f"trove replay --since {until.isoformat()}" in why
    broker.server.start()
    # A replay since a later time would leave a hole: refused, the mark kept.
    with pytest.raises(RebuildUnfinished, match=re.escape(f"--since {until.isoformat()}")):
        await replay(
            broker.server.url, scratch_database, POLICY, since=until + timedelta(seconds=1)
        )
    assert await rebuilding_now(target) == why
    # One since then finishes it: every event applied, and the recorders go on.
    stats = await asyncio.wait_for(
        replay(broker.server.url, scratch_database, POLICY, batch=500, since=until),
        timeout=120,
    )
    assert stats.failed == 0
    (row,) = await query(target, "SELECT count(DISTINCT raw) AS n FROM seed_rejections")
    assert row.n == len(events)
    assert await query(target, "SELECT * FROM rebuild_marks") == []
    assert await rebuilding_now(target) is None


async def test_a_stopped_rebuild_whose_record_lost_what_it_had_not_applied_is_not_finished(
    broker: Broker, scratch_database: str, target: AsyncEngine
) -> None:
    _, stalled = await stalled_whole_replay(broker, scratch_database, target)
    assert stalled.applied_until is not None
    (mark,) = await query(target, "SELECT applied_seq FROM rebuild_marks")
    broker.server.start()
    # What retention does while the rebuild waits: the oldest events go, some of
    # those it had not applied with them.
    await broker.bus.js.purge_stream(EVENTS_STREAM, seq=mark.applied_seq + 10)
    with pytest.raises(RecordIncomplete, match="retention removed events it had not"):
        await replay(broker.server.url, scratch_database, POLICY, since=stalled.applied_until)
    assert await rebuilding_now(target) is not None


async def test_a_stopped_rebuilds_held_retries_stay_held_until_it_is_finished(
    scratch_database: str, target: AsyncEngine
) -> None:
    await upgrade_async(scratch_database)
    async with target.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO outbox (event_id, subject, payload, published_at) VALUES "
                "(:id, 'trove.events.crawl.requested', '\\x7b7d', 'infinity')"
            ),
            {"id": uuid.uuid4()},
        )
        await conn.execute(text("INSERT INTO rebuild_marks (started_at) VALUES (now())"))

    async def nothing_pending(url: str) -> bool:
        return False

    async def release() -> tuple[bool, bool]:
        async with async_sessionmaker(target).begin() as session:
            await release_abandoned_holds(session, nothing_pending)
        (row,) = await query(
            target,
            "SELECT coalesce(published_at = 'infinity', false) AS held, "
            "published_at IS NULL AS due FROM outbox",
        )
        return row.held, row.due

    # The live publisher leaves them to the replay that finishes the rebuild.
    assert await release() == (True, False)
    async with target.begin() as conn:
        await conn.execute(text("DELETE FROM rebuild_marks"))
    assert await release() == (False, True)
