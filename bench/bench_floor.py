"""The floor under the throughput targets: what a page's work costs without any of Trove.

``bench_vs_scrapy.py`` measures Trove's CPU per page end to end. This measures, on the
same web (its throughput regime, served by ``witness_server.py`` in its own process,
whose CPU is not counted), the least CPU per page of the parts Trove's design cannot do
without, each with the bare library and none of Trove's code:

* **http**: ``httpx.AsyncClient`` GETs of every page the crawl must fetch, ``--concurrency``
  in flight, keep-alive, bodies read whole (this process's CPU), over the fetcher's
  transport (httpcore pools sharded by origin: httpx#3215). httpx as it comes, with one
  pool as large, is measured too and printed, but is not the floor: it costs more.
* **parse**: ``trove_fetcher.extract.extract`` on those bodies: lxml, ~100 links resolved,
  lingua, the keyword bag. Scrapy's spider in ``bench_vs_scrapy.py`` does the same work.
* **nats**: the JetStream traffic of one page in Trove's design, with bare nats-py on the
  embedded nats-server: a ``PageDiscovered``, a ``CrawlCompleted`` (the real wire size:
  ~100 links, ~60 keywords) and a re-crawl request published with a message id and their
  PubAcks awaited; four KV writes (the lease and its release: compare-and-sets on the
  host's key; the seen key: a create; the host's budget: a compare-and-set); each event
  pulled and acked by the consumers that read it (fetcher 1, discovery 1, recorder 3).
  CPU of this process and of nats-server.

It prints each part in ms of CPU per page, their sum, and the pages/s that sum allows on
this machine's cores at most. Postgres and the recorder's projection are not in the
floor (``bench_recorder.py`` measures them); nor are leases' waits, robots.txt, URL
canonicalization, dedup, retries, metrics or logs. Medians of ``--rounds``.

    .venv/bin/python bench/bench_floor.py [--hosts 300] [--articles 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import nats
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, KeyValueConfig, StorageType, StreamConfig
from nats.js.kv import KeyValue

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import cpu_seconds
from bench.bench_vs_scrapy import Regime, Server, start_server
from trove_fetcher.extract import extract
from trove_fetcher.transport import build_client
from trove_schema.events import (
    CrawlCompleted,
    CrawlOutcome,
    CrawlRequested,
    PageDiscovered,
    Provenance,
    RequestReason,
    Scope,
    utcnow,
)
from trove_schema.settings import FetcherSettings
from trove_schema.urls import domain_of
from trove_stack.nats import EmbeddedNats, NatsConfig


@dataclass
class Round:
    #: httpx as it comes (not in the floor: the pooled transport is cheaper).
    plain_http: float
    #: httpx over the fetcher's sharded pools.
    http: float
    parse: float
    nats_client: float
    nats_server: float

    @property
    def nats(self) -> float:
        return self.nats_client + self.nats_server

    @property
    def total(self) -> float:
        return self.http + self.parse + self.nats


def _cpu() -> float:
    return time.process_time()


# http ---------------------------------------------------------------------------------


Page = tuple[str, bytes, str]


async def fetch_all(
    server: Server, concurrency: int, client: httpx.AsyncClient, *, by_ip: bool
) -> tuple[list[Page], float]:
    """Every expected page with ``client``: (url, body, content type), and the CPU spent.

    ``by_ip``: the client cannot resolve the web's names, so ask for the IP with a Host
    header.
    """
    resolve: dict[str, str] = server.manifest["resolve"]
    pages: list[Page] = []
    queue: asyncio.Queue[str] = asyncio.Queue()
    for url in server.expected:
        queue.put_nowait(url)

    async def worker() -> None:
        while not queue.empty():
            url = queue.get_nowait()
            parts = urlsplit(url)
            host = parts.hostname or ""
            target = url.replace(host, resolve[host], 1) if by_ip else url
            response = await client.get(target, headers={"Host": parts.netloc})
            response.raise_for_status()
            pages.append((url, response.content, response.headers["content-type"]))

    async with client:
        cpu0 = _cpu()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return pages, _cpu() - cpu0


def plain_client(concurrency: int) -> httpx.AsyncClient:
    """httpx as it comes, with a pool as large as Trove's."""
    room = 2 * concurrency
    limits = httpx.Limits(max_connections=room, max_keepalive_connections=room)
    return httpx.AsyncClient(limits=limits, timeout=30.0)


def pooled_client(server: Server, concurrency: int) -> httpx.AsyncClient:
    """httpx over the fetcher's transport: sharded pools (httpx#3215), address guard."""
    settings = FetcherSettings(
        concurrency=concurrency,
        allowed_networks=(server.manifest["allowed_network"],),
        resolve=tuple(server.manifest["resolve_setting"].split(",")),
    )
    return build_client(settings)


