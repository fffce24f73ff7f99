"""Re-crawls: one pending request per page, on real NATS (schedules and the seen bucket)."""

from __future__ import annotations

import itertools
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import nats.js.errors
import pydantic
import pytest

from tests.conftest import StackUrls, eventually
from tests.discovery.crawl_support import crawled, discoveries, handle
from tests.fetcher._servers import Exchange, LocalServer, Seen
from tests.support import cycle_env, services
from trove_discovery.app import check_recrawls_are_kept, warn_of_a_short_seen_ttl
from trove_discovery.discovery import Discovery
from trove_schema.bus import Bus
from trove_schema.change_rate import estimate_rate
from trove_schema.events import (
    ChangeHistory,
    CrawlCompleted,
    CrawlOutcome,
    CrawlRequested,
    Link,
    LinkKind,
    RequestReason,
    Scope,
    ScopeKind,
    decode_event,
    derived_event_id,
    utcnow,
)
from trove_schema.settings import DiscoverySettings, RecorderSettings
from trove_schema.topology import (
    CRAWL_REQUESTED,
    EVENT_SCHEDULES_PREFIX,
    EVENTS_STREAM,
    SEEDS_SUBJECT,
    SEEN_BUCKET,
    TopologyOptions,
    declare,
    ensure_topology,
    page_schedule_subject,
)

pytestmark = pytest.mark.usefixtures("clean")

PAGE = "https://site.example/page"
SCOPE = Scope(kind=ScopeKind.HOST, value="site.example", max_depth=3)


async def replica(bus: Bus, **settings: float) -> Discovery:
    return Discovery(
        bus=bus,
        seen=await bus.js.key_value(SEEN_BUCKET),
        settings=DiscoverySettings(**settings),  # type: ignore[arg-type]
    )


def completed(n: int, url: str = PAGE) -> CrawlCompleted:
    now = utcnow()
    return CrawlCompleted(
        url=url,
        domain="site.example",
        scope=SCOPE,
        request_id=f"work-{n}",
        outcome=CrawlOutcome.SUCCESS,
        started_at=now,
        completed_at=now,
        etag=f'"v{n}"',
    )


def request(n: int, delay: float) -> CrawlRequested:
    return CrawlRequested(
        url=PAGE,
        domain="site.example",
        scope=SCOPE,
        reason=RequestReason.RETRY,
        not_before=utcnow() + timedelta(seconds=delay),
        caused_by=f"attempt-{n}",
    )


async def pending_schedules(bus: Bus) -> dict[str, int]:
    info = await bus.js.stream_info(EVENTS_STREAM, subjects_filter=f"{EVENT_SCHEDULES_PREFIX}.>")
    return dict(info.state.subjects or {})


async def requests_fired(bus: Bus) -> int:
    info = await bus.js.stream_info(EVENTS_STREAM, subjects_filter=CRAWL_REQUESTED)
    return (info.state.subjects or {}).get(CRAWL_REQUESTED, 0)


async def test_a_new_schedule_for_a_page_replaces_the_pending_one(bus: Bus) -> None:
    # What the whole design rests on: the server keeps one schedule per subject.
    first, second = request(1, delay=1.0), request(2, delay=1.5)
    await bus.publish_at(first, first.not_before or utcnow(), schedule=page_schedule_subject(PAGE))
    await bus.publish_at(
        second, second.not_before or utcnow(), schedule=page_schedule_subject(PAGE)
    )
    assert await pending_schedules(bus) == {page_schedule_subject(PAGE): 1}

    # The first was due earlier: had it survived, it would have fired before the second.
    await eventually(lambda: requests_fired(bus), until=lambda n: n >= 1, timeout=10)
    fired = await bus.js.get_last_msg(EVENTS_STREAM, CRAWL_REQUESTED)
    assert decode_event(fired.data or b"").id == second.id
    assert await requests_fired(bus) == 1
    assert await pending_schedules(bus) == {}


async def test_schedules_of_different_pages_do_not_replace_each_other(bus: Bus) -> None:
    other = "https://site.example/other"
    await (await replica(bus))._request_recrawl(completed(1))
    await (await replica(bus))._request_recrawl(completed(2, url=other))
    assert await pending_schedules(bus) == {
        page_schedule_subject(PAGE): 1,
        page_schedule_subject(other): 1,
    }


