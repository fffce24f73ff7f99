"""Polls of followed timelines: the pages their posts share enter the crawl with the post
as provenance, and each poll schedules the next at the right time, once."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import StackUrls, bucket_keys, eventually
from tests.discovery.crawl_support import crawled, handle, pages_counted
from tests.discovery.follow_support import (
    BusyReplicas,
    SchedulingBus,
    commands_handled,
    handled,
    pending_poll,
    poll_due_now,
    polled,
    publish_polled,
    recorded,
)
from tests.support import send, services
from trove_discovery.discovery import REFUSED, Discovery, _seen_key
from trove_discovery.follows import (
    Follows,
    FollowStore,
    InstanceFollows,
    TimelineFollow,
    parse_command,
    progress_key,
    with_timeline,
)
from trove_discovery.shares import Shares, next_poll, poll_delay, shared_pages
from trove_schema.bus import Bus, Retry, schedule_header
from trove_schema.events import (
    MAX_BACKFILL,
    MAX_RECENT_POSTS,
    CrawlOutcome,
    InstanceUnfollowed,
    PageDiscovered,
    ScopeKind,
    SharedPost,
    TimelinePollRequested,
    decode_event,
)
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import (
    DISCOVERY_LINKS,
    EVENTS_STREAM,
    FOLLOW_SUBJECT,
    FOLLOWS_BUCKET,
    SEEN_BUCKET,
    UNFOLLOW_SUBJECT,
    timeline_schedule_subject,
)

INSTANCE = "https://social.example"
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def make_settings(**overrides: Any) -> DiscoverySettings:
    values: dict[str, Any] = {
        "poll_interval_seconds": 300.0,
        "poll_max_backoff_seconds": 6 * 3600.0,
        "allowed_networks": (),
        "max_url_length": 2048,
        "max_path_repetitions": 3,
    }
    return DiscoverySettings(**(values | overrides))


def request(**fields: Any) -> TimelinePollRequested:
    values: dict[str, Any] = {
        "instance": INSTANCE,
        "domain": "social.example",
        "timeline": "local",
        "follow_id": "follow-1",
    }
    return TimelinePollRequested(**(values | fields))


def post(n: int, *links: str, url: bool = True) -> SharedPost:
    return SharedPost(
        uri=f"{INSTANCE}/users/ann/statuses/{n}",
        url=f"{INSTANCE}/@ann/{n}" if url else None,
        account="ann@social.example",
        shared_at=T0,
        language="en",
        links=links,
    )


def delays(*results: tuple[CrawlOutcome, float | None], **settings: Any) -> list[float]:
    """The pause after each poll of a run of results, failures counted as the chain does."""
    failures, found = 0, []
    for outcome, retry_after in results:
        failures = 0 if outcome is CrawlOutcome.SUCCESS else failures + 1
        event = polled(request(), outcome=outcome, retry_after=retry_after)
        found.append(poll_delay(event, failures, make_settings(**settings)))
    return found


def test_failed_polls_back_off_doubling_up_to_the_cap_unless_the_instance_says() -> None:
    failed, ok = CrawlOutcome.FAILED, CrawlOutcome.SUCCESS
    run = [
        (failed, None),
        (failed, None),
        (failed, None),
        (failed, 60.0),
        (ok, None),
        (failed, None),
        (failed, 1.0),
        (failed, 1.0),
        (ok, None),
        (failed, 1.0),
    ]
    assert delays(*run, poll_interval_seconds=100, poll_max_backoff_seconds=500) == [
        200.0,
        400.0,
        500.0,
        480.0,  # asked for 60 s after three failures in a row: doubled three times
        100.0,
        200.0,
        2.0,
        4.0,
        100.0,
        1.0,  # the first failure in a row: as asked
    ]
    # An instance asking for longer than the cap waits the cap; after a success it is
    # obeyed as well, as is the poll interval.
    assert delays((failed, 10**6), (ok, 30.0), (ok, 1000.0), poll_interval_seconds=100) == [
        6 * 3600.0,
        100.0,
        1000.0,
    ]
    assert delays((failed, None), poll_max_backoff_seconds=21600) == [600.0]
    # A Retry-After of 0 (or of a date gone by) to every poll: the back-off, doubling.
    assert delays((failed, 0.0), (failed, 0.0), poll_interval_seconds=100) == [200.0, 400.0]
    # A thousand failures in a row: no overflow, the cap.
    event = polled(request(), outcome=failed)
    assert poll_delay(event, 1000, make_settings()) == 6 * 3600.0


def test_a_poll_that_stopped_at_its_page_bound_is_followed_at_once() -> None:
    follow = TimelineFollow(follow_id="follow-1", followed_at=T0, cursor="120", poll=3)
    event = polled(
        request(poll=3, cursor="100", api=f"{INSTANCE}/api", software="mastodon"),
        completed_at=T0,
        more=True,
        cursor_after="120",
    )
    nxt, at = next_poll(event, follow, make_settings())
    assert at == T0
    assert (nxt.poll, nxt.cursor, nxt.api, nxt.software, nxt.failures) == (
        4,
        "120",
        f"{INSTANCE}/api",
        "mastodon",
        0,
    )
    assert (nxt.follow_id, nxt.caused_by, nxt.not_before) == ("follow-1", event.id, T0)
    # The same poll result always gives the same request (a redelivery is a duplicate).
    again, then = next_poll(event, follow, make_settings())
    assert (again.model_dump(exclude={"occurred_at"}), then) == (
        nxt.model_dump(exclude={"occurred_at"}),
        at,
    )


def test_a_progress_record_past_a_backfills_bound_still_gives_the_next_poll() -> None:
    # Written by hand, or by a release with a higher bound and rolled back: a request
    # built from it as it is would be refused, and the timeline stop for good.
    written = {"follow_id": "follow-1", "followed_at": T0.isoformat(), "poll": 3}
    follow = TimelineFollow.model_validate(
        written | {"cursor": "120", "back_from": "90", "back_left": 5000, "back_failures": -1}
    )
    event = polled(request(poll=3, cursor="120"), completed_at=T0, cursor_after="120")
    nxt, _ = next_poll(event, follow, make_settings())
    assert (nxt.poll, nxt.back_from, nxt.back_left) == (4, "90", MAX_BACKFILL)
    assert nxt.back_failures == 0


def test_shared_pages_carry_the_post_and_stay_on_their_own_host() -> None:
    follow = TimelineFollow(follow_id="follow-1", followed_at=T0, max_depth=2, priority=4)
    event = polled(
        request(),
        posts=(
            post(1, "https://blog.example/a", "https://10.0.0.1/admin", "https://notes.example/"),
            post(2, "https://blog.example/a", url=False),
        ),
    )
    pages = {p.url: p for p in shared_pages(event, follow, make_settings())}
    assert set(pages) == {
        "https://blog.example/a",
        "https://notes.example/",
        f"{INSTANCE}/@ann/1",
    }
    page = pages["https://blog.example/a"]
    assert (page.depth, page.priority, page.domain) == (0, 4, "blog.example")
    assert (page.scope.kind, page.scope.value, page.scope.max_depth) == (
        ScopeKind.HOST,
        "blog.example",
        2,
    )
    share = page.provenance.share
    assert page.provenance.kind == "share"
    assert share is not None
    assert (share.instance, share.post_uri, share.account, share.language) == (
        INSTANCE,
        f"{INSTANCE}/users/ann/statuses/1",
        "ann@social.example",
        "en",
    )
    # The post's own page is crawled for itself, not as a start of a crawl of the instance.
    assert pages[f"{INSTANCE}/@ann/1"].scope.max_depth == 0
    # Ids follow from the poll: a redelivered poll republishes the same events.
    again = shared_pages(event, follow, make_settings())
    assert [(p.id, p.url) for p in again] == [(p.id, p.url) for p in pages.values()]


async def _follow(stack: StackUrls, bus: Bus, payload: bytes) -> TimelinePollRequested:
    """Follow, and the first poll request (fired at once)."""
    await send(stack, FOLLOW_SUBJECT, payload)
    (first,) = await eventually(
        lambda: recorded(bus, TimelinePollRequested), until=bool, timeout=30, what="a poll"
    )
    return first


async def _handled(bus: Bus, seq: int) -> None:
    await eventually(
        lambda: handled(bus, EVENTS_STREAM, DISCOVERY_LINKS, seq),
        until=bool,
        timeout=30,
        what=f"event {seq} handled",
    )


async def _scheduled(bus: Bus, timeline: str = "local") -> tuple[str, TimelinePollRequested]:
    pending = await pending_poll(bus, INSTANCE, timeline)
    assert pending is not None
    assert pending.headers
    assert pending.data
    event = decode_event(pending.data)
    assert isinstance(event, TimelinePollRequested)
    return pending.headers["Nats-Schedule"], event


@pytest.mark.usefixtures("clean")
async def test_a_poll_discovers_the_shared_pages_and_schedules_the_next_once(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    env = {"TROVE_POLL_INTERVAL_SECONDS": "600"}
    async with services(stack, state_dir, env, only=("discovery",)):
        follow = json.dumps(
            {"instance": INSTANCE, "max_depth": 1, "priority": 3, "backfill": 5}
        ).encode()
        first = await _follow(stack, bus, follow)
        one = polled(
            first,
            posts=(post(1, "https://blog.example/a", "https://notes.example/"),),
            cursor_after="110",
            recent_after=("100", "105"),
            api=f"{INSTANCE}/api/v1",
            software="mastodon",
        )
        seq = await publish_polled(bus, one)
        await _handled(bus, seq)
        found = await recorded(bus, PageDiscovered)
        schedule, second = await _scheduled(bus)
        # Delivered again (after its duplicate window, under another id): nothing new.
        seq = await publish_polled(bus, one, msg_id="redelivered")
        await _handled(bus, seq)
        assert await recorded(bus, PageDiscovered) == found
        assert await _scheduled(bus) == (schedule, second)
        # The next poll stopped at its page bound: the one after fires at once. A page
        # shared again is not discovered again.
        two = polled(
            second,
            posts=(post(2, "https://blog.example/a", "https://blog.example/b"),),
            cursor_after="130",
            recent_after=("105", "120"),
            more=True,
        )
        seq = await publish_polled(bus, two)
        await _handled(bus, seq)
        fired = await eventually(
            lambda: recorded(bus, TimelinePollRequested),
            until=lambda r: len(r) == 2,
            timeout=30,
            what="the third poll",
        )
        found_after = await recorded(bus, PageDiscovered)
    assert {(p.url, p.priority, p.scope.max_depth) for p in found} == {
        ("https://blog.example/a", 3, 1),
        ("https://notes.example/", 3, 1),
        (f"{INSTANCE}/@ann/1", 3, 0),
    }
    assert all(p.provenance.kind == "share" for p in found)
    assert schedule == schedule_header(one.completed_at + timedelta(seconds=600))
    assert first.backfill == 5
    assert (second.poll, second.cursor, second.api, second.software, second.failures) == (
        2,
        "110",
        f"{INSTANCE}/api/v1",
        "mastodon",
        0,
    )
    # What the poll read behind its cursor goes on with the chain, not read again.
    assert second.recent == ("100", "105")
    assert {p.url for p in found_after[len(found) :]} == {
        "https://blog.example/b",
        f"{INSTANCE}/@ann/2",
    }
    third = fired[-1]
    assert (third.poll, third.cursor, third.follow_id) == (3, "130", first.follow_id)
    assert third.recent == ("105", "120")


@pytest.mark.usefixtures("clean")
async def test_failed_polls_are_retried_after_a_doubling_pause(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    env = {"TROVE_POLL_INTERVAL_SECONDS": "100", "TROVE_POLL_MAX_BACKOFF_SECONDS": "1000"}
    async with services(stack, state_dir, env, only=("discovery",)):
        pending = await _follow(stack, bus, INSTANCE.encode())
        seen: list[tuple[int, int, str | None, str]] = []
        results: list[dict[str, Any]] = [
            {"outcome": CrawlOutcome.BLOCKED_4XX, "status_code": 429, "retry_after": 42.0},
            {"outcome": CrawlOutcome.TIMEOUT},
            {"outcome": CrawlOutcome.BLOCKED_5XX, "status_code": 503},
            {"outcome": CrawlOutcome.FAILED},
            {"outcome": CrawlOutcome.SUCCESS, "cursor_after": "7"},
        ]
        for result in results:
            event = polled(pending, **result)
            seq = await publish_polled(bus, event)
            await _handled(bus, seq)
            schedule, pending = await _scheduled(bus)
            pause = datetime.strptime(schedule, "@at %Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
            seen.append((pending.poll, pending.failures, pending.cursor, schedule))
            assert pause == event.completed_at + timedelta(
                seconds=[42, 400, 800, 1000, 100][len(seen) - 1]
            )
    assert [(poll, failures, cursor) for poll, failures, cursor, _ in seen] == [
        (2, 1, None),
        (3, 2, None),
        (4, 3, None),
        (5, 4, None),
        (6, 0, "7"),
    ]


@pytest.mark.usefixtures("clean")
async def test_a_poll_stamped_ahead_is_followed_an_interval_after_its_record_time(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    env = {"TROVE_POLL_INTERVAL_SECONDS": "600"}
    ahead = datetime.now(UTC) + timedelta(days=365)
    async with services(stack, state_dir, env, only=("discovery",)):
        first = await _follow(stack, bus, INSTANCE.encode())
        seq = await publish_polled(bus, polled(first, completed_at=ahead, cursor_after="7"))
        await _handled(bus, seq)
        schedule, second = await _scheduled(bus)
    stored = (await bus.js.get_msg(EVENTS_STREAM, seq)).time
    assert stored is not None
    assert stored < ahead - timedelta(days=364)
    due = datetime.strptime(schedule, "@at %Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    # One timestamp, read twice: nats-py rounds its nanoseconds differently each way.
    assert abs(due - (stored + timedelta(seconds=600))) < timedelta(milliseconds=2)
    assert second.cursor == "7"


@pytest.mark.usefixtures("clean")
async def test_an_unfollow_stops_the_chain(stack: StackUrls, bus: Bus, state_dir: Path) -> None:
    env = {"TROVE_POLL_INTERVAL_SECONDS": "600"}
    async with services(stack, state_dir, env, only=("discovery",)):
        first = await _follow(stack, bus, INSTANCE.encode())
        seq = await publish_polled(bus, polled(first, cursor_after="5"))
        await _handled(bus, seq)
        _, second = await _scheduled(bus)
        await send(stack, UNFOLLOW_SUBJECT, INSTANCE.encode())
        (unfollowed,) = await eventually(
            lambda: recorded(bus, InstanceUnfollowed), until=bool, timeout=30, what="unfollowed"
        )
        # The pending poll is dropped: a tombstone in its place on the schedule subject.
        tombstone = await pending_poll(bus, INSTANCE, "local")
        assert tombstone is not None
        assert "Nats-Schedule" not in (tombstone.headers or {})
        assert not tombstone.data
        # A poll that was under way ends: its result is ignored, nothing follows it.
        seq = await publish_polled(
            bus, polled(second, posts=(post(3, "https://blog.example/late"),), cursor_after="9")
        )
        await _handled(bus, seq)
        await commands_handled(bus, "the unfollow handled")
        after = await pending_poll(bus, INSTANCE, "local")
        assert after is not None
        assert after.seq == tombstone.seq
        assert await recorded(bus, PageDiscovered) == []
        assert await recorded(bus, TimelinePollRequested) == [first]
        # Followed again: a new chain from a fresh start, on the same schedule subject.
        await send(stack, FOLLOW_SUBJECT, INSTANCE.encode())
        polls = await eventually(
            lambda: recorded(bus, TimelinePollRequested),
            until=lambda found: len(found) == 2,
            timeout=30,
            what="the new chain's first poll",
        )
    assert (unfollowed.instance, unfollowed.timeline) == (INSTANCE, None)
    again = polls[-1]
    assert again.follow_id != first.follow_id
    assert (again.poll, again.cursor) == (1, None)


@pytest.mark.usefixtures("clean")
async def test_a_page_shared_on_an_excluded_host_is_not_discovered(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    env = {"TROVE_POLL_INTERVAL_SECONDS": "600", "TROVE_EXCLUDED_HOSTS": "notes.example"}
    async with services(stack, state_dir, env, only=("discovery",)):
        first = await _follow(stack, bus, INSTANCE.encode())
        shares = ("https://blog.example/a", "https://notes.example/", "https://www.notes.example/")
        seq = await publish_polled(bus, polled(first, posts=(post(1, *shares),)))
        await _handled(bus, seq)
        found = await recorded(bus, PageDiscovered)
    assert {p.url for p in found} == {"https://blog.example/a", f"{INSTANCE}/@ann/1"}


@dataclass
class Refollowed:
    """A timeline followed (its first poll under way), that can be unfollowed and
    followed again; ``seq`` far past the seeds stream's own sequence, so that the ids
    derived from it are the test's alone (see test_follows)."""

    bus: Bus
    store: FollowStore
    follows: Follows
    first: TimelinePollRequested
    seq: int

    async def again(self) -> bool:
        (follow,) = parse_command(INSTANCE.encode(), verb="follow", settings=SETTINGS).accepted
        (unfollow,) = parse_command(INSTANCE.encode(), verb="unfollow", settings=SETTINGS).accepted
        await self.follows.unfollow(unfollow, place=str(self.seq + 1), origin=UNFOLLOW_SUBJECT)
        return await self.follows.follow(follow, place=str(self.seq + 2), origin=FOLLOW_SUBJECT)

    async def current(self) -> TimelineFollow:
        follow = await self.store.timeline(INSTANCE, "local")
        assert follow is not None
        return follow

    async def shares(self, bus: Bus | None = None) -> Shares:
        seen = await self.bus.js.key_value(SEEN_BUCKET)
        discovery = Discovery(bus=self.bus, seen=seen, settings=SETTINGS)
        return Shares(bus=bus or self.bus, store=self.store, discovery=discovery, settings=SETTINGS)