def parse_all(pages: Sequence[Page]) -> float:
    cpu0 = _cpu()
    for url, body, content_type in pages:
        extract(body, url=url, content_type=content_type)
    return _cpu() - cpu0


# nats ---------------------------------------------------------------------------------


@dataclass
class Payloads:
    discovered: bytes
    completed: bytes
    requested: bytes


def payloads(url: str, body: bytes, content_type: str) -> Payloads:
    """Real events for one page, for their wire sizes (built before the clock starts)."""
    found = extract(body, url=url, content_type=content_type)
    domain = domain_of(url)
    now = utcnow()
    completed = CrawlCompleted(
        url=url,
        domain=domain,
        scope=Scope(value=domain),
        request_id="r",
        outcome=CrawlOutcome.SUCCESS,
        status_code=200,
        started_at=now,
        completed_at=now,
        title=found.title,
        language=found.language,
        keywords=found.keywords,
        content_hash=found.content_hash,
        links=[link._asdict() for link in found.links],
    )
    discovered = PageDiscovered(
        url=url,
        domain=domain,
        depth=1,
        scope=Scope(value=domain),
        provenance=Provenance(kind="link", source_url=url),
    )
    requested = CrawlRequested(
        url=url, domain=domain, scope=Scope(value=domain), reason=RequestReason.RECRAWL
    )
    return Payloads(discovered.to_wire(), completed.to_wire(), requested.to_wire())


class Traffic:
    """One page's messages in Trove's design, on bare nats-py.

    A host's lease key and budget key are compare-and-set as in Trove, against the
    revision written last; pages of one host take turns on them (Trove's lease lets one
    request per host be in flight).
    """

    def __init__(self, js: nats.js.JetStreamContext, domains: KeyValue, seen: KeyValue) -> None:
        self.js = js
        self.domains = domains
        self.seen = seen
        self.revisions: dict[str, int] = {}
        self.locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    async def cas(self, kv: KeyValue, key: str, value: bytes) -> None:
        revision = self.revisions.get(key)
        if revision is None:
            self.revisions[key] = await kv.create(key, value)
        else:
            self.revisions[key] = await kv.update(key, value, last=revision)

    async def fetcher(self, n: int, host: str, page: Payloads) -> None:
        async with self.locks[host]:
            await self.cas(self.domains, host, b'{"lease":"pod-1","free_at":0}')
            await self.cas(self.domains, host, b'{"lease":null,"free_at":1}')
        await self.js.publish("floor.completed", page.completed, headers=_msg_id(n, "c"))

    async def discovery(self, n: int, host: str, page: Payloads) -> None:
        await self.seen.create(f"u.{n}", b"event-id")
        async with self.locks["b." + host]:
            await self.cas(self.seen, "b." + host, b'{"n":1,"last":"event-id"}')
        await self.js.publish("floor.requested", page.requested, headers=_msg_id(n, "r"))


def _msg_id(n: int, kind: str) -> dict[str, str]:
    return {"Nats-Msg-Id": f"{n}-{kind}"}


async def consume(
    js: nats.js.JetStreamContext,
    durable: str,
    subject: str,
    count: int,
    handle: Callable[[bytes], Awaitable[None]],
    concurrency: int,
) -> None:
    """Pull ``count`` messages in batches, handle up to ``concurrency`` at once, ack each."""
    sub = await js.pull_subscribe(subject, durable=durable, stream="FLOOR")
    done = 0
    while done < count:
        batch = await sub.fetch(min(concurrency, count - done), timeout=30)

        async def one(msg: Msg) -> None:
            await handle(msg.data)
            await msg.ack()

        await asyncio.gather(*(one(msg) for msg in batch))
        done += len(batch)