async def test_a_second_fetch_of_a_page_leaves_one_pending_recrawl(bus: Bus) -> None:
    # A forced seed, or a fetch after the page was discovered again, completes while a
    # re-crawl is pending: the newer re-crawl replaces it, so one chain goes on.
    discovery = await replica(bus, recrawl_after_seconds=3600)
    second = completed(2)
    await discovery._request_recrawl(completed(1))
    await discovery._request_recrawl(second)

    assert await pending_schedules(bus) == {page_schedule_subject(PAGE): 1}
    msg = await bus.js.get_last_msg(EVENTS_STREAM, page_schedule_subject(PAGE))
    pending = decode_event(msg.data or b"")
    assert pending.id == derived_event_id(second.id, "recrawl")
    assert isinstance(pending, CrawlRequested)
    assert pending.etag == '"v2"'


async def test_a_page_under_a_spelling_canonicalization_now_drops_is_not_recrawled_under_it(
    bus: Bus,
) -> None:
    # Discovered before a release named osCsid a session id: its chain would go on for
    # ever beside its twin's. Its one spelling is followed instead, as a learned alias.
    discovery = Discovery(
        bus=bus, seen=await bus.js.key_value(SEEN_BUCKET), settings=DiscoverySettings()
    )
    old = "https://shop.example/product_info.php?products_id=7&osCsid=0a1b2c3d4e5f"
    await handle(discovery, bus, crawled(old))
    with pytest.raises(nats.js.errors.NotFoundError):
        await bus.js.get_last_msg(EVENTS_STREAM, page_schedule_subject(old))
    assert [d.url for d in await discoveries(bus)] == [
        "https://shop.example/product_info.php?products_id=7"
    ]


async def pending_request(bus: Bus, url: str) -> CrawlRequested | None:
    """The request pending on ``url``'s schedule subject, if any."""
    try:
        msg = await bus.js.get_last_msg(EVENTS_STREAM, page_schedule_subject(url))
    except nats.js.errors.NotFoundError:
        return None
    pending = decode_event(msg.data or b"")
    assert isinstance(pending, CrawlRequested)
    return pending


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("http://site.example/post", "https://site.example/post"),
        ("https://site.example/dir", "https://site.example/dir/"),
        ("https://site.example/dir/", "https://site.example/dir"),
        ("http://site.example/dir?p=2", "https://site.example/dir/?p=2"),
    ],
    ids=["to https", "a slash added", "a slash taken away", "both"],
)
async def test_a_page_moved_for_good_on_its_host_is_recrawled_where_it_lives(
    bus: Bus, old: str, new: str
) -> None:
    """An http:// link to a blog now at https://, a /dir answering at /dir/ (a 301):
    re-crawled under the URL it was asked by, the page cost a redirect and two reads a
    cycle (its target is a page of its own too). Its chain goes on at the target, on the
    target's subject, which holds one request whichever chain scheduled it last."""
    discovery = await replica(bus)
    await handle(discovery, bus, crawled(old, final_url=new, moved=True, etag='"v1"'))
    assert await pending_request(bus, old) is None
    moved = await pending_request(bus, new)
    assert moved is not None
    assert moved.url == new
    # Read whole where it lives: the content was the old name's row's, and a 304 there
    # would leave the page's own row without any.
    assert (moved.etag, moved.validators_url) == (None, None)
    # Both names hold the page's place: a link to the old one brings no second read.
    assert not await discovery._first_sighting(old, "a-link-to-the-old-name")
    assert not await discovery._first_sighting(new, "a-link-to-the-new-name")


async def test_a_moved_pages_link_to_where_it_lives_is_no_new_page(bus: Bus) -> None:
    """A blog moved to https names its https self as canonical, as nearly every CMS does:
    the move's fetch read the page there, and its chain goes on there; discovered as a
    new page as well, it was fetched again at once and counted against its host."""
    discovery = await replica(bus)
    old, new = "http://site.example/post", "https://site.example/post"
    event = crawled(old, final_url=new, moved=True, canonical_url=new)
    links = (Link(url=new, kind=LinkKind.CANONICAL), Link(url="https://site.example/other"))
    await handle(discovery, bus, event.model_copy(update={"links": links}))
    assert [d.url for d in await discoveries(bus)] == ["https://site.example/other"]
    moved = await pending_request(bus, new)
    assert moved is not None
    assert moved.caused_by == event.id


