"""The per-host page budget, counted in the shared seen bucket on real NATS."""

from __future__ import annotations

import pytest

from trove_discovery.discovery import Discovery
from trove_schema.bus import Bus
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import SEEN_BUCKET

pytestmark = pytest.mark.usefixtures("clean")

BUDGET = 7


async def replica(bus: Bus) -> Discovery:
    settings = DiscoverySettings(host_page_budget=BUDGET)
    return Discovery(bus=bus, seen=await bus.js.key_value(SEEN_BUCKET), settings=settings)


async def one(discovery: Discovery, event_id: str) -> bool:
    return await discovery._within_budget("busy.example", [event_id]) == 1


async def test_two_replicas_interleaved_grant_exactly_the_budget(bus: Bus) -> None:
    # Each replica remembers the revision it wrote last; the other's writes make that
    # stale, so every grant here is a compare-and-set against a counter the other moved.
    first, second = await replica(bus), await replica(bus)
    granted = [await one(first if n % 3 else second, f"event-{n}") for n in range(3 * BUDGET)]
    assert granted == [True] * BUDGET + [False] * (2 * BUDGET)


async def test_the_same_event_again_is_granted_again(bus: Bus) -> None:
    # A redelivery of the event that took the last page must not be refused.
    first, second = await replica(bus), await replica(bus)
    for n in range(BUDGET):
        assert await one(first, f"event-{n}")
    assert await one(first, f"event-{BUDGET - 1}")
    assert await one(second, f"event-{BUDGET - 1}")
    assert not await one(first, "event-new")


async def test_a_refusal_is_read_from_the_bucket_not_memory(bus: Bus) -> None:
    # The cycle's counters expire with the bucket's keys; a host whose remembered count
    # is full is asked about again, and counts from zero once its key is gone.
    discovery = await replica(bus)
    for n in range(BUDGET):
        assert await one(discovery, f"event-{n}")
    assert not await one(discovery, "event-over")
    seen = await bus.js.key_value(SEEN_BUCKET)
    await seen.purge(next(k for k in await seen.keys() if k.startswith("b.")))
    assert await one(discovery, "event-next-cycle")


async def test_a_pages_new_links_to_a_host_are_counted_at_once_and_only_once(bus: Bus) -> None:
    # One write for a page's new pages of a host: as many as the budget has room for,
    # in order; the page handled again (a redelivery) is granted the same, no more.
    first, second = await replica(bus), await replica(bus)
    page = [f"page-a-{n}" for n in range(5)]
    assert await first._within_budget("busy.example", page) == 5
    assert await second._within_budget("busy.example", page) == 5
    other = [f"page-b-{n}" for n in range(5)]
    assert await first._within_budget("busy.example", other) == BUDGET - 5
    assert await second._within_budget("busy.example", other) == BUDGET - 5
    assert await first._within_budget("busy.example", ["page-c-0"]) == 0
