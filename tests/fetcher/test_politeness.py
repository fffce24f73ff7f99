from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import logging
import math
import random
import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import nats
import pytest

from trove_fetcher.app import warn_of_a_short_gap
from trove_fetcher.politeness import (
    BUSY_RECHECK,
    HOLD_SLACK,
    KV,
    MAX_DELAY_ORIGINS,
    POLICY_KEY,
    CrawlDelay,
    Deferred,
    DomainSlot,
    Granted,
    Moved,
    Politeness,
    PolitenessConfig,
)
from trove_schema.bus import Bus
from trove_schema.events import CrawlCompleted, CrawlOutcome, Scope, derived_event_id
from trove_schema.policy import HostPolicy, LearningConfig, Observation
from trove_schema.settings import FetcherSettings
from trove_schema.topology import DOMAINS_BUCKET

pytestmark = pytest.mark.usefixtures("clean")

CONFIG = PolitenessConfig(min_delay=10.0, max_delay=60.0, request_timeout=30.0)
LEARNING = LearningConfig(
    min_gap=10.0, max_gap=60.0, response_factor=10.0, pause_base=60.0, rate_base=60.0
)


class CountingKV:
    """The real bucket, and the calls made to it."""

    def __init__(self, kv: KV) -> None:
        self.kv = kv
        self.calls: list[str] = []

    async def get(self, key: str) -> object:
        self.calls.append("get")
        return await self.kv.get(key)

    async def create(self, key: str, value: bytes) -> int:
        self.calls.append("create")
        return await self.kv.create(key, value)

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        self.calls.append("update")
        return await self.kv.update(key, value, last=last)


class SharedClock:
    """The pods' shared time as a test sets it; by default never later than the
    instants the test hands each call."""

    def __init__(self, at: float = 0.0) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


async def _politeness(
    bus: Bus,
    config: PolitenessConfig = CONFIG,
    learning: LearningConfig = LEARNING,
    clock: SharedClock | None = None,
) -> Politeness:
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    return Politeness(kv, config, learning, clock=clock or SharedClock())


def attempt(
    domain: str,
    *,
    end: float,
    outcome: CrawlOutcome = CrawlOutcome.SUCCESS,
    status: int | None = 200,
    duration: float = 0.05,
    retry_after: float | None = None,
    path: str = "/p",
) -> Observation:
    """What one attempt on ``domain`` ending at ``end`` says, as the fetcher derives it."""
    url = f"http://{domain}{path}"
    success = outcome is CrawlOutcome.SUCCESS
    event = CrawlCompleted(
        url=url,
        domain=domain,
        scope=Scope(value=domain),
        request_id=derived_event_id(url, "test"),
        outcome=outcome,
        status_code=status,
        started_at=datetime.fromtimestamp(end - duration, UTC),
        completed_at=datetime.fromtimestamp(end, UTC),
        retry_after=retry_after,
        content_type="text/html" if success else None,
        title="a page" if success else None,
        text_chars=2000 if success else None,
        content_hash="0" * 64 if success else None,
        duration_ms=int(duration * 1000),
        strategy_reason="only",
    )
    return Observation.of(event)


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


async def test_a_hold_nobody_released_rests_the_host_a_gap_after_it_expires(bus: Bus) -> None:
    # The pod holding the lease died (or lost the broker) before its release: its
    # request may have ended as late as the hold, so the next one waits a gap more.
    dead, alive = await _politeness(bus), await _politeness(bus)
    held = await dead.acquire("slow.example", 1000.0)
    assert isinstance(held, Granted)
    rested = held.hold_until + CONFIG.min_delay
    expired = held.hold_until + 0.01
    # Told to come back when the host has rested, fresh or reserved, not asked again
    # and again in the meantime.
    fresh = await alive.acquire("slow.example", expired)
    assert isinstance(fresh, Deferred)
    assert fresh.at >= rested
    reserved = await alive.acquire("slow.example", expired, reserved=True)
    assert isinstance(reserved, Deferred)
    assert reserved.at >= rested
    later = await alive.acquire("slow.example", rested, reserved=True)
    assert isinstance(later, Granted)


@pytest.mark.parametrize("domain", [".lead.example", "two..dots.example", "tail.example."])
async def test_a_host_that_is_no_valid_key_is_leased_under_a_hash(bus: Bus, domain: str) -> None:
    # A robots.txt redirect may name any host; as a key, the client or the server
    # refused these, and the page's work failed at every try.
    p = await _politeness(bus)
    assert isinstance(await p.acquire(domain, 1000.0), Granted)
    assert isinstance(await p.acquire(domain, 1001.0), Deferred)


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
    assert [p.clamp_gap(delay) for delay in (25.0, 500.0, 1.0)] == [25.0, 60.0, 10.0]
    # robots.txt's answer sets it with its release, counted from that answer's end.
    robots = await p.acquire("cd.example", 1000.0)
    assert isinstance(robots, Granted)
    await p.finish(
        "cd.example",
        robots,
        1000.5,
        delays=(CrawlDelay("https://cd.example", p.clamp_gap(25.0), 2000.0),),
    )
    page = await p.acquire("cd.example", 1011.0)
    assert isinstance(page, Deferred)
    assert page.at == pytest.approx(1025.5)
    # Every pod sees it: another one's lease waits for it too.
    other = await (await _politeness(bus)).acquire("cd.example", 1011.0, reserved=True)
    assert isinstance(other, Deferred)
    assert other.at == pytest.approx(1025.5)


def test_a_hosts_gap_is_the_largest_crawl_delay_of_its_origins_files_not_expired() -> None:
    slot = DomainSlot(gap=10.0)
    slot.set_delay(CrawlDelay("https://h.example", 30.0, until=2000.0), 1000.0)
    slot.set_delay(CrawlDelay("http://h.example", 10.0, until=2100.0), 1050.0)
    assert slot.gap == 30.0
    # The https file asks for less: the host follows it.
    slot.set_delay(CrawlDelay("https://h.example", 20.0, until=3000.0), 1100.0)
    assert slot.gap == 20.0
    # Its file expired and not read again: the http file's is what holds.
    slot.set_delay(CrawlDelay("http://h.example", 10.0, until=4000.0), 3500.0)
    assert (slot.gap, list(slot.delays)) == (10.0, ["http://h.example"])
    # Ports without end: the largest are kept, the record stays small.
    for port in range(100):
        slot.set_delay(CrawlDelay(f"https://h.example:{port}", 10.0 + port, 5000.0), 3600.0)
    assert len(slot.delays) == MAX_DELAY_ORIGINS
    assert slot.gap == 109.0
    again = DomainSlot.decode(slot.encode(), 10.0)
    assert (again.gap, again.delays) == (slot.gap, slot.delays)


def test_a_gap_raised_in_a_record_an_older_pod_wrote_is_kept_a_day() -> None:
    # Its origins not kept: the https file's 30 s, then the http origin's file read.
    slot = DomainSlot.decode(DomainSlot(gap=30.0).encode(), 10.0)
    slot.set_delay(CrawlDelay("http://h.example", 10.0, until=90_000.0), 1_000.0)
    assert slot.gap == 30.0
    slot.set_delay(CrawlDelay("http://h.example", 10.0, until=200_000.0), 88_000.0)
    assert slot.gap == 10.0


