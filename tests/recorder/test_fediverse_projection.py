"""Followed instances and page shares: projections of follows and timeline polls."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Connection, inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

from tests.conftest import StackUrls, eventually
from tests.support import query, services
from trove_recorder import projections
from trove_recorder.projections import apply_batch
from trove_recorder.replay import replay
from trove_recorder.retention import Retention, prune_polls, prune_shares
from trove_recorder.retries import RetryPolicy
from trove_schema.bus import Bus
from trove_schema.events import (
    CrawlOutcome,
    Event,
    InstanceFollowed,
    InstanceUnfollowed,
    Provenance,
    SharedPost,
    TimelinePolled,
    account_key,
)
from trove_schema.migrate import alembic_config, upgrade
from trove_schema.settings import RecorderSettings

pytestmark = pytest.mark.usefixtures("clean")

POLICY = RetryPolicy(max_attempts=3, delay_seconds=60.0)
INSTANCE = "https://social.example"
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)

#: The tables follows, unfollows and polls are projected to, and the applied ids.
TABLES = ("instances", "timeline_polls", "instance_unfollows", "page_shares", "projected_events")

#: Every projected column but surrogate ids and row times, for replay's comparison.
CHECKSUMS = {
    "instances": (
        "SELECT md5(string_agg(t::text, '|' ORDER BY t::text)) FROM ("
        "SELECT instance, domain, timeline, follow_id, followed_at, unfollowed_at, max_depth, "
        "software, software_version, software_at, last_poll, last_poll_at, last_outcome, "
        "last_status_code, last_error, polls, posts_seen, links_found, skipped, cursor, "
        "next_poll_after, failing_since FROM instances) t"
    ),
    "page_shares": (
        "SELECT md5(string_agg(t::text, '|' ORDER BY t::text)) FROM ("
        "SELECT url, post_uri, post_url, instance, account, shared_at, language, first_seen_at "
        "FROM page_shares) t"
    ),
}


def follow(timeline: str = "local", at: datetime = T0, **fields: Any) -> InstanceFollowed:
    return InstanceFollowed(
        instance=INSTANCE,
        domain="social.example",
        timeline=timeline,
        occurred_at=at,
        provenance=Provenance(kind="seed", origin="test"),
        **fields,
    )


def unfollow(timeline: str | None = "local", at: datetime = T0) -> InstanceUnfollowed:
    return InstanceUnfollowed(
        instance=INSTANCE,
        domain="social.example",
        timeline=timeline,
        occurred_at=at,
        provenance=Provenance(kind="seed", origin="test"),
    )


def post(n: int, *links: str, account: str = "ada@social.example") -> SharedPost:
    return SharedPost(
        uri=f"{INSTANCE}/users/ada/statuses/{n}",
        url=f"{INSTANCE}/@ada/{n}",
        account=account,
        shared_at=T0 + timedelta(minutes=n),
        language="en",
        links=links,
    )


def polled(
    followed: InstanceFollowed,
    poll: int,
    *posts: SharedPost,
    outcome: CrawlOutcome = CrawlOutcome.SUCCESS,
    **fields: Any,
) -> TimelinePolled:
    ended = followed.occurred_at + timedelta(minutes=poll)
    base: dict[str, Any] = {
        "request_id": f"00000000-0000-0000-0000-{poll:012d}",
        "instance": INSTANCE,
        "domain": "social.example",
        "timeline": followed.timeline,
        "follow_id": followed.id,
        "poll": poll,
        "outcome": outcome,
        "started_at": ended - timedelta(seconds=1),
        "completed_at": ended,
        "software": "mastodon",
        "software_version": "4.3.2",
        "cursor_before": str(poll - 1) if poll > 1 else None,
        "cursor_after": str(poll),
        "posts": posts,
        "requests": 1,  # a poll deferred for its host's slot asks nothing: none here
    }
    base.update(fields)
    return TimelinePolled(**base)


async def project(engine: AsyncEngine, *events: Event) -> list[bool]:
    """Each event in a transaction of its own; whether it was new."""
    sessions = async_sessionmaker(engine)
    applied = []
    for event in events:
        async with sessions.begin() as session:
            applied.append((await apply_batch(session, [event], POLICY)).count == 1)
    return applied


async def project_batch(engine: AsyncEngine, events: Sequence[Event]) -> None:
    async with async_sessionmaker(engine).begin() as session:
        await apply_batch(session, events, POLICY)


async def forget(engine: AsyncEngine) -> None:
    """The fediverse's projections emptied, as before any event."""
    async with engine.begin() as conn:
        await conn.execute(text(f"TRUNCATE {', '.join(TABLES)}"))


