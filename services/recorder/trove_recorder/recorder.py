"""The recorder: projects the event record into Postgres and publishes retries.

Thin handler: decode, apply in a transaction, commit; the consumer loop acks after the
commit. Postgres being away is a ``Retry`` (the message is handed back and redelivered
later, nothing is acked), so the recorder catches up when the database returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime

from nats.aio.msg import Msg
from sqlalchemy import select, update
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

from trove_recorder.batch import apply_batch
from trove_recorder.page_ids import PageIds
from trove_recorder.projections import RetryPolicy, apply
from trove_schema.bus import BatchConsumer, Bus, Retry
from trove_schema.events import decode_event
from trove_schema.metrics import PROJECTED, PROJECTION_BATCH_SECONDS, PROJECTION_LAG_SECONDS
from trove_schema.migrate import upgrade_async
from trove_schema.settings import RecorderSettings
from trove_schema.tables import Outbox
from trove_schema.topology import EVENTS_STREAM, RECORDER, TopologyOptions, declare, ensure_topology

log = logging.getLogger("trove.recorder")

#: Errors that mean "the database is away or busy", not "this event is bad".
TRANSIENT_DB_ERRORS = (OperationalError, InterfaceError, OSError, ConnectionError)


#: deadlock_detected, serialization_failure: the transaction lost a race, not a bad event.
RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})


def _sqlstate(exc: DBAPIError) -> str | None:
    code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
    return str(code) if code else None


@contextlib.contextmanager
def _database_trouble_is_retried() -> Iterator[None]:
    """Translate "the database is away or lost a race" into Retry; a bad event stays an error."""
    try:
        yield
    except TRANSIENT_DB_ERRORS as exc:
        raise Retry(f"database unavailable: {exc}", delay=2.0) from exc
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise Retry(f"database connection lost: {exc}", delay=2.0) from exc
        if _sqlstate(exc) in RETRYABLE_SQLSTATES:
            # Two transactions touching the same pages at once: run it again shortly.
            raise Retry(f"transaction conflict: {_sqlstate(exc)}", delay=0.2) from exc
        raise


def make_engine(url: str) -> AsyncEngine:
    return create_async_engine(url, pool_size=10, max_overflow=10, pool_pre_ping=True)


class Recorder:
    """Applies events; owns the session factory and the outbox publisher's wake-up."""

    def __init__(
        self, engine: AsyncEngine, bus: Bus, policy: RetryPolicy, page_id_cache: int = 0
    ) -> None:
        self.sessions = async_sessionmaker(engine, expire_on_commit=False)
        self.bus = bus
        self.policy = policy
        self.known = PageIds(page_id_cache)
        self.outbox_wakeup = asyncio.Event()

    async def handle_batch(self, msgs: Sequence[Msg]) -> None:
        """Apply a batch of events in one transaction (stream order within the batch)."""
        events = [decode_event(m.data) for m in msgs]
        with _database_trouble_is_retried(), PROJECTION_BATCH_SECONDS.time():
            async with self.sessions.begin() as session:
                applied = await apply_batch(session, events, self.policy, self.known)
        self.known.learn(applied.generation, applied.page_ids)  # committed: safe to remember
        if applied.count:
            PROJECTED.inc(applied.count)
            newest = max(e.occurred_at for e in events)
            PROJECTION_LAG_SECONDS.set((datetime.now(UTC) - newest).total_seconds())
            self.outbox_wakeup.set()

    async def handle(self, msg: Msg) -> None:
        event = decode_event(msg.data)
        with _database_trouble_is_retried():
            async with self.sessions.begin() as session:
                applied = await apply(session, event, self.policy)
        if applied:
            self.outbox_wakeup.set()
            log.debug("projected", extra={"event_id": event.id, "type": event.TYPE})

    async def publish_outbox(self, stop: asyncio.Event) -> None:
        """Publish pending outbox rows (retries) as scheduled messages, then mark them sent."""
        while not stop.is_set():
            try:
                sent = await self._publish_batch()
            except Exception as exc:
                log.warning("outbox: %s", exc)
                sent = 0
            if sent:
                continue
            self.outbox_wakeup.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.outbox_wakeup.wait(), timeout=1.0)

    async def _publish_batch(self, limit: int = 100) -> int:
        async with self.sessions.begin() as session:
            rows = (
                (
                    await session.execute(
                        select(Outbox)
                        .where(Outbox.published_at.is_(None))
                        .order_by(Outbox.created_at)
                        .limit(limit)
                        .with_for_update(skip_locked=True)
                    )
                )
                .scalars()
                .all()
            )
            for row in rows:
                event = decode_event(row.payload)
                if row.deliver_at is not None:
                    await self.bus.publish_at(event, row.deliver_at, subject=row.subject)
                else:
                    await self.bus.publish(event, subject=row.subject)
            if rows:
                await session.execute(
                    update(Outbox)
                    .where(Outbox.event_id.in_([r.event_id for r in rows]))
                    .values(published_at=datetime.now(UTC))
                )
            return len(rows)


async def serve(settings: RecorderSettings, stop: asyncio.Event, ready: asyncio.Event) -> None:
    if not settings.nats_url or not settings.database_url:
        raise SystemExit("the recorder needs TROVE_NATS_URL and TROVE_DATABASE_URL")
    await upgrade_async(settings.database_url)
    bus = await Bus.connect(settings.nats_url, name="trove-recorder")
    engine = make_engine(settings.database_url)
    try:
        await ensure_topology(
            bus.js, declare(TopologyOptions.from_settings(settings)), owner="recorder"
        )
        recorder = Recorder(
            engine,
            bus,
            RetryPolicy(
                max_attempts=settings.max_attempts, delay_seconds=settings.retry_delay_seconds
            ),
            page_id_cache=settings.page_id_cache,
        )
        consumer = BatchConsumer(
            bus=bus,
            stream=EVENTS_STREAM,
            durable=RECORDER,
            batch_handler=recorder.handle_batch,
            handler=recorder.handle,
            batch_size=settings.batch_size,
            linger=settings.batch_linger_seconds,
        )
        ready.set()
        await asyncio.gather(consumer.run(stop), recorder.publish_outbox(stop))
    finally:
        await bus.close()
        await engine.dispose()