SETTINGS = make_settings(poll_interval_seconds=600.0)


async def _followed(bus: Bus, seq: int) -> Refollowed:
    """The local timeline followed by the command of stream sequence ``seq``: one of
    its own for each test, as the events derive their ids from it and a reset keeps the
    stream's duplicate window (``trove_stack.reset``)."""
    store = FollowStore(await bus.js.key_value(FOLLOWS_BUCKET))
    follows = Follows(bus=bus, store=store, settings=SETTINGS)
    (follow,) = parse_command(INSTANCE.encode(), verb="follow", settings=SETTINGS).accepted
    assert await follows.follow(follow, place=str(seq), origin=FOLLOW_SUBJECT)
    first = await poll_due_now(bus, INSTANCE, "local")
    return Refollowed(bus, store, follows, first, seq)


@pytest.mark.usefixtures("clean")
async def test_a_timeline_followed_again_while_polled_keeps_polling(bus: Bus) -> None:
    """An unfollow and a follow between a poll's handling and its next schedule: that
    schedule replaces the new chain's first poll, and its own answer is ignored."""
    timeline = await _followed(bus, 2 * 10**9)
    landed: list[bool] = []

    async def commands(request: TimelinePollRequested) -> None:
        if request.poll > 1 and not landed:  # just before the next poll is scheduled
            landed.append(await timeline.again())

    racing = SchedulingBus(bus.nc, bus.js)
    racing.scheduled, racing.before = [], commands
    shares = await timeline.shares(racing)
    await shares.polled(polled(timeline.first, cursor_after="5"))
    assert landed == [True]
    current = await timeline.current()
    pending = await poll_due_now(bus, INSTANCE, "local")
    assert current.follow_id != timeline.first.follow_id
    assert (pending.follow_id, pending.poll, pending.cursor) == (current.follow_id, 1, None)