async def rows(engine: AsyncEngine) -> list[Any]:
    """Every projected column of every ``instances`` row, by instance and timeline."""
    return list(
        await query(
            engine,
            "SELECT instance, timeline, domain, follow_id, followed_at, unfollowed_at, max_depth, "
            "software, software_version, software_at, last_poll, last_poll_at, last_outcome, "
            "last_status_code, last_error, polls, posts_seen, links_found, skipped, cursor, "
            "next_poll_after, failing_since FROM instances ORDER BY instance, timeline",
        )
    )


async def rows_after(engine: AsyncEngine, events: Sequence[Event]) -> list[Any]:
    """The rows ``events`` leave, applied in this order (a transaction each) from nothing."""
    await forget(engine)
    await project(engine, *events)
    return await rows(engine)


async def instance(engine: AsyncEngine, timeline: str = "local") -> Any:
    (row,) = await query(engine, "SELECT * FROM instances WHERE timeline = :t", t=timeline)
    return row


async def shares(engine: AsyncEngine) -> list[tuple[str, str]]:
    rows = await query(engine, "SELECT url, post_uri FROM page_shares ORDER BY url, post_uri")
    return [(r.url, r.post_uri) for r in rows]


async def checksums(engine: AsyncEngine) -> dict[str, str | None]:
    async with engine.connect() as conn:
        return {
            name: (await conn.execute(text(sql))).scalar_one() for name, sql in CHECKSUMS.items()
        }


async def test_a_followed_timeline_counts_its_polls_and_records_each_share(
    engine: AsyncEngine,
) -> None:
    followed = follow(max_depth=2)
    await project(
        engine,
        followed,
        polled(
            followed,
            1,
            post(1, "https://a.example/", "https://b.example/x"),
            post(2),
            skipped=3,
        ),
        polled(followed, 2, post(3, "https://a.example/")),
    )

    row = await instance(engine)
    assert (row.instance, row.domain, row.timeline, str(row.follow_id)) == (
        INSTANCE,
        "social.example",
        "local",
        followed.id,
    )
    assert (row.followed_at, row.unfollowed_at, row.max_depth) == (T0, None, 2)
    assert (row.software, row.software_version, row.cursor) == ("mastodon", "4.3.2", "2")
    assert (row.polls, row.last_poll, row.posts_seen, row.links_found, row.skipped) == (
        2,
        2,
        3,
        3,
        3,
    )
    assert (row.last_outcome, row.last_error, row.failing_since) == ("success", None, None)
    assert row.last_poll_at == T0 + timedelta(minutes=2)
    assert await shares(engine) == [
        ("https://a.example/", f"{INSTANCE}/users/ada/statuses/1"),
        ("https://a.example/", f"{INSTANCE}/users/ada/statuses/3"),
        ("https://b.example/x", f"{INSTANCE}/users/ada/statuses/1"),
    ]
    (share,) = await query(engine, "SELECT * FROM page_shares WHERE url = 'https://b.example/x'")
    assert (share.post_url, share.instance, share.account, share.language) == (
        f"{INSTANCE}/@ada/1",
        INSTANCE,
        "ada@social.example",
        "en",
    )
    assert (share.shared_at, share.first_seen_at) == (
        T0 + timedelta(minutes=1),
        T0 + timedelta(minutes=1),
    )


async def test_a_follow_whose_id_is_not_a_uuid_counts_its_polls(engine: AsyncEngine) -> None:
    # A stranger's producer: its polls name the follow by the same text.
    followed = follow(id="follow of social.example/local")
    events = (followed, polled(followed, 1), polled(followed, 2, outcome=CrawlOutcome.TIMEOUT))
    assert await project(engine, *events, events[1]) == [True, True, True, False]
    row = await instance(engine)
    assert (row.polls, row.last_poll, row.last_outcome) == (2, 2, "timeout")
    assert row.failing_since == events[2].completed_at


async def test_a_poll_delivered_again_or_made_again_counts_once(engine: AsyncEngine) -> None:
    followed = follow()
    first = polled(followed, 1, post(1, "https://a.example/"), skipped=1)
    # The same poll made a second time (its request redelivered) carries another id, and
    # ends later.
    again = polled(
        followed,
        1,
        post(1, "https://a.example/"),
        post(2, "https://b.example/"),
        started_at=first.completed_at,
        completed_at=first.completed_at + timedelta(seconds=30),
    )
    assert again.id != first.id

    assert await project(engine, followed, first, first, again) == [True, True, False, True]

    row = await instance(engine)
    assert (row.polls, row.posts_seen, row.links_found, row.skipped) == (1, 1, 1, 1)
    # The post the second try saw is a share all the same: shares are keyed, not counted.
    assert len(await shares(engine)) == 2


