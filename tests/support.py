"""Helpers for integration tests: the services as real processes, sandbox settings, queries."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import nats
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from trove_cli.local import SERVICES, LocalTrove
from trove_sandbox.web import TLD, SandboxWeb
from trove_schema.bus import Bus
from trove_schema.events import PageDiscovered, Provenance, Scope, ScopeKind
from trove_schema.urls import canonicalize, domain_of


@asynccontextmanager
async def services(
    stack: StackUrls,
    state: Path,
    env: dict[str, str],
    fetchers: int = 1,
    *,
    only: tuple[str, ...] = SERVICES,
    replicas: dict[str, int] | None = None,
) -> AsyncIterator[LocalTrove]:
    """The services as real processes against the session's servers."""
    local = LocalTrove(
        state_dir=state,
        nats_url=stack.nats_url,
        database_url=stack.database_url,
        fetchers=fetchers,
        services=only,
        replicas=replicas or {},
        service_env=env,
    )
    await asyncio.to_thread(local.start)
    try:
        yield local
    finally:
        await asyncio.to_thread(local.stop)


async def send(stack: StackUrls, subject: str, *payloads: bytes) -> None:
    """What `nats pub SUBJECT ...` sends: core NATS, raw bytes, no headers."""
    nc = await nats.connect(stack.nats_url)
    try:
        for payload in payloads:
            await nc.publish(subject, payload)
        await nc.flush()
    finally:
        await nc.close()


async def readiness(port: int) -> int:
    """A service's ``/readyz`` status on its health port (0 while nothing answers)."""
    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            return (await client.get(f"http://127.0.0.1:{port}/readyz")).status_code
    except httpx.TransportError:
        return 0


async def ready(port: int, timeout: float = 30) -> None:
    """Wait until the service on health port ``port`` says it is ready."""
    await eventually(
        lambda: readiness(port), until=lambda code: code == 200, timeout=timeout, what="ready"
    )


def sandbox_env(web: SandboxWeb, gap: float, **extra: str) -> dict[str, str]:
    return {
        "TROVE_RESOLVE": web.resolve_setting(),
        "TROVE_ALLOWED_NETWORKS": web.allowed_network(),
        "TROVE_PLATFORM_DOMAINS": TLD,
        "TROVE_MIN_DOMAIN_DELAY_SECONDS": str(gap),
        **extra,
    }


def cycle_env(cycle: float, **extra: str) -> dict[str, str]:
    """Services that visit every page again every ``cycle`` seconds (a scaled-down week),
    on servers in 127.0.0.0/8, 0.2 s apart on a host."""
    return {
        "TROVE_ALLOWED_NETWORKS": "127.0.0.0/8",
        "TROVE_MIN_DOMAIN_DELAY_SECONDS": "0.2",
        # The configured gap only: one learnt from response times on a loaded machine
        # (10x a 300 ms answer is 3 s a page) would stretch a cycle past the seen TTL.
        "TROVE_GAP_RESPONSE_FACTOR": "0",
        "TROVE_RECRAWL_AFTER_SECONDS": str(cycle),
        # A fixed cycle: pages that never change would otherwise be visited less and less
        # often (tests/e2e/test_recrawl_intervals.py).
        "TROVE_RECRAWL_MAX_SECONDS": str(cycle),
        # Seen for two intervals after the last request: a page with a pending re-crawl
        # is never discovered again by the links of the pages fetched meanwhile.
        "TROVE_SEEN_TTL_SECONDS": str(2 * cycle),
        "TROVE_RETRY_DELAY_SECONDS": "1",
        **extra,
    }


async def publish_work(bus: Bus, urls: Sequence[str], *, scope: ScopeKind = ScopeKind.HOST) -> None:
    """Hand URLs straight to the fetcher, as discovery would."""
    for url in urls:
        canonical = canonicalize(url)
        await bus.publish(
            PageDiscovered(
                url=canonical,
                domain=domain_of(canonical),
                scope=Scope(kind=scope, value=domain_of(canonical), max_depth=0),
                provenance=Provenance(kind="seed", origin="test"),
            )
        )


async def query(engine: AsyncEngine, sql: str, **params: Any) -> Sequence[Any]:
    async with engine.connect() as conn:
        return (await conn.execute(text(sql), params)).all()


async def outcomes(engine: AsyncEngine) -> dict[str, str]:
    """url -> outcome of its latest attempt."""
    rows = await query(
        engine,
        "SELECT DISTINCT ON (p.url) p.url, c.outcome FROM page_crawls c "
        "JOIN pages p ON p.id = c.page_id ORDER BY p.url, c.completed_at DESC",
    )
    return {r.url: r.outcome for r in rows}


async def run_trove(*argv: str, env: Mapping[str, str], timeout: float = 60) -> tuple[int, str]:
    """Run the `trove` command as a user would (its own process); its exit code and output."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "trove_cli",
        *argv,
        env=dict(env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def scraped(port: int) -> list[Sample]:
    """Every sample a service's ``/metrics`` on ``port`` shows now."""
    async with httpx.AsyncClient(trust_env=False) as client:
        page = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    return [sample for family in text_string_to_metric_families(page) for sample in family.samples]