@pytest.mark.parametrize(
    ("unreadable", "waits_until"),
    [
        ({"claimed": None}, 4600.0),
        ({"next": {"at": 1}}, 4600.0),
        ({"gap": "ten"}, 4600.0),
        ({"free_at": float("nan")}, 4600.0),
        ({"busy_until": "later"}, 4600.0),
        # The pause itself lost: the request in flight still holds the host.
        ({"backoff_until": float("inf")}, 1030.0),
    ],
    ids=lambda case: "-".join(case) if isinstance(case, dict) else str(case),
)
async def test_a_record_with_a_field_this_pod_cannot_read_keeps_its_host_waiting(
    bus: Bus, unreadable: dict[str, object], waits_until: float
) -> None:
    """A release that writes a field otherwise (or a hand-made record): a host paused
    an hour with a request in flight is not granted a lease, and what the record could
    tell survives the write-back. Read as blank, it was granted at once and the pause
    erased."""
    p = await _politeness(bus)
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    paused = json.loads(DomainSlot(busy_until=1030.0, backoff_until=4600.0, gap=10.0).encode())
    await kv.put(p.key("paused.example"), json.dumps({**paused, **unreadable}).encode())

    decision = await p.acquire("paused.example", 1000.0)

    assert isinstance(decision, Deferred)
    assert decision.at >= waits_until - 1e-6
    later = await p.acquire("paused.example", min(2000.0, waits_until - 1), reserved=True)
    assert isinstance(later, Deferred)
    assert later.at >= waits_until - 1e-6


def test_a_record_whose_pause_or_gap_cannot_be_read_keeps_what_its_policy_and_delays_say() -> None:
    # The host's policy keeps the pause it learned, and its origins' Crawl-delays keep
    # the gap: read as the default, a host that asked for 30 s was asked every 10.
    policy = HostPolicy(paused_until=4600.0, pause_reason="rate_limited")
    raw = json.loads(DomainSlot(free_at=990.0, policy=policy).encode())
    raw.update(backoff_until="4600s", gap="30s", d={"https://slow.example": [30.0, 1e9]})

    slot = DomainSlot.decode(json.dumps(raw).encode(), 10.0)

    assert (slot.backoff_until, slot.gap) == (4600.0, 30.0)


async def test_a_record_whose_free_time_cannot_be_read_is_free_a_gap_after_its_last_answer(
    bus: Bus,
) -> None:
    # A 25 s answer ended at 1025 on a host of a 60 s gap: its policy still says so when
    # the record's own free time does not read, and the next lease waits for 1085.
    p = await _politeness(bus)
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    policy = HostPolicy(last_attempt_at=1025.0, attempts=1)
    raw = json.loads(DomainSlot(busy_until=1000.0, gap=60.0, policy=policy).encode())
    await kv.put(p.key("slow.example"), json.dumps({**raw, "free_at": "later"}).encode())

    decision = await p.acquire("slow.example", 1030.0)

    assert isinstance(decision, Deferred)
    assert decision.at >= 1085.0 - 1e-6


_NO_TIME = ("free_at", "busy_until", "next", "backoff_until", "claimed")
#: What a lease granted at 1000 holds its host for: its hold, then a gap.
_HELD_FROM_1000 = 1000.0 + CONFIG.request_timeout + HOLD_SLACK + CONFIG.min_delay


async def _first_lease(
    p: Politeness, domain: str, now: float, clock: SharedClock | None = None, **how: Any
) -> Granted:
    """The lease a reserved page gets (``how``: a poll's, ahead of its slot), following
    its deferrals from ``now``, the shared clock with it."""
    for _ in range(100):
        if clock is not None:
            clock.at = now
        decision = await p.acquire(domain, now, **(how | {"reserved": True}))
        if isinstance(decision, Granted):
            return decision
        assert isinstance(decision, Deferred)
        assert decision.at > now
        now = decision.at
    raise AssertionError("never granted: the record was not repaired")


@pytest.mark.parametrize(
    "record",
    [
        b"not a record",
        b"[1030, 4600]",
        b'"busy"',
        json.dumps({k: "later" for k in _NO_TIME} | {"gap": 10.0}).encode(),
        json.dumps({"free_at": "later", "busy_until": "later", POLICY_KEY: "?"}).encode(),
        # Its policy's last answer was at 990: a lease granted at 1000 may be in flight.
        json.dumps(
            {k: "later" for k in _NO_TIME}
            | {"gap": 10.0, POLICY_KEY: HostPolicy(last_attempt_at=990.0, attempts=3).to_json()}
        ).encode(),
    ],
    ids=["text", "a-list", "a-string", "every-time", "times-and-policy", "a-last-answer"],
)
@pytest.mark.parametrize(
    "first",
    [{}, {"reserved": True}, {"reserved": True, "queue": False, "ahead": 0.9}],
    ids=["a-page", "a-reserved-page", "a-poll"],
)
async def test_a_record_that_cannot_tell_a_request_in_flight_holds_its_host_as_a_new_lease(
    bus: Bus, record: bytes, first: dict[str, Any]
) -> None:
    """A record whose hold no pod of this release can read (a release that writes it
    otherwise, a hand-made value) may stand for a request in flight: the host waits as
    if it had been granted the moment it was read, by this pod and every other, and is
    granted again after that hold and a gap, not later. Read as free, it was granted at
    once; held without being written back, a poll found it unknown at each look and
    was never granted."""
    clock = SharedClock(1000.0)
    p, other = await _politeness(bus, clock=clock), await _politeness(bus, clock=clock)
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    await kv.put(p.key("odd.example"), record)

    decision = await p.acquire("odd.example", 1000.0, **first)

    assert isinstance(decision, Deferred)
    lease = await _first_lease(other, "odd.example", decision.at, clock, **first)
    assert lease.start == pytest.approx(_HELD_FROM_1000)


@pytest.mark.parametrize(
    "unreadable",
    [{"busy_until": "?"}, {"busy_until": "?", "free_at": "?"}, {"free_at": "?"}],
    ids=["its-hold", "its-hold-and-free-time", "its-free-time"],
)
async def test_a_record_whose_hold_cannot_be_read_is_held_one_lease_not_its_queue(
    bus: Bus, unreadable: dict[str, str]
) -> None:
    """A host with a day of pages queued (``next``) whose hold does not read: held as a
    lease granted when it is read, and the pages whose slots come after that hold are
    granted at them. Taken as the latest time the record held, the hold ran to the
    queue's end, and the host stood idle for a day."""
    clock = SharedClock(1000.0)
    p = await _politeness(bus, clock=clock)
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    raw = json.loads(DomainSlot(free_at=990.0, next=87_400.0, gap=10.0).encode())
    await kv.put(p.key("queued.example"), json.dumps(raw | unreadable).encode())

    assert isinstance(await p.acquire("queued.example", 1000.0, reserved=True), Deferred)
    lease = await _first_lease(p, "queued.example", 1045.0, clock)  # a slot after the hold

    assert _HELD_FROM_1000 - 1e-6 <= lease.start <= 1045.0 + CONFIG.min_delay


