"""Recorder benchmark: CrawlCompleted events projected per second, pages of ~100 links.

Starts the embedded stack, publishes N CrawlCompleted events (each with `--links` links
to other pages of a synthetic site, so link targets overlap as on the real web), then
starts the recorder process and times how long it takes to project all of them.
Each configuration (TROVE_BATCH_SIZE values) runs `--runs` times, alternately, in one
invocation; medians and the ratio to the first configuration are printed.

With ``--trickle RATE`` it measures a polite crawl's pace instead: the recorder (its
default batch size and linger) is started first, the events are published RATE a
second, and what is printed is the CPU an event of the recorder and of Postgres over
the window, from ``/proc``. There a batch holds an event or a few, so this is the
recorder's cost a batch more than a page.

    .venv/bin/python bench/bench_recorder.py [--events 10000] [--links 100]
        [--batch 1,500] [--recorders 1,2] [--runs 2]
    .venv/bin/python bench/bench_recorder.py --trickle 10 --events 300 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import children_of, cpu_seconds, postmaster_pid
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


async def _projected(database_url: str, n: int, limit: float) -> None:
    engine = create_async_engine(database_url)
    deadline = time.monotonic() + limit
    try:
        while time.monotonic() < deadline:
            async with engine.connect() as conn:
                done = (await conn.execute(text("SELECT count(*) FROM page_crawls"))).scalar_one()
            if done >= n:
                return
            await asyncio.sleep(0.05)
        raise TimeoutError(f"{n} events not projected within {limit:.0f} s")
    finally:
        await engine.dispose()


async def _publish_at(nats_url: str, payloads: list[bytes], rate: float) -> None:
    """One event every 1/rate seconds, each on the clock (no drift from slow acks)."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    start = time.monotonic()
    for k, payload in enumerate(payloads):
        await asyncio.sleep(max(0.0, start + k / rate - time.monotonic()))  # the pace itself
        await js.publish("trove.events.crawl.completed", payload)
    await nc.close()


def trickle_once(stack: Stack, state: Path, payloads: list[bytes], rate: float) -> dict[str, float]:
    """ms of CPU an event, by process, projecting ``payloads`` published ``rate`` a second."""
    asyncio.run(reset(stack.nats_url, stack.database_url))
    warm, measured = payloads[:1], payloads[1:]
    local = LocalTrove(
        state_dir=state,
        nats_url=stack.nats_url,
        database_url=stack.database_url,
        services=("recorder",),
        service_env={"TROVE_LOG_LEVEL": "WARNING"},
    )
    assert stack.postgres is not None, "the trickle needs the embedded Postgres"
    postmaster = postmaster_pid(stack.postgres.config.data_dir)
    with local:
        # The first event pays for connecting and warming caches: not counted.
        asyncio.run(publish(stack.nats_url, warm))
        asyncio.run(_projected(stack.database_url, 1, 120))
        (recorder,) = local.children

        def cpu() -> dict[str, float]:
            pg = [postmaster, *children_of(postmaster)] if postmaster else []
            return {
                "recorder": cpu_seconds(recorder.pid) or 0.0,
                "postgres": sum(cpu_seconds(p) or 0.0 for p in pg),
            }

        before = cpu()
        asyncio.run(_publish_at(stack.nats_url, measured, rate))
        asyncio.run(_projected(stack.database_url, len(payloads), 120))
        after = cpu()
    return {k: 1000 * (after[k] - before[k]) / len(measured) for k in before}


def trickle(args: argparse.Namespace) -> None:
    payloads = events(args.events, args.links)
    with (
        tempfile.TemporaryDirectory() as tmp,
        Stack(state_dir=Path(tmp) / "stack", fast_and_unsafe=True) as stack,
    ):
        upgrade(stack.database_url)
        runs = []
        for run in range(args.runs):
            cost = trickle_once(stack, Path(tmp) / f"trickle{run}", payloads, args.trickle)
            runs.append(cost)
            print(f"run {run + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in cost.items()))
    print(
        f"\n{args.events - 1} CrawlCompleted events of {args.links} links, {args.trickle:g} a "
        "second; ms of CPU an event (median): "
        + ", ".join(f"{k} {statistics.median(r[k] for r in runs):.2f}" for k in runs[0])
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=10000)
    parser.add_argument("--links", type=int, default=100)
    parser.add_argument("--batch", default="1,500")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument(
        "--recorders", default="1", help="recorder processes, comma-separated configurations"
    )
    parser.add_argument(
        "--trickle", type=float, default=0.0, help="events a second: CPU an event at that pace"
    )
    args = parser.parse_args()
    if args.trickle > 0:
        trickle(args)
        return
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
