"""The fetcher benchmark: real fetcher processes against the sandbox web, side by side.

Starts the embedded stack (NATS JetStream and Postgres, fast and unsafe, in a temporary
folder), serves a sandbox web of ``--hosts`` sites with ~30 KiB pages of ~100 links and
a robots.txt that allows everything, runs the recorder and ``--fetchers`` fetcher
processes (``trove_cli.local.LocalTrove``), publishes ``PageDiscovered`` for ``--pages``
article URLs spread over the hosts and measures, per run:

* pages/s from the first publish to the N-th ``CrawlCompleted`` (fetch) and to the N-th
  committed ``page_crawls`` row (commit);
* CPU seconds per 1,000 pages of the fetcher processes (``/proc/<pid>/stat``) and of
  the recorder, and the peak RSS (``VmHWM``) of each fetcher process;
* fetch-to-commit latency: ``projected_events.projected_at`` (Postgres ``now()`` in
  the recorder's transaction) minus ``CrawlCompleted.completed_at``, p50 and p95;
* the outcome mix (everything should be a success; anything else is printed);
* where the CPU went during the fetch (cores used by the fetchers, the recorder,
  NATS, Postgres, this process with the sandbox, and anything else on the machine)
  and the requests/s the sandbox served.

Each configuration runs ``--runs`` times, alternating (ABBA...), on fresh streams and
tables; every run first warms up (one home page per host: robots.txt, the language
detector, connections) and is not measured during it. The sandbox's own ceiling is
measured first, with a load generator in another process. Then a table of medians and
the per-round ratio of each configuration to the first one.

    .venv/bin/python bench/bench_fetcher.py [--pages 1000] [--hosts 200]
        [--fetchers 1,2] [--runs 2] [--timeout 60]

Loopback only; no assertion on timings: it prints numbers. A run that does not finish
within ``--timeout`` seconds prints what it got, and the benchmark goes on.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import logging
import math
import os
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

# The repository root, for the benchmarks' shared helpers (bench/_common.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    CpuGroups,
    LoadResult,
    children_of,
    consumer_redelivered,
    cpu_seconds,
    machine_ticks,
    median,
    memory_mib,
    percentile,
    pids_with_cmdline,
    postmaster_pid,
    publish_work,
    pull_waiting,
    reset,
    run_loadgen,
    stored_times,
    stream_messages,
    subject_count,
)
from bench._common import (
    extra_env as _extra_env,
)
from bench._common import (
    fmt as _fmt,
)
from bench._common import (
    log_warnings as _log_warnings,
)
from trove_cli.local import LocalTrove
from trove_sandbox import RunningSandbox, SandboxWeb, serve_sandbox
from trove_schema.bus import Bus
from trove_schema.errors import StackError
from trove_schema.migrate import upgrade
from trove_schema.topology import (
    CRAWL_COMPLETED,
    DEAD_STREAM,
    EVENTS_STREAM,
    FETCHER,
    FETCHER_DEFERRED,
    RECORDER,
    WORK_STREAM,
)
from trove_stack.stack import Stack

ALLOW_ALL = "User-agent: *\nAllow: /\n"
POLL = 0.1
#: Log lines every service writes when it is stopped: not worth reporting.
READY_TIMEOUT = 90.0


@dataclass(kw_only=True)
class Run:
    fetchers: int
    round: int
    pages: int
    completed: int = 0
    committed: int = 0
    #: First publish -> N-th CrawlCompleted / N-th committed page_crawls row (NaN: not reached).
    fetch_seconds: float = math.nan
    commit_seconds: float = math.nan
    #: How long the run was watched (the timeout when it did not finish).
    watched_seconds: float = math.nan
    publish_seconds: float = math.nan
    fetcher_cpu: list[float] = field(default_factory=list)
    fetcher_peak_mib: list[float] = field(default_factory=list)
    fetcher_rss_mib: list[float] = field(default_factory=list)
    recorder_cpu: float = math.nan
    #: CPU seconds of each group of processes during the fetch window.
    group_cpu: dict[str, float] = field(default_factory=dict)
    #: Seconds between the two samples of ``group_cpu``.
    cpu_window: float = math.nan
    machine_busy_cores: float = math.nan
    latency_p50: float = math.nan
    latency_p95: float = math.nan
    #: The latency split where JetStream stored the CrawlCompleted: the fetcher's part
    #: (completed_at -> stored) and the recorder's (stored -> projected), p50 and p95.
    publish_p50: float = math.nan
    publish_p95: float = math.nan
    record_p50: float = math.nan
    record_p95: float = math.nan
    duration_p50_ms: float = math.nan
    outcomes: Counter[str] = field(default_factory=Counter)
    #: (url, what happened) of a few attempts that were not a success.
    failures: list[tuple[str, str]] = field(default_factory=list)
    server_requests: int = 0
    deferred: int = 0
    dead: int = 0
    #: Redeliveries on the fetcher's and the recorder's consumers.
    redelivered: dict[str, int] = field(default_factory=dict)
    #: Warnings and errors in the services' logs: "service: message" -> count.
    log_warnings: Counter[str] = field(default_factory=Counter)
    note: str = ""

    @property
    def fetch_window(self) -> float:
        return self.fetch_seconds if not math.isnan(self.fetch_seconds) else self.watched_seconds

    @property
    def pages_per_s(self) -> float:
        """N / fetch time; when unfinished, what got done per second watched."""
        window = self.fetch_window
        return self.completed / window if window > 0 else math.nan

    @property
    def commit_pages_per_s(self) -> float:
        window = self.commit_seconds
        if math.isnan(window):
            window = self.watched_seconds
        return self.committed / window if window > 0 else math.nan

    @property
    def fetcher_cpu_per_1k(self) -> float:
        return 1000 * sum(self.fetcher_cpu) / self.completed if self.completed else math.nan

    @property
    def recorder_cpu_per_1k(self) -> float:
        return 1000 * self.recorder_cpu / self.committed if self.committed else math.nan

    @property
    def peak_mib(self) -> float:
        return max(self.fetcher_peak_mib, default=math.nan)

    @property
    def server_rps(self) -> float:
        window = self.fetch_window
        return self.server_requests / window if window > 0 else math.nan

    @property
    def cores(self) -> dict[str, float]:
        """Cores used during the fetch window by each group, and by everything else."""
        window = self.cpu_window
        if not window > 0 or not self.group_cpu:
            return {}
        used = {name: cpu / window for name, cpu in self.group_cpu.items()}
        used["other"] = self.machine_busy_cores - sum(used.values())
        used["machine"] = self.machine_busy_cores
        return used

    @property
    def finished(self) -> bool:
        return self.completed >= self.pages and self.committed >= self.pages


@dataclass
class Context:
    args: argparse.Namespace
    bus: Bus
    engine: AsyncEngine
    sandbox: RunningSandbox
    stack: Stack
    state: Path
    env: dict[str, str]
    warmup_urls: list[str]
    urls: list[str]


# --- one run ------------------------------------------------------------------------


async def _count_crawls(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text("SELECT count(*) FROM page_crawls"))).scalar_one())


async def _wait_ready(ctx: Context, local: LocalTrove, fetchers: int) -> None:
    """Until every fetcher and the recorder have a pull request waiting on their consumer."""
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        local.check_alive()
        waiting = await pull_waiting(ctx.bus, EVENTS_STREAM, FETCHER)
        recorder = await pull_waiting(ctx.bus, EVENTS_STREAM, RECORDER)
        if waiting >= fetchers and recorder >= 1:
            return
        if time.monotonic() > deadline:
            raise StackError(f"services not ready within {READY_TIMEOUT:.0f} s")
        await asyncio.sleep(POLL)


async def _warm_up(ctx: Context, local: LocalTrove) -> str:
    """One home page per host; returns a note when it did not finish."""
    await publish_work(ctx.bus, ctx.warmup_urls, origin="bench-warmup")
    want = len(ctx.warmup_urls)
    deadline = time.monotonic() + ctx.args.timeout
    while time.monotonic() < deadline:
        local.check_alive()
        done = await subject_count(ctx.bus, EVENTS_STREAM, CRAWL_COMPLETED)
        if done >= want and await _count_crawls(ctx.engine) >= want:
            return ""
        await asyncio.sleep(POLL)
    return f"warm-up unfinished after {ctx.args.timeout:.0f} s"


def _pids(local: LocalTrove, service: str) -> list[int]:
    return [c.pid for c in local.children if c.name.startswith(service + "-")]


def _cpu_groups(ctx: Context, fetchers: list[int], recorders: list[int]) -> CpuGroups:
    nats = pids_with_cmdline(str(ctx.state / "stack" / "nats"))
    postmaster = postmaster_pid(ctx.state / "stack" / "postgres" / "data")
    postgres = [postmaster] if postmaster else []
    me = [os.getpid()]
    return CpuGroups(
        {
            "fetchers": lambda: fetchers,
            "recorder": lambda: recorders,
            "nats": lambda: nats,
            "postgres": lambda: postgres + [c for p in postgres for c in children_of(p)],
            "bench": lambda: me,
        }
    )


def _cpu(pids: Sequence[int]) -> list[float]:
    return [_nan_if_none(cpu_seconds(pid)) for pid in pids]


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else value


async def _deferred_delivered(bus: Bus) -> int:
    """Deliveries of deferred work to the fetchers so far: TROVE_WORK's own count of
    messages drops as the fetchers purge what they handled."""
    info = await bus.js.consumer_info(WORK_STREAM, FETCHER_DEFERRED)
    return int(info.delivered.consumer_seq or 0) if info.delivered else 0


async def _measure(ctx: Context, local: LocalTrove, run: Run) -> None:
    fetchers = _pids(local, "fetcher")
    recorders = _pids(local, "recorder")
    base_completed = await subject_count(ctx.bus, EVENTS_STREAM, CRAWL_COMPLETED)
    base_committed = await _count_crawls(ctx.engine)
    base_work = await _deferred_delivered(ctx.bus)
    witness = ctx.sandbox.witness
    requests0 = len(witness.requests())
    fetch_cpu0, rec_cpu0 = _cpu(fetchers), _cpu(recorders)
    groups = _cpu_groups(ctx, fetchers, recorders)
    groups0 = groups.sample()
    busy0, total0 = machine_ticks()
    sampled0 = time.perf_counter()

    t0_wall, t0 = time.time(), time.perf_counter()
    ids = await publish_work(ctx.bus, ctx.urls)
    run.publish_seconds = time.perf_counter() - t0

    fetch_cpu1: list[float] | None = None
    rec_cpu1: list[float] | None = None
    deadline = t0 + ctx.args.timeout
    fetch_done = commit_done = math.nan
    while True:
        now = time.perf_counter()
        run.completed = await subject_count(ctx.bus, EVENTS_STREAM, CRAWL_COMPLETED)
        run.completed -= base_completed
        run.committed = await _count_crawls(ctx.engine) - base_committed
        if fetch_cpu1 is None and (run.completed >= run.pages or now > deadline):
            fetch_cpu1 = _cpu(fetchers)
            run.group_cpu = groups.delta(groups0, groups.sample())
            busy1, total1 = machine_ticks()
            run.cpu_window = time.perf_counter() - sampled0
            cores = os.cpu_count() or 1
            run.machine_busy_cores = cores * (busy1 - busy0) / max(1, total1 - total0)
            run.server_requests = len(witness.requests()) - requests0
            if run.completed >= run.pages:
                fetch_done = now - t0
        if rec_cpu1 is None and (run.committed >= run.pages or now > deadline):
            rec_cpu1 = _cpu(recorders)
            if run.committed >= run.pages:
                commit_done = now - t0
        if fetch_cpu1 is not None and rec_cpu1 is not None:
            break
        dead = [c.name for c in local.children if not c.alive()]
        if dead:
            run.note = f"{', '.join(dead)} exited"
            deadline = now  # snapshot what there is on the next pass
        await asyncio.sleep(POLL)
    run.watched_seconds = min(time.perf_counter() - t0, ctx.args.timeout)
    if run.completed < run.pages or run.committed < run.pages:
        unfinished = "unfinished" if run.note else f"unfinished after {ctx.args.timeout:.0f} s"
        run.note = f"{run.note}; {unfinished}" if run.note else unfinished
    assert fetch_cpu1 is not None
    assert rec_cpu1 is not None
    run.fetcher_cpu = [b - a for a, b in zip(fetch_cpu0, fetch_cpu1, strict=True)]
    run.recorder_cpu = sum(b - a for a, b in zip(rec_cpu0, rec_cpu1, strict=True))
    run.fetcher_peak_mib = [_nan_if_none(memory_mib(pid, "VmHWM")) for pid in fetchers]
    run.fetcher_rss_mib = [_nan_if_none(memory_mib(pid, "VmRSS")) for pid in fetchers]
    run.deferred = await _deferred_delivered(ctx.bus) - base_work
    run.dead = await stream_messages(ctx.bus, DEAD_STREAM)
    for durable in (FETCHER, RECORDER):
        run.redelivered[durable] = await consumer_redelivered(ctx.bus, EVENTS_STREAM, durable)
    stored = await stored_times(
        ctx.bus, EVENTS_STREAM, CRAWL_COMPLETED, expected=base_completed + run.completed
    )
    await _crawl_rows(ctx.engine, ids, t0_wall, run, fetch_done, commit_done, stored)
    for k, (url, text_) in enumerate(run.failures):
        host, path = _host_path(url)
        seen = [str(r.status) for r in witness.requests(host) if r.path == path]
        answered = ", ".join(seen) or "nothing"
        run.failures[k] = (url, f"{text_} (the sandbox saw it {len(seen)}x, answered {answered})")


async def _crawl_rows(
    engine: AsyncEngine,
    ids: Sequence[str],
    t0_wall: float,
    run: Run,
    fetch_done: float,
    commit_done: float,
    stored: dict[str, float],
) -> None:
    """Latencies, outcomes and exact end times from the measured attempts' rows."""
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                text(
                    "SELECT c.outcome, c.status_code, c.error_message, c.duration_ms,"
                    " c.completed_at, c.event_id, pe.projected_at, p.url"
                    " FROM page_crawls c"
                    " JOIN projected_events pe ON pe.event_id = c.event_id"
                    " JOIN pages p ON p.id = c.page_id"
                    " WHERE c.request_id = ANY(:ids)"
                ),
                {"ids": [uuid.UUID(i) for i in ids]},
            )
        ).all()
    latencies = [(r.projected_at - r.completed_at).total_seconds() for r in rows]
    run.latency_p50 = percentile(latencies, 50)
    run.latency_p95 = percentile(latencies, 95)
    publish: list[float] = []
    record: list[float] = []
    for r in rows:
        at = stored.get(str(r.event_id))
        if at is not None:
            publish.append(at - r.completed_at.timestamp())
            record.append(r.projected_at.timestamp() - at)
    run.publish_p50, run.publish_p95 = percentile(publish, 50), percentile(publish, 95)
    run.record_p50, run.record_p95 = percentile(record, 50), percentile(record, 95)
    run.duration_p50_ms = percentile([float(r.duration_ms) for r in rows], 50)
    run.outcomes = Counter(r.outcome for r in rows)
    for r in rows:
        if r.outcome != "success" and len(run.failures) < 5:
            status = f" {r.status_code}" if r.status_code else ""
            run.failures.append((r.url, f"{r.outcome}{status}: {r.error_message}"))
    # Exact ends, rather than the polling instants (kept when rows are missing).
    if len(rows) >= run.pages and not math.isnan(fetch_done):
        run.fetch_seconds = max(r.completed_at.timestamp() for r in rows) - t0_wall
    else:
        run.fetch_seconds = fetch_done
    if len(rows) >= run.pages and not math.isnan(commit_done):
        run.commit_seconds = max(r.projected_at.timestamp() for r in rows) - t0_wall
    else:
        run.commit_seconds = commit_done