@pytest.mark.parametrize(
    "written",
    ["2026-12-02T14:40:01Z", "4601.0", True, None],
    ids=["a-date", "text", "true", "a-policy-written-without-it"],
)
async def test_a_pause_whose_record_and_policy_cannot_be_read_runs_to_its_queue(
    bus: Bus, written: object
) -> None:
    """A host paused an hour by a 429 (to 4601), three pages placed behind the pause;
    then its pause and its policy's written otherwise. The pages behind the pause are
    what the record still tells of it: no page goes before them. With the queue's end
    not read, the host was granted at once, an hour inside its pause."""
    p = await _politeness(bus)
    lease = await p.acquire("paused.example", 1000.0)
    assert isinstance(lease, Granted)
    limited = attempt(
        "paused.example", end=1001.0, outcome=CrawlOutcome.BLOCKED_4XX, status=429, retry_after=3600
    )
    await p.finish("paused.example", lease, 1001.0, limited)
    for now in (1100.0, 1101.0, 1102.0):
        assert isinstance(await p.acquire("paused.example", now), Deferred)
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    raw = json.loads((await kv.get(p.key("paused.example"))).value or b"")
    assert raw["backoff_until"] >= 4601.0
    raw["backoff_until"] = "2026-12-02T14:40:01Z"
    if written is None:  # an older pod's, which drops it: a policy of no pause since
        raw[POLICY_KEY] = {}
    else:
        raw[POLICY_KEY]["paused_until"] = written  # a number's text or true: not a number
    await kv.put(p.key("paused.example"), json.dumps(raw).encode())

    other = await _politeness(bus)
    poll = await _first_lease(other, "paused.example", 1200.0, queue=False)

    assert poll.start >= 4601.0


async def test_a_pause_that_does_not_read_runs_to_its_policys_written_as_text(
    bus: Bus,
) -> None:
    """No page queued behind the pause: its policy's pause, a number's text, is what
    tells it (the policy's reader takes numbers only, and read none)."""
    p = await _politeness(bus)
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    policy = HostPolicy(paused_until=4601.0, pause_reason="rate_limited")
    raw = json.loads(DomainSlot(free_at=1011.0, backoff_until=4601.0, policy=policy).encode())
    raw |= {"backoff_until": "?", POLICY_KEY: policy.to_json() | {"paused_until": "4601.0"}}
    await kv.put(p.key("paused.example"), json.dumps(raw).encode())

    poll = await _first_lease(p, "paused.example", 1200.0, queue=False)

    assert poll.start >= 4601.0


_HUGE = "1" + "0" * 400  # a JSON integer past a float's range


@pytest.mark.parametrize(
    ("record", "hold_unknown"),
    [
        (f'{{"busy_until": {_HUGE}, "gap": 10}}', True),
        (f'{{"backoff_until": 4601, "p": {{"paused_until": {_HUGE}, "attempts": 3}}}}', False),
        (f'{{"backoff_until": 4601, "d": {{"https://h.example": [{_HUGE}, 5]}}}}', False),
    ],
    ids=["a-time", "the-policy-pause", "a-crawl-delay"],
)
def test_an_integer_past_a_floats_range_costs_its_field_not_the_record(
    record: str, hold_unknown: bool
) -> None:
    """Python reads any JSON integer, and turning one past a float's range into a float
    raises OverflowError, which the field-by-field reading did not catch: every lease
    of the host failed, and its pages were parked."""
    slot = DomainSlot.decode(record.encode(), 10.0)

    assert slot.hold_unknown is hold_unknown
    if not hold_unknown:
        assert slot.backoff_until == 4601.0
    assert slot.policy.attempts == (3 if "attempts" in record else 0)


async def test_a_crawl_delay_that_is_not_a_number_is_none(bus: Bus) -> None:
    """A host of a 60 s gap whose record keeps, beside its origin's 60 s, a delay of NaN
    for another: once a robots.txt set a delay, the host's gap was NaN, and the next
    lease came 30 s after the answer, not 60."""
    p = await _politeness(bus)
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    raw = json.loads(DomainSlot(gap=60.0).encode())
    raw["d"] = {"https://h.example": [float("nan"), 1e12], "http://h.example": [60.0, 1e12]}
    await kv.put(p.key("h.example"), json.dumps(raw).encode())
    lease = await p.acquire("h.example", 1000.0)
    assert isinstance(lease, Granted)
    delay = CrawlDelay("http://h.example:8080", 10.0, 1e12)

    await p.finish("h.example", lease, 1030.0, delays=(delay,))

    assert (await _first_lease(p, "h.example", 1031.0)).start >= 1090.0


@pytest.mark.parametrize(
    ("delay", "gap", "times"),
    [
        ("[60, Infinity]", 60.0, True),
        ("[60, 1" + "0" * 400 + "]", 60.0, True),
        ('[60, "later"]', 60.0, True),
        ("[60, Infinity]", '"?"', True),
        ('[60, "later"]', 60.0, False),  # the day counted from the read, not from 0
        ('["sixty", 1e12]', 60.0, True),  # the record's gap stands for it
        ("[1" + "0" * 400 + ", 1e12]", 60.0, True),
    ],
    ids=[
        "infinity",
        "an-integer-past-a-float",
        "text",
        "infinity-and-the-gap-unread",
        "text-and-the-times-unread",
        "a-gap-as-text",
        "a-gap-past-a-float",
    ],
)
async def test_a_crawl_delay_that_cannot_be_read_keeps_its_hosts_gap(
    bus: Bus, delay: str, gap: object, times: bool
) -> None:
    """A host of a 60 s gap (an origin's Crawl-delay) whose record keeps that delay in a
    form no pod of this release reads: when another origin's robots.txt set a delay of
    10 s, the host's gap was made from that one alone, and the next lease came 30 s
    after the answer, not 60. ``times``: whether the record's times read (else a day
    counted from them was counted from 0, long past)."""
    now = 1_000_000.0
    p = await _politeness(bus)
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    raw = json.loads(DomainSlot().encode()) | {"gap": gap, "free_at": now - 10.0}
    raw |= {} if times else {"free_at": "?", "busy_until": "?"}
    record = json.dumps(raw)[:-1] + (
        f', "d": {{"https://h.example": {delay}, "http://h.example": [10, 1e12]}}}}'
    )
    await kv.put(p.key("h.example"), record.encode())
    lease = await _first_lease(p, "h.example", now)
    shorter = CrawlDelay("http://h.example", 10.0, 1e12)

    await p.finish("h.example", lease, lease.start + 30.0, delays=(shorter,))

    assert (await _first_lease(p, "h.example", lease.start + 31.0)).start >= lease.start + 90.0


_NOW = 1_000_000.0


