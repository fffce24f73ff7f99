"""Retention: the audit's old attempts, the crawl history's, the outbox's published rows,
and the ids of events the record no longer holds.

The audit (``fetcher_attempts`` and its tags in ``attempt_heuristics``) grows with
every request; the event record keeps what it needs for a replay. It is kept
``TROVE_AUDIT_RETENTION_SECONDS`` (90 days; 0: for ever). Each step deletes
at most ``batch`` of the oldest expired attempts, and their tags, in a transaction of
its own, so pruning a backlog never holds locks long nor fills the WAL at once, and
the live projection's inserts go on between batches.

``page_crawls`` (the crawl history, a row an attempt) is kept for ever unless
``TROVE_CRAWL_HISTORY_RETENTION_SECONDS`` says otherwise. Its retention deletes the
attempts older than the window that completed before their page's ``fetched_at`` (a
success of the page, the newest the projection applied as the page's newest attempt, so
never later than its newest success). Each page keeps that success and every attempt
after it, whatever their age, since the retry policy counts a page's attempts since its
last success: the window can be any length without a retry more or less. Ages are the
attempts' own (``completed_at``), which a replay writes again, not the time a row was
projected. A statement reads the next ``batch`` attempts past the window's start, in the
order of completion, and deletes the superseded among them: the rows pages keep are read
once (a pass goes on after the last attempt the one before it read, and starts over once
a day: ``HistoryCursor``), not walked by one statement looking for rows it may delete.

An ``outbox`` row (a retry to publish) has done its work once published: the retry is
in the record from then on, and nothing reads the row again (a replay decides the
retries again from the attempts). Published rows leave a day later: otherwise every
retry would keep a row for ever.

``projected_events`` (the ids of applied events, which make a redelivery harmless)
grows by one row an event. A copy of an event can be delivered only while the record
holds it, so once ``TROVE_EVENTS`` has a retention, the ids leave the same way, a batch
at a time, after twice the record's age. A copy stored before the first projection
leaves the record within one age of it; one stored after it (a producer's retry after
a lost PubAck, the outbox's re-send after a crash: moments later) is still caught
while it was stored within one age of it. With no retention the record, and so the
ids, are kept for ever.

``page_shares`` (a row a link shared by a post of a followed timeline: a federated
timeline of a large instance brings thousands a day) is kept for ever unless
``TROVE_SHARES_RETENTION_SECONDS`` says otherwise; then a share first seen before the
window leaves, and a page's shares count those of the window.

``timeline_polls`` (a row a poll of a followed timeline, which the projection counts
each poll once by, and works a timeline's last poll and run of failures out of) keeps
each follow's polls from its newest success on, and the rest for a week: the same poll
made twice (its request redelivered) comes within minutes, not a week later. A follow
no timeline holds any more (replaced, or the row gone) keeps nothing past the week.

A pass runs on one recorder at a time: it holds an advisory lock (``RETENTION_LOCK``) on
a connection of its own, whose transactions are its batches, and a recorder that finds
the lock held skips that pass (two would walk the same rows, each waiting on the other's
row locks). A connection lost takes the lock with it, and its pass stops there: the next
pass, on either recorder, takes the lock again.

Time is a seam: ``now`` is injected, so a test runs "90 days" in seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker

from trove_recorder.database import BATCH_TIMEOUT, bounded_transaction
from trove_recorder.errors import RebuildUnderWay
from trove_recorder.replay import rebuilding
from trove_schema.settings import RecorderSettings

log = logging.getLogger("trove.recorder")

# Each batch of a pass goes on from the age of the newest row the last one deleted
# (``after``): the rows earlier batches deleted stay in the index until a vacuum, and
# a batch that began from the oldest again would read them all, each batch of a backlog
# more than the last.
_DELETE = text(
    "DELETE FROM fetcher_attempts WHERE id IN (SELECT id FROM fetcher_attempts "
    "WHERE attempted_at < :cutoff AND attempted_at >= :after "
    "ORDER BY attempted_at LIMIT :batch) RETURNING attempted_at, id"
)
_DELETE_TAGS = text("DELETE FROM attempt_heuristics WHERE attempt_id = ANY(CAST(:ids AS bigint[]))")
# The next ``batch`` attempts in the order of completion (with those completed at the
# same moment as the last, so the next statement goes on after it), read from
# ``page_crawls`` alone, and the superseded among them deleted: the rows pages keep
# (each page's last success and what came after, every attempt of a page never fetched)
# cost a pass one read each, in statements of ``batch`` rows, never one statement that
# walks them all for a batch it can delete. A page's ``fetched_at`` is the completion of
# a success of it (its newest one applied in order: never later than its newest), so
# what completed before it was superseded; a primary-key probe a row.
_DELETE_CRAWLS = text(
    "WITH scanned AS (SELECT c.id, c.page_id, c.completed_at FROM page_crawls c "
    "WHERE c.completed_at < :cutoff AND c.completed_at > :after "
    "ORDER BY c.completed_at FETCH FIRST (:batch) ROWS WITH TIES), "
    "gone AS (DELETE FROM page_crawls d USING scanned s, pages p "
    "WHERE d.id = s.id AND p.id = s.page_id AND s.completed_at < p.fetched_at "
    "RETURNING d.id) "
    "SELECT count(*) AS read, max(s.completed_at) AS last, "
    "(SELECT count(*) FROM gone) AS deleted FROM scanned s"
)
_DELETE_PUBLISHED = text(
    "DELETE FROM outbox WHERE event_id IN (SELECT event_id FROM outbox "
    "WHERE published_at < :cutoff AND published_at >= :after "
    "ORDER BY published_at LIMIT :batch) RETURNING published_at, event_id"
)
_DELETE_SHARES = text(
    "DELETE FROM page_shares WHERE id IN (SELECT id FROM page_shares "
    "WHERE first_seen_at < :cutoff AND first_seen_at >= :after "
    "ORDER BY first_seen_at LIMIT :batch) RETURNING first_seen_at, id"
)
# A follow's newest success is a lookup in its index (``follow_id, outcome, poll``): a
# follow that never succeeds keeps every poll, and each of them read all of them, every
# pass. A poll is old by its time and by when it was projected: a replay, or a recorder
# catching up on a week's backlog, projects old polls now, and one deleted then would
# count a copy of it (its request answered twice) that came later in the record again.
_DELETE_POLLS = text(
    "WITH old AS (SELECT t.follow_id, t.poll FROM timeline_polls t "
    "WHERE t.completed_at < :cutoff AND NOT EXISTS (SELECT 1 FROM projected_events e "
    "WHERE e.event_id = t.event_id AND e.projected_at >= :cutoff) "
    "AND (t.poll < (SELECT max(s.poll) FROM timeline_polls s "
    "WHERE s.follow_id = t.follow_id AND s.outcome = 'success' "
    "AND s.unasked_event IS DISTINCT FROM s.event_id) "
    "OR NOT EXISTS (SELECT 1 FROM instances i WHERE i.follow_id = t.follow_id)) "
    "LIMIT :batch) "
    "DELETE FROM timeline_polls d USING old "
    "WHERE d.follow_id = old.follow_id AND d.poll = old.poll RETURNING d.poll"
)
_DELETE_APPLIED = text(
    "DELETE FROM projected_events WHERE event_id IN (SELECT event_id FROM projected_events "
    "WHERE projected_at < :cutoff AND projected_at >= :after "
    "ORDER BY projected_at LIMIT :batch) RETURNING projected_at, event_id"
)
#: Held by the recorder running a retention pass, for the pass (a session lock): the
#: other replicas skip theirs, which would walk the same rows and wait on its row locks.
RETENTION_LOCK = 0x72657461696E  # "retain"
_TRY_LOCK = text("SELECT pg_try_advisory_lock(:lock)")
_UNLOCK = text("SELECT pg_advisory_unlock(:lock)")


@dataclass(frozen=True, kw_only=True, slots=True)
class Retention:
    #: How long an attempt stays in the audit; None: for ever.
    window: timedelta | None
    #: How long a superseded attempt stays in the crawl history; None: for ever.
    crawl_window: timedelta | None = None
    #: How long a published outbox row stays, for an operator's look.
    published_window: timedelta = timedelta(days=1)
    #: How long a share stays; None: for ever.
    shares_window: timedelta | None = None
    #: How long a poll a timeline's row no longer needs stays (see the module).
    polls_window: timedelta = timedelta(days=7)
    #: How long the ids of applied events are kept: twice the record's age (see the
    #: module); None while the record is kept for ever.
    applied_window: timedelta | None = None
    #: Rows a statement deletes at most (the crawl history's: reads, the ones it keeps
    #: too).
    batch: int = 5_000
    #: Time between passes.
    interval: float = 600.0
    #: Longest a batch's transaction runs (``database.bounded_transaction``).
    batch_timeout: float = BATCH_TIMEOUT

    @classmethod
    def from_settings(cls, settings: RecorderSettings) -> Retention:
        max_age = settings.events_max_age_seconds
        audit = settings.audit_retention_seconds
        crawls = settings.crawl_history_retention_seconds
        shares = settings.shares_retention_seconds
        return cls(
            window=timedelta(seconds=audit) if audit else None,
            crawl_window=timedelta(seconds=crawls) if crawls else None,
            shares_window=timedelta(seconds=shares) if shares else None,
            applied_window=timedelta(seconds=2 * max_age) if max_age else None,
            batch=settings.audit_prune_batch,
            interval=settings.audit_prune_interval_seconds,
            batch_timeout=settings.batch_timeout_seconds,
        )


_T = TypeVar("_T")


def _utcnow() -> datetime:
    return datetime.now(UTC)


async def _in_batches(
    sessions: async_sessionmaker[AsyncSession],
    retention: Retention,
    step: Callable[[AsyncSession], Awaitable[int]],
    stop: asyncio.Event | None = None,
) -> list[int]:
    """Run ``step`` (which goes through at most ``retention.batch`` rows) a transaction at
    a time until it goes through fewer, or ``stop`` is set (a first pass over months of
    rows takes minutes: a stopping recorder does not wait for it); the rows each batch
    went through. A batch the database leaves unanswered past ``retention.batch_timeout``
    loses the pass's connection, and the lock with it: the pass ends there. A batch holds
    the rebuild lock shared, as a live batch does; a rebuild running or stopped partway
    raises ``RebuildUnderWay``."""
    batch, within = retention.batch, retention.batch_timeout
    done: list[int] = []
    while stop is None or not stop.is_set():
        async with bounded_transaction(sessions, within, "a batch of retention") as session:
            reason = await rebuilding(session)
            if reason is not None:
                raise RebuildUnderWay(reason)
            count = await step(session)
        if count:
            done.append(count)
        if count < batch:
            return done
    return done


_OLDEST = datetime.min.replace(tzinfo=UTC)


async def _delete_oldest(
    sessions: async_sessionmaker[AsyncSession],
    statement: TextClause,
    cutoff: datetime,
    retention: Retention,
    stop: asyncio.Event | None = None,
    with_them: Callable[[AsyncSession, list[Any]], Awaitable[object]] | None = None,
) -> list[int]:
    """Run ``statement`` (which deletes at most ``batch`` of the oldest rows older than
    ``cutoff`` from ``after`` on, and returns their ages and keys) until none is left,
    each batch from the newest age the last one deleted; ``with_them`` runs in a batch's
    transaction with the keys it deleted. The rows each batch deleted."""
    params = {"cutoff": cutoff, "after": _OLDEST, "batch": retention.batch}

    async def step(session: AsyncSession) -> int:
        found = (await session.execute(statement, params)).all()
        if found:
            params["after"] = max(age for age, _ in found)
            if with_them is not None:
                await with_them(session, [key for _, key in found])
        return len(found)

    return await _in_batches(sessions, retention, step, stop)


async def prune(
    sessions: async_sessionmaker[AsyncSession],
    retention: Retention,
    now: Callable[[], datetime] = _utcnow,
    stop: asyncio.Event | None = None,
) -> list[int]:
    """Delete every attempt older than the window; the rows each batch deleted."""
    if retention.window is None:
        return []

    async def tags(session: AsyncSession, ids: list[Any]) -> None:
        await session.execute(_DELETE_TAGS, {"ids": ids})

    cutoff = now() - retention.window
    return await _delete_oldest(sessions, _DELETE, cutoff, retention, stop, tags)


@dataclass(slots=True)
class HistoryCursor:
    """Where the crawl history's passes go on from, between passes of one recorder.

    The old attempts pages keep (every attempt since a page's last success) would
    otherwise be walked again by every pass, every ``interval``; a dead page keeps a few
    each time a link brings it back. A kept attempt becomes superseded only when its page
    succeeds again, behind the cursor, so a pass starts from the oldest row again once
    every ``rescan``: such an attempt leaves within that time of its page's success.
    """

    rescan: timedelta = timedelta(days=1)
    #: The completion of the last attempt read; the next statement reads those after it.
    after: datetime = _OLDEST
    rescanned_at: datetime | None = None


async def prune_crawls(
    sessions: async_sessionmaker[AsyncSession],
    retention: Retention,
    now: Callable[[], datetime] = _utcnow,
    cursor: HistoryCursor | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Delete the superseded attempts older than ``crawl_window`` (from ``cursor`` on,
    when one is given); how many left."""
    if retention.crawl_window is None:
        return 0
    at = now()
    resume = cursor or HistoryCursor()
    if resume.rescanned_at is None or at - resume.rescanned_at >= resume.rescan:
        resume.after, resume.rescanned_at = _OLDEST, at
    params = {
        "cutoff": at - retention.crawl_window,
        "after": resume.after,
        "batch": retention.batch,
    }
    deleted = 0

    async def step(session: AsyncSession) -> int:
        nonlocal deleted
        read, last, gone = (await session.execute(_DELETE_CRAWLS, params)).one()
        if last is not None:
            params["after"] = resume.after = last
        deleted += gone
        return int(read)

    await _in_batches(sessions, retention, step, stop)
    return deleted


async def prune_published(
    sessions: async_sessionmaker[AsyncSession],
    retention: Retention,
    now: Callable[[], datetime] = _utcnow,
    stop: asyncio.Event | None = None,
) -> int:
    """Delete the outbox rows published longer than ``published_window`` ago; how many."""
    cutoff = now() - retention.published_window
    return sum(await _delete_oldest(sessions, _DELETE_PUBLISHED, cutoff, retention, stop))


async def prune_shares(
    sessions: async_sessionmaker[AsyncSession],
    retention: Retention,
    now: Callable[[], datetime] = _utcnow,
    stop: asyncio.Event | None = None,
) -> int:
    """Delete the shares first seen before ``shares_window``; how many left."""
    if retention.shares_window is None:
        return 0
    cutoff = now() - retention.shares_window
    return sum(await _delete_oldest(sessions, _DELETE_SHARES, cutoff, retention, stop))


async def prune_polls(
    sessions: async_sessionmaker[AsyncSession],
    retention: Retention,
    now: Callable[[], datetime] = _utcnow,
    stop: asyncio.Event | None = None,
) -> int:
    """Delete the polls older than ``polls_window`` that no row needs; how many left."""
    cutoff = now() - retention.polls_window
    params = {"cutoff": cutoff, "batch": retention.batch}

    async def step(session: AsyncSession) -> int:
        return len((await session.execute(_DELETE_POLLS, params)).all())

    return sum(await _in_batches(sessions, retention, step, stop))


async def prune_applied(
    sessions: async_sessionmaker[AsyncSession],
    retention: Retention,
    now: Callable[[], datetime] = _utcnow,
    stop: asyncio.Event | None = None,
) -> int:
    """Delete the ids of applied events older than ``applied_window``; how many left."""
    if retention.applied_window is None:
        return 0
    cutoff = now() - retention.applied_window
    return sum(await _delete_oldest(sessions, _DELETE_APPLIED, cutoff, retention, stop))


@dataclass(slots=True)
class Pruned:
    """What a pass deleted (a step that failed: nothing)."""

    #: The audit's attempts, a batch each.
    audit: list[int] = field(default_factory=list)
    crawls: int = 0
    published: int = 0
    shares: int = 0
    polls: int = 0
    applied: int = 0


async def retention_pass(
    engine: AsyncEngine,
    retention: Retention,
    now: Callable[[], datetime] = _utcnow,
    cursor: HistoryCursor | None = None,
    stop: asyncio.Event | None = None,
) -> Pruned | None:
    """Prune every table once, unless another recorder's pass runs: then nothing (None).
    A whole replay's rebuild met (running, or stopped partway) ends the pass there.

    The pass holds ``RETENTION_LOCK`` on a connection of its own, and runs its batches
    in that connection's transactions: a connection lost takes the lock with it, and
    no batch runs after that (SQLAlchemy would open another connection, without the
    lock), so another pass, here or on another replica, may begin at once, alone."""
    async with engine.connect() as conn:
        async with conn.begin():
            if not (await conn.execute(_TRY_LOCK, {"lock": RETENTION_LOCK})).scalar_one():
                log.debug("retention: another recorder's pass runs; this one waits for the next")
                return None
        unlocked = False
        try:
            pruned = await _prune_tables(conn, retention, now, cursor or HistoryCursor(), stop)
            if not conn.invalidated:
                async with conn.begin():
                    await conn.execute(_UNLOCK, {"lock": RETENTION_LOCK})
                unlocked = not conn.invalidated
        finally:
            if not unlocked:
                # Ended, not pooled: a pooled connection would hold the lock for ever,
                # and every pass of every replica would skip.
                await conn.invalidate()
    return pruned


async def _prune_tables(
    conn: AsyncConnection,
    retention: Retention,
    now: Callable[[], datetime],
    cursor: HistoryCursor,
    stop: asyncio.Event | None,
) -> Pruned:
    """Each step on its own: one that fails is logged, and the steps after it run all
    the same (one table's trouble does not let the others grow), while ``conn`` lives."""
    sessions = async_sessionmaker(conn, expire_on_commit=False)

    async def step(what: str, prune_one: Callable[..., Awaitable[_T]]) -> _T | None:
        if conn.invalidated:
            log.warning("retention of %s: the connection holding the lock is lost", what)
            return None
        return await _logged(what, prune_one(sessions, retention, now, stop=stop))

    pruned = Pruned()
    try:
        pruned.audit = await step("the audit", prune) or []
        pruned.crawls = await step("the crawl history", partial(prune_crawls, cursor=cursor)) or 0
        pruned.published = await step("the outbox", prune_published) or 0
        pruned.shares = await step("the shares", prune_shares) or 0
        pruned.polls = await step("the polls", prune_polls) or 0
        pruned.applied = await step("the applied ids", prune_applied) or 0
    except RebuildUnderWay as rebuild:
        log.info("retention waits for its next pass: %s", rebuild)
        # The crawl history is being written anew: the next pass reads it from the start.
        cursor.rescanned_at = None
    return pruned


async def run_retention(
    engine: AsyncEngine,
    retention: Retention,
    stop: asyncio.Event,
    now: Callable[[], datetime] = _utcnow,
) -> None:
    """A pass every ``interval`` until ``stop``, on one recorder at a time; a pass that
    fails (the database away) is logged and tried again at the next."""
    cursor = HistoryCursor()
    while not stop.is_set():
        pruned = await _logged("the tables", retention_pass(engine, retention, now, cursor, stop))
        if pruned is not None:
            _report(pruned)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=retention.interval)


def _report(pruned: Pruned) -> None:
    if pruned.audit:
        log.info(
            "audit retention deleted %d attempts",
            sum(pruned.audit),
            extra={"batches": len(pruned.audit)},
        )
    if pruned.crawls:
        log.info("retention deleted %d superseded attempts of the crawl history", pruned.crawls)
    if pruned.published:
        log.info("retention deleted %d published outbox rows", pruned.published)
    if pruned.shares:
        log.info("retention deleted %d shares of followed timelines' posts", pruned.shares)
    if pruned.polls:
        log.info("retention deleted %d polls of followed timelines", pruned.polls)
    if pruned.applied:
        log.info("retention deleted %d ids of events the record no longer holds", pruned.applied)


async def _logged(what: str, step: Awaitable[_T]) -> _T | None:
    """Run one step of a pass; what it raised is logged, and it deleted nothing. A
    rebuild met ends the whole pass (``_prune_tables``)."""
    try:
        return await step
    except RebuildUnderWay:
        raise
    except Exception as exc:
        # The database away: the next pass catches up, nothing is lost by waiting.
        log.warning("retention of %s: %s", what, exc)
        return None