async def one_run(ctx: Context, fetchers: int, round_: int) -> Run:
    run = Run(fetchers=fetchers, round=round_, pages=len(ctx.urls))
    await reset(ctx.bus, ctx.engine)
    ctx.sandbox.witness.clear()
    local = LocalTrove(
        state_dir=ctx.state / f"run-{round_}-{fetchers}",
        nats_url=ctx.stack.nats_url,
        database_url=ctx.stack.database_url,
        services=("recorder", "fetcher"),
        replicas={"fetcher": fetchers},
        service_env=ctx.env,
    )
    try:
        await asyncio.to_thread(local.start)
        await _wait_ready(ctx, local, fetchers)
        run.note = await _warm_up(ctx, local)
        await _measure(ctx, local, run)
    except Exception as exc:  # a broken run is reported, and the next one goes on
        what = str(exc) if isinstance(exc, StackError) else f"{type(exc).__name__}: {exc}"
        run.note = f"{run.note}; {what}" if run.note else what
    finally:
        await asyncio.to_thread(local.stop)
        run.log_warnings = _log_warnings(local.state_dir / "logs")
    return run


# --- the server's ceiling -----------------------------------------------------------


@dataclass(frozen=True)
class Ceiling:
    load: LoadResult
    served: int
    server_cpu: float

    @property
    def cpu_ms_per_request(self) -> float:
        return 1000 * self.server_cpu / self.served if self.served else math.nan


