"""`trove crawl` on a state folder kept from earlier crawls counts this crawl's pages and
reports what it did: its attempts and the seeds it refused, apart from every crawl's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls
from tests.support import sandbox_env, services
from trove_cli.main import watch_crawl
from trove_cli.report import build_report
from trove_sandbox.server import serve_sandbox
from trove_sandbox.web import SandboxWeb

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


async def test_the_report_counts_this_crawls_attempts_and_heads_the_rest_as_all_crawls(
    stack: StackUrls,
    engine: AsyncEngine,
    state_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A month of earlier crawls in the folder: its pages, attempts and shares were
    # reported as this crawl's, under this crawl's bar.
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO pages (url, domain, status, language, discovered_at) "
                "SELECT 'https://old.example/' || n, 'old.example', 'fetched', 'xx-old', "
                "now() - interval '30 days' FROM generate_series(1, 5) AS n"
            )
        )
        await conn.execute(
            text(
                "INSERT INTO page_crawls (page_id, domain, outcome, started_at, completed_at, "
                "duration_ms, event_id) SELECT id, domain, 'timeout', "
                "now() - interval '30 days', now() - interval '30 days', 10, "
                "gen_random_uuid() FROM pages"
            )
        )
        await conn.execute(
            text(
                "INSERT INTO page_shares (url, post_uri, instance, account, first_seen_at) "
                "VALUES ('https://old.example/1', 'https://social.example/p/1', "
                "'https://social.example', 'someone', now() - interval '30 days')"
            )
        )
    web = SandboxWeb.generate(hosts=1, pages_per_host=3, base_ip="127.0.0.220")
    monkeypatch.setenv("COLUMNS", "200")
    async with (
        serve_sandbox(web) as running,
        services(stack, state_dir, sandbox_env(web, gap=0.2)),
    ):
        code = await watch_crawl(
            nats_url=stack.nats_url,
            database_url=stack.database_url,
            seeds=running.seeds,
            until_idle=True,
            max_pages=None,
            timeout=120.0,
        )
    printed = capsys.readouterr().out
    assert code == 0
    this_crawl, heading, every_crawl = printed.partition("All crawls in this database")
    assert heading, printed
    assert "Since this crawl began" in this_crawl
    host = web.hosts[0].name
    async with engine.connect() as conn:
        fetched = (
            await conn.execute(
                text("SELECT count(*) FROM pages WHERE domain = :d AND status = 'fetched'"),
                {"d": host},
            )
        ).scalar_one()
    assert fetched >= 3
    by_status = this_crawl.split("Pages by status")[1].split("Crawls by outcome")[0]
    row = next(line for line in by_status.splitlines() if line.startswith("fetched"))
    assert row.replace("│", " ").split() == ["fetched", str(fetched)]
    assert host in this_crawl
    for earlier in ("old.example", "timeout", "xx-old"):
        assert earlier not in this_crawl
    assert "Most linked pages" in every_crawl
    assert "links in the citation graph" in every_crawl


@pytest.mark.usefixtures("clean")
async def test_the_report_counts_the_pages_a_crawl_found_and_did_not_get_to(
    engine: AsyncEngine,
) -> None:
    # A crawl stopped by its page limit or its timeout left pages queued: they are its
    # work too; a page found before it began and never crawled is not.
    began = datetime.now(UTC)
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO pages (url, domain, status, discovered_at) VALUES "
                "('https://queued.example/a', 'queued.example', 'discovered', :after), "
                "('https://queued.example/b', 'queued.example', 'discovered', :after), "
                "('https://queued.example/c', 'queued.example', 'discovered', :before)"
            ),
            {"after": began + timedelta(seconds=5), "before": began - timedelta(days=3)},
        )
    report = await build_report(engine, since=began)
    assert report.pages_by_status == {"discovered": 2}
