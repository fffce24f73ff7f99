"""Trove against Scrapy: the same crawl of the same local web, side by side.

A sandbox web is served by a separate process (``bench/witness_server.py``) that writes
every request it receives (host, path, arrival time, user agent) to a JSONL witness
log. Both crawlers crawl it from its home pages, obeying robots.txt, one request at a
time per host, the same gap between two requests to a host:

* **Trove**, end to end: the embedded stack (nats-server with JetStream, Postgres in its
  fast-and-unsafe mode), discovery, fetcher(s) and recorder as real processes
  (``trove_cli.local.LocalTrove``); the home pages are published to ``trove.seeds``; a
  run is done when every page the crawl must fetch has a committed ``page_crawls`` row.
* **Scrapy**, in its own process (``bench/scrapy_spider.py``): ``ROBOTSTXT_OBEY``,
  ``CONCURRENT_REQUESTS_PER_DOMAIN = 1``, ``DOWNLOAD_DELAY`` = the gap without jitter,
  AutoThrottle off, lxml parsing, Trove's own language detector and keyword bag, items
  to a JSON-lines file (no database); done when the spider closes.

Regimes (``--regimes``):

* ``throughput``: many hosts of equal size, gap 0: the gap does not bind, only one
  request in flight per host does. Pages/s is what is compared.
* ``politeness``: skewed site sizes (a power law: host *i* has ``articles / (i+1)``
  articles), gap 1 s, URLs discovered while crawling. The makespan is compared with its
  lower bound, the largest site's requests (robots.txt included) less one, times the gap.
* ``known``: the politeness web with every URL handed over at the start (Trove:
  ``PageDiscovered`` events straight to the fetcher; Scrapy: start URLs), nothing followed.
* ``smallweb``: the real small web (``bench/smallweb.py``): ``--smallweb-hosts`` sites
  of skewed sizes, each answering after a delay drawn around its own median (a
  log-normal across hosts, tens of milliseconds to seconds), a few that never answer
  their articles (held past both crawlers' timeout), a share over TLS with a CA made
  for the run, the default gap of 10 s (``--gap`` scales it). Discovered from the home
  pages; Trove sizes its concurrency itself. The bound counts each request's answer
  time and the gap after it (Trove's rule: a host is free one gap after the *end* of a
  response), and the stalled requests' timeout. A second bound applies Trove's rule that
  a slow host's gap is raised (``TROVE_GAP_RESPONSE_FACTOR`` times its answer time);
  Trove's efficiency target is judged on that one.
* ``frontier``: a large frontier, nothing crawled: ``--frontier-urls`` URLs over
  ``--frontier-hosts`` loopback addresses (``bench/frontier_server.py``: robots.txt
  allows all, a page is a few bytes), with a gap of an hour, so each host's robots.txt
  is fetched and every page waits for its slot. Trove gets them as ``PageDiscovered``
  events; Scrapy as requests yielded into its scheduler. Measured: each process's RSS
  before, while and after queueing (sampled every second, then held
  ``--frontier-hold`` s), the streams' and buckets' bytes, the database's size; per
  queued URL.

Each regime runs ``--runs`` rounds, alternating which crawler goes first, on fresh
state (streams, buckets and tables emptied for Trove). Measured per run: pages/s from
the start (the seeds published; the spider opened) to the last page committed (Trove's
``projected_at``) or scraped (Scrapy's ``item_scraped``); the witness log's gaps per
host; CPU seconds of every process of the crawler over that window (``/proc``, and
``getrusage`` inside the Scrapy process); the peak RSS of each process; the time from
fetch to commit (Trove: ``projected_at - completed_at``; Scrapy: ``response_received``
to ``item_scraped``).

    .venv/bin/python bench/bench_vs_scrapy.py [--runs 2] \
        [--regimes throughput,politeness,known,smallweb,frontier]

Loopback only; every wait has a deadline and the benchmark stops by itself. It asserts
nothing about timings: it prints numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import itertools
import json
import logging
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import certifi
import httpx
from nats.js.errors import NotFoundError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

# The repository root, for the benchmarks' shared helpers (bench/_common.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    MIB,
    CpuGroups,
    children_of,
    cpu_seconds,
    frontier_urls,
    machine_ticks,
    median,
    memory_mib,
    percentile,
    pids_with_cmdline,
    postmaster_pid,
    pss_mib,
    publish_work,
    pull_waiting,
    reset,
    stream_messages,
    subject_counts,
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
from bench.cpu_profile import Profiler, py_spy
from bench.cpu_profile import report as profile_report
from trove_cli.local import LocalTrove
from trove_sandbox.web import TLD
from trove_schema.bus import Bus
from trove_schema.errors import StackError
from trove_schema.migrate import upgrade
from trove_schema.settings import CommonSettings
from trove_schema.topology import (
    DISCOVERY_LINKS,
    DISCOVERY_SEEDS,
    DOMAINS_BUCKET,
    EVENTS_STREAM,
    FETCHER,
    RECORDER,
    ROBOTS_BUCKET,
    SEEDS_STREAM,
    SEEDS_SUBJECT,
    SEEN_BUCKET,
    WORK_STREAM,
)
from trove_stack.processes import Child
from trove_stack.stack import Stack

ROOT = Path(__file__).resolve().parent.parent
SERVER_SCRIPT = ROOT / "bench" / "witness_server.py"
SPIDER_SCRIPT = ROOT / "bench" / "scrapy_spider.py"
SMALLWEB_SCRIPT = ROOT / "bench" / "smallweb.py"
POLL = 0.2
#: The ``application_name`` of the benchmark's own Postgres connections. Their backends
#: run its polling query five times a second: in a slow polite crawl that was ~0.3 ms of
#: Postgres CPU a page, charged to Trove until they were left out by this name.
OBSERVER = "trove-bench"
READY_TIMEOUT = 90.0
#: Log lines every service writes when it is stopped: not worth reporting.
CRAWLERS = ("trove", "scrapy")
REGIMES = ("throughput", "politeness", "known", "smallweb", "frontier")
#: The gap of each regime unless ``--gap`` is given.
DEFAULT_GAPS = {"politeness": 1.0, "known": 1.0, "smallweb": 10.0}


@dataclass(frozen=True)
class Regime:
    name: str
    hosts: int
    articles: int
    skew: float
    gap: float
    #: Every URL handed over at the start (nothing discovered).
    known: bool = False
    #: The web served: ``sandbox`` (witness_server.py) or ``smallweb`` (smallweb.py).
    web: str = "sandbox"


@dataclass(kw_only=True)
class Run:
    crawler: str
    regime: str
    round: int
    expected: int
    gap: float
    #: Expected pages the crawler got (Trove: a page_crawls row; Scrapy: an item).
    done: int = 0
    #: Pages fetched that were not expected (Trove: other rows, e.g. blocked by robots).
    extra: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    #: Start -> last expected page committed (Trove) or scraped (Scrapy); NaN: unfinished.
    seconds: float = math.nan
    watched: float = math.nan
    #: CPU seconds of each of the crawler's processes (or groups of them) in the window.
    cpu: dict[str, float] = field(default_factory=dict)
    #: Whole-life CPU of the Scrapy process (imports and shutdown included).
    cpu_whole: float = math.nan
    #: Trove: the Postgres CPU of the benchmark's own connections, left out of ``cpu``.
    cpu_observer: float = math.nan
    #: Peak RSS (VmHWM) of each process, MiB.
    rss: dict[str, float] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    #: Lower bound of the makespan: the largest host's requests, less one, times the gap.
    lower_bound: float = 0.0
    #: The same under Trove's rule (a slow host's gap is raised): ``Server.rule_bound``.
    rule_bound: float = 0.0
    # From the witness log.
    requests: int = 0
    robots_requests: int = 0
    duplicates: int = 0
    disallowed_hits: int = 0
    span: float = math.nan
    min_gap: float = math.nan
    min_gap_host: str = ""
    gaps: int = 0
    gaps_below: int = 0
    #: Of ``gaps_below``, those between a host's robots.txt and the request after it.
    gaps_below_after_robots: int = 0
    #: Wall-clock start (seeds published; spider opened).
    started_at: float = math.nan
    #: Trove: NATS messages in the window by client connection name, in (sent by the
    #: client) and out (delivered to it) together; "all" is the server's own total.
    nats_msgs: dict[str, int] = field(default_factory=dict)
    #: The largest host in the witness log: its first request (s after the start), the
    #: span of its requests and their mean gap.
    #: Trove only: the largest host's answer times as the fetcher measured them (ms),
    #: which its learned gap multiplies.
    big_answers_ms: list[int] = field(default_factory=list)
    big_first: float = math.nan
    big_span: float = math.nan
    big_mean_gap: float = math.nan
    #: Cores used in the window by the witness server, this process and everything else.
    server_cores: float = math.nan
    other_cores: float = math.nan
    warnings: Counter[str] = field(default_factory=Counter)
    #: (url, what happened) of a few expected pages that were not a success.
    failures: list[tuple[str, str]] = field(default_factory=list)
    note: str = ""
    #: ``--profile``: where each service's CPU went, as printed.
    profile: str = ""

    @property
    def window(self) -> float:
        return self.seconds if not math.isnan(self.seconds) else self.watched

    @property
    def finished(self) -> bool:
        return self.done >= self.expected

    @property
    def pages_per_s(self) -> float:
        return self.done / self.window if self.window > 0 else math.nan

    @property
    def cpu_total(self) -> float:
        return sum(self.cpu.values()) if self.cpu else math.nan

    @property
    def cpu_per_1k(self) -> float:
        return 1000 * self.cpu_total / self.done if self.done else math.nan

    @property
    def efficiency(self) -> float:
        """Lower bound / makespan from the start to the last page (0 gap: not defined)."""
        if self.lower_bound <= 0 or not self.finished:
            return math.nan
        return self.lower_bound / self.seconds

    @property
    def request_efficiency(self) -> float:
        """Lower bound / span of the requests the site saw (first to last)."""
        if self.lower_bound <= 0 or not self.finished or not self.span > 0:
            return math.nan
        return self.lower_bound / self.span

    @property
    def rule_efficiency(self) -> float:
        """``rule_bound`` / makespan from the start to the last page."""
        if self.rule_bound <= 0 or not self.finished:
            return math.nan
        return self.rule_bound / self.seconds

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 50)

    @property
    def p95(self) -> float:
        return percentile(self.latencies, 95)


# --- the witness server -----------------------------------------------------------------


@dataclass
class Server:
    child: Child
    witness: Path
    manifest: dict[str, Any]

    @property
    def expected(self) -> list[str]:
        return list(self.manifest["expected"])

    def mark(self) -> int:
        """Where the witness log ends now (read what comes after with ``records``)."""
        return self.witness.stat().st_size if self.witness.exists() else 0

    def records(self, since: int) -> list[dict[str, Any]]:
        """Requests logged after ``since`` (complete lines only)."""
        with open(self.witness, "rb") as f:
            f.seek(since)
            data = f.read()
        lines = data.split(b"\n")
        return [json.loads(line) for line in lines[:-1] if line.strip()]

    def lower_bound(self, gap: float, timeout: float = 0.0) -> float:
        """The largest host's requests (its pages and robots.txt) less one, times the gap.

        On the small web, the slowest host to get through: each request's answer time
        (a stalled one: ``timeout``) and the gap after each but the last.
        """
        per_host: dict[str, int] = self.manifest["per_host"]
        latency: dict[str, float] | None = self.manifest.get("latency_per_host")
        if latency is None:
            return max(per_host.values(), default=0) * gap
        stalled: dict[str, int] = self.manifest.get("stalled_per_host", {})
        return max(
            (
                (per_host.get(h, 0) + stalled.get(h, 0)) * gap
                + latency[h]
                + stalled.get(h, 0) * timeout
                for h in latency
            ),
            default=0.0,
        )

    def rule_bound(self, gap: float, timeout: float, factor: float, max_delay: float) -> float:
        """``lower_bound`` under Trove's own rule: a host's gap is its response time
        times ``factor`` (within ``max_delay``) when that is longer than ``gap``.

        Its response time is the mean of its answers (the fetcher smooths them); the
        gap after robots.txt is ``gap`` (robots.txt teaches no response time). Small
        web only: elsewhere the same as ``lower_bound``.
        """
        per_host: dict[str, int] = self.manifest["per_host"]
        latency: dict[str, float] | None = self.manifest.get("latency_per_host")
        if latency is None:
            return self.lower_bound(gap, timeout)
        stalled: dict[str, int] = self.manifest.get("stalled_per_host", {})

        def host(h: str) -> float:
            pages = per_host.get(h, 0)
            learned = max(gap, min(factor * latency[h] / (pages + 1), max(max_delay, gap)))
            gaps = pages + stalled.get(h, 0)
            stall = stalled.get(h, 0) * timeout
            return min(gaps, 1) * gap + max(gaps - 1, 0) * learned + latency[h] + stall

        return max(map(host, latency), default=0.0)

    @property
    def largest_host(self) -> str:
        per_host: dict[str, int] = self.manifest["per_host"]
        return max(per_host, key=lambda h: per_host[h])

    @property
    def hosts(self) -> set[str]:
        return set(self.manifest["resolve"])


async def start_server(regime: Regime, args: argparse.Namespace, folder: Path) -> Server:
    witness = folder / "witness.jsonl"
    manifest = folder / "manifest.json"
    command = [
        sys.executable,
        str(SMALLWEB_SCRIPT if regime.web == "smallweb" else SERVER_SCRIPT),
        f"--hosts={regime.hosts}",
        f"--articles={regime.articles}",
        f"--skew={regime.skew}",
        f"--page-kb={args.page_kb}",
        f"--links={args.links}",
        f"--witness={witness}",
        f"--manifest={manifest}",
        f"--max-seconds={args.server_max_seconds}",
    ]
    if regime.web == "smallweb":
        command += [
            f"--tls-share={args.smallweb_tls_share}",
            f"--stall-hosts={args.smallweb_stall_hosts}",
            f"--latency-median={args.smallweb_latency_median}",
            # Held past both crawlers' timeout.
            f"--stall-seconds={3 * args.smallweb_timeout}",
        ]
    child = Child(
        f"witness-{regime.name}",
        command,
        log_path=folder / "server.log",  # Child creates the folder
        cwd=ROOT,
    )
    # Rendering 1,000 hosts' pages takes a while on a busy machine.
    deadline = time.monotonic() + 300
    while not manifest.exists():
        if not child.alive():
            raise StackError(f"witness server exited: {child.tail()}")
        if time.monotonic() > deadline:
            child.stop()
            raise StackError("witness server not serving within 120 s")
        await asyncio.sleep(0.1)
    return Server(child, witness, json.loads(manifest.read_text()))


def _key(url: str) -> tuple[str, str]:
    """(host, path) of a URL: what both crawlers and the manifest agree on."""
    parts = urlsplit(url)
    return (parts.hostname or "").lower(), parts.path or "/"


def witness_analysis(run: Run, records: Sequence[dict[str, Any]], server: Server) -> None:
    """Requests, duplicates, robots.txt, /private/ hits, the gaps per host, the largest host."""
    hosts = server.hosts
    mine = [r for r in records if r.get("host") in hosts]
    run.requests = len(mine)
    run.robots_requests = sum(1 for r in mine if r.get("path") == "/robots.txt")
    seen = Counter((r["host"], r["path"]) for r in mine)
    run.duplicates = sum(n - 1 for n in seen.values() if n > 1)
    run.disallowed_hits = sum(1 for r in mine if str(r.get("path", "")).startswith("/private/"))
    if mine:
        run.span = max(r["monotonic"] for r in mine) - min(r["monotonic"] for r in mine)
    by_host: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for r in mine:
        by_host[r["host"]].append((float(r["monotonic"]), str(r.get("path", ""))))
    smallest = math.inf
    for host, times in by_host.items():
        times.sort()
        for (a, path), (b, _) in itertools.pairwise(times):
            gap = b - a
            run.gaps += 1
            if gap < run.gap:
                run.gaps_below += 1
                run.gaps_below_after_robots += path == "/robots.txt"
            if gap < smallest:
                smallest, run.min_gap_host = gap, host
    run.min_gap = smallest if run.gaps else math.nan
    big = sorted(r["wall"] for r in mine if r["host"] == server.largest_host)
    if len(big) > 1:
        run.big_first = big[0] - run.started_at
        run.big_span = big[-1] - big[0]
        run.big_mean_gap = run.big_span / (len(big) - 1)


# --- Trove ------------------------------------------------------------------------------


@dataclass
class Context:
    args: argparse.Namespace
    stack: Stack
    bus: Bus
    #: The benchmark's own connections (``OBSERVER``): polling for the end of a crawl.
    engine: AsyncEngine
    state: Path
    #: Postgres backends serving ``engine``: their CPU is the benchmark's, not Trove's.
    observers: set[int] = field(default_factory=set)


def _trove_env(ctx: Context, server: Server, regime: Regime) -> dict[str, str]:
    m = server.manifest
    env = {
        "TROVE_RESOLVE": str(m["resolve_setting"]),
        "TROVE_ALLOWED_NETWORKS": str(m["allowed_network"]),
        # The benchmark's hosts are a thousand sites under one name.
        "TROVE_PLATFORM_DOMAINS": TLD,
        "TROVE_MIN_DOMAIN_DELAY_SECONDS": str(regime.gap),
        "TROVE_LOG_LEVEL": "WARNING",
        "TROVE_MAX_DEPTH": str(max_depth(server)),
    }
    if regime.gap == 0:
        # No politeness at all, as Scrapy's DOWNLOAD_DELAY 0 without AutoThrottle: the
        # learned gap (10x a host's response time) is politeness too.
        env["TROVE_GAP_RESPONSE_FACTOR"] = "0"
    paths = [_as_in_the_image(ctx.state)]
    if regime.web == "smallweb":
        env["TROVE_READ_TIMEOUT"] = str(ctx.args.smallweb_timeout)
        if m.get("ca_file"):
            paths.insert(0, _certifi_with_ca(Path(m["ca_file"])))
    env["PYTHONPATH"] = os.pathsep.join(map(str, paths))
    env.update(_extra_env(ctx.args.env))
    return env


#: Installed in this virtualenv for Scrapy (and the tests' TLS certificates), not in
#: Trove's image (``Dockerfile``). nats-py imports aiohttp, and pypdf cryptography,
#: whenever they are there: ~16 MiB of a fetcher's RSS that no deployed pod has.
NOT_IN_THE_IMAGE = ("aiohttp", "cryptography")


def _as_in_the_image(state: Path) -> Path:
    """A folder that, first on Trove's ``PYTHONPATH``, hides ``NOT_IN_THE_IMAGE``.

    Each is a package whose import fails as a missing one does, so Trove's services
    import what they import in their image, and their memory is a pod's.
    """
    folder = state / "image-shim"
    for name in NOT_IN_THE_IMAGE:
        package = folder / name
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text(
            f'"""{name} is not installed in Trove\'s image."""\n\n'
            f"raise ModuleNotFoundError({name!r} + ' is not in the image', name={name!r})\n"
        )
    return folder