@pytest.mark.usefixtures("clean")
async def test_a_poll_whose_progress_keeps_losing_to_other_replicas_is_handed_back(
    bus: Bus,
) -> None:
    """Handed back to come again, not failed: five failures would park the result, and
    the timeline's chain would wait for an operator."""
    timeline = await _followed(bus, 8 * 10**9)
    seen = await bus.js.key_value(SEEN_BUCKET)
    discovery = Discovery(bus=bus, seen=seen, settings=SETTINGS)
    busy = Shares(
        bus=bus, store=BusyReplicas(timeline.store.kv), discovery=discovery, settings=SETTINGS
    )
    result = polled(timeline.first, cursor_after="5")
    with pytest.raises(Retry, match="kept changing"):
        await busy.polled(result)
    await (await timeline.shares()).polled(result)
    assert (await timeline.current()).cursor == "5"


@pytest.mark.usefixtures("clean")
async def test_a_result_redelivered_late_beside_the_next_one_leaves_the_chain_going(
    bus: Bus,
) -> None:
    """Its first handling scheduled the next poll and died before its ack; it comes back
    after the duplicate window, handled beside that poll's result: the poll it schedules
    again replaces the one the later result scheduled, whose answer would be ignored as
    older than the last one handled, and the chain would end for good."""
    timeline = await _followed(bus, 7 * 10**9)
    shares = await timeline.shares()
    # Its next poll at once; the instance's API and software known by now.
    one = polled(
        timeline.first, cursor_after="5", more=True, api=f"{INSTANCE}/api/v1", software="mastodon"
    )
    await shares.polled(one)

    async def fired() -> list[TimelinePollRequested]:
        return await recorded(bus, TimelinePollRequested)

    found = await eventually(
        fired, until=lambda found: any(r.poll == 2 for r in found), timeout=10, what="poll 2"
    )
    two = polled(next(r for r in found if r.poll == 2), cursor_after="7")
    info = await bus.js.stream_info(EVENTS_STREAM)
    await bus.js.update_stream(replace(info.config, duplicate_window=1.0))
    await asyncio.sleep(1.5)  # the duplicate window passes: the same ids are stored again

    async def two_handled_meanwhile(request: TimelinePollRequested) -> None:
        racing.before = None
        await shares.polled(two)  # schedules poll 3, at the poll interval

    racing = SchedulingBus(bus.nc, bus.js)
    racing.scheduled, racing.before = [], two_handled_meanwhile
    await (await timeline.shares(racing)).polled(one, redelivered=True)
    found = await eventually(
        fired, until=lambda found: any(r.poll == 3 for r in found), timeout=10, what="poll 3"
    )
    # Resumed with what the chain knows of the instance: no NodeInfo asked again.
    resumed = next(r for r in found if r.poll == 3)
    assert (resumed.api, resumed.software) == (f"{INSTANCE}/api/v1", "mastodon")