async def test_a_page_moved_where_a_chain_goes_on_already_leaves_that_chain_alone(
    bus: Bus,
) -> None:
    """The old name comes back by a link a seen TTL after its chain moved (or the
    target was a page of its own first): the target's chain goes on as it was, with the
    interval its change history learned, not put back to the first one."""
    discovery = await replica(bus)
    old, new = "http://site.example/post", "https://site.example/post"
    own = crawled(new, history=ChangeHistory(interval=20 * 86400.0))
    await handle(discovery, bus, own)
    before = await pending_request(bus, new)
    assert before is not None
    await handle(discovery, bus, crawled(old, final_url=new, moved=True))
    after = await pending_request(bus, new)
    assert after is not None
    assert (after.id, after.not_before) == (before.id, before.not_before)
    assert await pending_request(bus, old) is None
    assert not await discovery._first_sighting(old, "a-link-to-the-old-name")


async def test_a_page_moved_where_the_target_completes_meanwhile_leaves_its_request_alone(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The target's own request in flight while the move looks (nothing waits there),
    its completion scheduling the next before the move publishes: the move's request
    would replace it, and the target's learned interval go back to the first one."""
    discovery, target = await replica(bus), await replica(bus)
    old, new = "http://site.example/post", "https://site.example/post"
    own = crawled(new, history=ChangeHistory(interval=20 * 86400.0))
    looked = bus.waiting

    async def completes_meanwhile(schedule: str) -> tuple[bytes | None, int]:
        seen = await looked(schedule)
        monkeypatch.setattr(bus, "waiting", looked)
        await handle(target, bus, own)
        return seen

    monkeypatch.setattr(bus, "waiting", completes_meanwhile)
    await handle(discovery, bus, crawled(old, final_url=new, moved=True))
    after = await pending_request(bus, new)
    assert after is not None
    assert after.caused_by == own.id
    assert await pending_request(bus, old) is None


async def test_a_moved_pages_later_round_replaces_the_request_its_first_round_planned(
    bus: Bus,
) -> None:
    """A later delivery of the moving attempt (links held back by their host's budget)
    plans the page's request again, to read it whole: the request waiting where the page
    moved is its own first round's, not another chain's to join."""
    discovery = await replica(bus, recrawl_after_seconds=3600)
    old, new = "http://site.example/post", "https://site.example/post"
    event = crawled(old, final_url=new, moved=True)
    await handle(discovery, bus, event)
    await discovery._request_recrawl(event, validators=False, after_hold=True)
    again = await pending_request(bus, new)
    assert again is not None
    assert again.id == derived_event_id(event.id, "recrawl-after-hold")


@pytest.mark.parametrize(
    ("final", "moved"),
    [
        ("https://site.example/post", False),  # for now (302, 307): asked here again
        ("https://site.example/", True),  # a site-wide 301 to its home page
        ("https://site.example/post.html", True),  # another path
        ("https://other.site.example/post", True),  # another host (never followed)
        ("https://site.example/posts", True),  # a letter added, not a slash
        ("https://site.example/post?lang=en", True),  # another query
    ],
    ids=["for now", "home page", "another path", "another host", "a letter", "a query"],
)
async def test_a_page_redirected_elsewhere_is_recrawled_under_its_own_url(
    bus: Bus, final: str, moved: bool
) -> None:
    """Only a move that keeps what the URL names moves the chain: a site-wide 301 to one
    page would otherwise make every page's chain that page's one chain, and a
    temporary redirect says to ask the page's own URL again."""
    discovery = await replica(bus)
    old = "http://site.example/post"
    await handle(discovery, bus, crawled(old, final_url=final, moved=moved))
    pending = await pending_request(bus, old)
    assert pending is not None
    assert pending.url == old


async def test_a_page_moved_back_moves_its_chain_back(bus: Bus) -> None:
    """A site that sends /dir to /dir/ and, a year on, /dir/ to /dir: the chain went on
    at /dir/, and goes on at /dir again; it is moved each time, never ended."""
    discovery = await replica(bus)
    slash, bare = "https://site.example/dir/", "https://site.example/dir"
    await handle(discovery, bus, crawled(bare, final_url=slash, moved=True))
    assert (await pending_request(bus, slash)) is not None
    await handle(discovery, bus, crawled(slash, final_url=bare, moved=True))
    back = await pending_request(bus, bare)
    assert back is not None
    assert back.url == bare


async def test_links_do_not_discover_a_page_that_has_a_pending_recrawl(bus: Bus) -> None:
    first = await replica(bus)
    assert await first._first_sighting(PAGE, "discovered-by-a-link")
    fetched = completed(1)
    await first._request_recrawl(fetched)

    # The seen key now holds the re-crawl request, for a full seen_ttl from now.
    entry = await (await bus.js.key_value(SEEN_BUCKET)).get(
        next(k for k in await (await bus.js.key_value(SEEN_BUCKET)).keys() if k.startswith("u."))
    )
    assert entry.value == derived_event_id(fetched.id, "recrawl").encode()
    # Another replica, knowing nothing, and this one both refuse a new cause.
    assert not await (await replica(bus))._first_sighting(PAGE, "another-link")
    assert not await first._first_sighting(PAGE, "another-link")


async def test_a_page_whose_requests_ended_is_discovered_again_after_the_seen_ttl(
    bus: Bus,
) -> None:
    # A scaled-down cycle: re-crawl after 1 s, seen for 2 s.
    settings = {"recrawl_after_seconds": 1.0, "recrawl_max_seconds": 1.0, "seen_ttl_seconds": 2.0}
    options = TopologyOptions(seen_ttl=DiscoverySettings(**settings).seen_ttl)  # type: ignore[arg-type]
    await ensure_topology(bus.js, declare(options), owner="discovery")
    discovery = await replica(bus, **settings)
    assert await discovery._first_sighting(PAGE, "discovered-first")
    # Failed for good: no re-crawl keeps the key alive, so it expires and a link brings it back.
    assert not await discovery._first_sighting(PAGE, "a-link-meanwhile")
    await eventually(
        lambda: discovery._first_sighting(PAGE, "a-link-next-cycle"),
        until=bool,
        timeout=15,
        what="the page discovered again",
    )


def test_the_seen_ttl_defaults_to_twice_the_longest_recrawl_interval() -> None:
    assert DiscoverySettings(recrawl_after_seconds=5, recrawl_max_seconds=7).seen_ttl == 14
    assert DiscoverySettings().seen_ttl == 60 * 86_400
    settings = DiscoverySettings(recrawl_after_seconds=5, recrawl_max_seconds=5, seen_ttl_seconds=6)
    assert settings.seen_ttl == 6


def test_a_seen_ttl_not_longer_than_the_longest_recrawl_interval_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="TROVE_SEEN_TTL_SECONDS"):
        DiscoverySettings(recrawl_after_seconds=10, recrawl_max_seconds=10, seen_ttl_seconds=10)
    with pytest.raises(pydantic.ValidationError, match="TROVE_RECRAWL_MAX_SECONDS"):
        DiscoverySettings(recrawl_after_seconds=10, seen_ttl_seconds=20)