def _certifi_with_ca(ca_file: Path) -> Path:
    """A folder holding a ``certifi`` whose bundle is certifi's own plus ``ca_file``.

    The fetcher has no setting for an extra CA: it builds its SSL context from certifi
    with ``trust_env=False``, so ``SSL_CERT_FILE`` is not read. Put first on the
    fetcher's ``PYTHONPATH``, this package is the certifi it imports; the fetcher's
    code is unchanged and verifies every certificate as it would on the web.
    """
    folder = ca_file.parent / "certifi-shim"
    package = folder / "certifi"
    package.mkdir(parents=True, exist_ok=True)
    bundle = package / "cacert.pem"
    bundle.write_text(Path(certifi.where()).read_text() + "\n" + ca_file.read_text())
    (package / "__init__.py").write_text(
        '"""certifi, with the benchmark CA appended to its bundle."""\n\n'
        "from pathlib import Path\n\n"
        "__version__ = 'bench'\n\n\n"
        "def where() -> str:\n"
        "    return str(Path(__file__).with_name('cacert.pem'))\n\n\n"
        "def contents() -> str:\n"
        "    return Path(where()).read_text()\n"
    )
    return folder


def _bound(ctx: Context, server: Server, regime: Regime) -> float:
    return server.lower_bound(regime.gap, ctx.args.smallweb_timeout)


