"""Followed instances and page shares: projections of follows and timeline polls."""

from __future__ import annotations

import asyncio
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
from trove_recorder.projections import apply_batch
from trove_recorder.replay import replay
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
)
from trove_schema.migrate import alembic_config, upgrade

pytestmark = pytest.mark.usefixtures("clean")

POLICY = RetryPolicy(max_attempts=3, delay_seconds=60.0)
INSTANCE = "https://social.example"
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)

#: Every projected column but surrogate ids and row times, for replay's comparison.
CHECKSUMS = {
    "instances": (
        "SELECT md5(string_agg(t::text, '|' ORDER BY t::text)) FROM ("
        "SELECT instance, domain, timeline, follow_id, followed_at, unfollowed_at, max_depth, "
        "software, software_version, last_poll, last_poll_at, last_outcome, last_status_code, "
        "last_error, polls, posts_seen, links_found, skipped, cursor, next_poll_after, "
        "failing_since FROM instances) t"
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


async def test_a_poll_delivered_again_or_made_again_counts_once(engine: AsyncEngine) -> None:
    followed = follow()
    first = polled(followed, 1, post(1, "https://a.example/"), skipped=1)
    # The same poll made a second time (its request redelivered) carries another id.
    again = polled(followed, 1, post(1, "https://a.example/"), post(2, "https://b.example/"))
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

    # An unfollow older than the current follow, and a poll of the old chain, change
    # nothing; an unfollow without a timeline ends every timeline of the instance.
    await project(
        engine, unfollow("local", later), polled(followed, 2, post(3, "https://c.example/"))
    )
    assert (await instance(engine)).unfollowed_at is None
    assert (await instance(engine)).polls == 2
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
        async with engine.begin() as conn:
            await conn.execute(text("TRUNCATE instances, page_shares, projected_events"))
        await project(engine, local, public, *order)

        rows = await query(engine, "SELECT url, instance, first_seen_at FROM page_shares")
        assert [tuple(r) for r in rows] == [("https://a.example/", INSTANCE, early.completed_at)]


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
    async with engine.begin() as conn:
        await conn.execute(text("TRUNCATE instances, page_shares, projected_events"))

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
