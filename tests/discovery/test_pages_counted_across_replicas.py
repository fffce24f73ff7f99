"""A page handled again on another discovery replica counts each page of its host once.

Replicas come and go (scaled out for a burst of seeds and back, a rolling update, a pod
killed mid-page), so a page's deliveries land on different ones. A page whose links wait
while its host's URL aliases are learned (``Holds``) comes back round after round, and a
replica remembers only what it held itself. Each host's budget record names the pages
each cause counted, so whichever replica handles the next round, and whatever it holds
or lets through, counts the host's pages once: the count equals the pages discovered.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest
from nats.aio.msg import Msg

from tests.discovery.crawl_support import discoveries, pages_counted
from trove_discovery.discovery import Discovery
from trove_discovery.url_rules import Holds, UrlRules
from trove_schema.bus import Bus, Retry
from trove_schema.events import (
    CrawlCompleted,
    CrawlOutcome,
    Event,
    Link,
    PageDiscovered,
    Scope,
    ScopeKind,
    utcnow,
)
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import DISCOVERY_LINKS, EVENTS_STREAM, SEEN_BUCKET, URL_RULES_BUCKET

pytestmark = pytest.mark.usefixtures("clean")

SITE = "https://site.example"
SCOPE = Scope(kind=ScopeKind.HOST, value="site.example", max_depth=5)
#: Pages that each have their own ``?id=`` (a real parameter, once two probes say so).
BY_ID = tuple(f"/p/{n}?id={n}" for n in range(1, 9))
#: A list's pages, whose ``?page=`` is not learned in these rounds.
LISTS = tuple(f"/list?page={n}" for n in range(2, 6))


class Killed(BaseException):
    """The pod is gone (OOM-killed, a node drained) in the middle of a page."""


class _DiesBeforePublishing:
    """A replica's bus that dies as it publishes the pages it counted."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

    async def publish(self, event: Event, **kwargs: Any) -> None:
        if isinstance(event, PageDiscovered):
            raise Killed("killed mid-page")
        await self._bus.publish(event, **kwargs)


async def replica(bus: Bus) -> Discovery:
    settings = DiscoverySettings()  # a hold of 10 s doubled over 3 rounds
    return Discovery(
        bus=bus,
        seen=await bus.js.key_value(SEEN_BUCKET),
        settings=settings,
        # The rules are learned on A, which each replica reads first after that.
        url_rules=UrlRules(await bus.js.key_value(URL_RULES_BUCKET), ttl=5.0),
        holds=Holds(first=settings.alias_hold_seconds, rounds=settings.alias_hold_rounds),
    )


def page(path: str, links: tuple[str, ...] = ()) -> CrawlCompleted:
    now = utcnow()
    return CrawlCompleted(
        url=SITE + path,
        domain="site.example",
        scope=SCOPE,
        request_id="work-" + path,
        outcome=CrawlOutcome.SUCCESS,
        started_at=now,
        completed_at=now,
        content_hash=hashlib.sha256(path.encode()).hexdigest(),
        title="page " + path,
        links=tuple(Link(url=SITE + link) for link in links),
    )


async def deliver(discovery: Discovery, bus: Bus, event: CrawlCompleted, n: int) -> bool:
    """``discovery`` handles the ``n``-th delivery of ``event``; whether it was handed
    back (``Retry``: links held)."""
    msg = Msg(
        _client=bus.nc,
        subject=CrawlCompleted.SUBJECT,
        data=event.to_wire(),
        reply=f"$JS.ACK.{EVENTS_STREAM}.{DISCOVERY_LINKS}.{n}.7.7.0.0",
    )
    try:
        await discovery.handle_crawl_completed(msg)
    except Retry:
        return True
    return False


async def teach_ids(discovery: Discovery, bus: Bus) -> None:
    """The two probes of ``?id=`` come back, each its own page: a real parameter."""
    for n in (1, 2):
        await deliver(discovery, bus, page(f"/p/{n}?id={n}"), 1)


async def from_hub(bus: Bus, hub: CrawlCompleted) -> set[str]:
    return {e.url for e in await discoveries(bus) if e.provenance.source_url == hub.url}


async def test_a_round_back_on_the_replica_that_held_after_another_counted_counts_nothing_twice(
    bus: Bus,
) -> None:
    a, b = await replica(bus), await replica(bus)
    hub = page("/p/0", BY_ID)
    assert await deliver(a, bus, hub, 1)  # two probes out, six links held on A
    await teach_ids(a, bus)
    b.bus = _DiesBeforePublishing(bus)  # type: ignore[assignment]
    with pytest.raises(Killed):
        await deliver(b, bus, hub, 2)  # counted the six, gone before publishing them
    assert not await deliver(a, bus, hub, 3)

    assert await from_hub(bus, hub) == {SITE + link for link in BY_ID}
    assert await pages_counted(bus, "site.example") == len(BY_ID)


async def handled_until_done(
    bus: Bus, hub: CrawlCompleted, first: Discovery, later: Callable[[int], Discovery]
) -> set[str]:
    """Every round of ``hub`` until one is not handed back: the first on ``first``
    (whose links' probes then teach ``?id=``), the ``n``-th on ``later(n)``; the pages
    it discovered."""
    handed_back, n = True, 0
    while handed_back:
        n += 1
        handed_back = await deliver(first if n == 1 else later(n), bus, hub, n)
        if n == 1:
            await teach_ids(first, bus)
        assert n < 10, "the page is handed back without end"
    return await from_hub(bus, hub)


async def test_a_page_whose_rounds_alternate_between_replicas_counts_each_page_once(
    bus: Bus,
) -> None:
    a, b = await replica(bus), await replica(bus)
    hub = page("/p/0", BY_ID + LISTS)

    found = await handled_until_done(bus, hub, a, lambda n: a if n % 2 else b)

    # Every link, once its round let it through: none dropped by a round that read only
    # what its replica held long before.
    assert found == {SITE + link for link in BY_ID + LISTS}
    assert await pages_counted(bus, "site.example") == len(found)


async def test_a_page_handed_to_another_replica_for_its_later_rounds_counts_each_page_once(
    bus: Bus,
) -> None:
    a, b = await replica(bus), await replica(bus)
    hub = page("/p/0", BY_ID + LISTS)

    found = await handled_until_done(bus, hub, a, lambda n: b)

    assert found == {SITE + link for link in BY_ID + LISTS}
    assert await pages_counted(bus, "site.example") == len(found)