def _rule_bound(ctx: Context, server: Server, regime: Regime) -> float:
    """The bound under Trove's gap rule, with its settings (``--env`` may change them)."""
    env = _extra_env(ctx.args.env)
    fields = CommonSettings.model_fields

    def setting(name: str) -> float:
        return float(env.get(f"TROVE_{name.upper()}", fields[name].default))

    return server.rule_bound(
        regime.gap,
        ctx.args.smallweb_timeout,
        setting("gap_response_factor"),
        setting("max_domain_delay_seconds"),
    )


def _timeout(ctx: Context, server: Server, regime: Regime) -> float:
    """Seconds a run may take: ``--timeout``, or three times the bound and two minutes.

    Generous, because a host's gap may be raised above the configured one (a slow
    host's learned gap), which the configured-gap bound does not know.
    """
    bound = max(_bound(ctx, server, regime), _rule_bound(ctx, server, regime))
    return max(float(ctx.args.timeout), 3 * bound + 120)


def max_depth(server: Server) -> int:
    """Depth limit for both crawlers: comfortably above what the web needs."""
    return max(5, int(server.manifest["max_depth"]) + 3)


async def _wait_ready(ctx: Context, local: LocalTrove) -> None:
    """Until every service has a pull request waiting on each of its consumers."""
    wanted = (
        (EVENTS_STREAM, FETCHER, ctx.args.fetchers),
        (EVENTS_STREAM, RECORDER, 1),
        (SEEDS_STREAM, DISCOVERY_SEEDS, 1),
        (EVENTS_STREAM, DISCOVERY_LINKS, 1),
    )
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        local.check_alive()
        waiting = [await pull_waiting(ctx.bus, s, d) >= n for s, d, n in wanted]
        if all(waiting):
            return
        if time.monotonic() > deadline:
            raise StackError(f"services not ready within {READY_TIMEOUT:.0f} s")
        await asyncio.sleep(0.1)


def _service_pids(local: LocalTrove, service: str) -> list[int]:
    return [c.pid for c in local.children if c.name.startswith(service + "-")]


def _trove_groups(ctx: Context, local: LocalTrove) -> tuple[CpuGroups, dict[str, list[int]]]:
    nats = pids_with_cmdline(str(ctx.state / "stack" / "nats"))
    postmaster = postmaster_pid(ctx.state / "stack" / "postgres" / "data")
    pg = [postmaster] if postmaster else []
    services = {name: _service_pids(local, name) for name in ("discovery", "fetcher", "recorder")}
    groups = CpuGroups(
        {
            "discovery": lambda: services["discovery"],
            "fetcher": lambda: services["fetcher"],
            "recorder": lambda: services["recorder"],
            "nats": lambda: nats,
            "postgres": lambda: [
                pid
                for pid in pg + [c for p in pg for c in children_of(p)]
                if pid not in ctx.observers
            ],
        }
    )
    return groups, {**services, "nats": nats, "postgres": pg}


async def _observe(ctx: Context) -> None:
    """Note the backends serving the benchmark's own connections (``OBSERVER``)."""
    async with ctx.engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT pid FROM pg_stat_activity WHERE application_name = :name"),
            {"name": OBSERVER},
        )
        ctx.observers.update(int(pid) for (pid,) in rows)


async def _nats_messages(ctx: Context) -> dict[str, int]:
    """Messages nats-server has taken in and sent out so far, by client connection name.

    Connections of one name add up (the fetcher pods). "all" is the server's own count,
    which also holds JetStream's internal traffic (deliveries, acks, KV, schedules).
    """
    nats = ctx.stack.nats
    if nats is None or not nats.monitor_url:
        return {}

    async with httpx.AsyncClient(base_url=nats.monitor_url, timeout=5) as client:
        varz, connz = [
            (await client.get(path)).raise_for_status().json()
            for path in ("/varz", "/connz?limit=4096")
        ]
    counts: Counter[str] = Counter()
    for conn in connz.get("connections", []):
        counts[conn.get("name") or "unnamed"] += conn["in_msgs"] + conn["out_msgs"]
    counts["all"] = varz["in_msgs"] + varz["out_msgs"]
    return dict(counts)


