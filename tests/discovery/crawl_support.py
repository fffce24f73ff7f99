"""Discovery handling one crawled page, read back from the real events stream."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Any

import nats.js.errors
from nats.aio.msg import Msg

from tests.conftest import eventually
from trove_discovery.discovery import Discovery, _seen_key
from trove_schema.budgets import HostCount, host_budget_key
from trove_schema.bus import Bus
from trove_schema.events import (
    CrawlCompleted,
    CrawlOutcome,
    Link,
    PageDiscovered,
    Scope,
    ScopeKind,
    decode_event,
    utcnow,
)
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import (
    EVENTS_STREAM,
    PAGE_DISCOVERED,
    SEEDS_STREAM,
    SEEDS_SUBJECT,
    SEEN_BUCKET,
)

PAGE = "https://site.example/"


async def discovered_after(
    bus: Bus,
    links: list[Link],
    scope: Scope,
    *,
    depth: int = 0,
    outcome: CrawlOutcome = CrawlOutcome.SUCCESS,
    settings: DiscoverySettings | None = None,
    **fields: Any,
) -> dict[str, PageDiscovered]:
    """What discovery publishes for a crawl of PAGE (at ``depth``) with these links (and
    the event's other ``fields``)."""
    discovery = Discovery(
        bus=bus,
        seen=await bus.js.key_value(SEEN_BUCKET),
        settings=settings or DiscoverySettings(),
    )
    now = utcnow()
    event = CrawlCompleted(
        url=PAGE,
        domain="site.example",
        depth=depth,
        scope=scope,
        request_id="work-1",
        outcome=outcome,
        started_at=now,
        completed_at=now,
        links=links,
        **fields,
    )
    await handle(discovery, bus, event)
    return {e.url: e for e in await discoveries(bus)}


def crawled(
    url: str, *links: str, completed_at: datetime | None = None, **fields: Any
) -> CrawlCompleted:
    """A page fetched (at ``completed_at``, now by default) with these links, within
    its host's scope."""
    at = completed_at or utcnow()
    host = url.split("/")[2]
    return CrawlCompleted(
        url=url,
        domain=host,
        scope=Scope(kind=ScopeKind.HOST, value=host, max_depth=5),
        request_id=f"work-{url}",
        outcome=CrawlOutcome.SUCCESS,
        status_code=200,
        started_at=at,
        completed_at=at,
        links=tuple(Link(url=link) for link in links),
        **fields,
    )


async def pages_counted(bus: Bus, host: str) -> int:
    """The pages of ``host`` its budget record counts this cycle."""
    entry = await (await bus.js.key_value(SEEN_BUCKET)).get(host_budget_key(host))
    return HostCount.from_bytes(entry.value).pages


async def handle(discovery: Discovery, bus: Bus, event: CrawlCompleted) -> None:
    """``discovery`` handles ``event`` as delivered by the stream."""
    await discovery.handle_crawl_completed(
        Msg(_client=bus.nc, subject=CrawlCompleted.SUBJECT, data=event.to_wire())
    )


async def claimed_at_each_visit(
    bus: Bus,
    discovery: Discovery,
    page: str,
    fresh: Callable[[int], list[str]],
    *,
    visits: int,
    next_visit: Callable[[], None],
) -> list[int]:
    """How many of its links new at each visit hold a seen key after ``discovery``
    handled ``page``, read whole at each of ``visits`` (``next_visit`` between them)."""
    seen = await bus.js.key_value(SEEN_BUCKET)
    claimed: list[int] = []
    for visit in range(visits):
        links = fresh(visit)
        event = crawled(page, *links)
        event = event.model_copy(update={"scope": Scope(kind=ScopeKind.OPEN, max_depth=5)})
        await handle(discovery, bus, event)
        keys = await asyncio.gather(
            *(seen.get(_seen_key(url)) for url in links), return_exceptions=True
        )
        claimed.append(sum(not isinstance(key, nats.js.errors.KeyNotFoundError) for key in keys))
        next_visit()
    return claimed


async def discoveries(bus: Bus) -> list[PageDiscovered]:
    """Every PageDiscovered in the record, in order (each publish got its PubAck: the
    stream holds them all)."""
    info = await bus.js.stream_info(EVENTS_STREAM, subjects_filter=PAGE_DISCOVERED)
    count = (info.state.subjects or {}).get(PAGE_DISCOVERED, 0)
    if count == 0:
        return []
    sub = await bus.js.pull_subscribe(PAGE_DISCOVERED, stream=EVENTS_STREAM)
    try:
        msgs = await sub.fetch(count, timeout=5)
    finally:
        await sub.unsubscribe()
    found = [decode_event(msg.data) for msg in msgs]
    return [e for e in found if isinstance(e, PageDiscovered)]


async def seed(bus: Bus, discovery: Discovery, payload: str) -> None:
    """``discovery`` handles ``payload`` as `nats pub trove.seeds` sends it."""
    await bus.nc.publish(SEEDS_SUBJECT, payload.encode())
    await bus.nc.flush()
    await eventually(
        lambda: bus.js.stream_info(SEEDS_STREAM),
        until=lambda info: info.state.messages == 1,
        timeout=5,
        what="the seed stored",
    )
    sub = await bus.js.pull_subscribe(SEEDS_SUBJECT, stream=SEEDS_STREAM)
    try:
        (msg,) = await sub.fetch(1, timeout=5)
        await discovery.handle_seed(msg)
    finally:
        await sub.unsubscribe()