@pytest.mark.parametrize(
    ("delays", "kept_until"),
    [
        # An origin not known's live delay, then an expired one whose gap does not read.
        ({"?": [60.0, _NOW + 50_000.0], "https://h.example": ["sixty", 5.0]}, None),
        # A live one whose gap does not read (the record's 60), then a shorter known.
        ({"https://h.example": ["x", 1e12], "?": [20.0, _NOW + 50_000.0]}, None),
        # A live one known to 1e12, then one whose gap and expiry do not read.
        ({"?": [60.0, 1e12], "https://h.example": ["x", "x"]}, 1e12),
    ],
    ids=["an-expired-one-second", "a-shorter-one-second", "an-unread-expiry-second"],
)
async def test_delays_read_as_one_origins_keep_the_longer_and_the_later(
    bus: Bus, delays: dict[str, list[object]], kept_until: float | None
) -> None:
    """Crawl-delays read as one origin's (the origin not known's, and one whose gap does
    not read, which stands as the record's gap): the second replaced the first, and the
    host's gap was made from another origin's 10 s at the next Crawl-delay set, or a
    live delay's expiry was cut to a day."""
    p = await _politeness(bus)
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    raw = json.loads(DomainSlot(free_at=_NOW - 10.0, gap=60.0).encode())
    raw["d"] = delays | {"http://h.example": [10.0, 1e12]}
    await kv.put(p.key("h.example"), json.dumps(raw).encode())
    lease = await _first_lease(p, "h.example", _NOW)
    shorter = CrawlDelay("http://h.example", 10.0, 1e12)

    await p.finish("h.example", lease, lease.start + 30.0, delays=(shorter,))

    assert (await _first_lease(p, "h.example", lease.start + 31.0)).start >= lease.start + 90.0
    if kept_until is not None:
        stored = json.loads((await kv.get(p.key("h.example"))).value or b"")
        assert stored["d"]["?"] == [60.0, kept_until]


async def test_a_hosts_gap_is_never_past_the_longest_the_settings_allow(bus: Bus) -> None:
    # A hand-made record's gap of 1e9 s held its host for decades.
    p = await _politeness(bus)
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    await kv.put(p.key("h.example"), DomainSlot(gap=1e9).encode())
    lease = await p.acquire("h.example", 1000.0)
    assert isinstance(lease, Granted)

    await p.finish("h.example", lease, 1001.0)

    later = await _first_lease(p, "h.example", 1002.0)
    assert later.start == pytest.approx(1001.0 + CONFIG.max_delay)


async def test_a_pause_its_policy_writes_as_text_holds_beside_a_record_pause_that_reads(
    bus: Bus,
) -> None:
    # A record damaged elsewhere (its claim), its own pause read as none.
    p = await _politeness(bus)
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    raw = json.loads(DomainSlot(free_at=1000.0).encode())
    raw |= {"claimed": "?", POLICY_KEY: {"paused_until": "3000"}}
    await kv.put(p.key("paused.example"), json.dumps(raw).encode())

    poll = await _first_lease(p, "paused.example", 1000.0, queue=False)

    assert poll.start >= 3000.0


async def test_a_record_whose_hold_cannot_be_read_covers_a_lease_taken_ahead(bus: Bus) -> None:
    """Another release's lease granted at 999.5 for a start at 1000.4 (taken ahead), on
    a host of a 60 s gap: its record tells the free time it wrote (1060.4) but not its
    hold. Read at 999.6, the hold given runs from the lease's start, not the read: from
    the read, the host was granted 0.8 s inside the gap after that lease's hold."""
    clock = SharedClock(999.6)
    p = await _politeness(bus, clock=clock)
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    raw = json.loads(DomainSlot(free_at=1060.4, next=1060.4, gap=60.0).encode())
    await kv.put(p.key("ahead.example"), json.dumps(raw | {"busy_until": "?"}).encode())

    lease = await _first_lease(p, "ahead.example", 999.6, clock)

    assert lease.start >= 1000.4 + CONFIG.request_timeout + HOLD_SLACK + 60.0 - 1e-6


@pytest.mark.parametrize(
    "writer", ["finish", "finish-its-own-hold", "finish-ahead-of-the-clock", "set_delay", "observe"]
)
async def test_a_record_that_cannot_tell_a_request_in_flight_is_held_whoever_writes_it_first(
    bus: Bus, writer: str
) -> None:
    """A release, a Crawl-delay or a poll's answer that finds such a record writes the
    same hold, from when it read the record, however long after its request ended it
    writes (an extraction, a retry while the broker was away). Written back free, or
    held from the request's end, the next pod was granted before the hold was out."""
    clock = SharedClock(1000.0)  # the record is read at 1000, the answer came at 955
    p, other = await _politeness(bus, clock=clock), await _politeness(bus, clock=clock)
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    await kv.put(p.key("odd.example"), b"not a record")

    if writer == "finish":
        ours = Granted(
            hold_until=950.0 + CONFIG.request_timeout + HOLD_SLACK, gap=10.0, start=950.0
        )
        await p.finish("odd.example", ours, 955.0)
    elif writer == "finish-its-own-hold":
        # A lease of 1000 whose hold is the one the record is given: still not ours.
        hold = 1000.0 + CONFIG.request_timeout + HOLD_SLACK
        await p.finish("odd.example", Granted(hold_until=hold, gap=10.0, start=1000.0), 1000.0)
    elif writer == "finish-ahead-of-the-clock":
        # The release's instant is later than the clock's earliest reading: the hold
        # runs from the later of the two.
        clock.at = 955.0
        hold = 1000.0 + CONFIG.request_timeout + HOLD_SLACK
        await p.finish("odd.example", Granted(hold_until=hold, gap=10.0, start=990.0), 1000.0)
    elif writer == "set_delay":
        await p.set_delay("odd.example", CrawlDelay("https://odd.example", 10.0, 9e9), 955.0)
    else:
        await p.observe("odd.example", attempt("odd.example", end=955.0))

    # The pod that wrote it keeps to the hold it wrote, as every other does.
    clock.at = 1035.0
    assert isinstance(await p.acquire("odd.example", 1035.0, reserved=True), Deferred)
    lease = await _first_lease(other, "odd.example", 1000.0, clock)
    assert lease.start >= _HELD_FROM_1000 - 1e-6


async def test_a_record_whose_times_read_but_not_its_gap_is_granted_as_its_times_say(
    bus: Bus,
) -> None:
    # A host never asked (every time 0) whose gap a release wrote otherwise: its hold
    # reads (none), so nothing stands for a request in flight.
    p = await _politeness(bus)
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    raw = json.loads(DomainSlot().encode()) | {"gap": "10s"}
    await kv.put(p.key("new.example"), json.dumps(raw).encode())

    decision = await p.acquire("new.example", 1000.0)

    assert isinstance(decision, Granted)
    assert decision.start == 1000.0


async def test_a_lease_that_can_start_soon_is_taken_ahead_for_its_start(bus: Bus) -> None:
    p = await _politeness(bus)
    first = await p.acquire("ahead.example", 1000.0)
    assert isinstance(first, Granted)
    assert first.start == 1000.0
    await p.finish("ahead.example", first, 1000.5)  # free from 1010.5
    # Further ahead than the caller will wait: a slot to come back at.
    far = await p.acquire("ahead.example", 1009.0, reserved=True, ahead=1.0)
    assert isinstance(far, Deferred)
    assert far.at == pytest.approx(1010.5)
    soon = await p.acquire("ahead.example", 1010.0, reserved=True, ahead=1.0)
    assert isinstance(soon, Granted)
    assert soon.start == pytest.approx(1010.5)
    # The lease is taken from now: no other pod's request goes before this one's ends.
    other = await (await _politeness(bus)).acquire("ahead.example", 1010.6, reserved=True)
    assert isinstance(other, Deferred)
    await p.finish("ahead.example", soon, 1010.7)
    after = await p.acquire("ahead.example", 1020.0, reserved=True, ahead=1.0)
    assert isinstance(after, Granted)
    assert after.start == pytest.approx(1020.7)


