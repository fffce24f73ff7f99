"""A service process's life: health, readiness and metrics endpoints; SIGTERM mid-crawl."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.support import outcomes, publish_work, query, ready, sandbox_env, services
from trove_sandbox.server import serve_sandbox
from trove_sandbox.web import SandboxWeb
from trove_schema.bus import Bus
from trove_stack.nats import free_port

pytestmark = pytest.mark.usefixtures("clean")


async def test_health_readiness_and_metrics_are_served(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    web = SandboxWeb.generate(hosts=1, pages_per_host=1, base_ip="127.0.0.180")
    port = free_port("127.0.0.1")
    env = sandbox_env(web, 0.1, TROVE_HTTP_PORT=str(port))
    async with (
        serve_sandbox(web) as running,
        services(stack, state_dir, env, only=("fetcher",)),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False) as client,
    ):
        await ready(port)
        assert (await client.get("/healthz")).status_code == 200
        # lingua's models are loaded before the first page, not on it (a 0.3 s stall of
        # the event loop mid-crawl).
        log = (state_dir / "logs" / "fetcher-0.log").read_text()
        assert '"message": "language models loaded"' in log
        await publish_work(bus, running.seeds)

        async def fetches() -> str:
            return (await client.get("/metrics")).text

        page = await eventually(
            fetches,
            until=lambda text: 'trove_fetches_total{outcome="success"} 1.0' in text,
            timeout=30,
            what="the fetch counted",
        )
    assert "trove_fetch_seconds_bucket" in page
    assert 'trove_leases_total{decision="granted"}' in page
    assert 'trove_events_published_total{type="CrawlCompleted"} 1.0' in page


async def test_sigterm_mid_crawl_exits_in_time_and_loses_nothing(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    gap = 0.3
    web = SandboxWeb.generate(hosts=3, pages_per_host=8, base_ip="127.0.0.190")
    for host in web.hosts:
        web.set_robots(host.name, "User-agent: *\nAllow: /\n")
    async with (
        serve_sandbox(web) as running,
        # What the leaving pod held unfinished comes back to the other one after the
        # ack wait: well within the wait for every page below.
        services(
            stack, state_dir, sandbox_env(web, gap, TROVE_ACK_WAIT_SECONDS="20"), fetchers=2
        ) as local,
    ):
        urls = [u for h in web.hosts for u in [web.url(h.name, "/"), *web.articles(h.name)]]
        await publish_work(bus, urls)

        async def recorded() -> dict[str, str]:
            return await outcomes(engine)

        await eventually(recorded, until=lambda r: len(r) >= 4, timeout=60, what="a start")
        leaving = next(c for c in local.children if c.name == "fetcher-0")
        asked = time.monotonic()
        leaving.proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(leaving.proc.wait, 30)
        took = time.monotonic() - asked
        local.children.remove(leaving)

        # Every page's latest attempt (an exploring one is followed by another).
        result = await eventually(
            recorded,
            until=lambda r: len(r) == len(urls) and set(r.values()) == {"success"},
            timeout=90,
            what="every page",
        )
        witness = running.witness
    assert code == 0
    assert took < 30, f"took {took:.1f}s to stop"
    assert set(result.values()) == {"success"}
    # An exploring attempt that got nothing usable is rejected, and the page fetched again.
    sql = "SELECT count(*) AS n FROM page_crawls WHERE outcome = 'success'"
    (row,) = await query(engine, sql)
    assert row.n == len(urls)
    for host in web.hosts:
        assert (witness.min_gap(host.name) or gap) >= gap


def _packages_loaded(imports: str, packages: set[str]) -> str:
    """Which of ``packages`` a fresh interpreter holds after ``import imports``, as printed."""
    probe = (
        f"import sys, {imports}; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(packages)!r})))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return loaded.stdout.strip()


def test_a_fetcher_process_does_not_load_httpxs_command_line() -> None:
    # httpx imports click, rich and pygments whenever they are installed (~7 MB a pod);
    # ``trove_fetcher/__init__.py`` keeps that one import out.
    assert _packages_loaded("trove_fetcher.app, httpx", {"click", "rich", "pygments"}) == "[]"


@pytest.mark.parametrize("service", ["trove_fetcher.app", "trove_recorder.__main__"])
def test_only_discovery_loads_the_public_suffix_list(service: str) -> None:
    # tldextract imports requests (~6 MB a pod); registrable domains are discovery's.
    assert _packages_loaded(service, {"tldextract", "requests"}) == "[]"
