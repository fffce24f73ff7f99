"""A whole replay (``--truncate``) empties the tables and rebuilds them for hours; a live
recorder applying new events meanwhile would read tables half rebuilt (a page's attempts
counted from the few its chain has so far, retried again). Its batches wait for the
replay in the stream, counted against nothing, and the replay applies what came
meanwhile before it lets them go."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.recorder.test_database_outage import count, watch_recorder
from tests.recorder.test_recorder_service import completed
from tests.support import query, services
from trove_recorder.projections import INSTANCE_LOCKS, _instance_key
from trove_recorder.replay import replay
from trove_recorder.retries import RetryPolicy
from trove_schema.bus import Bus
from trove_schema.events import InstanceFollowed, Provenance
from trove_schema.topology import EVENTS_STREAM, RECORDER

pytestmark = pytest.mark.usefixtures("clean")

POLICY = RetryPolicy(max_attempts=3, delay_seconds=3600)
PROJECTED = "SELECT count(*) FROM projected_events"


async def test_a_live_recorder_waits_while_a_replay_rebuilds_the_tables(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    follow = InstanceFollowed(
        instance="https://social.example",
        domain="social.example",
        provenance=Provenance(kind="seed", origin="operator"),
    )
    record = [completed(0), completed(1), follow, completed(2)]
    later = [completed(n) for n in range(100, 105)]
    watch = watch_recorder(state_dir)
    async with services(stack, state_dir, watch.env, only=("recorder",)):
        for event in record:
            await bus.publish(event)
        await eventually(
            lambda: count(engine, PROJECTED),
            until=lambda n: n == len(record),
            timeout=30,
            what="the record projected live",
        )
        admin = await engine.connect()
        held = await admin.execution_options(isolation_level="AUTOCOMMIT")
        try:
            # The follow's instance lock: the replay's batch of it waits, the tables
            # emptied and half rebuilt.
            await held.exec_driver_sql(
                f"SELECT pg_advisory_lock({INSTANCE_LOCKS}, {_instance_key(follow.instance)})"
            )
            running = asyncio.create_task(
                replay(stack.nats_url, stack.database_url, POLICY, truncate=True, batch=1)
            )

            async def replay_waits() -> int:
                rows = await query(
                    engine,
                    "SELECT count(*) AS n FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event = 'advisory' "
                    "AND query LIKE '%pg_advisory_xact_lock%'",
                )
                return int(rows[0].n)

            await eventually(replay_waits, until=bool, timeout=30, what="the replay waits")
            assert await count(engine, PROJECTED) == 2  # rebuilt up to the follow

            for event in later:
                await bus.publish(event)

            # The recorder hands its batches back, again after each pause, and says why
            # once.
            async def handed_back() -> float:
                return (await watch.endings()).get("retried", 0)

            await eventually(
                handed_back,
                until=lambda n: n >= 2 * len(later),
                timeout=60,
                what="the live batches handed back twice",
            )
            assert watch.log().count("the events wait in the stream") == 1
            ids = [uuid.UUID(e.id) for e in later]
            rows = await query(
                engine,
                "SELECT count(*) AS n FROM projected_events WHERE event_id = ANY(:ids)",
                ids=ids,
            )
            assert rows[0].n == 0
        finally:
            await held.exec_driver_sql("SELECT pg_advisory_unlock_all()")
            await held.close()
        stats = await running
        # The replay applied what the live recorder left waiting, too.
        assert (stats.applied, stats.failed) == (len(record) + len(later), 0)

        async def recorder_caught_up() -> int:
            info = await bus.js.consumer_info(EVENTS_STREAM, RECORDER)
            return int(info.num_pending or 0) + int(info.num_ack_pending or 0)

        await eventually(
            recorder_caught_up, until=lambda n: n == 0, timeout=60, what="recorder caught up"
        )

        async def log() -> str:
            return watch.log()

        await eventually(
            log,
            until=lambda text: "projecting again" in text,
            timeout=30,
            what="the recorder going on",
        )
        await watch.assert_nothing_counted_against_the_events(bus)
        assert await count(engine, "SELECT count(*) FROM page_crawls") == 8
        assert await count(engine, PROJECTED) == len(record) + len(later)
