"""A page the site asks not to index while it stays the same is answered 304 at every
visit: that 304's noindex leaves the page out of search, and a 304 that says nothing of
it (a 304 need not repeat the headers of the answer it stands for) changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from trove_recorder.projections import apply_batch
from trove_recorder.retries import RetryPolicy
from trove_schema.events import CrawlCompleted, CrawlOutcome, Scope

pytestmark = pytest.mark.usefixtures("clean")

URL = "https://unchanged.example/page"
POLICY = RetryPolicy(max_attempts=3, delay_seconds=60.0)
START = datetime.now(UTC) - timedelta(hours=3)


def attempt(n: int, outcome: CrawlOutcome, *, url: str = URL, **fields: Any) -> CrawlCompleted:
    """The ``n``-th attempt on ``url``, a minute after the one before."""
    return CrawlCompleted(
        url=url,
        domain="unchanged.example",
        scope=Scope(value="unchanged.example"),
        request_id=f"00000000-0000-0000-0000-{n:012d}",
        outcome=outcome,
        status_code=304 if outcome is CrawlOutcome.NOT_MODIFIED else 200,
        started_at=START + timedelta(minutes=n, milliseconds=-100),
        completed_at=START + timedelta(minutes=n),
        **fields,
    )


def success(n: int, *, url: str = URL, noindex: bool = False) -> CrawlCompleted:
    return attempt(n, CrawlOutcome.SUCCESS, url=url, title="Same", etag='"v1"', noindex=noindex)


def not_modified(n: int, *, url: str = URL, noindex: bool = False) -> CrawlCompleted:
    return attempt(n, CrawlOutcome.NOT_MODIFIED, url=url, etag='"v1"', noindex=noindex)


async def project(engine: AsyncEngine, *batches: list[CrawlCompleted]) -> None:
    sessions = async_sessionmaker(engine)
    for batch in batches:
        async with sessions.begin() as session:
            await apply_batch(session, batch, POLICY)


async def noindex(engine: AsyncEngine, url: str = URL) -> bool:
    async with engine.connect() as conn:
        found = await conn.execute(text("SELECT noindex FROM pages WHERE url = :u"), {"u": url})
        return bool(found.scalar_one())


async def test_a_304_saying_noindex_makes_an_indexable_page_noindex(engine: AsyncEngine) -> None:
    await project(engine, [success(1)])
    assert not await noindex(engine)
    await project(engine, [not_modified(2, noindex=True)])
    assert await noindex(engine)


async def test_a_304_saying_nothing_of_noindex_keeps_a_noindex_page_noindex(
    engine: AsyncEngine,
) -> None:
    told, read = f"{URL}/told-by-a-304", f"{URL}/read-noindex"
    await project(engine, [success(1, url=told)], [not_modified(2, url=told, noindex=True)])
    await project(engine, [success(1, url=read, noindex=True)])
    await project(engine, [not_modified(3, url=told)], [not_modified(3, url=read)])
    assert await noindex(engine, told)
    assert await noindex(engine, read)


async def test_a_304s_noindex_holds_however_its_attempts_are_batched_or_arrive(
    engine: AsyncEngine,
) -> None:
    """A replay's batch, or an older success redriven after the 304, leaves the page as
    the attempts did in the order they completed."""

    def history(url: str) -> list[CrawlCompleted]:
        return [
            success(1, url=url),
            not_modified(2, url=url, noindex=True),
            not_modified(3, url=url),
        ]

    in_order, batched, reversed_url = (f"{URL}/{name}" for name in ("in-order", "batch", "rev"))
    await project(engine, *([a] for a in history(in_order)))
    await project(engine, history(batched))
    await project(engine, *([a] for a in reversed(history(reversed_url))))
    for url in (in_order, batched, reversed_url):
        assert await noindex(engine, url), url


async def test_a_success_after_a_304s_noindex_says_the_page_may_be_indexed_again(
    engine: AsyncEngine,
) -> None:
    await project(engine, [success(1)], [not_modified(2, noindex=True)], [success(3)])
    assert not await noindex(engine)