@pytest.mark.usefixtures("clean")
async def test_a_poll_result_redelivered_after_a_follow_again_resumes_the_new_chain(
    bus: Bus,
) -> None:
    """Its first handling scheduled the old chain's next poll over the new chain's first,
    then died before it looked again: the redelivery, no longer current, resumes it."""
    timeline = await _followed(bus, 3 * 10**9)
    result = polled(timeline.first, cursor_after="5")
    assert await timeline.again()
    # What the first handling did before it died: the old chain's next poll scheduled.
    current = await timeline.current()
    stale, at = next_poll(result, current, SETTINGS)
    await bus.publish_at(stale, at, schedule=timeline_schedule_subject(INSTANCE, "local"))
    await (await timeline.shares()).polled(result, redelivered=True)
    pending = await poll_due_now(bus, INSTANCE, "local")
    assert stale.follow_id == timeline.first.follow_id
    assert pending.follow_id == current.follow_id != timeline.first.follow_id


@pytest.mark.usefixtures("clean")
async def test_an_old_chains_result_arriving_after_a_follow_again_leaves_the_new_chain_be(
    bus: Bus,
) -> None:
    """First delivered after the follow again, it scheduled nothing: the new chain's
    pending poll stands (not replaced by one at once, ignoring its interval)."""
    timeline = await _followed(bus, 4 * 10**9)
    assert await timeline.again()
    new_first = await poll_due_now(bus, INSTANCE, "local")
    await (await timeline.shares()).polled(polled(timeline.first, cursor_after="5"))
    pending = await poll_due_now(bus, INSTANCE, "local")
    assert new_first.follow_id != timeline.first.follow_id
    assert pending == new_first


