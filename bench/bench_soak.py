"""The soak benchmark: the whole crawl, on scaled time, watched for memory that grows.

Starts the embedded stack (NATS JetStream and Postgres, fast and unsafe, in a temporary
folder), serves a sandbox web of ``--hosts`` sites on 127.0.0.0/8 and a small DNS
server that answers their names with a ``--dns-ttl`` TTL (the fetcher resolves through
it, ``TROVE_DNS_NAMESERVERS``, not through ``TROVE_RESOLVE``), runs discovery, the
recorder and one fetcher as real processes (``trove_cli.local.LocalTrove``) and seeds
every home page. Time is scaled: a page is re-crawled ``--recrawl`` seconds after it was
fetched (every interval pinned to it, however rarely a page changes), robots.txt is
read again every ``--robots-ttl`` seconds, the politeness gap is ``--gap`` seconds, so
a few minutes hold many crawl cycles of every host, each with new robots fetches, DNS
answers that expired, new connections, new events and rows.

Every ``--sample`` seconds it reads the resident memory (``VmRSS``) of every service
process, nats-server and Postgres (the postmaster and its backends, summed, and their
proportional set size, in which a shared buffer counts once), and at
the end prints, per process: RSS when the services were ready, after the first crawl
cycle (the baseline: caches and pools are warm by then), at the end, the change from
the baseline and the peak (``VmHWM``); then the attempts kept by outcome, the DNS
queries the fetcher sent, and the rows and size of the crawl history (``page_crawls``,
kept ``--crawl-history`` seconds once superseded when that is set) and the database.

    .venv/bin/python bench/bench_soak.py [--minutes 4] [--hosts 300] [--pages 4]
        [--recrawl 60] [--robots-ttl 60] [--gap 1] [--dns-ttl 10] [--sample 15]
        [--crawl-history 0]

Loopback only; no assertion: it prints numbers. Not part of ``make test``.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import logging
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

# The repository root, for the benchmarks' shared helpers (bench/_common.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    children_of,
    memory_mib,
    pids_with_cmdline,
    postmaster_pid,
    pss_mib,
    pull_waiting,
    subject_count,
)
from bench._common import (
    log_warnings as _log_warnings,
)
from tests.fetcher._dns import DnsServer, dns_server
from trove_cli.local import LocalTrove
from trove_sandbox import SandboxWeb, serve_sandbox
from trove_sandbox.web import TLD
from trove_schema.bus import Bus
from trove_schema.errors import StackError
from trove_schema.migrate import upgrade
from trove_schema.topology import (
    CRAWL_COMPLETED,
    DISCOVERY_LINKS,
    DISCOVERY_SEEDS,
    EVENTS_STREAM,
    FETCHER,
    RECORDER,
    SEEDS_STREAM,
    SEEDS_SUBJECT,
)
from trove_stack.stack import Stack

READY_TIMEOUT = 90.0
POLL = 0.5
SERVICES = ("recorder", "discovery", "fetcher")


# --- memory -------------------------------------------------------------------------


#: The group whose summed RSS counts shared memory once per process that touched it.
POSTGRES = "postgres (all)"


@dataclass
class Sample:
    at: float
    #: process name -> VmRSS MiB (and Postgres's PSS beside its summed RSS)
    rss: dict[str, float]
    pages: int


def _processes(local: LocalTrove, state: Path) -> dict[str, Callable[[], list[int]]]:
    groups: dict[str, Callable[[], list[int]]] = {}
    for name in [child.name for child in local.children]:
        # By name at each reading: a restarted process replaces its entry.
        groups[name] = lambda name=name: [c.pid for c in local.children if c.name == name]  # type: ignore[misc]
    groups["nats-server"] = lambda: pids_with_cmdline(str(state / "stack" / "nats"))

    def postgres() -> list[int]:
        master = postmaster_pid(state / "stack" / "postgres" / "data")
        return [] if master is None else [master, *children_of(master)]

    groups[POSTGRES] = postgres
    return groups


def _rss(groups: Mapping[str, Callable[[], list[int]]], key: str = "VmRSS") -> dict[str, float]:
    out: dict[str, float] = {}
    for name, pids in groups.items():
        members = pids()
        values = [memory_mib(pid, key) for pid in members]
        out[name] = sum(v for v in values if v is not None)
        if name == POSTGRES and key == "VmRSS":
            # Every backend's RSS includes the shared buffers it has read or written, so
            # the sum grows as backends touch more of them; PSS splits each shared page
            # among its processes and sums to the memory Postgres holds.
            shares = [pss_mib(pid) for pid in members]
            out["postgres (PSS)"] = sum(v for v in shares if v is not None)
    return out


# --- the run ------------------------------------------------------------------------


async def _wait_ready(bus: Bus, local: LocalTrove) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        local.check_alive()
        try:
            ready = (
                await pull_waiting(bus, EVENTS_STREAM, FETCHER) >= 1
                and await pull_waiting(bus, EVENTS_STREAM, RECORDER) >= 1
                and await pull_waiting(bus, EVENTS_STREAM, DISCOVERY_LINKS) >= 1
                and await pull_waiting(bus, SEEDS_STREAM, DISCOVERY_SEEDS) >= 1
            )
        except Exception:  # a consumer not declared yet
            ready = False
        if ready:
            return
        if time.monotonic() > deadline:
            raise StackError(f"services not ready within {READY_TIMEOUT:.0f} s")
        await asyncio.sleep(POLL)


async def _seed(bus: Bus, seeds: Sequence[str]) -> None:
    """As ``trove seed`` does: one core publish that the seeds stream captures."""
    await bus.nc.publish(SEEDS_SUBJECT, "\n".join(seeds).encode())
    await bus.nc.flush()


async def _outcomes(engine: AsyncEngine) -> Counter[str]:
    async with engine.connect() as conn:
        rows = (
            await conn.execute(text("SELECT outcome, count(*) FROM page_crawls GROUP BY outcome"))
        ).all()
    return Counter({str(r[0]): int(r[1]) for r in rows})


async def _history(engine: AsyncEngine) -> tuple[int, float, float]:
    """Rows in ``page_crawls``, its size and the database's (MB)."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT (SELECT count(*) FROM page_crawls), "
                    "pg_total_relation_size('page_crawls'), pg_database_size(current_database())"
                )
            )
        ).one()
    return int(row[0]), row[1] / 1e6, row[2] / 1e6


