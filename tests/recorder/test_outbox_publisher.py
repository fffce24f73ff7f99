"""The outbox publisher's loop: when it looks, and what it says while it cannot.

Its passes over Postgres are played by a stand-in: what is under test is when the loop
looks again and what it logs, not the pass (tests/recorder/test_recorder_service.py
runs the pass on a real stack).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import cast

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from tests.conftest import eventually, reading
from trove_recorder.recorder import Recorder
from trove_recorder.retries import RetryPolicy
from trove_schema.bus import Bus


class _Outbox(Recorder):
    """A recorder whose passes read ``rows`` instead of the outbox table."""

    def __init__(self) -> None:
        super().__init__(
            create_async_engine("postgresql+asyncpg://trove@127.0.0.1:9/trove"),
            cast(Bus, None),
            RetryPolicy(),
        )
        self.rows: list[str] = []
        self.passes = 0
        self.sent_at: float | None = None
        #: Passes that meet a database away, the first ones.
        self.failures = 0

    async def _publish_batch(self, limit: int = 100) -> int:
        self.passes += 1
        if self.failures:
            self.failures -= 1
            raise ConnectionRefusedError(111, "Connect call failed")
        read = list(self.rows)
        await asyncio.sleep(0)  # the pass waits on the broker: a batch may commit meanwhile
        if self.passes == 3:
            self.rows.append("retry")
            self.outbox_wakeup.set()  # what ``project`` does when it commits a retry
        if read:
            self.rows.clear()
            self.sent_at = time.monotonic()
        return len(read)


async def test_a_retry_committed_while_a_pass_runs_is_published_without_the_idle_pause() -> None:
    outbox = _Outbox()
    stop = asyncio.Event()
    # The idle pause after the third empty pass is 4 s, and grows to a minute: the retry
    # committed during that pass goes out on the next one, woken, not 4 s later.
    task = asyncio.create_task(outbox.publish_outbox(stop, idle_max=60.0))
    try:
        await eventually(reading(lambda: outbox.passes), until=lambda n: n >= 3, timeout=10)
        committed = time.monotonic()
        sent_at = await eventually(
            reading(lambda: outbox.sent_at), until=lambda at: at is not None, timeout=10
        )
        assert sent_at is not None
        assert sent_at - committed < 1.0
    finally:
        stop.set()
        await task


async def test_a_database_away_is_said_once_and_its_return_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outbox = _Outbox()
    outbox.failures = 3
    stop = asyncio.Event()
    with caplog.at_level(logging.INFO, logger="trove.recorder"):
        task = asyncio.create_task(outbox.publish_outbox(stop, idle_max=60.0))
        try:
            await eventually(reading(lambda: outbox.passes), until=lambda n: n >= 4, timeout=20)
        finally:
            stop.set()
            await task
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("outbox")]
    assert said == [
        "outbox: not published, looking again each second: [Errno 111] Connect call failed",
        "outbox: published again",
    ]
