"""Retention: expired attempts leave in batches, their tags with them; the crawl history's
superseded attempts leave, and what a page's retries are counted from stays; the ids of
applied events leave once the record can no longer deliver them again."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from tests.conftest import StackUrls, eventually
from tests.recorder.test_projections import POLICY, completed, rows
from tests.support import services
from trove_recorder.projections import apply_batch
from trove_recorder.retention import (
    HistoryCursor,
    Pruned,
    Retention,
    prune,
    prune_applied,
    prune_crawls,
    prune_published,
    retention_pass,
    run_retention,
)
from trove_recorder.retries import RetryPolicy, retry_request
from trove_schema.bus import Bus
from trove_schema.events import CrawlCompleted, CrawlOutcome, CrawlRequested, Scope, decode_event
from trove_schema.settings import MAX_DURATION_SECONDS, RecorderSettings
from trove_schema.tables import REBUILD_LOCK
from trove_schema.topology import EVENTS_STREAM, page_schedule_subject

pytestmark = pytest.mark.usefixtures("clean")


def attempt(n: int, at: datetime) -> CrawlCompleted:
    return completed(
        url=f"https://blog.example/{n}",
        title=f"Post {n}",
        started_at=at,
        completed_at=at + timedelta(milliseconds=50),
        scope=Scope(value="blog.example"),
    )


async def audited(engine: AsyncEngine) -> tuple[int, int]:
    (a,) = await rows(engine, "SELECT count(*) AS n FROM fetcher_attempts")
    (t,) = await rows(engine, "SELECT count(*) AS n FROM attempt_heuristics")
    return int(a.n), int(t.n)


async def test_expired_attempts_are_deleted_in_batches_with_their_tags(
    engine: AsyncEngine,
) -> None:
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    old = [attempt(n, now - timedelta(days=91, minutes=n)) for n in range(10)]
    fresh = [attempt(100 + n, now - timedelta(days=89)) for n in range(3)]
    sessions = async_sessionmaker(engine)
    async with sessions.begin() as session:
        await apply_batch(session, [*old, *fresh], POLICY)
    tags_per_attempt = (await audited(engine))[1] // 13

    retention = Retention(window=timedelta(days=90), batch=4)
    assert await prune(sessions, retention, now=lambda: now) == [4, 4, 2]

    assert await audited(engine) == (3, 3 * tags_per_attempt)
    kept = await rows(engine, "SELECT event_id::text AS id FROM fetcher_attempts")
    assert {r.id for r in kept} == {e.id for e in fresh}
    (crawls,) = await rows(engine, "SELECT count(*) AS n FROM page_crawls")
    assert crawls.n == 13  # the audit's retention touches nothing else
    assert await prune(sessions, retention, now=lambda: now) == []


async def test_a_stop_ends_a_pass_between_its_batches(engine: AsyncEngine) -> None:
    # A first pass over months of rows takes minutes: a stopping recorder (or one whose
    # consumer failed) does not wait for it.
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    old = [attempt(n, now - timedelta(days=91, minutes=n)) for n in range(10)]
    sessions = async_sessionmaker(engine)
    async with sessions.begin() as session:
        await apply_batch(session, old, POLICY)
    stop = asyncio.Event()
    stop.set()
    retention = Retention(window=timedelta(days=90), batch=4)
    assert await prune(sessions, retention, now=lambda: now, stop=stop) == []
    assert (await audited(engine))[0] == 10  # nothing begun after the stop
    assert await prune(sessions, retention, now=lambda: now) == [4, 4, 2]


async def test_the_loop_prunes_while_attempts_keep_arriving(engine: AsyncEngine) -> None:
    # The injected clock moves a day for each batch of attempts: ten days in a moment.
    start = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    clock = {"now": start}
    sessions = async_sessionmaker(engine)
    retention = Retention(window=timedelta(days=3), batch=2, interval=0.05)
    stop = asyncio.Event()
    loop = asyncio.create_task(run_retention(engine, retention, stop, now=lambda: clock["now"]))
    try:
        for day in range(10):
            clock["now"] = start + timedelta(days=day)
            async with sessions.begin() as session:
                await apply_batch(
                    session,
                    [attempt(day * 10 + k, clock["now"] - timedelta(minutes=k)) for k in range(3)],
                    POLICY,
                )

        async def oldest() -> datetime | None:
            (row,) = await rows(engine, "SELECT min(attempted_at) AS at FROM fetcher_attempts")
            return row.at  # type: ignore[no-any-return]

        cutoff = clock["now"] - timedelta(days=3)
        await eventually(
            oldest, until=lambda at: at is not None and at >= cutoff, timeout=10, what="pruned"
        )
    finally:
        stop.set()
        await asyncio.wait_for(loop, timeout=5)
    # Days 7, 8 and 9, three attempts each, and day 6's newest, made exactly at the cut.
    count, _ = await audited(engine)
    assert count == 10


async def test_the_recorder_process_prunes_the_audit(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    now = datetime.now(UTC)
    env = {
        "TROVE_AUDIT_RETENTION_SECONDS": "3600",
        "TROVE_AUDIT_PRUNE_INTERVAL_SECONDS": "0.2",
        "TROVE_AUDIT_PRUNE_BATCH": "2",
    }
    async with services(stack, state_dir, env, only=("recorder",)):
        for n in range(5):
            await bus.publish(attempt(n, now - timedelta(hours=2)))
        for n in range(5, 8):
            await bus.publish(attempt(n, now))

        async def crawls() -> int:
            (row,) = await rows(engine, "SELECT count(*) AS n FROM page_crawls")
            return int(row.n)

        await eventually(crawls, until=lambda n: n == 8, timeout=30, what="projected")
        await eventually(
            lambda: audited(engine), until=lambda c: c[0] == 3, timeout=30, what="pruned"
        )
    kept = await rows(engine, "SELECT url FROM fetcher_attempts ORDER BY url")
    assert [r.url for r in kept] == [f"https://blog.example/{n}" for n in range(5, 8)]


def crawl(path: str, outcome: CrawlOutcome, at: datetime) -> CrawlCompleted:
    return completed(
        outcome,
        url=f"https://blog.example/{path}",
        started_at=at - timedelta(milliseconds=50),
        completed_at=at,
        scope=Scope(value="blog.example"),
    )


async def history(engine: AsyncEngine) -> set[tuple[str, str, datetime]]:
    found = await rows(
        engine,
        "SELECT p.url, c.outcome, c.completed_at FROM page_crawls c JOIN pages p "
        "ON p.id = c.page_id",
    )
    return {(r.url.rsplit("/", 1)[1], r.outcome, r.completed_at) for r in found}


async def test_the_crawl_history_loses_only_superseded_attempts_past_its_window(
    engine: AsyncEngine,
) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)

    def day(n: float) -> datetime:
        return start + timedelta(days=n)

    ok, fresh, timeout = CrawlOutcome.SUCCESS, CrawlOutcome.NOT_MODIFIED, CrawlOutcome.TIMEOUT
    kept = [
        ("a", fresh, day(10)),  # the page's newest success, old as it is
        ("a", timeout, day(20)),  # the attempts after it: its retries count them
        ("a", timeout, day(21)),
        ("b", timeout, day(0.2)),  # never succeeded: every attempt counts
        ("b", timeout, day(1.2)),
        ("c", ok, day(50)),  # within the window
        ("d", ok, day(40)),
    ]
    superseded = [
        ("a", ok, day(0.1)),
        ("c", ok, day(0.3)),
        *[("d", ok, day(n + 0.5)) for n in range(1, 6)],
    ]
    sessions = async_sessionmaker(engine)
    for row in sorted([*kept, *superseded], key=lambda r: r[2]):  # as they completed
        async with sessions.begin() as session:
            await apply_batch(session, [crawl(*row)], POLICY)
    everything = await history(engine)
    assert len(everything) == 14

    forever = Retention(window=timedelta(days=90), batch=2)
    assert await prune_crawls(sessions, forever, now=lambda: day(3650)) == 0
    assert await history(engine) == everything

    thirty = Retention(window=timedelta(days=90), crawl_window=timedelta(days=30), batch=2)
    # Batches of two, in completion order, past the rows each page keeps (b's first
    # attempt is older than anything deleted).
    assert await prune_crawls(sessions, thirty, now=lambda: day(60)) == 7
    assert await history(engine) == set(kept)
    assert await prune_crawls(sessions, thirty, now=lambda: day(60)) == 0
    (pages,) = await rows(engine, "SELECT count(*) AS n FROM pages")
    assert pages.n == 4
    assert (await audited(engine))[0] == 14  # the audit has its own window


async def test_passes_go_on_from_the_last_and_start_over_once_a_day(engine: AsyncEngine) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)

    def day(n: float) -> datetime:
        return start + timedelta(days=n)

    sessions = async_sessionmaker(engine)

    async def crawled(*attempts: tuple[str, CrawlOutcome, datetime]) -> None:
        for row in attempts:
            async with sessions.begin() as session:
                await apply_batch(session, [crawl(*row)], POLICY)

    failing = ("e", CrawlOutcome.TIMEOUT, day(0.5))
    await crawled(failing, ("f", CrawlOutcome.SUCCESS, day(1)), ("f", CrawlOutcome.SUCCESS, day(2)))
    retention = Retention(window=timedelta(days=90), crawl_window=timedelta(days=30), batch=10)
    cursor = HistoryCursor()
    assert await prune_crawls(sessions, retention, lambda: day(40), cursor) == 1  # f's first
    assert cursor.after == day(2)  # the last attempt read: f's success, which it keeps

    # e succeeds at last: its old timeout is superseded, behind where the passes go on.
    await crawled(("e", CrawlOutcome.SUCCESS, day(39.9)))
    assert await prune_crawls(sessions, retention, lambda: day(40.01), cursor) == 0
    assert failing in await history(engine)
    assert await prune_crawls(sessions, retention, lambda: day(41), cursor) == 1
    assert failing not in await history(engine)


async def test_a_recorder_with_a_crawl_history_retention_prunes_it(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    env = {
        "TROVE_CRAWL_HISTORY_RETENTION_SECONDS": "3600",
        "TROVE_AUDIT_PRUNE_INTERVAL_SECONDS": "0.2",
        "TROVE_AUDIT_PRUNE_BATCH": "2",
    }
    sent = [
        ("p", CrawlOutcome.SUCCESS, now - timedelta(hours=3)),
        ("p", CrawlOutcome.SUCCESS, now - timedelta(hours=2)),
        ("p", CrawlOutcome.TIMEOUT, now - timedelta(minutes=90)),
        ("q", CrawlOutcome.SUCCESS, now - timedelta(hours=3)),
        ("q", CrawlOutcome.SUCCESS, now - timedelta(hours=2, minutes=30)),
        ("q", CrawlOutcome.SUCCESS, now),
    ]
    # Projected first, by a recorder without the retention: a pass reads an attempt once
    # past the window (the next pass goes on after it), and these come hours old, each
    # past it already; one read while its page kept it would wait for the daily rescan.
    async with services(stack, state_dir, {}, only=("recorder",)):
        for n, row in enumerate(sent, start=1):  # one after another, as a crawl comes
            await bus.publish(crawl(*row))
            await eventually(
                lambda: crawls_applied(engine),
                until=lambda found, n=n: found == n,  # type: ignore[misc]
                timeout=30,
                what=f"crawl {n} projected",
            )
    assert len(await history(engine)) == 6
    async with services(stack, state_dir, env, only=("recorder",)):
        await eventually(
            lambda: history(engine),
            until=lambda h: h == {sent[1], sent[2], sent[5]},
            timeout=30,
            what="the superseded attempts pruned",
        )
    assert await crawls_applied(engine) == 6


async def crawls_applied(engine: AsyncEngine) -> int:
    (row,) = await rows(
        engine, "SELECT count(*) AS n FROM projected_events WHERE event_type = 'CrawlCompleted'"
    )
    return int(row.n)


async def outbox(engine: AsyncEngine) -> list[tuple[str, bool]]:
    found = await rows(
        engine,
        "SELECT subject, published_at IS NOT NULL AS sent FROM outbox ORDER BY subject",
    )
    return [(r.subject, r.sent) for r in found]


async def test_published_outbox_rows_leave_after_a_day_and_pending_ones_never(
    engine: AsyncEngine,
) -> None:
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    rows_ = [
        *[(f"old-{n}", now - timedelta(days=2)) for n in range(3)],
        *[(f"recent-{n}", now - timedelta(hours=1)) for n in range(2)],
        *[(f"pending-{n}", None) for n in range(2)],
    ]
    async with engine.begin() as conn:
        for subject, published in rows_:
            await conn.execute(
                text(
                    "INSERT INTO outbox (event_id, subject, payload, created_at, published_at) "
                    "VALUES (gen_random_uuid(), :subject, '\\x7b7d', :created, :published)"
                ),
                {"subject": subject, "created": now - timedelta(days=10), "published": published},
            )
    sessions = async_sessionmaker(engine)
    retention = Retention(window=timedelta(days=90), batch=2)
    assert await prune_published(sessions, retention, now=lambda: now) == 3
    assert await outbox(engine) == [
        ("pending-0", False),
        ("pending-1", False),
        ("recent-0", True),
        ("recent-1", True),
    ]
    assert await prune_published(sessions, retention, now=lambda: now + timedelta(days=2)) == 2


async def test_the_recorder_lets_a_published_retry_go_and_keeps_it_in_the_record(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    env = {"TROVE_RETRY_DELAY_SECONDS": "3600", "TROVE_AUDIT_PRUNE_INTERVAL_SECONDS": "0.2"}
    failed = crawl("down", CrawlOutcome.TIMEOUT, datetime.now(UTC))
    async with services(stack, state_dir, env, only=("recorder",)):
        await bus.publish(failed)
        await eventually(
            lambda: outbox(engine),
            until=lambda found: found == [(CrawlRequested.SUBJECT, True)],
            timeout=30,
            what="the retry published",
        )
        # A day on, as far as the row can tell.
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE outbox SET published_at = now() - interval '25 hours'"))
        await eventually(
            lambda: outbox(engine), until=lambda found: found == [], timeout=30, what="row gone"
        )
    retry = retry_request(failed, 1, RetryPolicy(delay_seconds=3600))
    message = await bus.js.get_last_msg(EVENTS_STREAM, page_schedule_subject(failed.url))
    assert decode_event(message.data or b"").id == retry.id  # the retry, waiting in the record


async def applied_ids(engine: AsyncEngine) -> int:
    (row,) = await rows(engine, "SELECT count(*) AS n FROM projected_events")
    return int(row.n)


async def test_the_ids_of_applied_events_leave_after_their_window_and_nothing_else(
    engine: AsyncEngine,
) -> None:
    at = datetime.now(UTC)
    sessions = async_sessionmaker(engine)
    async with sessions.begin() as session:
        await apply_batch(session, [attempt(n, at) for n in range(10)], POLICY)
    assert await applied_ids(engine) == 10

    forever = Retention(window=timedelta(days=90), batch=4)
    assert await prune_applied(sessions, forever, now=lambda: at + timedelta(days=3650)) == 0
    kept = Retention(window=timedelta(days=90), applied_window=timedelta(days=60), batch=4)
    assert await prune_applied(sessions, kept, now=lambda: at + timedelta(days=59)) == 0
    assert await applied_ids(engine) == 10

    assert await prune_applied(sessions, kept, now=lambda: at + timedelta(days=61)) == 10

    assert await applied_ids(engine) == 0
    (crawls,) = await rows(engine, "SELECT count(*) AS n FROM page_crawls")
    (pages,) = await rows(engine, "SELECT count(*) AS n FROM pages")
    assert (crawls.n, pages.n) == (10, 10)
    assert (await audited(engine))[0] == 10


async def test_a_recorder_whose_record_has_a_retention_lets_the_applied_ids_go_after_it(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    # The record kept 5 s: the ids stay 10 s, twice that, then leave; the pages stay.
    # (Kept 2 s, the events of a recorder slow to start on a loaded machine left the
    # record before they were projected.)
    env = {
        "TROVE_EVENTS_MAX_AGE_SECONDS": "5",
        "TROVE_RETRY_DELAY_SECONDS": "1",
        "TROVE_RETRY_MAX_DELAY_SECONDS": "1",
        # The recorder refuses a record that would drop discovery's schedules.
        "TROVE_RECRAWL_AFTER_SECONDS": "1",
        "TROVE_RECRAWL_MAX_SECONDS": "1",
        "TROVE_POLL_INTERVAL_SECONDS": "1",
        "TROVE_POLL_MAX_BACKOFF_SECONDS": "1",
        "TROVE_AUDIT_PRUNE_INTERVAL_SECONDS": "0.2",
    }
    now = datetime.now(UTC)
    async with services(stack, state_dir, env, only=("recorder",)):
        for n in range(5):
            await bus.publish(attempt(n, now))

        async def crawls() -> int:
            (row,) = await rows(engine, "SELECT count(*) AS n FROM page_crawls")
            return int(row.n)

        await eventually(crawls, until=lambda n: n == 5, timeout=30, what="projected")
        assert await applied_ids(engine) == 5  # kept while the record may redeliver
        await eventually(
            lambda: applied_ids(engine), until=lambda n: n == 0, timeout=30, what="ids left"
        )
    (pages,) = await rows(engine, "SELECT count(*) AS n FROM pages")
    assert pages.n == 5


def test_the_applied_ids_are_kept_twice_the_records_age_and_for_ever_without_one() -> None:
    kept = Retention.from_settings(
        RecorderSettings(events_max_age_seconds=40 * 86_400, audit_retention_seconds=3600)
    )
    assert kept.applied_window == timedelta(days=80)
    assert kept.window == timedelta(hours=1)
    default = Retention.from_settings(RecorderSettings())
    assert default.applied_window is None


def test_the_crawl_history_is_kept_for_ever_unless_a_retention_is_set() -> None:
    assert Retention.from_settings(RecorderSettings()).crawl_window is None
    year = RecorderSettings(crawl_history_retention_seconds=365 * 86_400)
    assert Retention.from_settings(year).crawl_window == timedelta(days=365)


async def test_an_audit_retention_of_0_keeps_every_attempt(engine: AsyncEngine) -> None:
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    sessions = async_sessionmaker(engine)
    async with sessions.begin() as session:
        await apply_batch(
            session, [attempt(n, now - timedelta(days=3650)) for n in range(3)], POLICY
        )
    forever = Retention.from_settings(RecorderSettings(audit_retention_seconds=0))
    assert forever.window is None
    assert await prune(sessions, forever, now=lambda: now) == []
    # The longest window a setting takes still makes a cut-off.
    century = RecorderSettings(audit_retention_seconds=MAX_DURATION_SECONDS)
    assert await prune(sessions, Retention.from_settings(century), now=lambda: now) == []
    assert (await audited(engine))[0] == 3


async def test_a_retention_step_that_fails_leaves_the_others_to_run(
    engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    # An audit window too long for a cut-off (now less it is before year 1) fails the
    # audit's step at every pass; the outbox's published rows leave all the same.
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    async with engine.begin() as conn:
        for n in range(3):
            await conn.execute(
                text(
                    "INSERT INTO outbox (event_id, subject, payload, created_at, published_at) "
                    "VALUES (gen_random_uuid(), :subject, '\\x7b7d', :at, :at)"
                ),
                {"subject": f"old-{n}", "at": now - timedelta(days=2)},
            )
    retention = Retention(window=timedelta(days=1_000_000), batch=2, interval=0.05)
    stop = asyncio.Event()
    with caplog.at_level(logging.WARNING, logger="trove.recorder"):
        loop = asyncio.create_task(run_retention(engine, retention, stop, now=lambda: now))
        try:
            await eventually(
                lambda: outbox(engine), until=lambda found: found == [], timeout=10, what="pruned"
            )
        finally:
            stop.set()
            await asyncio.wait_for(loop, timeout=5)
    assert "retention of the audit" in caplog.text


@pytest.mark.parametrize("rebuild", ["running", "stopped partway"])
async def test_a_pass_leaves_the_tables_to_a_whole_replays_rebuild(
    engine: AsyncEngine, rebuild: str
) -> None:
    # A replay reads the crawl history it has rebuilt to settle the retries it held:
    # a pass deleting under it would release retries whose page was fetched since.
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    old = [attempt(n, now - timedelta(days=91, minutes=n)) for n in range(5)]
    async with async_sessionmaker(engine).begin() as session:
        await apply_batch(session, old, POLICY)
    retention = Retention(window=timedelta(days=90), batch=2)
    async with engine.connect() as replay:
        if rebuild == "running":
            await replay.execute(text("SELECT pg_advisory_lock(:l)"), {"l": REBUILD_LOCK})
        else:
            await replay.execute(text("INSERT INTO rebuild_marks (started_at) VALUES (now())"))
        await replay.commit()
        assert await retention_pass(engine, retention, now=lambda: now) == Pruned()
        assert (await audited(engine))[0] == 5
        if rebuild == "running":
            await replay.execute(text("SELECT pg_advisory_unlock(:l)"), {"l": REBUILD_LOCK})
        else:
            await replay.execute(text("DELETE FROM rebuild_marks"))
        await replay.commit()
    pruned = await retention_pass(engine, retention, now=lambda: now)
    assert pruned is not None
    assert pruned.audit == [2, 2, 1]
    assert (await audited(engine))[0] == 0
