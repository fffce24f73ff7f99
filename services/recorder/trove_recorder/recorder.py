"""The recorder: projects the event record into Postgres and publishes retries.

Thin handler: decode, apply in a transaction, commit; the consumer loop acks after the
commit. A batch and a single message (the fallback for a failed batch) take the same
path. Postgres being away or busy is a ``Retry`` (the messages are handed back and
redelivered later, nothing is acked and nothing counts against them; see
``database``), so the recorder catches up when the database returns. So is a whole
replay rebuilding the tables (``trove_schema.tables.REBUILD_LOCK``), or one that stopped
before its end (``rebuild_marks``): the events wait for it in the stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import UTC, datetime

from nats.aio.msg import Msg
from nats.js.errors import BadRequestError
from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from trove_recorder.database import (
    BATCH_TIMEOUT,
    UNAVAILABLE_DELAY,
    LoginRefusals,
    bounded_transaction,
    canceled,
    database_trouble_is_retried,
    drop_connection,
    make_engine,
    takes_no_writes,
)
from trove_recorder.exclusions import keep_excluded_marked
from trove_recorder.page_ids import PageIds
from trove_recorder.projections import apply_batch
from trove_recorder.replay import page_pending, rebuilding, release_abandoned_holds
from trove_recorder.retention import Retention, run_retention
from trove_recorder.retries import RetryPolicy
from trove_schema import sqlstates
from trove_schema.bus import REFUSED_PATIENCE, BatchConsumer, Bus, Retry, read_event
from trove_schema.errors import MalformedEvent
from trove_schema.events import (
    CrawlCompleted,
    CrawlRequested,
    Event,
    decode_event,
)
from trove_schema.exclusions import Exclusions, ListedExclusions
from trove_schema.metrics import (
    PROJECTED,
    PROJECTION_BATCH_SECONDS,
    PROJECTION_LAG_SECONDS,
    WAITING_FOR_REPLAY,
)
from trove_schema.migrate import upgrade_async
from trove_schema.policy import LearningConfig
from trove_schema.service import together
from trove_schema.settings import RecorderSettings
from trove_schema.tables import Outbox
from trove_schema.topology import (
    EVENTS_STREAM,
    EXCLUSIONS_BUCKET,
    RECORDER,
    TopologyOptions,
    declare,
    ensure_topology,
    page_schedule_subject,
)

log = logging.getLogger("trove.recorder")

#: Seconds between looks at the outbox while it has just been busy (see
#: ``Recorder.publish_outbox``).
OUTBOX_POLL_MIN = 1.0


class Recorder:
    """Applies events; owns the session factory and the outbox publisher's wake-up."""

    def __init__(
        self,
        engine: AsyncEngine,
        bus: Bus,
        policy: RetryPolicy,
        page_id_cache: int = 0,
        learning: LearningConfig | None = None,
        refused_patience: float = REFUSED_PATIENCE,
        batch_timeout: float = BATCH_TIMEOUT,
    ) -> None:
        self.sessions = async_sessionmaker(engine, expire_on_commit=False)
        #: Longest a batch's transaction runs before it is handed back
        #: (``database.bounded_transaction``).
        self.batch_timeout = batch_timeout
        self.bus = bus
        self.policy = policy
        self.learning = learning
        self.known = PageIds(page_id_cache)
        self.outbox_wakeup = asyncio.Event()
        self.refusals = LoginRefusals(refused_patience)
        #: Why the batches are handed back for a replay (said once each), None when not.
        self.waiting_for_replay: str | None = None

    async def handle_batch(self, msgs: Sequence[Msg]) -> None:
        """Apply a batch of events in one transaction (stream order within the batch)."""
        await self.project([read_event(m) for m in msgs], msgs)

    async def handle(self, msg: Msg) -> None:
        """One message of a batch that failed: a batch of one, so a bad event fails alone.

        A statement cancelled even for one event is the server's trouble, not the
        event's (``sqlstates.CANCELED``): it waits as for an outage, never parked."""
        try:
            await self.project([read_event(msg)], [msg])
        except Retry:
            raise
        except Exception as exc:
            if not canceled(exc):
                raise
            reason = f"statement canceled for one event ({sqlstates.CANCELED}): {exc}"
            raise Retry(reason, delay=UNAVAILABLE_DELAY) from exc

    async def project(self, events: Sequence[Event], msgs: Sequence[Msg]) -> None:
        """Apply ``events``, decoded from ``msgs``, in one transaction."""
        try:
            what = f"a batch of {len(events)} event{'' if len(events) == 1 else 's'}"
            with database_trouble_is_retried(), PROJECTION_BATCH_SECONDS.time():
                async with bounded_transaction(self.sessions, self.batch_timeout, what) as session:
                    why = await rebuilding(session)
                    if why is not None:
                        raise self._replay_under_way(why)
                    try:
                        applied = await apply_batch(
                            session, events, self.policy, self.known, learning=self.learning
                        )
                    except Exception as exc:
                        if takes_no_writes(exc):
                            await drop_connection(session, exc)
                        raise
        except Exception as exc:
            self.refusals.met(exc)
            if isinstance(exc, Retry):
                self.known.forget()  # see PageIds: the next batch may meet another server
            raise
        self.refusals.met(None)
        if self.waiting_for_replay is not None:
            self.waiting_for_replay = None
            WAITING_FOR_REPLAY.set(0)
            log.info("the replay has ended: projecting again")
        self.known.learn(applied.generation, applied.page_ids)  # committed: safe to remember
        if applied.count:
            PROJECTED.inc(applied.count)
            # From when the stream stored the newest message, not from its event's time:
            # a re-crawl or a retry is stamped when it is scheduled and stored when
            # JetStream fires it, days later, and it is not late then.
            stored = max(m.metadata.timestamp for m in msgs)
            PROJECTION_LAG_SECONDS.set((datetime.now(UTC) - stored).total_seconds())
            # Only an attempt that may be retried can have written outbox rows: a look at
            # the outbox after every batch was a second transaction per batch.
            if any(isinstance(e, CrawlCompleted) and e.retryable for e in events):
                self.outbox_wakeup.set()

    def _replay_under_way(self, why: str) -> Retry:
        """The batch's ``Retry`` while a whole replay rebuilds the tables, or left them
        half rebuilt: applied now, it would count a page's attempts from the few its
        chain has so far."""
        if self.waiting_for_replay != why:
            self.waiting_for_replay = why
            WAITING_FOR_REPLAY.set(1)
            log.warning("%s: the events wait in the stream", why)
        return Retry(why, delay=UNAVAILABLE_DELAY, expected=True)

    async def publish_outbox(self, stop: asyncio.Event, idle_max: float) -> None:
        """Publish pending outbox rows (retries) as scheduled messages, then mark them sent.

        Between looks it waits to be woken by a projected retry, or for a pause that
        doubles from ``OUTBOX_POLL_MIN`` to ``idle_max`` while the outbox stays empty:
        a look each second was most of an idle recorder's CPU (and its database's).
        """
        pause = OUTBOX_POLL_MIN
        failing = False
        while not stop.is_set():
            # Cleared before the look, not after: a retry projected while it runs wakes
            # the next one, instead of waiting out the idle pause.
            self.outbox_wakeup.clear()
            try:
                sent = await self._publish_batch()
            except Exception as exc:
                if not failing:  # once while it lasts: a look a second otherwise
                    log.warning("outbox: not published, looking again each second: %s", exc)
                failing = True
                self.refusals.met(exc)  # an idle recorder meets a refused login here alone
                sent, pause = 0, OUTBOX_POLL_MIN  # rows may be waiting: look again soon
            else:
                if failing:
                    log.info("outbox: published again")
                failing = False
                self.refusals.met(None)
            if sent:
                pause = OUTBOX_POLL_MIN
                continue
            if await _woken(self.outbox_wakeup, stop, pause):
                pause = OUTBOX_POLL_MIN
            else:
                pause = min(pause * 2, idle_max)

    async def _publish_batch(self, limit: int = 100) -> int:
        # Its rows stay locked while it waits on NATS, up to a publish's timeout (10 s) a
        # row: a slow broker would outlast the session's idle limit (a minute,
        # ``database.IDLE_IN_TRANSACTION_TIMEOUT``), and every pass would end killed, its
        # rows sent again. The same bound ends a pass on a database gone silent, which
        # would otherwise stop every retry from going out.
        within = limit * 20
        async with bounded_transaction(self.sessions, within, "a pass over the outbox") as session:
            await session.execute(
                text(f"SET LOCAL idle_in_transaction_session_timeout = '{within}s'")
            )
            await release_abandoned_holds(session, page_pending(self.bus))
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
            sent, unread = [], []
            for row in rows:
                try:
                    event = decode_event(row.payload)
                except MalformedEvent as exc:
                    # A row this release cannot read (a newer one wrote it, and this one
                    # was rolled back to): left for a release that can, and the rest go
                    # on; one such row stopped every retry.
                    log.warning("outbox: row %s left unpublished: %s", row.event_id, exc)
                    unread.append(row.event_id)
                    continue
                try:
                    if row.deliver_at is not None:
                        page = event.url if isinstance(event, CrawlRequested) else None
                        await self.bus.publish_at(
                            event,
                            row.deliver_at,
                            subject=row.subject,
                            schedule=page and page_schedule_subject(page),
                        )
                    else:
                        await self.bus.publish(event, subject=row.subject)
                except BadRequestError as exc:
                    # The broker refuses this message (a 400: a subject its stream does
                    # not take), which is no trouble of the broker's: passed over as a
                    # row this release cannot read is, so the rows behind it go out.
                    log.warning("outbox: row %s refused by the broker: %s", row.event_id, exc)
                    unread.append(row.event_id)
                    continue
                sent.append(row.event_id)
            if sent:
                await session.execute(
                    update(Outbox)
                    .where(Outbox.event_id.in_(sent))
                    .values(published_at=datetime.now(UTC))
                )
            if unread:
                # To the back of the queue: the rows behind them go out first.
                await session.execute(
                    update(Outbox)
                    .where(Outbox.event_id.in_(unread))
                    .values(created_at=datetime.now(UTC))
                )
            return len(sent)