async def soak(args: argparse.Namespace) -> int:
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    with tempfile.TemporaryDirectory(prefix="trove-soak-") as tmp:
        state = Path(tmp)
        stack = Stack(state_dir=state / "stack", fast_and_unsafe=True)
        atexit.register(stack.stop)
        await asyncio.to_thread(stack.start)
        try:
            await asyncio.to_thread(upgrade, stack.database_url)
            web = SandboxWeb.generate(hosts=args.hosts, pages_per_host=args.pages)
            async with serve_sandbox(web) as sandbox:
                with dns_server() as names:
                    # The sandbox's names, with the TTL the run asks for.
                    for name, ip in sandbox.resolve_map.items():
                        names.records[name] = ((ip,), args.dns_ttl)
                    return await _soak(args, state, stack, web, sandbox.seeds, names)
        finally:
            await asyncio.to_thread(stack.stop)
            atexit.unregister(stack.stop)


async def _soak(
    args: argparse.Namespace,
    state: Path,
    stack: Stack,
    web: SandboxWeb,
    seeds: Sequence[str],
    names: DnsServer,
) -> int:
    env = {
        "TROVE_DNS_NAMESERVERS": names.address,
        "TROVE_DNS_MIN_TTL_SECONDS": "1",
        "TROVE_ALLOWED_NETWORKS": web.allowed_network(),
        "TROVE_PLATFORM_DOMAINS": TLD,
        "TROVE_MIN_DOMAIN_DELAY_SECONDS": str(args.gap),
        "TROVE_RECRAWL_AFTER_SECONDS": str(args.recrawl),
        # Every cycle at the same interval: the schedule would otherwise stretch the
        # interval of a page that never changes, and the run would see few cycles.
        "TROVE_RECRAWL_MIN_SECONDS": str(args.recrawl),
        "TROVE_RECRAWL_MAX_SECONDS": str(args.recrawl),
        "TROVE_ROBOTS_TTL_SECONDS": str(args.robots_ttl),
        "TROVE_LOG_LEVEL": "WARNING",
    }
    if args.crawl_history:
        env["TROVE_CRAWL_HISTORY_RETENTION_SECONDS"] = str(args.crawl_history)
        env["TROVE_AUDIT_PRUNE_INTERVAL_SECONDS"] = str(max(1.0, args.crawl_history / 4))
    bus = await Bus.connect(stack.nats_url, name="trove-soak")
    engine = create_async_engine(stack.database_url)
    local = LocalTrove(
        state_dir=state / "services",
        nats_url=stack.nats_url,
        database_url=stack.database_url,
        services=SERVICES,
        service_env=env,
    )
    samples: list[Sample] = []
    try:
        await asyncio.to_thread(local.start)
        await _wait_ready(bus, local)
        groups = _processes(local, state)
        started = time.monotonic()
        samples.append(Sample(0.0, _rss(groups), 0))
        await _seed(bus, seeds)
        expected = args.hosts * args.pages
        print(
            f"{args.hosts} hosts, {expected} pages, re-crawl every {args.recrawl:g} s, "
            f"robots every {args.robots_ttl:g} s, DNS TTL {args.dns_ttl} s, "
            f"{args.minutes:g} min",
            flush=True,
        )
        end = started + args.minutes * 60
        next_sample = started + args.sample
        baseline: Sample | None = None
        while time.monotonic() < end:
            local.check_alive()
            await asyncio.sleep(min(POLL * 4, max(0.0, end - time.monotonic())))
            if time.monotonic() < next_sample:
                continue
            next_sample += args.sample
            pages = await subject_count(bus, EVENTS_STREAM, CRAWL_COMPLETED)
            sample = Sample(time.monotonic() - started, _rss(groups), pages)
            samples.append(sample)
            if baseline is None and pages >= expected:
                baseline = sample
            fetcher = sample.rss.get("fetcher-0", 0.0)
            rows, _, database = await _history(engine)
            print(
                f"  {sample.at:6.0f} s  {pages:6d} pages  fetcher {fetcher:6.1f} MiB  "
                f"DNS queries {names.total()}  page_crawls {rows} rows  "
                f"database {database:.1f} MB",
                flush=True,
            )
        final = Sample(
            time.monotonic() - started,
            _rss(groups),
            await subject_count(bus, EVENTS_STREAM, CRAWL_COMPLETED),
        )
        peaks = _rss(groups, "VmHWM")
        outcomes = await _outcomes(engine)
        rows, history_mb, database_mb = await _history(engine)
    finally:
        await asyncio.to_thread(local.stop)
        await engine.dispose()
        await bus.close()
    half = next((x for x in samples if x.at >= final.at / 2), final)
    _report(samples[0], baseline, half, final, peaks, outcomes, names.total())
    kept = f" (kept {args.crawl_history:g} s once superseded)" if args.crawl_history else ""
    print(f"page_crawls{kept}: {rows} rows, {history_mb:.1f} MB; the database {database_mb:.1f} MB")
    warnings = _log_warnings(local.state_dir / "logs")
    if warnings:
        print("\nLog warnings and errors:")
        for line, count in warnings.most_common(10):
            print(f"  {count:5d}  {line}")
    return 0


