"""The retention of applied event ids, month after month: the b-tree Trove builds against BRIN.

With a retention on the record (``TROVE_EVENTS_MAX_AGE_SECONDS``), the recorder deletes
the ids in ``projected_events`` older than twice the record's age, found through an index
on ``projected_at`` (``trove_recorder.retention``). This fills the table with ``--ids``
ids spread over 120 days, then runs ``--months`` months of days. Each day a day's ids are
inserted as the recorder inserts them (transactions of 500), the retention's pass runs
(a 60-day window, the recorder's own ``prune_applied``), and ``VACUUM`` runs as
autovacuum would, so new ids refill the pages the pruned ones left. Each month prints,
for the index Trove builds and for a BRIN index in its place, side by side:

* the month's passes' wall time and the ids they deleted;
* the blocks one lookup of the expired ids reads at the month's end
  (``EXPLAIN (ANALYZE, BUFFERS)``, a LIMIT of one batch);
* the table's and the index's size.

    .venv/bin/python bench/bench_applied_ids.py [--ids 1000000] [--months 4]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from bench._common import migrated_database
from trove_recorder.retention import Retention, prune_applied

INDEX = "ix_projected_events_projected_at"
WINDOW = timedelta(days=60)
BATCH = 500  # the recorder's default batch


async def fill(conn: asyncpg.Connection, end: datetime, days: int, n: int, *, batch: int) -> None:
    """``n`` ids evenly over the ``days`` before ``end``, ``batch`` to a transaction."""
    if n == 0:
        return
    start = end - timedelta(days=days)
    step = timedelta(days=days) / n
    for first in range(0, n, batch):
        count = min(batch, n - first)
        await conn.execute(
            "INSERT INTO projected_events (event_id, event_type, projected_at) "
            "SELECT gen_random_uuid(), 'CrawlCompleted', $1::timestamptz + g * $2::interval "
            "FROM generate_series($3::int, $4::int) g",
            start,
            step,
            first,
            first + count - 1,
        )


def fixed(at: datetime) -> Callable[[], datetime]:
    return lambda: at


async def heap_blocks(conn: asyncpg.Connection, cutoff: datetime) -> int:
    """Blocks one batch's lookup of expired ids touches (read or found in the cache)."""
    plan = await conn.fetch(
        "EXPLAIN (ANALYZE, BUFFERS) SELECT event_id FROM projected_events "
        "WHERE projected_at < $1 LIMIT 5000",
        cutoff,
    )
    total = 0
    for line in (r[0] for r in plan):
        if "Buffers:" in line:
            total = max(total, sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", line)))
    return total


async def one(database_url: str, kind: str, ids: int, months: int) -> list[dict[str, float]]:
    dsn = database_url.replace("postgresql+asyncpg", "postgresql")
    conn = await asyncpg.connect(dsn)
    engine = create_async_engine(database_url)
    sessions = async_sessionmaker(engine)
    rows: list[dict[str, float]] = []
    try:
        await conn.execute("TRUNCATE projected_events")
        await conn.execute(f"DROP INDEX IF EXISTS {INDEX}")
        using = "USING brin " if kind == "brin" else ""
        await conn.execute(f"CREATE INDEX {INDEX} ON projected_events {using}(projected_at)")
        base = datetime.now(UTC)
        await fill(conn, base, 120, ids, batch=50_000)
        retention = Retention(window=timedelta(days=90), applied_window=WINDOW, batch=5000)
        daily = ids // 4 // 30
        for month in range(months):
            seconds = 0.0
            deleted = 0
            for day in range(30):
                now = base + timedelta(days=30 * month + day)
                # A day's ids, as the recorder writes them, into the space pruned ids left.
                await fill(conn, now, 1, daily, batch=BATCH)
                started = time.perf_counter()
                deleted += await prune_applied(sessions, retention, now=fixed(now))
                seconds += time.perf_counter() - started
                await conn.execute("VACUUM ANALYZE projected_events")
            blocks = await heap_blocks(conn, now - WINDOW + timedelta(hours=1))
            table = await conn.fetchval("SELECT pg_relation_size('projected_events')")
            index = await conn.fetchval(f"SELECT pg_relation_size('{INDEX}')")
            rows.append(
                {
                    "deleted": deleted,
                    "seconds": seconds,
                    "blocks": blocks,
                    "table_mb": table / 1e6,
                    "index_mb": index / 1e6,
                }
            )
    finally:
        await conn.close()
        await engine.dispose()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=1_000_000)
    parser.add_argument("--months", type=int, default=4)
    args = parser.parse_args()
    with migrated_database() as url:
        results = {
            kind: asyncio.run(one(url, kind, args.ids, args.months)) for kind in ("btree", "brin")
        }
        # Put Trove's index back as the migration made it.
        asyncio.run(one(url, "btree", 0, 0))
    print(f"\n{args.ids:,} ids over 120 days, then {args.ids // 4 // 30:,} a day; window 60 days\n")
    print(
        "| month | deleted | passes s (b-tree / BRIN) | blocks a lookup (b-tree / BRIN) "
        "| table MB | index MB (b-tree / BRIN) |"
    )
    print("|---|---|---|---|---|---|")
    for month, (b, r) in enumerate(zip(results["btree"], results["brin"], strict=True)):
        print(
            f"| {month} | {b['deleted']:,.0f} / {r['deleted']:,.0f} "
            f"| {b['seconds']:.1f} / {r['seconds']:.1f} (x{r['seconds'] / b['seconds']:.2f}) "
            f"| {b['blocks']:,.0f} / {r['blocks']:,.0f} "
            f"| {b['table_mb']:.0f} / {r['table_mb']:.0f} "
            f"| {b['index_mb']:.1f} / {r['index_mb']:.2f} |"
        )


if __name__ == "__main__":
    main()