async def _woken(wakeup: asyncio.Event, stop: asyncio.Event, pause: float) -> bool:
    """Waits up to ``pause`` seconds for ``wakeup`` or ``stop``; whether one came. A stopping
    pod must not sit out an idle pause: it grows to ``TROVE_OUTBOX_POLL_MAX_SECONDS``,
    30 s by default, as long as Kubernetes waits for a pod to stop before it kills it."""
    waits = [asyncio.ensure_future(wakeup.wait()), asyncio.ensure_future(stop.wait())]
    try:
        done, _ = await asyncio.wait(waits, timeout=pause, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    return bool(done)


async def serve(
    settings: RecorderSettings,
    stop: asyncio.Event,
    ready: asyncio.Event,
    *,
    refused_patience: float = REFUSED_PATIENCE,
) -> None:
    """The recorder's service; it ends once Postgres has refused its logins for
    ``refused_patience`` seconds (``database.LoginRefusals``)."""
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
            RetryPolicy.from_settings(settings),
            page_id_cache=settings.page_id_cache,
            learning=LearningConfig.from_settings(settings),
            refused_patience=refused_patience,
            batch_timeout=settings.batch_timeout_seconds,
        )
        consumer = BatchConsumer(
            bus=bus,
            stream=EVENTS_STREAM,
            durable=RECORDER,
            batch_handler=recorder.handle_batch,
            handler=recorder.handle,
            batch_size=settings.batch_size,
            batch_max_bytes=settings.batch_max_bytes,
            linger=settings.batch_linger_seconds,
        )
        retention = Retention.from_settings(settings)
        listed = ListedExclusions(
            Exclusions.from_settings(settings),
            await bus.js.key_value(EXCLUSIONS_BUCKET),
            settings.exclusions_refresh_seconds,
        )
        ready.set()
        await together(
            stop,
            consumer.run(stop),
            recorder.publish_outbox(stop, settings.outbox_poll_max_seconds),
            run_retention(engine, retention, stop),
            keep_excluded_marked(engine, listed, stop),
            bus.until_closed(stop),
            recorder.refusals.until_given_up(stop),
        )
    finally:
        await bus.close()
        await engine.dispose()
