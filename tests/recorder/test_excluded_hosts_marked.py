"""The operator's excluded hosts in the tables (``trove_recorder.exclusions``): each
rule's pages marked rejected once, the names below it with it, nothing else."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.kv import KeyValue
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import eventually, reading
from tests.recorder.test_projections import completed, project, rows
from trove_recorder import exclusions
from trove_recorder.exclusions import held, keep_excluded_marked, mark_excluded
from trove_recorder.replay import PROJECTION_TABLES
from trove_schema.exclusions import Exclusions, ListedExclusions

pytestmark = pytest.mark.usefixtures("clean")

PAGES = {
    "https://blog.example/": "blog.example",
    "https://www.blog.example/post": "www.blog.example",
    "https://notblog.example/": "notblog.example",  # ends with the rule, not below it
    "http://10.0.0.1/": "10.0.0.1",
    "http://110.0.0.1/": "110.0.0.1",
}

#: ``PAGES`` once "blog.example" is excluded: the host and the names below it.
BLOG_EXCLUDED = {
    "https://blog.example/": "rejected",
    "https://www.blog.example/post": "rejected",
    "https://notblog.example/": "fetched",
    "http://10.0.0.1/": "fetched",
    "http://110.0.0.1/": "fetched",
}


async def crawled_pages(engine: AsyncEngine) -> None:
    for number, (url, domain) in enumerate(PAGES.items(), start=1):
        await project(
            engine,
            completed(url=url, domain=domain, request_id=f"00000000-0000-0000-0000-{number:012}"),
        )


async def statuses(engine: AsyncEngine) -> dict[str, Any]:
    return dict(await rows(engine, "SELECT url, status FROM pages"))


async def test_a_rule_marks_its_host_and_every_name_below_it_and_nothing_else(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hosts read two at a time, as a broad crawl's millions are read in parts.
    monkeypatch.setattr(exclusions, "HOSTS_READ_AT_ONCE", 2)
    await crawled_pages(engine)
    # "log.example" ends as "blog.example" does, a label short: it covers nothing here.
    marked = await mark_excluded(engine, frozenset({"blog.example", "log.example"}))
    assert marked == {"blog.example": 2, "log.example": 0}
    assert await statuses(engine) == BLOG_EXCLUDED
    # An address covers itself alone, not the addresses that end as it does.
    again = frozenset({"blog.example", "log.example", "10.0.0.1"})
    assert await mark_excluded(engine, again) == {"10.0.0.1": 1}
    assert (await statuses(engine))["http://110.0.0.1/"] == "fetched"


async def test_a_rule_is_marked_once_lifted_with_the_list_and_again_after_a_replay(
    engine: AsyncEngine,
) -> None:
    await crawled_pages(engine)
    rules = frozenset({"blog.example"})
    assert await mark_excluded(engine, rules) == {"blog.example": 2}
    # Another replica, or the next look: nothing new to mark.
    assert await mark_excluded(engine, rules) == {}
    assert await held(engine) == rules
    # Lifted: out of the table; its pages come back with their next visits.
    assert await mark_excluded(engine, frozenset()) == {}
    assert await held(engine) == frozenset()
    # A whole replay empties the tables, this one with them, and writes the pages
    # again as the events say: marked again at the next look.
    assert await mark_excluded(engine, rules) == {"blog.example": 0}
    async with engine.begin() as conn:
        await conn.execute(text(f"TRUNCATE {', '.join(PROJECTION_TABLES)} RESTART IDENTITY"))
    await crawled_pages(engine)
    assert await mark_excluded(engine, rules) == {"blog.example": 2}


async def test_a_visit_written_after_the_mark_is_marked_at_the_next_look(
    engine: AsyncEngine,
) -> None:
    await crawled_pages(engine)
    rules = frozenset({"blog.example"})
    assert await mark_excluded(engine, rules) == {"blog.example": 2}
    # A visit that ended before the rule reached the fetchers, projected after the mark.
    late = "00000000-0000-0000-0000-000000000101"
    await project(engine, completed(url="https://blog.example/", request_id=late))
    # And a batch still open while the next look runs: its write is not seen then.
    async with engine.connect() as batch:
        await batch.execute(
            text("UPDATE pages SET status = 'fetched' WHERE domain = 'www.blog.example'")
        )
        assert await mark_excluded(engine, rules) == {"blog.example": 1}
        await batch.commit()
    assert (await statuses(engine))["https://www.blog.example/post"] == "fetched"

    assert await mark_excluded(engine, rules) == {"blog.example": 1}
    assert await mark_excluded(engine, rules) == {}
    assert await statuses(engine) == BLOG_EXCLUDED


class ListAway:
    """The shared list's bucket while the broker is away: every read times out."""

    def __init__(self) -> None:
        self.reads = 0

    async def get(self, key: str) -> object:
        self.reads += 1
        raise NatsTimeoutError


async def test_a_recorder_that_cannot_read_the_list_leaves_its_rules_marks_as_they_are(
    engine: AsyncEngine,
) -> None:
    """Started with the broker away: the configured rules alone (none here) would lift
    the marks of every listed rule, and the list, read later, mark them all again, each
    a scan of every host. The looks wait for the list instead."""
    await crawled_pages(engine)
    rules = frozenset({"blog.example"})
    assert await mark_excluded(engine, rules) == {"blog.example": 2}  # before the restart
    bucket = ListAway()
    listed = ListedExclusions(Exclusions(), cast(KeyValue, bucket), interval=0.05)
    stop = asyncio.Event()
    looking = asyncio.create_task(keep_excluded_marked(engine, listed, stop))
    try:
        await eventually(reading(lambda: bucket.reads), until=lambda reads: reads >= 3, timeout=10)
    finally:
        stop.set()
        await asyncio.wait_for(looking, timeout=10)
    assert await held(engine) == rules
    assert await statuses(engine) == BLOG_EXCLUDED