def _report(
    ready: Sample,
    baseline: Sample | None,
    half: Sample,
    final: Sample,
    peaks: Mapping[str, float],
    outcomes: Counter[str],
    dns_queries: int,
) -> None:
    base = baseline or ready
    label = f"after cycle 1 ({base.at:.0f} s)" if baseline else "ready (no full cycle)"
    print(
        f"\nRSS (MiB): ready, {label}, half-way ({half.at:.0f} s), end ({final.at:.0f} s), "
        "end minus baseline, end minus half-way, peak"
    )
    print(
        f"{'process':<16} {'ready':>8} {'baseline':>9} {'half':>8} {'end':>8}"
        f" {'+base':>7} {'+half':>7} {'peak':>8}"
    )
    for name in final.rss:
        start, first = ready.rss.get(name, 0.0), base.rss.get(name, 0.0)
        mid, last = half.rss.get(name, 0.0), final.rss[name]
        print(
            f"{name:<16} {start:8.1f} {first:9.1f} {mid:8.1f} {last:8.1f}"
            f" {last - first:+7.1f} {last - mid:+7.1f}"
            + (f" {peaks[name]:8.1f}" if name in peaks else f" {'-':>8}")
        )
    minutes = final.at / 60
    pages = final.pages
    rate = pages / final.at if final.at else 0.0
    print(f"\n{pages} pages fetched in {minutes:.1f} min ({rate:.1f}/s)")
    print("attempts kept, by outcome: " + ", ".join(f"{k} {v}" for k, v in outcomes.most_common()))
    per_page = dns_queries / pages if pages else 0.0
    print(f"DNS queries: {dns_queries} ({per_page:.2f} a page; A and AAAA count one each)")


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=4.0, help="how long to run")
    parser.add_argument("--hosts", type=int, default=300, help="sandbox hosts, one IP each")
    parser.add_argument("--pages", type=int, default=4, help="pages a host, home included")
    parser.add_argument("--recrawl", type=float, default=60.0, help="re-crawl interval (s)")
    parser.add_argument("--robots-ttl", type=float, default=60.0, help="robots.txt TTL (s)")
    parser.add_argument("--gap", type=float, default=1.0, help="politeness gap (s)")
    parser.add_argument("--dns-ttl", type=int, default=10, help="TTL of the DNS answers (s)")
    parser.add_argument("--sample", type=float, default=15.0, help="seconds between samples")
    parser.add_argument(
        "--crawl-history",
        type=float,
        default=0.0,
        help="TROVE_CRAWL_HISTORY_RETENTION_SECONDS (0: every attempt kept)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 1 <= args.hosts <= 1000:
        raise SystemExit("--hosts must be 1..1000 (one loopback IP each, from 127.0.0.10)")
    if args.robots_ttl < 60:
        raise SystemExit("--robots-ttl is at least 60 s (TROVE_ROBOTS_TTL_SECONDS)")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("trove_schema.bus").setLevel(logging.ERROR)
    try:
        return asyncio.run(soak(args))
    except KeyboardInterrupt:
        return 130
    except asyncio.CancelledError:
        return 143


if __name__ == "__main__":
    raise SystemExit(main())