async def measure_ceiling(ctx: Context) -> Ceiling:
    """The sandbox's requests/s under a lean keep-alive client in another process."""
    sandbox = ctx.sandbox
    targets = []
    for url in ctx.urls:
        host, path = _host_path(url)
        targets.append((sandbox.resolve_map[host], sandbox.port, host, path))
    requests0 = len(sandbox.witness.requests())
    cpu0 = time.process_time()
    load = await run_loadgen(
        targets,
        connections=ctx.args.ceiling_connections,
        max_requests=20 * len(targets),
        max_seconds=ctx.args.ceiling_seconds,
    )
    served = len(sandbox.witness.requests()) - requests0
    ceiling = Ceiling(load, served, time.process_time() - cpu0)
    sandbox.witness.clear()
    return ceiling


# --- reporting ----------------------------------------------------------------------


def _label(fetchers: int) -> str:
    return f"{fetchers} fetcher{'s' if fetchers != 1 else ''}"


def print_run(run: Run) -> None:
    cpu = "/".join(_fmt(c, ".1f") for c in run.fetcher_cpu)
    peak = "/".join(_fmt(m) for m in run.fetcher_peak_mib)
    cores = " ".join(f"{k} {v:.2f}" for k, v in run.cores.items())
    print(
        f"  round {run.round + 1}, {_label(run.fetchers)}: "
        f"{run.completed}/{run.pages} fetched in {_fmt(run.fetch_seconds, '.1f')} s "
        f"({_fmt(run.pages_per_s, '.1f')} pages/s), {run.committed} committed in "
        f"{_fmt(run.commit_seconds, '.1f')} s; publish {_fmt(run.publish_seconds, '.2f')} s; "
        f"fetcher CPU {cpu} s, peak RSS {peak} MiB; fetch->commit p50 "
        f"{_fmt(1000 * run.latency_p50)} ms p95 {_fmt(1000 * run.latency_p95)} ms (fetcher "
        f"publish {_fmt(1000 * run.publish_p50)}/{_fmt(1000 * run.publish_p95)}, recorder "
        f"{_fmt(1000 * run.record_p50)}/{_fmt(1000 * run.record_p95)}); "
        f"cores: {cores}",
        flush=True,
    )
    others = {k: v for k, v in run.outcomes.items() if k != "success"}
    if others:
        print(f"    outcomes other than success: {others}")
        for url, what in run.failures:
            print(f"      {url}: {what}")
    if run.deferred:
        print(
            f"    {run.deferred} deliveries of deferred work (back from TROVE_WORK at a "
            "host's next slot; redeliveries included)"
        )
    if run.dead:
        print(f"    {run.dead} messages parked on TROVE_DEAD")
    redelivered = {k: v for k, v in run.redelivered.items() if v}
    if redelivered:
        print(f"    redelivered messages by consumer: {redelivered}")
    if run.log_warnings:
        top = "; ".join(f"{n}x {m}" for m, n in run.log_warnings.most_common(3))
        print(f"    {run.log_warnings.total()} warnings in the service logs, e.g. {top}")
    if run.note:
        print(f"    note: {run.note}")


