"""Postgres stopped and restarted mid-crawl: the recorder waits, catches up, loses nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tests.conftest import StackUrls, eventually
from tests.support import publish_work, sandbox_env, services
from trove_sandbox.server import serve_sandbox
from trove_sandbox.web import SandboxWeb
from trove_schema.bus import Bus
from trove_schema.migrate import upgrade
from trove_stack.nats import free_port
from trove_stack.postgres import EmbeddedPostgres, PostgresConfig

pytestmark = pytest.mark.usefixtures("clean")


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    """A Postgres of this test's own, on a fixed port so it can come back at the same URL."""
    server = EmbeddedPostgres(
        PostgresConfig(data_dir=tmp_path / "pg" / "data", port=free_port("127.0.0.1"))
    ).start()
    try:
        upgrade(server.url)
        yield server
    finally:
        server.stop()


async def test_postgres_stopped_and_restarted_mid_crawl_loses_nothing(
    stack: StackUrls, bus: Bus, own_postgres: EmbeddedPostgres, state_dir: Path
) -> None:
    web = SandboxWeb.generate(hosts=6, pages_per_host=6)
    engine = create_async_engine(own_postgres.url, pool_pre_ping=True)
    database = StackUrls(stack.nats_url, own_postgres.url, stack.kind)

    async def recorded() -> int:
        try:
            async with engine.connect() as conn:
                return int(
                    (await conn.execute(text("SELECT count(*) FROM page_crawls"))).scalar_one()
                )
        except Exception:
            return -1  # the database is down

    try:
        async with (
            serve_sandbox(web),
            services(database, state_dir, sandbox_env(web, 0.3)) as local,
        ):
            urls = [u for h in web.hosts for u in [web.url(h.name, "/"), *web.articles(h.name)]]
            await publish_work(bus, urls)
            await eventually(recorded, until=lambda n: n >= 5, timeout=60, what="first rows")

            await asyncio.to_thread(own_postgres.stop)

            # The crawl goes on without the database: CrawlCompleted piles up in the stream.
            async def completed_in_stream() -> int:
                info = await bus.js.stream_info(
                    "TROVE_EVENTS", subjects_filter="trove.events.crawl.completed"
                )
                return sum((info.state.subjects or {}).values())

            before = await completed_in_stream()
            await eventually(
                completed_in_stream, until=lambda n: n >= before + 5, timeout=60, what="progress"
            )
            local.check_alive()  # the recorder waits; it does not crash
            await asyncio.to_thread(own_postgres.start)

            await eventually(
                recorded, until=lambda n: n == len(urls), timeout=90, what="every page recorded"
            )
            local.check_alive()
        async with engine.connect() as conn:
            distinct = (
                await conn.execute(text("SELECT count(DISTINCT page_id) FROM page_crawls"))
            ).scalar_one()
            events = (
                await conn.execute(text("SELECT count(*) FROM projected_events"))
            ).scalar_one()
        assert distinct == len(urls)
        assert events >= len(urls)
    finally:
        await engine.dispose()
