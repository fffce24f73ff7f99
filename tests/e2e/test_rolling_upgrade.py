"""A rolling upgrade loses nothing: consumers older than their producer read what they know."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.support import query, services
from trove_schema.bus import Bus
from trove_schema.events import CrawlCompleted, CrawlOutcome, Link, Scope, utcnow
from trove_schema.topology import CRAWL_COMPLETED, DEAD_STREAM

pytestmark = pytest.mark.usefixtures("clean")


async def test_an_event_from_a_newer_producer_is_handled_by_the_recorder_and_discovery(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    now = utcnow()
    event = CrawlCompleted(
        url="https://blog.example/",
        domain="blog.example",
        scope=Scope(value="blog.example"),
        request_id="00000000-0000-0000-0000-000000000001",
        outcome=CrawlOutcome.SUCCESS,
        started_at=now,
        completed_at=now,
        title="Home",
        links=(Link(url="https://blog.example/next"),),
    )
    # What a producer one version ahead sends: a field this code lacks, at two depths.
    wire = json.loads(event.to_wire())
    wire |= {"version": CrawlCompleted.VERSION + 1, "reading_minutes": 4}
    wire["links"][0]["rel"] = "next"

    async with services(stack, state_dir, {}, only=("recorder", "discovery")):
        await bus.js.publish(CRAWL_COMPLETED, json.dumps(wire).encode(), headers=event.headers())

        async def recorded() -> list[str]:
            rows = await query(
                engine,
                "SELECT p.url FROM pages p WHERE p.discovered_at IS NOT NULL "
                "OR EXISTS (SELECT 1 FROM page_crawls c WHERE c.page_id = p.id) ORDER BY 1",
            )
            return [r.url for r in rows]

        # The recorder projected the attempt; discovery followed its link, and the
        # recorder projected that discovery too.
        await eventually(
            recorded,
            until=lambda urls: urls == ["https://blog.example/", "https://blog.example/next"],
            timeout=30,
            what="the attempt and the discovered link recorded",
        )
    (title,) = await query(engine, "SELECT title FROM pages WHERE url = 'https://blog.example/'")
    assert title.title == "Home"
    assert (await bus.js.stream_info(DEAD_STREAM)).state.messages == 0