@pytest.mark.usefixtures("clean")
async def test_a_poll_handled_again_after_other_pages_of_a_host_counts_its_shares_once(
    bus: Bus,
) -> None:
    """Handled again (its ack lost, or its handling died once its shares were counted:
    the next poll not scheduled, its pod gone) after nine other pages of the host were
    counted, its pages are granted again: neither counted again nor refused."""
    timeline = await _followed(bus, 5 * 10**9)
    seen = await bus.js.key_value(SEEN_BUCKET)
    settings = make_settings(host_page_budget=25)
    discovery = Discovery(bus=bus, seen=seen, settings=settings)
    shares = Shares(bus=bus, store=timeline.store, discovery=discovery, settings=settings)
    shared = [f"https://blog.example/{n}" for n in range(10)]
    result = polled(timeline.first, posts=(post(1, *shared, url=False),), cursor_after="5")
    await shares.polled(result)
    for n in range(9):
        page = crawled(f"https://blog.example/p{n}", f"https://blog.example/p{n}/next")
        await handle(discovery, bus, page)
    await shares.polled(result, redelivered=True)
    assert await pages_counted(bus, "blog.example") == 10 + 9
    claims = [(await seen.get(_seen_key(url))).value or b"" for url in shared]
    assert not [claim for claim in claims if claim.startswith(REFUSED)]
    assert len(await recorded(bus, PageDiscovered)) == 10 + 9