def test_the_recrawl_bounds_default_to_an_hour_and_30_days_around_the_first_interval() -> None:
    default = DiscoverySettings()
    assert (default.recrawl_min, default.recrawl_max) == (3600, 30 * 86_400)
    # A first interval outside the default bounds widens them rather than breaking a
    # deployment that set only TROVE_RECRAWL_AFTER_SECONDS.
    short = DiscoverySettings(recrawl_after_seconds=2)
    assert (short.recrawl_min, short.recrawl_max) == (2, 30 * 86_400)
    long = DiscoverySettings(recrawl_after_seconds=60 * 86_400)
    assert (long.recrawl_min, long.recrawl_max) == (3600, 60 * 86_400)


def test_recrawl_bounds_that_exclude_the_first_interval_are_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="TROVE_RECRAWL_MIN_SECONDS"):
        DiscoverySettings(recrawl_after_seconds=3600, recrawl_min_seconds=7200)
    with pytest.raises(pydantic.ValidationError, match="TROVE_RECRAWL_MAX_SECONDS"):
        DiscoverySettings(recrawl_after_seconds=3600, recrawl_max_seconds=1800)


def test_a_record_retention_shorter_than_the_recrawl_interval_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="TROVE_EVENTS_MAX_AGE_SECONDS"):
        DiscoverySettings(recrawl_after_seconds=7 * 86_400, events_max_age_seconds=86_400)
    # The longest interval is what must be kept, not the first one.
    with pytest.raises(pydantic.ValidationError, match="TROVE_EVENTS_MAX_AGE_SECONDS"):
        DiscoverySettings(recrawl_after_seconds=86_400, events_max_age_seconds=7 * 86_400)
    DiscoverySettings(
        recrawl_after_seconds=86_400,
        recrawl_max_seconds=3 * 86_400,
        events_max_age_seconds=7 * 86_400,
    )
    # Discovery's schedules all short, to see the retries' own bound.
    short: dict[str, Any] = {
        "recrawl_after_seconds": 60,
        "recrawl_max_seconds": 60,
        "poll_interval_seconds": 60,
        "poll_max_backoff_seconds": 60,
    }
    with pytest.raises(pydantic.ValidationError, match="scheduled retries"):
        RecorderSettings(retry_delay_seconds=3600, events_max_age_seconds=600, **short)
    # A site's Retry-After may put a retry off for days: the record must keep it that long.
    with pytest.raises(pydantic.ValidationError, match="scheduled retries"):
        RecorderSettings(events_max_age_seconds=2 * 86_400, **short)
    RecorderSettings(
        events_max_age_seconds=2 * 86_400,
        retry_max_delay_seconds=86_400,
        recrawl_after_seconds=3600,
        recrawl_max_seconds=86_400,
    )
    # The recorder owns the record: it refuses what would drop discovery's schedules,
    # re-crawls of 30 days by default and timeline polls paused up to six hours.
    with pytest.raises(pydantic.ValidationError, match="scheduled re-crawls"):
        RecorderSettings(events_max_age_seconds=15 * 86_400, retry_max_delay_seconds=86_400)
    with pytest.raises(pydantic.ValidationError, match="scheduled timeline polls"):
        RecorderSettings(
            events_max_age_seconds=3 * 3600,
            retry_delay_seconds=600,
            retry_max_delay_seconds=600,
            recrawl_after_seconds=600,
            recrawl_max_seconds=1800,
        )
    # It caps every retry's delay, so it may not be below the delay itself.
    with pytest.raises(pydantic.ValidationError, match="TROVE_RETRY_MAX_DELAY_SECONDS"):
        RecorderSettings(retry_max_delay_seconds=600)


