"""A replay makes no retry that was due already: the live recorder made it long ago (it
fired, or another request replaced it), or never made it. Decided again from a record
that lost a chain's first attempt, or with its cause's row gone to the crawl history's
retention, such a retry was released when the replay ended and asked a page at once."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

from tests.conftest import StackUrls, eventually
from tests.recorder.test_projections import completed, project
from tests.recorder.test_replay import empty_database
from tests.support import query
from trove_recorder.replay import replay
from trove_recorder.retention import Retention, prune_crawls
from trove_recorder.retries import RetryPolicy, retry_request
from trove_schema.bus import Bus
from trove_schema.events import CrawlCompleted, CrawlOutcome, Provenance, Scope, SeedRejected
from trove_schema.migrate import upgrade_async

pytestmark = pytest.mark.usefixtures("clean")

POLICY = RetryPolicy(max_attempts=3, delay_seconds=3600)
SITE = "https://down.example"


def attempt(path: str, outcome: CrawlOutcome, at: datetime, number: int = 1) -> CrawlCompleted:
    return completed(
        outcome,
        url=f"{SITE}/{path}",
        domain="down.example",
        scope=Scope(value="down.example"),
        attempt=number,
        started_at=at - timedelta(seconds=1),
        completed_at=at,
    )


async def test_a_replay_publishes_no_retry_that_was_due_before_it_ran(
    stack: StackUrls, bus: Bus, engine: AsyncEngine
) -> None:
    now = datetime.now(UTC)
    # A dead page's chain whose first attempt the record no longer holds: the live
    # recorder ended it at its third attempt; the replay counts two.
    trimmed = [
        attempt("trimmed", CrawlOutcome.TIMEOUT, now - timedelta(days=3), 2),
        attempt("trimmed", CrawlOutcome.TIMEOUT, now - timedelta(days=3) + timedelta(hours=1), 3),
    ]
    # A page whose retry another request replaced before it fired, which succeeded: the
    # failure's row goes to the crawl history's retention while the replay runs.
    replaced = [
        attempt("replaced", CrawlOutcome.TIMEOUT, now - timedelta(days=2)),
        attempt("replaced", CrawlOutcome.SUCCESS, now - timedelta(days=1)),
    ]
    # A page whose retry fired an hour ago (in the record) and whose attempt is still to
    # come: the page keeps its status meanwhile, as the live tables have it.
    pending = attempt("pending", CrawlOutcome.TIMEOUT, now - timedelta(hours=2))
    fired = retry_request(pending, 1, POLICY)
    last = SeedRejected(
        raw="ftp://last.example/", reason="not http(s)", provenance=Provenance(kind="seed")
    )
    for event in [*trimmed, *replaced, pending, fired, last]:
        await bus.publish(event)

    target = await empty_database(stack)
    await upgrade_async(target)
    replayed = create_async_engine(target)
    try:
        async with replayed.connect() as held:
            # The last event's id taken first, uncommitted: the replay waits before it,
            # every attempt applied.
            await held.execute(
                text("INSERT INTO projected_events (event_id, event_type) VALUES (:id, 'x')"),
                {"id": last.id},
            )
            running = asyncio.create_task(replay(stack.nats_url, target, POLICY, batch=1))

            async def waiting() -> int:
                (row,) = await query(
                    engine,
                    "SELECT count(*) AS n FROM pg_stat_activity "
                    "WHERE datname = :db AND wait_event_type = 'Lock'",
                    db=make_url(target).database,
                )
                return int(row.n)

            await eventually(waiting, until=lambda n: n == 1, timeout=30, what="replay waits")
            # The live recorder's retention, as it runs meanwhile: the failure before the
            # page's success leaves the crawl history.
            deleted = await prune_crawls(
                async_sessionmaker(replayed),
                Retention(window=None, crawl_window=timedelta(hours=1)),
            )
            assert deleted == 1
            await held.rollback()
        stats = await running
        assert (stats.applied, stats.failed) == (7, 0)

        # Nothing for a publisher to send: no retry of the dead page, none over the
        # replaced page's schedule.
        unsent = await query(replayed, "SELECT payload FROM outbox WHERE published_at IS NULL")
        assert [row.payload for row in unsent] == []

        # The pages stand as the live projection leaves them.
        for event in [*replaced, pending, fired]:
            await project(engine, event, policy=POLICY)
        statuses = "SELECT url, status, failed_at FROM pages WHERE url = ANY(:urls) ORDER BY url"
        urls = [f"{SITE}/replaced", f"{SITE}/pending"]
        live = await query(engine, statuses, urls=urls)
        assert [tuple(r) for r in await query(replayed, statuses, urls=urls)] == [
            tuple(r) for r in live
        ]
        assert [r.status for r in live] == ["discovered", "fetched"]
    finally:
        await replayed.dispose()