async def test_failing_polls_say_since_when_and_why_and_a_retry_after_pauses(
    engine: AsyncEngine,
) -> None:
    followed = follow()
    await project(
        engine,
        followed,
        polled(followed, 1, post(1, "https://a.example/")),
        polled(
            followed,
            2,
            outcome=CrawlOutcome.BLOCKED_5XX,
            status_code=503,
            error_message="HTTP 503",
            cursor_after="1",
        ),
        polled(followed, 3, outcome=CrawlOutcome.TIMEOUT, error_message=None, cursor_after="1"),
    )
    row = await instance(engine)
    assert row.failing_since == T0 + timedelta(minutes=2)  # the first failure of the run
    assert (row.last_outcome, row.last_error, row.cursor) == ("timeout", "timeout", "1")

    await project(
        engine,
        polled(
            followed,
            4,
            outcome=CrawlOutcome.BLOCKED_4XX,
            status_code=429,
            error_message="HTTP 429",
            retry_after=120.0,
            cursor_after="1",
        ),
    )
    row = await instance(engine)
    assert row.next_poll_after == T0 + timedelta(minutes=4, seconds=120)
    assert (row.last_status_code, row.last_error) == (429, "HTTP 429")

    await project(engine, polled(followed, 5, post(5, "https://c.example/")))
    row = await instance(engine)
    assert (row.failing_since, row.next_poll_after, row.last_error, row.cursor) == (
        None,
        None,
        None,
        "5",
    )
    assert (row.polls, row.posts_seen) == (5, 2)


async def test_unfollow_and_follow_again_start_a_new_chain(engine: AsyncEngine) -> None:
    followed = follow()
    tagged = follow("tag:smallweb")
    later = T0 + timedelta(hours=1)
    await project(engine, followed, tagged, polled(followed, 1, post(1, "https://a.example/")))
    await project(engine, unfollow("local", later))
    assert (await instance(engine)).unfollowed_at == later
    assert (await instance(engine, "tag:smallweb")).unfollowed_at is None

    again = follow(at=later + timedelta(minutes=1))
    await project(engine, again, polled(again, 1, post(2, "https://b.example/")))
    row = await instance(engine)
    assert (str(row.follow_id), row.unfollowed_at, row.followed_at) == (
        again.id,
        None,
        again.occurred_at,
    )
    # Poll 1 of the new chain counts; the counters go on across follows.
    assert (row.last_poll, row.polls, row.posts_seen) == (1, 2, 2)

    # An unfollow older than the current follow changes nothing. A poll of the old chain
    # (under way when it was unfollowed) was made: it counts, whatever order it is applied
    # in, and leaves the new chain's columns alone. An unfollow without a timeline ends
    # every timeline of the instance.
    await project(
        engine, unfollow("local", later), polled(followed, 2, post(3, "https://c.example/"))
    )
    row = await instance(engine)
    assert row.unfollowed_at is None
    assert (row.last_poll, row.cursor, row.polls, row.posts_seen) == (1, "1", 3, 3)
    end = later + timedelta(hours=1)
    await project(engine, unfollow(None, end))
    rows = await query(engine, "SELECT timeline, unfollowed_at FROM instances ORDER BY timeline")
    assert [(r.timeline, r.unfollowed_at) for r in rows] == [("local", end), ("tag:smallweb", end)]


async def test_an_unfollow_of_a_tag_ends_its_follow_whatever_the_case(
    engine: AsyncEngine,
) -> None:
    # Discovery stops `tag:Python` for `trove unfollow --timeline tag:python`.
    await project(engine, follow("tag:Python"), unfollow("tag:python", at=T0 + timedelta(hours=1)))

    row = await instance(engine, "tag:Python")
    assert row.unfollowed_at == T0 + timedelta(hours=1)


async def test_a_post_seen_twice_is_one_share_that_keeps_its_earliest_sighting(
    engine: AsyncEngine,
) -> None:
    local, public = follow("local"), follow("public")
    shared = post(1, "https://a.example/", "https://a.example/")
    early = polled(local, 1, shared)
    late = polled(public, 3, shared, shared)
    # In either order (several recorders, or a replay, may apply them either way).
    for order in ((early, late), (late, early)):
        await forget(engine)
        await project(engine, local, public, *order)

        rows = await query(engine, "SELECT url, instance, first_seen_at FROM page_shares")
        assert [tuple(r) for r in rows] == [("https://a.example/", INSTANCE, early.completed_at)]


