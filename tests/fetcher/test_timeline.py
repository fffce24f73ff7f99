"""Polling a followed timeline against the sandbox's fediverse instance over real HTTP.

The instance's own request log (its ``Witness``) is the evidence for the cursor, the
bounds and the gap; its ground truth (``timeline``, ``may_share``, ``shared_links``)
says which posts and links a polite follower may take.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import nats.errors
import pytest

from tests.conftest import eventually
from tests.fetcher._dns import dns_server
from trove_discovery.follows import TimelineFollow
from trove_discovery.shares import next_poll, poll_delay
from trove_fetcher import fetcher as fetcher_module
from trove_fetcher import timeline as timeline_module
from trove_fetcher.errors import GateDeferred, HopGateFailed, ResolverAway
from trove_fetcher.http import FetchLimits
from trove_fetcher.nodeinfo import document_link
from trove_fetcher.timeline import (
    BACK_FAILURES,
    DEFAULT_RATE_WINDOW,
    MAX_RETRY_AFTER,
    RENUMBERING_CHECK_EVERY,
    SOFTWARE_CHECK_EVERY,
    TimelinePoller,
    _made_after,
    _numbered_below,
    _Progress,
    id_key,
    link_relation,
    lookback_floor,
    rate_limit_wait,
    read_entry,
    retry_after_of,
    shared_links,
)
from trove_fetcher.transport import build_client
from trove_sandbox.fediverse import (
    REMOTE_HOST,
    FediverseInstance,
    Misbehaviour,
    RunningInstance,
    Status,
    serve_instance,
)
from trove_schema.events import (
    CrawlOutcome,
    SharedPost,
    TimelinePolled,
    TimelinePollRequested,
    account_key,
)
from trove_schema.policy import HostPolicy, LearningConfig, observe
from trove_schema.settings import DiscoverySettings, FetcherSettings
from trove_schema.urls import canonicalize_or_none

GAP = 0.12


class GapGate:
    """The fetcher's lease in miniature: one request at a time, ``gap`` seconds apart
    (from the end of a response), deferring instead after ``defer_after`` requests."""

    def __init__(self, gap: float = GAP, *, defer_after: int | None = None) -> None:
        self.gap = gap
        self.defer_after = defer_after
        self.free_at = 0.0
        self.entered = 0
        #: How far away the slot it answered with was, once it did.
        self.deferred_for: float | None = None

    @contextlib.asynccontextmanager
    async def __call__(self, url: str) -> AsyncIterator[None]:
        if self.defer_after is not None and self.entered >= self.defer_after:
            self.deferred_for = 45.0
            raise GateDeferred(self.deferred_for)
        wait = self.free_at - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)  # the gate's own politeness wait, the behaviour under test
        self.entered += 1
        try:
            yield
        finally:
            self.free_at = time.monotonic() + self.gap


async def allow_all(url: str) -> bool:
    return True


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    settings = FetcherSettings(
        allowed_networks=("127.0.0.0/8",), resolve=("social.trove.test=127.0.0.30",)
    )
    async with build_client(settings) as built:
        yield built


@contextlib.asynccontextmanager
async def served(instance: FediverseInstance) -> AsyncIterator[RunningInstance]:
    async with serve_instance(instance, port=0) as social:
        yield social


def poller(
    client: httpx.AsyncClient,
    gate: GapGate | None = None,
    *,
    robots_allows: Callable[[str], Awaitable[bool]] = allow_all,
    limits: FetchLimits | None = None,
    **options: Any,
) -> TimelinePoller:
    return TimelinePoller(
        client=client,
        gate=gate or GapGate(),
        limits=limits or FetchLimits(total_timeout=10.0),
        robots_allows=robots_allows,
        **options,
    )


def request(
    social: RunningInstance,
    *,
    cursor: str | None = None,
    cursor_at: datetime | None = None,
    api: str | None = None,
    timeline: str = "local",
    after: TimelinePolled | None = None,
    software: str | None = None,
    backfill: int | None = None,
) -> TimelinePollRequested:
    """The first request of a chain, or (``after``) the one a poll's answer leads to.
    ``cursor_at``: when the cursor was read (None: a chain that does not know);
    ``software``: what an earlier poll's NodeInfo named (it decides the rules for ids);
    ``backfill``: the follow's."""
    if after is not None:
        return TimelinePollRequested(
            instance=after.instance,
            domain=after.domain,
            timeline=after.timeline,
            follow_id=after.follow_id,
            cursor=after.cursor_after,
            cursor_at=after.cursor_after_at,
            recent=after.recent_after,
            back_from=after.back_from,
            back_left=after.back_left,
            back_failures=after.back_failures,
            api=after.api,
            software=after.software,
            software_version=after.software_version,
            poll=after.poll + 1,
        )
    return TimelinePollRequested(
        instance=social.base_url,
        domain=social.host,
        timeline=timeline,
        follow_id="follow-1",
        cursor=cursor,
        cursor_at=cursor_at,
        api=api,
        software=software,
        backfill=backfill,
    )


async def polled_on(
    polls: TimelinePoller, social: RunningInstance, events: list[TimelinePolled], *, most: int
) -> list[TimelinePolled]:
    """``events`` and the chain's polls after them while one says ``more``, ``most`` in all."""
    while events[-1].more and len(events) < most:
        events.append(await polls.poll(request(social, after=events[-1])))
    return events


#: The follow's backfill in the backfill's tests: more than a first poll's pages hold.
BACKFILL = 19


@contextlib.asynccontextmanager
async def first_poll_of_a_backfill(
    client: httpx.AsyncClient,
    instance: FediverseInstance,
    gate: GapGate | None = None,
    *,
    max_pages: int = 2,
    timeline: str = "local",
) -> AsyncIterator[tuple[RunningInstance, TimelinePoller, TimelinePolled]]:
    """``instance`` served, a poller of ``max_pages`` pages of four posts, and the first
    poll of a follow whose backfill (``BACKFILL``) those pages do not hold."""
    async with served(instance) as social:
        polls = poller(client, gate, max_pages=max_pages, page_limit=4)
        asked = request(social, api=social.base_url, timeline=timeline, backfill=BACKFILL)
        yield social, polls, await polls.poll(asked)


def api_queries(social: RunningInstance) -> list[dict[str, list[str]]]:
    """The query of every timeline request the instance saw, in order."""
    return [
        parse_qs(urlsplit(path).query)
        for path in social.witness.paths(social.host)
        if path.startswith("/api/v1/timelines/")
    ]


def canonical_links(instance: FediverseInstance, status: Status) -> set[str]:
    found = {canonicalize_or_none(url) for url in instance.shared_links(status)}
    return {url for url in found if url is not None}


def uris(event: TimelinePolled) -> list[str]:
    return [post.uri for post in event.posts]


def public_local_post(instance: FediverseInstance, account: str = "ada") -> Status:
    return instance.add_post(account, visibility="public")


async def checked_once_deleted(
    instance: FediverseInstance,
    social: RunningInstance,
    polls: TimelinePoller,
    first: TimelinePollRequested,
    cursor: Status,
    *,
    clock_ahead: float | None = None,
) -> TimelinePolled:
    """The renumbering check's poll (one in ``RENUMBERING_CHECK_EVERY``) after ``first``'s,
    whose cursor is ``cursor``, deleted since; ``clock_ahead``: the instance's clock then."""
    read = await polls.poll(first)
    assert read.cursor_after == cursor.sid, read.error_message
    instance.delete_post(cursor)
    if clock_ahead is not None:
        instance.clock_ahead = clock_ahead
    chain = request(social, after=read)
    return await polls.poll(chain.model_copy(update={"poll": RENUMBERING_CHECK_EVERY}))


def kept_its_cursor(check: TimelinePolled, cursor: Status) -> bool:
    """The check read nothing and started nothing again: the cursor where it was."""
    assert check.outcome is CrawlOutcome.SUCCESS, check.error_message
    return (check.posts, check.cursor_after, check.error_message) == ((), cursor.sid, None)


def started_again(
    instance: FediverseInstance, check: TimelinePolled, why: str, posts: Sequence[Status]
) -> bool:
    """The check started again from the newest posts, ``posts``, saying ``why``."""
    assert check.outcome is CrawlOutcome.SUCCESS, check.error_message
    assert why in (check.error_message or ""), check.error_message
    return sorted(uris(check)) == sorted(instance.status_uri(s) for s in posts)


def read_between(event: TimelinePolled, start: float, end: float) -> bool:
    """``event``'s cursor was read between ``start`` and ``end`` (epoch seconds, on the
    instance's clock; its ``Date`` says whole seconds)."""
    assert event.cursor_after_at is not None
    return int(start) <= event.cursor_after_at.timestamp() <= end


async def test_first_poll_finds_the_api_through_nodeinfo_and_reads_back_the_backfill(
    client: httpx.AsyncClient,
) -> None:
    instance = FediverseInstance.generate(posts=60, seed=7)
    async with served(instance) as social:
        event = await poller(client, max_pages=3, page_limit=5).poll(request(social))

        assert event.outcome is CrawlOutcome.SUCCESS, event.error_message
        assert (event.software, event.software_version) == ("mastodon", "4.3.0")
        assert event.api == social.base_url
        paths = social.witness.paths(social.host)
        assert paths[:2] == ["/.well-known/nodeinfo", "/nodeinfo/2.1"]
        assert len(paths) == 2 + 3 == event.requests
        timeline = instance.timeline(local=True)
        read_back = timeline[:15]
        kept = [s for s in read_back if instance.may_share(s)]
        assert kept
        assert len(kept) < len(read_back)
        assert uris(event) == [instance.status_uri(s) for s in kept]
        assert event.skipped == len(read_back) - len(kept)
        assert event.cursor_before is None
        assert event.cursor_after == timeline[0].sid
        assert not event.more
        by_uri = {instance.status_uri(s): s for s in kept}
        for post in event.posts:
            status = by_uri[post.uri]
            assert set(post.links) == canonical_links(instance, status)
            assert post.url == instance.status_url(status)
            assert post.account == f"{status.account}@{social.host}"
            assert post.language == status.language
            assert post.shared_at == status.created_at
        assert (social.witness.min_gap(social.host) or 0.0) >= GAP


@pytest.mark.parametrize("timeline", ["local", "public"])
async def test_a_backfill_larger_than_a_polls_pages_is_read_by_the_polls_after_it(
    client: httpx.AsyncClient, timeline: str
) -> None:
    # Two pages of four a poll, a backfill of 19: the first poll reads 8 of them, and
    # the rest was never read. The polls after read the new posts first, then on back.
    instance = FediverseInstance.generate(posts=40, seed=11)
    before = instance.timeline(local=timeline == "local")[:BACKFILL]
    async with first_poll_of_a_backfill(client, instance, timeline=timeline) as (
        social,
        polls,
        first,
    ):
        added = [public_local_post(instance) for _ in range(3)]
        events = await polled_on(polls, social, [first], most=10)

    assert all(e.outcome is CrawlOutcome.SUCCESS for e in events), events[-1].error_message
    assert first.cursor_after == before[0].sid
    assert (first.back_from, first.back_left) == (before[7].sid, BACKFILL - 8)
    assert first.more
    assert first.error_message == "11 posts of the backfill left to read back"
    assert events[-1].error_message is None
    read = [uri for event in events for uri in uris(event)]
    assert len(read) == len(set(read))
    wanted = [s for s in [*before, *added] if instance.may_share(s)]
    assert set(read) == {instance.status_uri(s) for s in wanted}
    # The new posts before the rest of the backfill.
    assert set(uris(events[1])) >= {instance.status_uri(s) for s in added if instance.may_share(s)}
    last = events[-1]
    assert (last.back_from, last.back_left, last.more) == (None, 0, False)
    assert last.cursor_after == added[-1].sid
    assert sum(e.skipped for e in events) == len(before) + len(added) - len(wanted)
    assert len(events) == 4  # 8 posts, then 3 new and 4, then 4, then 3


async def test_a_post_of_the_backfill_the_lookback_reaches_is_left_to_the_back_read(
    client: httpx.AsyncClient,
) -> None:
    # The first poll reads one page; the next one's lookback reaches below it, and its
    # new posts take its pages: the post it took there, no longer in ``recent`` once the
    # cursor moved, was taken again when the back read came to it.
    instance = FediverseInstance.generate(posts=40, seed=11)
    async with served(instance) as social:
        before = instance.timeline(local=False)
        lookback = (before[0].created_at - before[4].created_at).total_seconds() + 60
        asked = request(social, api=social.base_url, timeline="public", backfill=BACKFILL)
        first = await poller(
            client, GapGate(defer_after=1), max_pages=2, page_limit=4, lookback=lookback
        ).poll(asked)
        instance.add_posts(12)  # a busy timeline: the next poll does not catch up
        polls = poller(client, max_pages=2, page_limit=4, lookback=lookback)
        events = await polled_on(polls, social, [first], most=12)
        now = instance.timeline(local=False)

    assert first.back_from == before[3].sid
    assert not events[-1].more
    assert (events[-1].back_from, events[-1].back_left) == (None, 0)
    read = [uri for event in events for uri in uris(event)]
    assert len(read) == len(set(read))
    assert instance.status_uri(before[4]) in read
    # The 19 of the backfill and every post since, each once.
    wanted = now[: now.index(before[18]) + 1]
    assert set(read) == {instance.status_uri(s) for s in wanted if instance.may_share(s)}
    assert sum(e.skipped for e in events) + len(read) == len(wanted)


@pytest.mark.parametrize(
    ("mode", "outcome", "status", "judged"),
    [
        ("old-posts-429", CrawlOutcome.BLOCKED_4XX, 429, "rate_limited"),
        ("old-posts-502", CrawlOutcome.BLOCKED_5XX, 502, "server_error"),
        ("old-posts-cut", CrawlOutcome.FAILED, None, "network_error"),
    ],
)
@pytest.mark.parametrize("new_posts", [False, True])
async def test_old_pages_refused_in_a_row_end_the_backfill_at_the_last_refusal_allowed(
    client: httpx.AsyncClient,
    mode: Misbehaviour,
    outcome: CrawlOutcome,
    status: int | None,
    judged: str,
    new_posts: bool,
) -> None:
    # A wait, or a failure to answer (a 5xx, a connection cut), may be gone by the next
    # poll; an instance that refuses its old pages so at every poll would have each
    # spend a request on them, and the host a pause, for good. Each poll keeps the new
    # posts it read, and says how many refusals it counts.
    instance = FediverseInstance.generate(posts=40, seed=11)
    added: list[Status] = []
    async with first_poll_of_a_backfill(client, instance) as (social, polls, first):
        instance.misbehave(mode)
        events = [first]
        while len(events) <= BACK_FAILURES + 1:
            if new_posts:
                added.append(public_local_post(instance))
            events.append(await polls.poll(request(social, after=events[-1])))
        queries = api_queries(social)

    last = BACK_FAILURES
    refused, ended, after = events[1:last], events[last], events[last + 1]
    polled = CrawlOutcome.SUCCESS if new_posts else outcome
    assert [(e.outcome, e.status_code) for e in refused] == [(polled, status)] * (last - 1)
    assert [(e.back_from, e.back_left, e.more) for e in refused] == [
        (first.back_from, BACKFILL - 8, new_posts)
    ] * (last - 1)
    assert [e.back_failures for e in refused] == list(range(1, last))
    assert (ended.outcome, ended.stopped_by, ended.status_code) == (
        CrawlOutcome.SUCCESS,
        outcome,
        status,
    )
    assert (ended.back_from, ended.back_left, ended.back_failures, ended.more) == (
        None,
        0,
        0,
        False,
    )
    assert all(f"{e.back_failures} of {last} in a row" in (e.error_message or "") for e in refused)
    assert f"{last} of its pages refused in a row" in (ended.error_message or "")
    observation = fetcher_module._poll_observation(ended)
    assert observation is not None
    assert observation.error_type == judged
    # The next poll reads on from the cursor alone: one old page asked for each refusal.
    assert (after.outcome, after.requests) == (CrawlOutcome.SUCCESS, 1)
    old_pages = [q for q in queries if "max_id" in q and "since_id" not in q]
    assert len(old_pages) == 1 + last
    read = [uri for event in events for uri in uris(event)]
    assert len(read) == len(set(read))
    assert set(read) >= {instance.status_uri(s) for s in added if instance.may_share(s)}


