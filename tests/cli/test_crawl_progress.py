"""`trove crawl` on a state folder kept from earlier crawls counts this crawl's pages and
reports the seeds it refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls
from tests.support import services
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


async def test_the_report_lists_the_seeds_this_crawl_refused_not_those_of_earlier_crawls(
    stack: StackUrls,
    engine: AsyncEngine,
    state_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Earlier crawls refused more seeds than the report lists: it showed theirs, the
    # oldest, and not the one this crawl refused.
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO seed_rejections (event_id, raw, reason, occurred_at) "
                "SELECT gen_random_uuid(), 'ftp://old.example/' || n, 'earlier', "
                "now() - interval '1 day' FROM generate_series(1, 12) AS n"
            )
        )
    monkeypatch.setenv("COLUMNS", "200")
    async with services(stack, state_dir, {}, only=("discovery", "recorder")):
        code = await watch_crawl(
            nats_url=stack.nats_url,
            database_url=stack.database_url,
            seeds=("ftp://refused.example/",),
            until_idle=True,
            max_pages=None,
            timeout=120.0,
        )
    printed = capsys.readouterr().out
    assert code == 0
    assert "Rejected seeds" in printed
    assert "ftp://refused.example/" in printed
    assert "old.example" not in printed
