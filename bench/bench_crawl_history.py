"""The crawl history's retention: its pass with the index on ``completed_at`` and without,
and what the index costs the projection's inserts.

With ``TROVE_CRAWL_HISTORY_RETENTION_SECONDS`` set, the recorder deletes the attempts in
``page_crawls`` older than the window that a later success of their page superseded
(``trove_recorder.retention.prune_crawls``). This fills ``--pages`` pages with a
weekly crawl each over ``--days`` days (one page in ten failing all along: its attempts
stay, whatever their age), then, with migration 0010's index and without it, side by side:

* inserts a week's attempts as the projection does (transactions of 500 rows), timed;
* runs the first pass of a 30-day window (the backlog), the next one (from where it
  stopped, as the recorder's next pass does) and a day's rescan from the oldest row,
  timed, with the blocks one batch of a rescan reads (``EXPLAIN (ANALYZE, BUFFERS)``).

    .venv/bin/python bench/bench_crawl_history.py [--pages 100000] [--days 120]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from bench._common import migrated_database
from trove_recorder.retention import _DELETE_CRAWLS, HistoryCursor, Retention, prune_crawls

INDEX = "ix_page_crawls_completed_at"
WINDOW = timedelta(days=30)
BATCH = 500  # the recorder's default batch


async def attempts(conn: asyncpg.Connection, pages: int, start: datetime, days: int) -> None:
    """A crawl a week of every page over ``days`` from ``start``, ``BATCH`` to a transaction;
    a page in ten fails every time."""
    for week in range(days // 7):
        at = start + timedelta(days=7 * week)
        for first in range(1, pages + 1, BATCH):
            await insert(conn, first, min(first + BATCH - 1, pages), at)


async def insert(conn: asyncpg.Connection, first: int, last: int, at: datetime) -> None:
    await conn.execute(
        "INSERT INTO page_crawls (page_id, domain, outcome, status_code, started_at, "
        "completed_at, duration_ms, event_id) "
        "SELECT g, 'host' || (g % 1000), CASE WHEN g % 10 = 0 THEN 'timeout' "
        "ELSE 'success' END, 200, $1::timestamptz + g * interval '1 ms', "
        "$1::timestamptz + g * interval '1 ms', 120, gen_random_uuid() "
        "FROM generate_series($2::int, $3::int) g",
        at,
        first,
        last,
    )


async def lookup_blocks(conn: asyncpg.Connection, cutoff: datetime) -> int:
    """Blocks one batch of the pass touches, in a transaction rolled back."""
    sql = (
        str(_DELETE_CRAWLS)
        .replace(":cutoff", "$1")
        .replace(":after", "'-infinity'")
        .replace(":batch", "5000")
    )
    tx = conn.transaction()
    await tx.start()
    try:
        plan = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS) " + sql, cutoff)
    finally:
        await tx.rollback()
    first = next(r[0] for r in plan if "Buffers:" in r[0])
    return sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", first))


async def one(database_url: str, indexed: bool, pages: int, days: int) -> dict[str, float]:
    dsn = database_url.replace("postgresql+asyncpg", "postgresql")
    conn = await asyncpg.connect(dsn)
    engine = create_async_engine(database_url)
    sessions = async_sessionmaker(engine)
    try:
        await conn.execute("TRUNCATE pages, page_crawls CASCADE")
        await conn.execute(f"DROP INDEX IF EXISTS {INDEX}")
        if indexed:
            await conn.execute(f"CREATE INDEX {INDEX} ON page_crawls (completed_at)")
        await conn.execute(
            "INSERT INTO pages (id, url, domain) SELECT g, 'https://host' || (g % 1000) "
            "|| '.test/' || g, 'host' || (g % 1000) || '.test' FROM generate_series(1, $1) g",
            pages,
        )
        now = datetime(2026, 11, 1, tzinfo=UTC)
        await attempts(conn, pages, now - timedelta(days=days), days)
        # As the projection leaves them: each page's newest success.
        await conn.execute(
            "UPDATE pages p SET fetched_at = s.at FROM (SELECT page_id, max(completed_at) AS at "
            "FROM page_crawls WHERE outcome = 'success' GROUP BY page_id) s WHERE s.page_id = p.id"
        )
        await conn.execute("VACUUM ANALYZE pages, page_crawls")
        rows = await conn.fetchval("SELECT count(*) FROM page_crawls")
        # A week's crawls, as the projection writes them.
        started = time.perf_counter()
        for first in range(1, pages + 1, BATCH):
            await insert(conn, first, min(first + BATCH - 1, pages), now)
        insert_s = time.perf_counter() - started
        inserted = await conn.fetchval("SELECT count(*) FROM page_crawls") - rows
        retention = Retention(window=timedelta(days=90), crawl_window=WINDOW, batch=5000)
        cursor = HistoryCursor()
        started = time.perf_counter()
        backlog = await prune_crawls(sessions, retention, lambda: now, cursor)
        backlog_s = time.perf_counter() - started
        await conn.execute("VACUUM ANALYZE page_crawls")
        blocks = await lookup_blocks(conn, now - WINDOW)
        # The next pass, an interval later, goes on from the cursor; a day later, a pass
        # starts from the oldest row again.
        later = now + timedelta(minutes=10)
        started = time.perf_counter()
        await prune_crawls(sessions, retention, lambda: later, cursor)
        resumed_s = time.perf_counter() - started
        started = time.perf_counter()
        await prune_crawls(sessions, retention, lambda: now + timedelta(days=1), cursor)
        daily_s = time.perf_counter() - started
        left = await conn.fetchval("SELECT count(*) FROM page_crawls")
        index_mb = (
            await conn.fetchval(f"SELECT pg_relation_size('{INDEX}')") / 1e6 if indexed else 0.0
        )
        return {
            "rows": rows,
            "insert_us": insert_s / inserted * 1e6,
            "backlog": backlog,
            "backlog_s": backlog_s,
            "resumed_s": resumed_s,
            "daily_s": daily_s,
            "blocks": blocks,
            "left": left,
            "index_mb": index_mb,
        }
    finally:
        await conn.close()
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=100_000)
    parser.add_argument("--days", type=int, default=120)
    args = parser.parse_args()
    with migrated_database() as url:
        with_index = asyncio.run(one(url, True, args.pages, args.days))
        without = asyncio.run(one(url, False, args.pages, args.days))
    w, o = with_index, without
    print(
        f"\n{args.pages:,} pages crawled weekly over {args.days} days ({w['rows']:,.0f} attempts, "
        f"a page in ten failing); window {WINDOW.days} days\n"
    )
    print("| | with the index | without | without / with |")
    print("|---|---|---|---|")
    print(
        f"| µs an attempt inserted | {w['insert_us']:.1f} | {o['insert_us']:.1f} "
        f"| x{o['insert_us'] / w['insert_us']:.2f} |"
    )
    lines = [
        (
            f"first pass (the backlog: {w['backlog']:,.0f} deleted, {w['left']:,.0f} kept)",
            "backlog_s",
        ),
        ("the next pass, from the cursor", "resumed_s"),
        ("a day's pass from the oldest row", "daily_s"),
    ]
    for label, key in lines:
        print(f"| {label} | {w[key]:.2f} s | {o[key]:.2f} s | x{o[key] / w[key]:.2f} |")
    print(
        f"| blocks one batch's lookup reads, once pruned | {w['blocks']:,} | {o['blocks']:,} "
        f"| x{o['blocks'] / max(1, w['blocks']):.1f} |"
    )
    print(f"| index MB | {w['index_mb']:.1f} | - | |")


if __name__ == "__main__":
    main()
