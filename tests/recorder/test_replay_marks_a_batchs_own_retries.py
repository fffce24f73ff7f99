"""A replay's batch marks sent the held retries whose CrawlRequested it brings, a lookup
each: not a read of every retry the replay holds, each batch. The replay's results are
the same: what the record holds is marked sent, the rest released."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tests.conftest import StackUrls
from tests.recorder.test_lookups import nodes, rows_read
from tests.recorder.test_projections import completed
from tests.recorder.test_replay import empty_database
from tests.support import query
from trove_recorder.replay import replay
from trove_recorder.retries import RetryPolicy, retry_request
from trove_schema.bus import Bus
from trove_schema.events import CrawlOutcome, Scope

pytestmark = pytest.mark.usefixtures("clean")

POLICY = RetryPolicy(delay_seconds=3600)


@contextmanager
def marks_of_recorded_retries() -> Iterator[list[tuple[str, Any]]]:
    """The statements (and their parameters, as sent) that mark sent the retries in the
    record, of every engine: the replay makes its own."""
    seen: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.startswith("UPDATE outbox o SET published_at = now()"):
            seen.append((statement, parameters))

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", record)


async def plan_as_sent(
    engine: AsyncEngine, statement: str, parameters: Any
) -> list[dict[str, Any]]:
    """The plan of a statement as the driver was sent it, run (its writes rolled back)."""
    async with engine.connect() as conn:
        found = await conn.exec_driver_sql(
            f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", parameters
        )
        document = found.scalar_one()
        await conn.rollback()
    if isinstance(document, str):
        document = json.loads(document)
    return list(nodes(document[0]["Plan"]))


async def test_a_replay_batch_reads_only_the_retries_its_crawl_requests_name(
    stack: StackUrls, bus: Bus
) -> None:
    # 300 pages time out: 300 retries decided, held while the replay runs; ten of them
    # fired already, their CrawlRequested at the end of the record.
    at = datetime.now(UTC) - timedelta(hours=1)
    failed = [
        completed(
            CrawlOutcome.TIMEOUT,
            url=f"https://down.example/{n}",
            domain="down.example",
            scope=Scope(value="down.example"),
            started_at=at - timedelta(seconds=1),
            completed_at=at,
        )
        for n in range(300)
    ]
    for attempt in failed:
        await bus.publish(attempt)
    fired = [retry_request(attempt, 1, POLICY) for attempt in failed[:10]]
    for request in fired:
        await bus.publish(request)

    target = await empty_database(stack)
    with marks_of_recorded_retries() as marks:
        stats = await replay(stack.nats_url, target, POLICY, batch=50)
    assert stats.applied == 310

    replayed = create_async_engine(target)
    try:
        found = await query(
            replayed, "SELECT event_id, published_at IS NOT NULL AS sent FROM outbox"
        )
        sent = {r.event_id for r in found if r.sent}
        assert len(found) == 300
        assert sent == {uuid.UUID(r.id) for r in fired}

        # The sweeps that begin and end the replay read every row; each batch's mark in
        # between (run again, the released rows pending) reads the rows of the ten
        # requests, once in all.
        assert len(marks) >= 3
        batches = [await plan_as_sent(replayed, *mark) for mark in marks[1:-1]]
        assert sum(rows_read(plan, "outbox") for plan in batches) <= len(fired)
        assert sum(rows_read(plan, "projected_events") for plan in batches) <= len(fired)
    finally:
        await replayed.dispose()
