"""`trove crawl` on a state folder kept from earlier crawls counts this crawl's pages."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls
from trove_cli.main import watch_crawl

pytestmark = pytest.mark.usefixtures("clean")


async def test_max_pages_counts_the_pages_of_this_crawl_not_of_the_database(
    stack: StackUrls, engine: AsyncEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    # Five pages crawled before (no --fresh): a --max-pages 2 crawl ended at its first
    # look, having crawled nothing, and its bar said 5/5.
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO pages (url, domain, status, discovered_at) "
                "SELECT 'https://old.example/' || n, 'old.example', 'fetched', now() "
                "FROM generate_series(1, 5) AS n"
            )
        )
    code = await watch_crawl(
        nats_url=stack.nats_url,
        database_url=stack.database_url,
        seeds=(),
        until_idle=False,
        max_pages=2,
        timeout=2.0,
    )
    printed = " ".join(capsys.readouterr().out.split())
    assert code == 0
    assert "crawled 0/0 pages" in printed
    assert "stopped after 2s: not idle yet" in printed
