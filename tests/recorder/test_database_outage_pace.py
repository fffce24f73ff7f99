"""The recorder's pace while Postgres is away: it waits between tries, doubling the wait,
instead of pulling, decoding and handing back its whole ack window again and again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.recorder.test_database_outage import (
    assert_whole,
    own_engine,
    own_postgres,
    own_stack,
    projected,
    publish,
    watch_recorder,
)
from tests.support import services
from trove_schema.bus import Bus
from trove_stack.postgres import EmbeddedPostgres

pytestmark = pytest.mark.usefixtures("clean")

#: The fixtures of a Postgres of the test's own, which it stops and starts.
__all__ = ["own_engine", "own_postgres", "own_stack"]

BATCH = 20


async def test_a_recorder_whose_database_is_away_waits_instead_of_cycling_its_window(
    bus: Bus,
    own_stack: StackUrls,
    own_engine: AsyncEngine,
    own_postgres: EmbeddedPostgres,
    state_dir: Path,
) -> None:
    # A thousand events waiting, batches of 20, two at a time: every batch is handed
    # back (`Retry`, 2 s). The recorder took batch after batch until its ack window
    # was out, and all of it again every 2 s: thousands of events decoded and handed
    # back in 10 s. Waiting 2, 4, 8 s between tries, it hands back a few batches.
    watch = watch_recorder(state_dir)
    env = watch.env | {"TROVE_BATCH_SIZE": str(BATCH)}
    async with services(own_stack, state_dir, env, only=("recorder",)) as recorder:
        await publish(bus, range(10))
        await projected(own_engine, 10, timeout=30)
        await asyncio.to_thread(own_postgres.stop)
        await publish(bus, range(10, 1010))

        async def retried() -> float:
            return (await watch.endings()).get("retried", 0)

        before = await eventually(retried, until=lambda n: n > 0, timeout=30, what="a retry")
        await asyncio.sleep(10.0)  # the duration under test: the database away
        handed_back = await retried() - before
        recorder.check_alive()
        await asyncio.to_thread(own_postgres.start)
        await assert_whole(own_engine, 1010, watch, bus)
    # Tries 2, 6 and 14 s after the first (perhaps one more as the wait starts), two
    # batches each at most.
    assert handed_back <= 4 * 2 * BATCH, f"{handed_back:.0f} events handed back in 10 s"