async def _crawled(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        result = await conn.execute(text("SELECT count(DISTINCT page_id) FROM page_crawls"))
        return int(result.scalar_one())


async def _crawled_keys(engine: AsyncEngine) -> set[tuple[str, str]]:
    async with engine.connect() as conn:
        urls = await conn.execute(
            text("SELECT DISTINCT p.url FROM page_crawls c JOIN pages p ON p.id = c.page_id")
        )
        return {_key(u) for u in urls.scalars()}


async def trove_run(ctx: Context, server: Server, regime: Regime, round_: int) -> Run:
    run = Run(
        crawler="trove",
        regime=regime.name,
        round=round_,
        expected=len(server.expected),
        gap=regime.gap,
        lower_bound=_bound(ctx, server, regime),
        rule_bound=_rule_bound(ctx, server, regime),
    )
    await reset(ctx.bus, ctx.engine)
    local = LocalTrove(
        state_dir=ctx.state / f"trove-{regime.name}-{round_}",
        nats_url=ctx.stack.nats_url,
        database_url=ctx.stack.database_url,
        services=("recorder", "discovery", "fetcher"),
        replicas={"fetcher": ctx.args.fetchers},
        service_env=_trove_env(ctx, server, regime),
    )
    try:
        await asyncio.to_thread(local.start)
        await _wait_ready(ctx, local)
        await _trove_crawl(ctx, server, regime, local, run)
    except Exception as exc:  # a broken run is reported, and the next one goes on
        what = str(exc) if isinstance(exc, StackError) else f"{type(exc).__name__}: {exc}"
        run.note = f"{run.note}; {what}" if run.note else what
    finally:
        await asyncio.to_thread(local.stop)
        run.warnings = _log_warnings(local.state_dir / "logs")
    return run


async def _trove_crawl(
    ctx: Context, server: Server, regime: Regime, local: LocalTrove, run: Run
) -> None:
    expected = {_key(u) for u in server.expected}
    groups, pids = _trove_groups(ctx, local)
    mark = server.mark()
    profiler = None
    if ctx.args.profile:
        folder = ctx.args.profile / f"{run.regime}-{run.round + 1}"
        nats = ctx.stack.nats
        profiler = await Profiler.attach(
            folder, pids, _timeout(ctx, server, regime) + 60, nats.profile_url if nats else ""
        )
    await _observe(ctx)
    observer = CpuGroups({"observer": lambda: sorted(ctx.observers)})
    observer0 = observer.sample()
    cpu0 = groups.sample()
    msgs0 = await _nats_messages(ctx)
    start = Snapshot.take(server)

    t0 = run.started_at = time.time()
    if regime.known:
        await publish_work(ctx.bus, server.expected, origin="bench-vs-scrapy")
    else:
        for seed in server.manifest["seeds"]:
            await ctx.bus.nc.publish(SEEDS_SUBJECT, str(seed).encode())
        await ctx.bus.nc.flush()

    deadline = time.monotonic() + _timeout(ctx, server, regime)
    complete = False
    while time.monotonic() < deadline:
        dead = [c.name for c in local.children if not c.alive()]
        if dead:
            run.note = f"{', '.join(dead)} exited"
            break
        if await _crawled(ctx.engine) >= len(expected):
            complete = expected <= await _crawled_keys(ctx.engine)
            if complete:
                break
        await asyncio.sleep(POLL)
    run.watched = time.time() - t0
    await _observe(ctx)  # a connection the pool opened during the crawl
    run.cpu = CpuGroups.delta(cpu0, groups.sample())
    msgs = await _nats_messages(ctx)
    run.nats_msgs = {k: n - msgs0.get(k, 0) for k, n in msgs.items() if n > msgs0.get(k, 0)}
    run.cpu_observer = CpuGroups.delta(observer0, observer.sample())["observer"]
    profile = await profiler.stop() if profiler else None
    _window_cores(run, start, Snapshot.take(server), run.cpu_total)
    for name, members in pids.items():
        peaks = [memory_mib(pid, "VmHWM") for pid in members]
        for k, peak in enumerate(p for p in peaks if p is not None):
            run.rss[f"{name}-{k}" if len(members) > 1 else name] = peak
    postmaster = pids["postgres"]
    backends = [memory_mib(c, "VmHWM") for p in postmaster for c in children_of(p)]
    if backends:
        run.rss["postgres backend (max)"] = max(b for b in backends if b is not None)

    async with ctx.engine.connect() as conn:
        rows = (
            await conn.execute(
                text(
                    "SELECT p.url, c.outcome, c.status_code, c.error_message, c.completed_at,"
                    " c.duration_ms, pe.projected_at FROM page_crawls c"
                    " JOIN pages p ON p.id = c.page_id"
                    " JOIN projected_events pe ON pe.event_id = c.event_id"
                )
            )
        ).all()
    ends: list[float] = []
    for row in rows:
        if _key(row.url) in expected:
            run.outcomes[row.outcome] += 1
            if row.outcome != "success" and len(run.failures) < 5:
                status = f" {row.status_code}" if row.status_code else ""
                run.failures.append((row.url, f"{row.outcome}{status}: {row.error_message}"))
            run.latencies.append((row.projected_at - row.completed_at).total_seconds())
            ends.append(row.projected_at.timestamp())
            if _key(row.url)[0] == server.largest_host and row.duration_ms is not None:
                run.big_answers_ms.append(row.duration_ms)
        else:
            run.extra[row.outcome] += 1
    run.done = len({_key(r.url) for r in rows} & expected)
    if profile:
        run.profile = profile_report(profile, run.cpu, run.done)
    if complete and ends:
        run.seconds = max(ends) - t0
    elif not run.note:
        run.note = f"unfinished after {_timeout(ctx, server, regime):.0f} s"
    records = server.records(mark)
    witness_analysis(run, records, server)
    for k, (url, what) in enumerate(run.failures):
        host, path = _key(url)
        seen = [str(r["status"]) for r in records if r["host"] == host and r["path"] == path]
        answered = ", ".join(seen) or "nothing"
        run.failures[k] = (url, f"{what} (the server saw it {len(seen)}x, answered {answered})")


# --- Scrapy -----------------------------------------------------------------------------


async def scrapy_run(ctx: Context, server: Server, regime: Regime, round_: int) -> Run:
    run = Run(
        crawler="scrapy",
        regime=regime.name,
        round=round_,
        expected=len(server.expected),
        gap=regime.gap,
        lower_bound=_bound(ctx, server, regime),
        rule_bound=_rule_bound(ctx, server, regime),
    )
    folder = ctx.state / f"scrapy-{regime.name}-{round_}"
    config = {
        "manifest": str(server.witness.parent / "manifest.json"),
        "mode": "known" if regime.known else "discover",
        "gap": regime.gap,
        "concurrency": ctx.args.scrapy_concurrency,
        "max_depth": max_depth(server),
        "items": str(folder / "items.jsonl"),
        "stats": str(folder / "stats.json"),
        "timeout": _timeout(ctx, server, regime),
        "download_timeout": ctx.args.smallweb_timeout if regime.web == "smallweb" else 30.0,
    }
    _write_json(folder / "config.json", config)
    mark = server.mark()
    start = Snapshot.take(server)
    started = time.time()
    child = Child(
        "scrapy",
        [sys.executable, str(SPIDER_SCRIPT), str(folder / "config.json")],
        log_path=folder / "scrapy.log",
        cwd=ROOT,
    )
    try:
        limit = _timeout(ctx, server, regime) + 30
        deadline = time.monotonic() + limit
        while child.alive():
            if time.monotonic() > deadline:
                run.note = f"killed after {limit:.0f} s"
                break
            await asyncio.sleep(0.05)
    finally:
        await asyncio.to_thread(child.stop)
    run.watched = time.time() - started
    end = Snapshot.take(server)
    _scrapy_results(run, server, folder, child, start, end)
    witness_analysis(run, server.records(mark), server)
    return run


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def _scrapy_results(
    run: Run, server: Server, folder: Path, child: Child, start: Snapshot, end: Snapshot
) -> None:
    """What the spider wrote: its stats (times, CPU, RSS, latencies) and its items."""
    try:
        stats = json.loads((folder / "stats.json").read_text())
    except (OSError, ValueError):
        run.note = f"{run.note}; no stats: {child.tail(5)}".strip("; ")
        _window_cores(run, start, end, math.nan)
        return
    expected = {_key(u) for u in server.expected}
    got: set[tuple[str, str]] = set()
    with open(folder / "items.jsonl", encoding="utf-8") as f:
        for line in f:
            item = json.loads(line)
            key = _key(item["url"])
            if key in expected:
                got.add(key)
                run.outcomes["success" if item["status"] == 200 else str(item["status"])] += 1
            else:
                run.extra[str(item["status"])] += 1
    run.done = len(got)
    opened = run.started_at = float(stats["opened_at"])
    run.watched = float(stats["closed_at"]) - opened
    if run.finished:
        run.seconds = float(stats["last_item_at"]) - opened
    else:
        run.note = f"{run.note}; closed: {stats['reason']}".strip("; ")
    run.cpu = {"scrapy": float(stats["cpu_closed"]) - float(stats["cpu_opened"])}
    run.cpu_whole = float(stats["cpu_closed"])
    run.rss = {"scrapy": float(stats["maxrss_kib"]) / 1024}
    run.latencies = [float(v) for v in stats["latencies"]]
    # The process lived inside the window, so its whole-life CPU is its share of it.
    _window_cores(run, start, end, run.cpu_whole)
    run.warnings = Counter(
        line.strip()[:100]
        for line in (folder / "scrapy.log").read_text(errors="replace").splitlines()
        if " WARNING: " in line or " ERROR: " in line
    )


# --- shared measurement -----------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """CPU of the witness server and of this process, and of the machine, at one instant."""

    server: float
    bench: float
    busy: int
    total: int
    at: float

    @classmethod
    def take(cls, server: Server) -> Snapshot:
        busy, total = machine_ticks()
        return cls(
            server=cpu_seconds(server.child.pid) or 0.0,
            bench=time.process_time(),
            busy=busy,
            total=total,
            at=time.perf_counter(),
        )


def _window_cores(run: Run, start: Snapshot, end: Snapshot, crawler_cpu: float) -> None:
    """Cores the witness server used in the window, and what nobody here used ("other")."""
    window = end.at - start.at
    if window <= 0:
        return
    machine = (os.cpu_count() or 1) * (end.busy - start.busy) / max(1, end.total - start.total)
    run.server_cores = (end.server - start.server) / window
    bench = (end.bench - start.bench) / window
    run.other_cores = machine - run.server_cores - bench - crawler_cpu / window


# --- the large frontier -----------------------------------------------------------------

#: The frontier's hosts: consecutive loopback addresses, served by frontier_server.py
#: (robots.txt allows all, a page is a few bytes), so every page waits for its slot.
FRONTIER_BASE_IP = "127.64.0.0"
FRONTIER_SCRIPT = ROOT / "bench" / "frontier_server.py"
#: Streams and buckets whose bytes grow with the frontier (buckets are KV_<name>).
FRONTIER_STORES = (
    EVENTS_STREAM,
    WORK_STREAM,
    f"KV_{DOMAINS_BUCKET}",
    f"KV_{ROBOTS_BUCKET}",
    f"KV_{SEEN_BUCKET}",
)


@dataclass(kw_only=True)
class FrontierRun:
    crawler: str
    urls: int
    hosts: int
    #: From the first URL handed over to the last one waiting.
    queue_seconds: float = math.nan
    #: RSS (MiB) of each process group: before the frontier, once queued, after the hold.
    before: dict[str, float] = field(default_factory=dict)
    queued: dict[str, float] = field(default_factory=dict)
    end: dict[str, float] = field(default_factory=dict)
    #: Peak RSS (VmHWM, MiB) over the process's life.
    peak: dict[str, float] = field(default_factory=dict)
    #: Bytes each store (stream, bucket, database, nats-server's folder) grew by.
    storage: dict[str, float] = field(default_factory=dict)
    #: URLs still waiting at the end (Trove: TROVE_WORK messages; Scrapy: its scheduler).
    waiting: int = 0
    #: (seconds from the start, {group: RSS MiB}) every second or so.
    series: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    #: Messages on each subject of the record and the work stream at the end (Trove).
    subjects: dict[str, int] = field(default_factory=dict)
    warnings: Counter[str] = field(default_factory=Counter)
    note: str = ""

    def per_url(self, group: str) -> float:
        """Bytes of RSS a queued URL costs ``group``: end (after the hold) less before."""
        if group not in self.end or group not in self.before or not self.urls:
            return math.nan
        return (self.end[group] - self.before[group]) * MIB / self.urls

    @property
    def total_per_url(self) -> float:
        return sum(self.per_url(g) for g in self.end)


def _rss_groups(pids: dict[str, list[int]], key: str = "VmRSS") -> dict[str, float]:
    """Summed RSS (MiB) of each group.

    Postgres is its postmaster and backends, summed by PSS (their shared buffers would
    count once per backend in RSS); its peak (``VmHWM``) is the postmaster's alone.
    """
    found: dict[str, float] = {}
    for name, members in pids.items():
        if name == "postgres" and key == "VmRSS":
            members = members + [c for p in members for c in children_of(p)]
            readings = [pss_mib(pid) for pid in members]
        else:
            readings = [memory_mib(pid, key) for pid in members]
        found[name] = sum(m for m in readings if m is not None)
    return found


async def _store_bytes(ctx: Context) -> dict[str, float]:
    sizes: dict[str, float] = {}
    for name in FRONTIER_STORES:
        try:
            info = await ctx.bus.js.stream_info(name)
        except NotFoundError:
            continue
        sizes[name] = float(info.state.bytes)
    async with ctx.engine.connect() as conn:
        size = await conn.execute(text("SELECT pg_database_size(current_database())"))
        sizes["postgres database"] = float(size.scalar_one())
    sizes["nats-server folder"] = float(_folder_bytes(ctx.state / "stack" / "nats"))
    return sizes


def _folder_bytes(folder: Path) -> int:
    total = 0
    for parent, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(parent, name)).st_size
    return total


