"""rel=me and Webmention links on real Postgres: stored as their own kinds, read by the CLI."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from trove_cli.report import build_report
from trove_cli.search import search
from trove_recorder.projections import apply_batch
from trove_recorder.retries import RetryPolicy
from trove_schema.events import CrawlCompleted, CrawlOutcome, Link, LinkKind, Scope

pytestmark = pytest.mark.usefixtures("clean")

URL = "https://ann.example/"
POLICY = RetryPolicy(max_attempts=3, delay_seconds=60.0)


def completed(url: str, links: list[Link], **fields: Any) -> CrawlCompleted:
    now = datetime.now(UTC)
    return CrawlCompleted(
        url=url,
        domain=url.split("/")[2],
        scope=Scope(value="ann.example"),
        request_id="00000000-0000-0000-0000-000000000001",
        outcome=CrawlOutcome.SUCCESS,
        started_at=now - timedelta(milliseconds=50),
        completed_at=now,
        links=links,
        **fields,
    )


async def project(engine: AsyncEngine, *events: CrawlCompleted) -> None:
    sessions = async_sessionmaker(engine)
    for event in events:
        async with sessions.begin() as session:
            assert (await apply_batch(session, [event], POLICY)).count == 1


async def test_me_and_webmention_links_are_recorded_with_their_kinds(engine: AsyncEngine) -> None:
    social, hooks = "https://social.example/@ann", "https://hooks.example/wm"
    await project(
        engine,
        completed(
            URL,
            [
                Link(url=social, kind=LinkKind.ME),
                Link(url="https://code.example/ann", kind=LinkKind.ME, nofollow=True),
                Link(url=hooks, kind=LinkKind.WEBMENTION),
                Link(url=social, kind=LinkKind.A),
            ],
            title="Ann's notes",
            keywords=("notes", "gardening"),
        ),
    )
    async with engine.connect() as conn:
        edges = (
            await conn.execute(
                text(
                    "SELECT t.url, l.kind, l.nofollow FROM page_links l "
                    "JOIN pages t ON t.id = l.to_page_id ORDER BY t.url, l.kind"
                )
            )
        ).all()
    assert [tuple(edge) for edge in edges] == [
        ("https://code.example/ann", "me", True),
        (hooks, "webmention", False),
        (social, "a", False),
        (social, "me", False),
    ]

    # The readers of the graph take the new kinds in their stride: only ``a`` links
    # count as citations.
    hits = await search(engine, "gardening")
    assert [hit.url for hit in hits] == [URL]
    report = await build_report(engine)
    assert report.links == 4
    assert [(url, n) for url, _, n in report.top_linked] == [(social, 1)]


async def test_a_recrawl_replaces_indieweb_links_like_any_other(engine: AsyncEngine) -> None:
    hooks = "https://hooks.example/wm"
    await project(
        engine,
        completed(URL, [Link(url=hooks, kind=LinkKind.WEBMENTION)]),
        completed(URL, [Link(url=hooks, kind=LinkKind.ME)]),
    )
    async with engine.connect() as conn:
        kinds = (await conn.execute(text("SELECT kinds FROM page_outlinks"))).scalars().all()
    assert kinds == [["me"]]
