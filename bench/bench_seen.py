"""The dedup seen-set's cost per URL: NATS KV storage and nats-server memory.

Creates N keys the way discovery does (``u.`` + 40 hex chars of sha256(url), the
discovering event id as value) in a bucket like ``trove_seen``, and reports bytes on
disk per URL, nats-server RSS per URL, creates per second, and the extrapolation to
100 million URLs. Run: ``.venv/bin/python bench/bench_seen.py [--urls 200000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import tempfile
import time
import uuid
from pathlib import Path

import nats
from nats.js.api import KeyValueConfig, StorageType

from trove_stack.nats import EmbeddedNats, NatsConfig


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def measure(url: str, pid: int, n: int) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    kv = await js.create_key_value(
        KeyValueConfig(bucket="seen_bench", history=1, storage=StorageType.FILE)
    )
    base_rss = rss_kib(pid)
    started = time.monotonic()
    chunk = 2000
    for start in range(0, n, chunk):
        keys = [
            "u." + hashlib.sha256(f"https://site{i % 5000}.example/p/{i}".encode()).hexdigest()[:40]
            for i in range(start, min(n, start + chunk))
        ]
        await asyncio.gather(*(kv.create(k, str(uuid.uuid4()).encode()) for k in keys))
    seconds = time.monotonic() - started
    info = await js.stream_info("KV_seen_bench")
    disk = info.state.bytes
    grown = (rss_kib(pid) - base_rss) * 1024
    per_disk, per_rss = disk / n, grown / n
    print(f"{n:,} URLs in {seconds:.1f}s: {n / seconds:,.0f} creates/s")
    print(f"stored: {per_disk:.0f} bytes/URL on disk; nats-server RSS +{per_rss:.0f} bytes/URL")
    scale = 100_000_000
    print(
        f"100M URLs: ~{per_disk * scale / 2**30:.1f} GiB per replica on disk, "
        f"~{per_rss * scale / 2**30:.1f} GiB of nats-server memory (index) per replica"
    )
    await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--urls", type=int, default=200_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedNats(NatsConfig(store_dir=Path(tmp))).start()
        try:
            assert server.pid is not None
            asyncio.run(measure(server.url, server.pid, args.urls))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