async def nats_traffic(
    nats_url: str, server_pid: int, pages: Sequence[Payloads], hosts: Sequence[str], width: int
) -> tuple[float, float]:
    """CPU seconds (this process, nats-server) for every page's messages."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    for stream in ("FLOOR", "KV_floor_domains", "KV_floor_seen"):
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(stream)
    await js.add_stream(StreamConfig(name="FLOOR", subjects=["floor.>"], storage=StorageType.FILE))
    kv = [
        await js.create_key_value(
            KeyValueConfig(bucket=name, history=1, storage=StorageType.FILE, direct=True)
        )
        for name in ("floor_domains", "floor_seen")
    ]
    for durable, subject in (
        ("fetcher", "floor.discovered"),
        ("discovery", "floor.completed"),
        ("recorder", "floor.>"),
    ):
        await js.add_consumer(
            "FLOOR",
            ConsumerConfig(
                durable_name=durable, filter_subject=subject, ack_policy=AckPolicy.EXPLICIT
            ),
        )
    traffic = Traffic(js, kv[0], kv[1])
    by_payload = {page.discovered: (n, page) for n, page in enumerate(pages)}
    by_completed = {page.completed: (n, page) for n, page in enumerate(pages)}

    async def fetch(data: bytes) -> None:
        n, page = by_payload[data]
        await traffic.fetcher(n, hosts[n], page)

    async def discover(data: bytes) -> None:
        n, page = by_completed[data]
        await traffic.discovery(n, hosts[n], page)

    async def record(data: bytes) -> None:
        return None

    count = len(pages)
    cpu0, server0 = _cpu(), cpu_seconds(server_pid) or 0.0
    # Discovery's PageDiscovered for each page, then the three consumers as the pages flow.
    for start in range(0, count, width):
        await asyncio.gather(
            *(
                js.publish("floor.discovered", page.discovered, headers=_msg_id(n, "d"))
                for n, page in enumerate(pages[start : start + width], start)
            )
        )
    await asyncio.gather(
        consume(js, "fetcher", "floor.discovered", count, fetch, width),
        consume(js, "discovery", "floor.completed", count, discover, width),
        consume(js, "recorder", "floor.>", 3 * count, record, width),
    )
    cpu1, server1 = _cpu(), cpu_seconds(server_pid) or 0.0
    await nc.close()
    return cpu1 - cpu0, server1 - server0


# the benchmark ------------------------------------------------------------------------


async def bench(args: argparse.Namespace) -> int:
    folder = Path(tempfile.mkdtemp(prefix="trove-floor-"))
    regime = Regime("throughput", args.hosts, args.articles, skew=0.0, gap=0.0)
    server = await start_server(regime, args, folder / "web")
    broker = EmbeddedNats(NatsConfig(folder / "nats")).start()
    cores = os.cpu_count() or 1
    try:
        rounds: list[Round] = []
        for number in range(1, args.rounds + 1):
            _, plain_cpu = await fetch_all(
                server, args.concurrency, plain_client(args.concurrency), by_ip=True
            )
            fetched, http_cpu = await fetch_all(
                server, args.concurrency, pooled_client(server, args.concurrency), by_ip=False
            )
            parse_cpu = parse_all(fetched)
            events = [payloads(*page) for page in fetched]
            hosts = [domain_of(url) for url, _, _ in fetched]
            assert broker.pid is not None
            client_cpu, server_cpu = await nats_traffic(
                broker.url, broker.pid, events, hosts, args.concurrency
            )
            n = len(fetched)
            result = Round(
                plain_http=1000 * plain_cpu / n,
                http=1000 * http_cpu / n,
                parse=1000 * parse_cpu / n,
                nats_client=1000 * client_cpu / n,
                nats_server=1000 * server_cpu / n,
            )
            rounds.append(result)
            print(
                f"round {number}: {n} pages; ms of CPU a page: http {result.http:.2f} "
                f"(plain httpx {result.plain_http:.2f}), "
                f"parse {result.parse:.2f}, nats {result.nats:.2f} (client "
                f"{result.nats_client:.2f}, nats-server {result.nats_server:.2f}); "
                f"sum {result.total:.2f}"
            )
    finally:
        broker.stop()
        server.child.stop()

    def med(attr: str) -> float:
        return float(statistics.median(getattr(r, attr) for r in rounds))

    total = med("total")
    print(
        f"\nFloor, medians of {len(rounds)} round(s), {args.hosts} hosts x "
        f"{args.articles + 2} pages, {cores} cores:"
    )
    print(
        f"  http   {med('http'):5.2f} ms of CPU a page (GET, body read: httpx over the "
        f"fetcher's sharded pools; httpx as it comes: {med('plain_http'):.2f})"
    )
    print(f"  parse  {med('parse'):5.2f} ms (extract: lxml, links, lingua, keywords)")
    print(
        f"  nats   {med('nats'):5.2f} ms (nats-py {med('nats_client'):.2f}, "
        f"nats-server {med('nats_server'):.2f}: 3 events, 4 KV writes, 5 deliveries acked)"
    )
    print(f"  sum    {total:5.2f} ms: at most {1000 * cores / total:.0f} pages/s on {cores} cores")
    return 0


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--hosts", type=int, default=300, help="hosts of the web")
    parser.add_argument("--articles", type=int, default=3, help="articles per host (+ home, feed)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are printed")
    parser.add_argument("--concurrency", type=int, default=64, help="pages in flight")
    parser.add_argument("--page-kb", type=int, default=30, help="page size (KiB)")
    parser.add_argument("--links", type=int, default=100, help="links a page")
    parser.add_argument(
        "--server-max-seconds", type=float, default=1800.0, help="the web stops after this"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(bench(build_parser().parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
