"""`trove crawl` on a state folder kept from earlier crawls counts this crawl's pages and
reports what it did: its attempts and the seeds it refused, apart from every crawl's."""

from __future__ import annotations

import asyncio
import io
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path

import pytest
from rich.console import Console
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.recorder.test_lookups import analyze, plan_of, rows_read
from tests.support import sandbox_env, services
from trove_cli import main as main_module
from trove_cli import status as status_module
from trove_cli.main import watch_crawl
from trove_cli.report import (
    _LINKS,
    PAGES_BY_STATUS,
    build_report,
    progress_counts,
    render,
)
from trove_cli.status import sample_source
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


async def test_the_crawls_progress_reads_its_own_pages_not_every_page_of_the_database(
    engine: AsyncEngine,
) -> None:
    # Months of earlier crawls in the folder: each look at the progress, twice a second,
    # read all their pages.
    began = datetime.now(UTC)
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO pages (url, domain, status, discovered_at) "
                "SELECT 'https://old.example/' || n, 'old.example', 'fetched', :before "
                "FROM generate_series(1, 20000) AS n"
            ),
            {"before": began - timedelta(days=30)},
        )
        await conn.execute(
            text(
                "INSERT INTO page_crawls (page_id, domain, outcome, started_at, completed_at, "
                "duration_ms, event_id) SELECT id, domain, 'success', :before, :before, 10, "
                "gen_random_uuid() FROM pages"
            ),
            {"before": began - timedelta(days=30)},
        )
        # This crawl queued three pages and crawled one, and crawled an old page again.
        await conn.execute(
            text(
                "INSERT INTO pages (url, domain, status, discovered_at) VALUES "
                "('https://new.example/a', 'new.example', 'fetched', :after), "
                "('https://new.example/b', 'new.example', 'discovered', :after), "
                "('https://new.example/c', 'new.example', 'discovered', :after)"
            ),
            {"after": began + timedelta(seconds=1)},
        )
        await conn.execute(
            text(
                "INSERT INTO page_crawls (page_id, domain, outcome, started_at, completed_at, "
                "duration_ms, event_id) SELECT id, domain, 'success', :after, :after, 10, "
                "gen_random_uuid() FROM pages WHERE url IN "
                "('https://new.example/a', 'https://old.example/7')"
            ),
            {"after": began + timedelta(seconds=2)},
        )
    await analyze(engine, "pages")
    await analyze(engine, "page_crawls")

    assert await progress_counts(engine, began) == (2, 4)
    plan = await plan_of(engine, PAGES_BY_STATUS.text, since=began)
    # The index entries of this crawl's pages and attempts, and a lookup of each page:
    # never the 20,000 pages of the earlier crawls.
    assert rows_read(plan, "pages") <= 10
    assert rows_read(plan, "page_crawls") <= 10


async def test_the_reports_graph_of_every_crawl_is_counted_from_a_sample_once_large(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A billion links on a crawl of months: the report at the end of each crawl read
    # them all, and every page, to count the graph and the pages only linked to. Here
    # 40,000 linking pages, over the (lowered) limit, sampled at a tenth.
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO pages (url, domain, title) VALUES "
                "('https://hub.example/', 'hub.example', 'The hub'), "
                "('https://hub.example/style.css', 'hub.example', NULL)"
            )
        )
        # One page in four was queued; the rest are only linked to.
        await conn.execute(
            text(
                "INSERT INTO pages (url, domain, discovered_at) "
                "SELECT 'https://a.example/' || n, 'a.example', "
                "CASE WHEN n % 4 = 0 THEN now() END FROM generate_series(1, 40000) AS n"
            )
        )
        # Each links to the hub and to its stylesheet, which is not a citation.
        await conn.execute(
            text(
                "INSERT INTO page_outlinks (from_page_id, to_page_ids, kinds, nofollow) "
                "SELECT p.id, ARRAY[h.id, c.id], ARRAY['a', 'stylesheet'], ARRAY[false, false] "
                "FROM pages p, pages h, pages c WHERE p.domain = 'a.example' "
                "AND h.url = 'https://hub.example/' AND c.url = 'https://hub.example/style.css'"
            )
        )
    await analyze(engine, "pages")
    await analyze(engine, "page_outlinks")
    monkeypatch.setattr(status_module, "SAMPLE_ROWS", 4_000)

    report = await build_report(engine, exact_rows=10_000)

    assert report.graph_estimated
    assert report.pages_estimated
    assert report.links == pytest.approx(80_000, rel=0.1)
    assert [(url, title) for url, title, _ in report.top_linked] == [
        ("https://hub.example/", "The hub")
    ]
    assert report.top_linked[0][2] == pytest.approx(40_000, rel=0.1)
    assert report.linked_only == pytest.approx(30_000, rel=0.1)
    async with engine.connect() as conn:
        source, estimate = await sample_source(conn, "page_outlinks", 10_000)
    assert estimate == pytest.approx(40_000, rel=0.1)
    assert rows_read(await plan_of(engine, _LINKS.format(source)), "page_outlinks") < 10_000
    out = io.StringIO()
    render(report, Console(file=out, width=200, color_system=None))
    printed = " ".join(out.getvalue().split())  # a title is wrapped to its table's width
    assert "Most linked pages (estimated from a sample)" in printed
    assert f"≈{report.links} links in the citation graph; ≈{report.linked_only} pages" in printed
    assert f"≈{report.top_linked[0][2]}" in printed


@pytest.mark.parametrize(
    ("off", "stamped_by"),
    [(+10, "the cluster"), (-10, "this machine")],
    ids=["laptop-ahead", "laptop-behind"],
)
async def test_a_crawl_counts_its_pages_whichever_clock_stamped_them(
    stack: StackUrls,
    engine: AsyncEngine,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    off: int,
    stamped_by: str,
) -> None:
    # `trove crawl --join` from a laptop ten minutes ahead of the cluster: every page the
    # pods stamped came "before" the crawl began, and --max-pages was never reached; ten
    # minutes behind, so did the pages its own services (run on the laptop) stamped.
    class Off(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> Off:
            return cls.fromtimestamp((super().now(tz) + timedelta(minutes=off)).timestamp(), tz)

    monkeypatch.setattr(main_module, "datetime", Off)
    crawl = asyncio.create_task(
        watch_crawl(
            nats_url=stack.nats_url,
            database_url=stack.database_url,
            seeds=(),
            until_idle=False,
            max_pages=2,
            timeout=20.0,
        )
    )
    added = 0

    async def a_page_more() -> bool:
        # A page crawled, stamped by the cluster's clock or this machine's, until the
        # crawl ends.
        nonlocal added
        added += 1
        at = datetime.now(UTC) if stamped_by == "the cluster" else Off.now(UTC)
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO pages (url, domain, status, discovered_at) "
                    "VALUES (:url, 'new.example', 'fetched', :at)"
                ),
                {"url": f"https://new.example/{added}", "at": at},
            )
        return crawl.done()

    await eventually(a_page_more, until=bool, timeout=30, interval=0.5, what="the crawl ended")
    assert await crawl == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "not idle yet" not in printed  # ended at its page limit, not its timeout