async def test_discovery_refuses_to_start_on_a_record_that_would_drop_its_recrawls(
    bus: Bus,
) -> None:
    # The recorder owns TROVE_EVENTS; its retention is what counts, not discovery's setting.
    await ensure_topology(bus.js, declare(TopologyOptions(events_max_age=3600.0)), owner="recorder")
    with pytest.raises(SystemExit, match="TROVE_RECRAWL_MAX_SECONDS"):
        await check_recrawls_are_kept(bus, DiscoverySettings(recrawl_after_seconds=600))
    await check_recrawls_are_kept(
        bus,
        DiscoverySettings(
            recrawl_after_seconds=600, recrawl_max_seconds=1800, poll_max_backoff_seconds=1800
        ),
    )


async def test_discovery_refuses_to_start_on_a_record_that_would_drop_its_timeline_polls(
    bus: Bus,
) -> None:
    # A poll paused longer than the record keeps it is aged out before it fires, and
    # nothing polls that timeline again.
    await ensure_topology(bus.js, declare(TopologyOptions(events_max_age=3600.0)), owner="recorder")

    def polled(interval: float = 300, backoff: float = 6 * 3600) -> DiscoverySettings:
        return DiscoverySettings(
            recrawl_after_seconds=600,
            recrawl_max_seconds=1800,
            poll_interval_seconds=interval,
            poll_max_backoff_seconds=backoff,
        )

    with pytest.raises(SystemExit, match=r"\(21600 s, TROVE_POLL_MAX_BACKOFF_SECONDS\)"):
        await check_recrawls_are_kept(bus, polled())
    with pytest.raises(SystemExit, match=r"\(3600 s, TROVE_POLL_MAX_BACKOFF_SECONDS\)"):
        await check_recrawls_are_kept(bus, polled(interval=3600, backoff=3600))
    await check_recrawls_are_kept(bus, polled(backoff=1800))


