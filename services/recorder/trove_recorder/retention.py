"""Retention: the audit's old attempts, and the ids of events the record no longer holds.

The audit (``fetcher_attempts`` and its tags in ``attempt_heuristics``) grows with
every request; the event record keeps what it needs for a replay. Each step deletes
at most ``batch`` of the oldest expired attempts, and their tags, in a transaction of
its own, so pruning a backlog never holds locks long nor fills the WAL at once, and
the live projection's inserts go on between batches.

``projected_events`` (the ids of applied events, which make a redelivery harmless)
grows by one row an event. A copy of an event can be delivered only while the record
holds it, so once ``TROVE_EVENTS`` has a retention, the ids leave the same way, a batch
at a time, after twice the record's age. A copy stored before the first projection
leaves the record within one age of it; one stored after it (a producer's retry after
a lost PubAck, the outbox's re-send after a crash: moments later) is still caught
while it was stored within one age of it. With no retention the record, and so the
ids, are kept for ever.

Time is a seam: ``now`` is injected, so a test runs "90 days" in seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from trove_schema.settings import RecorderSettings

log = logging.getLogger("trove.recorder")

_DELETE = text(
    "DELETE FROM fetcher_attempts WHERE id IN (SELECT id FROM fetcher_attempts "
    "WHERE attempted_at < :cutoff ORDER BY attempted_at LIMIT :batch) RETURNING id"
)
_DELETE_TAGS = text("DELETE FROM attempt_heuristics WHERE attempt_id = ANY(CAST(:ids AS bigint[]))")
_DELETE_APPLIED = text(
    "DELETE FROM projected_events WHERE event_id IN (SELECT event_id FROM projected_events "
    "WHERE projected_at < :cutoff LIMIT :batch) RETURNING event_id"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Retention:
    #: How long an attempt stays in the audit.
    window: timedelta
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
        return cls(
            window=timedelta(seconds=settings.audit_retention_seconds),
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
) -> list[int]:
    """Run ``step`` (which deletes at most ``batch`` rows) a transaction at a time until
    it deletes fewer; the rows each batch deleted."""
    deleted: list[int] = []
    while True:
        async with sessions.begin() as session:
            count = await step(session)
        if count:
            deleted.append(count)
        if count < batch:
            return deleted


async def prune(
    sessions: async_sessionmaker[AsyncSession],
    retention: Retention,
    now: Callable[[], datetime] = _utcnow,
) -> list[int]:
    """Delete every attempt older than the window; the rows each batch deleted."""
    params = {"cutoff": now() - retention.window, "batch": retention.batch}

    async def step(session: AsyncSession) -> int:
        ids = list((await session.execute(_DELETE, params)).scalars().all())
        if ids:
            await session.execute(_DELETE_TAGS, {"ids": ids})
        return len(ids)

    return await _in_batches(sessions, retention.batch, step)


async def prune_applied(
    sessions: async_sessionmaker[AsyncSession],
    retention: Retention,
    now: Callable[[], datetime] = _utcnow,
) -> int:
    """Delete the ids of applied events older than ``applied_window``; how many left."""
    if retention.applied_window is None:
        return 0
    params = {"cutoff": now() - retention.applied_window, "batch": retention.batch}

    async def step(session: AsyncSession) -> int:
        return len((await session.execute(_DELETE_APPLIED, params)).all())

    return sum(await _in_batches(sessions, retention.batch, step))


async def run_retention(
    sessions: async_sessionmaker[AsyncSession],
    retention: Retention,
    stop: asyncio.Event,
    now: Callable[[], datetime] = _utcnow,
) -> None:
    """Prune every ``interval`` until ``stop``; a failed pass is logged and tried again."""
    while not stop.is_set():
        try:
            batches = await prune(sessions, retention, now)
            applied = await prune_applied(sessions, retention, now)
        except Exception as exc:
            # The database away: the next pass catches up, nothing is lost by waiting.
            log.warning("retention: %s", exc)
        else:
            if batches:
                log.info(
                    "audit retention deleted %d attempts",
                    sum(batches),
                    extra={"batches": len(batches)},
                )
            if applied:
                log.info("retention deleted %d ids of events the record no longer holds", applied)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=retention.interval)