async def test_an_account_that_opted_out_has_its_earlier_shares_withdrawn(
    engine: AsyncEngine,
) -> None:
    local, public = follow("local"), follow("public")
    ada, bruno = "ada@social.example", "bruno@social.example"
    before = polled(
        local, 1, post(1, "https://a.example/"), post(2, "https://b.example/", account=bruno)
    )
    # Ada opted out since: the next poll skips her posts and names her by her key.
    withdrawing = polled(local, 2, withdrawn=(account_key(ada), account_key("x@y.example")))
    # She opts in again, and shares after it: that share is hers to keep, also from a
    # poll that ended before it and is applied after it (another timeline's).
    again = polled(local, 3, post(3, "https://c.example/"))
    late = polled(public, 2, withdrawn=(account_key(ada),))
    kept = [
        ("https://b.example/", f"{INSTANCE}/users/ada/statuses/2"),
        ("https://c.example/", f"{INSTANCE}/users/ada/statuses/3"),
    ]
    await project(engine, local, public, before, withdrawing, again, late)
    assert await shares(engine) == kept
    # A replay of the record rebuilds the same.
    await forget(engine)
    await project_batch(engine, [local, public, before, withdrawing, again, late])
    assert await shares(engine) == kept


async def test_the_tables_do_not_depend_on_how_the_stream_is_cut_into_batches(
    engine: AsyncEngine,
) -> None:
    followed = follow()
    again = follow(at=T0 + timedelta(hours=1))
    stream: list[Event] = [
        followed,
        polled(followed, 1, post(1, "https://a.example/")),
        unfollow("local", T0 + timedelta(minutes=30)),
        again,
        polled(again, 1, post(2, "https://b.example/"), skipped=2),
        polled(again, 2, outcome=CrawlOutcome.FAILED, error_message="connection reset"),
    ]
    await project(engine, *stream)
    one_by_one = await checksums(engine)
    await forget(engine)

    await project_batch(engine, stream)

    assert await checksums(engine) == one_by_one
    row = await instance(engine)
    assert (row.unfollowed_at, row.polls, row.last_poll, row.skipped) == (None, 3, 2, 2)
    assert row.last_error == "connection reset"


async def test_the_recorder_projects_polls_once_and_replay_rebuilds_the_same_tables(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path, scratch_database: str
) -> None:
    followed = follow(at=datetime.now(UTC))
    polls = [
        polled(followed, 1, post(1, "https://a.example/"), post(2, "https://b.example/")),
        polled(followed, 2, post(3, "https://a.example/"), skipped=1),
    ]
    async with services(stack, state_dir, {}, only=("recorder",)):
        for event in (followed, *polls):
            await bus.publish(event)
        # The second poll made again after its request was redelivered: another id.
        await bus.publish(polled(followed, 2, post(3, "https://a.example/"), skipped=1))
        await bus.publish(unfollow("public"))  # no such timeline: nothing to change

        async def seen() -> int:
            (row,) = await query(engine, "SELECT count(*) AS n FROM projected_events")
            return int(row.n)

        await eventually(seen, until=lambda n: n == 5, timeout=30, what="five events projected")
    row = await instance(engine)
    assert (row.polls, row.posts_seen, row.links_found, row.skipped) == (2, 3, 3, 1)
    assert len(await shares(engine)) == 3
    live = await checksums(engine)

    stats = await replay(stack.nats_url, scratch_database, POLICY)

    assert stats.applied == 5
    target = create_async_engine(scratch_database)
    try:
        assert await checksums(target) == live
    finally:
        await target.dispose()


async def test_a_poll_applied_before_its_follow_keeps_its_counts(engine: AsyncEngine) -> None:
    followed = follow(max_depth=1)
    await project(engine, polled(followed, 1, post(1, "https://a.example/")), followed)

    row = await instance(engine)
    assert (str(row.follow_id), row.followed_at, row.max_depth) == (followed.id, T0, 1)
    assert (row.polls, row.last_poll, row.links_found, row.cursor) == (1, 1, 1, "1")


