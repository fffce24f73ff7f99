"""An index kept from the tables reads each change once, in commit order
(``trove_schema.changes``), written by the recorder's own projection."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from tests.recorder.test_projections import POLICY, completed, project
from trove_recorder.projections import apply_batch
from trove_schema.changes import ChangedPage, changed_pages, window_end
from trove_schema.errors import WindowLost
from trove_schema.events import CrawlCompleted, CrawlOutcome

pytestmark = pytest.mark.usefixtures("clean")

EARLY = "https://early.example/post"
LATE = "https://late.example/post"


def crawled(
    url: str, outcome: CrawlOutcome = CrawlOutcome.SUCCESS, **fields: Any
) -> CrawlCompleted:
    domain = url.split("/")[2]
    return completed(outcome, url=url, domain=domain, **fields)


class Index:
    """What an index keeps: each pass reads the window since the last one."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.since: int | None = None
        self.passes: list[list[ChangedPage]] = []

    async def read(self, page_size: int = 2) -> list[ChangedPage]:
        read: list[ChangedPage] = []
        async with self.engine.connect() as conn:
            until = await window_end(conn)
            after = 0
            while batch := await changed_pages(
                conn, self.since, until, after=after, limit=page_size
            ):
                read += batch
                after = batch[-1].id
        self.since = until
        self.passes.append(read)
        return read


def urls(pages: list[ChangedPage]) -> set[str]:
    return {page.url for page in pages}


async def test_a_batch_that_began_before_a_read_and_committed_after_is_read_next(
    engine: AsyncEngine,
) -> None:
    # With updated_at (the transaction's start) as the cursor, the 410 committed after
    # the read that moved the cursor past it was never seen: the page stayed indexed.
    await project(engine, crawled(EARLY, title="early"), crawled(LATE, title="late"))
    index = Index(engine)
    first = await index.read()
    assert urls(first) == {EARLY, LATE}
    assert all(page.indexable for page in first)

    sessions = async_sessionmaker(engine)
    async with sessions.begin() as slow:  # a batch that takes its time
        gone = crawled(EARLY, CrawlOutcome.BLOCKED_4XX, status_code=410)
        await apply_batch(slow, [gone], POLICY)
        await project(engine, crawled(LATE, title="late, edited"))
        # The window ends at the oldest write still running: the edit committed after
        # it waits with it (a slow write delays what is read, and loses nothing).
        assert await index.read() == []
    after = {page.url: page for page in await index.read()}
    assert after.keys() == {EARLY, LATE}
    assert (after[EARLY].status, after[EARLY].indexable) == ("failed", False)
    assert (after[LATE].title, after[LATE].indexable) == ("late, edited", True)
    assert await index.read() == []  # each change once


async def test_a_recrawl_that_changes_nothing_an_index_reads_is_not_a_change(
    engine: AsyncEngine,
) -> None:
    later = datetime.now(UTC) + timedelta(days=7)
    await project(engine, crawled(EARLY, title="same", keywords=("alpha", "beta")))
    index = Index(engine)
    await index.read()
    await project(
        engine,
        crawled(
            EARLY,
            title="same",
            keywords=("alpha", "beta"),
            started_at=later,
            completed_at=later + timedelta(seconds=1),
            request_id="00000000-0000-0000-0000-000000000002",
        ),
    )
    assert await index.read() == []
    async with engine.connect() as conn:
        visited = text("SELECT last_crawled_at FROM pages WHERE url = :u")
        crawled_at = (await conn.execute(visited, {"u": EARLY})).scalar_one()
    assert crawled_at > later  # the row was written: the visit is there
    latest = later + timedelta(days=7)
    await project(
        engine,
        crawled(
            EARLY,
            title="same",
            keywords=("alpha", "beta"),
            noindex=True,
            started_at=latest,
            completed_at=latest + timedelta(seconds=1),
            request_id="00000000-0000-0000-0000-000000000003",
        ),
    )
    (now_noindex,) = await index.read()
    assert (now_noindex.noindex, now_noindex.indexable) == (True, False)


async def test_a_window_past_the_databases_transactions_is_refused_not_read_empty(
    engine: AsyncEngine,
) -> None:
    # An index moved to a restored backup, or to a standby promoted before it had every
    # commit: its ids are counted again below the bound the index kept.
    index = Index(engine)
    await project(engine, crawled(EARLY))
    assert urls(await index.read()) == {EARLY}
    assert index.since is not None
    index.since += 1_000_000
    with pytest.raises(WindowLost, match="read every page again"):
        await index.read()