def _column(runs: Sequence[Run], attr: str) -> float:
    return median([float(getattr(r, attr)) for r in runs])


def _pair(runs: Sequence[Run], p50: str, p95: str) -> str:
    return f"{_fmt(1000 * _column(runs, p50))}/{_fmt(1000 * _column(runs, p95))}"


def print_summary(args: argparse.Namespace, configs: Sequence[int], runs: Sequence[Run]) -> None:
    cores = os.cpu_count() or 1
    print(
        f"\nMedians of {args.runs} run(s); {args.pages} pages over {args.hosts} hosts, "
        f"~{args.page_kb} KiB and ~{args.links} links a page; {cores} CPU cores, "
        "shared by everything (fetchers, recorder, NATS, Postgres, this process)."
    )
    print(
        f"{'':<13} {'done':>9} {'pages/s':>8} {'pages/s':>8} {'fetcher CPU':>12} "
        f"{'recorder CPU':>13} {'fetcher peak':>13} {'sandbox':>8}"
    )
    print(
        f"{'':<13} {'':>9} {'fetched':>8} {'commit':>8} {'s/1k pages':>12} "
        f"{'s/1k pages':>13} {'RSS MiB':>13} {'req/s':>8}"
    )
    for fetchers in configs:
        rs = [r for r in runs if r.fetchers == fetchers]
        done = f"{sum(r.completed for r in rs)}/{sum(r.pages for r in rs)}"
        print(
            f"{_label(fetchers):<13} {done:>9} {_fmt(_column(rs, 'pages_per_s'), '.1f'):>8} "
            f"{_fmt(_column(rs, 'commit_pages_per_s'), '.1f'):>8} "
            f"{_fmt(_column(rs, 'fetcher_cpu_per_1k'), '.1f'):>12} "
            f"{_fmt(_column(rs, 'recorder_cpu_per_1k'), '.1f'):>13} "
            f"{_fmt(_column(rs, 'peak_mib')):>13} {_fmt(_column(rs, 'server_rps')):>8}"
        )
    print(
        "\nLatency, ms p50/p95: fetch->commit (completed_at -> projected_at), split where"
        " JetStream\nstored the CrawlCompleted (fetcher: publish; recorder: stored -> projected);"
        " GET: the request"
    )
    print(f"{'':<13} {'fetch->commit':>14} {'fetcher':>12} {'recorder':>12} {'GET p50':>8}")
    for fetchers in configs:
        rs = [r for r in runs if r.fetchers == fetchers]
        print(
            f"{_label(fetchers):<13} {_pair(rs, 'latency_p50', 'latency_p95'):>14} "
            f"{_pair(rs, 'publish_p50', 'publish_p95'):>12} "
            f"{_pair(rs, 'record_p50', 'record_p95'):>12} "
            f"{_fmt(_column(rs, 'duration_p50_ms')):>8}"
        )
    names = ("fetchers", "recorder", "nats", "postgres", "bench", "other", "machine")
    print("\nCores busy while fetching (bench: this process, with the sandbox server; other:")
    print("the rest of the machine, e.g. other people's jobs; machine: all of it)")
    print(f"{'':<13}" + "".join(f"{n:>10}" for n in names))
    for fetchers in configs:
        rs = [r for r in runs if r.fetchers == fetchers]
        parts = [median([r.cores.get(n, math.nan) for r in rs]) for n in names]
        print(f"{_label(fetchers):<13}" + "".join(f"{_fmt(v, '.2f'):>10}" for v in parts))
    other = median([r.cores.get("other", math.nan) for r in runs])
    if other > 0.2:
        print(
            f"Note: other processes used a median {other:.2f} cores while fetching: the machine"
            " was not quiet, so these numbers are low and noisy (rerun on an idle machine)."
        )
    if len(configs) > 1:
        reference = configs[0]
        print(f"\nRatios to {_label(reference)}, run side by side (median over rounds):")
        for fetchers in configs[1:]:
            cells = []
            for attr in ("pages_per_s", "commit_pages_per_s", "fetcher_cpu_per_1k"):
                ratios = []
                for round_ in range(args.runs):
                    a = [r for r in runs if r.round == round_ and r.fetchers == reference]
                    b = [r for r in runs if r.round == round_ and r.fetchers == fetchers]
                    if a and b:
                        ratios.append(float(getattr(b[0], attr)) / float(getattr(a[0], attr)))
                cells.append(f"{attr} x{_fmt(median(ratios), '.2f')}")
            print(f"  {_label(fetchers)}: " + ", ".join(cells))