async def test_old_pages_read_before_a_deferral_end_the_count_of_refusals(
    client: httpx.AsyncClient,
) -> None:
    # Read on back, then deferred for the host's slot: the pages read end the run of
    # refusals, or the next one alone would end the backfill as the last allowed.
    instance = FediverseInstance.generate(posts=40, seed=11)
    async with first_poll_of_a_backfill(client, instance) as (social, _, first):
        counted = request(social, after=first).model_copy(
            update={"back_failures": BACK_FAILURES - 1}
        )
        # The new posts' page, an old page, then the host's slot too far off.
        gate = GapGate(defer_after=2)
        deferred = await poller(client, gate, max_pages=3, page_limit=4).poll(counted)

    assert gate.deferred_for is not None
    assert deferred.outcome is CrawlOutcome.SUCCESS, deferred.error_message
    assert deferred.back_from is not None
    assert first.back_from is not None
    assert id_key(deferred.back_from) < id_key(first.back_from)
    assert (deferred.back_left, deferred.back_failures, deferred.more) == (BACKFILL - 12, 0, True)


async def test_an_error_of_its_own_reading_the_backfill_ends_it_not_the_polls(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fault of the poller's own on an old page would fail every poll of the follow,
    # each blaming the host: the backfill ends there instead, with a note.
    instance = FediverseInstance.generate(posts=40, seed=11)
    async with first_poll_of_a_backfill(client, instance) as (social, polls, first):

        def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("a reader that cannot read")

        monkeypatch.setattr(timeline_module, "read_entry", broken)
        second = await polls.poll(request(social, after=first))

    assert first.back_left == BACKFILL - 8
    assert (second.outcome, second.stopped_by) == (CrawlOutcome.SUCCESS, None)
    assert (second.back_from, second.back_left, second.more) == (None, 0, False)
    assert "the rest of the backfill left unread: unexpected error" in (second.error_message or "")
    assert fetcher_module._poll_observation(second) is None


async def test_a_wait_asked_on_an_old_page_keeps_the_rest_of_the_backfill_for_after_it(
    client: httpx.AsyncClient,
) -> None:
    # A 429 on a page of the backfill says "not now", not "never": the chain waits it
    # out, then reads the rest, each post once. Without new posts, the 429 is the poll's.
    instance = FediverseInstance.generate(posts=40, seed=11)
    before = instance.timeline(local=True)[:BACKFILL]
    async with first_poll_of_a_backfill(client, instance) as (social, polls, first):
        instance.misbehave("old-posts-429")
        added = public_local_post(instance)
        told = await polls.poll(request(social, after=first))
        quiet = await polls.poll(request(social, after=told))
        instance.misbehave(None)
        events = [first, told, quiet]
        while len(events) < 10 and (events[-1] is quiet or events[-1].more):
            events.append(await polls.poll(request(social, after=events[-1])))

    assert (first.back_from, first.back_left) == (before[7].sid, BACKFILL - 8)
    assert told.outcome is CrawlOutcome.SUCCESS, told.error_message
    assert (told.stopped_by, told.status_code, told.retry_after) == (
        CrawlOutcome.BLOCKED_4XX,
        429,
        60.0,
    )
    assert (told.back_from, told.back_left, told.more) == (before[7].sid, BACKFILL - 8, True)
    settings = DiscoverySettings(allowed_networks=())
    assert poll_delay(told, 0, settings) == 60.0
    assert (quiet.outcome, quiet.status_code, quiet.posts) == (CrawlOutcome.BLOCKED_4XX, 429, ())
    assert (quiet.back_from, quiet.back_left) == (before[7].sid, BACKFILL - 8)
    last = events[-1]
    assert last.outcome is CrawlOutcome.SUCCESS, last.error_message
    assert (last.back_from, last.back_left, last.more) == (None, 0, False)
    read = [uri for event in events for uri in uris(event)]
    assert len(read) == len(set(read))
    wanted = [s for s in [*before, added] if instance.may_share(s)]
    assert set(read) == {instance.status_uri(s) for s in wanted}


async def test_a_wait_asked_after_an_old_page_was_read_keeps_that_page(
    client: httpx.AsyncClient,
) -> None:
    # A poll with no new posts reads one page of the backfill, and the next is refused
    # with a 429: the page read is the poll's progress, kept, and the rest read after.
    instance = FediverseInstance.generate(posts=40, seed=11)
    refuse = lambda: instance.misbehave("old-posts-429")  # noqa: E731
    # The first poll's three pages; the second's new posts, an old page, a refused one.
    gate = GateThatActs(nth=3 + 3, act=refuse)
    before = instance.timeline(local=True)[:BACKFILL]
    async with first_poll_of_a_backfill(client, instance, gate, max_pages=3) as (
        social,
        polls,
        first,
    ):
        second = await polls.poll(request(social, after=first))
        instance.misbehave(None)
        events = await polled_on(polls, social, [first, second], most=10)

    assert (first.back_from, first.back_left) == (before[11].sid, BACKFILL - 12)
    assert second.outcome is CrawlOutcome.SUCCESS, second.error_message
    assert (second.stopped_by, second.status_code) == (CrawlOutcome.BLOCKED_4XX, 429)
    assert "in a row" not in (second.error_message or "")  # nothing refused in a row
    page = [s for s in before[12:16] if instance.may_share(s)]
    assert uris(second) == [instance.status_uri(s) for s in page]
    assert (second.back_from, second.back_left, second.back_failures, second.more) == (
        before[15].sid,
        BACKFILL - 16,
        0,
        True,
    )
    read = [uri for event in events for uri in uris(event)]
    assert len(read) == len(set(read))
    assert set(read) == {instance.status_uri(s) for s in before if instance.may_share(s)}


@pytest.mark.parametrize(
    ("mode", "outcome", "status", "challenged"),
    [
        ("old-posts-challenge", CrawlOutcome.BLOCKED_4XX, 429, True),
        ("old-posts-loop", CrawlOutcome.FAILED, None, False),
    ],
)
async def test_an_old_page_refused_for_what_will_not_pass_ends_the_backfill_at_once(
    client: httpx.AsyncClient,
    mode: Misbehaviour,
    outcome: CrawlOutcome,
    status: int | None,
    challenged: bool,
) -> None:
    # A challenge, even one sent as a 429, names no wait to outlast: the host's defence,
    # not its load. A redirect loop is the same at every poll.
    instance = FediverseInstance.generate(posts=40, seed=11)
    async with first_poll_of_a_backfill(client, instance) as (social, polls, first):
        instance.misbehave(mode)
        second = await polls.poll(request(social, after=first))

    assert first.back_left == BACKFILL - 8
    assert (second.outcome, second.stopped_by) == (CrawlOutcome.SUCCESS, outcome)
    assert (second.status_code, second.challenged) == (status, challenged)
    assert (second.back_from, second.back_left, second.more) == (None, 0, False)
    assert "the rest of the backfill left unread" in (second.error_message or "")


async def test_an_answer_for_older_posts_dated_ahead_ends_the_backfill(
    client: httpx.AsyncClient,
) -> None:
    # Asked for the posts older than one it trusted, the instance answers with posts
    # dated a day ahead: no page past them holds the backfill. Followed, they left it
    # where it was, and every poll came back at once to ask for it again.
    instance = FediverseInstance.generate(posts=40, seed=11)
    async with first_poll_of_a_backfill(client, instance) as (social, polls, first):
        for n in range(4):
            instance.add_post_numbered(a_day_ahead() + n)
        instance.misbehave("endless")  # a query of max_id alone: the newest page
        second = await polls.poll(request(social, after=first))

    assert first.back_left == BACKFILL - 8
    assert second.outcome is CrawlOutcome.SUCCESS, second.error_message
    assert (second.back_from, second.back_left, second.more) == (None, 0, False)
    # Each note the poll told, the forward read's too.
    assert (second.error_message or "").split("; ")[:2] == [
        "a page of posts dated ahead, left for their time",
        "the backfill's older posts answered with posts dated ahead",
    ]


class GateThatActs(GapGate):
    """A gate that calls ``act`` before the ``nth`` timeline request it lets through."""

    def __init__(self, *, nth: int, act: Callable[[], object]) -> None:
        super().__init__()
        self.nth, self.act = nth, act
        self.pages = 0

    @contextlib.asynccontextmanager
    async def __call__(self, url: str) -> AsyncIterator[None]:
        if "/api/v1/timelines/" in url:
            self.pages += 1
            if self.pages == self.nth:
                self.act()
        async with super().__call__(url):
            yield


async def test_a_first_poll_answered_with_newer_posts_for_older_ones_reads_on_below_the_oldest(
    client: httpx.AsyncClient,
) -> None:
    # Asked for the posts before its first page, the instance answers with posts made
    # since: the backfill reads on below the oldest post read, not theirs, which would
    # take the first page's posts again.
    instance = FediverseInstance.generate(posts=40, seed=11)
    instance.misbehave("endless")  # a query of max_id alone: the newest page
    top = instance.timeline(local=True)[:4]
    added: list[Status] = []
    publish = lambda: added.extend(public_local_post(instance) for _ in range(4))  # noqa: E731
    gate = GateThatActs(nth=2, act=publish)
    async with first_poll_of_a_backfill(client, instance, gate) as (social, polls, first):
        instance.misbehave(None)
        events = await polled_on(polls, social, [first], most=10)

    assert first.outcome is CrawlOutcome.SUCCESS, first.error_message
    assert set(uris(first)) >= {instance.status_uri(s) for s in added}
    assert first.back_from == top[-1].sid
    read = [uri for event in events for uri in uris(event)]
    assert len(read) == len(set(read))
    assert not events[-1].more
    # The newer posts took 4 of the backfill; the rest are the newest before them.
    timeline = instance.timeline(local=True)
    wanted = [*added, *timeline[len(added) : BACKFILL]]
    assert set(read) == {instance.status_uri(s) for s in wanted if instance.may_share(s)}


async def test_a_timeline_empty_when_followed_without_backfill_gives_its_first_post(
    client: httpx.AsyncClient,
) -> None:
    """Backfill 0 leaves out what was there before the follow, and nothing after it:
    an empty timeline starts no cursor, so its next poll is a first poll again."""
    instance = FediverseInstance.generate(posts=0, seed=3)
    followed = datetime.now(UTC)
    follow = TimelineFollow(follow_id="follow-1", followed_at=followed, backfill=0)
    async with served(instance) as social:
        polls = poller(client, max_pages=2, page_limit=5)
        first = request(social).model_copy(update={"backfill": 0})
        empty = await polls.poll(first)
        assert empty.outcome is CrawlOutcome.SUCCESS, empty.error_message
        assert (empty.posts, empty.cursor_after) == ((), None)
        after = follow.model_copy(update={"poll": 1, "polled_id": empty.id})
        then, _ = next_poll(empty, after, DiscoverySettings(allowed_networks=()))
        status = public_local_post(instance)
        second = await polls.poll(then)
        assert uris(second) == [instance.status_uri(status)]
        assert second.cursor_after == status.sid


async def test_an_api_answer_is_parsed_off_the_event_loop(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 2 MiB of "[{},{},...]" held the loop ~35 ms, every other fetch's lease waiting.
    parsed_in: list[str] = []
    loads = json.loads

    def recorded(body: bytes) -> Any:
        parsed_in.append(threading.current_thread().name)
        return loads(body)

    monkeypatch.setattr(json, "loads", recorded)  # the module the fetcher reads it from
    instance = FediverseInstance.generate(posts=3, seed=5)
    async with served(instance) as social:
        polled = await poller(client, max_pages=1, page_limit=5).poll(request(social))
    assert polled.outcome is CrawlOutcome.SUCCESS, polled.error_message
    assert parsed_in
    assert threading.main_thread().name not in parsed_in


@pytest.mark.parametrize("timeline", ["public", "tag:smallweb"])
async def test_a_post_from_elsewhere_that_arrives_late_is_read_once(
    client: httpx.AsyncClient, timeline: str
) -> None:
    """Mastodon numbers another instance's post by the time it was published, not by
    its arrival: one that arrives after a newer post was read lands behind the cursor.
    The poll reads a lookback behind it again, and leaves alone what it read there."""
    instance = FediverseInstance.generate(posts=12, seed=11)
    tag = timeline.removeprefix("tag:") if timeline.startswith("tag:") else None
    for _ in range(3):
        instance.add_post("ada", visibility="public", tags=[tag] if tag else None)
    async with served(instance) as social:
        polls = poller(client, max_pages=4, page_limit=5, lookback=3600.0)
        first = await polls.poll(request(social, timeline=timeline))
        assert first.outcome is CrawlOutcome.SUCCESS, first.error_message
        assert first.posts
        remote = next(a.acct for a in instance.accounts if not a.local)
        tags = [tag] if tag else None
        late = instance.add_late_post(remote, published_before=timedelta(minutes=20), tags=tags)
        newer = instance.add_post("ada", visibility="public", tags=tags)
        too_late = instance.add_late_post(remote, published_before=timedelta(hours=3), tags=tags)

        second = await polls.poll(request(social, after=first))
        assert second.outcome is CrawlOutcome.SUCCESS, second.error_message
        assert set(uris(second)) == {instance.status_uri(late), instance.status_uri(newer)}
        assert second.cursor_after == newer.sid  # never moved back by the late post
        third = await polls.poll(request(social, after=second))
        assert uris(third) == []  # what the lookback read once is not read again
        assert third.cursor_after == newer.sid
        # A post later than the lookback is not found: the bound is the setting.
        assert instance.status_uri(too_late) not in set(uris(first) + uris(second))


async def test_late_posts_found_before_the_new_ones_fail_are_no_progress(
    client: httpx.AsyncClient,
) -> None:
    # An overloaded instance: the lookback behind the cursor answers, the new posts 502.
    # That poll failed (backed off as one), and the late post is found once it answers.
    instance = FediverseInstance.generate(posts=12, seed=11)
    async with served(instance) as social:
        polls = poller(client, max_pages=4, page_limit=5, lookback=3600.0)
        first = await polls.poll(request(social, timeline="public"))
        assert first.outcome is CrawlOutcome.SUCCESS, first.error_message
        remote = next(a.acct for a in instance.accounts if not a.local)
        late = instance.add_late_post(remote, published_before=timedelta(minutes=20))
        instance.misbehave("new-posts-502")

        second = await polls.poll(request(social, after=first))

        assert second.outcome is CrawlOutcome.BLOCKED_5XX
        assert (second.status_code, second.posts, second.more) == (502, (), False)
        assert second.cursor_after == first.cursor_after
        instance.misbehave(None)
        third = await polls.poll(request(social, after=second))
        assert third.outcome is CrawlOutcome.SUCCESS, third.error_message
        assert uris(third) == [instance.status_uri(late)]


async def test_a_lookback_of_nothing_readable_leaves_the_new_posts_to_be_read(
    client: httpx.AsyncClient,
) -> None:
    # Behind the cursor only posts that cannot be read ("uri": null): the page there
    # comes back the same every poll until the cursor moves on, so it must not stop the
    # poll that moves it.
    instance = FediverseInstance.generate(posts=12, seed=11)
    lookback = 3600.0
    newest = instance.timeline(local=False)[0]
    floor = lookback_floor("public", newest.sid, lookback)
    assert floor is not None
    behind = [s for s in instance.timeline(local=False) if floor < s.id < newest.id]
    assert behind
    for status in behind:
        instance.make_unreadable(status)
    async with served(instance) as social:
        polls = poller(client, max_pages=4, page_limit=5, lookback=lookback)
        first = await polls.poll(request(social, timeline="public"))
        assert first.outcome is CrawlOutcome.SUCCESS, first.error_message
        assert first.cursor_after == newest.sid
        added = public_local_post(instance)

        second = await polls.poll(request(social, after=first))
        third = await polls.poll(request(social, after=second))

        assert second.outcome is CrawlOutcome.SUCCESS, second.error_message
        assert uris(second) == [instance.status_uri(added)]
        assert second.cursor_after == added.sid
        assert second.error_message is not None
        assert "behind the cursor left unread" in second.error_message
        assert any("since_id" in q for q in api_queries(social))  # the lookback was asked
        assert third.outcome is CrawlOutcome.SUCCESS, third.error_message
        assert third.cursor_after == added.sid


async def test_the_local_timeline_is_read_from_its_cursor_only(
    client: httpx.AsyncClient,
) -> None:
    """Only the instance's own posts are on it, numbered as they are made."""
    instance = FediverseInstance.generate(posts=20, seed=5)
    async with served(instance) as social:
        polls = poller(client, max_pages=3, page_limit=5, lookback=3600.0)
        first = await polls.poll(request(social))
        newer = public_local_post(instance)
        before = len(api_queries(social))
        second = await polls.poll(request(social, after=first))
        assert api_queries(social)[before].get("min_id") == [first.cursor_after]
        assert uris(second) == [instance.status_uri(newer)]
        assert second.recent_after == ()


async def test_a_tag_timeline_reads_the_tagged_posts_of_every_account(
    client: httpx.AsyncClient,
) -> None:
    instance = FediverseInstance.generate(posts=80, seed=7)
    async with served(instance) as social:
        instance.add_post("ines@elsewhere.trove.test", tags=["smallweb"], visibility="public")
        event = await poller(client, max_pages=2, page_limit=40).poll(
            request(social, timeline="tag:smallweb", api=social.base_url)
        )

        tagged = instance.timeline(local=False, tag="smallweb")
        kept = [s for s in tagged if instance.may_share(s)]
        assert any(not instance.account(s.account).local for s in kept)
        assert uris(event) == [instance.status_uri(s) for s in kept]
        expected = [s.account if "@" in s.account else f"{s.account}@{social.host}" for s in kept]
        assert [post.account for post in event.posts] == expected
        assert all(
            path.startswith("/api/v1/timelines/tag/smallweb?")
            for path in social.witness.paths(social.host)
        )


async def test_a_link_to_another_choice_of_posts_is_not_followed(
    client: httpx.AsyncClient,
) -> None:
    # Links that forget `local` lead to the federated timeline: the local timeline's
    # next page is built from its own query instead.
    instance = FediverseInstance.generate(posts=40, seed=11)
    instance.misbehave("links-unscoped")
    async with served(instance) as social:
        cursor = instance.timeline(local=True)[-1].sid  # the oldest: pages to catch up
        event = await poller(client, max_pages=4, page_limit=5).poll(
            request(social, cursor=cursor, api=social.base_url)
        )

        assert event.outcome is CrawlOutcome.SUCCESS, event.error_message
        assert event.posts
        local = {instance.status_uri(s) for s in instance.timeline(local=True)}
        assert set(uris(event)) <= local
        assert all(q.get("local") == ["true"] for q in api_queries(social))


async def test_the_first_poll_reads_back_past_a_link_to_another_choice_of_posts(
    client: httpx.AsyncClient,
) -> None:
    # Its backfill, page after page, built from its own query when a Link leads away.
    instance = FediverseInstance.generate(posts=40, seed=11)
    instance.misbehave("links-unscoped")
    async with served(instance) as social:
        polls = poller(client, max_pages=4, page_limit=5, backfill=15)
        event = await polls.poll(request(social, api=social.base_url))

        assert event.outcome is CrawlOutcome.SUCCESS, event.error_message
        local = [instance.status_uri(s) for s in instance.timeline(local=True)]
        shared = {instance.status_uri(s) for s in instance.timeline(local=True)[:15]}
        assert set(uris(event)) <= shared
        assert len(api_queries(social)) > 1  # past the first page
        assert set(uris(event)) <= set(local)


def test_a_link_that_spells_out_a_default_choice_is_the_same_timeline() -> None:
    # GoToSocial writes `local=false` into its Links, Pleroma `only_media=false`.
    here = "https://social.example/api/v1/timelines/public?limit=40"
    spelt = (
        '<https://social.example/api/v1/timelines/public?limit=40&local=false&max_id=9>; rel="next"'
    )
    assert link_relation(httpx.Headers({"link": spelt}), "next", here) is not None
    local = here + "&local=true"
    dropped = '<https://social.example/api/v1/timelines/public?limit=40&max_id=9>; rel="next"'
    assert link_relation(httpx.Headers({"link": dropped}), "next", local) is None
    defaults = (
        "<https://social.example/api/v1/timelines/public?limit=40&local=true&only_media=false"
        '&remote=false&max_id=9>; rel="next"'
    )
    assert link_relation(httpx.Headers({"link": defaults}), "next", local) is not None


async def test_cursor_advances_across_polls_and_no_post_is_handled_twice(
    client: httpx.AsyncClient,
) -> None:
    instance = FediverseInstance.generate(posts=30, seed=11)
    async with served(instance) as social:
        polls = poller(client, max_pages=3, page_limit=10)
        first = await polls.poll(request(social))
        added = [public_local_post(instance, name) for name in ("ada", "bruno", "ada")]
        added += instance.add_posts(9)
        second = await polls.poll(request(social, after=first))
        third = await polls.poll(request(social, after=second))

        assert first.outcome is second.outcome is third.outcome is CrawlOutcome.SUCCESS
        new_kept = [s for s in added if instance.may_share(s) and instance.account(s.account).local]
        assert uris(second) == [instance.status_uri(s) for s in new_kept]
        assert not set(uris(first)) & set(uris(second))
        newest_local = [s for s in added if s in instance.timeline(local=True)][-1]
        assert second.cursor_after == newest_local.sid
        assert (third.posts, third.cursor_after, third.requests) == ((), second.cursor_after, 1)
        # NodeInfo once; then each poll starts at the cursor the previous one ended on.
        assert social.witness.paths(social.host).count("/.well-known/nodeinfo") == 1
        cursors = [q["min_id"][0] for q in api_queries(social) if "min_id" in q]
        assert cursors[0] == first.cursor_after
        assert cursors[-1] == second.cursor_after
        assert [id_key(c) for c in cursors] == sorted(id_key(c) for c in cursors)
        assert id_key(cursors[-1]) > id_key(cursors[0])


async def test_paging_stops_at_max_pages_and_the_next_poll_reads_the_rest(
    client: httpx.AsyncClient,
) -> None:
    instance = FediverseInstance.generate(posts=10, seed=5)
    async with served(instance) as social:
        polls = poller(client, max_pages=2, page_limit=4)
        start = instance.timeline(local=True)[0].sid
        added = [public_local_post(instance) for _ in range(14)]
        first = await polls.poll(request(social, cursor=start, api=social.base_url))
        second = await polls.poll(request(social, after=first))

        assert first.more
        assert first.requests == 2
        assert len(first.posts) == 8
        assert not second.more
        assert len(second.posts) == 6
        assert uris(first) + uris(second) == [instance.status_uri(s) for s in added]
        assert second.cursor_after == added[-1].sid
        # The second page came from the first page's Link: prev (min_id of its newest).
        queries = api_queries(social)
        assert [q["min_id"][0] for q in queries] == [
            start,
            added[3].sid,
            added[7].sid,
            added[11].sid,
        ]
        assert (social.witness.min_gap(social.host) or 0.0) >= GAP


async def test_an_instance_that_gives_fewer_posts_a_page_than_asked_is_read_to_its_newest(
    client: httpx.AsyncClient,
) -> None:
    # 20 a page whatever is asked: 50 new posts are three pages, not one and the end.
    instance = FediverseInstance.generate(posts=10, seed=5)
    instance.page_cap = 20
    async with served(instance) as social:
        polls = poller(client, max_pages=4, page_limit=40)
        start = instance.timeline(local=True)[0].sid
        added = [public_local_post(instance) for _ in range(50)]
        event = await polls.poll(request(social, cursor=start, api=social.base_url))

        assert event.outcome is CrawlOutcome.SUCCESS, event.error_message
        assert uris(event) == [instance.status_uri(s) for s in added]
        assert event.cursor_after == added[-1].sid
        assert not event.more
        assert [q["limit"][0] for q in api_queries(social)] == ["40", "40", "40"]


async def test_a_backfill_on_an_instance_of_short_pages_reads_back_past_its_first_page(
    client: httpx.AsyncClient,
) -> None:
    instance = FediverseInstance.generate(posts=60, seed=7)
    instance.page_cap = 20
    async with served(instance) as social:
        polls = poller(client, max_pages=3, page_limit=40)
        event = await polls.poll(request(social, api=social.base_url, backfill=50))

        assert event.outcome is CrawlOutcome.SUCCESS, event.error_message
        read_back = instance.timeline(local=True)[:50]
        kept = [s for s in read_back if instance.may_share(s)]
        assert uris(event) == [instance.status_uri(s) for s in kept]
        assert (event.back_from, event.back_left, event.more) == (None, 0, False)


async def test_opted_out_accounts_leave_no_trace_in_the_event(
    client: httpx.AsyncClient,
) -> None:
    instance = FediverseInstance.generate(posts=20, seed=9)
    instance.opt_out("ada", "noindex")
    opted_out = [a.acct for a in instance.accounts if a.local and a.opted_out]
    assert len(opted_out) == 4  # the generated three ways, and ada's noindex
    async with served(instance) as social:
        secret = [
            instance.add_post(
                acct,
                links=[f"https://secret-{acct}.example/page"],
                visibility="public",
                card=True,
            )
            for acct in opted_out
        ]
        public_local_post(instance, "bruno")
        event = await poller(client, max_pages=2, page_limit=40).poll(request(social))

        assert event.outcome is CrawlOutcome.SUCCESS
        wire = event.to_wire().decode()
        for acct in opted_out:
            assert f"secret-{acct}" not in wire
            assert f"/users/{acct}/" not in wire
            assert f"/@{acct}/" not in wire
            assert f"{acct}@" not in wire
        assert event.skipped >= len(secret)
        assert not {instance.status_uri(s) for s in secret} & set(uris(event))


async def test_an_account_that_opts_out_later_is_named_by_its_key_for_its_shares_to_go(
    client: httpx.AsyncClient,
) -> None:
    instance = FediverseInstance.generate(posts=20, seed=9)
    async with served(instance) as social:
        shared = instance.add_post("ada", links=["https://blog.example/a"], visibility="public")
        polls = poller(client, max_pages=2, page_limit=40)
        first = await polls.poll(request(social))
        ada = account_key(f"ada@{social.host}")
        assert instance.status_uri(shared) in uris(first)
        # The instance's accounts that opted out from the start are named as well.
        others = {a.acct for a in instance.accounts if a.local and a.opted_out}
        assert others
        assert set(first.withdrawn) == {account_key(f"{a}@{social.host}") for a in others}

        instance.opt_out("ada", "indexable")
        later = instance.add_post("ada", links=["https://blog.example/b"], visibility="public")
        instance.add_post("ada", visibility="public")  # the key is said once a poll
        hidden = instance.add_post("bruno", visibility="unlisted")  # not an opt-out
        second = await polls.poll(request(social, after=first))

        assert second.outcome is CrawlOutcome.SUCCESS
        assert second.withdrawn == (ada,)
        assert instance.status_uri(later) not in uris(second)
        assert instance.status_uri(hidden) not in uris(second)
        wire = second.to_wire().decode()
        assert "ada@" not in wire
        assert "blog.example/b" not in wire


async def test_shared_links_leave_out_mentions_hashtags_the_instance_and_private_addresses(
    client: httpx.AsyncClient,
) -> None:
    instance = FediverseInstance.generate(posts=40, seed=7)
    async with served(instance) as social:
        shared = instance.add_post(
            "bruno",
            links=[
                "http://127.0.0.1/admin",
                "https://blog.example/post?utm_source=fedi",
                "http://10.1.2.3/",
                "ftp://files.example/x",
                social.url("/about"),
            ],
            card=True,  # the card shows the first link: a private address
            visibility="public",
            tags=["smallweb"],
        )
        event = await poller(client, max_pages=2, page_limit=40).poll(request(social))

        posts = {post.uri: post for post in event.posts}
        assert posts[instance.status_uri(shared)].links == ("https://blog.example/post",)
        own = [post for post in event.posts if any(social.host in url for url in post.links)]
        assert not own
        assert any(s.mentions for s in instance.timeline() if instance.status_uri(s) in posts)
        assert any(s.own_links for s in instance.timeline() if instance.status_uri(s) in posts)


async def test_a_shared_link_in_the_operators_nat64_prefix_is_judged_by_its_ipv4_address(
    client: httpx.AsyncClient,
) -> None:
    # As discovery and the transport judge it: a public IPv4 address behind the
    # operator's NAT64 prefix is a page; a private one is not. Without the prefix both
    # are addresses outside the global unicast range.
    public, private = "http://[64:ff9b:1::5db8:d822]/post", "http://[64:ff9b:1::a01:203]/"
    entry = {"content": f'<p><a href="{public}">a</a> <a href="{private}">b</a></p>'}
    assert shared_links(entry, host="social.example") == ()

    instance = FediverseInstance.generate(posts=5, seed=7)
    async with served(instance) as social:
        shared = instance.add_post("bruno", links=[public, private], visibility="public")
        plain = await poller(client).poll(request(social))
        behind = await poller(client, nat64_prefixes=("64:ff9b:1::/96",)).poll(request(social))

    uri = instance.status_uri(shared)
    assert {post.uri: post.links for post in plain.posts}[uri] == ()
    assert {post.uri: post.links for post in behind.posts}[uri] == (public,)


@pytest.mark.parametrize("clock_ahead", [0.0, -3600.0, 3600.0])
async def test_rate_limit_nearly_spent_stops_the_poll_until_the_reset(
    client: httpx.AsyncClient, clock_ahead: float
) -> None:
    # The reset is a time on the instance's clock, and so is its Date: read on ours, an
    # instance an hour slow was left the default window, one an hour fast an hour more.
    instance = FediverseInstance.generate(posts=30, seed=7, rate_limit=4, rate_window=30.0)
    instance.clock_ahead = clock_ahead
    async with served(instance) as social:
        oldest = instance.timeline(local=True)[-1].sid
        event = await poller(client, max_pages=5, page_limit=2).poll(
            request(social, cursor=oldest, api=social.base_url)
        )

        # Remaining 3, 2, then 1 of 4: the poll stops there and waits for the reset.
        assert event.outcome is CrawlOutcome.SUCCESS
        assert event.requests == len(api_queries(social)) == 3
        assert event.more
        assert event.retry_after is not None
        assert 20.0 < event.retry_after <= 31.0  # a second more: a Date counts whole seconds
        assert event.rate_limited  # the instance's asking: the host learns it
        assert event.posts
        assert event.cursor_after != oldest
    # No refusal: the host waits for each reset as named, and no run of refusals grows
    # (a busy instance whose limit every poll spends was paused 30, 59, 119, 238 s...).
    observation = fetcher_module._poll_observation(event)
    assert observation is not None
    assert observation.error_type == "rate_spent"
    policy = HostPolicy()
    for n in range(4):
        later = replace(
            observation, started=observation.started + 100 * n, at=observation.at + 100 * n
        )
        policy = observe(policy, later, LearningConfig())
        assert policy.paused_until == pytest.approx(later.at + event.retry_after, abs=0.01)
    assert policy.rate_level == 0


async def test_a_hop_after_an_answer_that_spent_the_limit_asks_no_robots_txt(
    client: httpx.AsyncClient,
) -> None:
    # The API answers with a redirect on the instance and its limit spent (one request a
    # window): the poll ends there, without looking up the hop's robots.txt, which a
    # pod that has not read it would ask of the host the instance asked to be left alone.
    instance = FediverseInstance.generate(posts=20, seed=7, rate_limit=1, rate_window=60.0)
    asked: list[str] = []

    async def robots_allows(url: str) -> bool:
        asked.append(url)
        return True

    async with served(instance) as social:
        instance.misbehave("redirect", redirect_to=f"{social.base_url}/api/v1/timelines/public")
        cursor = instance.timeline(local=True)[-1].sid
        event = await poller(client, robots_allows=robots_allows).poll(
            request(social, cursor=cursor, api=social.base_url)
        )

    assert event.requests == 1
    assert event.rate_limited
    assert event.retry_after is not None
    # The timeline's own page (local posts), not the hop (the public timeline, no query).
    assert len(asked) == 1
    assert "local=true" in urlsplit(asked[0]).query


@pytest.mark.parametrize(("retry_after", "low", "high"), [("7", 7.0, 7.0), ("", 200.0, 300.0)])
async def test_429_is_blocked_4xx_with_its_retry_after_and_the_cursor_kept(
    client: httpx.AsyncClient, retry_after: str, low: float, high: float
) -> None:
    instance = FediverseInstance.generate(posts=20, seed=7)
    instance.throttle(retry_after)  # "": no usable Retry-After, the rate limit's reset instead
    async with served(instance) as social:
        cursor = instance.timeline(local=True)[-1].sid
        event = await poller(client).poll(request(social, cursor=cursor, api=social.base_url))

        assert event.outcome is CrawlOutcome.BLOCKED_4XX
        assert event.status_code == 429
        assert event.retry_after is not None
        assert low <= event.retry_after <= high
        assert event.rate_limited
        assert (event.cursor_after, event.posts, event.more) == (cursor, (), False)
        assert event.requests == 1


async def test_an_error_answer_that_spent_the_limit_holds_the_poll_until_the_reset(
    client: httpx.AsyncClient,
) -> None:
    # A 502 from the API still counts against its limit and says so in its
    # headers: unread, the next poll of the instance came a gap later, inside the window.
    instance = FediverseInstance.generate(posts=20, seed=7, rate_limit=1, rate_window=60.0)
    instance.misbehave("new-posts-502")
    waits: list[float] = []
    async with served(instance) as social:
        cursor = instance.timeline(local=True)[-1].sid
        event = await poller(client, told=waits.append).poll(
            request(social, cursor=cursor, api=social.base_url)
        )

    assert event.outcome is CrawlOutcome.BLOCKED_5XX
    assert event.status_code == 502
    assert event.requests == 1
    assert event.rate_limited
    assert event.retry_after is not None
    assert 50.0 < event.retry_after <= 61.0
    # Told inside the request's gate: its release holds the host until the reset.
    assert len(waits) == 1
    assert 50.0 < waits[0] <= 61.0


@pytest.mark.parametrize(
    ("mode", "outcome", "reason", "asked"),
    [
        ("html", CrawlOutcome.REJECTED, "not JSON", 1),
        ("redirect", CrawlOutcome.REJECTED, "off the instance", 1),
        # Asked again with fewer posts down to one (max_pages), which no Link leads past.
        ("huge", CrawlOutcome.REJECTED, "larger than", 5),
    ],
)
async def test_a_hostile_answer_is_rejected_and_the_cursor_kept(
    client: httpx.AsyncClient, mode: Misbehaviour, outcome: CrawlOutcome, reason: str, asked: int
) -> None:
    instance = FediverseInstance.generate(posts=20, seed=7)
    instance.misbehave(mode)
    async with served(instance) as social:
        cursor = instance.timeline(local=True)[-1].sid
        limits = FetchLimits(total_timeout=10.0, max_body_bytes=256 * 1024)
        event = await poller(client, limits=limits).poll(request(social, cursor=cursor))

        assert event.outcome is outcome
        assert event.error_message is not None
        assert reason in event.error_message
        assert (event.cursor_after, event.posts) == (cursor, ())
        # NodeInfo (two requests) still found the software; then the API requests.
        assert event.software == "mastodon"
        assert event.requests == len(social.witness.requests()) == 2 + asked
        assert len(api_queries(social)) == asked


def big_post(instance: FediverseInstance) -> Status:
    """A public post of 100 links of 900 characters: over 64 KiB whatever page holds it."""
    return instance.add_post(
        "ada",
        links=[f"https://blog{i}.example/" + "p" * 900 for i in range(100)],
        visibility="public",
        card=False,
    )


@pytest.mark.parametrize(
    ("max_pages", "page_limit", "limits"),
    [(5, 8, ["8", "4", "2", "1", "8"]), (3, 40, ["40", "20", "1"])],
)
async def test_a_post_too_large_for_a_page_is_passed_over_after_pages_of_fewer_posts(
    client: httpx.AsyncClient, max_pages: int, page_limit: int, limits: list[str]
) -> None:
    # Any page holding it is over max_body_bytes: asked the same way, the same page
    # would be refused every poll. Fewer posts a page, down to one (the poll's last page
    # whatever its pages), which the page's Link says where to read on from.
    instance = FediverseInstance.generate(posts=10, seed=5)
    async with served(instance) as social:
        start = instance.timeline(local=True)[0].sid
        big = big_post(instance)
        added = [public_local_post(instance) for _ in range(3)]
        fetch = FetchLimits(total_timeout=10.0, max_body_bytes=64 * 1024)
        polls = poller(client, max_pages=max_pages, page_limit=page_limit, limits=fetch)
        first = await polls.poll(request(social, cursor=start, api=social.base_url))
        rest = await polls.poll(request(social, after=first))

        assert first.outcome is rest.outcome is CrawlOutcome.SUCCESS, first.error_message
        assert first.requests == max_pages
        queries = api_queries(social)
        assert [q["limit"][0] for q in queries[:max_pages]] == limits
        assert [q["min_id"][0] for q in queries[: limits.index("1") + 1]] == [start] * (
            limits.index("1") + 1
        )
        assert first.skipped == 1
        assert first.error_message is not None
        assert "passed over" in first.error_message
        assert instance.status_uri(big) not in uris(first) + uris(rest)
        assert uris(first) + uris(rest) == [instance.status_uri(s) for s in added]
        assert rest.cursor_after == added[-1].sid
        assert (social.witness.min_gap(social.host) or 0.0) >= GAP


async def test_a_post_no_json_reader_takes_is_passed_over_after_pages_of_fewer_posts(
    client: httpx.AsyncClient,
) -> None:
    # One post in Latin-1 makes every page that holds it no JSON: asked the same way, the
    # same page was refused every poll, and the timeline read nothing new for good.
    instance = FediverseInstance.generate(posts=10, seed=5)
    async with served(instance) as social:
        start = instance.timeline(local=True)[0].sid
        broken = public_local_post(instance)
        instance.make_undecodable(broken)
        added = [public_local_post(instance) for _ in range(3)]
        polls = poller(client, max_pages=5, page_limit=8)
        first = await polls.poll(request(social, cursor=start, api=social.base_url))
        rest = await polls.poll(request(social, after=first))

        assert first.outcome is rest.outcome is CrawlOutcome.SUCCESS, first.error_message
        assert [q["limit"][0] for q in api_queries(social)[:4]] == ["8", "4", "2", "1"]
        assert first.skipped == 1
        assert first.error_message is not None
        assert "not JSON" in first.error_message
        assert instance.status_uri(broken) not in uris(first) + uris(rest)
        assert uris(first) + uris(rest) == [instance.status_uri(s) for s in added]
        assert rest.cursor_after == added[-1].sid
        assert (social.witness.min_gap(social.host) or 0.0) >= GAP


async def test_pages_of_fewer_posts_are_asked_within_the_rate_a_refused_page_left(
    client: httpx.AsyncClient,
) -> None:
    # The page refused for its size still says how much of the rate is left: asked again
    # past it, the instance answers 429.
    instance = FediverseInstance.generate(posts=10, seed=5, rate_limit=3)
    async with served(instance) as social:
        start = instance.timeline(local=True)[0].sid
        big_post(instance)
        fetch = FetchLimits(total_timeout=10.0, max_body_bytes=64 * 1024)
        polls = poller(client, max_pages=5, page_limit=8, limits=fetch)
        event = await polls.poll(request(social, cursor=start, api=social.base_url))

        assert event.status_code != 429, event.error_message
        assert event.requests < 3
        assert event.retry_after is not None


async def test_a_run_of_posts_that_cannot_be_read_is_passed_over_and_reading_goes_on(
    client: httpx.AsyncClient,
) -> None:
    # A page of nothing readable is refused: as many as a page holds in a row would be
    # refused every poll. The page is passed over whole, by its newest id.
    instance = FediverseInstance.generate(posts=10, seed=5)
    async with served(instance) as social:
        start = instance.timeline(local=True)[0].sid
        broken = [public_local_post(instance) for _ in range(4)]
        for status in broken:
            instance.make_unreadable(status)
        added = [public_local_post(instance) for _ in range(2)]
        polls = poller(client, max_pages=5, page_limit=4)
        event = await polls.poll(request(social, cursor=start, api=social.base_url))

        assert event.outcome is CrawlOutcome.SUCCESS, event.error_message
        assert uris(event) == [instance.status_uri(s) for s in added]
        assert event.cursor_after == added[-1].sid
        assert event.skipped == len(broken)
        assert event.error_message is not None
        assert "4 malformed entries skipped" in event.error_message
        asked = [(q["limit"][0], q["min_id"][0]) for q in api_queries(social)]
        assert asked[:2] == [("4", start), ("4", broken[-1].sid)]
        assert event.requests == len(asked) <= 3


async def test_ids_of_another_kind_or_past_the_cap_are_skipped_and_the_cursor_goes_on(
    client: httpx.AsyncClient,
) -> None:
    # Taken as the cursor, an id of letters among numbers (or of 250 digits) would
    # have hidden every later post for good.
    instance = FediverseInstance.generate(posts=20, seed=7)
    async with served(instance) as social:
        cursor = instance.timeline(local=True)[-1].sid
        instance.misbehave("odd-ids")
        event = await poller(client).poll(request(social, cursor=cursor, api=social.base_url))
        assert event.outcome is CrawlOutcome.SUCCESS
        assert event.error_message is not None
        assert "2 malformed entries skipped" in event.error_message
        assert event.cursor_after is not None
        assert event.cursor_after.isdigit()
        assert len(event.cursor_after) < 30
        instance.misbehave(None)
        instance.add_post()
        after = await poller(client).poll(request(social, after=event))
        assert after.posts
        assert after.cursor_after != event.cursor_after


def a_day_ahead() -> int:
    """A snowflake of Mastodon's dated a day ahead of this clock."""
    return int(time.time() + 86_400) * 1000 << 16


@pytest.mark.parametrize(("far", "software"), [("past-64-bits", None), ("ahead", "mastodon")])
async def test_an_id_past_any_the_instance_can_have_given_never_moves_the_cursor(
    client: httpx.AsyncClient, far: str, software: str | None
) -> None:
    # A post numbered past 64 bits (whatever the software), or dated a day ahead (a
    # snowflake of Mastodon's; a remote server claimed that date): as the cursor, it
    # would have hidden every later post for good.
    instance = FediverseInstance.generate(posts=10, seed=7)
    async with served(instance) as social:
        cursor = instance.timeline(local=True)[0].sid
        added = [public_local_post(instance) for _ in range(6)]
        odd = instance.add_post_numbered(1 << 63 if far == "past-64-bits" else a_day_ahead())
        polls = poller(client, max_pages=4, page_limit=4)
        first = await polls.poll(
            request(social, cursor=cursor, api=social.base_url, software=software)
        )
        later = [public_local_post(instance) for _ in range(3)]
        rest = await polls.poll(request(social, after=first))

        assert first.outcome is rest.outcome is CrawlOutcome.SUCCESS, first.error_message
        assert first.cursor_after == added[-1].sid
        assert first.error_message is not None
        assert "1 malformed entries skipped" in first.error_message
        read = uris(first) + uris(rest)
        assert read == [instance.status_uri(s) for s in added + later]
        assert instance.status_uri(odd) not in read
        assert rest.cursor_after == later[-1].sid


@pytest.mark.parametrize("mode", ["since-links", "skipping-links"])
async def test_the_next_page_reads_on_from_the_pages_newest_post_whatever_its_link_says(
    client: httpx.AsyncClient, mode: Misbehaviour
) -> None:
    # A Link that reads on with since_id gives the newest posts, one with a min_id past
    # the page skips a page: either way the posts between would be passed for good.
    instance = FediverseInstance.generate(posts=5, seed=3)
    instance.misbehave(mode)
    async with served(instance) as social:
        cursor = instance.timeline(local=True)[0].sid
        added = [public_local_post(instance) for _ in range(30)]
        polls = poller(client, max_pages=3, page_limit=5)
        first = await polls.poll(request(social, cursor=cursor, api=social.base_url))
        events = await polled_on(polls, social, [first], most=5)

        assert all(e.outcome is CrawlOutcome.SUCCESS for e in events), events[-1].error_message
        assert not events[-1].more
        read = [uri for event in events for uri in uris(event)]
        assert read == [instance.status_uri(s) for s in added]
        assert not any("since_id" in query for query in api_queries(social))


async def test_a_lookback_answered_with_the_newest_posts_leaves_them_to_the_forward_read(
    client: httpx.AsyncClient,
) -> None:
    # An instance that ignores since_id and max_id serves its newest posts behind the
    # cursor: taken there, they would move the cursor past the posts between.
    instance = FediverseInstance.generate(posts=5, seed=3)
    instance.misbehave("ignores-lookback")
    async with served(instance) as social:
        cursor = instance.timeline(local=False)[0].sid
        added = [public_local_post(instance) for _ in range(20)]
        polls = poller(client, max_pages=2, page_limit=5, lookback=3600.0)
        asked = request(social, cursor=cursor, api=social.base_url, timeline="public")
        events = await polled_on(polls, social, [await polls.poll(asked)], most=4)

        assert all(e.outcome is CrawlOutcome.SUCCESS for e in events), events[-1].error_message
        assert not events[-1].more
        read = [uri for event in events for uri in uris(event)]
        assert sorted(read) == sorted(instance.status_uri(s) for s in added)
        assert len(read) == len(set(read))
        assert events[0].cursor_after == added[9].sid  # two pages read on, no further


@pytest.mark.parametrize(
    ("mode", "outcome", "status"),
    [("lookback-422", CrawlOutcome.SUCCESS, None), ("lookback-429", CrawlOutcome.BLOCKED_4XX, 429)],
)
async def test_a_lookback_refused_for_its_query_leaves_the_new_posts_to_be_read(
    client: httpx.AsyncClient, mode: Misbehaviour, outcome: CrawlOutcome, status: int | None
) -> None:
    # The lookback is an extra: refused for its query (422), the new posts are read
    # still; refused for the host's sake (429), the whole poll waits.
    instance = FediverseInstance.generate(posts=5, seed=3)
    instance.misbehave(mode)
    async with served(instance) as social:
        cursor = instance.timeline(local=False)[0].sid
        added = [public_local_post(instance) for _ in range(3)]
        polls = poller(client, max_pages=2, page_limit=5, lookback=3600.0)
        event = await polls.poll(
            request(social, cursor=cursor, api=social.base_url, timeline="public")
        )

        assert event.outcome is outcome, event.error_message
        assert event.status_code == status
        assert event.error_message is not None
        if outcome is CrawlOutcome.SUCCESS:
            assert uris(event) == [instance.status_uri(s) for s in added]
            assert event.cursor_after == added[-1].sid
            assert "behind the cursor left unread" in event.error_message
        else:
            assert (event.posts, event.cursor_after) == ((), cursor)
            assert event.retry_after is not None
            assert len(api_queries(social)) == 1


async def test_an_instance_that_numbers_its_posts_anew_is_read_again_from_its_newest(
    client: httpx.AsyncClient,
) -> None:
    # Other software on the same domain: Mastodon's numbers, then ids of text that sort
    # before them (GoToSocial's ULIDs). After the cursor there is nothing, every poll,
    # for good: one poll in RENUMBERING_CHECK_EVERY asks for the newest posts and starts
    # again as a first poll, within the backfill; the others cost what a quiet poll does.
    instance = FediverseInstance.generate(posts=10, seed=3)
    async with served(instance) as social:
        cursor = instance.timeline(local=True)[0].sid
        instance.misbehave("renumbered")
        added = [public_local_post(instance) for _ in range(5)]
        polls = poller(client, max_pages=3, page_limit=5, backfill=3)
        start = request(social, cursor=cursor, api=social.base_url)
        quiet = await polls.poll(start.model_copy(update={"poll": RENUMBERING_CHECK_EVERY + 1}))
        first = await polls.poll(start.model_copy(update={"poll": RENUMBERING_CHECK_EVERY}))
        later = public_local_post(instance)
        second = await polls.poll(request(social, after=first))

        assert quiet.outcome is CrawlOutcome.SUCCESS, quiet.error_message
        assert (quiet.posts, quiet.cursor_after, quiet.requests) == ((), cursor, 1)
        assert first.outcome is second.outcome is CrawlOutcome.SUCCESS, first.error_message
        assert first.error_message is not None
        assert "another kind of id" in first.error_message
        assert sorted(uris(first)) == sorted(instance.status_uri(s) for s in added[-3:])
        assert first.cursor_after is not None
        assert not first.cursor_after.isdigit()
        assert (first.api, first.software) == (None, None)  # other software: asked again
        assert first.requests == 2  # after the cursor; the newest page, read back once
        assert uris(second) == [instance.status_uri(later)]
        assert second.cursor_after not in (None, first.cursor_after)
        assert second.api == social.base_url


@pytest.mark.parametrize("cut_short", [False, True])
async def test_a_cursor_of_text_on_an_instance_that_now_numbers_its_posts_starts_again(
    client: httpx.AsyncClient, cut_short: bool
) -> None:
    # The other way (text ids, then Mastodon's numbers): the page after the cursor holds
    # only numbers. Cut short after its first page (here robots.txt refuses older
    # pages), the poll keeps what it read, as a first poll would.
    instance = FediverseInstance.generate(posts=20, seed=3)

    async def robots(url: str) -> bool:
        return not (cut_short and "max_id" in url)

    async with served(instance) as social:
        polls = poller(client, max_pages=3, page_limit=5, backfill=12, robots_allows=robots)
        text_cursor = "01JD8QZ4V6ZK6Y3N7Q2W5XH8RT"
        event = await polls.poll(request(social, cursor=text_cursor, api=social.base_url))

        assert event.outcome is CrawlOutcome.SUCCESS, event.error_message
        newest = instance.timeline(local=True)
        assert event.cursor_after == newest[0].sid
        assert event.error_message is not None
        assert "another kind of id" in event.error_message
        read_back = newest[:5] if cut_short else newest[:12]
        assert uris(event) == [instance.status_uri(s) for s in read_back if instance.may_share(s)]
        if cut_short:
            assert event.stopped_by is CrawlOutcome.BLOCKED_ROBOTS
            assert event.more


async def test_the_newest_posts_refused_to_the_renumbering_check_leave_the_poll_as_it_was(
    client: httpx.AsyncClient,
) -> None:
    # The check is an extra, as the lookback is: refused for its query, the poll ends as
    # it would have without it.
    instance = FediverseInstance.generate(posts=10, seed=3)

    async def robots(url: str) -> bool:
        return "min_id" in url

    async with served(instance) as social:
        cursor = instance.timeline(local=True)[0].sid
        for _ in range(4):
            public_local_post(instance)
        instance.misbehave("text-ids-after-cursor")
        polls = poller(client, max_pages=2, page_limit=4, robots_allows=robots)
        event = await polls.poll(request(social, cursor=cursor, api=social.base_url))

        assert event.outcome is CrawlOutcome.SUCCESS, event.error_message
        assert (event.posts, event.cursor_after) == ((), cursor)
        assert "another kind of id" not in (event.error_message or "")
        assert event.requests == 1  # robots.txt refused the check before it was asked


async def test_a_lookback_of_ids_of_another_kind_asks_a_quiet_timeline_nothing_more(
    client: httpx.AsyncClient,
) -> None:
    # What the lookback behind the cursor held says nothing of the page after it: with
    # nothing new there, the poll asks for the newest posts only on its own schedule.
    instance = FediverseInstance.generate(posts=10, seed=3)
    instance.misbehave("text-ids-behind-cursor")
    async with served(instance) as social:
        cursor = instance.timeline(local=False)[0].sid
        polls = poller(client, max_pages=2, page_limit=4, lookback=30 * 86_400.0)
        event = await polls.poll(
            request(social, cursor=cursor, api=social.base_url, timeline="public")
        )

        assert event.outcome is CrawlOutcome.SUCCESS, event.error_message
        assert (event.posts, event.cursor_after) == ((), cursor)
        assert event.requests == 2  # the lookback, the page after the cursor


@pytest.mark.parametrize(
    ("clock_ahead", "read"),
    [(86_400 - 60, True), (0, False), (30 * 86_400, False), (-5 * 365 * 86_400, False)],
)
async def test_a_post_dated_ahead_alone_after_the_cursor_leaves_the_poll_caught_up(
    client: httpx.AsyncClient, clock_ahead: float, read: bool
) -> None:
    # Alone on its page, a post left for its time is not a page that cannot be read:
    # the poll is caught up. It is read once the instance's clock (its answers' Date)
    # says its time has come: here once the instance's clock runs a day ahead. A Date
    # further than a day from the pods' clock is not believed: one a month ahead
    # leaves the post aside still, and one years behind leaves the other posts read.
    instance = FediverseInstance.generate(posts=10, seed=7)
    async with served(instance) as social:
        cursor = instance.timeline(local=True)[0].sid
        ahead = instance.add_post_numbered(a_day_ahead())
        polls = poller(client, max_pages=3, page_limit=4)
        mastodon = request(social, cursor=cursor, api=social.base_url, software="mastodon")
        event = await polls.poll(mastodon)
        instance.clock_ahead = clock_ahead
        added = public_local_post(instance)
        then = await polls.poll(request(social, after=event))

        assert event.outcome is CrawlOutcome.SUCCESS, event.error_message
        assert (event.posts, event.cursor_after, event.more) == ((), cursor, False)
        assert event.skipped == 1
        assert then.outcome is CrawlOutcome.SUCCESS, then.error_message
        expected = [added, ahead] if read else [added]
        assert uris(then) == [instance.status_uri(s) for s in expected]
        assert then.cursor_after == expected[-1].sid


async def test_a_date_further_than_a_day_ahead_is_not_believed(
    client: httpx.AsyncClient,
) -> None:
    # An instance whose Date says a month from now: a post dated ten days ahead is
    # still no cursor, or every post made in those ten days would be hidden.
    instance = FediverseInstance.generate(posts=10, seed=7)
    instance.clock_ahead = 30 * 86_400
    async with served(instance) as social:
        cursor = instance.timeline(local=True)[0].sid
        far = instance.add_post_numbered(int(time.time() + 10 * 86_400) * 1000 << 16)
        polls = poller(client, max_pages=3, page_limit=4)
        mastodon = request(social, cursor=cursor, api=social.base_url, software="mastodon")
        event = await polls.poll(mastodon)
        added = public_local_post(instance)
        then = await polls.poll(request(social, after=event))

        assert event.cursor_after == cursor
        assert instance.status_uri(far) not in uris(event) + uris(then)
        assert uris(then) == [instance.status_uri(added)]


async def test_a_post_dated_ahead_of_an_instance_whose_clock_runs_slow_is_no_cursor(
    client: httpx.AsyncClient,
) -> None:
    # An instance an hour slow numbers its own posts an hour back; a post from
    # elsewhere dated by the true time is an hour ahead of them. As the cursor, it
    # would hide the instance's own posts of that hour.
    instance = FediverseInstance.generate(posts=10, seed=7)
    instance.clock_ahead = -3600
    async with served(instance) as social:
        cursor = instance.timeline(local=True)[0].sid
        remote = instance.add_post_numbered(int(time.time() + 300) * 1000 << 16)
        polls = poller(client, max_pages=3, page_limit=4)
        mastodon = request(social, cursor=cursor, api=social.base_url, software="mastodon")
        event = await polls.poll(mastodon)
        own = public_local_post(instance)
        then = await polls.poll(request(social, after=event))

        assert event.cursor_after == cursor
        assert instance.status_uri(remote) not in uris(event) + uris(then)
        assert uris(then) == [instance.status_uri(own)]


@pytest.mark.parametrize("dated_ahead", [0, 2])
@pytest.mark.parametrize("timeline", ["public", "tag:smallweb"])
async def test_a_first_poll_sees_as_far_back_as_the_next_lookback_reads(
    client: httpx.AsyncClient, dated_ahead: int, timeline: str
) -> None:
    # The next poll looks back a page below the cursor; the page read first holds the
    # cursor's own post, and posts dated ahead take places on it: seen no further,
    # the lookback would take posts from before the follow (a backfill of 0 here) as
    # late ones.
    instance = FediverseInstance.generate(posts=4, seed=7)
    for _ in range(10):
        instance.add_post("ada", visibility="public", tags=["smallweb"])
    remote = next(a.acct for a in instance.accounts if not a.local)
    for n in range(dated_ahead):
        instance.add_post_numbered(a_day_ahead() + n, remote, tags=["smallweb"])
    async with served(instance) as social:
        polls = poller(client, max_pages=4, page_limit=4, lookback=86_400.0)
        start = request(social, api=social.base_url, software="mastodon", timeline=timeline)
        first = await polls.poll(start.model_copy(update={"backfill": 0}))
        second = await polls.poll(request(social, after=first))

        assert first.outcome is second.outcome is CrawlOutcome.SUCCESS, first.error_message
        assert (uris(first), uris(second)) == ([], [])
        assert second.cursor_after == first.cursor_after


async def test_a_post_minutes_ahead_of_the_instances_date_waits_for_its_time(
    client: httpx.AsyncClient,
) -> None:
    # Told the instance's clock, a post five minutes ahead of it is no cursor: the
    # instance's own posts of those minutes would be numbered behind it, where one
    # page of lookback reaches only some.
    instance = FediverseInstance.generate(posts=10, seed=7)
    async with served(instance) as social:
        cursor = instance.timeline(local=False)[0].sid
        remote = next(a.acct for a in instance.accounts if not a.local)
        ahead = instance.add_post_numbered(int(time.time() + 300) * 1000 << 16, remote)
        polls = poller(client, max_pages=3, page_limit=4)
        mastodon = request(
            social, cursor=cursor, api=social.base_url, software="mastodon", timeline="public"
        )
        events = [await polls.poll(mastodon)]
        own = [
            instance.add_post_numbered(int(time.time() + 10 + 10 * i) * 1000 << 16 | i)
            for i in range(12)
        ]
        for clock_ahead in (200.0, 250.0, 400.0):  # the instance's clock moves on
            instance.clock_ahead = clock_ahead
            events.append(await polls.poll(request(social, after=events[-1])))

        assert events[0].cursor_after == cursor
        read = [uri for event in events for uri in uris(event)]
        assert sorted(read) == sorted(instance.status_uri(s) for s in [*own, ahead])


async def test_a_poll_started_again_on_numbers_takes_no_post_dated_ahead_as_its_cursor(
    client: httpx.AsyncClient,
) -> None:
    # From text ids to numbers: the next poll asks NodeInfo for the software, and the
    # numbers meanwhile are taken for Mastodon's, dated.
    instance = FediverseInstance.generate(posts=20, seed=3)
    async with served(instance) as social:
        remote = next(a.acct for a in instance.accounts if not a.local)
        ahead = instance.add_post_numbered(a_day_ahead(), remote)
        polls = poller(client, max_pages=3, page_limit=5, backfill=5)
        text = request(
            social,
            cursor="01JD8QZ4V6ZK6Y3N7Q2W5XH8RT",
            api=social.base_url,
            software="gotosocial",
            timeline="public",
        )
        first = await polls.poll(text)
        added = [public_local_post(instance) for _ in range(3)]
        second = await polls.poll(request(social, after=first))

        assert first.outcome is second.outcome is CrawlOutcome.SUCCESS, first.error_message
        assert first.cursor_after not in (None, ahead.sid)
        assert set(uris(second)) >= {instance.status_uri(s) for s in added}


def pixelfed_id(seconds_ago: float, sequence: int) -> int:
    """An id as Pixelfed gives one: milliseconds since its epoch (2019-02-10), 22 bits up."""
    epoch = datetime(2019, 2, 10, tzinfo=UTC).timestamp()
    return int((time.time() - seconds_ago - epoch) * 1000) << 22 | sequence


async def test_an_instance_that_moved_to_other_numbers_is_read_once_its_software_is_known(
    client: httpx.AsyncClient,
) -> None:
    # From text ids to Pixelfed's numbers, which read as Mastodon's would be dated
    # centuries ahead: the poll that starts again takes them for Mastodon's (its
    # software unknown), and the next, which asked NodeInfo, reads them.
    instance = FediverseInstance.generate(posts=0, seed=3, software=("pixelfed", "0.12.4"))
    async with served(instance) as social:
        posts = [instance.add_post_numbered(pixelfed_id(600 - 60 * n, n)) for n in range(6)]
        polls = poller(client, max_pages=3, page_limit=4, backfill=4)
        text = request(
            social,
            cursor="01JD8QZ4V6ZK6Y3N7Q2W5XH8RT",
            api=social.base_url,
            software="gotosocial",
        )
        events = [await polls.poll(text)]
        while events[-1].cursor_after == text.cursor and len(events) < 3:
            events.append(await polls.poll(request(social, after=events[-1])))
        later = instance.add_post_numbered(pixelfed_id(0, 7))
        events.append(await polls.poll(request(social, after=events[-1])))

        assert all(e.outcome is CrawlOutcome.SUCCESS for e in events), events[-1].error_message
        assert len(events) == 3  # the poll that started again, the one that read, one more
        assert events[1].software == "pixelfed"
        assert events[1].cursor_after == posts[-1].sid
        assert sorted(uris(events[1])) == sorted(instance.status_uri(s) for s in posts[-4:])
        assert uris(events[2]) == [instance.status_uri(later)]


def mastodon_id(seconds_ago: float) -> str:
    return str(int((time.time() - seconds_ago) * 1000) << 16)


#: Software a Mastodon instance may run later whose post ids are numbers too: Pixelfed's
#: (larger, read as Mastodon's dated centuries ahead) and small ones (Friendica's).
other_numbered_software = pytest.mark.parametrize(
    ("software", "numbered"),
    [
        (("pixelfed", "0.12.4"), lambda n: pixelfed_id(300 - 30 * n, n)),
        (("friendica", "2024.08"), lambda n: 5000 + n),
    ],
    ids=["larger numbers", "smaller numbers"],
)


@other_numbered_software
async def test_an_instance_that_runs_other_software_of_numbered_ids_now_is_read_again(
    client: httpx.AsyncClient, software: tuple[str, str], numbered: Callable[[int], int]
) -> None:
    # Followed on Mastodon, the instance runs other software after weeks away, whose ids
    # are numbers too: Pixelfed's read as Mastodon's dated centuries ahead (read once
    # NodeInfo, asked again one poll in SOFTWARE_CHECK_EVERY, names the software), others
    # sort before the cursor (a check's poll starts again from the newest).
    instance = FediverseInstance.generate(posts=0, seed=3, software=software)
    async with served(instance) as social:
        cursor = mastodon_id(21 * 86_400)
        posts = [instance.add_post_numbered(numbered(n)) for n in range(6)]
        polls = poller(client, max_pages=3, page_limit=4)
        chain = request(social, cursor=cursor, api=social.base_url, software="mastodon")
        chain = chain.model_copy(update={"poll": SOFTWARE_CHECK_EVERY - 2})
        events: list[TimelinePolled] = []
        while len(events) < 4 or events[-1].more:
            events.append(await polls.poll(chain))
            chain = request(social, after=events[-1])
            assert len(events) < 10, "the chain never caught up"

    assert all(e.outcome is CrawlOutcome.SUCCESS for e in events), events[-1].error_message
    assert events[-1].software == software[0]
    read = {uri for event in events for uri in uris(event)}
    assert read == {instance.status_uri(s) for s in posts}


async def test_a_fork_of_mastodon_in_its_place_keeps_the_cursor(
    client: httpx.AsyncClient,
) -> None:
    # The instance moved to a fork that numbers posts alike (glitch-soc): its quiet
    # timeline is no reason to read its newest posts again.
    instance = FediverseInstance.generate(posts=5, seed=3, software=("glitchsoc", "4.3.2"))
    async with served(instance) as social:
        cursor = instance.timeline(local=True)[0].sid
        chain = request(social, cursor=cursor, api=social.base_url, software="mastodon")
        polls = poller(client, max_pages=3, page_limit=4)
        # The poll that asks NodeInfo, and checks the numbering.
        event = await polls.poll(chain.model_copy(update={"poll": SOFTWARE_CHECK_EVERY}))

    assert event.outcome is CrawlOutcome.SUCCESS, event.error_message
    assert (event.posts, event.cursor_after, event.software) == ((), cursor, "glitchsoc")


@other_numbered_software
async def test_other_software_on_a_host_that_allows_a_poll_two_requests_is_read(
    client: httpx.AsyncClient, software: tuple[str, str], numbered: Callable[[int], int]
) -> None:
    # A host whose gap leaves a poll two requests before its slot is too far (a gap of
    # a minute, two minutes a poll): NodeInfo's poll has none left for the timeline, and
    # the numbering is checked on the check's polls that do not ask it.
    instance = FediverseInstance.generate(posts=0, seed=3, software=software)
    async with served(instance) as social:
        cursor = mastodon_id(21 * 86_400)
        posts = [instance.add_post_numbered(numbered(n)) for n in range(6)]
        chain = request(social, cursor=cursor, api=social.base_url, software="mastodon")
        chain = chain.model_copy(update={"poll": RENUMBERING_CHECK_EVERY})
        events: list[TimelinePolled] = []
        while chain.poll <= 2 * SOFTWARE_CHECK_EVERY:
            # A page holds every post: a start again cut short reads back no further.
            two = poller(client, GapGate(defer_after=2), max_pages=3, page_limit=8)
            events.append(await two.poll(chain))
            chain = request(social, after=events[-1])
        nodeinfo = [p for p in social.witness.paths(social.host) if "nodeinfo" in p]

    assert all(e.outcome is CrawlOutcome.SUCCESS for e in events), events[-1].error_message
    # Two requests each: the two software checks' polls, and the one after a start again
    # from the newest posts (which asks for the software anew), never more.
    assert len(nodeinfo) <= 6
    read = {uri for event in events for uri in uris(event)}
    assert read == {instance.status_uri(s) for s in posts}


def test_only_numbers_far_below_a_numbered_cursor_tell_a_timeline_numbered_anew() -> None:
    cursor = mastodon_id(3600)
    assert _numbered_below(["5002", "5001", "5000"], cursor)  # small numbers after it
    assert not _numbered_below([str(int(cursor) - 2**16), str(int(cursor) - 2**20)], cursor)
    assert not _numbered_below([], cursor)  # nothing posted: nothing to tell by
    assert not _numbered_below(["5000", "01JD8QZ4V6ZK6Y3N7Q2W5XH8RT"], cursor)
    assert not _numbered_below(["5000"], "01JD8QZ4V6ZK6Y3N7Q2W5XH8RT")  # text: another rule


def test_newest_posts_made_after_the_cursor_was_read_tell_a_timeline_numbered_anew() -> None:
    cursor, read = "900", datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    now = read + timedelta(days=1)
    later, earlier = read + timedelta(hours=2), read - timedelta(hours=2)
    assert _made_after([("12", later), ("11", later), ("10", earlier)], cursor, read, now)
    # Made before it was read: a newest post deleted, or the times say nothing.
    assert not _made_after([("12", later), ("11", earlier), ("10", earlier)], cursor, read, now)
    # Within minutes of the read: the instance's hosts' clocks, not a later post.
    within = read + timedelta(minutes=5)
    assert not _made_after([("12", within), ("11", within)], cursor, read, now)
    # The cursor's own post, or one after it, among them: the same numbering.
    assert not _made_after([(cursor, later), ("12", later), ("11", later)], cursor, read, now)
    assert not _made_after([("901", later), ("12", later), ("11", later)], cursor, read, now)
    # Nothing to tell by: the cursor's time or the instance's unknown, most posts without
    # one, no posts.
    assert not _made_after([("12", later), ("11", later)], cursor, None, now)
    assert not _made_after([("12", later), ("11", later)], cursor, read, None)
    assert not _made_after([("12", later), ("11", None), ("10", None)], cursor, read, now)
    assert not _made_after([], cursor, read, now)
    # Posts dated past the instance's clock (an author's clock, a hostile one) say nothing.
    ahead = now + timedelta(hours=1)
    assert not _made_after([("12", ahead), ("11", ahead), ("10", later)], cursor, read, now)
    # Nor does a cursor read later than the instance's clock now (a clock set back).
    assert not _made_after([("12", later), ("11", later)], cursor, ahead, now)
    # A snowflake dated before its post's time: made no later than its id says.
    snowflake = int(earlier.timestamp() * 1000) << 16
    big = str(int(now.timestamp() * 1000) << 16)
    assert not _made_after([(str(snowflake + 1), later), (str(snowflake), later)], big, read, now)
    assert _made_after([("12", later), ("11", later)], big, read, now)
    # A time read without its zone is UTC's.
    assert _made_after([("12", later), ("11", later)], cursor, read.replace(tzinfo=None), now)


@pytest.mark.parametrize("timed", [True, False], ids=["timed", "untimed"])
@pytest.mark.parametrize("timeline", ["local", "public", "tag:smallweb"])
async def test_a_timeline_whose_newest_post_was_deleted_is_not_read_again(
    client: httpx.AsyncClient, timeline: str, timed: bool
) -> None:
    # Its newest posts all come before the cursor now, a little, and were made before
    # it was read: not a change of scale, no other numbering. A chain that does not
    # know when it was read (from a release before) learns it from the poll's answer.
    instance = FediverseInstance.generate(posts=0, seed=11)
    tags = ["smallweb"] if timeline.startswith("tag:") else None
    for _ in range(12):
        instance.add_post("ada", visibility="public", tags=tags)
    async with served(instance) as social:
        polls = poller(client, max_pages=3, page_limit=5, lookback=3600.0)
        first = await polls.poll(request(social, timeline=timeline))
        newest = instance.timeline(local=timeline == "local", tag=tags[0] if tags else None)[0]
        assert first.cursor_after == newest.sid
        instance.delete_post(newest)
        chain = request(social, after=first).model_copy(update={"poll": RENUMBERING_CHECK_EVERY})
        if not timed:
            chain = chain.model_copy(update={"cursor_at": None})
        check = await polls.poll(chain)

    assert check.outcome is CrawlOutcome.SUCCESS, check.error_message
    assert (check.posts, check.cursor_after, check.api) == ((), newest.sid, social.base_url)
    assert check.cursor_after_at is not None
    if timed:
        assert check.cursor_after_at == first.cursor_after_at


async def test_a_pixelfed_timeline_whose_newest_post_was_deleted_keeps_its_cursor(
    client: httpx.AsyncClient,
) -> None:
    instance = FediverseInstance.generate(posts=0, seed=3, software=("pixelfed", "0.12.4"))
    async with served(instance) as social:
        posts = [instance.add_post_numbered(pixelfed_id(300 - 30 * n, n)) for n in range(6)]
        chain = request(social, cursor=posts[-1].sid, api=social.base_url, software="pixelfed")
        instance.delete_post(posts[-1])
        polls = poller(client, max_pages=3, page_limit=4)
        event = await polls.poll(chain.model_copy(update={"poll": RENUMBERING_CHECK_EVERY}))

    assert event.outcome is CrawlOutcome.SUCCESS, event.error_message
    assert (event.posts, event.cursor_after, event.software) == ((), posts[-1].sid, "pixelfed")


@pytest.mark.parametrize(
    ("runs", "renumbered", "cursor", "before"),
    [
        # Pixelfed's numbers, then Mastodon's snowflakes: smaller, but not by a change of
        # scale, as a newest post deleted would leave them.
        (("mastodon", "4.3.0"), False, str(pixelfed_id(21 * 86_400, 0)), "pixelfed"),
        # Pleroma's flake ids (letters and digits), then GoToSocial's, which sort before
        # them ("01..." before letters): text after text, no other kind.
        (("gotosocial", "0.17.3"), True, "AqxhJX4Nf8Z9hN2K7M", "pleroma"),
    ],
    ids=["pixelfed-to-mastodon", "pleroma-to-gotosocial"],
)
async def test_an_instance_whose_new_numbers_stay_below_the_cursor_is_read_again(
    client: httpx.AsyncClient,
    runs: tuple[str, str],
    renumbered: bool,
    cursor: str,
    before: str,
) -> None:
    # Nothing after the cursor for good: made after the cursor was read, the newest
    # posts are a new numbering, and the check's poll starts again from them.
    instance = FediverseInstance.generate(posts=0, seed=3, software=runs)
    async with served(instance) as social:
        posts = [public_local_post(instance) for _ in range(6)]
        if renumbered:
            instance.misbehave("renumbered")  # ids spelt as text that sorts before letters
        assert not _numbered_below([posts[0].sid], cursor)
        read = posts[0].created_at - timedelta(days=2)
        chain = request(social, cursor=cursor, cursor_at=read, api=social.base_url, software=before)
        polls = poller(client, max_pages=3, page_limit=4)
        start = time.time()
        first = await polls.poll(chain.model_copy(update={"poll": RENUMBERING_CHECK_EVERY}))
        end = time.time()
        later = public_local_post(instance)
        second = await polls.poll(request(social, after=first))

    assert first.outcome is second.outcome is CrawlOutcome.SUCCESS, first.error_message
    assert "made after the cursor was read" in (first.error_message or "")
    assert sorted(uris(first)) == sorted(instance.status_uri(s) for s in posts)
    assert first.cursor_after is not None
    assert id_key(first.cursor_after) < id_key(cursor)
    assert read_between(first, start, end)
    assert (uris(second), second.software) == ([instance.status_uri(later)], runs[0])


@pytest.mark.parametrize("known", [None, 400.0], ids=["not-known", "400-days-ahead"])
async def test_a_chain_that_did_not_know_when_its_cursor_was_read_tells_a_move_by_its_time(
    client: httpx.AsyncClient, known: float | None
) -> None:
    # A chain from a release before (or one that took its time from a Date far ahead),
    # on an instance that runs Mastodon now after Pixelfed (its numbers below the
    # cursor, not by a change of scale): a poll learns when the cursor was its own from
    # its answer, and a check once the new software's posts made since fill most of its
    # newest page starts again from them.
    instance = FediverseInstance.generate(posts=0, seed=3)
    cursor = str(pixelfed_id(21 * 86_400, 0))
    cursor_at = None if known is None else datetime.now(UTC) + timedelta(days=known)
    async with served(instance) as social:
        polls = poller(client, max_pages=3, page_limit=4)
        chain = request(
            social, cursor=cursor, cursor_at=cursor_at, api=social.base_url, software="pixelfed"
        )
        start = time.time()
        quiet = await polls.poll(chain)
        assert (quiet.cursor_after, quiet.posts) == (cursor, ())
        assert read_between(quiet, start, time.time())
        instance.clock_ahead = 3600.0
        made = datetime.now(UTC) + timedelta(minutes=30)
        snowflake = int(made.timestamp() * 1000) << 16
        posts = [instance.add_post_numbered(snowflake + n, created_at=made) for n in range(6)]
        assert int(posts[-1].sid) < int(cursor)
        assert not _numbered_below([posts[0].sid], cursor)
        after = request(social, after=quiet)
        check = await polls.poll(after.model_copy(update={"poll": RENUMBERING_CHECK_EVERY}))

    assert started_again(instance, check, "made after the cursor was read", posts)


async def test_posts_made_before_the_cursor_was_read_keep_no_move_from_its_ids(
    client: httpx.AsyncClient,
) -> None:
    # Mastodon's cursor read an hour ago; the instance runs Friendica now, whose newest
    # page holds five posts a month old (imported, fetched as a thread's context) and
    # three new: the times tell nothing, the numbers far below the cursor's do.
    instance = FediverseInstance.generate(posts=0, seed=3, software=("friendica", "2024.12"))
    now = datetime.now(UTC)
    old = [
        instance.add_post_numbered(1 + n, created_at=now - timedelta(days=30 - n)) for n in range(5)
    ]
    new = [
        instance.add_post_numbered(10 + n, created_at=now - timedelta(minutes=30 - n))
        for n in range(3)
    ]
    async with served(instance) as social:
        chain = request(
            social,
            cursor=mastodon_id(3600),
            cursor_at=now - timedelta(hours=1),
            api=social.base_url,
            software="mastodon",
        )
        polls = poller(client, max_pages=3, page_limit=8)
        check = await polls.poll(chain.model_copy(update={"poll": RENUMBERING_CHECK_EVERY}))

    assert started_again(instance, check, "numbered far below the cursor", old + new)


async def test_the_cursor_goes_with_when_it_was_read_on_the_instances_clock(
    client: httpx.AsyncClient,
) -> None:
    # The newest post handled is the cursor whether kept, skipped (its account opted
    # out) or unreadable, and the time of the answer that held it goes with it, as the
    # instance's clock says; a poll that reads nothing new keeps both.
    instance = FediverseInstance.generate(posts=0, seed=3)
    instance.opt_out("bruno")
    hour = 3600.0
    async with served(instance) as social:
        polls = poller(client, max_pages=2, page_limit=4)
        public_local_post(instance)
        skipped = public_local_post(instance, "bruno")
        start = time.time()
        first = await polls.poll(request(social))
        end = time.time()
        instance.clock_ahead = hour
        quiet = await polls.poll(request(social, after=first))
        public_local_post(instance)
        unreadable = public_local_post(instance)
        instance.make_unreadable(unreadable)
        instance.clock_ahead = 2 * hour
        start_last = time.time()
        last = await polls.poll(request(social, after=quiet))
        end_last = time.time()

    assert (first.skipped, len(first.posts)) == (1, 1)
    assert first.cursor_after == skipped.sid
    assert read_between(first, start, end)
    assert (quiet.cursor_after, quiet.cursor_after_at) == (skipped.sid, first.cursor_after_at)
    assert last.cursor_after == unreadable.sid
    assert read_between(last, start_last + 2 * hour, end_last + 2 * hour)


@pytest.mark.parametrize(
    "dated", [datetime(9999, 1, 1, tzinfo=UTC), None], ids=["year-9999", "ten-minutes-ahead"]
)
async def test_remote_posts_dated_ahead_tell_no_new_numbering(
    client: httpx.AsyncClient, dated: datetime | None
) -> None:
    # Mastodon numbers a remote post dated ahead by its arrival and keeps the date: an
    # author's clock ten minutes fast, or a hostile one's year 9999. The cursor among
    # them deleted, an hour later the newest posts all sort before it and say they were
    # made after it was read: the year 9999 no clock has seen, and the ids say when the
    # others came.
    instance = FediverseInstance.generate(posts=0, seed=3)
    remote = f"ines@{REMOTE_HOST}"
    ahead = dated or datetime.now(UTC) + timedelta(minutes=10)
    for _ in range(2):
        instance.add_post("ada", visibility="public", tags=["smallweb"])
    for _ in range(8):
        arrived = instance.add_post(remote, visibility="public", tags=["smallweb"])
        instance.delete_post(arrived)
        instance.add_post_numbered(arrived.id, remote, tags=["smallweb"], created_at=ahead)
    cursor = instance.add_post_numbered(
        max(s.id for s in instance.statuses) + 7, remote, tags=["smallweb"], created_at=ahead
    )
    async with served(instance) as social:
        polls = poller(client, max_pages=3, page_limit=4)
        first = request(social, api=social.base_url, software="mastodon", timeline="tag:smallweb")
        check = await checked_once_deleted(
            instance, social, polls, first, cursor, clock_ahead=3600.0
        )

    assert kept_its_cursor(check, cursor)


async def test_a_late_post_as_the_cursor_deleted_leaves_the_cursor_where_it_was(
    client: httpx.AsyncClient,
) -> None:
    # Software that numbers posts by their arrival: the newest arrival, the cursor, was
    # made half an hour before the posts that came ahead of it (a delivery's delay).
    # Deleted, those posts are the newest, made after the cursor's post, but there when
    # the cursor was read: the same numbering.
    instance = FediverseInstance.generate(posts=0, seed=3, software=("friendica", "2024.12"))
    made = datetime.now(UTC) - timedelta(hours=2)
    for n in range(10):
        instance.add_post_numbered(1000 + n, created_at=made + timedelta(minutes=n))
    late = instance.add_post_numbered(
        1010, f"ines@{REMOTE_HOST}", created_at=made - timedelta(minutes=30)
    )
    async with served(instance) as social:
        polls = poller(client, max_pages=3, page_limit=4)
        first = request(social, api=social.base_url, software="friendica", timeline="public")
        check = await checked_once_deleted(instance, social, polls, first, late)

    assert kept_its_cursor(check, late)


@pytest.mark.parametrize(
    ("at_the_read", "since"),
    [(6 * 3600.0, 0.0), (-3 * 86_400.0, -3 * 86_400.0)],
    ids=["six-hours-ahead-set-right", "days-slow"],
)
async def test_an_instance_installed_again_after_a_read_on_a_clock_off_is_told_by_its_ids(
    client: httpx.AsyncClient, at_the_read: float, since: float
) -> None:
    # The cursor read while the instance's clock ran six hours ahead (its time lies
    # ahead of the posts made after it once the clock is set right), or three days
    # behind (not believed): installed again (numbered from 1), the instance is told
    # by its numbers, far below the cursor's.
    instance = FediverseInstance.generate(posts=0, seed=3)
    for _ in range(5):
        public_local_post(instance)
    instance.clock_ahead = at_the_read
    async with served(instance) as social:
        polls = poller(client, max_pages=3, page_limit=4)
        first = await polls.poll(request(social, api=social.base_url, software="mastodon"))
        assert first.outcome is CrawlOutcome.SUCCESS, first.error_message
        instance.clock_ahead = since
        for status in instance.statuses:
            instance.delete_post(status)
        its_now = datetime.now(UTC) + timedelta(seconds=since)
        fresh = [instance.add_post_numbered(1 + n, created_at=its_now) for n in range(6)]
        chain = request(social, after=first).model_copy(update={"poll": RENUMBERING_CHECK_EVERY})
        check = await polls.poll(chain)

    assert started_again(instance, check, "numbered far below the cursor", fresh)


async def test_a_date_minutes_off_the_applications_clock_tells_no_new_numbering(
    client: httpx.AsyncClient,
) -> None:
    # The instance's proxy says a Date three minutes behind its application's clock,
    # which dates the posts; its newest post deleted, the others were made a minute or
    # two before it was read by the application's clock, after it by the proxy's.
    instance = FediverseInstance.generate(posts=0, seed=3, software=("friendica", "2024.12"))
    now = datetime.now(UTC)
    for n in range(10):
        instance.add_post_numbered(1000 + n, created_at=now - timedelta(seconds=110 - 3 * n))
    newest = instance.add_post_numbered(1010, created_at=now)
    instance.clock_ahead = -180.0
    async with served(instance) as social:
        polls = poller(client, max_pages=3, page_limit=4)
        first = request(social, api=social.base_url, software="friendica")
        an_hour_later = 3600.0 - 180.0
        check = await checked_once_deleted(
            instance, social, polls, first, newest, clock_ahead=an_hour_later
        )

    assert kept_its_cursor(check, newest)


async def test_a_date_days_behind_at_the_read_tells_nothing_once_set_right(
    client: httpx.AsyncClient,
) -> None:
    # The answer that held the cursor came from a host whose clock ran three days
    # behind (started without it); set right, the posts made before the read look made
    # days after it. Not believed at the read, the Date leaves the ids to tell.
    instance = FediverseInstance.generate(posts=0, seed=3, software=("friendica", "2024.12"))
    now = datetime.now(UTC)
    posts = [
        instance.add_post_numbered(100 + n, created_at=now - timedelta(minutes=60 - 5 * n))
        for n in range(10)
    ]
    async with served(instance) as social:
        instance.clock_ahead = -3 * 86_400.0
        polls = poller(client, max_pages=3, page_limit=4)
        first = request(social, api=social.base_url, software="friendica")
        check = await checked_once_deleted(
            instance, social, polls, first, posts[-1], clock_ahead=0.0
        )

    assert kept_its_cursor(check, posts[-1])


@pytest.mark.parametrize("fast", [2 * 3600.0, 2 * 86_400.0], ids=["hours", "days"])
async def test_an_instance_fast_at_the_read_and_set_right_since_keeps_its_cursor(
    client: httpx.AsyncClient, fast: float
) -> None:
    # Its Date and its posts' times ran fast when the cursor was read (hours: believed;
    # days: not, and the page after the cursor tells the time once set right). Set
    # right, its newest post deleted, a check two hours and a quarter later finds the
    # posts made before the read on the fast clock: not made after it.
    instance = FediverseInstance.generate(posts=0, seed=3, software=("friendica", "2024.12"))
    its_now = datetime.now(UTC) + timedelta(seconds=fast)
    posts = [
        instance.add_post_numbered(100 + n, created_at=its_now - timedelta(minutes=60 - 5 * n))
        for n in range(10)
    ]
    async with served(instance) as social:
        instance.clock_ahead = fast
        polls = poller(client, max_pages=3, page_limit=4)
        first = await polls.poll(request(social, api=social.base_url, software="friendica"))
        assert first.cursor_after == posts[-1].sid
        instance.delete_post(posts[-1])
        instance.clock_ahead = 0.0
        quiet = await polls.poll(request(social, after=first))
        later = 2 * 3600.0 + 900.0
        instance.clock_ahead = later
        pods_later = poller(client, max_pages=3, page_limit=4, now=lambda: time.time() + later)
        chain = request(social, after=quiet).model_copy(update={"poll": RENUMBERING_CHECK_EVERY})
        check = await pods_later.poll(chain)

    assert kept_its_cursor(check, posts[-1])


async def test_other_software_with_nothing_posted_yet_is_read_once_it_posts(
    client: httpx.AsyncClient,
) -> None:
    # A check while the new software's timeline is empty finds nothing to start again
    # from; the next, its posts all before the cursor, starts from them.
    instance = FediverseInstance.generate(posts=0, seed=3, software=("friendica", "2024.08"))
    async with served(instance) as social:
        cursor = mastodon_id(21 * 86_400)
        chain = request(social, cursor=cursor, api=social.base_url, software="mastodon")
        polls = poller(client, max_pages=3, page_limit=4)
        events = [await polls.poll(chain.model_copy(update={"poll": RENUMBERING_CHECK_EVERY}))]
        posts = [instance.add_post_numbered(5000 + n) for n in range(3)]
        while events[-1].poll <= 2 * RENUMBERING_CHECK_EVERY or events[-1].more:
            events.append(await polls.poll(request(social, after=events[-1])))
            assert len(events) < 2 * RENUMBERING_CHECK_EVERY, "the chain never caught up"

    assert (events[0].posts, events[0].cursor_after) == ((), cursor)
    read = {uri for event in events for uri in uris(event)}
    assert read == {instance.status_uri(s) for s in posts}


async def test_an_api_that_answered_is_read_whatever_software_nodeinfo_names_later(
    client: httpx.AsyncClient,
) -> None:
    # WordPress with a plugin that serves the Mastodon client API: its NodeInfo failed
    # when the chain began, the API answered, and a later check names the software.
    instance = FediverseInstance.generate(posts=5, seed=3, software=("wordpress", "6.6"))
    async with served(instance) as social:
        polls = poller(client, max_pages=2, page_limit=5)
        chain = request(social, api=social.base_url)
        events = [await polls.poll(chain.model_copy(update={"poll": SOFTWARE_CHECK_EVERY - 1}))]
        added = []
        for _ in range(3):
            added.append(public_local_post(instance))
            events.append(await polls.poll(request(social, after=events[-1])))

    assert all(e.outcome is CrawlOutcome.SUCCESS for e in events), events[-1].error_message
    assert events[1].software == "wordpress"
    assert {e.api for e in events} == {social.base_url}
    read = {uri for event in events[1:] for uri in uris(event)}
    assert read == {instance.status_uri(s) for s in added}


async def test_posts_of_unknown_software_on_a_clock_days_fast_are_no_cursor(
    client: httpx.AsyncClient,
) -> None:
    # Its NodeInfo documents fail, so the software is not known; its clock runs two days
    # fast (too far for its Date to be believed), then NTP puts it right. Taken as the
    # cursor, the post dated ahead would hide every post made for those two days.
    instance = FediverseInstance.generate(posts=0, seed=5)
    instance.fail_nodeinfo(500)
    async with served(instance) as social:
        polls = poller(client, max_pages=2, page_limit=5, backfill=5)
        instance.add_post_numbered(int((time.time() - 3600) * 1000) << 16 | 1)
        instance.clock_ahead = 2 * 86_400.0
        ahead = instance.add_post_numbered(int((time.time() + 2 * 86_400) * 1000) << 16 | 2)
        events = [await polls.poll(request(social))]
        instance.clock_ahead = 0.0
        later = [
            instance.add_post_numbered(int((time.time() + n) * 1000) << 16 | 3 + n)
            for n in range(3)
        ]
        for _ in range(3):
            events.append(await polls.poll(request(social, after=events[-1])))

    assert events[0].software is None
    assert events[0].cursor_after != ahead.sid
    read = {uri for event in events[1:] for uri in uris(event)}
    assert read >= {instance.status_uri(s) for s in later}


async def test_a_page_refused_below_a_first_polls_posts_leaves_the_poll_as_it_was(
    client: httpx.AsyncClient,
) -> None:
    # A first poll of a public timeline reads on below its backfill, to see what the
    # next lookback will; refused there for its query, it has what it came for.
    instance = FediverseInstance.generate(posts=12, seed=7)

    async def robots(url: str) -> bool:
        return "max_id" not in url

    async with served(instance) as social:
        polls = poller(client, max_pages=4, page_limit=4, lookback=86_400.0, robots_allows=robots)
        start = request(social, api=social.base_url, timeline="public")
        event = await polls.poll(start.model_copy(update={"backfill": 1}))

        assert event.outcome is CrawlOutcome.SUCCESS, event.error_message
        assert (event.more, event.stopped_by) == (False, None)
        newest = instance.timeline(local=False)
        assert event.cursor_after == newest[0].sid
        assert event.error_message is not None
        assert "left unseen" in event.error_message


@pytest.mark.parametrize("backfill", [0, 1, 3])
async def test_a_first_poll_reads_back_past_posts_dated_ahead(
    client: httpx.AsyncClient, backfill: int
) -> None:
    # The newest page of a follow's first poll holds nothing but a post dated ahead:
    # reading back stops not there, or the poll would start no cursor and the next
    # one read back as a first poll, past the follow's backfill.
    instance = FediverseInstance.generate(posts=12, seed=7)
    async with served(instance) as social:
        # More than a page of them, whatever the page's size (the backfill's).
        ahead = [instance.add_post_numbered(a_day_ahead() + n) for n in range(4)]
        polls = poller(client, max_pages=4, page_limit=4, backfill=backfill)
        first = request(social, api=social.base_url, software="mastodon").model_copy(
            update={"backfill": backfill}
        )
        event = await polls.poll(first)

        assert event.outcome is CrawlOutcome.SUCCESS, event.error_message
        newest = instance.timeline(local=True)
        ordinary = [s for s in newest if s not in ahead]
        assert event.cursor_after == ordinary[0].sid
        shared = [instance.status_uri(s) for s in ordinary[:backfill] if instance.may_share(s)]
        assert uris(event) == shared


async def test_one_page_of_odd_ids_after_the_cursor_does_not_start_it_again(
    client: httpx.AsyncClient,
) -> None:
    # Only ids of another kind right after the cursor, while the instance's newest posts
    # are numbered as before: one odd page, not other software. Starting again from
    # the newest posts would skip those between.
    instance = FediverseInstance.generate(posts=10, seed=3)
    async with served(instance) as social:
        cursor = instance.timeline(local=True)[0].sid
        added = [public_local_post(instance) for _ in range(9)]
        instance.misbehave("text-ids-after-cursor")
        polls = poller(client, max_pages=2, page_limit=4)
        first = await polls.poll(request(social, cursor=cursor, api=social.base_url))

        assert first.outcome is CrawlOutcome.SUCCESS, first.error_message
        assert first.cursor_after == cursor
        assert first.error_message is not None
        assert "another kind of id" not in first.error_message
        instance.misbehave(None)
        rest = await poller(client, max_pages=5, page_limit=5).poll(request(social, after=first))
        assert sorted(uris(rest)) == sorted(instance.status_uri(s) for s in added)


async def test_endless_pagination_ends_at_the_repeated_page(client: httpx.AsyncClient) -> None:
    instance = FediverseInstance.generate(posts=40, seed=7)
    instance.misbehave("endless")
    async with served(instance) as social:
        event = await poller(client, max_pages=5, page_limit=4).poll(
            request(social, api=social.base_url)
        )

        assert event.outcome is CrawlOutcome.SUCCESS
        assert event.error_message is not None
        assert "already read" in event.error_message
        assert len(api_queries(social)) == 2
        newest = instance.timeline(local=True)[:4]
        assert event.cursor_after == newest[0].sid
        assert len(set(uris(event))) == len(event.posts)


async def test_bottomless_pagination_is_bounded(client: httpx.AsyncClient) -> None:
    instance = FediverseInstance.generate(posts=40, seed=7)
    instance.misbehave("bottomless")
    async with served(instance) as social:
        polls = poller(client, max_pages=3, page_limit=4)
        backfill = await polls.poll(request(social, api=social.base_url))
        cursor = instance.timeline(local=False)[0].sid
        forward = await polls.poll(request(social, cursor=cursor, api=social.base_url))

        assert backfill.outcome is forward.outcome is CrawlOutcome.SUCCESS
        assert backfill.requests == 3  # max_pages, each older than the last
        assert len(set(uris(backfill))) == len(backfill.posts)
        # Past the newest post it serves only older, invented ones: none is taken.
        assert (forward.posts, forward.cursor_after, forward.requests) == ((), cursor, 1)
        assert forward.error_message is not None
        assert "already read" in forward.error_message
        assert len(api_queries(social)) == backfill.requests + forward.requests


async def test_a_hop_gates_broker_trouble_reaches_the_caller_with_its_cause(
    client: httpx.AsyncClient,
) -> None:
    # robots.txt redirected, and the hop's lease failed for the broker's reasons: the
    # fetcher hands that back to the consumer (not counted against the poll), which it
    # can only tell by the cause.
    broker = nats.errors.ConnectionClosedError()

    async def failing(url: str) -> bool:
        raise HopGateFailed("lease of the hop") from broker

    instance = FediverseInstance.generate(posts=10, seed=5)
    async with served(instance) as social:
        with pytest.raises(HopGateFailed) as failed:
            await poller(client, robots_allows=failing).poll(request(social, api=social.base_url))
    assert failed.value.__cause__ is broker


async def test_gate_deferral_ends_the_poll_with_what_it_read(client: httpx.AsyncClient) -> None:
    instance = FediverseInstance.generate(posts=10, seed=5)
    async with served(instance) as social:
        start = instance.timeline(local=True)[0].sid
        added = [public_local_post(instance) for _ in range(9)]
        gate = GapGate(defer_after=2)
        deferred = await poller(client, gate, max_pages=5, page_limit=3).poll(
            request(social, cursor=start, api=social.base_url)
        )
        rest = await poller(client, max_pages=5, page_limit=3).poll(request(social, after=deferred))

        assert deferred.outcome is CrawlOutcome.SUCCESS
        assert deferred.more
        assert deferred.requests == 2
        assert uris(deferred) == [instance.status_uri(s) for s in added[:6]]
        assert deferred.cursor_after == added[5].sid
        assert gate.deferred_for is not None
        assert deferred.retry_after == gate.deferred_for
        assert not deferred.rate_limited  # our own lease's wait, not the instance's
        assert uris(rest) == [instance.status_uri(s) for s in added[6:]]


async def test_robots_txt_waiting_for_the_hosts_slot_ends_the_poll_for_later(
    client: httpx.AsyncClient,
) -> None:
    # The fetcher reads an unknown robots.txt under the host's lease: when the slot is
    # far away, the poll ends (nothing read, the cursor kept) rather than failing.
    async def robots_later(url: str) -> bool:
        raise GateDeferred(30.0)

    instance = FediverseInstance.generate(posts=10, seed=5)
    async with served(instance) as social:
        start = instance.timeline(local=True)[0].sid
        event = await poller(client, robots_allows=robots_later).poll(
            request(social, cursor=start, api=social.base_url)
        )

        assert event.outcome is CrawlOutcome.SUCCESS
        assert event.more
        assert event.cursor_after == start
        assert event.retry_after == 30.0
        assert not event.rate_limited
        assert not api_queries(social)


async def test_robots_refusal_is_blocked_robots_and_the_api_is_never_asked(
    client: httpx.AsyncClient,
) -> None:
    async def no_api(url: str) -> bool:
        return "/api/" not in url

    instance = FediverseInstance.generate(posts=10, seed=5)
    async with served(instance) as social:
        event = await poller(client, robots_allows=no_api).poll(request(social))

        assert event.outcome is CrawlOutcome.BLOCKED_ROBOTS
        assert not api_queries(social)
        assert event.software == "mastodon"
        assert event.cursor_after is None


async def test_an_unreachable_instance_is_a_failed_poll_with_the_cursor_kept(
    client: httpx.AsyncClient,
) -> None:
    instance = FediverseInstance.generate(posts=5, seed=5)
    async with served(instance) as social:
        gone = request(social, cursor="110", api=social.base_url)
    event = await poller(client).poll(gone)

    assert event.outcome is CrawlOutcome.FAILED
    assert (event.cursor_after, event.posts, event.requests) == ("110", (), 1)
    assert event.error_message


async def test_a_poll_meeting_the_nameservers_away_waits_and_goes_on_when_they_answer() -> None:
    # Not a failed poll of the instance: the pod's own nameservers answer nothing, the
    # poll is handed back (``ResolverAway``), and the cursor and the instance are left
    # as they were until a later poll reads them.
    instance = FediverseInstance.generate(posts=8, seed=11)
    with dns_server("127.0.0.62") as names:
        names.down = True
        settings = FetcherSettings(
            allowed_networks=("127.0.0.0/8",),
            dns_nameservers=(names.address,),
            dns_timeout_seconds=0.3,
            dns_recheck_seconds=0.5,
        )
        async with served(instance) as social, build_client(settings) as client:
            names.records[social.host] = ((instance.ip,), 60)
            first = request(social)
            with pytest.raises(ResolverAway):
                await poller(client).poll(first)
            assert social.witness.requests() == []
            assert names.asked(".") >= 1
            asked_while_away = names.asked(social.host)

            names.down = False

            async def poll_once() -> TimelinePolled | None:
                try:
                    return await poller(client).poll(first)
                except ResolverAway:  # still within the recheck: no query, no request
                    return None

            event = await eventually(
                poll_once, until=lambda polled: polled is not None, timeout=10, what="a poll"
            )
            assert event is not None
            assert event.outcome is CrawlOutcome.SUCCESS, event.error_message
            assert names.asked(social.host) > asked_while_away  # asked again, and answered
            assert social.witness.paths(social.host)[:2] == [
                "/.well-known/nodeinfo",
                "/nodeinfo/2.1",
            ]
            assert event.cursor_before is None
            assert uris(event)


@pytest.mark.parametrize(
    ("software", "outcome"),
    [(("lemmy", "0.19.3"), CrawlOutcome.REJECTED), (("newthing", "0.1"), CrawlOutcome.SUCCESS)],
)
async def test_software_without_the_api_is_rejected_and_unknown_software_is_tried(
    client: httpx.AsyncClient, software: tuple[str, str], outcome: CrawlOutcome
) -> None:
    instance = FediverseInstance.generate(posts=10, seed=5, software=software)
    async with served(instance) as social:
        event = await poller(client).poll(request(social))

        assert event.outcome is outcome
        assert (event.software, event.software_version) == software
        assert bool(api_queries(social)) is (outcome is CrawlOutcome.SUCCESS)


@pytest.mark.parametrize("failure", [500, 502, 503])
async def test_a_failing_nodeinfo_document_leaves_the_software_unknown_and_the_api_read(
    client: httpx.AsyncClient, failure: int
) -> None:
    # Its index answers: the instance is up. A document that always fails would else end
    # every poll before the API, for ever, as NodeInfo is asked again until one is read.
    instance = FediverseInstance.generate(posts=10, seed=5)
    instance.fail_nodeinfo(failure)
    async with served(instance) as social:
        polls = poller(client)
        first = await polls.poll(request(social))
        second = await polls.poll(request(social, after=first))

        assert first.outcome is CrawlOutcome.SUCCESS, first.error_message
        assert (first.software, first.api) == (None, social.base_url)
        assert uris(first)
        assert second.outcome is CrawlOutcome.SUCCESS, second.error_message
        paths = social.witness.paths(social.host)
        assert paths[:2] == ["/.well-known/nodeinfo", "/nodeinfo/2.1"]
        assert paths.count("/.well-known/nodeinfo") == 1
        assert len(api_queries(social)) == first.requests - 2 + second.requests


async def test_a_nodeinfo_document_asking_to_slow_down_still_ends_the_poll(
    client: httpx.AsyncClient,
) -> None:
    instance = FediverseInstance.generate(posts=10, seed=5)
    instance.fail_nodeinfo(429)
    async with served(instance) as social:
        event = await poller(client).poll(request(social))

        assert (event.outcome, event.status_code) == (CrawlOutcome.BLOCKED_4XX, 429)
        assert event.api is None
        assert not api_queries(social)


async def test_a_nodeinfo_document_in_maintenance_for_an_hour_ends_the_poll_for_it(
    client: httpx.AsyncClient,
) -> None:
    # A 503 with Retry-After is the instance asking for a wait, not a document that fails.
    instance = FediverseInstance.generate(posts=10, seed=5)
    instance.fail_nodeinfo(503, retry_after=3600)
    async with served(instance) as social:
        event = await poller(client).poll(request(social))

        assert (event.outcome, event.status_code) == (CrawlOutcome.BLOCKED_5XX, 503)
        assert event.retry_after is not None
        assert event.retry_after >= 3000
        assert not api_queries(social)


async def test_the_event_fits_the_message_size_and_the_cursor_covers_what_it_carries(
    client: httpx.AsyncClient,
) -> None:
    instance = FediverseInstance.generate(posts=5, seed=5)
    async with served(instance) as social:
        start = instance.timeline(local=True)[0].sid
        added = [
            instance.add_post(
                "ada",
                links=[f"https://blog{i}.example/{n}/" + "p" * 900 for i in range(120)],
                visibility="public",
                card=False,
            )
            for n in range(6)
        ]
        polls = poller(client, max_pages=3, page_limit=10, max_message_bytes=256 * 1024)
        first = await polls.poll(request(social, cursor=start, api=social.base_url))
        second = await polls.poll(request(social, after=first))

        assert len(first.to_wire()) <= 256 * 1024 - 4096
        assert all(len(post.links) == 100 for post in first.posts)
        assert first.more
        assert 0 < len(first.posts) < len(added)
        assert first.cursor_after == added[len(first.posts) - 1].sid
        assert uris(second)[0] == instance.status_uri(added[len(first.posts)])


def test_the_rows_a_polls_shares_make_fit_its_budget() -> None:
    """Each link of a post is a row of ``page_shares`` repeating the post's uri, URL and
    account: posts of long ids (the instance's to choose) are counted so."""
    budget = 1 << 20
    progress = _Progress(cursor=None, budget=budget)
    long = "https://social.example/" + "x" * 2_000
    posts = [
        SharedPost(
            uri=f"{long}/{n}",
            url=f"{long}/@{n}",
            account="ada@social.example",
            links=tuple(f"https://blog.example/{n}/{k}" for k in range(100)),
        )
        for n in range(60)
    ]
    for post in posts:
        progress.add(post)
    rows = sum(
        len(post.links) * len(f"{post.uri}{post.url}{post.account}".encode())
        for post in progress.posts
    )
    assert 0 < len(progress.posts) < len(posts)
    assert rows <= budget


async def test_a_post_too_big_for_an_event_of_its_own_keeps_the_links_that_fit(
    client: httpx.AsyncClient,
) -> None:
    # At the smallest message size a post of 100 long links is over a whole event.
    instance = FediverseInstance.generate(posts=5, seed=5)
    async with served(instance) as social:
        start = instance.timeline(local=True)[0].sid
        big = big_post(instance)
        polls = poller(client, page_limit=10, max_message_bytes=64 * 1024)
        first = await polls.poll(request(social, cursor=start, api=social.base_url))

        assert len(first.to_wire()) <= 64 * 1024
        (post,) = first.posts
        assert 0 < len(post.links) < 100
        assert first.cursor_after == big.sid
        assert first.error_message is not None
        assert "cut to fit" in first.error_message


def test_entries_of_the_wrong_shape_are_told_from_posts() -> None:
    account = {"acct": "ada", "indexable": True, "discoverable": True}
    good = {
        "id": "110",
        "uri": "https://social.example/users/ada/statuses/110",
        "visibility": "public",
        "account": account,
        "content": '<p><a href="https://blog.example/a">a</a></p>',
        "card": {"url": "https://blog.example/b"},
    }
    assert read_entry(good, host="social.example").verdict == "kept"
    cases: dict[str, Any] = {
        "no account object": {**good, "account": "ada"},
        "no uri": {**good, "uri": None},
        "a list": ["status"],
        "a boolean id": {**good, "id": True},
    }
    for name, entry in cases.items():
        assert read_entry(entry, host="social.example").verdict == "malformed", name
    opted = [
        {**account, "indexable": False},
        {**account, "noindex": True},
        {**account, "discoverable": "false"},
    ]
    for flags in opted:
        assert read_entry({**good, "account": flags}, host="social.example").verdict == "skipped"
    mentions = {
        **good,
        "content": '<a class="u-url mention" href="https://other.example/@bob">@bob</a>'
        '<a class="hashtag" href="https://other.example/tags/x">#x</a>'
        '<a rel="tag" href="https://other.example/tag/y">#y</a>'
        '<a href="https://other.example/people/z">z</a>',
        "mentions": [{"url": "https://other.example/people/z"}],
        "card": None,
    }
    assert (
        read_entry(mentions, host="social.example").post
        == read_entry({**good, "content": "", "card": None}, host="social.example").post
    )
    # A remote server's post names itself with a user:pass@: no URL Trove keeps does.
    spelled = read_entry(
        {
            **good,
            "uri": "https://alice:hunter2@remote.example/users/alice/statuses/1",
            "url": "https://alice:hunter2@remote.example/@alice/1",
        },
        host="social.example",
    ).post
    assert spelled is not None
    assert (spelled.uri, spelled.url) == (
        "https://remote.example/users/alice/statuses/1",
        "https://remote.example/@alice/1",
    )
    # A date a datetime holds only in its own zone: no date, not a poll lost downstream.
    for edge in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"):
        dated = read_entry({**good, "created_at": edge}, host="social.example").post
        assert dated is not None
        assert dated.shared_at is None
    numeric = read_entry({**good, "id": 110, "created_at": 5, "language": 7, "card": []}, host="x")
    assert numeric.id == "110"
    assert numeric.post is not None
    assert numeric.post.links == ("https://blog.example/a",)
    assert numeric.post.account == "ada@x"


def test_a_post_of_unclosed_tags_is_read_in_linear_time_and_keeps_its_links() -> None:
    # html.parser took quadratic time on this (minutes for one post, on the event
    # loop): the suite's timeout is what fails it.
    hostile = '<a href="https://blog.example/kept">k</a>' + "<a " * 85_000
    entry = {
        "id": "111",
        "uri": "https://social.example/users/ada/statuses/111",
        "visibility": "public",
        "account": {"acct": "ada", "indexable": True, "discoverable": True},
        "content": hostile,
    }
    read = read_entry(entry, host="social.example")
    assert read.post is not None
    assert read.post.links == ("https://blog.example/kept",)


def test_ids_compare_as_numbers_when_they_are_digits_and_as_strings_otherwise() -> None:
    assert id_key("10") > id_key("9")
    assert id_key("01HZY8") < id_key("01HZY9")
    assert sorted(["9", "100", "11"], key=id_key) == ["9", "11", "100"]


def test_a_nodeinfo_link_is_followed_only_on_the_instances_host_and_never_down_to_http() -> None:
    def index(href: str) -> dict[str, Any]:
        return {"links": [{"rel": "http://nodeinfo.diaspora.software/ns/schema/2.1", "href": href}]}

    home = "https://social.example"
    assert document_link(index("/nodeinfo/2.1"), home) == f"{home}/nodeinfo/2.1"
    assert document_link(index("http://social.example/nodeinfo/2.1"), home) is None
    assert document_link(index("https://other.example/nodeinfo/2.1"), home) is None
    assert document_link(index("https://social.example/x"), "http://social.example") is not None


def test_an_instances_links_are_followed_without_credentials() -> None:
    # httpx would send a user:pass@ on as Basic auth; Trove logs in nowhere.
    index = {
        "links": [
            {
                "rel": "http://nodeinfo.diaspora.software/ns/schema/2.1",
                "href": "https://u:p@social.example/nodeinfo/2.1",
            }
        ]
    }
    home = "https://social.example"
    assert document_link(index, home) == f"{home}/nodeinfo/2.1"
    here = f"{home}/api/v1/timelines/public?limit=40"
    older = '<https://token@social.example/api/v1/timelines/public?limit=40&max_id=9>; rel="next"'
    assert link_relation(httpx.Headers({"link": older}), "next", here) == f"{here}&max_id=9"


@pytest.mark.parametrize(
    "reset", ["0", "2026-11-30T12:00:00.000Z", "Mon, 30 Nov 2026 12:00:00 GMT"]
)
def test_a_spent_rate_limit_whose_reset_reads_as_past_waits_the_window(reset: str) -> None:
    """A reset at or before now (a "0", a slow clock's date) is no reset to wait for: the
    limit is spent, and a wait of 0 sent the poll back at once, every time."""
    headers = httpx.Headers(
        {"x-ratelimit-limit": "300", "x-ratelimit-remaining": "0", "x-ratelimit-reset": reset}
    )
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert rate_limit_wait(headers, now=now) == DEFAULT_RATE_WINDOW


def test_a_rate_limit_sent_twice_is_read() -> None:
    """An app's headers and its proxy's: joined with a comma they read as no limit, and
    every page of a poll was asked of an instance that said none was left."""
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    reset = "2026-12-01T12:05:00.000Z"
    headers = httpx.Headers(
        [
            ("x-ratelimit-limit", "300"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", reset),
            ("x-ratelimit-limit", "300"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", reset),
        ]
    )
    assert rate_limit_wait(headers, now=now) == 300.0
    assert retry_after_of(headers, now=now) == 300.0
    plenty = httpx.Headers([("x-ratelimit-remaining", "250"), ("x-ratelimit-remaining", "0")])
    assert rate_limit_wait(plenty, now=now) == DEFAULT_RATE_WINDOW  # the fewer left counts
    folded = httpx.Headers({"x-ratelimit-remaining": "0, 0", "x-ratelimit-limit": "300, 300"})
    assert rate_limit_wait(folded, now=now) == DEFAULT_RATE_WINDOW


def test_two_healthy_rate_limits_are_no_spent_one_and_a_spent_pair_waits_its_own_reset() -> None:
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

    def layered(app_left: str, proxy_left: str) -> httpx.Headers:
        return httpx.Headers(
            [
                ("x-ratelimit-limit", "300"),
                ("x-ratelimit-remaining", app_left),
                ("x-ratelimit-reset", "2026-12-01T12:05:00.000Z"),
                ("x-ratelimit-limit", "10000"),
                ("x-ratelimit-remaining", proxy_left),
                ("x-ratelimit-reset", "2026-12-01T13:00:00.000Z"),
            ]
        )

    assert rate_limit_wait(layered("100", "5000"), now=now) is None
    assert rate_limit_wait(layered("0", "5000"), now=now) == 300.0
    assert rate_limit_wait(layered("100", "20"), now=now) == 3600.0


def test_a_retry_after_of_zero_leaves_the_rate_limits_reset_to_wait_for() -> None:
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    headers = httpx.Headers(
        {"retry-after": "0", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "300"}
    )
    assert retry_after_of(headers, now=now) == 300.0
    assert retry_after_of(httpx.Headers({"retry-after": "0"}), now=now) == 0.0
    assert retry_after_of(httpx.Headers({"retry-after": "60"}), now=now) == 60.0


@pytest.mark.parametrize(
    "reset",
    [
        "Mon, 01 Jan 99999999999999999999 00:00:00 GMT",
        "0001-01-01T00:00:00+14:00",
        "9999-12-31T23:59:59-14:00",
        "-5",
        "1e400",
        "x" * 100,
    ],
)
def test_a_hostile_rate_limit_reset_is_a_bounded_wait_not_a_lost_poll(reset: str) -> None:
    """An instance's ``X-RateLimit-Reset`` is a stranger's text: a date past 9999 raised
    out of the poll (the page read thrown away, the limit recorded as a network error)."""
    headers = httpx.Headers({"x-ratelimit-remaining": "0", "x-ratelimit-reset": reset})
    for wait in (rate_limit_wait(headers), retry_after_of(headers)):
        assert wait is None or 0.0 <= wait <= MAX_RETRY_AFTER
    assert rate_limit_wait(headers) is not None  # spent: the API is left alone a while