@pytest.mark.usefixtures("clean")
async def test_a_polls_new_pages_of_a_full_host_cost_no_seen_key(bus: Bus) -> None:
    """A busy timeline naming new pages of a host whose budget is spent: refused before
    any is claimed, as a page's links are, not written twice each at every poll."""
    timeline = await _followed(bus, 13 * 10**9)
    seen = await bus.js.key_value(SEEN_BUCKET)
    settings = make_settings(host_page_budget=2)
    discovery = Discovery(bus=bus, seen=seen, settings=settings)
    shares = Shares(bus=bus, store=timeline.store, discovery=discovery, settings=settings)
    request = timeline.first
    for n in range(4):
        links = [f"https://busy.example/{n}-{k}" for k in range(10)]
        result = polled(request, posts=(post(n, *links, url=False),), cursor_after=str(10 + n))
        await shares.polled(result)
        request = next_poll(result, await timeline.current(), settings)[0]
    keys = [k for k in await bucket_keys(bus, SEEN_BUCKET) if k.startswith("u.")]
    # The first poll's ten (two granted, eight refused and marked), none after.
    assert len(keys) == 10, len(keys)
    assert len(await recorded(bus, PageDiscovered)) == 2


@pytest.mark.usefixtures("clean")
async def test_each_timeline_keeps_its_progress_however_long_its_posts_ids_are(
    bus: Bus,
) -> None:
    """Post ids are the instance's to choose (200 characters each, 200 kept a timeline):
    kept with the instance's follows, a hundred tags' progress passed the largest
    message nats-server takes, and no poll of the instance could be written. A poll
    writes its own timeline's progress, and never the instance's follows."""
    store = FollowStore(await bus.js.key_value(FOLLOWS_BUCKET))
    follows = Follows(bus=bus, store=store, settings=SETTINGS)
    tags = [f"tag:t{n}" for n in range(110)]
    for n, tag in enumerate(tags):
        line = f"{INSTANCE} {tag}".encode()
        (command,) = parse_command(line, verb="follow", settings=SETTINGS).accepted
        assert await follows.follow(command, place=str(9 * 10**9 + n), origin=FOLLOW_SUBJECT)
    record, revision = await store.read(INSTANCE)
    seen = await bus.js.key_value(SEEN_BUCKET)
    shares = Shares(
        bus=bus,
        store=store,
        discovery=Discovery(bus=bus, seen=seen, settings=SETTINGS),
        settings=SETTINGS,
    )
    for tag in tags:
        ids = tuple(f"{tag}-{n:04d}-".ljust(200, "x") for n in range(MAX_RECENT_POSTS))
        first = request(timeline=tag, follow_id=record.timelines[tag].follow_id, poll=1)
        await shares.polled(polled(first, cursor_after=ids[-1], recent_after=ids))
    for tag in tags:
        follow = await store.timeline(INSTANCE, tag)
        assert follow is not None
        assert (follow.poll, follow.cursor, len(follow.recent)) == (1, follow.recent[-1], 200)
        assert follow.recent[0].startswith(f"{tag}-0000-")
    assert (await store.read(INSTANCE))[1] == revision


