"""The hosts of the large-frontier regime of ``bench_vs_scrapy.py``: many, tiny, always up.

Listens on ``--hosts`` consecutive loopback addresses from ``--base-ip`` (never
0.0.0.0), one socket each, all on one port, and answers every GET at once: robots.txt
allows everything, any other path is a small HTML page without links. A crawler thus
takes each host's robots.txt, and every page waits behind the gap. Thousands of
listening sockets need a higher RLIMIT_NOFILE, raised here to the hard limit.

Once listening it writes ``--ready`` (JSON: the port, the request count so far is not
kept). Stops on SIGTERM or SIGINT, after ``--max-seconds``, or when its parent goes away.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import os
import signal
import sys
from pathlib import Path

# The repository root, for the benchmarks' shared helpers (bench/_common.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import raise_nofile

ROBOTS = b"User-agent: *\nAllow: /\n"
PAGE = b"<!doctype html><html lang=en><title>A page</title><p>Nothing to follow here.</p>"


def _answer(body: bytes, content_type: str) -> bytes:
    return (
        f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


ROBOTS_ANSWER = _answer(ROBOTS, "text/plain")
PAGE_ANSWER = _answer(PAGE, "text/html; charset=utf-8")


async def _connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 15.0)
            target = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b"/"
            writer.write(ROBOTS_ANSWER if target == b"/robots.txt" else PAGE_ANSWER)
            await writer.drain()
    except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
        pass
    finally:
        writer.close()


async def serve(args: argparse.Namespace) -> int:
    limit = raise_nofile(args.hosts * 2 + 4096)
    if limit < args.hosts + 1024:
        print(f"frontier_server: RLIMIT_NOFILE {limit} is too low", file=sys.stderr)
        return 2
    first = ipaddress.IPv4Address(args.base_ip)
    if not (first.is_loopback and (first + args.hosts - 1).is_loopback):
        print("frontier_server: loopback addresses only", file=sys.stderr)
        return 2
    servers: list[asyncio.Server] = []
    port = args.port
    for k in range(args.hosts):
        server = await asyncio.start_server(_connection, str(first + k), port, backlog=64)
        servers.append(server)
        if port == 0:
            port = int(server.sockets[0].getsockname()[1])
    ready = Path(args.ready)
    partial = ready.with_suffix(".partial")
    partial.write_text(json.dumps({"port": port, "hosts": args.hosts, "base_ip": args.base_ip}))
    partial.replace(ready)
    print(f"frontier_server: {args.hosts} hosts on port {port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    parent = os.getppid()
    deadline = loop.time() + args.max_seconds
    while not stop.is_set() and loop.time() < deadline and os.getppid() == parent:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    for server in servers:
        server.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=10_000)
    parser.add_argument("--base-ip", default="127.64.0.0")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready", required=True, help="JSON file written once listening")
    parser.add_argument("--max-seconds", type=float, default=7200.0)
    args = parser.parse_args(argv)
    try:
        return asyncio.run(serve(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
