"""The event record on disk, S2-compressed against not: bytes a page and nats-server's CPU.

``TROVE_EVENTS`` is kept for ever by default and is the largest thing Trove stores. This
starts a nats-server for each setting of ``TROVE_EVENTS_COMPRESSION`` in turn (the
stream declared as the recorder declares it), publishes the record of ``--pages`` crawled
pages (a ``PageDiscovered`` and a ``CrawlCompleted`` with ``--links`` links and 60
keywords each), then replays the whole record as a rebuild of the projections would,
and prints, side by side:

* bytes on disk a page (the stream's directory, after the publish);
* nats-server's CPU a thousand pages while the record is written and while it is read;
* the replay's wall time.

Words in titles, keywords and link paths are drawn from a vocabulary of made-up words,
so text repeats as a site's words do; ids and times are unique, as in a real record.

    .venv/bin/python bench/bench_record_size.py [--pages 20000] [--links 100] [--runs 2]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import cpu_seconds
from trove_schema.events import (
    CrawlCompleted,
    CrawlOutcome,
    Link,
    PageDiscovered,
    Provenance,
    Scope,
)
from trove_schema.topology import (
    CRAWL_COMPLETED,
    EVENTS_STREAM,
    PAGE_DISCOVERED,
    TopologyOptions,
    declare,
    ensure_topology,
)
from trove_stack.nats import EmbeddedNats, NatsConfig

SETTINGS = ("none", "s2")


def record(pages: int, links: int, seed: int = 1) -> list[tuple[str, bytes]]:
    """The events of ``pages`` crawled pages over 200 sites, as (subject, payload)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocabulary = ["".join(rng.choices(letters, k=rng.randint(3, 10))) for _ in range(5000)]
    start = datetime(2026, 1, 1, tzinfo=UTC)
    out = []
    for i in range(pages):
        site = f"{rng.choice(vocabulary)}{i % 200}.example"
        path = "-".join(rng.choices(vocabulary, k=4))
        url = f"https://{site}/posts/{path}.html"
        at = start + timedelta(seconds=i * 0.37)
        discovered = PageDiscovered(
            url=url,
            domain=site,
            scope=Scope(value=site),
            depth=rng.randint(0, 5),
            provenance=Provenance(kind="link", source_url=f"https://{site}/"),
        )
        completed = CrawlCompleted(
            url=url,
            domain=site,
            scope=Scope(value=site),
            request_id=discovered.id,
            outcome=CrawlOutcome.SUCCESS,
            status_code=200,
            started_at=at,
            completed_at=at + timedelta(milliseconds=rng.randint(30, 900)),
            title=" ".join(rng.choices(vocabulary, k=6)),
            language="en",
            content_hash=f"{rng.getrandbits(256):064x}",
            keywords=tuple(rng.sample(vocabulary, 60)),
            links=tuple(
                Link(
                    url=f"https://{site if k % 3 else rng.choice(vocabulary) + '.example'}"
                    f"/posts/{'-'.join(rng.choices(vocabulary, k=3))}.html"
                )
                for k in range(links)
            ),
        )
        out.append((PAGE_DISCOVERED, discovered.to_wire()))
        out.append((CRAWL_COMPLETED, completed.to_wire()))
    return out


def disk_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


async def write_and_replay(
    url: str, pid: int, events: list[tuple[str, bytes]], compression: str
) -> dict[str, float]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    options = TopologyOptions(events_compression=compression == "s2")
    await ensure_topology(js, declare(options), owner="recorder")
    cpu = cpu_seconds(pid) or 0.0
    for chunk in range(0, len(events), 500):
        await asyncio.gather(*(js.publish(s, p) for s, p in events[chunk : chunk + 500]))
    written = (cpu_seconds(pid) or 0.0) - cpu

    cpu = cpu_seconds(pid) or 0.0
    started = time.perf_counter()
    sub = await js.pull_subscribe(
        "trove.events.>",
        stream=EVENTS_STREAM,
        config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL),
    )
    read = 0
    while read < len(events):
        read += len(await sub.fetch(1000, timeout=30))
    replay_wall = time.perf_counter() - started
    replayed = (cpu_seconds(pid) or 0.0) - cpu
    await nc.close()
    return {"written_cpu": written, "replay_cpu": replayed, "replay_wall": replay_wall}


def run_once(events: list[tuple[str, bytes]], compression: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="trove-record-") as tmp:
        server = EmbeddedNats(NatsConfig(store_dir=Path(tmp))).start()
        try:
            assert server.pid is not None
            measured = asyncio.run(write_and_replay(server.url, server.pid, events, compression))
            streams = Path(tmp) / "jetstream"
            stream_dir = next(p for p in streams.rglob(EVENTS_STREAM) if p.is_dir())
            measured["disk"] = disk_bytes(stream_dir)
        finally:
            server.stop()
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=20_000)
    parser.add_argument("--links", type=int, default=100)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()

    events = record(args.pages, args.links)
    payload = sum(len(p) for _, p in events)
    print(
        f"{args.pages:,} pages, {len(events):,} events, {payload / args.pages:,.0f} B of JSON "
        f"a page; {args.runs} runs of each setting, alternating"
    )
    results: dict[str, list[dict[str, float]]] = {s: [] for s in SETTINGS}
    for run in range(args.runs):
        for setting in SETTINGS:
            got = run_once(events, setting)
            results[setting].append(got)
            print(
                f"  run {run + 1} {setting:>4}: {got['disk'] / args.pages:,.0f} B a page on disk, "
                f"nats-server {got['written_cpu'] * 1e6 / args.pages:,.0f} µs a page written, "
                f"{got['replay_cpu'] * 1e6 / args.pages:,.0f} µs read back; "
                f"replay {got['replay_wall']:.2f} s"
            )

    def median(setting: str, key: str) -> float:
        return statistics.median(r[key] for r in results[setting])

    print("\nmedians                 none        s2     s2/none")
    rows = (
        ("disk a page (B)", "disk", 1 / args.pages, "{:>9,.0f}"),
        ("written (µs a page)", "written_cpu", 1e6 / args.pages, "{:>9,.0f}"),
        ("read back (µs a page)", "replay_cpu", 1e6 / args.pages, "{:>9,.0f}"),
        ("replay (s)", "replay_wall", 1.0, "{:>9.2f}"),
    )
    for label, key, scale, fmt in rows:
        none, s2 = median("none", key) * scale, median("s2", key) * scale
        print(f"{label:<22}{fmt.format(none)} {fmt.format(s2)}   x{s2 / none:.2f}")


if __name__ == "__main__":
    main()