async def test_migration_0007_goes_down_and_up_again(scratch_database: str) -> None:
    def tables(connection: Connection) -> set[str]:
        return set(inspect(connection).get_table_names())

    db = create_async_engine(scratch_database)
    try:
        await asyncio.to_thread(upgrade, scratch_database, "0007")
        async with db.connect() as conn:
            assert {"instances", "page_shares"} <= await conn.run_sync(tables)
        await asyncio.to_thread(command.downgrade, alembic_config(scratch_database), "0006")
        async with db.connect() as conn:
            assert not {"instances", "page_shares"} & await conn.run_sync(tables)
        await asyncio.to_thread(upgrade, scratch_database, "0007")
        async with db.connect() as conn:
            indexes = {
                ix["name"]: ix
                for ix in await conn.run_sync(lambda c: inspect(c).get_indexes("page_shares"))
            }
        assert indexes["uq_page_shares_url_post_uri"]["unique"]
    finally:
        await db.dispose()


# Each recorder applies two batches at once, and a batch handed back (a lost race, the
# database away) commits after later ones: events reach the tables in another order than
# the stream's.


async def test_an_unfollow_applied_before_its_follow_still_ends_it(engine: AsyncEngine) -> None:
    local, public = follow("local"), follow("public", at=T0 + timedelta(minutes=1))
    stop = unfollow("local", T0 + timedelta(minutes=30))
    stop_all = unfollow(None, T0 + timedelta(hours=1))
    in_order = await rows_after(engine, [local, public, stop, stop_all])
    assert [(r.timeline, r.unfollowed_at) for r in in_order] == [
        ("local", stop.occurred_at),  # its first unfollow: the one of every timeline after
        ("public", stop_all.occurred_at),
    ]

    assert await rows_after(engine, [stop_all, stop, public, local]) == in_order
    assert await rows_after(engine, [stop, local, stop_all, public]) == in_order


async def test_a_follow_again_and_its_unfollow_applied_the_other_way_round_end_unfollowed(
    engine: AsyncEngine,
) -> None:
    first, again = follow(), follow(at=T0 + timedelta(hours=1))
    stop_first = unfollow("local", T0 + timedelta(minutes=30))
    stop_again = unfollow("local", T0 + timedelta(hours=2))
    in_order = await rows_after(engine, [first, stop_first, again, stop_again])
    (row,) = in_order
    assert (str(row.follow_id), row.unfollowed_at) == (again.id, stop_again.occurred_at)

    assert await rows_after(engine, [first, stop_first, stop_again, again]) == in_order
    assert await rows_after(engine, [stop_again, again, stop_first, first]) == in_order


async def test_a_poll_applied_before_its_follow_again_counts_and_shows(
    engine: AsyncEngine,
) -> None:
    first, again = follow(), follow(at=T0 + timedelta(hours=1))
    stream: list[Event] = [
        first,
        polled(first, 1, post(1, "https://a.example/")),
        unfollow("local", T0 + timedelta(minutes=30)),
        again,
        polled(again, 1, post(2, "https://b.example/"), cursor_after="7", software="gotosocial"),
    ]
    in_order = await rows_after(engine, stream)
    (row,) = in_order
    assert (str(row.follow_id), row.last_poll, row.cursor, row.software) == (
        again.id,
        1,
        "7",
        "gotosocial",
    )
    assert (row.polls, row.posts_seen, row.unfollowed_at) == (2, 2, None)

    first_, poll, stop, again_, poll_again = stream
    assert await rows_after(engine, [first_, poll, stop, poll_again, again_]) == in_order
    assert await rows_after(engine, [poll_again, poll, again_, stop, first_]) == in_order


async def test_polls_applied_out_of_order_each_count_once(engine: AsyncEngine) -> None:
    followed = follow()
    ok = polled(followed, 1, post(1, "https://a.example/"), skipped=1)
    reset = polled(
        followed, 2, outcome=CrawlOutcome.FAILED, error_message="connection reset", cursor_after="1"
    )
    slow = polled(followed, 3, outcome=CrawlOutcome.TIMEOUT, cursor_after="1")
    # Poll 3 made again (its request redelivered): it ended later, and saw a post.
    slow_again = polled(
        followed,
        3,
        post(3, "https://c.example/"),
        started_at=slow.completed_at,
        completed_at=slow.completed_at + timedelta(seconds=30),
    )
    in_order = await rows_after(engine, [followed, ok, reset, slow, slow_again])
    (row,) = in_order
    assert (row.polls, row.posts_seen, row.links_found, row.skipped) == (3, 1, 1, 1)
    assert (row.last_poll, row.last_outcome, row.cursor) == (3, "timeout", "1")
    assert row.failing_since == reset.completed_at  # the first failure after the success

    for order in (
        [followed, slow, reset, ok, slow_again],
        [slow_again, followed, slow, ok, reset],
        [reset, slow_again, ok, slow, followed],
    ):
        assert await rows_after(engine, order) == in_order, [type(e).__name__ for e in order]