def test_a_seen_ttl_with_little_margin_past_the_longest_interval_is_warned_of(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Allowed, as it always was; a re-crawl that comes late finds its key gone, and the
    # next link discovers the page again: a fetch and a budget count more.
    def cycle(seen_ttl: float = 0) -> DiscoverySettings:
        return DiscoverySettings(
            recrawl_after_seconds=86_400,
            recrawl_max_seconds=10 * 86_400,
            seen_ttl_seconds=seen_ttl,
        )

    with caplog.at_level(logging.WARNING, logger="trove.discovery"):
        warn_of_a_short_seen_ttl(cycle())
        warn_of_a_short_seen_ttl(cycle(seen_ttl=15 * 86_400))
        assert caplog.text == ""
        warn_of_a_short_seen_ttl(cycle(seen_ttl=12 * 86_400))
    assert "TROVE_SEEN_TTL_SECONDS (1.0368e+06) is less than 1.5 times" in caplog.text
    assert "one fetch more" in caplog.text


async def scheduled_request(bus: Bus, url: str = PAGE) -> CrawlRequested:
    msg = await bus.js.get_last_msg(EVENTS_STREAM, page_schedule_subject(url))
    pending = decode_event(msg.data or b"")
    assert isinstance(pending, CrawlRequested)
    return pending


def visited(
    *,
    content_hash: str | None,
    history: ChangeHistory | None,
    outcome: CrawlOutcome = CrawlOutcome.SUCCESS,
) -> CrawlCompleted:
    return completed(1).model_copy(
        update={"content_hash": content_hash, "history": history, "outcome": outcome}
    )


async def test_a_first_fetch_is_recrawled_after_the_first_interval_with_its_hash_remembered(
    bus: Bus,
) -> None:
    discovery = await replica(bus, recrawl_after_seconds=5 * 3600)
    event = visited(content_hash="a", history=None)
    await discovery._request_recrawl(event)

    pending = await scheduled_request(bus)
    assert pending.history == ChangeHistory(
        content_hash="a",
        visited_at=event.completed_at,
        interval=5 * 3600,
        read_whole_at=event.completed_at,
    )
    assert pending.not_before == event.completed_at + timedelta(hours=5)


async def test_an_attempt_stamped_ahead_is_recrawled_an_interval_after_its_record_time(
    bus: Bus,
) -> None:
    discovery = await replica(bus, recrawl_after_seconds=5 * 3600)
    ahead = utcnow() + timedelta(days=365)
    event = visited(content_hash="a", history=None)
    await bus.publish(event.model_copy(update={"started_at": ahead, "completed_at": ahead}))
    sub = await bus.js.pull_subscribe(CrawlCompleted.SUBJECT, stream=EVENTS_STREAM)
    try:
        (msg,) = await sub.fetch(1, timeout=5)
    finally:
        await sub.unsubscribe()
    await discovery.handle_crawl_completed(msg)

    stored = msg.metadata.timestamp
    assert stored < ahead - timedelta(days=364)
    pending = await scheduled_request(bus)
    assert pending.not_before == stored + timedelta(hours=5)
    assert pending.history is not None
    assert pending.history.visited_at == stored


async def test_the_recrawl_request_carries_the_updated_history_and_its_interval(
    bus: Bus,
) -> None:
    settings = {"recrawl_after_seconds": 4 * 3600, "recrawl_min_seconds": 60}
    discovery = await replica(bus, **settings)
    now = utcnow()
    before = ChangeHistory(
        content_hash="a",
        visited_at=now - timedelta(hours=2),
        visits=((4 * 3600.0, True), (4 * 3600.0, True), (4 * 3600.0, False)),
        interval=2 * 3600.0,
    )
    event = visited(content_hash="b", history=before).model_copy(update={"completed_at": now})
    await discovery._request_recrawl(event)

    pending = await scheduled_request(bus)
    assert pending.history is not None
    assert pending.history.visits == (*before.visits, (2 * 3600.0, True))
    assert pending.history.content_hash == "b"
    assert pending.history.visited_at == now
    # The mean time between changes the four visits show (within the bounds).
    rate = estimate_rate(pending.history.visits)
    assert rate is not None
    expected = 1 / rate
    assert 3600 < expected < 4 * 3600
    assert pending.history.interval == pytest.approx(expected)
    assert pending.not_before == now + timedelta(seconds=expected)
    assert pending.etag == event.etag


async def test_a_not_modified_recrawl_counts_as_unchanged_and_waits_longer(bus: Bus) -> None:
    discovery = await replica(bus, recrawl_after_seconds=3600, recrawl_max_seconds=86_400)
    now = utcnow()
    before = ChangeHistory(
        content_hash="a", visited_at=now - timedelta(hours=1), visits=(), interval=3600.0
    )
    event = visited(content_hash=None, history=before, outcome=CrawlOutcome.NOT_MODIFIED)
    await discovery._request_recrawl(event.model_copy(update={"completed_at": now}))

    pending = await scheduled_request(bus)
    assert pending.history is not None
    assert pending.history.visits == ((3600.0, False),)
    assert pending.history.content_hash == "a"
    # Never seen changing: the interval doubles (the growth bound), toward the maximum.
    assert pending.history.interval == 7200.0
    assert pending.not_before == now + timedelta(hours=2)


async def test_a_visit_the_operators_exclusions_refused_keeps_its_chain_and_waits_longer(
    bus: Bus,
) -> None:
    # Ended there, the page's seen key would keep it out of the crawl for a seen TTL
    # after `trove include`: its chain goes on, learning nothing from the refusal.
    discovery = await replica(bus, recrawl_after_seconds=3600, recrawl_max_seconds=86_400)
    now = utcnow()
    before = ChangeHistory(
        content_hash="a",
        visited_at=now - timedelta(hours=1),
        visits=((3600.0, True),),
        interval=3600.0,
    )
    refused = visited(content_hash=None, history=before, outcome=CrawlOutcome.REJECTED)
    refused = refused.model_copy(update={"completed_at": now, "excluded": True, "etag": None})
    await handle(discovery, bus, refused)

    pending = await scheduled_request(bus)
    assert pending.history is not None
    assert (pending.history.visits, pending.history.content_hash) == (before.visits, "a")
    assert pending.history.interval == 7200.0  # a refusal that lasts is asked less often
    assert pending.not_before == now + timedelta(hours=2)
    assert (pending.etag, pending.url) == (None, PAGE)


async def test_a_page_fetched_before_that_robots_txt_now_refuses_keeps_its_chain(
    bus: Bus,
) -> None:
    discovery = await replica(bus, recrawl_after_seconds=3600, recrawl_max_seconds=86_400)
    before = ChangeHistory(content_hash="a", visited_at=utcnow(), interval=43_200.0)
    blocked = visited(content_hash=None, history=before, outcome=CrawlOutcome.BLOCKED_ROBOTS)
    await handle(discovery, bus, blocked)

    pending = await scheduled_request(bus)
    assert pending.history is not None
    assert pending.history.interval == 86_400.0  # grown, up to the longest interval


@pytest.mark.parametrize(
    ("outcome", "excluded", "history"),
    [
        # A link robots.txt refused before its page was ever fetched: forgotten in time.
        (CrawlOutcome.BLOCKED_ROBOTS, False, None),
        # Rejected for what the page is (not a fetchable URL, a type not parsed).
        (CrawlOutcome.REJECTED, False, ChangeHistory(content_hash="a", visited_at=utcnow())),
    ],
)
async def test_a_refusal_no_one_may_take_back_ends_the_chain(
    bus: Bus, outcome: CrawlOutcome, excluded: bool, history: ChangeHistory | None
) -> None:
    discovery = await replica(bus)
    event = visited(content_hash=None, history=history, outcome=outcome)
    await handle(discovery, bus, event.model_copy(update={"excluded": excluded}))

    assert await pending_request(bus, PAGE) is None


async def test_a_page_answering_304_is_read_whole_once_a_seen_ttl_has_passed(
    bus: Bus,
) -> None:
    # A day's interval, a seen TTL of 60 days: read whole at least every 60.
    discovery = await replica(bus, recrawl_after_seconds=86_400, seen_ttl_seconds=60 * 86_400)
    now = utcnow()
    day = timedelta(days=1)
    before = ChangeHistory(
        content_hash="a", visited_at=now - day, interval=86_400.0, read_whole_at=now - 58 * day
    )
    event = visited(content_hash=None, history=before, outcome=CrawlOutcome.NOT_MODIFIED)
    await discovery._request_recrawl(event.model_copy(update={"completed_at": now}))
    # Due in two days (the interval doubles), 60 days after the page was last read whole.
    pending = await scheduled_request(bus)
    assert pending.not_before == now + 2 * day
    assert (pending.etag, pending.last_modified) == (None, None)
    assert pending.history is not None
    assert pending.history.read_whole_at == now - 58 * day

    # Answered with its body, it is asked with its validators again, for another 60 days.
    read = visited(content_hash="a", history=pending.history)
    await discovery._request_recrawl(read.model_copy(update={"completed_at": now + 2 * day}))
    pending = await scheduled_request(bus)
    assert pending.etag == read.etag
    assert pending.history is not None
    assert pending.history.read_whole_at == now + 2 * day


async def test_a_chain_planned_before_whole_reads_were_kept_counts_them_from_now(
    bus: Bus,
) -> None:
    # Unknown is not "long ago": every page of every site read whole in the cycle after
    # an upgrade would be a burst of bodies the validators were there to spare.
    discovery = await replica(bus, recrawl_after_seconds=86_400, seen_ttl_seconds=60 * 86_400)
    now = utcnow()
    before = ChangeHistory(content_hash="a", visited_at=now - timedelta(days=1), interval=86_400.0)
    event = visited(content_hash=None, history=before, outcome=CrawlOutcome.NOT_MODIFIED)
    await discovery._request_recrawl(event.model_copy(update={"completed_at": now}))
    pending = await scheduled_request(bus)
    assert pending.etag == event.etag
    assert pending.history is not None
    assert pending.history.read_whole_at == now


#: A month in seconds: a page is re-crawled every RECRAWL seconds, and its seen key lives
#: SEEN_TTL seconds after the request that last wrote it.
RECRAWL = 1.0
SEEN_TTL = 8.0


def honouring_validators(exchange: Exchange, etag: str, body: str) -> None:
    """Answers 304 to its own ETag, as a static site does: a 304 carries no links."""
    if exchange.headers.get("If-None-Match") == etag:
        exchange.send(304, headers={"ETag": etag})
    else:
        exchange.send(200, body.encode(), {"ETag": etag})


async def test_a_page_whose_chain_ended_is_found_again_by_a_page_that_answers_304(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    # The home page links to the article; the article answers its re-crawl with a 403
    # once (a day of a WAF's), so its chain ends and its seen key expires. The home page
    # answers every conditional request with a 304, which shows no links: only a read of
    # it whole, which comes at least every seen TTL, finds the article again.
    env = cycle_env(RECRAWL, TROVE_SEEN_TTL_SECONDS=str(SEEN_TTL), TROVE_HOST_PAUSE_SECONDS="0.5")
    with LocalServer("127.0.0.1") as site:
        home = '<html><head><title>Home</title></head><body><a href="/article">A</a></body>'
        article = "<html><head><title>Article</title></head><body>Words.</body></html>"

        def article_route(exchange: Exchange) -> None:
            if len(site.requests_to("/article")) == 2:
                exchange.send(403, b"forbidden")
            else:
                honouring_validators(exchange, '"article"', article)

        site.routes["/"] = lambda exchange: honouring_validators(exchange, '"home"', home)
        site.routes["/article"] = article_route
        async with services(stack, state_dir, env) as local:
            await bus.nc.publish(SEEDS_SUBJECT, site.url("/").encode())

            async def article_requests() -> list[Seen]:
                local.check_alive()
                return site.requests_to("/article")

            asked = await eventually(
                article_requests,
                until=lambda seen: len(seen) >= 3,
                timeout=3 * SEEN_TTL + 10 * RECRAWL,
                interval=0.5,
                what="the article asked for again after its chain ended",
            )
        home_requests = site.requests_to("/")

    # Found again by a link, not by a chain: read whole, within the bound (its key
    # expires a seen TTL after its last re-crawl was planned, and the home page is read
    # whole at most a seen TTL and an interval after the time before).
    assert "if-none-match" not in asked[2].headers
    assert asked[2].at - asked[0].at < SEEN_TTL * 2 + 4 * RECRAWL
    # The home page kept its validators in between: most of its visits were 304s.
    whole = [seen.at for seen in home_requests if "if-none-match" not in seen.headers]
    assert len(home_requests) - len(whole) > len(whole)
    gaps = [b - a for a, b in itertools.pairwise(whole)]
    assert gaps
    assert max(gaps) < SEEN_TTL + 3 * RECRAWL
