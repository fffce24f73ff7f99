"""One fuzz round through the real services: hostile seeds and pages in, one answer each out.

The services run as real processes on the session's NATS and Postgres; the pages come
from ``hostile.serve_hostile`` on loopback. Names that are not the server's go to a
nameserver on loopback that knows none of them (``tests.fetcher._dns``: it refuses
them), so nothing leaves 127.0.0.0/8 and such a name fails as the host's own trouble.
Used by ``tests/fuzz`` (a few hundred inputs) and ``bench/bench_fuzz.py``
(thousands).

What must hold at the end of a round (``Report.problems`` lists what did not):

* every seed message's rejections are rows of ``seed_rejections``, each with a reason,
  no more and no fewer than discovery's parser gives for it;
* every URL a seed message was accepted with was crawled: its attempt is recorded;
* every hostile page was fetched exactly once, as the server counts its requests (no
  retry: the retry delay is an hour), or twice when it was asked again another way;
* nothing discovered is left unanswered, nothing is parked (``TROVE_DEAD`` is empty),
  every service is still running, and no service logged an error or a traceback.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.fetcher._dns import dns_server
from tests.fuzz.hostile import host_name, page_cases, seed_messages, serve_hostile
from tests.support import send, services
from trove_discovery.seeds import parse_seeds
from trove_schema.bus import Bus
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import (
    DEAD_STREAM,
    EVENTS_STREAM,
    SEEDS_SUBJECT,
    WORK_STREAM,
)


@dataclass
class Report:
    seed_messages: int = 0
    pages: int = 0
    rejected_seeds: int = 0
    accepted_urls: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    page_outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: One recorded reason per (page family, outcome), for the reader of a report.
    reasons: dict[tuple[str, str], str] = field(default_factory=dict)
    parked: int = 0
    unexpected_errors: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "inputs": self.seed_messages + self.pages,
            "seed_messages": self.seed_messages,
            "hostile_pages": self.pages,
            "rejected_seeds": self.rejected_seeds,
            "accepted_urls": self.accepted_urls,
            "outcomes": dict(self.outcomes.most_common()),
            "page_outcomes": {f"{k} -> {o}": n for (k, o), n in sorted(self.page_outcomes.items())},
            "parked": self.parked,
            "unexpected_errors": len(self.unexpected_errors),
            "problems": len(self.problems),
            "seconds": round(self.seconds, 1),
        }


#: Where the fuzz rounds' nameserver listens.
FUZZ_NAMESERVER = "127.0.0.59"


def fuzz_env(hosts: int, nameserver: str, **extra: str) -> dict[str, str]:
    return {
        "TROVE_RESOLVE": ",".join(f"{host_name(n)}=127.0.0.1" for n in range(hosts)),
        "TROVE_ALLOWED_NETWORKS": "127.0.0.0/8",
        # Every other name goes to a nameserver on loopback that refuses it: no traffic
        # leaves. (One that answered nothing at all would be the pod's nameservers away,
        # and the work would wait for them.)
        "TROVE_DNS_NAMESERVERS": nameserver,
        "TROVE_DNS_TIMEOUT_SECONDS": "0.5",
        "TROVE_MIN_DOMAIN_DELAY_SECONDS": "0",
        "TROVE_MAX_DEPTH": "0",
        "TROVE_CONNECT_TIMEOUT": "2",
        "TROVE_READ_TIMEOUT": "2",
        "TROVE_REQUEST_TIMEOUT": "4",
        "TROVE_RETRY_DELAY_SECONDS": "3600",
        # A host that fails is left alone for a while, and one that answers slowly gets a
        # longer gap: both scaled down, the cases share hosts and must all be answered.
        "TROVE_HOST_PAUSE_SECONDS": "0.2",
        "TROVE_RATE_PAUSE_SECONDS": "0.2",
        "TROVE_MAX_BACKOFF_SECONDS": "1",
        "TROVE_GAP_RESPONSE_FACTOR": "0",
        "TROVE_LOG_LEVEL": "INFO",
        **extra,
    }


def unexpected_log_lines(logs: Path) -> list[str]:
    """Lines at level error or above, or carrying a traceback, in every service log."""
    found: list[str] = []
    for path in sorted(logs.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                if "Traceback" in line or "Logging error" in line:
                    found.append(f"{path.name}: {line[:300]}")
                continue
            if not isinstance(entry, dict):
                continue
            if entry.get("level") in ("error", "critical") or "exc" in entry:
                found.append(f"{path.name}: {line[:600]}")
    return found


async def _scalar(engine: AsyncEngine, sql: str, **params: Any) -> Any:
    async with engine.connect() as conn:
        return (await conn.execute(text(sql), params)).scalar_one()


async def _rows(engine: AsyncEngine, sql: str, **params: Any) -> list[Any]:
    async with engine.connect() as conn:
        return list((await conn.execute(text(sql), params)).all())


async def fuzz_round(
    stack: StackUrls,
    engine: AsyncEngine,
    state_dir: Path,
    *,
    seed: int,
    seed_count: int,
    page_count: int,
    hosts: int = 12,
    timeout: float = 120.0,
    fetchers: int = 1,
) -> Report:
    """Run one round on an empty crawl (the caller resets the stack) and judge it."""
    started = time.monotonic()
    rng = random.Random(seed)
    report = Report()
    cases: list[Any] = []
    with dns_server(FUZZ_NAMESERVER) as names:
        env = fuzz_env(hosts, names.address)
        async with serve_hostile(cases) as server:
            cases.extend(page_cases(rng, page_count, hosts=hosts, port=server.port))
            page_urls = {server.url(n, hosts): case.kind for n, case in enumerate(cases)}
            messages = seed_messages(rng, seed_count, hosts=hosts, port=server.port)
            for url in page_urls:
                form = rng.randrange(3)
                if form == 0:
                    messages.append(url.encode())
                elif form == 1:
                    messages.append(json.dumps({"url": url, "max_depth": 0}).encode())
                else:
                    messages.append(f"# page\r\n{url}\r\n".encode())
            rng.shuffle(messages)
            settings = DiscoverySettings(max_depth=0, allowed_networks=("127.0.0.0/8",))
            expected_rejections = 0
            accepted: set[str] = set()
            for data in messages:
                batch = parse_seeds(data, origin="fuzz", settings=settings)
                expected_rejections += len(batch.rejected)
                accepted.update(seed.url for seed in batch.accepted)
            report.seed_messages = len(messages) - len(page_urls)
            report.pages = len(page_urls)
            report.rejected_seeds = expected_rejections
            report.accepted_urls = len(accepted)

            async with services(stack, state_dir, env, fetchers=fetchers) as local:
                await send(stack, SEEDS_SUBJECT, *messages)

                async def progress() -> tuple[int, int]:
                    local.check_alive()
                    rejections = await _scalar(engine, "SELECT count(*) FROM seed_rejections")
                    crawled = await _scalar(
                        engine,
                        "SELECT count(*) FROM pages p WHERE p.url = ANY(:urls) AND EXISTS "
                        "(SELECT 1 FROM page_crawls c WHERE c.page_id = p.id)",
                        urls=sorted(accepted),
                    )
                    return rejections, crawled

                await eventually(
                    progress,
                    until=lambda seen: seen[0] >= expected_rejections and seen[1] >= len(accepted),
                    timeout=timeout,
                    interval=0.5,
                    what=f"{expected_rejections} rejections and {len(accepted)} crawled seeds",
                )
                # A request the fetcher still owes (work handed back, an ack it lost) would
                # come after the last answer was recorded: the server's count is read once
                # no consumer holds anything.
                await eventually(
                    lambda: _crawl_idle(stack),
                    until=bool,
                    timeout=timeout,
                    interval=0.5,
                    what="every consumer's work acked",
                )
                served = {server.url(n, hosts): server.requests[n] for n in range(len(cases))}
                await _judge(
                    report, engine, stack, accepted, page_urls, served, expected_rejections
                )
                local.check_alive()
    report.unexpected_errors = unexpected_log_lines(state_dir / "logs")
    report.seconds = time.monotonic() - started
    return report


async def _crawl_idle(stack: StackUrls) -> bool:
    """Nothing waits for any consumer of the events or the work, or is held by one: the
    fetcher's answers projected and the pages they led to (a redirect's target, which
    discovery publishes after the fetcher acked) asked for and answered too."""
    bus = await Bus.connect(stack.nats_url, name="trove-fuzz")
    try:
        for stream in (EVENTS_STREAM, WORK_STREAM):
            for info in await bus.js.consumers_info(stream):
                if info.num_pending or info.num_ack_pending:
                    return False
        return True
    finally:
        await bus.close()


async def _judge(
    report: Report,
    engine: AsyncEngine,
    stack: StackUrls,
    accepted: set[str],
    page_urls: dict[str, str],
    served: dict[str, int],
    expected_rejections: int,
) -> None:
    problems = report.problems
    rejections = await _rows(engine, "SELECT raw, reason FROM seed_rejections")
    if len(rejections) != expected_rejections:
        problems.append(f"{len(rejections)} seed rejections recorded, {expected_rejections} due")
    problems.extend(
        f"rejection without a reason: {raw!r}" for raw, reason in rejections if not reason
    )
    crawls = await _rows(
        engine,
        "SELECT p.url, c.outcome, c.error_message, a.fetcher, a.error_type FROM page_crawls c "
        "JOIN pages p ON p.id = c.page_id LEFT JOIN fetcher_attempts a ON a.event_id = c.event_id "
        "ORDER BY c.completed_at, c.id",
    )
    per_url: dict[str, list[str]] = {}
    ways: dict[str, list[tuple[str | None, str | None]]] = {}
    messages: dict[str, str] = {}
    for url, outcome, message, fetcher, error_type in crawls:
        per_url.setdefault(url, []).append(outcome)
        ways.setdefault(url, []).append((fetcher, error_type))
        messages[url] = message or ""
        report.outcomes[outcome] += 1
    for url, kind in page_urls.items():
        outcomes = per_url.get(url, [])
        # One answer; or two, when the first way of asking got the wrong kind of answer
        # and the page was asked once more another way (``Fetcher._ask_another_way``).
        asked = ways.get(url, [])
        another_way = len(asked) == 2 and asked[0][1] == "wrong_tool" and asked[0][0] != asked[1][0]
        if len(outcomes) != 1 and not another_way:
            problems.append(f"{kind} page {url}: {len(outcomes)} attempts recorded, 1 due")
        # The recorded attempts cannot show a second fetch of the same work (a redelivery
        # publishes the same attempt id again): the server's count can. Each attempt is
        # one request, redirects lead to no other case, and the retry delay is an hour.
        due = 2 if another_way else 1
        if served.get(url, 0) != due:
            problems.append(f"{kind} page {url}: requested {served.get(url, 0)} times, {due} due")
        for outcome in outcomes:
            report.page_outcomes[(kind, outcome)] += 1
            report.reasons.setdefault((kind, outcome), messages[url][:200])
    problems.extend(f"accepted seed never crawled: {url}" for url in _missing(accepted, per_url))
    waiting = await _scalar(
        engine,
        "SELECT count(*) FROM pages p WHERE p.discovered_at IS NOT NULL AND NOT EXISTS "
        "(SELECT 1 FROM page_crawls c WHERE c.page_id = p.id)",
    )
    if waiting:
        problems.append(f"{waiting} discovered pages without an answer")
    bus = await Bus.connect(stack.nats_url, name="trove-fuzz")
    try:
        info = await bus.js.stream_info(DEAD_STREAM)
        report.parked = int(info.state.messages)
    finally:
        await bus.close()
    if report.parked:
        problems.append(f"{report.parked} messages parked in {DEAD_STREAM}")


def _missing(urls: Iterable[str], per_url: dict[str, list[str]]) -> list[str]:
    return sorted(url for url in urls if url not in per_url)