def print_ceiling(ceiling: Ceiling, args: argparse.Namespace) -> None:
    load = ceiling.load
    implied = 1000 / ceiling.cpu_ms_per_request if ceiling.cpu_ms_per_request > 0 else math.nan
    print(
        f"Sandbox ceiling: {_fmt(load.rps)} req/s ({_fmt(load.bytes / load.seconds / 2**20, '.1f')}"
        f" MiB/s) over {load.requests} GETs from {args.ceiling_connections} keep-alive "
        f"connections in another process ({load.errors} errors); the server spent "
        f"{_fmt(ceiling.cpu_ms_per_request, '.2f')} ms CPU a request, so one core serves at most"
        f" ~{_fmt(implied)} req/s. The sandbox runs in this process: during the runs it shares"
        f" {os.cpu_count()} cores with the fetchers, the recorder, NATS and Postgres, so its"
        " share of the machine (bench+sandbox below) is part of the result.",
        flush=True,
    )


# --- main ---------------------------------------------------------------------------


def _urls(web: SandboxWeb, hosts: int, pages: int) -> tuple[list[str], list[str]]:
    """(warm-up URLs: every home page, measured URLs: articles, host after host)."""
    articles = [web.articles(h.name) for h in web.hosts if not h.is_trap]
    measured: list[str] = []
    depth = 0
    while len(measured) < pages:
        for per_host in articles:
            if depth < len(per_host) and len(measured) < pages:
                measured.append(per_host[depth])
        depth += 1
    return web.seeds(), measured


