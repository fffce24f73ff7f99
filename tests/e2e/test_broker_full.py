"""JetStream's store full, as the volume the record fills after months of crawling: every
write the services make to a stream or a bucket (events, leases, the seen set) is refused
with 503 "insufficient resources". They wait: nothing is parked, nothing recorded
against the sites, no service exits. Once the store has room again (here nats-server is restarted
with the limit lifted, as after the volume was grown), the crawl completes: every page,
never two requests to a host closer than the gap.

The three services run as real processes against their own real nats-server (its store
limited by ``max_file_store``) and the session's Postgres; the sandbox web is real."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx
import nats
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.ports import free_port
from tests.support import outcomes, sandbox_env, services
from trove_sandbox.server import serve_sandbox
from trove_sandbox.web import SandboxWeb
from trove_schema.topology import DEAD_STREAM, SEEDS_SUBJECT, declare, ensure_topology
from trove_stack.nats import EmbeddedNats, NatsConfig

pytestmark = pytest.mark.usefixtures("clean")

GAP = 0.2
#: Bytes the store may hold: the first pages' events and keys, not the crawl's (~110 KB).
LIMIT = 40_000


async def handed_back(ports: list[int]) -> float:
    """Messages the services handed back to wait, not counted (``trove_messages_total``)."""
    total = 0.0
    async with httpx.AsyncClient(trust_env=False) as client:
        for port in ports:
            page = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
            total += sum(
                sample.value
                for family in text_string_to_metric_families(page)
                for sample in family.samples
                if sample.name == "trove_messages_total"
                and sample.labels.get("ending") == "retried"
            )
    return total


async def parked(url: str) -> int:
    nc = await nats.connect(url)
    try:
        return int((await nc.jetstream().stream_info(DEAD_STREAM)).state.messages)
    finally:
        await nc.close()


async def test_a_full_store_makes_the_crawl_wait_and_it_completes_once_there_is_room(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path, tmp_path: Path
) -> None:
    web = SandboxWeb.generate(hosts=3, pages_per_host=6, base_ip="127.0.0.188")
    expected = len(web.expected_pages()) + len(web.hosts)  # pages and feeds
    config = NatsConfig(
        store_dir=tmp_path / "nats", port=free_port("127.0.0.1"), max_file_store=LIMIT
    )
    log = config.store_dir / "nats-server.log"
    server = EmbeddedNats(config).start()
    own = StackUrls(server.url, stack.database_url, stack.kind)
    nc = await nats.connect(server.url)
    await ensure_topology(nc.jetstream(), declare())  # the seeds have a stream to go to
    await nc.close()
    try:
        env = sandbox_env(web, GAP)
        ports = [free_port("127.0.0.1") for _ in range(3)]
        async with (
            serve_sandbox(web) as running,
            services(
                own, state_dir / "d", env | {"TROVE_HTTP_PORT": str(ports[0])}, only=("discovery",)
            ) as discovery,
            services(
                own, state_dir / "f", env | {"TROVE_HTTP_PORT": str(ports[1])}, only=("fetcher",)
            ) as fetcher,
            services(
                own, state_dir / "r", env | {"TROVE_HTTP_PORT": str(ports[2])}, only=("recorder",)
            ) as recorder,
        ):
            local = (discovery, fetcher, recorder)
            nc = await nats.connect(server.url)
            await nc.publish(SEEDS_SUBJECT, "\n".join(running.seeds).encode())
            await nc.flush()
            await nc.close()
            await eventually(
                lambda: _read(log),
                until=lambda text: "resource limits exceeded" in text,
                timeout=60,
                what="the store full",
            )
            # The services meet the refusals and wait: their work handed back, again and
            # again, uncounted; none exits.
            waited = await handed_back(ports)
            await eventually(
                lambda: handed_back(ports),
                until=lambda n: n >= waited + 10,
                timeout=90,
                what="work handed back ten times more",
            )
            for service in local:
                service.check_alive()
            when_full = await outcomes(engine)
            assert len(when_full) < expected
            assert await parked(server.url) == 0

            # The volume grown: the same store, the same address, no limit.
            server.stop()
            server = EmbeddedNats(dataclasses.replace(config, max_file_store=None)).start()
            result = await eventually(
                lambda: outcomes(engine),
                until=lambda r: sum(o == "success" for o in r.values()) >= expected,
                timeout=120,
                what="every page crawled",
            )
            for service in local:
                service.check_alive()
            assert await parked(server.url) == 0
            gaps = {host.name: running.witness.min_gap(host.name) for host in web.hosts}
    finally:
        server.stop()

    # Every page and feed, as a crawl untouched ends; the one link robots.txt disallows
    # is recorded without a request, as always.
    assert sum(outcome == "success" for outcome in result.values()) == expected
    assert set(result.values()) <= {"success", "blocked_robots"}, result
    assert all(gap is None or gap >= GAP for gap in gaps.values()), gaps


async def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""