async def test_a_lease_is_not_taken_ahead_of_the_reservations_before_it(bus: Bus) -> None:
    # Taken for a later start, it would hold the host idle while the messages that came
    # before it wait for it to end.
    p = await _politeness(bus)
    first = await p.acquire("queue.example", 1000.0)
    assert isinstance(first, Granted)
    await p.finish("queue.example", first, 1000.5)  # free from 1010.5
    reserved = await p.acquire("queue.example", 1001.0, ahead=1.0)
    assert isinstance(reserved, Deferred)
    assert reserved.at == pytest.approx(1010.5)
    # Even when it would wait for its start: its slot comes after the reservation's.
    fresh = await p.acquire("queue.example", 1010.0, ahead=15.0)
    assert isinstance(fresh, Deferred)
    assert fresh.at == pytest.approx(1020.5)
    due = await p.acquire("queue.example", 1010.0, reserved=True, ahead=1.0)
    assert isinstance(due, Granted)
    assert due.start == pytest.approx(1010.5)


async def test_no_lease_is_taken_ahead_while_a_request_is_in_flight(bus: Bus) -> None:
    # Its gap counts from its end, which nobody knows yet. The first look worth taking
    # is one gap after it started: it cannot have ended before that.
    p = await _politeness(bus)
    assert isinstance(await p.acquire("flight.example", 1000.0), Granted)
    waiting = await p.acquire("flight.example", 1009.5, reserved=True, ahead=1.0)
    assert isinstance(waiting, Deferred)
    assert waiting.at == pytest.approx(1010.0)
    # Still in flight a gap after it started (a slow answer): look again a gap on.
    later = await p.acquire("flight.example", 1012.0, reserved=True, ahead=1.0)
    assert isinstance(later, Deferred)
    assert later.at == pytest.approx(1022.0)


async def rate_limited(p: Politeness, domain: str, retry_after: float) -> HostPolicy:
    """A request to ``domain`` at 1000 s answered 429 with ``retry_after``, at 1000.5 s."""
    grant = await p.acquire(domain, 1000.0)
    assert isinstance(grant, Granted)
    answer = attempt(
        domain,
        end=1000.5,
        outcome=CrawlOutcome.BLOCKED_4XX,
        status=429,
        retry_after=retry_after,
    )
    return await p.finish(domain, grant, 1000.5, answer)


class AnswerLostOnce(CountingKV):
    """The real bucket; the answer to its first update is lost after the write is applied."""

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        revision = await super().update(key, value, last=last)
        if self.calls.count("update") == 1:
            raise nats.errors.TimeoutError
        return revision


async def test_a_release_tried_again_after_its_answer_was_lost_counts_its_attempt_once(
    bus: Bus,
) -> None:
    kv = AnswerLostOnce(await bus.js.key_value(DOMAINS_BUCKET))
    p = Politeness(kv, CONFIG, LEARNING)
    grant = await p.acquire("lost.example", 1000.0)
    assert isinstance(grant, Granted)
    answer = attempt(
        "lost.example", end=1000.5, outcome=CrawlOutcome.BLOCKED_4XX, status=429, retry_after=30
    )
    with pytest.raises(nats.errors.TimeoutError):
        await p.finish("lost.example", grant, 1000.5, answer)
    again = await p.finish("lost.example", grant, 1000.5, answer)
    once = await rate_limited(await _politeness(bus), "once.example", 30)
    assert again.attempts == 1
    assert (again.paused_until, again.rate_level) == (once.paused_until, once.rate_level)
    # The host's next attempt is folded as ever.
    grant = await p.acquire("lost.example", 1040.0)
    assert isinstance(grant, Granted)
    later = await p.finish("lost.example", grant, 1040.5, attempt("lost.example", end=1040.5))
    assert later.attempts == 2


async def test_retry_after_pauses_the_domain_for_every_pod(bus: Bus) -> None:
    p1, p2 = await _politeness(bus), await _politeness(bus)
    await rate_limited(p1, "limited.example", 299.5)
    decision = await p2.acquire("limited.example", 1100.0, reserved=True)
    assert isinstance(decision, Deferred)
    assert decision.at == pytest.approx(1300.0)


