"""What runs at every retryable attempt, every poll and every retention pass reads what it
needs (through its index), never a page's or a follow's whole history: read off the
statements' own plans, run on a history of years (EXPLAIN ANALYZE)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from tests.recorder.test_projections import POLICY, completed, rows
from trove_recorder.projections import _FOLLOW_STATE, CHAIN_ATTEMPTS, apply_batch
from trove_recorder.retention import _DELETE_POLLS
from trove_schema.events import CrawlOutcome, CrawlRequested, decode_event

pytestmark = pytest.mark.usefixtures("clean")

NOW = datetime.now(UTC).replace(microsecond=0)


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from nodes(child)


async def plan_of(engine: AsyncEngine, sql: str, **params: Any) -> list[dict[str, Any]]:
    """The plan's nodes, as run (its writes rolled back)."""
    async with engine.connect() as conn:
        found = await conn.execute(text(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}"), params)
        document = found.scalar_one()
        await conn.rollback()
    if isinstance(document, str):
        document = json.loads(document)
    return list(nodes(document[0]["Plan"]))


def rows_read(plan: list[dict[str, Any]], table: str) -> int:
    """Rows the plan's scans of ``table`` read, in all their loops (those a filter
    threw away too)."""
    return sum(
        round((node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node["Actual Loops"])
        for node in plan
        if node["Node Type"].endswith("Scan") and node.get("Relation Name") == table
    )


def indexes(plan: list[dict[str, Any]], table: str) -> set[str]:
    return {n["Index Name"] for n in plan if n.get("Relation Name") == table and "Index Name" in n}


async def analyze(engine: AsyncEngine, table: str) -> None:
    async with engine.connect() as conn:
        await conn.execute(text(f"ANALYZE {table}"))
        await conn.commit()


async def test_a_pages_retry_reads_its_attempts_since_its_last_success_not_its_history(
    engine: AsyncEngine,
) -> None:
    url = "https://blog.example/daily"
    years = 2000  # a success a day for five years and a half
    async with engine.begin() as conn:
        # A hundred other pages, so that the statistics are a crawl's, not one page's.
        await conn.execute(
            text(
                "INSERT INTO pages (url, domain) SELECT 'https://blog.example/' || n, "
                "'blog.example' FROM generate_series(1, 100) AS n"
            )
        )
        await conn.execute(
            text("INSERT INTO pages (url, domain) VALUES (:url, 'blog.example')"), {"url": url}
        )
        await conn.execute(
            text(
                "INSERT INTO page_crawls (page_id, domain, attempt, outcome, started_at, "
                "completed_at, duration_ms, event_id) SELECT p.id, 'blog.example', 1, "
                "'success', t, t, 5, gen_random_uuid() FROM pages p "
                "CROSS JOIN LATERAL (SELECT CAST(:now AS timestamptz) - k * interval '1 day' "
                "AS t FROM generate_series(1, CASE WHEN p.url = :url THEN :days ELSE 20 END) "
                "AS k) AS a"
            ),
            {"now": NOW - timedelta(hours=2), "url": url, "days": years},
        )
    await analyze(engine, "page_crawls")
    # Its daily re-crawl times out, and so does the retry.
    first = NOW - timedelta(minutes=30)
    sessions = async_sessionmaker(engine)
    for attempt, at in ((1, first), (2, NOW)):
        failed = completed(
            CrawlOutcome.TIMEOUT,
            url=url,
            attempt=attempt,
            started_at=at - timedelta(seconds=1),
            completed_at=at,
        )
        async with sessions.begin() as session:
            await apply_batch(session, [failed], POLICY)
    retries = [decode_event(r.payload) for r in await rows(engine, "SELECT payload FROM outbox")]
    assert sorted(r.attempt for r in retries if isinstance(r, CrawlRequested)) == [2, 3]

    (page,) = await rows(engine, "SELECT id FROM pages WHERE url = :url", url=url)
    async with engine.connect() as conn:
        counted = (
            await conn.execute(text(CHAIN_ATTEMPTS), {"ids": [page.id] * 2, "ats": [NOW, first]})
        ).all()
    assert sorted(tuple(row) for row in counted) == [(1, 2, first), (2, 1, first)]
    plan = await plan_of(engine, CHAIN_ATTEMPTS, ids=[page.id], ats=[NOW])
    assert indexes(plan, "page_crawls") == {"ix_page_crawls_page_id_completed_at"}
    # The two failures, the success before them, and a look or two more: not its 2,000 twice.
    assert rows_read(plan, "page_crawls") <= 10


async def a_dead_follow(engine: AsyncEngine, polls: int) -> None:
    """A follow whose instance has failed every poll, every quarter of an hour, for
    ``polls`` polls up to now; and a live one, polled as long, which succeeds."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO instances (instance, domain, timeline, follow_id, followed_at) "
                "VALUES ('https://dead.example', 'dead.example', 'local', "
                "'00000000-0000-0000-0000-00000000dead', :at), "
                "('https://live.example', 'live.example', 'local', "
                "'00000000-0000-0000-0000-0000000011fe', :at)"
            ),
            {"at": NOW - timedelta(minutes=15 * polls)},
        )
        await conn.execute(
            text(
                "INSERT INTO timeline_polls (follow_id, poll, event_id, completed_at, outcome, "
                "posts, links, skipped) SELECT f, n, gen_random_uuid(), "
                "CAST(:now AS timestamptz) - (:polls - n) * interval '15 minutes', "
                "CASE WHEN f = '00000000-0000-0000-0000-0000000011fe' AND n % 2 = 0 "
                "THEN 'success' ELSE 'timeout' END, 0, 0, 0 "
                "FROM generate_series(1, :polls) AS n, unnest(CAST(ARRAY["
                "'00000000-0000-0000-0000-00000000dead', "
                "'00000000-0000-0000-0000-0000000011fe'] AS uuid[])) AS f"
            ),
            {"now": NOW, "polls": polls},
        )
    await analyze(engine, "timeline_polls")


async def test_the_polls_retention_finds_a_dead_follows_newest_success_at_once(
    engine: AsyncEngine,
) -> None:
    polls = 3000  # a month
    await a_dead_follow(engine, polls)
    plan = await plan_of(engine, _DELETE_POLLS.text, cutoff=NOW - timedelta(days=7), batch=5000)
    # Each old poll of the dead follow looks its follow's newest success up (none):
    # a lookup each, not a read of its 3,000 polls each (9 million rows a pass).
    assert "ix_timeline_polls_follow_id_outcome_poll" in indexes(plan, "timeline_polls")
    assert rows_read(plan, "timeline_polls") <= 3 * 2 * polls
    (left,) = await rows(engine, "SELECT count(*) AS n FROM timeline_polls")
    assert left.n == 2 * polls  # the statement's deletes were rolled back


async def test_a_dead_follows_row_finds_its_newest_success_at_once(engine: AsyncEngine) -> None:
    polls = 3000
    await a_dead_follow(engine, polls)
    plan = await plan_of(engine, _FOLLOW_STATE, instance="https://dead.example", timeline="local")
    assert "ix_timeline_polls_follow_id_outcome_poll" in indexes(plan, "timeline_polls")
    # Its run of failures, for the first of them (``failing_since``), and lookups: the
    # newest poll, the newest success.
    assert rows_read(plan, "timeline_polls") <= polls + 10
