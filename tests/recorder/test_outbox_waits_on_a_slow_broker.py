"""The outbox publisher holds its rows in a transaction while it waits on NATS: a slow
broker must not outlast the session's idle limit, or every pass ends killed and sends
its rows again."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.recorder.test_recorder_service import pending_retry, put_in_outbox
from tests.support import query
from trove_recorder.database import make_engine
from trove_recorder.recorder import Recorder
from trove_recorder.retries import RetryPolicy
from trove_schema.bus import Bus
from trove_schema.topology import ensure_topology
from trove_stack.nats import EmbeddedNats, NatsConfig

#: The recorder sessions' idle limit here, scaled down from a minute.
IDLE_LIMIT = 1.0


async def test_a_broker_slower_than_the_idle_limit_does_not_end_the_publishers_transaction(
    stack: StackUrls, engine: AsyncEngine, tmp_path: Path
) -> None:
    server = EmbeddedNats(NatsConfig(store_dir=tmp_path / "nats")).start()
    assert server.pid is not None
    bus = await Bus.connect(server.url, name="test-outbox")
    recording = make_engine(stack.database_url, idle_in_transaction=IDLE_LIMIT)
    try:
        await ensure_topology(bus.js)
        retry = pending_retry()
        async with engine.begin() as conn:
            await conn.execute(text("DELETE FROM outbox"))
            await put_in_outbox(conn, retry)

        async def idle_past_the_limit() -> int:
            (row,) = await query(
                engine,
                "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database()"
                " AND state = 'idle in transaction'"
                " AND now() - state_change > :held * interval '1 s'",
                held=IDLE_LIMIT * 2,
            )
            return int(row.n)

        os.kill(server.pid, signal.SIGSTOP)  # the broker stalls: no PubAck comes
        try:
            publishing = asyncio.create_task(
                Recorder(recording, bus, RetryPolicy())._publish_batch()
            )
            await eventually(
                idle_past_the_limit,
                until=lambda n: n == 1,
                timeout=15,
                what="the publisher's transaction waiting past the sessions' idle limit",
            )
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert await asyncio.wait_for(publishing, timeout=30) == 1
        (row,) = await query(
            engine, "SELECT published_at FROM outbox WHERE event_id = :id", id=retry.id
        )
        assert row.published_at is not None
    finally:
        await recording.dispose()
        await bus.close()
        server.stop()
