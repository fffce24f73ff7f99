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
projected.

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

Time is a seam: ``now`` is injected, so a test runs "90 days" in seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from trove_schema.settings import RecorderSettings

log = logging.getLogger("trove.recorder")

_DELETE = text(
    "DELETE FROM fetcher_attempts WHERE id IN (SELECT id FROM fetcher_attempts "
    "WHERE attempted_at < :cutoff ORDER BY attempted_at LIMIT :batch) RETURNING id"
)
_DELETE_TAGS = text("DELETE FROM attempt_heuristics WHERE attempt_id = ANY(CAST(:ids AS bigint[]))")
# A page's ``fetched_at`` is the completion of a success of it (its newest one applied in
# order: never later than its newest), so what completed before it was superseded; a
# primary-key probe a row instead of a scan of the page's history. In the order of
# completion, from where the last batch stopped: the old rows pages keep are passed once
# a pass, not again by every batch.
_DELETE_CRAWLS = text(
    "WITH expired AS (SELECT c.id, c.completed_at FROM page_crawls c "
    "JOIN pages p ON p.id = c.page_id "
    "WHERE c.completed_at < :cutoff AND c.completed_at >= :after "
    "AND c.completed_at < p.fetched_at "
    "ORDER BY c.completed_at LIMIT :batch) "
    "DELETE FROM page_crawls d USING expired WHERE d.id = expired.id "
    "RETURNING expired.completed_at"
)
_DELETE_PUBLISHED = text(
    "DELETE FROM outbox WHERE event_id IN (SELECT event_id FROM outbox "
    "WHERE published_at < :cutoff LIMIT :batch) RETURNING event_id"
)
_DELETE_SHARES = text(
    "DELETE FROM page_shares WHERE id IN (SELECT id FROM page_shares "
    "WHERE first_seen_at < :cutoff ORDER BY first_seen_at LIMIT :batch) RETURNING id"
)
# A follow's newest success is a lookup in its index (``follow_id, outcome, poll``): a
# follow that never succeeds keeps every poll, and each of them read all of them, every
# pass.
_DELETE_POLLS = text(
    "WITH old AS (SELECT t.follow_id, t.poll FROM timeline_polls t "
    "WHERE t.completed_at < :cutoff AND (t.poll < (SELECT max(s.poll) FROM timeline_polls s "
    "WHERE s.follow_id = t.follow_id AND s.outcome = 'success') "
    "OR NOT EXISTS (SELECT 1 FROM instances i WHERE i.follow_id = t.follow_id)) "
    "LIMIT :batch) "
    "DELETE FROM timeline_polls d USING old "
    "WHERE d.follow_id = old.follow_id AND d.poll = old.poll RETURNING d.poll"
)
_DELETE_APPLIED = text(
    "DELETE FROM projected_events WHERE event_id IN (SELECT event_id FROM projected_events "
    "WHERE projected_at < :cutoff LIMIT :batch) RETURNING event_id"
)


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
    #: Rows deleted per statement.
    batch: int = 5_000
    #: Time between passes.
    interval: float = 600.0

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
        )


def _utcnow() -> datetime:
    return datetime.now(UTC)


async def _in_batches(
    sessions: async_sessionmaker[AsyncSession],
    batch: int,
    step: Callable[[AsyncSession], Awaitable[int]],
    stop: asyncio.Event | None = None,
) -> list[int]:
    """Run ``step`` (which deletes at most ``batch`` rows) a transaction at a time until
    it deletes fewer, or ``stop`` is set (a first pass over months of rows takes minutes:
    a stopping recorder does not wait for it); the rows each batch deleted."""
    deleted: list[int] = []
    while stop is None or not stop.is_set():
        async with sessions.begin() as session:
            count = await step(session)
        if count:
            deleted.append(count)
        if count < batch:
            return deleted
    return deleted


async def prune(
    sessions: async_sessionmaker[AsyncSession],
    retention: Retention,
    now: Callable[[], datetime] = _utcnow,
    stop: asyncio.Event | None = None,
) -> list[int]:
    """Delete every attempt older than the window; the rows each batch deleted."""
    if retention.window is None:
        return []
    params = {"cutoff": now() - retention.window, "batch": retention.batch}

    async def step(session: AsyncSession) -> int:
        ids = list((await session.execute(_DELETE, params)).scalars().all())
        if ids:
            await session.execute(_DELETE_TAGS, {"ids": ids})
        return len(ids)

    return await _in_batches(sessions, retention.batch, step, stop)


