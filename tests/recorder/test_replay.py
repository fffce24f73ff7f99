"""Replay: the tables rebuilt from the event record are the tables the live recorder built."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import pytest
from asyncpg.exceptions import DiskFullError, QueryCanceledError
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tests.conftest import StackUrls, eventually
from tests.recorder.test_database_outage import DISK_FULL, TIMED_OUT
from tests.recorder.test_recorder_service import completed, count
from tests.support import outcomes, publish_work, query, run_trove, sandbox_env, services
from trove_recorder.errors import LockLost, RecordIncomplete
from trove_recorder.replay import (
    NOT_PROJECTIONS,
    PROJECTION_TABLES,
    REPLAY_LOCK,
    replay,
    since_of,
)
from trove_recorder.retries import RetryPolicy, retry_request
from trove_sandbox.server import serve_sandbox
from trove_sandbox.web import SandboxWeb
from trove_schema.bus import Bus
from trove_schema.events import (
    CrawlCompleted,
    CrawlOutcome,
    CrawlRequested,
    Link,
    PageDiscovered,
    Provenance,
    RequestReason,
    Scope,
    SeedRejected,
    decode_event,
    utcnow,
)
from trove_schema.migrate import upgrade_async
from trove_schema.settings import RecorderSettings
from trove_schema.tables import Base
from trove_schema.topology import (
    DEAD_STREAM,
    DISCOVERY_LINKS,
    EVENTS_STREAM,
    FETCHER,
    RECORDER,
    SEEDS_SUBJECT,
    page_schedule_subject,
)

pytestmark = pytest.mark.usefixtures("clean")

#: Every projected column but surrogate ids and row-insertion times, joined on URLs.
CHECKSUM_QUERIES = {
    "pages": (
        "SELECT md5(string_agg(t::text, '|' ORDER BY t::text)) FROM ("
        "SELECT url, domain, status, depth, title, language, keywords_tsv::text, etag, "
        "last_modified, content_hash, canonical_url, noindex, last_crawled_at, last_outcome, "
        "last_status_code, discovered_at, fetched_at, failed_at FROM pages) t"
    ),
    "page_crawls": (
        "SELECT md5(string_agg(t::text, '|' ORDER BY t::text)) FROM ("
        "SELECT p.url, c.domain, c.priority, c.attempt, c.outcome, c.status_code, "
        "c.error_message, c.content_length, c.started_at, c.completed_at, c.duration_ms, "
        "c.event_id, c.request_id FROM page_crawls c JOIN pages p ON p.id = c.page_id) t"
    ),
    "page_links": (
        "SELECT md5(string_agg(t::text, '|' ORDER BY t::text)) FROM ("
        "SELECT f.url AS f, o.url AS o, l.kind, l.nofollow FROM page_links l "
        "JOIN pages f ON f.id = l.from_page_id JOIN pages o ON o.id = l.to_page_id) t"
    ),
    "fetcher_attempts": (
        "SELECT md5(string_agg(t::text, '|' ORDER BY t::text)) FROM ("
        "SELECT a.event_id, p.url AS page, a.url, a.host, a.fetcher, a.success, a.is_banned, "
        "a.error_type, a.http_status, a.response_headers, a.duration_ms, a.attempted_at "
        "FROM fetcher_attempts a LEFT JOIN pages p ON p.id = a.page_id) t"
    ),
    "attempt_heuristics": (
        "SELECT md5(string_agg(t::text, '|' ORDER BY t::text)) FROM ("
        "SELECT a.event_id, h.heuristic_type, h.heuristic_value, h.importance_score "
        "FROM attempt_heuristics h JOIN fetcher_attempts a ON a.id = h.attempt_id) t"
    ),
    "seed_rejections": (
        "SELECT md5(string_agg(t::text, '|' ORDER BY t::text)) FROM ("
        "SELECT event_id, raw, reason, origin, occurred_at FROM seed_rejections) t"
    ),
}


async def checksums(engine: AsyncEngine) -> dict[str, str | None]:
    async with engine.connect() as conn:
        return {
            name: (await conn.execute(text(sql))).scalar_one()
            for name, sql in CHECKSUM_QUERIES.items()
        }


async def empty_database(stack: StackUrls) -> str:
    """The URL of a new, empty database on the session's server."""
    name = f"replay_{uuid.uuid4().hex[:8]}"
    admin = create_async_engine(stack.database_url, isolation_level="AUTOCOMMIT")
    async with admin.connect() as conn:
        await conn.execute(text(f'CREATE DATABASE "{name}"'))
    await admin.dispose()
    return make_url(stack.database_url).set(database=name).render_as_string(hide_password=False)