@pytest.mark.usefixtures("clean")
async def test_a_timelines_progress_an_earlier_release_kept_with_its_follow_goes_on(
    bus: Bus,
) -> None:
    timeline = await _followed(bus, 11 * 10**9)
    record, revision = await timeline.store.read(INSTANCE)
    kept = {"poll": 3, "polled_id": "polled-3", "cursor": "30", "recent": ("29", "30")}
    earlier = record.timelines["local"].model_copy(update=kept)
    await timeline.store.write(with_timeline(record, "local", earlier), revision)
    shares = await timeline.shares()
    assert (await timeline.current()).cursor == "30"
    # The poll it had scheduled: its result is newer, and goes on from the cursor.
    fourth = request(follow_id=earlier.follow_id, poll=4, cursor="30")
    await shares.polled(polled(fourth, cursor_after="41", recent_after=("40", "41")))
    assert ((await timeline.current()).poll, (await timeline.current()).cursor) == (4, "41")
    # The third's result, redelivered, is older than the last handled.
    third = request(follow_id=earlier.follow_id, poll=3, cursor="20")
    await shares.polled(polled(third, cursor_after="30", recent_after=("29", "30")))
    assert ((await timeline.current()).poll, (await timeline.current()).cursor) == (4, "41")


@pytest.mark.usefixtures("clean")
async def test_the_cursors_time_goes_on_with_the_chain_from_a_record_written_without_it(
    bus: Bus,
) -> None:
    """The poller tells a timeline numbered anew by when its cursor was read: the
    time each poll ends on is the next request's. A timeline's progress written before
    it was kept reads as not knowing it."""
    timeline = await _followed(bus, 12 * 10**9)
    follow_id = timeline.first.follow_id
    written = {"follow_id": follow_id, "poll": 3, "polled_id": "polled-3", "cursor": "30"}
    key = progress_key(INSTANCE, "local")
    await timeline.store.kv.put(key, json.dumps(written | {"recent": ["29", "30"]}).encode())
    assert ((await timeline.current()).cursor, (await timeline.current()).cursor_at) == ("30", None)
    shares = await timeline.shares()
    read = T0 - timedelta(minutes=7)
    fourth = request(follow_id=follow_id, poll=4, cursor="30")
    await shares.polled(polled(fourth, cursor_after="41", cursor_after_at=read))
    _, fifth = await _scheduled(bus)
    assert (fifth.poll, fifth.cursor, fifth.cursor_at) == (5, "41", read)
    assert (await timeline.current()).cursor_at == read
    # The cursor where it was, told by a fetcher of a release that does not tell the
    # time: the time known stays with it.
    await shares.polled(polled(fifth, cursor_after="41"))
    _, sixth = await _scheduled(bus)
    assert (sixth.poll, sixth.cursor, sixth.cursor_at) == (6, "41", read)
    # A cursor moved by a release that does not tell when it read it: none.
    await shares.polled(polled(sixth, cursor_after="52"))
    _, seventh = await _scheduled(bus)
    assert (seventh.poll, seventh.cursor, seventh.cursor_at) == (7, "52", None)


