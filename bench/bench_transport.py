"""Transport pool settings, measured side by side (httpx#3215: httpcore's pool scans).

Runs a keep-alive HTTP server in a child process on 127.0.0.1 .. 127.0.0.<hosts>, then
sends the same load through the guarded client with different pool settings, one
configuration after another, several interleaved rounds, and prints the medians:
requests per second, client CPU per request (``time.process_time``), connections
opened, and each one's ratio to the reference configuration.

    .venv/bin/python bench/bench_transport.py [--requests 6000] [--concurrency 200]
        [--hosts 50] [--rounds 3] [--set main|shards|backends]

Loopback only; the server exits by itself after ``--server-lifetime`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import os
import socket
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import httpcore
import httpx

from trove_fetcher.streams import AsyncioBackend
from trove_fetcher.transport import PoolConfig, build_client
from trove_schema.settings import FetcherSettings

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 13\r\n\r\n<html></html>"


# --- server (child process) ---------------------------------------------------------


class _Http(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        count = self.buffer.count(b"\r\n\r\n")
        if count and self.transport is not None:
            self.buffer = self.buffer[self.buffer.rfind(b"\r\n\r\n") + 4 :]
            self.transport.write(RESPONSE * count)


def _serve(port: int, hosts: int, lifetime: float) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        servers = [
            await loop.create_server(_Http, f"127.0.0.{n}", port, backlog=1024)
            for n in range(1, hosts + 1)
        ]
        await asyncio.sleep(lifetime)
        for server in servers:
            server.close()

    asyncio.run(main())


def free_port(hosts: int) -> int:
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port: int = probe.getsockname()[1]
        taken = False
        for n in range(2, hosts + 1):
            with socket.socket() as other:
                try:
                    other.bind((f"127.0.0.{n}", port))
                except OSError:
                    taken = True
                    break
        if not taken:
            return port
    raise RuntimeError("no port free on every loopback address")


def _wait_until_listening(port: int, hosts: int, deadline: float) -> None:
    pending = {f"127.0.0.{n}" for n in range(1, hosts + 1)}
    while pending:
        if time.monotonic() > deadline:
            raise RuntimeError(f"server did not listen on {sorted(pending)[:3]}...")
        for ip in list(pending):
            try:
                socket.create_connection((ip, port), timeout=0.5).close()
                pending.discard(ip)
            except OSError:
                time.sleep(0.05)


# --- client -------------------------------------------------------------------------


class CountingBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
        self.inner = inner
        self.connects = 0

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        self.connects += 1
        return await self.inner.connect_tcp(
            host, port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise NotImplementedError

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


@dataclass(frozen=True)
class Config:
    name: str
    pool: PoolConfig | None  # None: httpx's own AsyncHTTPTransport, unguarded
    #: The streams under the pool: the fetcher's (``trove_fetcher.streams``) or anyio's.
    backend: str = "asyncio"


@dataclass(frozen=True)
class Run:
    seconds: float
    cpu: float
    requests: int
    errors: Counter[str]
    connects: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def cpu_ms(self) -> float:
        return 1000 * self.cpu / self.requests


async def _load(
    send: Callable[[str], Awaitable[int]], urls: list[str], total: int, concurrency: int
) -> tuple[int, Counter[str]]:
    counter = itertools.count()
    errors: Counter[str] = Counter()

    async def worker() -> None:
        while (n := next(counter)) < total:
            try:
                status = await send(urls[n % len(urls)])
                if status != 200:
                    errors[f"HTTP {status}"] += 1
            except httpx.HTTPError as exc:
                errors[type(exc).__name__] += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total, errors


async def _run(config: Config, port: int, args: argparse.Namespace) -> Run:
    hosts = range(1, args.hosts + 1)
    backend = CountingBackend(
        AsyncioBackend() if config.backend == "asyncio" else httpcore.AnyIOBackend()
    )
    if config.pool is None:
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=20)
        transport = httpx.AsyncHTTPTransport(limits=limits, trust_env=False)
        client = httpx.AsyncClient(transport=transport, trust_env=False)
        urls = [f"http://127.0.0.{n}:{port}/" for n in hosts]
    else:
        settings = FetcherSettings(
            allowed_networks=("127.0.0.0/24",),
            resolve=tuple(f"h{n}.bench.test=127.0.0.{n}" for n in hosts),
            connect_timeout=10,
            read_timeout=30,
            request_timeout=60,
        )
        client = build_client(settings, network_backend=backend, pool=config.pool)
        urls = [f"http://h{n}.bench.test:{port}/" for n in hosts]

    async def send(url: str) -> int:
        response = await client.get(url)
        return response.status_code

    async with client:
        await _load(send, urls, min(500, args.requests), args.concurrency)  # warm up
        backend.connects = 0
        cpu0, t0 = time.process_time(), time.perf_counter()
        total, errors = await _load(send, urls, args.requests, args.concurrency)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return Run(seconds, cpu, total, errors, backend.connects)


def _shard_sweep(concurrency: int) -> list[Config]:
    c2 = 2 * concurrency
    configs = [
        Config(
            "1 pool, 100 conns, 100 keep-alive",
            PoolConfig(max_connections=100, max_keepalive_connections=100, shards=1),
        ),
    ]
    for size in (128, 64, 32, 16, 8):
        shards = -(-c2 // size)
        configs.append(
            Config(
                f"{shards} shards of {size}, {c2} conns, all keep-alive, 2 s",
                PoolConfig(
                    max_connections=c2,
                    max_keepalive_connections=c2,
                    keepalive_expiry=2.0,
                    shards=shards,
                ),
            )
        )
    return configs


def _backends(concurrency: int) -> list[Config]:
    """The fetcher's streams against anyio's, with connections kept and without."""
    kept = PoolConfig(max_connections=1000, max_keepalive_connections=1000, shards=8)
    fresh = PoolConfig.for_settings(FetcherSettings(concurrency=concurrency))
    return [
        Config("kept connections, asyncio streams", kept),
        Config("kept connections, anyio streams", kept, backend="anyio"),
        Config("a connection a request, asyncio streams", fresh),
        Config("a connection a request, anyio streams", fresh, backend="anyio"),
    ]


def _configs(concurrency: int) -> list[Config]:
    c2 = 2 * concurrency
    return [
        Config("httpx default transport (100/20), unguarded", None),
        Config(
            "1 pool, 100 conns, 100 keep-alive",
            PoolConfig(max_connections=100, max_keepalive_connections=100, shards=1),
        ),
        Config(
            "1 pool, 100 conns, 20 keep-alive",
            PoolConfig(max_connections=100, max_keepalive_connections=20, shards=1),
        ),
        Config(
            "1 pool, 1000 conns, 1000 keep-alive",
            PoolConfig(max_connections=1000, max_keepalive_connections=1000, shards=1),
        ),
        Config(
            "8 shards, 1000 conns, 1000 keep-alive",
            PoolConfig(max_connections=1000, max_keepalive_connections=1000, shards=8),
        ),
        Config(
            f"1 pool, {c2} conns, no keep-alive",
            PoolConfig(
                max_connections=c2, max_keepalive_connections=0, keepalive_expiry=0.0, shards=1
            ),
        ),
        Config(
            f"{-(-c2 // 32)} shards, {c2} conns, no keep-alive",
            PoolConfig(
                max_connections=c2,
                max_keepalive_connections=0,
                keepalive_expiry=0.0,
                shards=-(-c2 // 32),
            ),
        ),
        Config(
            f"{-(-c2 // 64)} shards, {c2} conns, {concurrency} keep-alive, 5 s",
            PoolConfig(
                max_connections=c2,
                max_keepalive_connections=concurrency,
                keepalive_expiry=5.0,
                shards=-(-c2 // 64),
            ),
        ),
        Config(
            f"{-(-c2 // 32)} shards, {c2} conns, {c2} keep-alive, 2 s",
            PoolConfig(
                max_connections=c2,
                max_keepalive_connections=c2,
                keepalive_expiry=2.0,
                shards=-(-c2 // 32),
            ),
        ),
        Config(
            f"PoolConfig.for_settings(concurrency={concurrency})",
            PoolConfig.for_settings(FetcherSettings(concurrency=concurrency)),
        ),
    ]


async def _bench(port: int, args: argparse.Namespace) -> None:
    configs = {"shards": _shard_sweep, "backends": _backends, "main": _configs}[args.set](
        args.concurrency
    )
    configs = [c for c in configs if args.only in c.name]
    runs: dict[str, list[Run]] = {c.name: [] for c in configs}
    for round_ in range(args.rounds):
        for config in configs:
            runs[config.name].append(await _run(config, port, args))
        print(f"round {round_ + 1}/{args.rounds} done", flush=True)
    reference = next(c.name for c in configs if c.pool is not None)
    ref_rps = statistics.median(r.rps for r in runs[reference])
    ref_cpu = statistics.median(r.cpu_ms for r in runs[reference])
    print(
        f"\n{args.requests} GETs per run, {args.concurrency} concurrent, {args.hosts} hosts, "
        f"median of {args.rounds} rounds; ratios against: {reference}\n"
    )
    print(
        f"{'configuration':<48} {'req/s':>8} {'x':>6} {'CPU ms/req':>11} {'x':>6} "
        f"{'connects':>9} {'errors':>7}"
    )
    for config in configs:
        rs = runs[config.name]
        rps = statistics.median(r.rps for r in rs)
        cpu = statistics.median(r.cpu_ms for r in rs)
        connects = statistics.median(r.connects for r in rs) if config.pool else float("nan")
        errors = sum((r.errors for r in rs), Counter[str]())
        print(
            f"{config.name:<48} {rps:>8.0f} {rps / ref_rps:>6.2f} {cpu:>11.3f} "
            f"{cpu / ref_cpu:>6.2f} {connects:>9.0f} {errors.total():>7}"
            + (f"  {dict(errors)}" if errors else "")
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--hosts", type=int, default=50, choices=range(1, 255))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--set",
        choices=("main", "shards", "backends"),
        default="main",
        help="the table, a shard sweep, or the fetcher's streams against anyio's",
    )
    parser.add_argument("--only", default="", help="run the configurations whose name has this")
    parser.add_argument("--server-lifetime", type=float, default=900.0)
    args = parser.parse_args()
    port = free_port(args.hosts)
    server = multiprocessing.get_context("spawn").Process(
        target=_serve, args=(port, args.hosts, args.server_lifetime), daemon=True
    )
    server.start()
    try:
        _wait_until_listening(port, args.hosts, time.monotonic() + 30)
        print(f"server pid {server.pid} on 127.0.0.1-{args.hosts}:{port}; client pid {os.getpid()}")
        asyncio.run(_bench(port, args))
    finally:
        server.terminate()
        server.join(10)


if __name__ == "__main__":
    main()