async def test_a_pause_is_said_once_with_its_host_reason_and_length(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    # Only `trove status` could say why a host was not crawled: the log said nothing.
    p = await _politeness(bus)
    with caplog.at_level(logging.INFO, logger="trove.fetcher"):
        grant = await p.acquire("quiet.example", 999.0)
        assert isinstance(grant, Granted)
        await p.finish("quiet.example", grant, 1000.0, attempt("quiet.example", end=1000.0))
        assert not [r for r in caplog.records if r.getMessage().startswith("host paused")]
        await rate_limited(p, "limited.example", 120)
    (said,) = [r for r in caplog.records if r.getMessage().startswith("host paused")]
    assert said.getMessage() == "host paused for 120s: rate_limited (Retry-After)"
    assert (getattr(said, "domain", None), getattr(said, "paused_seconds", None)) == (
        "limited.example",
        120.0,
    )


async def test_retry_after_is_capped(bus: Bus) -> None:
    p = await _politeness(bus, PolitenessConfig(min_delay=1.0, max_backoff=100.0))
    grant = await p.acquire("capped.example", 999.0)
    assert isinstance(grant, Granted)
    answer = attempt(
        "capped.example",
        end=1000.0,
        outcome=CrawlOutcome.BLOCKED_5XX,
        status=503,
        retry_after=1_000_000.0,
    )
    await p.finish("capped.example", grant, 1000.0, answer)
    assert (await p.state("capped.example")).backoff_until == pytest.approx(1100.0)


async def test_a_wait_a_release_is_told_holds_the_host_for_every_pod_up_to_the_cap(
    bus: Bus,
) -> None:
    # A poll's answer that spent the rate limit names its reset before the poll has
    # read the answer through: the release of the request's lease writes it, capped as
    # a Retry-After is.
    p1 = await _politeness(bus, PolitenessConfig(min_delay=1.0, max_backoff=100.0))
    p2 = await _politeness(bus, PolitenessConfig(min_delay=1.0, max_backoff=100.0))
    grant = await p1.acquire("told.example", 999.0)
    assert isinstance(grant, Granted)
    await p1.finish("told.example", grant, 1000.0, rest_until=1060.0)
    assert (await p2.state("told.example")).backoff_until == pytest.approx(1060.0)
    decision = await p2.acquire("told.example", 1001.5, reserved=True)
    assert isinstance(decision, Deferred)
    assert decision.at >= 1060.0
    grant = await p1.acquire("far.example", 999.0)
    assert isinstance(grant, Granted)
    await p1.finish("far.example", grant, 1000.0, rest_until=1_000_000.0)
    assert (await p2.state("far.example")).backoff_until == pytest.approx(1100.0)


async def test_a_pause_defers_every_url_of_the_host_to_its_end(bus: Bus) -> None:
    # A host that refuses connections is paused for all its URLs at once: fresh work
    # and reserved work queue behind the pause, on every pod.
    p1, p2 = await _politeness(bus), await _politeness(bus)
    grant = await p1.acquire("down.example", 1000.0)
    assert isinstance(grant, Granted)
    refused = attempt("down.example", end=1000.1, outcome=CrawlOutcome.FAILED, status=None)
    policy = await p1.finish("down.example", grant, 1000.1, refused)
    pause_end = policy.paused_until
    assert pause_end >= 1000.1 + 0.9 * LEARNING.pause_base
    assert (await p2.state("down.example")).backoff_until == pause_end
    fresh = [await p2.acquire("down.example", 1000.2 + n) for n in range(4)]
    assert all(isinstance(d, Deferred) for d in fresh)
    slots = [d.at for d in fresh if isinstance(d, Deferred)]
    assert slots[0] == pytest.approx(pause_end)
    assert all(b - a == pytest.approx(10.0) for a, b in itertools.pairwise(slots))
    # A timeline poll has no place in the queue: it comes back at the pause's end.
    poll = await p2.acquire("down.example", pause_end - 1.0, reserved=True, queue=False)
    assert isinstance(poll, Deferred)
    assert poll.at == pytest.approx(pause_end)
    back = await p2.acquire("down.example", pause_end - 1.0, reserved=True)
    assert isinstance(back, Deferred)
    assert back.at == pytest.approx(slots[-1] + 10.0)
    assert isinstance(await p2.acquire("down.example", pause_end, reserved=True), Granted)


async def test_a_paused_hosts_queue_comes_back_spaced_and_is_looked_up_once_a_page(
    bus: Bus,
) -> None:
    """A ban over a host with a long queue: each reserved page, as it comes due during
    the pause, takes a place behind it, so that each is looked at once more, not once
    more every gap until the last (quadratic in the queue)."""
    p = await _politeness(bus)
    policy = await rate_limited(p, "banned.example", 600.0)
    queue = 40
    # Each page of the queue comes due in the pause, as its slot before it said.
    due = [
        await p.acquire("banned.example", 1010.0 + 10.0 * n, reserved=True) for n in range(queue)
    ]
    assert all(isinstance(d, Deferred) for d in due)
    times = sorted(d.at for d in due if isinstance(d, Deferred))
    assert times[0] >= policy.paused_until
    assert all(b - a >= 10.0 - 1e-6 for a, b in itertools.pairwise(times))
    # Replay them at their times, each answered 0.1 s after it starts: every page is
    # granted at the time it was given (a few come back once more, no page again and again).
    lookups = 0
    pending = list(times)
    while pending:
        at = pending.pop(0)
        lookups += 1
        decision = await p.acquire("banned.example", at, reserved=True)
        if isinstance(decision, Granted):
            await p.finish(
                "banned.example", decision, at + 0.1, attempt("banned.example", end=at + 0.1)
            )
        else:
            assert isinstance(decision, Deferred)
            pending = sorted([*pending, decision.at])
        assert lookups <= 2 * queue, "the queue is looked up again and again"


@dataclass
class _HostCrawl:
    """What a host saw of its queue (``_crawl_host``): each request's start, end and the
    gap its record set after it; how many times a page was scheduled again."""

    requests: list[tuple[float, float, float]] = field(default_factory=list)
    scheduled: int = 0

    @property
    def efficiency(self) -> float:
        """The politeness bound (every answer and the gap after each but the last) over
        the time the host's requests took."""
        ordered = sorted(self.requests)
        bound = sum(end - start + gap for start, end, gap in ordered[:-1])
        bound += ordered[-1][1] - ordered[-1][0]
        return bound / (max(end for _, end, _ in ordered) - ordered[0][0])

    def too_close(self) -> list[tuple[float, float]]:
        """(start, the moment the host was free) of each request sent too early."""
        ordered = sorted(self.requests)
        return [
            (b[0], a[1] + a[2]) for a, b in itertools.pairwise(ordered) if b[0] < a[1] + a[2] - 1e-6
        ]


async def _crawl_host(
    p: Politeness, host: str, answers: list[float], *, raised_to: float | None = None
) -> _HostCrawl:
    """A host's home page and the pages it reveals, in virtual time on the real bucket, as
    the fetcher handles them: page ``n`` answers in ``answers[n]``; the others, found in
    the home page, queue as it ends; a wait of up to a second (the fetcher's LOCAL_WAIT)
    is spent in the task, a longer one is a message scheduled again. With ``raised_to``,
    robots.txt read again with the first page after it raises the host's gap under the
    queue."""
    ahead = 1.0
    crawl = _HostCrawl()
    events: list[tuple[float, int, str, int, Granted | None]] = []
    order = itertools.count()

    def at(moment: float, what: str, page: int, grant: Granted | None = None) -> None:
        heapq.heappush(events, (moment, next(order), what, page, grant))

    home = await p.acquire(host, 1000.0, ahead=ahead)
    assert isinstance(home, Granted)
    at(home.start + answers[0], "end", 0, home)
    for page in range(1, len(answers)):
        at(home.start + answers[0] + 0.05 + page * 0.001, "found", page)
    starts: dict[int, float] = {0: home.start}
    while events:
        now, _, what, page, grant = heapq.heappop(events)
        if what == "end":
            assert grant is not None
            raised = raised_to is not None and page == 1  # the queue planned by then
            delays = (CrawlDelay(f"http://{host}", raised_to or 0.0, 1e12),) if raised else ()
            observation = attempt(host, end=now, duration=answers[page])
            await p.finish(host, grant, now, observation, delays=delays)
            crawl.requests.append((starts[page], now, (await p.state(host)).free_at - now))
            continue
        decision = await p.acquire(host, now, reserved=what == "due", ahead=ahead)
        if isinstance(decision, Granted):
            starts[page] = decision.start
            at(decision.start + answers[page], "end", page, decision)
            continue
        assert isinstance(decision, Deferred)
        assert decision.at >= now
        crawl.scheduled += decision.at - now > ahead
        at(decision.at, "due", page)
    assert len(crawl.requests) == len(answers)
    return crawl


@pytest.mark.parametrize("queue", [50, 200])
async def test_a_long_queue_of_a_host_slower_than_its_slots_costs_each_page_a_few_looks(
    bus: Bus, queue: int
) -> None:
    """Every answer takes half a second: slots planned a gap apart from each start fell
    behind by an answer each, until every page came due before the host was free; all
    of them were told to come back then, one won, and the rest came back a gap later,
    again and again (quadratic in the queue: 1,035 schedules for 200 pages)."""
    crawl = await _crawl_host(await _politeness(bus), f"q{queue}.example", [0.5] * (queue + 1))
    assert crawl.too_close() == []
    assert crawl.scheduled <= 2 * queue
    assert crawl.efficiency >= 0.95


@pytest.mark.parametrize("queue", [50, 100])
async def test_a_gap_raised_under_a_queue_costs_each_page_a_few_looks(bus: Bus, queue: int) -> None:
    # robots.txt's Crawl-delay read again, 10 s to 30 s: 3,423 schedules for 100 pages.
    p = await _politeness(bus)
    crawl = await _crawl_host(p, f"r{queue}.example", [0.1] * (queue + 1), raised_to=30.0)
    assert crawl.too_close() == []
    assert crawl.scheduled <= 3 * queue
    assert crawl.efficiency >= 0.95


@pytest.mark.parametrize("median", [0.6, 1.5, 3.0])
async def test_a_host_whose_answers_vary_is_kept_busy_without_a_request_too_close(
    bus: Bus, median: float
) -> None:
    """The small web's answers (``bench/smallweb.py``: log-normal, sigma 0.3, around
    the host's median): a page that came due later than its host was free by more than
    a second, all sent behind the queue, left the host idle for most of a slot each
    time (efficiency 0.76 for hosts answering in 1.5 s or more)."""
    efficiencies = []
    for seed in range(8):
        rnd = random.Random(seed)
        answers = [median] + [median * math.exp(0.3 * rnd.gauss(0, 1)) for _ in range(24)]
        crawl = await _crawl_host(await _politeness(bus), f"v{seed}.example", answers)
        assert crawl.too_close() == []
        efficiencies.append(crawl.efficiency)
    assert statistics.median(efficiencies) >= 0.95, efficiencies


@pytest.mark.parametrize("median", [1.5, 3.0])
async def test_a_long_queue_of_a_host_whose_learned_gap_swings_is_kept_busy(
    bus: Bus, median: float
) -> None:
    """100 pages: the gap learned from the last five answers swings with them. A slot
    planned at a high one comes due after the host was free, and a scheduled message
    cannot be brought forward: a few percent of the host's time is lost (0.76 with every
    late page sent behind the queue)."""
    for seed in range(4):
        rnd = random.Random(seed)
        answers = [median] + [median * math.exp(0.3 * rnd.gauss(0, 1)) for _ in range(100)]
        crawl = await _crawl_host(await _politeness(bus), f"w{seed}.example", answers)
        assert crawl.too_close() == []
        assert crawl.efficiency >= 0.93, seed


async def test_a_fast_host_with_now_and_then_a_slow_answer_is_kept_busy(bus: Bus) -> None:
    # Every seventh answer takes 5 s: an answer, not a timeout; the median stays 50 ms.
    answers = [5.0 if n % 7 == 3 else 0.05 for n in range(40)]
    crawl = await _crawl_host(await _politeness(bus), "bimodal.example", answers)
    assert crawl.too_close() == []
    assert crawl.efficiency >= 0.95


async def _answered(p: Politeness, host: str, grant: Granted, end: float) -> None:
    """The request under ``grant`` answered at ``end``, in 2 s."""
    await p.finish(host, grant, end, attempt(host, end=end, duration=2.0))


async def _late(p: Politeness, host: str, at: float) -> Deferred:
    """A reserved page that comes at ``at`` and is told to come back."""
    decision = await p.acquire(host, at, reserved=True, ahead=1.0)
    assert isinstance(decision, Deferred)
    return decision


async def _in_flight(p: Politeness, host: str) -> tuple[float, Granted]:
    """After three answers of 2 s (a gap of 20 s, slots 22 s apart), the host's next
    request, granted at ``t`` and in flight."""
    now = 1000.0
    for _ in range(3):
        grant = await p.acquire(host, now, ahead=1.0)
        assert isinstance(grant, Granted)
        await _answered(p, host, grant, grant.start + 2.0)
        now = grant.start + 2.0 + 20.0
    grant = await p.acquire(host, now, ahead=1.0)
    assert isinstance(grant, Granted)
    return now, grant


async def test_a_late_page_behind_the_queue_is_not_given_the_moment_another_claimed(
    bus: Bus,
) -> None:
    p = await _politeness(bus)
    host = "claimed.example"
    t, grant = await _in_flight(p, host)
    await _answered(p, host, grant, t + 2.0)  # free t + 22
    first = await _late(p, host, t + 5.0)
    second = await _late(p, host, t + 6.0)
    assert first.at == pytest.approx(t + 22.0)  # it claims the moment
    assert second.at >= t + 44.0  # one slot behind it, not the same moment


async def test_a_moment_claimed_while_a_request_is_in_flight_holds_once_it_ends(
    bus: Bus,
) -> None:
    # Claimed while in flight, the moment was a gap after the request's start; once it
    # ended it was a gap after its end, and the next late page claimed that again.
    p = await _politeness(bus)
    host = "inflight.example"
    t, grant = await _in_flight(p, host)
    first = await _late(p, host, t + 1.0)
    assert first.at == pytest.approx(t + 22.0)  # a gap after the usual answer's end
    await _answered(p, host, grant, t + 2.0)
    second = await _late(p, host, t + 10.0)
    assert second.at >= t + 44.0


async def test_a_late_page_sent_behind_a_moment_claimed_in_flight_comes_a_slot_after_it(
    bus: Bus,
) -> None:
    # Placed a gap after the host's free moment while the claim was an answer past it,
    # it came back before the host was free, and was scheduled once more.
    p = await _politeness(bus)
    host = "inflight2.example"
    t, grant = await _in_flight(p, host)
    first = await _late(p, host, t + 1.0)
    second = await _late(p, host, t + 1.5)
    await _answered(p, host, grant, t + 2.0)
    claimed = await p.acquire(host, first.at, reserved=True, ahead=1.0)
    assert isinstance(claimed, Granted)
    await _answered(p, host, claimed, first.at + 2.0)
    assert isinstance(await p.acquire(host, second.at, reserved=True, ahead=1.0), Granted)


async def test_the_last_page_of_a_short_queue_waits_for_its_host_not_behind_itself(
    bus: Bus,
) -> None:
    p = await _politeness(bus)
    host = "three.example"
    home = await p.acquire(host, 1000.0, ahead=1.0)
    assert isinstance(home, Granted)
    await p.finish(host, home, 1002.0, attempt(host, end=1002.0, duration=2.0))  # gap 20 s
    one = await p.acquire(host, 1002.05, ahead=1.0)
    two = await p.acquire(host, 1002.06, ahead=1.0)
    assert isinstance(one, Deferred)
    assert isinstance(two, Deferred)
    assert (one.at, two.at) == pytest.approx((1022.0, 1044.0))  # a gap and an answer apart
    first = await p.acquire(host, one.at, reserved=True, ahead=1.0)
    assert isinstance(first, Granted)
    # It answers in 3.2 s: the median 2.6 s, the gap 26 s, the host free at 1051.2.
    await p.finish(host, first, 1025.2, attempt(host, end=1025.2, duration=3.2))
    last = await p.acquire(host, two.at, reserved=True, ahead=1.0)
    assert isinstance(last, Deferred)
    assert last.at == pytest.approx((await p.state(host)).free_at)


async def test_failures_in_a_row_lengthen_the_pause(bus: Bus) -> None:
    p = await _politeness(bus)
    now, pauses = 1000.0, []
    for _ in range(3):
        grant = await p.acquire("dying.example", now, reserved=True)
        assert isinstance(grant, Granted), grant
        down = attempt("dying.example", end=now + 0.1, outcome=CrawlOutcome.TIMEOUT, status=None)
        policy = await p.finish("dying.example", grant, now + 0.1, down)
        pauses.append(policy.paused_until - (now + 0.1))
        now = policy.paused_until
    assert pauses[1] > 1.5 * pauses[0]
    assert pauses[2] > 1.5 * pauses[1]


async def test_the_gap_after_a_slow_response_is_longer_and_never_below_the_minimum(
    bus: Bus,
) -> None:
    p = await _politeness(bus)
    for host, duration in (("slow.example", 2.0), ("fast.example", 0.01)):
        grant = await p.acquire(host, 1000.0)
        assert isinstance(grant, Granted)
        end = 1000.0 + duration
        await p.finish(host, grant, end, attempt(host, end=end, duration=duration))
    slow, fast = await p.state("slow.example"), await p.state("fast.example")
    slow_gap, fast_gap = slow.free_at - 1002.0, fast.free_at - 1000.01
    assert fast_gap == pytest.approx(10.0)  # the minimum: 10 x 10 ms is less
    assert 10.0 < slow_gap <= 60.0  # 10 x 2 s, within the maximum
    # The next lease plans its slots with the learned gap too, and the usual answer
    # (2 s): a gap runs from the end of an answer.
    grant = await p.acquire("slow.example", slow.free_at)
    assert isinstance(grant, Granted)
    assert grant.gap == pytest.approx(slow_gap)
    later = await p.acquire("slow.example", slow.free_at + 1.0)
    after = await p.acquire("slow.example", slow.free_at + 1.1)
    assert isinstance(later, Deferred)
    assert isinstance(after, Deferred)
    assert later.at == pytest.approx(slow.free_at + slow_gap + 2.0)
    assert after.at == pytest.approx(later.at + slow_gap + 2.0)


async def test_the_learned_policy_travels_with_the_lease_to_every_pod(bus: Bus) -> None:
    p1, p2 = await _politeness(bus), await _politeness(bus)
    grant = await p1.acquire("learned.example", 1000.0)
    assert isinstance(grant, Granted)
    assert grant.policy == HostPolicy()
    policy = await p1.finish(
        "learned.example", grant, 1000.5, attempt("learned.example", end=1000.5)
    )
    assert policy.attempts == 1
    seen = await p2.acquire("learned.example", 1020.0)
    assert isinstance(seen, Granted)
    assert seen.policy.to_json() == policy.to_json()


async def test_a_record_an_older_pod_wrote_keeps_its_lease_and_gets_a_fresh_policy(
    bus: Bus,
) -> None:
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    old = {"free_at": 1000.0, "busy_until": 0.0, "next": 1000.0, "gap": 20.0, "backoff_until": 0.0}
    await kv.put("old.example", json.dumps(old).encode())
    await kv.put("odd.example", json.dumps({**old, POLICY_KEY: "not a policy"}).encode())
    p = await _politeness(bus)
    for host in ("old.example", "odd.example"):
        early = await p.acquire(host, 990.0)
        assert isinstance(early, Deferred)
        assert early.at == pytest.approx(1000.0)
        grant = await p.acquire(host, 1000.0, reserved=True)
        assert isinstance(grant, Granted)
        assert grant.gap == pytest.approx(20.0)
        assert grant.policy == HostPolicy()


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


async def test_a_pods_messages_for_one_host_at_once_reserve_a_write_each_and_no_read(
    bus: Bus,
) -> None:
    """A page's links to one host reach a pod together: in turn, not racing."""
    kv = CountingKV(await bus.js.key_value(DOMAINS_BUCKET))
    p = Politeness(kv, CONFIG, LEARNING)
    first = await p.acquire("many.example", 1000.0)
    assert isinstance(first, Granted)
    kv.calls.clear()
    waiting = await asyncio.gather(*(p.acquire("many.example", 1000.1) for _ in range(6)))
    assert sorted(d.at for d in waiting if isinstance(d, Deferred)) == [
        1010.0, 1020.0, 1030.0, 1040.0, 1050.0, 1060.0
    ]  # fmt: skip
    assert kv.calls == ["update"] * 6
    # The release, side by side with a reservation, fails no write either.
    kv.calls.clear()
    _, reserved = await asyncio.gather(
        p.finish("many.example", first, 1001.0), p.acquire("many.example", 1001.0)
    )
    assert isinstance(reserved, Deferred)
    assert reserved.at == pytest.approx(1070.0)
    assert kv.calls == ["update", "update"]
    assert len(p._turns) == 0


async def test_a_pod_that_remembers_the_record_reserves_a_slot_in_one_round_trip(
    bus: Bus,
) -> None:
    kv = CountingKV(await bus.js.key_value(DOMAINS_BUCKET))
    p = Politeness(kv, CONFIG, LEARNING)
    assert isinstance(await p.acquire("one.example", 1000.0), Granted)
    kv.calls.clear()
    # Taking a slot writes the record: its compare-and-set checks what the pod remembers.
    waiting = await p.acquire("one.example", 1000.1)
    assert isinstance(waiting, Deferred)
    assert waiting.at == pytest.approx(1010.0)
    assert kv.calls == ["update"]
    # A reserved message's wait writes nothing: it is decided on what the bucket says.
    kv.calls.clear()
    again = await p.acquire("one.example", 1009.5, reserved=True, ahead=1.0)
    assert isinstance(again, Deferred)
    assert again.at == pytest.approx(1010.0)
    assert kv.calls == ["get"]


async def test_a_moved_hosts_page_lease_answers_moved_and_writes_nothing(bus: Bus) -> None:
    kv = CountingKV(await bus.js.key_value(DOMAINS_BUCKET))
    p = Politeness(kv, CONFIG, LEARNING)
    # The home page and another part of the site redirect, keeping their paths.
    for path, end in (("", 1000.0), ("1/p", 1020.0)):
        grant = await p.acquire("www.moved.example", end - 10)
        assert isinstance(grant, Granted)
        redirect = CrawlCompleted(
            url=f"http://www.moved.example/{path}",
            domain="www.moved.example",
            scope=Scope(value="www.moved.example"),
            request_id=derived_event_id(f"moved {path}", "test"),
            outcome=CrawlOutcome.REJECTED,
            status_code=301,
            started_at=datetime.fromtimestamp(end - 0.05, UTC),
            completed_at=datetime.fromtimestamp(end, UTC),
            links=[{"url": f"https://moved.example/{path}", "kind": "redirect"}],
        )
        await p.finish("www.moved.example", grant, end, Observation.of(redirect))
    before = await p.state("www.moved.example")
    kv.calls.clear()
    for at in (1030.0, 1030.1, 1030.2):  # within one gap: no slot is taken
        assert await p.acquire("www.moved.example", at, follow_moves=True) == Moved(
            "https://moved.example"
        )
    assert set(kv.calls) == {"get"}  # read, never written
    assert await p.state("www.moved.example") == before
    # Not for robots.txt or a redirect hop: those take the lease as before.
    assert isinstance(await p.acquire("www.moved.example", 1031.0), Granted)


def test_a_gap_under_a_second_is_said_at_start(caplog: pytest.LogCaptureFixture) -> None:
    # Allowed (the tests and the benchmarks run so against their own servers), but an
    # operator who typed milliseconds for seconds hears of it.
    with caplog.at_level(logging.WARNING, logger="trove.fetcher"):
        warn_of_a_short_gap(FetcherSettings())
        warn_of_a_short_gap(FetcherSettings(min_domain_delay_seconds=1))
        assert caplog.text == ""
        warn_of_a_short_gap(FetcherSettings(min_domain_delay_seconds=0.01))
    assert "TROVE_MIN_DOMAIN_DELAY_SECONDS is 0.01" in caplog.text
