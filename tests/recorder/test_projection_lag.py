"""``trove_projection_lag_seconds``: how long ago the stream stored what the recorder
just applied, not how old its events are."""

from __future__ import annotations

from datetime import timedelta

import pytest
from prometheus_client import REGISTRY
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support import query
from trove_recorder.recorder import Recorder
from trove_recorder.retries import RetryPolicy
from trove_schema.bus import Bus
from trove_schema.events import CrawlRequested, RequestReason, Scope, utcnow
from trove_schema.topology import EVENTS_STREAM, page_schedule_subject

pytestmark = pytest.mark.usefixtures("clean")

PAGE = "https://blog.example/old-post"


async def test_a_recrawl_request_scheduled_long_ago_and_fired_now_is_not_late(
    bus: Bus, engine: AsyncEngine
) -> None:
    # A re-crawl is stamped when it is scheduled and fired by JetStream its interval later:
    # a batch of such requests alone is as fresh as the moment they were fired.
    recrawl = CrawlRequested(
        url=PAGE,
        domain="blog.example",
        scope=Scope(value="blog.example"),
        reason=RequestReason.RECRAWL,
        occurred_at=utcnow() - timedelta(days=90),
    )
    sub = await bus.js.pull_subscribe(CrawlRequested.SUBJECT, durable=None, stream=EVENTS_STREAM)
    try:
        await bus.publish_at(
            recrawl, utcnow() + timedelta(seconds=1), schedule=page_schedule_subject(PAGE)
        )
        (fired,) = await sub.fetch(1, timeout=30)
    finally:
        await sub.unsubscribe()
    assert fired.metadata.timestamp - recrawl.occurred_at > timedelta(days=89)

    await Recorder(engine, bus, RetryPolicy()).handle_batch([fired])

    rows = await query(engine, "SELECT event_id FROM projected_events")
    assert [str(row.event_id) for row in rows] == [recrawl.id]
    lag = REGISTRY.get_sample_value("trove_projection_lag_seconds")
    assert lag is not None
    assert 0 <= lag < 60, lag
