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
from tests.fetcher._pods import (
    HOSTS,
    POD_A,
    POD_B,
    agent,
    fetcher_pod,
    hold_work,
    stalled_env,
    stalled_site,
    still_held,
)
from tests.ports import free_port
from tests.support import outcomes, publish_work, query, ready, sandbox_env, services
from trove_sandbox.server import serve_sandbox
from trove_sandbox.web import SandboxWeb
from trove_schema.bus import Bus

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
    # Longer than this test waits for every page: what the leaving pod held and the other
    # one fetched was handed back, not given out again once the ack wait expired.
    env = stalled_env("127.0.0.190", gap, TROVE_ACK_WAIT_SECONDS="120")
    with stalled_site("127.0.0.190") as site:
        urls = [site.stalled, *site.waiting]
        async with (
            services(stack, state_dir, env, only=("recorder",)) as recorder,
            fetcher_pod(stack, state_dir, env, POD_A) as pod_a,
        ):
            await hold_work(bus, site, POD_A)
            async with fetcher_pod(stack, state_dir, env, POD_B) as pod_b:
                await still_held(bus, site, POD_A)
                (leaving,) = pod_a.children
                pod_a.children.remove(leaving)  # not to be restarted
                asked = time.monotonic()
                leaving.proc.send_signal(signal.SIGTERM)

                async def fetched_by_the_other() -> list[str]:
                    return [url for url in site.waiting if agent(POD_B) in site.senders(url)]

                # The page it is asking for is still stalled: the pages it held unstarted
                # can only have reached the other pod by its handing them back.
                await eventually(
                    fetched_by_the_other, until=bool, timeout=30, what="a held page fetched"
                )
                site.release.set()
                code = await asyncio.to_thread(leaving.proc.wait, 30)
                took = time.monotonic() - asked

                async def recorded() -> dict[str, str]:
                    recorder.check_alive()
                    pod_b.check_alive()
                    return await outcomes(engine)

                # Every page's latest attempt (an exploring one is followed by another).
                result = await eventually(
                    recorded,
                    until=lambda r: len(r) == len(urls) and set(r.values()) == {"success"},
                    timeout=60,
                    what="every page",
                )
    assert code == 0
    assert took < 30, f"took {took:.1f}s to stop"
    assert set(result.values()) == {"success"}
    # An exploring attempt that got nothing usable is rejected, and the page fetched again.
    sql = "SELECT count(*) AS n FROM page_crawls WHERE outcome = 'success'"
    (row,) = await query(engine, sql)
    assert row.n == len(urls)
    # It finished the page it was asking for (a host's first page is never asked by an
    # exploring strategy, so once); every page it held went to the other pod.
    assert site.senders(site.stalled) == [agent(POD_A)]
    for url in site.waiting:
        assert set(site.senders(url)) == {agent(POD_B)}, url
    for host in HOSTS:
        shortest = site.server.min_gap(host)
        assert shortest is None or shortest >= gap, host


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
