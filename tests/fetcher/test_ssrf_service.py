"""SSRF at the service level: the fetcher process never connects outside the allowed range.

Only loopback targets are used here (an address outside the allowed loopback range
stands for every private address): the non-loopback cases (10.0.0.1,
169.254.169.254, mapped IPv6, ...) are proven in test_transport.py against a backend
that refuses to dial anything but loopback, so no test can send traffic off the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.support import outcomes, publish_work, query, sandbox_env, services
from trove_sandbox.server import serve_sandbox
from trove_sandbox.web import SandboxWeb
from trove_schema.bus import Bus

pytestmark = pytest.mark.usefixtures("clean")


class Listener:
    """A TCP listener that only counts who connects to it."""

    def __init__(self) -> None:
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.close()


@contextlib.asynccontextmanager
async def listening(host: str, family: socket.AddressFamily) -> AsyncIterator[tuple[Listener, int]]:
    listener = Listener()
    server = await asyncio.start_server(listener.handle, host, 0, family=family)
    port = server.sockets[0].getsockname()[1]
    try:
        yield listener, port
    finally:
        server.close()
        await server.wait_closed()


async def test_private_targets_are_never_connected_to(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    web = SandboxWeb.generate(hosts=1, pages_per_host=1, base_ip="127.0.0.64")
    allowed = "127.0.0.64/26"  # the sandbox, and not 127.0.0.1
    async with (
        listening("127.0.0.1", socket.AF_INET) as (v4, port4),
        listening("::1", socket.AF_INET6) as (v6, port6),
        serve_sandbox(web) as running,
    ):
        resolve = f"{web.resolve_setting()},sneaky.trove.test=127.0.0.1"
        env = sandbox_env(web, 0.1, TROVE_RESOLVE=resolve, TROVE_ALLOWED_NETWORKS=allowed)
        targets = [
            f"http://127.0.0.1:{port4}/admin",
            f"http://[::1]:{port6}/admin",
            f"http://sneaky.trove.test:{port4}/",  # a name that resolves to a private address
            f"http://2130706433:{port4}/",  # 127.0.0.1 spelled as a number
        ]
        async with services(stack, state_dir, env):
            await publish_work(bus, [*targets, running.seeds[0]])

            async def recorded() -> dict[str, str]:
                return await outcomes(engine)

            result = await eventually(
                recorded, until=lambda r: len(r) == 5, timeout=60, what="all recorded"
            )
    assert result[running.seeds[0]] == "success"  # the allowed range still works
    assert v4.connections == 0
    assert v6.connections == 0
    rows = await query(
        engine,
        "SELECT p.url, c.outcome, c.error_message FROM page_crawls c "
        "JOIN pages p ON p.id = c.page_id WHERE p.url <> :seed",
        seed=running.seeds[0],
    )
    assert len(rows) == 4
    for row in rows:
        assert row.outcome == "failed", row
        assert "blocked" in (row.error_message or ""), row
