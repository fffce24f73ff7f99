from __future__ import annotations

import asyncio

import pytest

from trove_fetcher.politeness import (
    BUSY_RECHECK,
    Deferred,
    Granted,
    Politeness,
    PolitenessConfig,
)
from trove_schema.bus import Bus
from trove_schema.topology import DOMAINS_BUCKET

pytestmark = pytest.mark.usefixtures("clean")

CONFIG = PolitenessConfig(min_delay=10.0, max_delay=60.0, request_timeout=30.0)


async def _politeness(bus: Bus, config: PolitenessConfig = CONFIG) -> Politeness:
    return Politeness(await bus.js.key_value(DOMAINS_BUCKET), config)


async def test_first_lease_on_a_domain_is_granted(bus: Bus) -> None:
    p = await _politeness(bus)
    assert isinstance(await p.acquire("a.example", 1000.0), Granted)


async def test_second_lease_on_a_domain_is_refused(bus: Bus) -> None:
    p = await _politeness(bus)
    await p.acquire("a.example", 1000.0)
    second = await p.acquire("a.example", 1000.5)
    assert isinstance(second, Deferred)
    assert second.at >= 1010.0


async def test_with_no_gap_a_job_waiting_on_a_busy_domain_does_not_poll_in_a_loop(
    bus: Bus,
) -> None:
    # Gap 0 (the throughput benchmark): the domain is free the moment its request ends,
    # which no pod can know ahead; the waiting job is told to look again a little later,
    # not at once (it read the record in a tight loop).
    p = await _politeness(bus, PolitenessConfig(min_delay=0.0, request_timeout=30.0))
    assert isinstance(await p.acquire("fast.example", 1000.0), Granted)
    waiting = await p.acquire("fast.example", 1000.01, reserved=True)
    assert isinstance(waiting, Deferred)
    assert waiting.at >= 1000.01 + BUSY_RECHECK


async def test_other_domains_are_not_held_up(bus: Bus) -> None:
    p = await _politeness(bus)
    await p.acquire("a.example", 1000.0)
    assert isinstance(await p.acquire("b.example", 1000.0), Granted)


async def test_concurrent_acquires_from_many_pods_have_one_winner(bus: Bus) -> None:
    pods = [await _politeness(bus) for _ in range(8)]
    results = await asyncio.gather(*(p.acquire("busy.example", 2000.0) for p in pods))
    assert sum(isinstance(r, Granted) for r in results) == 1


async def test_waiting_messages_get_successive_slots_one_gap_apart(bus: Bus) -> None:
    p = await _politeness(bus)
    await p.acquire("q.example", 1000.0)
    slots = []
    for _ in range(5):
        decision = await p.acquire("q.example", 1000.1)
        assert isinstance(decision, Deferred)
        slots.append(decision.at)
    assert slots == [1010.0, 1020.0, 1030.0, 1040.0, 1050.0]


async def test_gap_is_measured_from_the_end_of_the_response(bus: Bus) -> None:
    p = await _politeness(bus)
    grant = await p.acquire("slow.example", 1000.0)
    assert isinstance(grant, Granted)
    # While the request is in flight the domain is held, even past one gap.
    assert isinstance(await p.acquire("slow.example", 1015.0, reserved=True), Deferred)
    await p.finish("slow.example", grant, end=1017.0)
    early = await p.acquire("slow.example", 1026.0, reserved=True)
    assert isinstance(early, Deferred)
    assert early.at == pytest.approx(1027.0)
    assert isinstance(await p.acquire("slow.example", 1027.0, reserved=True), Granted)


async def test_crawl_delay_raises_the_gap_within_the_maximum(bus: Bus) -> None:
    p = await _politeness(bus)
    assert await p.set_gap("cd.example", 25.0) == 25.0
    assert await p.set_gap("cd.example", 500.0) == 60.0
    assert await p.set_gap("cd.example", 1.0) == 10.0


async def test_retry_after_backs_off_the_domain_for_every_pod(bus: Bus) -> None:
    p1, p2 = await _politeness(bus), await _politeness(bus)
    grant = await p1.acquire("limited.example", 1000.0)
    assert isinstance(grant, Granted)
    await p1.finish("limited.example", grant, end=1000.5)
    await p1.back_off("limited.example", until=1300.0, now=1000.5)
    decision = await p2.acquire("limited.example", 1100.0, reserved=True)
    assert isinstance(decision, Deferred)
    assert decision.at == 1300.0


async def test_backoff_is_capped(bus: Bus) -> None:
    p = await _politeness(bus, PolitenessConfig(min_delay=1.0, max_backoff=100.0))
    await p.back_off("capped.example", until=1_000_000.0, now=1000.0)
    assert (await p.state("capped.example")).backoff_until == 1100.0


async def test_a_pod_whose_memory_of_the_domain_is_stale_still_sees_the_other_pods_lease(
    bus: Bus,
) -> None:
    a, b = await _politeness(bus), await _politeness(bus)
    first = await a.acquire("shared.example", 1000.0)
    assert isinstance(first, Granted)
    await a.finish("shared.example", first, 1001.0)  # a remembers: free from 1011
    held = await b.acquire("shared.example", 1011.0)  # b's request is in flight now
    assert isinstance(held, Granted)
    again = await a.acquire("shared.example", 1012.0)
    assert isinstance(again, Deferred)
    assert again.at >= 1021.0