async def _sample_rss(
    pids: dict[str, list[int]], series: list[tuple[float, dict[str, float]]], t0: float
) -> None:
    while True:
        series.append((time.monotonic() - t0, _rss_groups(pids)))
        await asyncio.sleep(1.0)


async def _consumed(ctx: Context) -> bool:
    """Every handed-over event taken and acknowledged by the fetcher and the recorder."""
    for durable in (FETCHER, RECORDER):
        info = await ctx.bus.js.consumer_info(EVENTS_STREAM, durable)
        if info.num_pending or info.num_ack_pending:
            return False
    return True


async def trove_frontier(ctx: Context, regime: Regime, port: int) -> FrontierRun:
    args = ctx.args
    run = FrontierRun(crawler="trove", urls=args.frontier_urls, hosts=regime.hosts)
    await reset(ctx.bus, ctx.engine)
    env = {
        "TROVE_ALLOWED_NETWORKS": f"{FRONTIER_BASE_IP}/10",
        "TROVE_MIN_DOMAIN_DELAY_SECONDS": str(regime.gap),
        "TROVE_MAX_DOMAIN_DELAY_SECONDS": str(regime.gap),
        "TROVE_LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(_as_in_the_image(ctx.state)),
    }
    env.update(_extra_env(args.env))
    local = LocalTrove(
        state_dir=ctx.state / "trove-frontier",
        nats_url=ctx.stack.nats_url,
        database_url=ctx.stack.database_url,
        services=("recorder", "discovery", "fetcher"),
        replicas={"fetcher": args.fetchers},
        service_env=env,
    )
    sampler: asyncio.Task[None] | None = None
    try:
        await asyncio.to_thread(local.start)
        await _wait_ready(ctx, local)
        _, pids = _trove_groups(ctx, local)
        run.before = _rss_groups(pids)
        stored = await _store_bytes(ctx)
        t0 = time.monotonic()
        sampler = asyncio.create_task(_sample_rss(pids, run.series, t0))
        urls = frontier_urls(urls=run.urls, hosts=run.hosts, base_ip=FRONTIER_BASE_IP, port=port)
        while chunk := list(itertools.islice(urls, 5000)):
            await publish_work(ctx.bus, chunk, origin="bench-frontier")
        deadline = t0 + args.frontier_timeout
        while not await _consumed(ctx):
            local.check_alive()
            if time.monotonic() > deadline:
                run.note = f"not all queued after {args.frontier_timeout:.0f} s"
                break
            await asyncio.sleep(POLL)
        else:
            run.queue_seconds = time.monotonic() - t0
        run.queued = _rss_groups(pids)
        await asyncio.sleep(args.frontier_hold)
        run.end = _rss_groups(pids)
        run.peak = _rss_groups(pids, "VmHWM")
        after = await _store_bytes(ctx)
        run.storage = {k: v - stored.get(k, 0.0) for k, v in after.items()}
        run.waiting = await stream_messages(ctx.bus, WORK_STREAM)
        for stream in (EVENTS_STREAM, WORK_STREAM):
            for subject, count in (await subject_counts(ctx.bus, stream)).items():
                # trove.events.<kind>.<what>, trove.schedules.page.<hash>: by kind
                kind = ".".join(subject.split(".")[: 3 if ".schedules." in subject else 4])
                run.subjects[kind] = run.subjects.get(kind, 0) + int(count)
    except Exception as exc:  # a broken run is reported, and the next one goes on
        what = str(exc) if isinstance(exc, StackError) else f"{type(exc).__name__}: {exc}"
        run.note = f"{run.note}; {what}" if run.note else what
    finally:
        if sampler is not None:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        await asyncio.to_thread(local.stop)
        run.warnings = _log_warnings(local.state_dir / "logs")
    return run