async def test_replay_into_an_empty_database_reproduces_the_tables(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    web = SandboxWeb.generate(hosts=3, pages_per_host=3)
    async with serve_sandbox(web) as running, services(stack, state_dir, sandbox_env(web, 0.1)):
        nc = await nats.connect(stack.nats_url)
        await nc.publish(SEEDS_SUBJECT, "\n".join([*running.seeds, "ftp://bad.example/"]).encode())
        await nc.flush()
        await nc.close()
        expected = len(web.expected_pages()) + len(web.hosts)  # pages and feeds

        async def crawled() -> int:
            return len(await outcomes(engine))

        await eventually(crawled, until=lambda n: n >= expected, timeout=90, what="crawl done")
    live = await checksums(engine)
    assert all(live.values()), live

    target = await empty_database(stack)

    env = {**os.environ, "TROVE_NATS_URL": stack.nats_url, "TROVE_DATABASE_URL": stack.database_url}
    code, out = await run_trove("replay", "--database-url", target, env=env, timeout=120)
    assert code == 0, out
    assert "replayed" in out

    replayed_engine = create_async_engine(target)
    try:
        assert await checksums(replayed_engine) == live
        (row,) = await query(
            replayed_engine, "SELECT count(*) AS n FROM outbox WHERE published_at IS NULL"
        )
        assert row.n == 0
    finally:
        await replayed_engine.dispose()


async def test_replay_leaves_pending_the_retries_the_record_does_not_hold_yet(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    web = SandboxWeb.generate(hosts=1, pages_per_host=1, with_trap=True)
    trap = web.trap_host
    assert trap is not None
    # A host-wide back-off of a moment, so the far page's Retry-After does not hold up
    # the other.
    env = sandbox_env(
        web,
        0.1,
        TROVE_RETRY_DELAY_SECONDS="1",
        TROVE_MAX_ATTEMPTS="3",
        TROVE_RATE_PAUSE_SECONDS="0.1",
        TROVE_MAX_BACKOFF_SECONDS="0.1",
    )

    async def attempts() -> list[tuple[str, int]]:
        rows = await query(
            engine,
            "SELECT p.url, count(*) AS n FROM page_crawls c JOIN pages p ON p.id = c.page_id "
            "GROUP BY p.url ORDER BY p.url",
        )
        return [(r.url, r.n) for r in rows]

    async def outbox(target: AsyncEngine) -> dict[uuid.UUID, bool]:
        rows = await query(target, "SELECT event_id, published_at IS NOT NULL AS sent FROM outbox")
        return {r.event_id: r.sent for r in rows}

    async with serve_sandbox(web), services(stack, state_dir, env, only=("recorder", "fetcher")):
        # One page's retry is due tomorrow; the other's come after a second and run out.
        far, soon = web.url(trap, "/status/503?after=86400"), web.url(trap, "/status/503?after=1")
        await publish_work(bus, [far, soon])
        await eventually(
            attempts,
            until=lambda a: sorted(a) == sorted([(far, 1), (soon, 3)]),
            timeout=60,
            what="one attempt of the far page, three of the other",
        )
        # Three retries, and the other page's recheck a week on (its retries ran out).
        live_outbox = await eventually(
            lambda: outbox(engine),
            until=lambda rows: len(rows) == 4 and all(rows.values()),
            timeout=30,
            what="three retries and a recheck published",
        )
    live = await checksums(engine)
    retries = [decode_event(r.payload) for r in await query(engine, "SELECT payload FROM outbox")]
    (far_retry,) = [
        uuid.UUID(r.id) for r in retries if isinstance(r, CrawlRequested) and r.url == far
    ]
    (recheck,) = [
        uuid.UUID(r.id)
        for r in retries
        if isinstance(r, CrawlRequested) and r.url == soon and r.attempt == 1
    ]
    due_later = {far_retry, recheck}

    target = await empty_database(stack)
    replayed_engine = create_async_engine(target)
    # What a live recorder's publisher on that database would send meanwhile: no retry
    # the record shows as published (its CrawlRequested further on) may be pending.
    seen_pending: set[uuid.UUID] = set()
    replaying = True

    async def publisher_view() -> None:
        while replaying:
            with contextlib.suppress(ProgrammingError):  # before the tables exist
                rows = await query(
                    replayed_engine, "SELECT event_id FROM outbox WHERE published_at IS NULL"
                )
                seen_pending.update(r.event_id for r in rows)

    watcher = asyncio.create_task(publisher_view())
    try:
        # As the live recorder's settings: its default rechecks.
        recheck_for = RecorderSettings.model_fields["recheck_failing_for_seconds"].default
        policy = RetryPolicy(max_attempts=3, delay_seconds=1.0, recheck_for_seconds=recheck_for)
        stats = await replay(stack.nats_url, target, policy, batch=1)
    finally:
        replaying = False
        await watcher
    assert stats.malformed == 0
    assert seen_pending <= due_later
    try:
        assert await checksums(replayed_engine) == live
        replayed_outbox = await outbox(replayed_engine)
        assert set(replayed_outbox) == set(live_outbox)
        # The far retry and the recheck are not in the record yet: pending again. The two
        # retries that fired are.
        assert replayed_outbox == {e: e not in due_later for e in live_outbox}

        # The recorder running on the rebuilt database publishes it (again, harmlessly).
        rebuilt = StackUrls(stack.nats_url, target, stack.kind)
        async with services(rebuilt, state_dir / "rebuilt", {}, only=("recorder",)):
            await eventually(
                lambda: outbox(replayed_engine),
                until=lambda rows: all(rows.values()),
                timeout=30,
                what="the pending retry published",
            )
    finally:
        await replayed_engine.dispose()


async def test_an_event_the_projection_cannot_apply_is_skipped_as_the_recorder_parks_it(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    now = datetime.now(UTC)

    def attempt(path: str, **fields: Any) -> CrawlCompleted:
        success = {"outcome": CrawlOutcome.SUCCESS, "status_code": 200, "title": path}
        return _attempt(now, url=f"https://blog.example/{path}", **{**success, **fields})

    events = [
        # What the projection takes as a stranger's producer wrote it: a link to no
        # host, an id that is no UUID, an attempt whose times are a month apart.
        attempt("links", links=(Link(url="https://blog.example/a"), Link(url="about:blank"))),
        attempt("stranger", id="an attempt of a stranger's producer"),
        attempt("month", started_at=now - timedelta(days=30)),
        # Decoded, but no projection can hold it (a status code past the column's int).
        attempt("unheld", status_code=2**31),
        PageDiscovered(
            url="https://blog.example/later",
            domain="blog.example",
            scope=Scope(),
            provenance=Provenance(kind="seed"),
        ),
    ]
    async with services(stack, state_dir, {}, only=("recorder",)):
        for event in events:
            await bus.publish(event)

        async def parked() -> int:
            return (await bus.js.stream_info(DEAD_STREAM)).state.messages

        await eventually(parked, until=lambda n: n == 1, timeout=90, what="one event parked")
        await eventually(
            lambda: query(engine, "SELECT url FROM pages WHERE discovered_at IS NOT NULL"),
            until=lambda found: len(found) == 1,
            timeout=30,
            what="the events after it applied",
        )
    live = await checksums(engine)
    crawled = await query(
        engine, "SELECT p.url FROM page_crawls c JOIN pages p ON p.id = c.page_id"
    )
    assert sorted(r.url.rsplit("/", 1)[1] for r in crawled) == ["links", "month", "stranger"]

    target = await empty_database(stack)
    stats = await replay(stack.nats_url, target, RetryPolicy(max_attempts=3, delay_seconds=1.0))
    assert (stats.events, stats.applied, stats.malformed, stats.failed) == (5, 4, 0, 1)
    replayed_engine = create_async_engine(target)
    try:
        assert await checksums(replayed_engine) == live
    finally:
        await replayed_engine.dispose()


@pytest.mark.parametrize(
    ("trouble", "error"),
    [(DISK_FULL, DiskFullError), (TIMED_OUT, QueryCanceledError)],
    ids=["a full disk", "a statement timeout even for one event"],
)
async def test_a_replay_that_meets_the_databases_trouble_stops_rather_than_skip_events(
    stack: StackUrls,
    bus: Bus,
    scratch_database: str,
    trouble: tuple[str, ...],
    error: type[Exception],
) -> None:
    await bus.publish(
        SeedRejected(
            raw="ftp://a.example/", reason="not http(s)", provenance=Provenance(kind="seed")
        )
    )
    await upgrade_async(scratch_database)
    target = create_async_engine(scratch_database)
    try:
        async with target.begin() as conn:
            for statement in trouble:
                await conn.execute(text(statement))
        with pytest.raises(error):
            await replay(stack.nats_url, scratch_database, RetryPolicy(max_attempts=3))
        (row,) = await query(target, "SELECT count(*) AS n FROM seed_rejections")
        assert row.n == 0
    finally:
        await target.dispose()


async def quiet(bus: Bus, engine: AsyncEngine) -> bool:
    """Every page discovered has been crawled, and every event so far projected."""
    for consumer in (RECORDER, FETCHER, DISCOVERY_LINKS):
        info = await bus.js.consumer_info(EVENTS_STREAM, consumer)
        if info.num_pending or info.num_ack_pending:
            return False
    (row,) = await query(
        engine,
        "SELECT count(*) FILTER (WHERE discovered_at IS NOT NULL) AS discovered,"
        " count(*) FILTER (WHERE last_crawled_at IS NOT NULL) AS crawled FROM pages",
    )
    return bool(row.crawled) and row.discovered == row.crawled


async def crawl(stack: StackUrls, bus: Bus, engine: AsyncEngine, state: Path, seed: str) -> None:
    web_env = sandbox_env(WEB, 0.1)
    async with services(stack, state, web_env):
        nc = await nats.connect(stack.nats_url)
        await nc.publish(SEEDS_SUBJECT, seed.encode())
        await nc.flush()
        await nc.close()

        async def done() -> bool:
            return seed in await outcomes(engine) and await quiet(bus, engine)

        await eventually(done, until=bool, timeout=90, what=f"{seed} crawled")


async def copy_of(stack: StackUrls, engine: AsyncEngine) -> str:
    """A copy of the session's database as it is now (a standby that stopped here)."""
    name = f"standby_{uuid.uuid4().hex[:8]}"
    source = make_url(stack.database_url).database
    await engine.dispose()  # a template may have no one connected
    admin = create_async_engine(
        make_url(stack.database_url).set(database="postgres"), isolation_level="AUTOCOMMIT"
    )
    async with admin.connect() as conn:
        await conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{source}"'))
    await admin.dispose()
    return make_url(stack.database_url).set(database=name).render_as_string(hide_password=False)


WEB = SandboxWeb.generate(hosts=2, pages_per_host=3)


async def test_a_replay_since_a_time_restores_in_place_what_a_failover_lost(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    async with serve_sandbox(WEB) as running:
        first, second = running.seeds
        await crawl(stack, bus, engine, state_dir, first)
        # The asynchronous standby a failover promotes: it stopped after the first site.
        standby = await copy_of(stack, engine)
        await crawl(stack, bus, engine, state_dir, second)
    live = await checksums(engine)
    standby_engine = create_async_engine(standby)
    env = {**os.environ, "TROVE_NATS_URL": stack.nats_url, "TROVE_DATABASE_URL": stack.database_url}
    try:
        assert await checksums(standby_engine) != live

        # A whole replay refuses tables that have projections, and says what to do.
        code, out = await run_trove("replay", "--database-url", standby, env=env, timeout=120)
        assert code == 2
        assert "--since" in out

        # The window covers both crawls: the first's events are there already, skipped.
        code, out = await run_trove(
            "replay", "--database-url", standby, "--since", "1h", env=env, timeout=120
        )
        assert code == 0, out
        assert await checksums(standby_engine) == live
        replayed, applied = (int(n) for n in re.findall(r"(\d+) events \((\d+) applied", out)[0])
        assert 0 < applied < replayed

        # Again: nothing left to apply.
        code, out = await run_trove(
            "replay", "--database-url", standby, "--since", "1h", env=env, timeout=120
        )
        assert code == 0, out
        assert "(0 applied" in out
        assert await checksums(standby_engine) == live
    finally:
        await standby_engine.dispose()


async def test_a_replay_since_a_time_after_the_last_event_applies_nothing(
    stack: StackUrls, bus: Bus
) -> None:
    await publish_work(bus, ["http://a.example/"])
    target = await empty_database(stack)
    policy = RetryPolicy(max_attempts=3, delay_seconds=1.0)
    later = await replay(
        stack.nats_url, target, policy, since=datetime.now(UTC) + timedelta(hours=1)
    )
    assert (later.events, later.applied) == (0, 0)
    earlier = await replay(
        stack.nats_url, target, policy, since=datetime.now(UTC) - timedelta(hours=1)
    )
    assert (earlier.events, earlier.applied) == (1, 1)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("90s", datetime(2026, 11, 28, 4, 58, 30, tzinfo=UTC)),
        ("1.5h", datetime(2026, 11, 28, 3, 30, tzinfo=UTC)),
        ("2d", datetime(2026, 11, 26, 5, 0, tzinfo=UTC)),
        ("2026-11-28T04:00Z", datetime(2026, 11, 28, 4, 0, tzinfo=UTC)),
        ("2026-11-28T04:00+01:00", datetime(2026, 11, 28, 3, 0, tzinfo=UTC)),
    ],
)
def test_since_is_a_span_back_from_now_or_a_time_with_its_zone(
    value: str, expected: datetime
) -> None:
    assert since_of(value, datetime(2026, 11, 28, 5, 0, tzinfo=UTC)) == expected


@pytest.mark.parametrize("value", ["yesterday", "2026-11-28T04:00", "-3h", "h", "infh", "nanm"])
def test_a_since_that_is_neither_is_refused_with_both_forms(value: str) -> None:
    with pytest.raises(ValueError, match=r"2h.*2026-11-28T04:00Z"):
        since_of(value, datetime(2026, 11, 28, 5, 0, tzinfo=UTC))


def test_replay_with_truncate_empties_every_projection_table() -> None:
    # A table left out would keep rows pointing at page ids the replay hands out anew;
    # the one left out on purpose is the replay's own mark, which points at nothing.
    assert set(PROJECTION_TABLES) | set(NOT_PROJECTIONS) == set(Base.metadata.tables)
    assert not set(PROJECTION_TABLES) & set(NOT_PROJECTIONS)


async def _replay_stopped_at(
    stack: StackUrls,
    scratch_database: str,
    event: SeedRejected,
    policy: RetryPolicy,
    since: datetime | None = None,
) -> None:
    """Run a replay of the record (``since`` a time: whole when None) one event a batch,
    and end the session of its lock (a server restart; Ctrl-C, a 10-minute NATS outage
    or a kill end it the same way) while its batch of ``event`` waits: that batch and
    those before it applied, none after."""
    target = create_async_engine(scratch_database)
    try:
        async with target.connect() as held:
            # ``event``'s id taken first, uncommitted: its batch waits for it.
            await held.execute(
                text("INSERT INTO projected_events (event_id, event_type) VALUES (:id, 'x')"),
                {"id": event.id},
            )
            running = asyncio.create_task(
                replay(stack.nats_url, scratch_database, policy, batch=1, since=since)
            )

            async def waiting() -> int:
                (row,) = await query(
                    target,
                    "SELECT count(*) AS n FROM pg_stat_activity "
                    "WHERE datname = :db AND wait_event_type = 'Lock'",
                    db=make_url(scratch_database).database,
                )
                return int(row.n)

            await eventually(waiting, until=lambda n: n == 1, timeout=30, what="replay waits")
            (ended,) = await query(
                target,
                "SELECT pg_terminate_backend(pid) AS ended FROM pg_locks "
                "WHERE locktype = 'advisory' AND granted AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND (CAST(classid AS bigint) << 32 | CAST(objid AS bigint)) = :lock",
                lock=REPLAY_LOCK,
            )
            assert ended.ended
            await held.rollback()
        with pytest.raises(LockLost):
            await running
    finally:
        await target.dispose()


async def test_a_replay_whose_lock_went_with_its_connection_stops(
    stack: StackUrls, bus: Bus, scratch_database: str
) -> None:
    rejected = [
        SeedRejected(
            raw=f"ftp://{n}.example/",
            reason="not http(s)",
            provenance=Provenance(kind="seed", origin="test"),
        )
        for n in range(20)
    ]
    for event in rejected:
        await bus.publish(event)
    await upgrade_async(scratch_database)
    policy = RetryPolicy(max_attempts=3, delay_seconds=1.0)
    await _replay_stopped_at(stack, scratch_database, rejected[2], policy)
    target = create_async_engine(scratch_database)
    try:
        (row,) = await query(target, "SELECT count(*) AS n FROM seed_rejections")
        assert row.n == 3  # the batch under way when the lock went, and none after it
    finally:
        await target.dispose()


def _attempt(then: datetime, **fields: Any) -> CrawlCompleted:
    """An attempt at the one page that ended at ``then``: a 503 unless ``fields`` say."""
    base: dict[str, Any] = {
        "url": "https://blog.example/post",
        "domain": "blog.example",
        "scope": Scope(value="blog.example"),
        "request_id": str(uuid.uuid4()),
        "outcome": CrawlOutcome.BLOCKED_5XX,
        "status_code": 503,
        "started_at": then - timedelta(seconds=1),
        "completed_at": then,
    }
    return CrawlCompleted(**{**base, **fields})


def _failure(then: datetime) -> CrawlCompleted:
    return _attempt(then)


async def _outbox(database: str) -> list[tuple[str, str]]:
    """Each row's event id, and whether it is held (by a replay), sent, or due."""
    target = create_async_engine(database)
    try:
        rows = await query(
            target,
            "SELECT event_id, CASE WHEN published_at = 'infinity' THEN 'held' "
            "WHEN published_at IS NOT NULL THEN 'sent' ELSE 'due' END AS state FROM outbox",
        )
    finally:
        await target.dispose()
    return [(str(row.event_id), row.state) for row in rows]


async def _stopped_and_finished(
    stack: StackUrls,
    scratch_database: str,
    stop: SeedRejected,
    policy: RetryPolicy,
    whole: bool,
    since: datetime,
) -> list[tuple[str, str]]:
    """The outbox after a replay (whole, or ``since``) stopped at ``stop``, and after
    the replay that finishes a whole one: a stopped rebuild keeps its retries held for
    it, which settles them as it reads on; any other stopped replay settles them at
    once, from whether each page has a request pending."""
    await _replay_stopped_at(stack, scratch_database, stop, policy, None if whole else since)
    if not whole:
        return await _outbox(scratch_database)
    assert {state for _, state in await _outbox(scratch_database)} == {"held"}
    target = create_async_engine(scratch_database)
    try:
        (mark,) = await query(target, "SELECT applied_until FROM rebuild_marks")
    finally:
        await target.dispose()
    await replay(stack.nats_url, scratch_database, policy, since=mark.applied_until)
    return await _outbox(scratch_database)


@pytest.mark.parametrize("whole", [True, False], ids=["whole", "since"])
async def test_a_replay_stopped_halfway_sends_no_retry_that_fired_long_ago_again(
    stack: StackUrls, bus: Bus, scratch_database: str, whole: bool
) -> None:
    """A failure three days ago decided a retry, which fired an hour later and was
    answered: both past where the replay stopped. Sent again, the old retry would
    replace the page's next re-crawl, pending, and its answer be dropped as a copy."""
    policy = RetryPolicy(max_attempts=3, delay_seconds=3600.0)
    since = datetime.now(UTC) - timedelta(minutes=1)
    then = datetime.now(UTC) - timedelta(days=3)
    failed = _failure(then)
    stop = SeedRejected(raw="ftp://x.example/", reason="x", provenance=Provenance(kind="seed"))
    retry = retry_request(failed, 1, policy)
    answered = failed.model_copy(
        update={
            "id": str(uuid.uuid4()),
            "request_id": retry.id,
            "attempt": 2,
            "outcome": CrawlOutcome.SUCCESS,
            "status_code": 200,
            "completed_at": then + timedelta(hours=1),
        }
    )
    for event in (failed, stop, retry, answered):
        await bus.publish(event)
    recrawl = CrawlRequested(
        url=failed.url,
        domain=failed.domain,
        scope=failed.scope,
        reason=RequestReason.RECRAWL,
        not_before=datetime.now(UTC) + timedelta(days=1),
        caused_by=answered.id,
    )
    assert recrawl.not_before is not None
    await bus.publish_at(recrawl, recrawl.not_before, schedule=page_schedule_subject(failed.url))
    await upgrade_async(scratch_database)
    settled = await _stopped_and_finished(stack, scratch_database, stop, policy, whole, since)
    assert settled == [(retry.id, "sent")], "released to be sent again"


@pytest.mark.parametrize("whole", [True, False], ids=["whole", "since"])
async def test_a_replay_stopped_halfway_releases_a_retry_nothing_sent_yet(
    stack: StackUrls, bus: Bus, scratch_database: str, whole: bool
) -> None:
    """A failure five minutes ago, projected by the replay alone (the live recorders
    waiting on it, or behind): its retry, due already, never went out, and the page
    has nothing pending. Marked sent, the page would never be asked again."""
    policy = RetryPolicy(max_attempts=3, delay_seconds=60.0)
    since = datetime.now(UTC) - timedelta(minutes=1)
    failed = _failure(datetime.now(UTC) - timedelta(minutes=5))
    stop = SeedRejected(raw="ftp://x.example/", reason="x", provenance=Provenance(kind="seed"))
    after = SeedRejected(raw="ftp://y.example/", reason="y", provenance=Provenance(kind="seed"))
    for event in (failed, stop, after):
        await bus.publish(event)
    await upgrade_async(scratch_database)
    settled = await _stopped_and_finished(stack, scratch_database, stop, policy, whole, since)
    assert settled == [(retry_request(failed, 1, policy).id, "due")]


async def test_an_attempt_stamped_ahead_is_ordered_at_its_record_time_live_and_replayed(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    # Stamped a year ahead (a producer's clock, a hand-made event), an attempt was newer
    # than every real one: each later attempt read as older, and the page's row stayed
    # as it said for the year. Its times are taken as the record took it.
    now = datetime.now(UTC)

    def attempt(title: str, at: datetime) -> CrawlCompleted:
        success = {"outcome": CrawlOutcome.SUCCESS, "status_code": 200, "title": title}
        return _attempt(at, occurred_at=at, **success)

    ahead = now + timedelta(days=365)
    async with services(stack, state_dir, {}, only=("recorder",)):
        await bus.publish(attempt("Skewed", ahead))
        await bus.publish(attempt("Real", datetime.now(UTC)))
        await eventually(
            lambda: query(engine, "SELECT count(*) AS n FROM projected_events"),
            until=lambda rows: rows[0].n == 2,
            timeout=30,
            what="both attempts applied",
        )
    (page,) = await query(engine, "SELECT title, last_crawled_at FROM pages")
    assert page.title == "Real"
    assert page.last_crawled_at < now + timedelta(minutes=5)
    live = await checksums(engine)

    target = await empty_database(stack)
    stats = await replay(stack.nats_url, target, RetryPolicy())
    assert (stats.events, stats.applied) == (2, 2)
    replayed_engine = create_async_engine(target)
    try:
        assert await checksums(replayed_engine) == live
    finally:
        await replayed_engine.dispose()


async def test_a_whole_replay_of_a_record_its_retention_cut_is_refused_and_keeps_the_tables(
    stack: StackUrls, bus: Bus, engine: AsyncEngine
) -> None:
    """The record's oldest events gone (as ``TROVE_EVENTS_MAX_AGE_SECONDS`` removes them):
    ``--truncate`` would empty the tables and rebuild only what is left, and say it
    replayed. It is refused, and the tables stay as they were."""
    old = utcnow() - timedelta(hours=2)
    for n in range(3):
        await bus.publish(completed(n).model_copy(update={"started_at": old, "completed_at": old}))
    for n in range(3, 6):
        await bus.publish(completed(n))
    policy = RetryPolicy(max_attempts=3, delay_seconds=3600.0)
    await replay(stack.nats_url, stack.database_url, policy, batch=2)
    before = await count(engine, "page_crawls")
    info = await bus.js.stream_info(EVENTS_STREAM)
    await bus.js.purge_stream(EVENTS_STREAM, seq=info.state.first_seq + 3)

    with pytest.raises(RecordIncomplete, match="retention"):
        await replay(stack.nats_url, stack.database_url, policy, truncate=True, batch=2)

    assert await count(engine, "page_crawls") == before == 6
