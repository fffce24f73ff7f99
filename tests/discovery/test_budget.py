"""The per-host page budget, counted in the shared seen bucket on real NATS."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from tests.conftest import bucket_keys, eventually
from tests.discovery.crawl_support import (
    PAGE,
    claimed_at_each_visit,
    crawled,
    discoveries,
    handle,
    pages_counted,
)
from tests.discovery.follow_support import recorded
from trove_discovery import discovery as discovery_module
from trove_discovery.discovery import BUDGET_MEMORY, REFUSED, Discovery, _seen_key
from trove_discovery.sightings import Recent
from trove_schema.budgets import (
    BATCH_MEMORY,
    BATCH_MEMORY_SECONDS,
    HostCount,
    batch_mark,
    host_budget_key,
)
from trove_schema.bus import Bus, Retry
from trove_schema.events import (
    CrawlCompleted,
    CrawlOutcome,
    CrawlRequested,
    Link,
    Scope,
    ScopeKind,
    decode_event,
    derived_event_id,
    utcnow,
)
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import (
    DISCOVERY_LINKS,
    EVENTS_STREAM,
    SEEN_BUCKET,
    page_schedule_subject,
)

pytestmark = pytest.mark.usefixtures("clean")

BUDGET = 7


async def replica(bus: Bus, budget: int = BUDGET) -> Discovery:
    settings = DiscoverySettings(host_page_budget=budget)
    return Discovery(bus=bus, seen=await bus.js.key_value(SEEN_BUCKET), settings=settings)


async def one(discovery: Discovery, event_id: str) -> bool:
    return len((await discovery._within_budget("busy.example", [event_id]))[0]) == 1


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


async def test_a_page_handled_again_with_more_links_of_the_host_counts_the_new_ones(
    bus: Bus,
) -> None:
    # Handled again on a replica whose alias probes held fewer links back: the links
    # counted the first time are granted again, the others counted now, none refused.
    first, second = await replica(bus), await replica(bus)
    assert len((await first._within_budget("busy.example", ["page-1/a", "page-1/b"]))[0]) == 2
    again = ["page-1/a", "page-1/b", "page-1/c"]
    assert len((await second._within_budget("busy.example", again))[0]) == 3
    assert await counted(bus) == 3
    assert len((await first._within_budget("busy.example", again))[0]) == 3
    assert await counted(bus) == 3


async def test_a_page_handled_again_after_other_pages_of_its_host_counts_nothing_again(
    bus: Bus,
) -> None:
    # Page A's links counted, then page B's; A comes back (its ack lost, an alias hold
    # handed to the other replica): its links are granted, and not counted twice.
    first, second = await replica(bus), await replica(bus)
    a, b = ["page-a/1", "page-a/2"], ["page-b/1", "page-b/2"]
    assert len((await first._within_budget("busy.example", a))[0]) == 2
    assert len((await first._within_budget("busy.example", b))[0]) == 2
    assert len((await second._within_budget("busy.example", a))[0]) == 2
    assert await counted(bus) == 4


async def test_a_refusal_is_read_from_the_bucket_not_memory(bus: Bus) -> None:
    # The cycle's counters expire with the bucket's keys; a host whose remembered count
    # is full is asked about again, and counts from zero once its key is gone.
    discovery = await replica(bus)
    for n in range(BUDGET):
        assert await one(discovery, f"event-{n}")
    assert not await one(discovery, "event-over")
    seen = await bus.js.key_value(SEEN_BUCKET)
    await seen.purge(host_budget_key("busy.example"))
    assert await one(discovery, "event-next-cycle")


async def test_a_host_over_its_budget_costs_no_seen_key_for_links_that_are_new_at_every_visit(
    bus: Bus,
) -> None:
    # A tarpit, or session ids in paths: the page read again names fresh pages each
    # time. Once its host is known full, they are refused before any is claimed.
    first, second = await replica(bus, budget=3), await replica(bus, budget=3)
    links, visits = 20, 8
    for visit in range(visits):
        fresh = [f"https://trap.example/s/{visit}-{n}" for n in range(links)]
        other = f"https://roomy{visit}.example/p"
        page = crawled("https://trap.example/", *fresh, other)
        page = page.model_copy(update={"scope": Scope(kind=ScopeKind.OPEN, max_depth=5)})
        await handle(first if visit % 2 else second, bus, page)
    keys = [k for k in await bucket_keys(bus, SEEN_BUCKET) if k.startswith("u.")]
    found = await discoveries(bus)
    assert sum(d.domain == "trap.example" for d in found) == 3
    # Another host's links are claimed and granted as before.
    assert sum(d.domain.startswith("roomy") for d in found) == visits
    # Each replica claimed one visit's links before it knew (the one that filled the
    # budget, and its first refused one), and none after; beside them, the other hosts'
    # pages and the page's own key (its re-crawl's).
    assert len(keys) <= 2 * links + visits + 1, len(keys)


async def test_a_host_known_full_stays_known_while_its_pages_keep_coming(bus: Bus) -> None:
    # The tarpit's re-crawls go on for months: each visit that finds it full again keeps
    # it known full, or every few minutes one visit claims all its fresh links again
    # (seen keys kept for a seen TTL).
    discovery = await replica(bus, budget=3)
    now = [0.0]
    memory = discovery.budgets.ttl
    discovery.budgets = Recent(BUDGET_MEMORY, ttl=memory, clock=lambda: now[0])

    def minutes_later() -> None:  # a visit every few minutes, over many memories' length
        now[0] += memory / 3

    claimed = await claimed_at_each_visit(
        bus,
        discovery,
        "https://trap.example/",
        lambda visit: [f"https://trap.example/s/{visit}-{n}" for n in range(20)],
        visits=8,
        next_visit=minutes_later,
    )
    # The first visit fills the budget and claims its links; none after.
    assert claimed[1:] == [0] * 7, claimed


async def test_links_a_failed_delivery_claimed_are_refused_on_its_redelivery_to_a_full_host(
    bus: Bus,
) -> None:
    # The first delivery claims the links, then fails before its batch is counted; the
    # host fills meanwhile. Its redelivery finds them its own: refused and marked so, to
    # come in the host's next cycle, not left claimed by a page that never published them.
    now = [1_800_000_000.0]
    settings = DiscoverySettings(
        host_page_budget=2, recrawl_after_seconds=50, recrawl_max_seconds=100
    )
    seen = await bus.js.key_value(SEEN_BUCKET)
    discovery = Discovery(bus=bus, seen=seen, settings=settings, clock=lambda: now[0])
    links = ["https://busy.example/a", "https://busy.example/b"]
    page = crawled("https://hub.example/", *links)
    page = page.model_copy(update={"scope": Scope(kind=ScopeKind.OPEN, max_depth=5)})
    counting = discovery._within_budget

    async def broker_away(*args: Any, **kwargs: Any) -> tuple[frozenset[str], float]:
        raise Retry("broker away a moment", delay=1.0)

    discovery._within_budget = broker_away  # type: ignore[method-assign]
    with pytest.raises(Retry):
        await handle(discovery, bus, page)
    discovery._within_budget = counting  # type: ignore[method-assign]
    assert len((await counting("busy.example", ["x", "y"], cause="filler"))[0]) == 2
    assert len((await counting("busy.example", ["z"], cause="third"))[0]) == 0
    await handle(discovery, bus, page)
    for url in links:
        assert ((await seen.get(_seen_key(url))).value or b"").startswith(REFUSED)
    # The host's next cycle: another page's link brings it in.
    now[0] += 150
    other = crawled("https://hub2.example/", links[0])
    other = other.model_copy(update={"scope": Scope(kind=ScopeKind.OPEN, max_depth=5)})
    await handle(discovery, bus, other)
    assert links[0] in {d.url for d in await discoveries(bus)}


async def test_a_page_whose_links_to_a_full_host_are_all_known_keeps_its_validators(
    bus: Bus,
) -> None:
    # Known to the bucket, not to this replica's memory: nothing of the page waits for
    # the host's next cycle, so nothing asks for it to be read whole.
    first, second = await replica(bus, budget=2), await replica(bus, budget=2)
    links = ["https://busy.example/x", "https://busy.example/y"]
    await handle(first, bus, crawled("https://busy.example/", *links))  # fills the budget
    await handle(second, bus, crawled("https://busy.example/z", "https://busy.example/new"))
    page = crawled("https://busy.example/about", *links, etag='"v1"')
    await handle(second, bus, page)
    msg = await bus.js.get_last_msg(EVENTS_STREAM, page_schedule_subject(page.url))
    request = decode_event(msg.data or b"")
    assert isinstance(request, CrawlRequested)
    assert request.etag == '"v1"'


async def test_a_full_hosts_batch_counted_before_is_granted_again_before_any_claim(
    bus: Bus,
) -> None:
    discovery = await replica(bus, budget=2)
    granted, _ = await discovery._within_budget("busy.example", ["a", "b"], cause="page-1")
    assert granted == {"a", "b"}
    assert (await discovery._within_budget("busy.example", ["c"], cause="page-2"))[0] == set()
    # The cause that filled it, handled again, is not refused; another cause is; links a
    # hold kept back, which its batch did not count, are.
    assert (
        await discovery._full_hosts({"busy.example": ["b"], "other.example": ["o"]}, "page-1")
        == set()
    )
    assert await discovery._full_hosts({"busy.example": ["a"]}, "page-3") == {"busy.example"}
    assert await discovery._full_hosts({"busy.example": ["held"]}, "page-1") == {"busy.example"}


async def test_a_host_that_keeps_bringing_pages_gets_its_budget_again_each_cycle(
    bus: Bus,
) -> None:
    """Every page counted writes the host's key again, so its expiry never comes while the
    host keeps bringing new pages: the cycle runs from its first page counted."""
    now = [1_800_000_000.0]
    settings = DiscoverySettings(host_page_budget=BUDGET)
    discovery = Discovery(
        bus=bus,
        seen=await bus.js.key_value(SEEN_BUCKET),
        settings=settings,
        clock=lambda: now[0],
    )
    day = 86_400.0
    for n in range(BUDGET):  # a page every three days
        assert await one(discovery, f"event-{n}")
        now[0] += 3 * day
    assert not await one(discovery, "event-over")
    now[0] += settings.recrawl_max - BUDGET * 3 * day  # the cycle is over, the key is not
    granted = [await one(discovery, f"next-{n}") for n in range(BUDGET + 1)]
    assert granted == [True] * BUDGET + [False]


def test_a_count_written_before_cycles_were_kept_begins_its_cycle_when_read() -> None:
    counted = HostCount.from_bytes(b'{"n": 5, "last": "event-4"}')
    assert counted.in_cycle(1_800_000_000.0, 30 * 86_400.0) == HostCount(
        pages=5, since=1_800_000_000.0
    )


def test_a_count_written_by_the_release_before_marks_is_read_with_its_pages_and_cycle() -> None:
    # During a rolling upgrade: its marks named links, not causes, and are let go.
    old = b'{"n": 12, "last": "event-9", "recent": ["event-3", "event-9"], "since": 5.0}'
    assert HostCount.from_bytes(old) == HostCount(pages=12, since=5.0)


def test_a_batch_is_remembered_by_its_pages_for_its_redeliveries_and_forgotten_after() -> None:
    first, other = batch_mark("page-1", "busy.example"), batch_mark("page-2", "busy.example")
    pages = ["a", "b", "c", "d", "e", "f"]
    counted = HostCount.from_bytes(HostCount().add(first, ["a", "b", "c"], 1000.0).to_bytes())
    # Which, whatever the order and whatever else the cause brings the next time.
    assert counted.counted_of(first, ["z", "c", "a"]) == ["c", "a"]
    # Pages of the same cause counted later (other links the second time) add to it.
    counted = counted.add(first, ["d", "e"], 1010.0).add(other, ["f"], 1020.0)
    assert counted.pages == 6
    assert counted.counted_of(first, pages) == ["a", "b", "c", "d", "e"]
    assert counted.counted_of(other, pages) == ["f"]
    later = counted.add(batch_mark("page-3", "busy.example"), ["g"], 1010.0 + BATCH_MEMORY_SECONDS)
    assert (later.pages, later.counted_of(first, pages), later.counted_of(other, pages)) == (
        7,
        [],
        ["f"],
    )
    # A cause's batch of another host is another batch.
    assert counted.counted_of(batch_mark("page-1", "other.example"), pages) == []


def test_a_batch_the_release_before_counted_by_number_grants_its_first_pages() -> None:
    # Written during a rolling upgrade by a release that kept the number alone: its
    # redelivery is granted the first pages, as that release would have granted them.
    mark = batch_mark("page-1", "busy.example")
    old = HostCount.from_bytes(
        b'{"n": 3, "since": 5.0, "marks": [["%s", 2, 1000]]}' % mark.encode()
    )
    assert old.counted_of(mark, ["a", "b", "c"]) == ["a", "b"]
    assert old.add(mark, ["c"], 1010.0).counted_of(mark, ["a", "b", "c", "d"]) == ["a", "b", "c"]
    # A mark whose pages cannot be read is read as its number alone, and so it stays.
    for pages in (b'"not base64!"', b'"AAAAAAA="', b"null"):
        garbled = b'{"n": 3, "marks": [["%s", 2, 1000, %s]]}' % (mark.encode(), pages)
        read = HostCount.from_bytes(garbled)
        assert read.counted_of(mark, ["a", "b", "c"]) == ["a", "b"]
        assert read.add(mark, ["c"], 1010.0).counted_of(mark, ["a", "b", "c", "d"]) == [
            "a",
            "b",
            "c",
        ]


def test_a_hosts_record_read_over_budget_forgets_its_old_batches_and_stays_small() -> None:
    # A host over its budget is read at every batch and written at none: marks past their
    # memory go when it is read, and however busy it was, the record stays small.
    busy = HostCount(since=1000.0)
    for n in range(3 * BATCH_MEMORY):
        busy = busy.add(batch_mark(f"page-{n}", "busy.example"), [f"page-{n}/a"], 1000.0 + n)
    assert len(busy.to_bytes()) < 4_000
    later = busy.in_cycle(1000.0 + 3 * BATCH_MEMORY + BATCH_MEMORY_SECONDS, cycle=30 * 86400.0)
    assert later.marks == ()
    assert later.pages == 3 * BATCH_MEMORY  # the count itself stays for the cycle


async def test_a_page_handled_again_after_many_batches_of_its_host_counts_its_links_once(
    bus: Bus,
) -> None:
    # The hub's links counted, then twenty other pages of the busy host, one new link
    # each; the hub comes back (its ack lost, an alias hold handed to the other
    # replica): its links are granted again, and not counted twice.
    first, second = await replica(bus, budget=100), await replica(bus, budget=100)
    hub = crawled("https://busy.example/", *(f"https://busy.example/a{n}" for n in range(3)))
    await handle(first, bus, hub)
    for n in range(20):
        page = crawled(f"https://busy.example/p{n}", f"https://busy.example/p{n}/next")
        await handle(first, bus, page)
    await handle(second, bus, hub)
    assert await pages_counted(bus, "busy.example") == 3 + 20
    assert len(await discoveries(bus)) == 23


async def test_a_page_over_budget_first_handled_on_its_redelivery_still_has_its_recrawl(
    bus: Bus,
) -> None:
    # Discovery a day behind a week's interval (an outage): the page was pulled, then
    # handed back unhandled by a pod that stopped, and is handled first on its second
    # delivery with its links over their host's budget. Its re-crawl, due already,
    # still goes out (read whole), under the id its first delivery would have given it.
    discovery = await replica(bus, budget=1)
    event = crawled(
        PAGE,
        "https://site.example/a",
        "https://site.example/b",
        completed_at=utcnow() - timedelta(days=8),
        etag='"v1"',
    )
    await bus.publish(event)
    sub = await bus.js.pull_subscribe_bind(DISCOVERY_LINKS, EVENTS_STREAM)
    try:
        (msg,) = await sub.fetch(1, timeout=5)
        await msg.nak()
        (msg,) = await sub.fetch(1, timeout=5)
        assert msg.metadata.num_delivered == 2
        await discovery.handle_crawl_completed(msg)
        (request,) = await eventually(
            lambda: recorded(bus, CrawlRequested),
            until=bool,
            timeout=10,
            what="the page's re-crawl fired",
        )
        assert (request.id, request.url, request.etag) == (
            derived_event_id(event.id, "recrawl"),
            PAGE,
            None,
        )
        # Delivered once more, it sends the same request, which the stream drops.
        last = (await bus.js.stream_info(EVENTS_STREAM)).state.last_seq
        await msg.nak()
        (msg,) = await sub.fetch(1, timeout=5)
        await discovery.handle_crawl_completed(msg)
        await msg.ack()
        assert (await bus.js.stream_info(EVENTS_STREAM)).state.last_seq == last
    finally:
        await sub.unsubscribe()


async def test_a_pages_new_links_to_a_host_are_counted_at_once_and_only_once(bus: Bus) -> None:
    # One write for a page's new pages of a host: as many as the budget has room for,
    # in order; the page handled again (a redelivery) is granted the same, no more.
    first, second = await replica(bus), await replica(bus)
    page = [f"page-a-{n}" for n in range(5)]
    assert len((await first._within_budget("busy.example", page))[0]) == 5
    assert len((await second._within_budget("busy.example", page))[0]) == 5
    other = [f"page-b-{n}" for n in range(5)]
    assert len((await first._within_budget("busy.example", other))[0]) == BUDGET - 5
    assert len((await second._within_budget("busy.example", other))[0]) == BUDGET - 5
    assert len((await first._within_budget("busy.example", ["page-c-0"]))[0]) == 0


async def test_a_hosts_pages_handled_side_by_side_are_all_granted_at_once(bus: Bus) -> None:
    # A host's pages come back together (no gap) and discovery handles 32 at a time:
    # each handler counts that host's new links on the one key. None may lose its grant
    # to the others' writes while the budget has room: a refused link stays seen, and
    # its page would never be crawled.
    discovery = await replica(bus, budget=100_000)
    handlers = asyncio.Semaphore(32)  # the discovery-links consumer's concurrency

    async def page(n: int) -> int:
        async with handlers:
            return len((await discovery._within_budget("busy.example", links_of(n)))[0])

    granted = await asyncio.gather(*(page(n) for n in range(400)))

    assert granted == [3] * 400
    assert await counted(bus) == 1200


async def test_a_hosts_pages_on_two_replicas_are_each_granted_and_counted_once(
    bus: Bus,
) -> None:
    # One replica with most of the host's pages writes back to back; the other's writes
    # are against a revision the first keeps moving.
    first, second = await replica(bus, budget=100_000), await replica(bus, budget=100_000)
    handlers = {first: asyncio.Semaphore(32), second: asyncio.Semaphore(32)}

    async def page(n: int) -> int:
        discovery = second if n % 8 == 0 else first
        while True:
            async with handlers[discovery]:
                try:
                    return len((await discovery._within_budget("busy.example", links_of(n)))[0])
                except Retry:
                    continue  # handed back: its redelivery asks again

    granted = await asyncio.gather(*(page(n) for n in range(400)))

    assert granted == [3] * 400
    assert await counted(bus) == 1200


async def test_a_page_that_loses_every_write_to_other_replicas_is_handed_back_not_refused(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(discovery_module, "BUDGET_WRITE_ATTEMPTS", 1)
    first, second = await replica(bus, budget=100_000), await replica(bus, budget=100_000)
    assert len((await second._within_budget("busy.example", links_of(0)))[0]) == 3
    assert len((await first._within_budget("busy.example", links_of(1)))[0]) == 3
    # The second replica's remembered revision is stale now: its one write loses.
    with pytest.raises(Retry, match="written by too many replicas"):
        await second._within_budget("busy.example", links_of(2))
    # Asked again (the page's redelivery), it reads the counter first, and is granted.
    assert len((await second._within_budget("busy.example", links_of(2)))[0]) == 3
    assert await counted(bus) == 9


def links_of(n: int) -> list[str]:
    return [f"page-{n}-{k}" for k in range(3)]


async def counted(bus: Bus) -> int:
    return await pages_counted(bus, "busy.example")


async def test_a_link_its_hosts_budget_refused_comes_in_its_next_cycle_from_the_page_read_whole(
    bus: Bus,
) -> None:
    # A budget of two pages a 100 s cycle (a month, scaled down); the hub links to four.
    now = [1_000_000.0]
    settings = DiscoverySettings(
        host_page_budget=2, recrawl_after_seconds=50, recrawl_max_seconds=100
    )
    discovery = Discovery(
        bus=bus,
        seen=await bus.js.key_value(SEEN_BUCKET),
        settings=settings,
        clock=lambda: now[0],
    )
    pages = [f"https://site.example/p{n}" for n in range(4)]

    def hub(visit: int) -> CrawlCompleted:
        at = utcnow()
        return CrawlCompleted(
            url=PAGE,
            domain="site.example",
            scope=Scope(kind=ScopeKind.HOST, value="site.example", max_depth=3),
            request_id=f"work-{visit}",
            outcome=CrawlOutcome.SUCCESS,
            status_code=200,
            started_at=at,
            completed_at=at,
            etag=f'"v{visit}"',
            links=tuple(Link(url=url) for url in pages),
        )

    async def next_visit() -> CrawlRequested:
        msg = await bus.js.get_last_msg(EVENTS_STREAM, page_schedule_subject(PAGE))
        pending = decode_event(msg.data or b"")
        assert isinstance(pending, CrawlRequested)
        return pending

    await handle(discovery, bus, hub(1))
    assert [e.url for e in await discoveries(bus)] == pages[:2]
    # The hub is read whole when next due: a 304 would show the waiting links no more.
    assert (await next_visit()).etag is None
    # Read again within the cycle: the two still wait, asking nothing of the budget.
    now[0] += 60
    await handle(discovery, bus, hub(2))
    assert [e.url for e in await discoveries(bus)] == pages[:2]
    assert (await next_visit()).etag is None
    # The host's next cycle: the page that links to them brings them in, and another
    # replica, which never saw them refused, reads the refusal's end the same way.
    now[0] += 41
    other = Discovery(
        bus=bus,
        seen=await bus.js.key_value(SEEN_BUCKET),
        settings=settings,
        clock=lambda: now[0],
    )
    await handle(other, bus, hub(3))
    assert [e.url for e in await discoveries(bus)] == pages
    assert (await next_visit()).etag == '"v3"'


async def test_a_page_whose_links_fail_still_has_its_recrawl(bus: Bus) -> None:
    # Its host's budget record unreadable: the links fail (the page is handed back, then
    # parked), and the page's own chain goes on regardless.
    seen = await bus.js.key_value(SEEN_BUCKET)
    await seen.put(host_budget_key("site.example"), b"not a count")
    discovery = Discovery(bus=bus, seen=seen, settings=DiscoverySettings())
    at = utcnow()
    event = CrawlCompleted(
        url=PAGE,
        domain="site.example",
        scope=Scope(kind=ScopeKind.HOST, value="site.example", max_depth=3),
        request_id="work-1",
        outcome=CrawlOutcome.SUCCESS,
        status_code=200,
        started_at=at,
        completed_at=at,
        etag='"v1"',
        links=(Link(url="https://site.example/new"),),
    )
    with pytest.raises(ValueError, match="Expecting value"):  # json's, of the record
        await handle(discovery, bus, event)
    msg = await bus.js.get_last_msg(EVENTS_STREAM, page_schedule_subject(PAGE))
    pending = decode_event(msg.data or b"")
    assert isinstance(pending, CrawlRequested)
    # Read whole: the links' handling again plans the same request, which the record
    # drops as a copy, so it could not say that they waited for their host's budget.
    assert pending.etag is None


async def test_a_full_hosts_record_sheds_its_old_batches_pages_once_when_next_read(
    bus: Bus,
) -> None:
    # A tarpit that filled its budget in one batch: nothing writes its record again this
    # cycle, and every batch that names it reads it.
    now = [1_800_000_000.0]
    seen = await bus.js.key_value(SEEN_BUCKET)
    settings = DiscoverySettings(host_page_budget=1_000)
    discovery = Discovery(bus=bus, seen=seen, settings=settings, clock=lambda: now[0])
    pages = [f"tarpit-page/{n}" for n in range(1_000)]
    granted, _ = await discovery._within_budget("tarpit.example", pages, cause="tarpit-home")
    assert len(granted) == 1_000
    key = host_budget_key("tarpit.example")
    full = await seen.get(key)
    assert len(full.value or b"") > 4_000

    now[0] += BATCH_MEMORY_SECONDS
    assert await discovery._full_hosts({"tarpit.example": ["new"]}, "other") == {"tarpit.example"}
    compacted = await seen.get(key)
    assert compacted.revision != full.revision
    assert len(compacted.value or b"") < 200
    assert HostCount.from_bytes(compacted.value).pages == 1_000
    # Once: read again, it stays as it is.
    assert await discovery._full_hosts({"tarpit.example": ["next"]}, "another") == {
        "tarpit.example"
    }
    assert (await seen.get(key)).revision == compacted.revision