_OLDEST = datetime.min.replace(tzinfo=UTC)


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

    async def step(session: AsyncSession) -> int:
        ages = list((await session.execute(_DELETE_CRAWLS, params)).scalars().all())
        if ages:
            params["after"] = resume.after = max(ages)
        return len(ages)

    return sum(await _in_batches(sessions, retention.batch, step, stop))


async def prune_published(
    sessions: async_sessionmaker[AsyncSession],
    retention: Retention,
    now: Callable[[], datetime] = _utcnow,
    stop: asyncio.Event | None = None,
) -> int:
    """Delete the outbox rows published longer than ``published_window`` ago; how many."""
    cutoff = now() - retention.published_window
    return await _delete_before(sessions, _DELETE_PUBLISHED, cutoff, retention.batch, stop)


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
    return await _delete_before(sessions, _DELETE_SHARES, cutoff, retention.batch, stop)


async def prune_polls(
    sessions: async_sessionmaker[AsyncSession],
    retention: Retention,
    now: Callable[[], datetime] = _utcnow,
    stop: asyncio.Event | None = None,
) -> int:
    """Delete the polls older than ``polls_window`` that no row needs; how many left."""
    cutoff = now() - retention.polls_window
    return await _delete_before(sessions, _DELETE_POLLS, cutoff, retention.batch, stop)


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
    return await _delete_before(sessions, _DELETE_APPLIED, cutoff, retention.batch, stop)


async def _delete_before(
    sessions: async_sessionmaker[AsyncSession],
    statement: TextClause,
    cutoff: datetime,
    batch: int,
    stop: asyncio.Event | None = None,
) -> int:
    """Run ``statement`` (which deletes at most ``batch`` rows older than ``cutoff``) until
    none is left; how many it deleted."""
    params = {"cutoff": cutoff, "batch": batch}

    async def step(session: AsyncSession) -> int:
        return len((await session.execute(statement, params)).all())

    return sum(await _in_batches(sessions, batch, step, stop))


async def run_retention(
    sessions: async_sessionmaker[AsyncSession],
    retention: Retention,
    stop: asyncio.Event,
    now: Callable[[], datetime] = _utcnow,
) -> None:
    """Prune every ``interval`` until ``stop``; a failed step is logged and tried again
    at the next pass, and the steps after it run all the same: one table's trouble does
    not let the others grow."""
    cursor = HistoryCursor()
    while not stop.is_set():
        batches = await _logged("the audit", prune(sessions, retention, now, stop))
        crawls = await _logged(
            "the crawl history", prune_crawls(sessions, retention, now, cursor, stop)
        )
        published = await _logged("the outbox", prune_published(sessions, retention, now, stop))
        shares = await _logged("the shares", prune_shares(sessions, retention, now, stop))
        polls = await _logged("the polls", prune_polls(sessions, retention, now, stop))
        applied = await _logged("the applied ids", prune_applied(sessions, retention, now, stop))
        if batches:
            log.info(
                "audit retention deleted %d attempts",
                sum(batches),
                extra={"batches": len(batches)},
            )
        if crawls:
            log.info("retention deleted %d superseded attempts of the crawl history", crawls)
        if published:
            log.info("retention deleted %d published outbox rows", published)
        if shares:
            log.info("retention deleted %d shares of followed timelines' posts", shares)
        if polls:
            log.info("retention deleted %d polls of followed timelines", polls)
        if applied:
            log.info("retention deleted %d ids of events the record no longer holds", applied)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=retention.interval)


_T = TypeVar("_T")


async def _logged(what: str, step: Awaitable[_T]) -> _T | None:
    """Run one step of a pass; what it raised is logged, and it deleted nothing."""
    try:
        return await step
    except Exception as exc:
        # The database away: the next pass catches up, nothing is lost by waiting.
        log.warning("retention of %s: %s", what, exc)
        return None
