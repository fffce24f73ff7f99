"""Recorder benchmark: CrawlCompleted events projected per second, pages of ~100 links.

Starts the embedded stack, publishes N CrawlCompleted events (each with `--links` links
to other pages of a synthetic site, so link targets overlap as on the real web), then
starts the recorder process and times how long it takes to project all of them.
Each configuration (TROVE_BATCH_SIZE values) runs `--runs` times, alternately, in one
invocation; medians and the ratio to the first configuration are printed.

    .venv/bin/python bench/bench_recorder.py [--events 10000] [--links 100]
        [--batch 1,500] [--recorders 1,2] [--runs 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from trove_cli.local import LocalTrove
from trove_schema.events import CrawlCompleted, CrawlOutcome, Link, Scope
from trove_schema.migrate import upgrade
from trove_stack.reset import reset as reset_stack
from trove_stack.stack import Stack


def events(n: int, links: int) -> list[bytes]:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    out = []
    for i in range(n):
        at = start + timedelta(milliseconds=i)
        out.append(
            CrawlCompleted(
                url=f"https://site{i % 50}.example/p/{i}",
                domain=f"site{i % 50}.example",
                scope=Scope(value=f"site{i % 50}.example"),
                request_id=f"00000000-0000-0000-0000-{i:012d}",
                outcome=CrawlOutcome.SUCCESS,
                status_code=200,
                started_at=at,
                completed_at=at,
                title=f"Page {i}",
                language="en",
                keywords=tuple(f"word{(i * 7 + k) % 5000}" for k in range(60)),
                links=tuple(
                    Link(url=f"https://site{(i + k) % 50}.example/p/{(i * 31 + k) % n}")
                    for k in range(links)
                ),
            ).to_wire()
        )
    return out


async def reset(nats_url: str, database_url: str) -> None:
    nc = await nats.connect(nats_url)
    engine = create_async_engine(database_url)
    try:
        await reset_stack(nc.jetstream(), engine)
    finally:
        await nc.close()
        await engine.dispose()


async def publish(nats_url: str, payloads: list[bytes]) -> None:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    for chunk in range(0, len(payloads), 500):
        acks = [
            js.publish("trove.events.crawl.completed", p) for p in payloads[chunk : chunk + 500]
        ]
        await asyncio.gather(*acks)
    await nc.close()


async def projection_rate(database_url: str, n: int, limit: float) -> float:
    """Events per second from the first projected row to the last.

    Timing starts when the first batch has committed, so the recorder's start-up
    (imports, migrations, connecting) is not counted against it.
    """
    engine = create_async_engine(database_url)
    deadline = time.monotonic() + limit
    first: tuple[float, int] | None = None
    try:
        while time.monotonic() < deadline:
            async with engine.connect() as conn:
                done = (await conn.execute(text("SELECT count(*) FROM page_crawls"))).scalar_one()
            now = time.monotonic()
            if first is None and done > 0:
                first = (now, done)
            if first is not None and done >= n:
                return (n - first[1]) / (now - first[0]) if now > first[0] else float("nan")
            await asyncio.sleep(0.05)
        return float("nan")
    finally:
        await engine.dispose()


def run_once(stack: Stack, state: Path, payloads: list[bytes], batch: int, recorders: int) -> float:
    asyncio.run(reset(stack.nats_url, stack.database_url))
    asyncio.run(publish(stack.nats_url, payloads))
    local = LocalTrove(
        state_dir=state,
        nats_url=stack.nats_url,
        database_url=stack.database_url,
        services=("recorder",),
        replicas={"recorder": recorders},
        service_env={"TROVE_BATCH_SIZE": str(batch), "TROVE_LOG_LEVEL": "WARNING"},
    )
    with local:
        return asyncio.run(projection_rate(stack.database_url, len(payloads), 300))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=10000)
    parser.add_argument("--links", type=int, default=100)
    parser.add_argument("--batch", default="1,500")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument(
        "--recorders", default="1", help="recorder processes, comma-separated configurations"
    )
    args = parser.parse_args()
    configs = [(int(b), int(r)) for r in args.recorders.split(",") for b in args.batch.split(",")]
    payloads = events(args.events, args.links)
    with (
        tempfile.TemporaryDirectory() as tmp,
        Stack(state_dir=Path(tmp) / "stack", fast_and_unsafe=True) as stack,
    ):
        upgrade(stack.database_url)
        rates: dict[tuple[int, int], list[float]] = {c: [] for c in configs}
        for run in range(args.runs):
            for batch, recorders in configs:
                state = Path(tmp) / f"run{run}-{batch}-{recorders}"
                rate = run_once(stack, state, payloads, batch, recorders)
                rates[(batch, recorders)].append(rate)
                print(f"run {run + 1} batch {batch} recorders {recorders}: {rate:,.0f} events/s")
    base = statistics.median(rates[configs[0]])
    print(f"\n{args.events} CrawlCompleted events, {args.links} links each, 2-core machine")
    print(f"{'batch size':>10} {'recorders':>9} {'events/s (median)':>18} {'ratio':>7}")
    for batch, recorders in configs:
        median = statistics.median(rates[(batch, recorders)])
        print(f"{batch:>10} {recorders:>9} {median:>18,.0f} {median / base:>7.2f}")


if __name__ == "__main__":
    main()
