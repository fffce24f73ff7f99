"""nats-server's memory for the pages in a crawl: one pending re-crawl schedule each.

Every page Trove has fetched waits for its next visit as a scheduled ``CrawlRequested``
on its own subject in ``TROVE_EVENTS`` (``trove.schedules.page.<hash>``), so nats-server
holds one pending schedule per page in the crawl, besides the frontier's. This starts a
nats-server, declares the topology as the services do, schedules ``--pages`` re-crawls
a month ahead (a realistic request: ETag, change history of five visits) and replaces
every one of them in a second cycle, as the next visits do. It prints nats-server's RSS
a page after each cycle and after an idle spell, with Go's collector left alone and
with it told a soft limit (``GOMEMLIMIT``, as the Helm values do), run side by side.

    .venv/bin/python bench/bench_schedules.py [--pages 100000] [--limit-mib 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import MIB, memory_mib
from trove_schema.bus import Bus
from trove_schema.events import ChangeHistory, CrawlRequested, RequestReason, Scope
from trove_schema.topology import EVENTS_STREAM, declare, ensure_topology, page_schedule_subject
from trove_stack.nats import EmbeddedNats, NatsConfig


def rss_bytes(pid: int) -> float:
    return (memory_mib(pid, "VmRSS") or 0.0) * MIB


def request(i: int, at: datetime) -> CrawlRequested:
    host = f"blog{i % 5000}.example"
    return CrawlRequested(
        url=f"https://{host}/posts/{i}-notes-from-the-garden.html",
        domain=host,
        scope=Scope(value=host),
        reason=RequestReason.RECRAWL,
        etag=f'"{i:x}-5f3a"',
        caused_by=f"00000000-0000-0000-0000-{i:012d}",
        history=ChangeHistory(
            content_hash=f"{i:064x}",
            visited_at=at,
            visits=((604_800.0, False),) * 5,
            interval=604_800.0,
        ),
    )


async def schedule_all(bus: Bus, pages: int, at: datetime) -> float:
    started = time.perf_counter()
    for chunk in range(0, pages, 1000):
        batch = [request(i, at) for i in range(chunk, min(pages, chunk + 1000))]
        await asyncio.gather(
            *(
                bus.publish_at(
                    event, at + timedelta(seconds=i), schedule=page_schedule_subject(event.url)
                )
                for i, event in enumerate(batch, start=chunk)
            )
        )
    return time.perf_counter() - started


async def measure(url: str, pid: int, pages: int, idle: float) -> dict[str, float]:
    nc = await nats.connect(url)
    bus = Bus(nc, nc.jetstream())
    await ensure_topology(bus.js, declare())
    base = rss_bytes(pid)
    ahead = datetime.now(UTC) + timedelta(days=30)
    out = {"base": base / MIB}
    for cycle in (1, 2):
        out[f"seconds{cycle}"] = await schedule_all(bus, pages, ahead)
        out[f"cycle{cycle}"] = (rss_bytes(pid) - base) / pages
    info = await bus.js.stream_info(EVENTS_STREAM)
    assert info.state.messages == pages, info.state.messages  # each page's one schedule
    out["disk"] = info.state.bytes / pages
    await asyncio.sleep(idle)  # an idle spell: what Go hands back to the system
    out["idle"] = (rss_bytes(pid) - base) / pages
    await nc.close()
    return out


def run_once(pages: int, limit_mib: int | None, idle: float) -> dict[str, float]:
    saved = os.environ.get("GOMEMLIMIT")
    if limit_mib:
        os.environ["GOMEMLIMIT"] = f"{limit_mib}MiB"
    else:
        os.environ.pop("GOMEMLIMIT", None)
    try:
        with tempfile.TemporaryDirectory(prefix="trove-schedules-") as tmp:
            server = EmbeddedNats(NatsConfig(store_dir=Path(tmp))).start()
            try:
                assert server.pid is not None
                return asyncio.run(measure(server.url, server.pid, pages, idle))
            finally:
                server.stop()
    finally:
        if saved is None:
            os.environ.pop("GOMEMLIMIT", None)
        else:
            os.environ["GOMEMLIMIT"] = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=100_000)
    parser.add_argument("--limit-mib", type=int, default=200, help="GOMEMLIMIT of the second run")
    parser.add_argument(
        "--idle", type=float, default=30.0, help="seconds idle before the last reading"
    )
    args = parser.parse_args()

    print(f"{args.pages:,} pages, each with one pending re-crawl a month ahead; bytes a page")
    print("GOMEMLIMIT      after cycle 1   after cycle 2   after idle   disk     cycles (s)")
    for limit in (None, args.limit_mib):
        got = run_once(args.pages, limit, args.idle)
        label = f"{limit} MiB" if limit else "unset"
        print(
            f"{label:<15} {got['cycle1']:>13,.0f} {got['cycle2']:>15,.0f} {got['idle']:>12,.0f}"
            f" {got['disk']:>6,.0f}   {got['seconds1']:.1f}, {got['seconds2']:.1f}"
            f"   (server at start {got['base']:.1f} MiB)"
        )


if __name__ == "__main__":
    main()
