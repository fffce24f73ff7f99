"""The pod's egress away (a NAT gateway down, a NetworkPolicy without its egress rule):
every connection fails, to every host. The fetcher process hands its work back instead
of blaming each host, and crawls every page once connections succeed again; an outage
longer than its patience is the hosts' after all, so no work waits for ever.

Nothing listening on the sandbox's addresses plays the outage (each connection refused,
as a gateway that rejects); the sandbox's servers starting on them again ends it."""

from __future__ import annotations

import itertools
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.ports import free_port
from tests.support import outcomes, publish_work, query, sandbox_env, services
from trove_sandbox.server import serve_sandbox
from trove_sandbox.web import SandboxWeb
from trove_schema.bus import Bus
from trove_schema.urls import domain_of

pytestmark = pytest.mark.usefixtures("clean")

SUSPECT_AFTER = 4
GAP = 0.1


async def egress_away(port: int) -> float:
    """The fetcher's ``trove_egress_away`` gauge for IPv4 (-1 while its port does not answer)."""
    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            page = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    except httpx.TransportError:
        return -1.0
    return sum(
        sample.value
        for family in text_string_to_metric_families(page)
        for sample in family.samples
        if sample.name == "trove_egress_away" and sample.labels.get("family") == "IPv4"
    )


async def handed_back(port: int) -> float:
    """Work messages the fetcher handed back, not counted (``trove_messages_total``)."""
    async with httpx.AsyncClient(trust_env=False) as client:
        page = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(page)
        for sample in family.samples
        if sample.name == "trove_messages_total" and sample.labels.get("ending") == "retried"
    )


def unserved_web(hosts: int, base_ip: str) -> SandboxWeb:
    """A sandbox web whose URLs name a port nothing listens on yet."""
    web = SandboxWeb.generate(hosts=hosts, pages_per_host=1, base_ip=base_ip)
    web.port = free_port()
    return web


def watched_env(web: SandboxWeb, **extra: str) -> dict[str, str]:
    """The services on ``web``, an outage taken for one after ``SUSPECT_AFTER`` addresses
    failed, however recent the last connection, and looked at again every second."""
    return sandbox_env(
        web,
        GAP,
        TROVE_EGRESS_SUSPECT_AFTER=str(SUSPECT_AFTER),
        TROVE_EGRESS_QUIET_SECONDS="0",
        TROVE_EGRESS_RECHECK_SECONDS="1",
        **extra,
    )


async def test_work_waits_while_no_connection_succeeds_and_crawls_once_they_do(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    web = unserved_web(12, "127.0.0.84")
    seeds = web.seeds()
    metrics = free_port()
    env = watched_env(web)
    fetcher_env = env | {"TROVE_HTTP_PORT": str(metrics)}
    async with (
        services(stack, state_dir / "recorder", env, only=("recorder",)),
        services(stack, state_dir / "fetcher", fetcher_env, only=("fetcher",)),
    ):
        await publish_work(bus, seeds)
        await eventually(
            lambda: egress_away(metrics), until=lambda v: v == 1, timeout=60, what="egress away"
        )
        # The outage lasts until the work handed back has come back and been handed
        # back again (the job let through to find out failing too), blaming nobody.
        await eventually(
            lambda: handed_back(metrics),
            until=lambda n: n >= len(seeds),
            timeout=60,
            what="the work handed back twice",
        )
        blamed = {
            r.url
            for r in await query(
                engine, "SELECT url FROM pages p JOIN page_crawls c ON c.page_id = p.id"
            )
        }
        async with serve_sandbox(web, port=web.port) as running:

            async def crawled() -> dict[str, str]:
                return await outcomes(engine)

            result = await eventually(
                crawled,
                until=lambda r: sum(o == "success" for o in r.values()) >= len(seeds) - len(blamed),
                timeout=90,
                what="every page not blamed crawled",
            )
            assert await egress_away(metrics) == 0
    # Only the connections that showed the outage were taken for their hosts' failures.
    assert len(blamed) < SUSPECT_AFTER
    assert {url for url, outcome in result.items() if outcome != "success"} <= blamed
    failed = await query(engine, "SELECT count(*) AS n FROM page_crawls WHERE outcome <> 'success'")
    assert failed[0].n == len(blamed)
    requests = running.witness.requests()
    for host in {domain_of(seed) for seed in seeds}:
        times = sorted(r.monotonic for r in requests if r.host == host)
        assert all(b - a >= GAP for a, b in itertools.pairwise(times)), host


async def test_an_outage_longer_than_the_patience_is_recorded_against_the_hosts(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    web = unserved_web(8, "127.0.0.100")
    seeds = web.seeds()
    env = watched_env(web, TROVE_EGRESS_PATIENCE_SECONDS="3")
    async with services(stack, state_dir, env):
        await publish_work(bus, seeds)

        async def recorded() -> dict[str, str]:
            return await outcomes(engine)

        result = await eventually(
            recorded, until=lambda r: len(r) == len(seeds), timeout=90, what="every page recorded"
        )
    assert set(result) == set(seeds)
    assert "success" not in result.values()
