"""The fault suite: a crawl of a local web while every part of the stack is killed.

Two scenarios, each held against a fault-free crawl of the same web in the same run:

* ``single``: one nats-server and one Postgres. While the crawl runs, every service
  is killed with SIGKILL and restarted, nats-server is killed with SIGKILL and
  restarted, Postgres is crash-stopped (SIGKILL of the postmaster) and restarted:
  four rounds of the six, then the crawl must finish.
* ``cluster``: a three-node JetStream cluster with every stream and bucket at
  replicas 3 (the production topology in ``k8s/``); one node is killed with SIGKILL
  and restarted mid-crawl, more than once, the leases' bucket included.

What must hold, from the web server's own log and the tables:

* no URL lost: the same pages, the same page statuses and the same latest outcomes
  as the fault-free crawl;
* no two requests to a host closer than the gap;
* repeated requests (requests beyond the fault-free crawl's, per URL) no more than
  the page fetches in flight when a fetcher or nats-server was killed.

    .venv/bin/python bench/bench_faults.py                 # both scenarios
    .venv/bin/python bench/bench_faults.py --scenario cluster --hosts 8

Traffic stays on 127.0.0.0/8; every wait has a deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import nats
from nats.js.api import DeliverPolicy
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from trove_cli.main import pipeline_backlog
from trove_cli.report import progress_counts
from trove_sandbox.server import RunningSandbox, WitnessRecord, serve_sandbox
from trove_sandbox.web import TLD, SandboxWeb
from trove_schema.events import CrawlCompleted, decode_event
from trove_schema.migrate import upgrade
from trove_schema.topology import (
    CRAWL_COMPLETED,
    EVENTS_STREAM,
    SEEDS_SUBJECT,
    TopologyOptions,
    declare,
    ensure_topology,
)
from trove_stack.nats import free_port, listening, nats_server_binary
from trove_stack.postgres import EmbeddedPostgres, PostgresConfig
from trove_stack.processes import Child

SERVICES = ("recorder", "discovery", "fetcher")


# --- the web ---------------------------------------------------------------------


def build_web(hosts: int, pages: int) -> tuple[SandboxWeb, list[str]]:
    """A sandbox web plus, on every host, a redirect chain and error pages; and the seeds."""
    web = SandboxWeb.generate(hosts=hosts, pages_per_host=pages, seed=11)
    extra: list[str] = []
    for host in web.hosts:
        name = host.name
        web.add_page(name, "/r/chain1", "", status=301, headers={"Location": "/r/chain2"})
        web.add_page(name, "/r/chain2", "", status=302, headers={"Location": "/r/chain3"})
        web.add_page(name, "/r/chain3", "", status=307, headers={"Location": "/r/final.html"})
        web.add_page(name, "/r/final.html", "<title>the end of the chain</title><p>landed</p>")
        web.add_page(name, "/err/500.html", "<p>broken</p>", status=500)
        web.add_page(name, "/err/404.html", "<p>not here</p>", status=404)
        web.add_page(name, "/err/410.html", "<p>gone</p>", status=410)
        extra += ["/r/chain1", "/err/500.html", "/err/404.html", "/err/410.html"]
    return web, extra


def seeds_for(running: RunningSandbox, extra: list[str]) -> list[str]:
    paths = sorted(set(extra))
    return [*running.seeds, *(running.url(h.name, p) for h in running.web.hosts for p in paths)]


# --- the stack -------------------------------------------------------------------


@dataclass
class Cluster:
    """One or three nats-servers on fixed ports, so a killed node comes back where it was."""

    root: Path
    size: int
    nodes: list[Child | None] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    confs: list[Path] = field(default_factory=list)

    @property
    def url(self) -> str:
        return ",".join(f"nats://127.0.0.1:{p}" for p in self.ports)

    def start(self) -> Cluster:
        self.ports = [free_port("127.0.0.1") for _ in range(self.size)]
        routes = [free_port("127.0.0.1") for _ in range(self.size)]
        for i in range(self.size):
            store = self.root / f"n{i}"
            store.mkdir(parents=True, exist_ok=True)
            conf = store / "nats-server.conf"
            lines = [
                f"server_name: n{i}",
                f"listen: 127.0.0.1:{self.ports[i]}",
                "max_payload: 4194304",
                f"jetstream {{ store_dir: {json.dumps(str(store / 'js'))} }}",
            ]
            if self.size > 1:
                peers = ", ".join(f"nats-route://127.0.0.1:{r}" for r in routes)
                lines.append(
                    f"cluster {{ name: trove, listen: 127.0.0.1:{routes[i]}, routes: [{peers}] }}"
                )
            conf.write_text("\n".join(lines) + "\n")
            self.confs.append(conf)
            self.nodes.append(None)
        for i in range(self.size):
            self.start_node(i)
        return self

    def start_node(self, i: int) -> None:
        child = Child(
            f"nats-{i}",
            [str(nats_server_binary()), "-c", str(self.confs[i])],
            log_path=self.root / f"n{i}" / "nats-server.log",
        )
        port = self.ports[i]
        child.wait_until(lambda: listening("127.0.0.1", port), timeout=30, what="listening")
        self.nodes[i] = child

    def kill_node(self, i: int) -> None:
        child = self.nodes[i]
        if child is not None:
            child.proc.kill()
            child.proc.wait(10)
            self.nodes[i] = None

    def stop(self) -> None:
        for child in self.nodes:
            if child is not None:
                child.stop()
        self.nodes = [None] * len(self.nodes)


@dataclass
class Services:
    """The services as processes of their own; a killed one is started again by ``respawn``."""

    root: Path
    env: dict[str, str]
    fetchers: int
    children: dict[str, Child] = field(default_factory=dict)
    starts: Counter[str] = field(default_factory=Counter)

    def names(self) -> list[str]:
        return [
            f"{svc}-{n}"
            for svc in SERVICES
            for n in range(self.fetchers if svc == "fetcher" else 1)
        ]

    def start(self) -> Services:
        for name in self.names():
            self.spawn(name)
        return self

    def spawn(self, name: str) -> None:
        service = name.rsplit("-", 1)[0]
        env = {
            **os.environ,
            **self.env,
            "TROVE_LOG_FORMAT": "json",
            "PYTHONUNBUFFERED": "1",
        }
        self.starts[name] += 1
        self.children[name] = Child(
            name,
            [sys.executable, "-m", f"trove_{service}"],
            log_path=self.root / "logs" / f"{name}.log",
            env=env,
        )

    def kill(self, name: str) -> None:
        child = self.children[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.proc.wait(10)

    def unexpected_exits(self) -> list[str]:
        return [n for n, c in self.children.items() if not c.alive()]

    def stop(self) -> None:
        for child in self.children.values():
            child.stop(timeout=20)


# --- one crawl -------------------------------------------------------------------


@dataclass
class CrawlResult:
    seconds: float
    statuses: dict[str, str]
    outcomes: dict[str, str]
    requests: Counter[tuple[str, str]]
    gap_violations: list[tuple[str, float]]
    smallest_gap: float
    faults: list[str]
    in_flight_during_outages: int
    unexpected_exits: list[str]


async def crawl_state(engine: AsyncEngine) -> tuple[dict[str, str], dict[str, str]]:
    async with engine.connect() as conn:
        statuses = {
            r.url: r.status
            for r in await conn.execute(
                text("SELECT url, status FROM pages WHERE discovered_at IS NOT NULL")
            )
        }
        outcomes = {
            r.url: r.outcome
            for r in await conn.execute(
                text(
                    "SELECT DISTINCT ON (p.url) p.url, c.outcome FROM page_crawls c "
                    "JOIN pages p ON p.id = c.page_id ORDER BY p.url, c.completed_at DESC"
                )
            )
        }
    return statuses, outcomes


async def idle(engine: AsyncEngine, nats_url: str) -> bool:
    """Every queued page finished, no message waiting anywhere, no retry left to publish."""
    try:
        done, queued = await progress_counts(engine)
        async with engine.connect() as conn:
            outbox = (
                await conn.execute(text("SELECT count(*) FROM outbox WHERE published_at IS NULL"))
            ).scalar_one()
        nc = await nats.connect(nats_url.split(","), connect_timeout=2, max_reconnect_attempts=0)
        try:
            backlog = await pipeline_backlog(nc.jetstream(timeout=3))
        finally:
            await nc.close()
    except Exception:
        return False  # something is down: not idle
    return queued > 0 and done == queued and outbox == 0 and backlog == 0


FaultFn = Callable[[], str]


@dataclass(frozen=True, kw_only=True)
class CrawlPlan:
    """One crawl of the web: where its servers keep their data, and what goes wrong."""

    label: str
    root: Path
    web: SandboxWeb
    extra: list[str]
    gap: float
    cluster_size: int
    fetchers: int
    faults: Callable[[Cluster, EmbeddedPostgres, Services], Iterator[tuple[str, FaultFn]]] | None
    fault_every: float
    budget: float


def fresh_folder(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)


async def run_crawl(plan: CrawlPlan) -> CrawlResult:
    root, web, extra, gap = plan.root, plan.web, plan.extra, plan.gap
    cluster_size, fetchers, faults = plan.cluster_size, plan.fetchers, plan.faults
    fault_every, timeout, label = plan.fault_every, plan.budget, plan.label
    await asyncio.to_thread(fresh_folder, root)
    cluster = Cluster(root / "nats", cluster_size).start()
    postgres = EmbeddedPostgres(
        PostgresConfig(data_dir=root / "pg" / "data", port=free_port("127.0.0.1"))
    ).start()
    services: Services | None = None
    engine = create_async_engine(postgres.url, pool_pre_ping=True)
    fault_log: list[str] = []
    kills: list[tuple[float, float]] = []
    crashes: list[str] = []
    try:
        await asyncio.to_thread(upgrade, postgres.url)
        await _topology(cluster.url, cluster_size)
        async with serve_sandbox(web, witness_path=root / "witness.jsonl") as running:
            env = {
                "TROVE_NATS_URL": cluster.url,
                "TROVE_DATABASE_URL": postgres.url,
                "TROVE_REPLICAS": str(cluster_size),
                "TROVE_RESOLVE": web.resolve_setting(),
                "TROVE_ALLOWED_NETWORKS": web.allowed_network(),
                "TROVE_PLATFORM_DOMAINS": TLD,
                "TROVE_MIN_DOMAIN_DELAY_SECONDS": str(gap),
                "TROVE_RETRY_DELAY_SECONDS": "2",
                # A host that fails is left alone for a while (the learned policy):
                # scaled down like the retries, or one 500 page pauses its host a minute.
                "TROVE_HOST_PAUSE_SECONDS": "2",
                "TROVE_HOST_PAUSE_MAX_SECONDS": "30",
                "TROVE_RATE_PAUSE_SECONDS": "2",
                "TROVE_MAX_ATTEMPTS": "3",
                "TROVE_ACK_WAIT_SECONDS": "10",
                "TROVE_REQUEST_TIMEOUT": "8",
                "TROVE_READ_TIMEOUT": "5",
            }
            services = Services(root, env, fetchers).start()
            seeds = seeds_for(running, extra)
            nc = await nats.connect(cluster.url.split(","))
            await nc.publish(SEEDS_SUBJECT, "\n".join(seeds).encode())
            await nc.flush()
            await nc.close()
            started = time.monotonic()
            deadline = started + timeout
            schedule: Iterator[tuple[str, FaultFn]] = iter(())
            if faults is not None:
                schedule = faults(cluster, postgres, services)
            next_fault = started + fault_every
            quiet_since: float | None = None
            while time.monotonic() < deadline:
                now = time.monotonic()
                if now >= next_fault:
                    step = next(schedule, None)
                    if step is not None:
                        kind, act = step
                        down = time.time()
                        fault_log.append(f"{now - started:5.1f}s {await asyncio.to_thread(act)}")
                        if kind in ("fetcher", "nats"):
                            kills.append((down, time.time()))
                    next_fault = now + fault_every
                # A service that exits on its own is started again, as its orchestrator
                # would, and reported: it should have ridden the fault out instead.
                for name in services.unexpected_exits():
                    crashes.append(f"{now - started:5.1f}s {name} exited")
                    services.spawn(name)
                if await idle(engine, cluster.url):
                    quiet_since = quiet_since or now
                    if now - quiet_since >= 3.0:
                        break
                else:
                    quiet_since = None
                await asyncio.sleep(0.5)
            else:
                raise SystemExit(f"{label}: not idle within {timeout:.0f}s")
            seconds = time.monotonic() - started
            exits = [*crashes, *services.unexpected_exits()]
            statuses, outcomes = await crawl_state(engine)
            records = running.witness.requests()
            settled = await completions(cluster.url)
        in_flight = unsettled_at(kills, records, settled)
        gaps: list[tuple[str, float]] = []
        smallest = float("inf")
        by_host: dict[str, list[float]] = {}
        for record in records:
            by_host.setdefault(record.host, []).append(record.monotonic)
        for host, times in by_host.items():
            for a, b in itertools.pairwise(times):
                smallest = min(smallest, b - a)
                if b - a < gap:
                    gaps.append((host, b - a))
        return CrawlResult(
            seconds=seconds,
            statuses=statuses,
            outcomes=outcomes,
            requests=Counter((r.host, r.path) for r in records),
            gap_violations=gaps,
            smallest_gap=smallest,
            faults=fault_log,
            in_flight_during_outages=in_flight,
            unexpected_exits=exits,
        )
    finally:
        if services is not None:
            await asyncio.to_thread(services.stop)
        await engine.dispose()
        postgres.stop()
        cluster.stop()


async def completions(url: str) -> dict[str, list[float]]:
    """When each CrawlCompleted was stored, by host (the stream's own timestamps)."""
    nc = await nats.connect(url.split(","))
    try:
        js = nc.jetstream(timeout=10)
        sub = await js.subscribe(
            CRAWL_COMPLETED, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
        )
        info = await js.stream_info(EVENTS_STREAM, subjects_filter=CRAWL_COMPLETED)
        total = sum((info.state.subjects or {}).values())
        stored: dict[str, list[float]] = {}
        for _ in range(total):
            msg = await sub.next_msg(timeout=10)
            event = decode_event(msg.data)
            assert isinstance(event, CrawlCompleted)
            host = urlsplit(event.url).hostname or ""
            stored.setdefault(host, []).append(msg.metadata.timestamp.timestamp())
        await sub.unsubscribe()
    finally:
        await nc.close()
    return {host: sorted(times) for host, times in stored.items()}


def unsettled_at(
    outages: list[tuple[float, float]],
    records: list[WitnessRecord],
    settled: dict[str, list[float]],
) -> int:
    """Requests whose attempt was under way while a fetcher or nats-server was down.

    An outage runs from the kill to the moment the process was back (a fetcher is
    started again at once; a nats-server after its downtime). One request at a time
    goes to a host, so a request is settled by the first CrawlCompleted of its host
    stored after it (a redirect chain's hops by the one after its last hop). A request
    sent before the end of an outage and settled after its start was in flight during
    it, and may be sent again: that is the bound on repeated requests.
    """
    total = 0
    for down, back in outages:
        for record in records:
            if record.wall >= back:
                continue
            times = settled.get(record.host, [])
            after = bisect.bisect_left(times, record.wall)
            if after == len(times) or times[after] > down:
                total += 1
    return total


async def _topology(url: str, replicas: int) -> None:
    """Streams and buckets at the wanted replicas, once the cluster has a JetStream leader."""
    deadline = time.monotonic() + 60
    while True:
        try:
            nc = await nats.connect(url.split(","), connect_timeout=2)
            try:
                await ensure_topology(
                    nc.jetstream(timeout=5), declare(TopologyOptions(replicas=replicas))
                )
                return
            finally:
                await nc.close()
        except Exception as exc:
            if time.monotonic() > deadline:
                raise SystemExit(f"JetStream not ready: {exc}") from exc
            await asyncio.sleep(0.5)


# --- the faults --------------------------------------------------------------------


#: Rounds of the six faults of the single-node scenario: 24 faults, 3 s apart by default,
#: outlast the fault-free crawl, so faults fall from its start to its end. A storm that
#: went on until the crawl was done could fall in step with one page's redeliveries:
#: every round killed both fetchers 9 s apart, and a redirect chain of three hops a gap
#: apart, fetched right after nats-server came back, never had the 2 s it needs.
SINGLE_ROUNDS = 4


def single_node_faults(
    cluster: Cluster, postgres: EmbeddedPostgres, services: Services
) -> Iterator[tuple[str, FaultFn]]:
    def kill_service(name: str) -> FaultFn:
        def act() -> str:
            services.kill(name)
            services.spawn(name)
            return f"SIGKILL {name}, restarted"

        return act

    def kill_nats() -> str:
        cluster.kill_node(0)
        time.sleep(1.0)  # the outage itself: the services must ride it out
        cluster.start_node(0)
        return "SIGKILL nats-server, restarted after 1 s"

    def crash_postgres() -> str:
        postgres.kill()
        time.sleep(1.0)
        postgres.start()
        return "SIGKILL Postgres (crash stop), restarted after 1 s"

    one_round = [
        ("fetcher", kill_service("fetcher-0")),
        ("service", kill_service("discovery-0")),
        ("nats", kill_nats),
        ("fetcher", kill_service("fetcher-1")),
        ("postgres", crash_postgres),
        ("service", kill_service("recorder-0")),
    ]
    for _ in range(SINGLE_ROUNDS):
        yield from one_round


def cluster_faults(
    cluster: Cluster, postgres: EmbeddedPostgres, services: Services
) -> Iterator[tuple[str, FaultFn]]:
    """Each node once, in turn: a quorum of two stays up, as in a rolling failure."""
    for i in range(cluster.size):

        def act(i: int = i) -> str:
            cluster.kill_node(i)
            time.sleep(2.0)
            cluster.start_node(i)
            return f"SIGKILL nats node n{i}, restarted after 2 s"

        yield "nats", act


# --- the report --------------------------------------------------------------------


def compare(reference: CrawlResult, faulty: CrawlResult, gap: float) -> dict[str, Any]:
    lost = sorted(set(reference.statuses) - set(faulty.statuses))
    status_diff = sorted(
        u for u in reference.statuses if faulty.statuses.get(u) != reference.statuses[u]
    )
    outcome_diff = sorted(
        u for u in reference.outcomes if faulty.outcomes.get(u) != reference.outcomes[u]
    )
    repeated = {
        key: n - reference.requests.get(key, 0)
        for key, n in faulty.requests.items()
        if n > reference.requests.get(key, 0)
    }
    return {
        "pages": len(reference.statuses),
        "requests (fault-free)": sum(reference.requests.values()),
        "requests (faults)": sum(faulty.requests.values()),
        "faults injected": len(faulty.faults),
        "urls lost": len(lost),
        "status differences": len(status_diff),
        "outcome differences": len(outcome_diff),
        "repeated requests": sum(repeated.values()),
        "in flight during outages": faulty.in_flight_during_outages,
        "gaps below the gap": len(faulty.gap_violations) + len(reference.gap_violations),
        "smallest gap (s)": round(min(faulty.smallest_gap, reference.smallest_gap), 3),
        "gap (s)": gap,
        "seconds (fault-free, faults)": (round(reference.seconds), round(faulty.seconds)),
        "unexpected exits": faulty.unexpected_exits,
        "_detail": {
            "lost": lost[:20],
            "status": [(u, reference.statuses[u], faulty.statuses.get(u)) for u in status_diff][
                :20
            ],
            "outcome": [(u, reference.outcomes[u], faulty.outcomes.get(u)) for u in outcome_diff][
                :20
            ],
            "repeated": [f"{h}{p} +{n}" for (h, p), n in sorted(repeated.items())][:30],
            "faults": faulty.faults,
        },
    }


def verdict(figures: dict[str, Any]) -> list[str]:
    failures = []
    for key in ("urls lost", "status differences", "outcome differences", "gaps below the gap"):
        if figures[key]:
            failures.append(f"{key}: {figures[key]}")
    if figures["repeated requests"] > figures["in flight during outages"]:
        failures.append(
            f"repeated requests {figures['repeated requests']} > "
            f"in flight during outages {figures['in flight during outages']}"
        )
    return failures


async def scenario(name: str, args: argparse.Namespace, base: Path) -> tuple[bool, dict[str, Any]]:
    web, extra = build_web(args.hosts, args.pages)
    size = 3 if name == "cluster" else 1
    fault_plan = cluster_faults if size == 3 else single_node_faults
    plans = {
        kind: CrawlPlan(
            label=f"{name}/{kind}",
            root=base / name / kind,
            web=web,
            extra=extra,
            gap=args.gap,
            cluster_size=size,
            fetchers=2,
            faults=None if kind == "reference" else fault_plan,
            fault_every=args.cluster_fault_every if size == 3 else args.fault_every,
            budget=args.timeout,
        )
        for kind in ("reference", "faults")
    }
    print(f"[{name}] fault-free crawl ...", flush=True)
    reference = await run_crawl(plans["reference"])
    print(f"[{name}] crawl with faults ...", flush=True)
    faulty = await run_crawl(plans["faults"])
    figures = compare(reference, faulty, args.gap)
    failures = verdict(figures)
    print(f"\n== {name}: {'PASS' if not failures else 'FAIL'}")
    for key, value in figures.items():
        if not key.startswith("_"):
            print(f"  {key:30} {value}")
    for line in faulty.faults:
        print(f"    {line}")
    if failures:
        print("  failures: " + "; ".join(failures))
        print(json.dumps(figures["_detail"], indent=1, default=str))
    return not failures, figures


async def main_async(args: argparse.Namespace) -> int:
    base = Path(args.state or tempfile.mkdtemp(prefix="trove-faults-"))
    ok = True
    names = ["single", "cluster"] if args.scenario == "both" else [args.scenario]
    for name in names:
        passed, _ = await scenario(name, args, base)
        ok = ok and passed
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=["single", "cluster", "both"], default="both")
    parser.add_argument("--hosts", type=int, default=10)
    parser.add_argument("--pages", type=int, default=20, help="generated pages per host")
    parser.add_argument("--gap", type=float, default=1.0, help="politeness gap, seconds")
    parser.add_argument("--fault-every", type=float, default=3.0, help="seconds between faults")
    parser.add_argument("--cluster-fault-every", type=float, default=8.0)
    parser.add_argument("--timeout", type=float, default=600.0, help="per crawl, seconds")
    parser.add_argument("--state", help="folder for the servers' data (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the state folder")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