def timeline_history() -> list[Event]:
    """Two timelines of an instance over three hours, in stream order: a follow, polls,
    a poll made twice, an unfollow with a poll under way, a follow again whose polls fail,
    and an unfollow of every timeline."""
    first = follow(max_depth=1)
    tag = follow("tag:smallweb", at=T0 + timedelta(minutes=1))
    again = follow(at=T0 + timedelta(hours=1), max_depth=2)
    late = T0 + timedelta(minutes=31)
    return [
        first,
        tag,
        polled(first, 1, post(1, "https://a.example/", "https://b.example/"), skipped=2),
        polled(tag, 1, post(2, "https://a.example/")),
        polled(first, 2, post(3, "https://c.example/"), software_version="4.3.3"),
        polled(
            first,
            2,
            post(3, "https://c.example/"),
            post(4, "https://d.example/"),
            started_at=T0 + timedelta(minutes=2, seconds=5),
            completed_at=T0 + timedelta(minutes=2, seconds=40),
        ),
        unfollow("local", T0 + timedelta(minutes=30)),
        polled(first, 3, post(5, "https://e.example/"), started_at=late, completed_at=late),
        again,
        polled(again, 1, post(6, "https://f.example/"), software="mastodon"),
        polled(
            again,
            2,
            outcome=CrawlOutcome.BLOCKED_5XX,
            status_code=503,
            error_message="HTTP 503",
            retry_after=120.0,
            cursor_after="1",
        ),
        polled(again, 3, outcome=CrawlOutcome.TIMEOUT, cursor_after="1"),
        unfollow(None, T0 + timedelta(hours=3)),
    ]


async def test_any_order_in_any_batches_gives_the_rows_a_replay_gives(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, scratch_database: str
) -> None:
    stream = timeline_history()
    for event in stream:
        await bus.publish(event)
    await replay(stack.nats_url, scratch_database, POLICY)
    target = create_async_engine(scratch_database)
    try:
        replayed, replayed_sums = await rows(target), await checksums(target)
    finally:
        await target.dispose()
    local, tag = replayed
    assert (local.timeline, local.unfollowed_at, local.max_depth) == (
        "local",
        T0 + timedelta(hours=3),
        2,
    )
    assert (local.polls, local.posts_seen, local.links_found, local.skipped) == (6, 4, 5, 2)
    assert (local.last_poll, local.last_outcome, local.software) == (3, "timeout", "mastodon")
    assert local.failing_since == T0 + timedelta(hours=1, minutes=2)
    assert (tag.timeline, tag.unfollowed_at, tag.polls) == (
        "tag:smallweb",
        T0 + timedelta(hours=3),
        1,
    )

    shuffle = random.Random(20261130)
    for attempt in range(12):
        order = shuffle.sample(stream, len(stream))
        cuts = sorted(shuffle.sample(range(1, len(order)), 4))
        batches = [order[a:b] for a, b in zip([0, *cuts], [*cuts, len(order)], strict=True)]
        await forget(engine)
        if attempt % 2:
            # Batches at once: an instance's rows are written by one of them at a time.
            await asyncio.gather(*(project_batch(engine, batch) for batch in batches))
        else:
            for batch in batches:
                await project_batch(engine, batch)
        assert await rows(engine) == replayed, [type(e).__name__ for e in order]
        assert await checksums(engine) == replayed_sums


async def test_migration_0012_keeps_what_the_rows_held(scratch_database: str) -> None:
    gone, failing = follow("public"), follow()
    await asyncio.to_thread(upgrade, scratch_database, "0011")
    db = create_async_engine(scratch_database)
    try:
        async with db.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO instances (instance, domain, timeline, follow_id, followed_at, "
                    "unfollowed_at, software, software_version, last_poll, last_poll_at, "
                    "last_outcome, polls, cursor, failing_since) VALUES "
                    "(:i, 'social.example', 'public', :gone, :t0, :t1, 'mastodon', '4.3.2', 2, "
                    ":t2, 'success', 2, '2', NULL), "
                    "(:i, 'social.example', 'local', :failing, :t0, NULL, 'mastodon', '4.3.2', 5, "
                    ":t5, 'timeout', 5, '5', :t3)"
                ),
                {
                    "i": INSTANCE,
                    "gone": gone.id,
                    "failing": failing.id,
                    "t0": T0,
                    "t1": T0 + timedelta(hours=1),
                    **{f"t{n}": T0 + timedelta(minutes=n) for n in (2, 3, 5)},
                },
            )
        await asyncio.to_thread(upgrade, scratch_database, "head")

        # A poll of the unfollowed follow (under way when it ended), the next failure of
        # the other, and its last poll before the upgrade made again.
        await project(
            db,
            polled(gone, 3),
            polled(failing, 6, outcome=CrawlOutcome.TIMEOUT, cursor_after="5"),
            polled(
                failing,
                5,
                outcome=CrawlOutcome.TIMEOUT,
                completed_at=T0 + timedelta(minutes=5, seconds=30),
                software=None,
            ),
        )
        public, local = await query(db, "SELECT * FROM instances ORDER BY timeline DESC")
        assert (public.unfollowed_at, public.polls, public.last_poll) == (
            T0 + timedelta(hours=1),
            3,
            3,
        )
        assert (local.failing_since, local.polls, local.last_poll) == (
            T0 + timedelta(minutes=3),
            6,
            6,
        )
        assert (local.software, local.software_version) == ("mastodon", "4.3.2")
    finally:
        await db.dispose()


