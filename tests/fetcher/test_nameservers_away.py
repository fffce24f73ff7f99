"""The pod's own nameservers away (a cluster DNS restarting, a pod without network): the
fetcher process hands its work back, blames no host, and crawls every page once they
answer again. A real DNS server on loopback plays the cluster's, and goes silent."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.fetcher._dns import dns_server
from tests.support import outcomes, publish_work, query, sandbox_env, services
from trove_sandbox.server import serve_sandbox
from trove_sandbox.web import SandboxWeb
from trove_schema.bus import Bus

pytestmark = pytest.mark.usefixtures("clean")


async def test_work_waits_while_the_nameservers_are_away_and_no_host_is_blamed(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    web = SandboxWeb.generate(hosts=3, pages_per_host=1, base_ip="127.0.0.72")
    with dns_server("127.0.0.58") as names:
        names.records.update({host: ((ip,), 60) for host, ip in web.resolve_map().items()})
        names.down = True
        async with serve_sandbox(web) as running:
            env = sandbox_env(
                web,
                0.1,
                TROVE_RESOLVE="",  # every name through the nameserver
                TROVE_DNS_NAMESERVERS=names.address,
                TROVE_DNS_TIMEOUT_SECONDS="0.5",
                TROVE_DNS_RECHECK_SECONDS="1",
            )
            async with services(stack, state_dir, env):
                await publish_work(bus, running.seeds)

                async def progress() -> tuple[int, int, int]:
                    attempts = await query(engine, "SELECT count(*) AS n FROM page_crawls")
                    root = names.asked(".")
                    return names.total() - root, root, attempts[0].n

                # Each host's name asked in two rounds (A and AAAA), and the nameservers
                # found away after each (the root asked): the work came back, met them
                # still away, and waited again. Or an attempt was recorded against a
                # host, which is what must not happen.
                _, _, attempts = await eventually(
                    progress,
                    until=lambda seen: (seen[0] >= 12 and seen[1] >= 2) or seen[2] > 0,
                    timeout=90,
                    what="the names asked again",
                )
                audited = await query(engine, "SELECT count(*) AS n FROM fetcher_attempts")
                assert (attempts, audited[0].n) == (0, 0)
                assert running.witness.requests() == []

                names.down = False

                async def recorded() -> dict[str, str]:
                    return await outcomes(engine)

                result = await eventually(
                    recorded, until=lambda r: len(r) == 3, timeout=90, what="every seed recorded"
                )
    assert result == {seed: "success" for seed in running.seeds}
    rows = await query(engine, "SELECT outcome FROM page_crawls")
    assert [row.outcome for row in rows] == ["success"] * 3  # one attempt a page, none failed
    paths = sorted(record.path for record in running.witness.requests())
    assert paths.count("/robots.txt") == 3