@pytest.mark.usefixtures("clean")
async def test_two_follows_of_a_tag_in_two_cases_keep_a_progress_each(bus: Bus) -> None:
    """Kept so by a release that kept the case given: two chains, whose failures each
    double their own back-off."""
    store = FollowStore(await bus.js.key_value(FOLLOWS_BUCKET))
    now = datetime.now(UTC)
    spellings = {"tag:Foo": "follow-upper", "tag:foo": "follow-lower"}
    follows = {
        name: TimelineFollow(follow_id=id, followed_at=now) for name, id in spellings.items()
    }
    await store.write(InstanceFollows(instance=INSTANCE, timelines=follows), None)
    seen = await bus.js.key_value(SEEN_BUCKET)
    discovery = Discovery(bus=bus, seen=seen, settings=SETTINGS)
    shares = Shares(bus=bus, store=store, discovery=discovery, settings=SETTINGS)
    for poll in range(1, 4):
        for name, follow_id in spellings.items():
            failed = request(timeline=name, follow_id=follow_id, poll=poll, failures=poll - 1)
            await shares.polled(polled(failed, outcome=CrawlOutcome.BLOCKED_5XX))
    for name in spellings:
        follow = await store.timeline(INSTANCE, name)
        assert follow is not None
        assert (follow.poll, follow.failures) == (3, 3)


@pytest.mark.usefixtures("clean")
async def test_a_backfill_a_poll_left_goes_on_with_the_chain_until_it_is_read(bus: Bus) -> None:
    """What the first poll's pages did not read of the backfill is the next request's to
    read on from; a failed poll keeps it (and the waits it counted), and a poll that read
    it ends it."""
    timeline = await _followed(bus, 14 * 10**9)
    shares = await timeline.shares()
    await shares.polled(polled(timeline.first, cursor_after="100", back_from="81", back_left=12))
    _, second = await _scheduled(bus)
    assert (second.poll, second.cursor, second.back_from, second.back_left) == (2, "100", "81", 12)
    assert (await timeline.current()).back_from == "81"
    # A wait asked where the backfill is read: the poll failed, and counts it all the same.
    await shares.polled(polled(second, outcome=CrawlOutcome.BLOCKED_4XX, back_failures=1))
    _, third = await _scheduled(bus)
    assert (third.poll, third.back_from, third.back_left, third.back_failures) == (3, "81", 12, 1)
    await shares.polled(polled(third, cursor_after="104", back_from="70", back_left=1))
    _, fourth = await _scheduled(bus)
    assert (fourth.poll, fourth.cursor, fourth.back_from, fourth.back_left) == (4, "104", "70", 1)
    assert fourth.back_failures == 0
    await shares.polled(polled(fourth, cursor_after="104"))
    _, fifth = await _scheduled(bus)
    assert (fifth.poll, fifth.back_from, fifth.back_left) == (5, None, 0)