async def test_the_polls_a_timelines_row_no_longer_needs_leave_after_a_week(
    engine: AsyncEngine,
) -> None:
    # Polls 1-3 succeed, 4-5 fail; an earlier follow, replaced, polled once. A week
    # after them, what the row is worked out from stays: the newest success and after.
    earlier, followed = follow(at=T0 - timedelta(days=1)), follow()
    await project(engine, earlier, polled(earlier, 1), followed)
    await project(
        engine, *(polled(followed, n, post(n, f"https://{n}.example/")) for n in (1, 2, 3))
    )
    for n in (4, 5):
        await project(engine, polled(followed, n, outcome=CrawlOutcome.TIMEOUT, cursor_after="3"))
    before = await instance(engine)
    await projected_as_they_came(engine)
    sessions = async_sessionmaker(engine)
    retention = Retention(window=timedelta(days=90), batch=2)

    assert await prune_polls(sessions, retention, now=lambda: T0 + timedelta(days=6)) == 0
    assert await prune_polls(sessions, retention, now=lambda: T0 + timedelta(days=8)) == 3
    kept = await query(engine, "SELECT follow_id, poll FROM timeline_polls ORDER BY poll")
    assert [(str(r.follow_id), r.poll) for r in kept] == [(followed.id, n) for n in (3, 4, 5)]
    # The row reads the same, and a poll made again within the window still counts once.
    await project(engine, polled(followed, 5, outcome=CrawlOutcome.TIMEOUT, cursor_after="3"))
    await project(engine, polled(followed, 6, outcome=CrawlOutcome.TIMEOUT, cursor_after="3"))
    after = await instance(engine)
    assert after.failing_since == before.failing_since == T0 + timedelta(minutes=4)
    assert (after.polls, after.posts_seen) == (before.polls + 1, before.posts_seen)


