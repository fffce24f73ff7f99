"""Audit retention: attempts older than the window are deleted, a batch at a time.

The audit (``fetcher_attempts`` and its tags in ``attempt_heuristics``) grows with
every request; the event record keeps what it needs for a replay. Each step deletes
at most ``batch`` of the oldest expired attempts, and their tags, in a transaction of
its own, so pruning a backlog never holds locks long nor fills the WAL at once, and
the live projection's inserts go on between batches.

Time is a seam: ``now`` is injected, so a test runs "90 days" in seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

log = logging.getLogger("trove.recorder")

_DELETE = text(
    "DELETE FROM fetcher_attempts WHERE id IN (SELECT id FROM fetcher_attempts "
    "WHERE attempted_at < :cutoff ORDER BY attempted_at LIMIT :batch) RETURNING id"
)
_DELETE_TAGS = text("DELETE FROM attempt_heuristics WHERE attempt_id = ANY(CAST(:ids AS bigint[]))")


@dataclass(frozen=True, kw_only=True, slots=True)
class Retention:
    #: How long an attempt stays in the audit.
    window: timedelta
    #: Rows deleted per statement.
    batch: int = 5_000
    #: Time between passes.
    interval: float = 600.0


def _utcnow() -> datetime:
    return datetime.now(UTC)


async def prune(
    sessions: async_sessionmaker[AsyncSession],
    retention: Retention,
    now: Callable[[], datetime] = _utcnow,
) -> list[int]:
    """Delete every attempt older than the window; the rows each batch deleted."""
    cutoff = now() - retention.window
    deleted: list[int] = []
    while True:
        async with sessions.begin() as session:
            ids = list(
                (await session.execute(_DELETE, {"cutoff": cutoff, "batch": retention.batch}))
                .scalars()
                .all()
            )
            if ids:
                await session.execute(_DELETE_TAGS, {"ids": ids})
        count = len(ids)
        if count:
            deleted.append(count)
        if count < retention.batch:
            return deleted


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
        except Exception as exc:
            # The database away: the next pass catches up, nothing is lost by waiting.
            log.warning("audit retention: %s", exc)
        else:
            if batches:
                log.info(
                    "audit retention deleted %d attempts",
                    sum(batches),
                    extra={"batches": len(batches)},
                )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=retention.interval)
