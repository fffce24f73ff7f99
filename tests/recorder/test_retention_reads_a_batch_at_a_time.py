"""A retention statement reads about a batch of rows, whatever a table holds: the crawl
history's past the rows pages keep, the other tables' past the rows earlier batches of
the pass deleted (still in the indexes while a vacuum lags). Read off the statements'
own plans, as run (EXPLAIN ANALYZE)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from tests.recorder.test_lookups import analyze, nodes, plan_of, rows_read
from tests.recorder.test_projections import rows
from trove_recorder.retention import (
    _DELETE_CRAWLS,
    HistoryCursor,
    Retention,
    prune,
    prune_applied,
    prune_crawls,
    prune_published,
    prune_shares,
)

pytestmark = pytest.mark.usefixtures("clean")

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
OLDEST = datetime.min.replace(tzinfo=UTC)


async def a_history_pages_keep(engine: AsyncEngine, kept: int) -> list[datetime]:
    """``kept`` pages never fetched, an attempt each a minute apart from 100 days ago
    (every one kept, whatever its age), then two pages fetched twice, ten and eleven
    days later (the first fetch superseded); the attempts' completions, oldest first."""
    start = NOW - timedelta(days=100)
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO pages (url, domain) SELECT 'https://dead.example/' || n, "
                "'dead.example' FROM generate_series(1, :kept) AS n"
            ),
            {"kept": kept},
        )
        # The crawl's frontier: pages discovered, not crawled yet.
        await conn.execute(
            text(
                "INSERT INTO pages (url, domain) SELECT 'https://new.example/' || n, "
                "'new.example' FROM generate_series(1, 20000) AS n"
            )
        )
        await conn.execute(
            text(
                "INSERT INTO page_crawls (page_id, domain, attempt, outcome, started_at, "
                "completed_at, duration_ms, event_id) SELECT p.id, p.domain, 1, 'timeout', "
                "t, t, 5, gen_random_uuid() FROM pages p, LATERAL (SELECT "
                "CAST(:start AS timestamptz) + CAST(split_part(p.url, '/', 4) AS int) "
                "* interval '1 minute' AS t) AS a WHERE p.domain = 'dead.example'"
            ),
            {"start": start},
        )
        for n in (1, 2):
            first = start + timedelta(days=10, hours=n)
            second = start + timedelta(days=11, hours=n)
            (page,) = (
                await conn.execute(
                    text(
                        "INSERT INTO pages (url, domain, fetched_at) VALUES (:url, "
                        "'live.example', :fetched) RETURNING id"
                    ),
                    {"url": f"https://live.example/{n}", "fetched": second},
                )
            ).one()
            for at in (first, second):
                await conn.execute(
                    text(
                        "INSERT INTO page_crawls (page_id, domain, attempt, outcome, "
                        "started_at, completed_at, duration_ms, event_id) VALUES (:page, "
                        "'live.example', 1, 'success', :at, :at, 5, gen_random_uuid())"
                    ),
                    {"page": page, "at": at},
                )
    await analyze(engine, "pages")
    await analyze(engine, "page_crawls")
    found = await rows(engine, "SELECT completed_at FROM page_crawls ORDER BY completed_at")
    return [r.completed_at for r in found]


async def test_a_crawl_history_statement_reads_a_batch_past_the_attempts_pages_keep(
    engine: AsyncEngine,
) -> None:
    kept, batch = 2000, 50
    await a_history_pages_keep(engine, kept)
    cutoff = NOW - timedelta(days=30)
    plan = await plan_of(engine, _DELETE_CRAWLS.text, cutoff=cutoff, after=OLDEST, batch=batch)
    # The batch (and one more, to see that no attempt completed with its last), and a
    # probe a row of it to delete it and to read its page: not the 2,000 kept rows
    # ahead of the first it may delete.
    assert rows_read(plan, "page_crawls") <= 2 * batch + 1
    assert rows_read(plan, "pages") <= batch


async def test_a_crawl_history_pass_goes_on_past_a_batch_of_kept_rows_and_stops_after_the_last_read(
    engine: AsyncEngine,
) -> None:
    completions = await a_history_pages_keep(engine, kept=120)
    sessions = async_sessionmaker(engine)
    retention = Retention(window=timedelta(days=90), crawl_window=timedelta(days=30), batch=50)
    cursor = HistoryCursor()
    # The first 120 rows are kept: the pass goes past them, batch after batch, to the
    # two pages' first fetches.
    assert await prune_crawls(sessions, retention, lambda: NOW, cursor) == 2
    (left,) = await rows(engine, "SELECT count(*) AS n FROM page_crawls")
    assert left.n == 122
    # The next pass goes on after the newest attempt this one read, which it kept: it
    # reads none of them again.
    assert cursor.after == completions[-1]
    assert await prune_crawls(sessions, retention, lambda: NOW + timedelta(minutes=10), cursor) == 0