async def projected_as_they_came(engine: AsyncEngine) -> None:
    """The polls projected when they were made, as a recorder keeping up does: the
    test's week passes for the projection too."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE projected_events e SET projected_at = t.completed_at "
                "FROM timeline_polls t WHERE t.event_id = e.event_id"
            )
        )


async def test_old_polls_projected_just_now_stay_for_a_copy_that_comes_later(
    engine: AsyncEngine,
) -> None:
    # A replay (or a recorder a week behind) projects polls made weeks ago; a pass then
    # deleted the first, and a copy of it further on in the record (its request
    # answered twice) was counted again: the counters were the pass's timing, not the
    # record's.
    followed = follow()
    await project(
        engine,
        followed,
        *(polled(followed, n, post(n, f"https://{n}.example/")) for n in (1, 2)),
    )
    before = await instance(engine)
    sessions = async_sessionmaker(engine)
    retention = Retention(window=timedelta(days=90), batch=2)
    assert await prune_polls(sessions, retention, now=lambda: T0 + timedelta(days=30)) == 0
    await project(engine, polled(followed, 1, post(1, "https://1.example/")))
    after = await instance(engine)
    assert (after.polls, after.posts_seen) == (before.polls, before.posts_seen) == (2, 2)


async def test_a_poll_that_asked_nothing_ends_no_run_of_failures_and_leaves_none_early(
    engine: AsyncEngine,
) -> None:
    # Poll 1 a 403; polls 2 and 3 deferred for the host's slot (a success, no request).
    followed = follow()
    await project(
        engine,
        followed,
        polled(followed, 1, outcome=CrawlOutcome.BLOCKED_4XX, status_code=403, cursor_after=None),
        *(
            polled(followed, n, requests=0, cursor_after=None, retry_after=3600.0 * n)
            for n in (2, 3)
        ),
    )
    row = await instance(engine)
    assert row.failing_since == T0 + timedelta(minutes=1)
    assert (row.last_poll, row.last_outcome, row.last_status_code) == (1, "blocked_4xx", 403)
    assert row.next_poll_after == T0 + timedelta(minutes=3, hours=3)  # the newest poll's
    # Kept as the successes the events say, which the release before reads as it did.
    kept = await query(
        engine,
        "SELECT poll, outcome, unasked_event = event_id AS unasked FROM timeline_polls "
        "ORDER BY poll",
    )
    assert [(r.poll, r.outcome, r.unasked) for r in kept] == [
        (1, "blocked_4xx", None),
        (2, "success", True),
        (3, "success", True),
    ]
    # A week on, the failure the row is worked out from stays.
    await projected_as_they_came(engine)
    sessions = async_sessionmaker(engine)
    retention = Retention(window=timedelta(days=90), batch=2)
    assert await prune_polls(sessions, retention, now=lambda: T0 + timedelta(days=8)) == 0
    await project(engine, polled(followed, 4, requests=0, cursor_after=None))
    assert (await instance(engine)).failing_since == T0 + timedelta(minutes=1)


async def test_a_copy_of_a_poll_the_release_before_writes_in_place_of_one_that_asked_nothing(
    engine: AsyncEngine,
) -> None:
    # The same poll made twice (its request redelivered): this release applied the copy
    # deferred for its host's slot; the release before, beside it in a rolling upgrade,
    # writes the copy that ended first, which asked and was answered. Its statement sets
    # the columns it knows, the event id among them, and nothing of 0018's.
    followed = follow()
    refused = polled(followed, 1, outcome=CrawlOutcome.BLOCKED_4XX, cursor_after=None)
    await project(engine, followed, refused, polled(followed, 2, requests=0, cursor_after=None))
    assert (await instance(engine)).failing_since == T0 + timedelta(minutes=1)
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "UPDATE timeline_polls SET event_id = :other, posts = 1 WHERE poll = 2",
            ),
            {"other": uuid.uuid4()},
        )
    await project(engine, polled(followed, 3, requests=0, cursor_after=None))
    row = await instance(engine)
    assert (row.failing_since, row.last_poll, row.last_outcome) == (None, 2, "success")


async def test_an_unfollow_a_recorder_before_0012_applied_holds_when_a_late_poll_comes(
    engine: AsyncEngine,
) -> None:
    # The release before kept an unfollow on the row alone; a poll in flight at the
    # unfollow is applied by this one after it.
    followed = follow()
    await project(engine, followed, polled(followed, 1))
    gone = T0 + timedelta(minutes=90)
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE instances SET unfollowed_at = :at"), {"at": gone})
    await project(engine, polled(followed, 2))
    row = await instance(engine)
    assert (row.unfollowed_at, row.polls) == (gone, 2)
    # A follow again takes the row, followed.
    again = follow(at=T0 + timedelta(hours=2))
    await project(engine, again)
    assert (await instance(engine)).unfollowed_at is None


async def test_shares_leave_after_their_window_when_one_is_set(engine: AsyncEngine) -> None:
    followed = follow()
    await project(
        engine,
        followed,
        polled(followed, 1, post(1, "https://old.example/")),
        polled(followed, 2000, post(2, "https://new.example/")),  # 2,000 minutes on
    )
    sessions = async_sessionmaker(engine)
    later = T0 + timedelta(days=2)
    kept_for_ever = Retention(window=timedelta(days=90), batch=1)
    assert await prune_shares(sessions, kept_for_ever, now=lambda: later) == 0
    a_day = Retention.from_settings(
        RecorderSettings(shares_retention_seconds=86_400, audit_prune_batch=1)
    )
    assert await prune_shares(sessions, a_day, now=lambda: later) == 1
    assert await shares(engine) == [("https://new.example/", f"{INSTANCE}/users/ada/statuses/2")]


async def test_a_poll_of_more_shares_than_a_statement_writes_has_every_one_kept(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shares are written a thousand rows a statement (each repeats its post's uri, URL
    and account): a poll of more is written in several, every share kept once."""
    monkeypatch.setattr(projections, "SHARES_A_STATEMENT", 7)
    await forget(engine)
    followed = follow()
    posts = [post(n, *(f"https://blog.example/{n}/{k}" for k in range(5))) for n in range(5)]
    await project(engine, followed, polled(followed, 1, *posts, posts[0]))
    expected = sorted((link, p.uri) for p in posts for link in p.links)
    assert await shares(engine) == expected