def _prerender(web: SandboxWeb, urls: Sequence[str]) -> None:
    """Render every page once, so that no run pays for rendering (the cache holds 64 MiB)."""
    for url in urls:
        web.page(*_host_path(url))


def _host_path(url: str) -> tuple[str, str]:
    """(host, path) of a sandbox URL (``http://host:port/path``)."""
    _scheme, _empty, netloc, path = url.split("/", 3)
    return netloc.split(":")[0], "/" + path


async def bench(args: argparse.Namespace, configs: Sequence[int]) -> int:
    # SIGTERM unwinds like Ctrl-C: services, servers and the temporary folder go away.
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    with tempfile.TemporaryDirectory(prefix="trove-bench-") as tmp:
        state = Path(tmp)
        started = time.perf_counter()
        stack = Stack(state_dir=state / "stack", fast_and_unsafe=True)
        atexit.register(stack.stop)  # whatever happens, no orphaned server
        await asyncio.to_thread(stack.start)
        try:
            await asyncio.to_thread(upgrade, stack.database_url)
            per_host = -(-args.pages // args.hosts)
            web = SandboxWeb.generate(
                hosts=args.hosts,
                pages_per_host=per_host + 1,
                page_kb=args.page_kb,
                links_per_page=args.links,
            )
            for host in web.hosts:
                web.set_robots(host.name, ALLOW_ALL)
            async with serve_sandbox(web) as sandbox:
                warmup, urls = _urls(web, args.hosts, args.pages)
                _prerender(web, warmup + urls)
                size = len(web.page(*_host_path(urls[0])).body)
                print(
                    f"Stack up in {time.perf_counter() - started:.1f} s; sandbox: {args.hosts}"
                    f" hosts on port {sandbox.port}, pages ~{size // 1024} KiB; "
                    f"{len(urls)} measured pages, {len(warmup)} warm-up pages a run",
                    flush=True,
                )
                bus = await Bus.connect(stack.nats_url, name="trove-bench")
                engine = create_async_engine(stack.database_url)
                ctx = Context(
                    args=args,
                    bus=bus,
                    engine=engine,
                    sandbox=sandbox,
                    stack=stack,
                    state=state,
                    env=_service_env(web, args),
                    warmup_urls=warmup,
                    urls=urls,
                )
                try:
                    return await _bench_runs(ctx, configs)
                finally:
                    await engine.dispose()
                    await bus.close()
        finally:
            await asyncio.to_thread(stack.stop)
            atexit.unregister(stack.stop)
            print(f"Total {time.perf_counter() - started:.0f} s", flush=True)


def _service_env(web: SandboxWeb, args: argparse.Namespace) -> dict[str, str]:
    env = {
        "TROVE_RESOLVE": web.resolve_setting(),
        "TROVE_ALLOWED_NETWORKS": web.allowed_network(),
        "TROVE_MIN_DOMAIN_DELAY_SECONDS": "0",
        "TROVE_LOG_LEVEL": "WARNING",
    }
    env.update(_extra_env(args.env))
    return env


async def _bench_runs(ctx: Context, configs: Sequence[int]) -> int:
    args = ctx.args
    if args.ceiling_seconds > 0:
        try:
            print_ceiling(await measure_ceiling(ctx), args)
        except (RuntimeError, OSError) as exc:
            print(f"Sandbox ceiling not measured: {exc}", flush=True)
    runs: list[Run] = []
    for round_ in range(args.runs):
        order = list(configs) if round_ % 2 == 0 else list(reversed(configs))
        for fetchers in order:
            run = await one_run(ctx, fetchers, round_)
            print_run(run)
            runs.append(run)
    print_summary(args, configs, runs)
    unfinished = [r for r in runs if not r.finished]
    if unfinished:
        print(f"\n{len(unfinished)} run(s) did not finish; their rates count what got done.")
    return 0


def _fetcher_counts(value: str) -> list[int]:
    try:
        counts = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of counts: {value!r}") from None
    if not counts or any(not 1 <= c <= 16 for c in counts):
        raise argparse.ArgumentTypeError("fetcher counts are 1..16, comma-separated")
    return counts


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--pages", type=int, default=1000, help="measured pages a run")
    parser.add_argument(
        "--hosts", type=int, default=200, help="sandbox hosts, one loopback IP each"
    )
    parser.add_argument(
        "--fetchers", type=_fetcher_counts, default=[1, 2], help="configurations, e.g. 1,2"
    )
    parser.add_argument("--runs", type=int, default=2, help="runs of each configuration")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a run may take")
    parser.add_argument("--page-kb", type=int, default=30, help="page size (KiB)")
    parser.add_argument("--links", type=int, default=100, help="links a page")
    parser.add_argument(
        "--ceiling-seconds", type=float, default=5.0, help="sandbox ceiling test (0: skip)"
    )
    parser.add_argument("--ceiling-connections", type=int, default=32)
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="TROVE_X=V",
        help="extra setting for the services (repeatable), e.g. TROVE_CONCURRENCY=128",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 1 <= args.hosts <= 1000:
        raise SystemExit("--hosts must be 1..1000 (one loopback IP each, from 127.0.0.10)")
    if args.pages < 1 or args.runs < 1 or args.timeout <= 0:
        raise SystemExit("--pages, --runs and --timeout must be positive")
    _extra_env(args.env)  # refuse a bad --env before starting anything
    configs: list[Any] = args.fetchers
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("trove_schema.bus").setLevel(logging.ERROR)  # "disconnected" at close
    try:
        return asyncio.run(bench(args, [int(c) for c in configs]))
    except KeyboardInterrupt:
        return 130
    except asyncio.CancelledError:  # SIGTERM
        return 143


if __name__ == "__main__":
    raise SystemExit(main())
