"""Rebuild every projection from the event record: ``trove replay``.

Reads ``TROVE_EVENTS`` from the first message to the last one present when the replay
starts, with an ordered (ephemeral) consumer, and applies each event exactly as the
live recorder does, in batches of one transaction each. Retries decided during replay
are marked as already published: the record holds the ones that really happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError
from sqlalchemy import text, update
from sqlalchemy.ext.asyncio import async_sessionmaker

from trove_recorder.projections import RetryPolicy, apply
from trove_recorder.recorder import make_engine
from trove_schema.bus import Bus
from trove_schema.errors import MalformedEvent, TroveError
from trove_schema.events import decode_event
from trove_schema.migrate import upgrade_async
from trove_schema.tables import Outbox
from trove_schema.topology import (
    CRAWL_COMPLETED,
    CRAWL_REQUESTED,
    EVENTS_STREAM,
    PAGE_DISCOVERED,
    SEED_REJECTED,
)

log = logging.getLogger("trove.recorder.replay")

PROJECTION_TABLES = (
    "page_outlinks",
    "page_crawls",
    "pages",
    "seed_rejections",
    "projected_events",
    "outbox",
)


class NotEmpty(TroveError):
    """The target database already holds projections; replay refuses to mix them."""


@dataclass(slots=True)
class ReplayStats:
    events: int = 0
    applied: int = 0
    malformed: int = 0
    seconds: float = 0.0


async def replay(
    nats_url: str,
    database_url: str,
    policy: RetryPolicy,
    *,
    truncate: bool = False,
    batch: int = 500,
) -> ReplayStats:
    await upgrade_async(database_url)
    engine = make_engine(database_url)
    bus = await Bus.connect(nats_url, name="trove-replay")
    stats = ReplayStats()
    started = time.monotonic()
    try:
        async with engine.begin() as conn:
            if truncate:
                await conn.execute(
                    text(f"TRUNCATE {', '.join(PROJECTION_TABLES)} RESTART IDENTITY CASCADE")
                )
            elif (await conn.execute(text("SELECT count(*) FROM projected_events"))).scalar_one():
                raise NotEmpty("the database already has projections: use --truncate")
        subjects = {SEED_REJECTED, PAGE_DISCOVERED, CRAWL_REQUESTED, CRAWL_COMPLETED}
        last = 0
        for subject in subjects:
            # The stream's own last sequence may be a schedule, which is deleted once it
            # fires: wait for the last *event* present now, not for that.
            with contextlib.suppress(NotFoundError):
                found = await bus.js.get_last_msg(EVENTS_STREAM, subject)
                last = max(last, found.seq or 0)
        if last == 0:
            return stats
        sessions = async_sessionmaker(engine, expire_on_commit=False)
        sub = await bus.js.subscribe(
            "trove.events.>",
            stream=EVENTS_STREAM,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
        )
        done = False
        while not done:
            async with sessions.begin() as session:
                for _ in range(batch):
                    msg = await sub.next_msg(timeout=10)
                    seq = msg.metadata.sequence.stream
                    if msg.subject in subjects:
                        stats.events += 1
                        try:
                            event = decode_event(msg.data)
                        except MalformedEvent:
                            stats.malformed += 1
                        else:
                            stats.applied += int(await apply(session, event, policy))
                    if seq >= last:
                        done = True
                        break
                await session.execute(
                    update(Outbox)
                    .where(Outbox.published_at.is_(None))
                    .values(published_at=datetime.now(UTC))
                )
            log.info("replayed up to %d of %d", seq, last)
        await sub.unsubscribe()
    finally:
        await bus.close()
        await engine.dispose()
    stats.seconds = time.monotonic() - started
    return stats


def run_replay(nats_url: str, database_url: str, policy: RetryPolicy, truncate: bool) -> int:
    try:
        stats = asyncio.run(replay(nats_url, database_url, policy, truncate=truncate))
    except NotEmpty as exc:
        print(f"error: {exc}")
        return 2
    rate = stats.events / stats.seconds if stats.seconds else 0.0
    print(
        f"replayed {stats.events} events ({stats.applied} applied, {stats.malformed} malformed) "
        f"in {stats.seconds:.1f}s, {rate:.0f} events/s"
    )
    return 0