@dataclass(frozen=True)
class Table:
    name: str
    fill: str
    prune: Callable[..., Any]
    retention: Retention


# ``:n`` rows, a minute apart, the newest 10 days old: past every window below.
TABLES = [
    Table(
        "fetcher_attempts",
        "INSERT INTO fetcher_attempts (event_id, url, host, fetcher, success, is_banned, "
        "duration_ms, attempted_at) SELECT gen_random_uuid(), 'https://a.example/' || n, "
        "'a.example', 'http', true, false, 5, CAST(:newest AS timestamptz) - n * "
        "interval '1 minute' FROM generate_series(1, :n) AS n",
        prune,
        Retention(window=timedelta(days=1), batch=200),
    ),
    Table(
        "outbox",
        "INSERT INTO outbox (event_id, subject, payload, created_at, published_at) "
        "SELECT gen_random_uuid(), 'crawl.requested', '\\x7b7d', t, t FROM (SELECT "
        "CAST(:newest AS timestamptz) - n * interval '1 minute' AS t "
        "FROM generate_series(1, :n) AS n) AS a",
        prune_published,
        Retention(window=None, batch=200),
    ),
    Table(
        "page_shares",
        "INSERT INTO page_shares (url, post_uri, instance, account, first_seen_at) "
        "SELECT 'https://shared.example/' || n, 'https://social.example/p/' || n, "
        "'https://social.example', 'a', CAST(:newest AS timestamptz) - n * "
        "interval '1 minute' FROM generate_series(1, :n) AS n",
        prune_shares,
        Retention(window=None, shares_window=timedelta(days=1), batch=200),
    ),
    Table(
        "projected_events",
        "INSERT INTO projected_events (event_id, event_type, projected_at) "
        "SELECT gen_random_uuid(), 'CrawlCompleted', CAST(:newest AS timestamptz) - n * "
        "interval '1 minute' FROM generate_series(1, :n) AS n",
        prune_applied,
        Retention(window=None, applied_window=timedelta(days=1), batch=200),
    ),
]


@contextmanager
def deletes_of(engine: AsyncEngine, table: str) -> Iterator[list[tuple[str, Any]]]:
    """The statements (and their parameters, as sent) that delete from ``table``."""
    seen: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.split()[:3] == ["DELETE", "FROM", table]:
            seen.append((statement, parameters))

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)


def blocks_read(plan: list[dict[str, Any]], table: str) -> int:
    """Blocks the plan's scans of ``table`` (and of its indexes) touched."""
    return sum(
        node["Shared Hit Blocks"] + node["Shared Read Blocks"]
        for node in plan
        if node["Node Type"].endswith("Scan") and node.get("Relation Name") == table
    )


@pytest.mark.parametrize("table", TABLES, ids=[t.name for t in TABLES])
async def test_a_retention_batch_does_not_read_again_what_the_batches_before_it_deleted(
    engine: AsyncEngine, table: Table
) -> None:
    count = 4000
    async with engine.begin() as conn:
        await conn.execute(text(table.fill), {"n": count, "newest": NOW - timedelta(days=10)})
    await analyze(engine, table.name)
    sessions = async_sessionmaker(engine)
    # A transaction older than the deletes (a long report, a standby's feedback): until
    # it ends, no vacuum takes their rows out of the table or its indexes.
    async with engine.connect() as held:
        await held.execution_options(isolation_level="REPEATABLE READ")
        await held.execute(text("SELECT 1"))
        with deletes_of(engine, table.name) as statements:
            deleted = await table.prune(sessions, table.retention, lambda: NOW)
        assert (sum(deleted) if isinstance(deleted, list) else deleted) == count
        assert len(statements) == count // table.retention.batch + 1
        # The pass's last statement, run again: it finds nothing from where the batch
        # before it stopped, and reads none of the 4,000 rows the pass deleted.
        statement, parameters = statements[-1]
        async with engine.connect() as conn:
            found = await conn.exec_driver_sql(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}", parameters
            )
            document = found.scalar_one()
            await conn.rollback()
        plan = list(
            nodes((json.loads(document) if isinstance(document, str) else document)[0]["Plan"])
        )
        (pages,) = await rows(
            engine, "SELECT pg_relation_size(CAST(:t AS regclass)) / 8192 AS n", t=table.name
        )
        assert pages.n >= 20
        assert blocks_read(plan, table.name) <= 10
        await held.rollback()