async def scrapy_frontier(ctx: Context, regime: Regime, port: int) -> FrontierRun:
    args = ctx.args
    run = FrontierRun(crawler="scrapy", urls=args.frontier_urls, hosts=regime.hosts)
    folder = ctx.state / "scrapy-frontier"
    config = {
        "mode": "frontier",
        "frontier": {
            "urls": run.urls,
            "hosts": run.hosts,
            "base_ip": FRONTIER_BASE_IP,
            "port": port,
        },
        "hold": args.frontier_hold,
        "gap": regime.gap,
        "concurrency": args.scrapy_concurrency,
        "max_depth": 5,
        "items": str(folder / "items.jsonl"),
        "stats": str(folder / "stats.json"),
        "timeout": args.frontier_timeout + args.frontier_hold,
    }
    _write_json(folder / "config.json", config)
    child = Child(
        "scrapy",
        [sys.executable, str(SPIDER_SCRIPT), str(folder / "config.json")],
        log_path=folder / "scrapy.log",
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + args.frontier_timeout + args.frontier_hold + 60
        while child.alive():
            if time.monotonic() > deadline:
                run.note = "killed: the frontier was not held in time"
                break
            await asyncio.sleep(0.2)
    finally:
        await asyncio.to_thread(child.stop)
    try:
        stats = json.loads((folder / "stats.json").read_text())
    except (OSError, ValueError):
        run.note = f"{run.note}; no stats: {child.tail(5)}".strip("; ")
        return run
    opened = float(stats["opened_at"])
    run.before = {"scrapy": float(stats["rss_opened"])}
    run.queued = {"scrapy": float(stats["rss_queued"])}
    samples = stats["samples"]
    run.end = {"scrapy": float(samples[-1][1])} if samples else {}
    run.peak = {"scrapy": float(stats["maxrss_kib"]) / 1024}
    run.series = [(float(t), {"scrapy": float(rss)}) for t, rss, _ in samples]
    run.waiting = int(samples[-1][2]) if samples else 0
    if stats["queued_at"]:
        run.queue_seconds = float(stats["queued_at"]) - opened
    if stats["reason"] != "frontier held":
        run.note = f"closed: {stats['reason']}"
    return run


def print_frontier(regime: Regime, runs: Sequence[FrontierRun], hold: float) -> None:
    print(
        f"\nfrontier: {regime.articles} URLs over {regime.hosts} hosts, gap {regime.gap:g} s "
        f"(each host's robots.txt is fetched; every page waits), held {hold:g} s"
    )
    print(
        f"{'':<8} {'process':<10} {'RSS MiB before':>14} {'queued':>8} {'held':>8} "
        f"{'peak':>8} {'B / URL':>8}"
    )
    for run in runs:
        for group in run.end:
            print(
                f"{run.crawler:<8} {group:<10} {_fmt(run.before.get(group, math.nan), '.0f'):>14}"
                f" {_fmt(run.queued.get(group, math.nan), '.0f'):>8} "
                f"{_fmt(run.end[group], '.0f'):>8} {_fmt(run.peak.get(group, math.nan), '.0f'):>8}"
                f" {_fmt(run.per_url(group), '.0f'):>8}"
            )
        print(
            f"{run.crawler:<8} {'all':<10} RSS {_fmt(run.total_per_url, '.0f')} bytes a queued "
            f"URL; {run.waiting} waiting at the end; queued in {_fmt(run.queue_seconds, '.1f')} s"
        )
        if run.storage:
            stores = ", ".join(
                f"{k} {v / MIB:.1f} MiB ({v / run.urls:.0f} B/URL)" for k, v in run.storage.items()
            )
            print(f"{'':<8} on disk: {stores}")
        if run.series:
            step = max(1, len(run.series) // 12)
            picked = run.series[::step] + ([run.series[-1]] if len(run.series) % step else [])
            for group in run.end:
                points = " ".join(f"{rss.get(group, math.nan):.0f}" for _, rss in picked)
                print(f"{'':<8} {group} RSS MiB every ~{step} s: {points}")
        if run.subjects:
            counts = ", ".join(f"{k} {v}" for k, v in sorted(run.subjects.items()))
            print(f"{'':<8} messages at the end: {counts}")
        if run.warnings:
            top = "; ".join(f"{n}x {m}" for m, n in run.warnings.most_common(3))
            print(f"    {run.warnings.total()} warnings in the logs, e.g. {top}")
        if run.note:
            print(f"    note: {run.note}")
    by = {r.crawler: r for r in runs}
    if "trove" in by and "scrapy" in by and by["scrapy"].total_per_url > 0:
        print(
            "Trove / Scrapy, RSS a queued URL (every process): "
            f"x{by['trove'].total_per_url / by['scrapy'].total_per_url:.2f}",
            flush=True,
        )


async def _frontier(ctx: Context, regime: Regime) -> None:
    folder = ctx.state / "web-frontier"
    ready = folder / "ready.json"
    server = Child(
        "frontier-server",
        [
            sys.executable,
            str(FRONTIER_SCRIPT),
            f"--hosts={regime.hosts}",
            f"--base-ip={FRONTIER_BASE_IP}",
            f"--ready={ready}",
            f"--max-seconds={ctx.args.server_max_seconds}",
        ],
        log_path=folder / "server.log",
        cwd=ROOT,
    )
    atexit.register(server.stop)
    try:
        deadline = time.monotonic() + 300
        while not ready.exists():
            if not server.alive() or time.monotonic() > deadline:
                raise StackError(f"frontier server not serving: {server.tail()}")
            await asyncio.sleep(0.1)
        port = int(json.loads(ready.read_text())["port"])
        print(
            f"\nfrontier: {regime.articles} URLs over {regime.hosts} hosts on "
            f"{FRONTIER_BASE_IP} upwards (pid {server.pid}, port {port}), gap {regime.gap:g} s",
            flush=True,
        )
        runs = []
        for crawler in ctx.args.crawlers:
            if crawler == "trove":
                runs.append(await trove_frontier(ctx, regime, port))
            else:
                runs.append(await scrapy_frontier(ctx, regime, port))
        print_frontier(regime, runs, ctx.args.frontier_hold)
    finally:
        await asyncio.to_thread(server.stop)
        atexit.unregister(server.stop)


# --- reporting --------------------------------------------------------------------------


def print_run(run: Run) -> None:
    cpu = ", ".join(f"{k} {v:.1f}" for k, v in run.cpu.items())
    rss = ", ".join(f"{k} {v:.0f}" for k, v in run.rss.items())
    print(
        f"  {run.regime} round {run.round + 1}, {run.crawler}: {run.done}/{run.expected} pages"
        f" in {_fmt(run.seconds, '.1f')} s ({_fmt(run.pages_per_s, '.1f')} pages/s); "
        f"{run.requests} requests ({run.robots_requests} robots.txt, {run.duplicates} repeated,"
        f" {run.disallowed_hits} disallowed), span {_fmt(run.span, '.1f')} s; min gap "
        f"{_fmt(1000 * run.min_gap, '.1f')} ms ({run.min_gap_host}), {run.gaps_below} of "
        f"{run.gaps} gaps < {run.gap:g} s ({run.gaps_below_after_robots} right after robots.txt)"
        f"; CPU s: {cpu}"
        + (f" (whole process {run.cpu_whole:.1f})" if not math.isnan(run.cpu_whole) else "")
        + (
            f" (the benchmark's own Postgres queries, left out: {run.cpu_observer:.2f})"
            if not math.isnan(run.cpu_observer)
            else ""
        )
        + f"; peak RSS MiB: {rss}; fetch->commit p50/p95 {_fmt(1000 * run.p50)}/"
        f"{_fmt(1000 * run.p95)} ms; server {_fmt(run.server_cores, '.2f')} cores, other "
        f"{_fmt(run.other_cores, '.2f')}",
        flush=True,
    )
    if run.gap > 0:
        print(
            f"    largest host: first request {_fmt(run.big_first, '.2f')} s after the start, "
            f"its requests span {_fmt(run.big_span, '.2f')} s, mean gap "
            f"{_fmt(1000 * run.big_mean_gap)} ms"
            + (
                "; answer times measured by Trove: median"
                f" {statistics.median(run.big_answers_ms):.0f} ms, max {max(run.big_answers_ms)} ms"
                if run.big_answers_ms
                else ""
            )
        )
    if run.rule_bound != run.lower_bound:
        print(
            f"    efficiency e2e: {_fmt(run.efficiency, '.3f')} of the configured-gap bound "
            f"({run.lower_bound:.1f} s), {_fmt(run.rule_efficiency, '.3f')} of the bound "
            f"under Trove's gap rule ({run.rule_bound:.1f} s)"
        )
    if run.nats_msgs and run.done:
        per_page = ", ".join(
            f"{k.removeprefix('trove-')} {n / run.done:.1f}"
            for k, n in sorted(run.nats_msgs.items(), key=lambda kv: -kv[1])
        )
        print(f"    NATS messages a page, in and out: {per_page}")
    others = {k: v for k, v in run.outcomes.items() if k != "success"}
    if others:
        print(f"    outcomes other than success: {dict(others)}")
        for url, what in run.failures:
            print(f"      {url}: {what}")
    if run.extra:
        print(f"    pages beyond the expected ones: {dict(run.extra)}")
    if run.warnings:
        top = "; ".join(f"{n}x {m}" for m, n in run.warnings.most_common(3))
        print(f"    {run.warnings.total()} warnings in the logs, e.g. {top}")
    if run.note:
        print(f"    note: {run.note}")
    if run.profile:
        print(run.profile, flush=True)


def _med(runs: Sequence[Run], attr: str) -> float:
    return median([float(getattr(r, attr)) for r in runs])


def _ratio(runs: Sequence[Run], attr: str) -> float:
    """Median over rounds of Trove's value / Scrapy's, each round's pair run side by side."""
    ratios = []
    for round_ in sorted({r.round for r in runs}):
        pair = {r.crawler: float(getattr(r, attr)) for r in runs if r.round == round_}
        if "trove" in pair and "scrapy" in pair and pair["scrapy"] > 0:
            ratios.append(pair["trove"] / pair["scrapy"])
    return median(ratios)


def _peak(runs: Sequence[Run]) -> str:
    """Largest peak RSS of each process name over the runs, the biggest first."""
    peaks: dict[str, float] = {}
    for run in runs:
        for name, mib in run.rss.items():
            peaks[name] = max(peaks.get(name, 0.0), mib)
    return ", ".join(f"{k} {v:.0f}" for k, v in sorted(peaks.items(), key=lambda kv: -kv[1]))


def print_summary(regime: Regime, server: Server, runs: Sequence[Run]) -> None:
    m = server.manifest
    sizes = sorted(m["per_host"].values(), reverse=True)
    print(
        f"\n{regime.name}: {len(m['expected'])} pages over {regime.hosts} hosts "
        f"(pages per host {sizes[0]}..{sizes[-1]}), ~{m['page_bytes_mean'] / 1024:.0f} KiB and "
        f"~{m['links_per_page']} links a page, gap {regime.gap:g} s, "
        + ("every URL given up front" if regime.known else "discovered from the home pages")
        + f"; medians of {len({r.round for r in runs})} run(s)"
    )
    medians = m.get("host_medians")
    if medians:
        q = [percentile(medians, p) for p in (5, 50, 95)]
        print(
            f"Hosts' median answer times: p5 {1000 * q[0]:.0f} ms, p50 {1000 * q[1]:.0f} ms, "
            f"p95 {1000 * q[2]:.0f} ms, max {1000 * max(medians):.0f} ms; "
            f"{len(m['tls_hosts'])} hosts over TLS; {len(m['stalled'])} pages on "
            f"{len(m['stalled_per_host'])} hosts never answer (not expected)"
        )
    header = (
        f"{'':<8} {'done':>9} {'pages/s':>8} {'makespan':>9} {'efficiency':>11} "
        f"{'min gap':>8} {'gaps <':>7} {'CPU s/1k':>9} {'fetch->commit':>14}"
    )
    print(header)
    print(
        f"{'':<8} {'':>9} {'':>8} {'s':>9} {'e2e / req':>11} {'ms':>8} {'gap':>7} "
        f"{'pages':>9} {'p50/p95 ms':>14}"
    )
    for crawler in CRAWLERS:
        rs = [r for r in runs if r.crawler == crawler]
        if not rs:
            continue
        done = f"{sum(r.done for r in rs)}/{sum(r.expected for r in rs)}"
        eff = f"{_fmt(_med(rs, 'efficiency'), '.2f')}/{_fmt(_med(rs, 'request_efficiency'), '.2f')}"
        gaps = min((r.min_gap for r in rs if not math.isnan(r.min_gap)), default=math.nan)
        below = sum(r.gaps_below for r in rs)
        lat = f"{_fmt(1000 * _med(rs, 'p50'))}/{_fmt(1000 * _med(rs, 'p95'))}"
        print(
            f"{crawler:<8} {done:>9} {_fmt(_med(rs, 'pages_per_s'), '.1f'):>8} "
            f"{_fmt(_med(rs, 'seconds'), '.1f'):>9} {eff:>11} {_fmt(1000 * gaps, '.1f'):>8} "
            f"{below:>7} {_fmt(_med(rs, 'cpu_per_1k'), '.1f'):>9} {lat:>14}"
        )
        print(f"{'':<8} peak RSS MiB: {_peak(rs)}")
    bound = max((r.lower_bound for r in runs), default=0.0)
    if regime.web == "smallweb":
        print(
            f"Lower bound of the makespan: {bound:.1f} s (the slowest host to get through:"
            " each request's answer time, a stalled one's timeout, and the gap after each but"
            " the last, as Trove counts it; Scrapy's delay runs from the start of a request,"
            " so it can beat the bound); efficiency = lower bound / makespan (e2e: start to"
            " last page; req: first to last request the site saw)."
        )
        rule = max((r.rule_bound for r in runs), default=0.0)
        effs = ", ".join(
            f"{c} {_fmt(_med([r for r in runs if r.crawler == c], 'rule_efficiency'), '.2f')}"
            for c in CRAWLERS
            if any(r.crawler == c for r in runs)
        )
        print(
            f"Under Trove's gap rule (a host's gap is at least its mean answer time times "
            f"TROVE_GAP_RESPONSE_FACTOR, within TROVE_MAX_DOMAIN_DELAY_SECONDS): bound "
            f"{rule:.1f} s, efficiency e2e {effs}. Trove's target is judged on this one."
        )
    elif regime.gap > 0:
        print(
            f"Lower bound of the makespan: {bound:.1f} s (the largest "
            f"host's {sizes[0]} pages and its robots.txt, less one, times {regime.gap:g} s); "
            "efficiency = lower bound / makespan (e2e: start to last page; req: first to last"
            " request the site saw)."
        )
    trove = [r for r in runs if r.crawler == "trove"]
    if trove:
        names = sorted({k for r in trove for k in r.cpu})
        parts = ", ".join(
            f"{n} {median([1000 * r.cpu.get(n, math.nan) / r.done for r in trove if r.done]):.1f}"
            for n in names
        )
        print(f"Trove CPU s/1k pages by process group: {parts}")
    print(
        "Trove / Scrapy, side by side (median over rounds): "
        f"pages/s x{_fmt(_ratio(runs, 'pages_per_s'), '.2f')}, "
        f"CPU per page x{_fmt(_ratio(runs, 'cpu_per_1k'), '.2f')}"
        + (f", makespan x{_fmt(_ratio(runs, 'seconds'), '.2f')}" if regime.gap > 0 else ""),
        flush=True,
    )
    other = median([r.other_cores for r in runs if r.crawler == "trove"])
    if other > 0.2:
        print(
            f"Note: other processes used a median {other:.2f} cores during Trove's runs: the "
            "machine was not quiet, so the numbers are low and noisy."
        )


# --- main -------------------------------------------------------------------------------


def regimes(args: argparse.Namespace) -> list[Regime]:
    def gap(name: str) -> float:
        return float(args.gap) if args.gap is not None else DEFAULT_GAPS[name]

    table = {
        "throughput": Regime(
            "throughput", args.throughput_hosts, args.throughput_articles, 0.0, 0.0
        ),
        "politeness": Regime(
            "politeness",
            args.politeness_hosts,
            args.politeness_articles,
            args.skew,
            gap("politeness"),
        ),
        "known": Regime(
            "known",
            args.politeness_hosts,
            args.politeness_articles,
            args.skew,
            gap("known"),
            True,
        ),
        "smallweb": Regime(
            "smallweb",
            args.smallweb_hosts,
            args.smallweb_articles,
            args.smallweb_skew,
            gap("smallweb"),
            web="smallweb",
        ),
        # ``articles`` is the number of URLs: none is crawled beyond each host's first.
        "frontier": Regime(
            "frontier",
            args.frontier_hosts,
            args.frontier_urls,
            0.0,
            args.frontier_gap,
            True,
            web="frontier",
        ),
    }
    return [table[name] for name in args.regimes]


async def bench(args: argparse.Namespace) -> int:
    # SIGTERM unwinds like Ctrl-C: services, servers and the temporary folder go away.
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    with tempfile.TemporaryDirectory(prefix="trove-vs-scrapy-") as tmp:
        state = Path(tmp)
        started = time.perf_counter()
        stack = Stack(
            state_dir=state / "stack", fast_and_unsafe=True, profile_nats=bool(args.profile)
        )
        atexit.register(stack.stop)  # whatever happens, no orphaned server
        await asyncio.to_thread(stack.start)
        try:
            await asyncio.to_thread(upgrade, stack.database_url)
            bus = await Bus.connect(stack.nats_url, name="trove-bench-vs-scrapy")
            engine = create_async_engine(
                stack.database_url,
                connect_args={"server_settings": {"application_name": OBSERVER}},
            )
            ctx = Context(args=args, stack=stack, bus=bus, engine=engine, state=state)
            print(
                f"Stack up in {time.perf_counter() - started:.1f} s; {os.cpu_count()} cores; "
                f"Trove: {args.fetchers} fetcher(s); Scrapy: CONCURRENT_REQUESTS "
                f"{args.scrapy_concurrency}",
                flush=True,
            )
            try:
                for regime in regimes(args):
                    if regime.web == "frontier":
                        await _frontier(ctx, regime)
                    else:
                        await _regime(ctx, regime)
            finally:
                await engine.dispose()
                await bus.close()
        finally:
            await asyncio.to_thread(stack.stop)
            atexit.unregister(stack.stop)
            print(f"Total {time.perf_counter() - started:.0f} s", flush=True)
    return 0


async def _regime(ctx: Context, regime: Regime) -> None:
    args = ctx.args
    server = await start_server(regime, args, ctx.state / f"web-{regime.name}")
    atexit.register(server.child.stop)
    try:
        m = server.manifest
        print(
            f"\n{regime.name}: witness server (pid {server.child.pid}) on port {m['port']}, "
            f"{len(m['expected'])} pages over {regime.hosts} hosts",
            flush=True,
        )
        runs: list[Run] = []
        for round_ in range(args.runs):
            order = list(args.crawlers) if round_ % 2 == 0 else list(reversed(args.crawlers))
            for crawler in order:
                if crawler == "trove":
                    run = await trove_run(ctx, server, regime, round_)
                else:
                    run = await scrapy_run(ctx, server, regime, round_)
                print_run(run)
                runs.append(run)
        print_summary(regime, server, runs)
    finally:
        await asyncio.to_thread(server.child.stop)
        atexit.unregister(server.child.stop)


def _names(allowed: Sequence[str]) -> Any:
    def parse(value: str) -> list[str]:
        names = [part.strip() for part in value.split(",") if part.strip()]
        wrong = [n for n in names if n not in allowed]
        if not names or wrong:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(allowed)}")
        return names

    return parse


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=2, help="rounds per regime")
    parser.add_argument(
        "--regimes",
        type=_names(REGIMES),
        default=",".join(REGIMES),
        help=f"comma-separated, of {', '.join(REGIMES)}",
    )
    parser.add_argument(
        "--crawlers", type=_names(CRAWLERS), default=",".join(CRAWLERS), help="who runs"
    )
    parser.add_argument(
        "--throughput-hosts", type=int, default=300, help="throughput web: hosts, equal sizes"
    )
    parser.add_argument(
        "--throughput-articles", type=int, default=3, help="articles per host (plus home, feed)"
    )
    parser.add_argument(
        "--politeness-hosts", type=int, default=40, help="politeness web: hosts, skewed sizes"
    )
    parser.add_argument(
        "--politeness-articles", type=int, default=20, help="articles of the largest host"
    )
    parser.add_argument("--skew", type=float, default=1.0, help="host i: articles / (i+1)**skew")
    parser.add_argument(
        "--gap",
        type=float,
        default=None,
        help="gap (s) of the politeness, known and smallweb regimes (default 1, 1, 10)",
    )
    parser.add_argument(
        "--smallweb-hosts", type=int, default=1000, help="small web: hosts, one address each"
    )
    parser.add_argument(
        "--smallweb-articles", type=int, default=20, help="small web: articles of the largest"
    )
    parser.add_argument(
        "--smallweb-skew", type=float, default=1.0, help="small web: host i: articles/(i+1)**skew"
    )
    parser.add_argument(
        "--smallweb-tls-share", type=float, default=0.2, help="small web: share of hosts on TLS"
    )
    parser.add_argument(
        "--smallweb-stall-hosts",
        type=int,
        default=10,
        help="small web: smallest hosts whose articles never answer",
    )
    parser.add_argument(
        "--smallweb-latency-median",
        type=float,
        default=0.15,
        help="small web: median of the hosts' median answer times (s)",
    )
    parser.add_argument(
        "--smallweb-timeout",
        type=float,
        default=10.0,
        help="small web: read timeout of both crawlers (s): TROVE_READ_TIMEOUT, DOWNLOAD_TIMEOUT",
    )
    parser.add_argument(
        "--frontier-urls", type=int, default=1_000_000, help="frontier: URLs handed over"
    )
    parser.add_argument(
        "--frontier-hosts", type=int, default=10_000, help="frontier: hosts they are spread over"
    )
    parser.add_argument(
        "--frontier-gap", type=float, default=3600.0, help="frontier: gap (s), so URLs wait"
    )
    parser.add_argument(
        "--frontier-hold",
        type=float,
        default=30.0,
        help="frontier: seconds the queued frontier is held and sampled",
    )
    parser.add_argument(
        "--frontier-timeout",
        type=float,
        default=3600.0,
        help="frontier: seconds the crawler may take to queue every URL",
    )
    parser.add_argument("--page-kb", type=int, default=30, help="page size (KiB)")
    parser.add_argument("--links", type=int, default=100, help="links a page")
    parser.add_argument("--fetchers", type=int, default=1, help="Trove fetcher processes")
    parser.add_argument("--scrapy-concurrency", type=int, default=64, help="CONCURRENT_REQUESTS")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds a run may take")
    parser.add_argument("--server-max-seconds", type=float, default=1800.0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="TROVE_X=V",
        help="extra setting for Trove's services (repeatable)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="attach py-spy to Trove's services and Go's profiler to nats-server in each "
        "run, print where their CPU went, keep the raw stacks and profiles in DIR",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.runs < 1 or args.timeout <= 0 or not 1 <= args.fetchers <= 16:
        raise SystemExit("--runs and --timeout must be positive, --fetchers 1..16")
    for hosts in (args.throughput_hosts, args.politeness_hosts):
        if not 1 <= hosts <= 1000:
            raise SystemExit("hosts must be 1..1000 (one loopback IP each, from 127.0.0.10)")
    if not 1 <= args.smallweb_hosts <= 60_000:
        raise SystemExit("--smallweb-hosts must be 1..60000 (one loopback IP each)")
    if not 1 <= args.frontier_hosts <= 1 << 22 or args.frontier_urls < args.frontier_hosts:
        raise SystemExit("--frontier-hosts 1..4194304, --frontier-urls at least as many")
    if args.gap is not None and args.gap < 0:
        raise SystemExit("--gap must not be negative")
    _extra_env(args.env)  # refuse a bad --env before starting anything
    if args.profile:
        py_spy()  # refuse --profile without py-spy before starting anything
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("trove_schema.bus").setLevel(logging.ERROR)  # "disconnected" at close
    try:
        return asyncio.run(bench(args))
    except KeyboardInterrupt:
        return 130
    except asyncio.CancelledError:  # SIGTERM
        return 143


if __name__ == "__main__":
    raise SystemExit(main())
