"""Rebuild every projection from the event record: ``trove replay``.

Reads ``TROVE_EVENTS`` from the first message to the last one present when the replay
starts, with an ordered (ephemeral) consumer, and applies the events through the live
recorder's own path (``projections.apply_batch``), in batches of one transaction each.
A batch that fails for a reason not the database's is applied again an event a
transaction, and an event that fails alone is counted and skipped, where the live
recorder parks it: it would stop every replay, and every replay ``--since`` before it.

``since`` re-applies only the events from that time on, into a database that has its
projections (``trove replay --since 2h``): after a failover to an asynchronous standby,
which lacks the last batches the old primary committed (and whose events the recorder
had acknowledged), it restores them in minutes, where a whole replay of a long crawl
takes hours. An event the database holds is skipped (``projected_events``), and the
projections apply an attempt once whatever its order, so the
window may start well before the loss, and the live recorder may run meanwhile (an
attempt older than one the page holds sets only the columns it is the newest of:
``projections``).

Retries are decided again as events are applied, each into an outbox row, held
(``published_at`` at infinity: no publisher sends it) while the replay runs: a retry
whose ``CrawlRequested`` is further on in the record was published long ago, and a live
recorder publishing its row before the replay got there would fire it again, over the
page's pending re-crawl. A row whose ``CrawlRequested`` the replay met is marked
published, and so is one whose page had a later attempt (its chain went on without
it: another request replaced it before it fired); when the replay ends, the rows it
still holds (scheduled for later, or decided but not yet published when the live
recorder stopped) are released, and the recorder running on this database publishes
them; a replay that fails releases them too. One killed outright (no ``finally``)
loses its advisory lock with its connection, and the live recorder's publisher, or
the next replay, ends its hold. The lock's connection is used before every batch, so a
server never ends it as idle, and a replay whose connection ended anyway (the server
restarted, an operator ended it) stops: a live recorder may have released its retries
meanwhile, and taking the lock again would not call them back.

A whole replay (``--truncate``, or into an empty database) also holds ``REBUILD_LOCK``.
Each live batch takes it shared for its transaction, or is handed back (``Retry``) to
wait in the stream: the live recorders would otherwise apply new events to tables half
rebuilt, counting a page's attempts from the few its chain has so far, and retrying it
again. The lock goes with the replay's connection, so a whole replay that stops
partway (the broker away past its patience, its lock lost, Ctrl-C, a kill) also leaves
a mark in ``rebuild_marks``, written with the truncation and removed only when a
replay has read the record to its end: the live recorders wait while it is there.
A replay ``--since`` the time the mark says it applied up to (or before) finishes the
rebuild, holding the lock and removing the mark as a whole replay does; one since a
later time is refused (``RebuildUnfinished``), as it would leave a hole.

A rebuilding replay, once at the last event present when it started, goes on to those
stored meanwhile, until what came during a pass is under a batch: a retry whose
``CrawlRequested`` fired while it ran is then marked sent, not released as one never
sent. Any other replay ``--since`` leaves the live recorders running: it fills in what
the tables lack, and they hold the rest already.

The replay reads from a stream sequence (``since``'s first event's, looked up once), so
that nats-py can make its ordered consumer again after a server restart or a leader move
(it resumes from the sequence after the last one delivered). A broker away is waited
for, up to ``patience`` without a message; then the replay stops with ``ReplayStalled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from trove_recorder.database import as_retry, canceled, make_engine
from trove_recorder.errors import (
    LockLost,
    NotEmpty,
    RebuildUnfinished,
    RecordIncomplete,
    ReplayStalled,
)
from trove_recorder.page_ids import PageIds
from trove_recorder.projections import apply_batch, event_uuid
from trove_recorder.retries import RetryPolicy
from trove_schema.bus import Bus, read_event
from trove_schema.errors import BrokerClosed, MalformedEvent, TroveError
from trove_schema.events import CrawlRequested, Event, decode_event
from trove_schema.migrate import upgrade_async
from trove_schema.policy import LearningConfig
from trove_schema.service import causes, infrastructure_away
from trove_schema.tables import REBUILD_LOCK
from trove_schema.topology import (
    CRAWL_COMPLETED,
    CRAWL_REQUESTED,
    EVENTS_PREFIX,
    EVENTS_STREAM,
    INSTANCE_FOLLOWED,
    INSTANCE_UNFOLLOWED,
    PAGE_DISCOVERED,
    SEED_REJECTED,
    TIMELINE_POLLED,
    page_schedule_subject,
)

log = logging.getLogger("trove.recorder.replay")

PROJECTION_TABLES = (
    "page_outlinks",
    "page_crawls",
    "pages",
    "seed_rejections",
    "fetcher_attempts",
    "attempt_heuristics",
    "instances",
    "timeline_polls",
    "instance_unfollows",
    "page_shares",
    "host_policies",
    "projected_events",
    "outbox",
    # Not an event's projection: emptied so that the rules' pages, written again by
    # the replay, are marked again after it (``trove_recorder.exclusions``).
    "excluded_hosts",
)
#: Not truncated: a whole replay's own mark (``rebuild_marks``), which every live batch
#: reads. Truncated, its lock would hold each of them for the truncation's transaction
#: where they are handed back at once; its rows are deleted and written again instead.
NOT_PROJECTIONS = ("rebuild_marks",)

# Pending or held, and in the record: the row needs no publishing.
_RECORDED = (
    "(o.published_at IS NULL OR o.published_at = 'infinity') "
    "AND EXISTS (SELECT 1 FROM projected_events p WHERE p.event_id = o.event_id)"
)
#: Retries already in the record: their outbox rows need no publishing.
_MARK_RECORDED_RETRIES = text(
    f"UPDATE outbox o SET published_at = now() WHERE {_RECORDED}"  # noqa: S608
)
# The same, of a batch's own CrawlRequested: a lookup each, where the sweep reads every
# row a long replay holds, each batch. A row decided after its CrawlRequested was applied
# (not in the record's order) waits for the sweep that ends the replay, held till then.
_MARK_RECORDED_OF = text(
    "UPDATE outbox o SET published_at = now() "  # noqa: S608
    f"WHERE o.event_id = ANY(CAST(:ids AS uuid[])) AND {_RECORDED}"
)
# The rows this transaction wrote (their ``created_at`` is its start): held.
_HOLD_DECIDED_RETRIES = text(
    "UPDATE outbox SET published_at = 'infinity' WHERE published_at IS NULL AND created_at = now()"
)
_HELD = text("SELECT event_id, payload FROM outbox WHERE published_at = 'infinity'")
#: Causes looked up a statement (a replay of a long crawl may leave many rows held).
OVERTAKEN_CHUNK = 1000
# Of these attempts, those their page has a later attempt than.
_OVERTAKEN = text(
    "SELECT c.event_id FROM page_crawls c WHERE c.event_id = ANY(CAST(:ids AS uuid[])) "
    "AND EXISTS (SELECT 1 FROM page_crawls later WHERE later.page_id = c.page_id "
    "AND later.completed_at > c.completed_at)"
)
_MARK_SENT = text(
    "UPDATE outbox SET published_at = now() WHERE event_id = ANY(CAST(:ids AS uuid[]))"
)
_RELEASE_HELD_RETRIES = text(
    "UPDATE outbox SET published_at = NULL WHERE published_at = 'infinity'"
)
_HELD_DUE = text(
    "SELECT event_id, payload FROM outbox WHERE published_at = 'infinity' AND deliver_at <= now()"
)
#: Held by a running replay (a session lock, so a replay killed outright lets it go).
REPLAY_LOCK = 0x74726F7665  # "trove"
# The lock shared, and the mark of a whole replay that stopped before its end: in one
# statement, the one that begins a live batch's transaction.
_SHARE_REBUILD_LOCK = (
    f"SELECT pg_try_advisory_xact_lock_shared({REBUILD_LOCK}), "  # noqa: S608
    "EXISTS (SELECT 1 FROM rebuild_marks), (SELECT max(applied_until) FROM rebuild_marks)"
)
_REBUILD_MARK = text(
    "SELECT max(started_at), max(applied_until), max(applied_seq) FROM rebuild_marks"
)
_REBUILT_UNTIL = text("UPDATE rebuild_marks SET applied_until = :until, applied_seq = :seq")
_REBUILT = text("DELETE FROM rebuild_marks")
_MARK_REBUILD = text("INSERT INTO rebuild_marks (started_at) VALUES (clock_timestamp())")
# Whether this session still holds the replay's lock (a one-key lock: its high and low
# halves, ``objsubid`` 1).
_HOLDS_REPLAY_LOCK = text(
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted "
    "AND pid = pg_backend_pid() AND objsubid = 1 "
    "AND (CAST(classid AS bigint) << 32 | CAST(objid AS bigint)) = :lock)"
)
# Whether rows are held and no replay holds them (one killed, its connection gone).
# The lock, tried only when such rows exist, is the caller's transaction's.
_ABANDONED = text(
    "SELECT pg_try_advisory_xact_lock(:lock) "
    "WHERE EXISTS (SELECT 1 FROM outbox WHERE published_at = 'infinity') "
    "AND NOT EXISTS (SELECT 1 FROM rebuild_marks)"
)


#: Whether a page has a request pending on its schedule subject.
Pending = Callable[[str], Awaitable[bool]]


def page_pending(bus: Bus) -> Pending:
    """Whether a page has a request pending: the last message on its schedule subject
    (one that fired is gone from it)."""

    async def pending(url: str) -> bool:
        return await bus.scheduled_event(page_schedule_subject(url)) is not None

    return pending


async def release_held_retries(
    conn: AsyncConnection | AsyncSession, *, stopped: Pending | None = None
) -> None:
    """End a hold: the retries in the record marked sent, those the page's chain went on
    without dropped, the others released to the publisher.

    ``stopped``: the hold of a replay that stopped before the record's end (an outage,
    Ctrl-C, a kill), which did not read what came after. A retry it held that was due
    already either fired then (a live recorder published it when its failure was new;
    its ``CrawlRequested`` is in the part not read), and sent again would replace what
    the page has pending (its next re-crawl) under an id the record knows, its answer
    dropped as a copy; or it never went out (its failure projected by this replay
    alone, the live recorders waiting on it or behind). The page's schedule tells
    which: one with a request pending went on without it (marked sent), one with none
    waits for it (released). Raises if the broker cannot say: the rows stay held, and a
    live recorder's publisher ends the hold when it can (``release_abandoned_holds``)."""
    await conn.execute(_MARK_RECORDED_RETRIES)
    await _mark_overtaken(conn)
    if stopped is not None:
        await _mark_gone_on(conn, stopped)
    await conn.execute(_RELEASE_HELD_RETRIES)


async def _mark_gone_on(conn: AsyncConnection | AsyncSession, pending: Pending) -> None:
    """Mark sent the held rows due already whose page has a request pending."""
    gone_on: list[uuid.UUID] = []
    for event_id, payload in (await conn.execute(_HELD_DUE)).all():
        try:
            event = decode_event(payload)
        except (TroveError, ValueError):
            continue  # released as it is, for the publisher to judge
        if isinstance(event, CrawlRequested) and await pending(event.url):
            gone_on.append(event_id)
    if gone_on:
        await conn.execute(_MARK_SENT, {"ids": gone_on})


async def _mark_overtaken(conn: AsyncConnection | AsyncSession) -> None:
    """Mark sent the held rows whose page had an attempt after the one that decided
    them: the chain went on without them (another request replaced theirs on the page's
    schedule subject before it fired, so it is not in the record), and sent now they
    would replace what the page has pending. A row this release cannot read (a newer
    one wrote it) is released as it is, for the publisher to judge."""
    causes: dict[uuid.UUID, list[uuid.UUID]] = {}
    for event_id, payload in (await conn.execute(_HELD)).all():
        try:
            cause = event_uuid(str(json.loads(payload)["caused_by"]))
        except (ValueError, TypeError, KeyError):  # not JSON, not an object, no cause
            continue
        causes.setdefault(cause, []).append(event_id)
    ids = list(causes)
    for start in range(0, len(ids), OVERTAKEN_CHUNK):
        found = await conn.execute(_OVERTAKEN, {"ids": ids[start : start + OVERTAKEN_CHUNK]})
        overtaken = [row for (cause,) in found.all() for row in causes[cause]]
        if overtaken:
            await conn.execute(_MARK_SENT, {"ids": overtaken})


async def rebuilding(session: AsyncSession) -> str | None:
    """Why the tables are not to be written now: a whole replay is rebuilding them, or
    one stopped before its end and left them half rebuilt; None when they may be. Then
    the session's transaction holds ``REBUILD_LOCK`` shared until it ends: no replay
    truncates the tables under it, and one that is about to waits for it.

    Sent first, it begins the transaction in place of the statement the projection
    would begin it with (``sql.Transaction.of``): a batch pays for no round trip more."""
    connection = await session.connection()
    row = (await connection.exec_driver_sql(_SHARE_REBUILD_LOCK)).one()
    shared, marked, until = tuple(row)
    if not shared:
        return "a replay is rebuilding the tables"
    if marked:
        since = f"--since {until.isoformat()}" if until is not None else "--truncate"
        return (
            "a whole replay stopped before the end of the record and left the tables half "
            f"rebuilt: `trove replay {since}` finishes the rebuild"
        )
    return None


async def release_abandoned_holds(session: AsyncSession, pending: Pending) -> None:
    """End the hold of a replay that could not (killed by a signal, its terminal
    closed): else its retries never went out, until the next replay. Not a rebuild's
    that stopped before its end: the replay that finishes it settles them."""
    if (await session.execute(_ABANDONED, {"lock": REPLAY_LOCK})).scalar():
        await release_held_retries(session, stopped=pending)


#: The ids of applied events leave with the record's retention; the pages stay.
_HAS_PROJECTIONS = text(
    "SELECT EXISTS (SELECT 1 FROM pages) OR EXISTS (SELECT 1 FROM projected_events)"
)
#: The oldest time the tables know of: a page's first sighting, or its oldest visit kept.
_OLDEST_PROJECTED = text(
    "SELECT least((SELECT min(discovered_at) FROM pages), "
    "(SELECT min(completed_at) FROM page_crawls))"
)
#: How much older than the record's first event the tables' oldest time may be and still
#: be its own: the services' clocks against nats-server's, which stamps the record.
RECORD_CLOCK_SLACK = timedelta(seconds=60)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def since_of(value: str, now: datetime) -> datetime:
    """When ``--since`` starts: a span back from ``now`` (``90s``, ``30m``, ``2h``,
    ``1d``) or an ISO 8601 time with its zone (``2026-11-28T04:00Z``)."""
    text_value = value.strip()
    unit = _UNITS.get(text_value[-1:].lower())
    at: datetime | None = None
    try:
        if unit is not None:
            amount = float(text_value[:-1])
            if amount >= 0:  # NaN too is refused here
                at = now - timedelta(seconds=amount * unit)
        else:
            at = datetime.fromisoformat(text_value.replace("Z", "+00:00").replace("z", "+00:00"))
    except (ValueError, OverflowError):
        at = None
    if at is None or at.tzinfo is None:
        raise ValueError(
            f"--since {value!r}: give a span back from now (90s, 30m, 2h, 1d) "
            "or a time with its zone (2026-11-28T04:00Z)"
        )
    return at.astimezone(UTC)


#: Seconds one read waits for a message before the replay looks at how long it waited.
READ_WAIT = 10.0
#: Seconds the replay waits for a broker that sends nothing (a restart, a leader moved,
#: an outage) before it gives up.
REPLAY_PATIENCE = 600.0
#: Seconds the replay waits for its first connection to NATS.
CONNECT_PATIENCE = 10.0


async def _record_holds_the_tables(conn: AsyncConnection, js: JetStreamContext) -> None:
    """Raise ``RecordIncomplete`` when the tables know of a time before the record's first
    event (``TROVE_EVENTS_MAX_AGE_SECONDS`` removed what came before): emptied, they
    would be rebuilt from what is left, and the rest lost without a word."""
    oldest = (await conn.execute(_OLDEST_PROJECTED)).scalar()
    if oldest is None:
        return
    first = await _first_event_time(js)
    if first is not None and oldest >= first - RECORD_CLOCK_SLACK:
        return
    since = f"starts at {first.isoformat()}" if first is not None else "holds no event"
    raise RecordIncomplete(
        f"the tables go back to {oldest.isoformat()} and the event record {since}: its "
        "retention removed what came before, and a whole replay would rebuild only what "
        "is left. Restore the tables from a snapshot taken after the record's start and "
        "run `trove replay --since` the snapshot's time"
    )


async def _finishes_a_rebuild(conn: AsyncConnection, since: datetime) -> int | None:
    """The stream sequence of the last event a whole replay that stopped before the end
    went past, when a replay ``--since`` finishes it (its mark is there); None when
    there is none to finish. Raises ``RebuildUnfinished`` when it would leave a hole."""
    started, until, seq = (await conn.execute(_REBUILD_MARK)).one()
    if started is None:
        return None
    if until is None or seq is None or since > until:
        after = f"--since {until.isoformat()}" if until is not None else "--truncate"
        raise RebuildUnfinished(
            f"a whole replay started at {started.isoformat()} stopped before the end of the "
            f"record, having applied what was stored up to {until or 'its start'}: the "
            f"tables are half rebuilt, and the live recorders wait. Run `trove replay "
            f"{after}` to finish it"
        )
    return int(seq)


async def _record_holds_the_rest(js: JetStreamContext, seq: int) -> None:
    """Raise ``RecordIncomplete`` when the record no longer holds what came after
    sequence ``seq`` (its retention removed it while the rebuild waited to be
    finished): finished from what is left, the tables would have a hole."""
    info = await js.stream_info(EVENTS_STREAM)
    if info.state.first_seq <= seq + 1:
        return
    raise RecordIncomplete(
        f"the stopped rebuild went past the event at sequence {seq}, and the record now "
        f"starts at {info.state.first_seq}: its retention removed events it had not "
        "applied. Restore the tables from a snapshot taken after the record's start and "
        "run `trove replay --since` the snapshot's time"
    )


async def _first_event_time(js: JetStreamContext) -> datetime | None:
    """When the stream stored the first event it still holds (None when it holds none)."""
    first = await js.pull_subscribe(
        f"{EVENTS_PREFIX}.>",
        stream=EVENTS_STREAM,
        config=ConsumerConfig(
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.NONE,
            mem_storage=True,
            num_replicas=1,
        ),
    )
    try:
        msgs = await first.fetch(1, timeout=READ_WAIT)
    except TimeoutError:
        return None
    finally:
        with contextlib.suppress(Exception):
            await first.unsubscribe()
    return msgs[0].metadata.timestamp


async def _first_event_since(js: JetStreamContext, since: datetime) -> int:
    """The stream sequence of the first event at or after ``since`` (there is one).

    A consumer that starts at a time cannot be made again by nats-py after a reset: it
    asks for the sequence after the last delivered and keeps the start time beside it,
    which the server refuses. A one-message consumer finds the sequence instead."""
    first = await js.pull_subscribe(
        f"{EVENTS_PREFIX}.>",
        stream=EVENTS_STREAM,
        config=ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_TIME,
            opt_start_time=since,
            ack_policy=AckPolicy.NONE,
            mem_storage=True,
            num_replicas=1,
        ),
    )
    try:
        (msg,) = await first.fetch(1, timeout=READ_WAIT)
    finally:
        with contextlib.suppress(Exception):
            await first.unsubscribe()
    return msg.metadata.sequence.stream


async def _next_message(
    sub: JetStreamContext.PushSubscription,
    bus: Bus,
    at: int,
    last: int,
    patience: float,
    read_wait: float = READ_WAIT,
) -> Msg:
    """The replay's next message, the broker waited for while it is away (the client
    reconnects, and the ordered consumer is made again from where it was)."""
    started = time.monotonic()
    while True:
        waited = time.monotonic() - started
        if waited >= patience:
            raise ReplayStalled(
                f"no event from NATS for {patience:.0f} s, at sequence {at} of {last}"
            )
        try:
            return await sub.next_msg(timeout=min(read_wait, patience - waited))
        except nats.errors.ConnectionClosedError:
            closed = True
        except nats.errors.TimeoutError:
            # The server turned the client away for the connection's patience.
            closed = bus.closed.is_set()
        if closed:
            raise ReplayStalled(
                f"the NATS connection is lost for good ({bus.nc.last_error}), "
                f"at sequence {at} of {last}"
            )
        log.warning(
            "replay: waiting for NATS at sequence %d of %d (%.0f s so far)",
            at,
            last,
            time.monotonic() - started,
        )


async def _last_event(
    js: JetStreamContext, subjects: Collection[str]
) -> tuple[int, datetime | None]:
    """The stream sequence of the last event present now, and when it was stored (0 and
    None when there is none)."""
    last, newest = 0, None
    for subject in subjects:
        # The stream's own last sequence may be a schedule, which is deleted once it
        # fires: wait for the last *event* present now, not for that.
        with contextlib.suppress(NotFoundError):
            found = await js.get_last_msg(EVENTS_STREAM, subject)
            last = max(last, found.seq or 0)
            if found.time is not None and (newest is None or found.time > newest):
                newest = found.time
    return last, newest


async def _check_lock(lock: AsyncConnection) -> None:
    """Raise ``LockLost`` unless ``lock``'s session still holds the replay's lock."""
    try:
        held = (await lock.execute(_HOLDS_REPLAY_LOCK, {"lock": REPLAY_LOCK})).scalar_one()
    except Exception as exc:  # the connection ended: its lock with it
        raise LockLost(f"the connection holding the replay's lock ended ({exc})") from exc
    if not held:
        raise LockLost("the replay's lock is no longer held")


@dataclass(slots=True)
class ReplayStats:
    events: int = 0
    applied: int = 0
    malformed: int = 0
    #: Events that decoded but could not be applied (the live recorder parks them).
    failed: int = 0
    seconds: float = 0.0


async def replay(
    nats_url: str,
    database_url: str,
    policy: RetryPolicy,
    *,
    truncate: bool = False,
    batch: int = 500,
    page_id_cache: int = 200_000,
    learning: LearningConfig | None = None,
    since: datetime | None = None,
    patience: float = REPLAY_PATIENCE,
    read_wait: float = READ_WAIT,
) -> ReplayStats:
    if since is not None and truncate:
        raise ValueError("a replay since a time re-applies a window: it cannot truncate")
    # The broker first, within a bound: a service's connect waits for it for ever, and a
    # replay run by hand, or by cron in an outage, hung there (after migrating the
    # database it was to fill).
    connecting = min(patience, CONNECT_PATIENCE)
    try:
        bus = await asyncio.wait_for(
            # A server that turns the replay away is said as such within the bound.
            Bus.connect(nats_url, name="trove-replay", refused_patience=connecting / 2),
            connecting,
        )
    except TimeoutError:
        raise ReplayStalled(f"no connection to NATS in {connecting:.0f} s") from None
    engine = None
    try:
        await upgrade_async(database_url)
        engine = make_engine(database_url)
        # While this connection lives, the live recorders leave the retries it holds
        # alone. In autocommit: not a transaction left open for the whole replay, which
        # a server's idle-in-transaction timeout would end, and the lock with it.
        lock = await (await engine.connect()).execution_options(isolation_level="AUTOCOMMIT")
    except BaseException:
        await bus.close()
        if engine is not None:
            await engine.dispose()
        raise
    stats = ReplayStats()
    started = time.monotonic()
    holding = False  # past the checks: this replay may hold retries
    read_to_the_end = False
    rebuild = since is None  # the live recorders wait for it (``REBUILD_LOCK``, the mark)
    sub: JetStreamContext.PushSubscription | None = None
    try:
        await lock.execute(text("SELECT pg_advisory_lock(:lock)"), {"lock": REPLAY_LOCK})
        resume = None if since is None else await _finishes_a_rebuild(lock, since)
        if resume is not None:
            # A whole replay that stopped before the end: this one finishes it, as one.
            rebuild = True
        if rebuild:
            # Once the live batches under way have committed: none starts after it.
            await lock.execute(text("SELECT pg_advisory_lock(:lock)"), {"lock": REBUILD_LOCK})
        async with engine.begin() as conn:
            if truncate:
                await _record_holds_the_tables(conn, bus.js)
                await conn.execute(
                    text(f"TRUNCATE {', '.join(PROJECTION_TABLES)} RESTART IDENTITY CASCADE")
                )
            elif since is None and (await conn.execute(_HAS_PROJECTIONS)).scalar_one():
                raise NotEmpty(
                    "the database already has projections: use --truncate to rebuild them, "
                    "or --since to re-apply the events of a recent window"
                )
            if since is None:
                await conn.execute(_REBUILT)
                await conn.execute(_MARK_REBUILD)
            if resume is None:
                # A replay that died held them. A rebuild that stopped keeps them held
                # for the replay that finishes it, which reads on to their CrawlRequested.
                await release_held_retries(conn, stopped=page_pending(bus))
        holding = True
        subjects = {
            SEED_REJECTED,
            PAGE_DISCOVERED,
            CRAWL_REQUESTED,
            CRAWL_COMPLETED,
            INSTANCE_FOLLOWED,
            INSTANCE_UNFOLLOWED,
            TIMELINE_POLLED,
        }
        last, newest = await _last_event(bus.js, subjects)
        if resume is not None:
            await _record_holds_the_rest(bus.js, resume)
            nothing = last <= resume
        else:
            nothing = last == 0 or (since is not None and newest is not None and newest < since)
        if nothing:
            # Nothing to apply (no consumer would deliver anything): read to its end.
            if rebuild:
                async with engine.begin() as conn:
                    await conn.execute(_REBUILT)
            return stats
        sessions = async_sessionmaker(engine, expire_on_commit=False)
        # From 1: the server starts at the stream's first message when retention took 1.
        first = 1 if since is None else await _first_event_since(bus.js, since)
        if resume is not None:
            # By the sequence too: ``since`` is the stored time of the last event the
            # rebuild went past, to the microsecond, and the stream keeps nanoseconds.
            first = min(first, resume + 1)
        sub = await bus.js.subscribe(
            f"{EVENTS_PREFIX}.>",
            stream=EVENTS_STREAM,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            config=ConsumerConfig(opt_start_seq=first),
        )
        known = PageIds(page_id_cache)

        async def apply(
            events: list[Event], until: datetime | None = None, last_seq: int = 0
        ) -> int:
            """``events`` in a transaction of their own; how many were new. ``until`` and
            ``last_seq``: when the stream stored the last of them, and its sequence,
            which a rebuild's mark keeps."""
            async with sessions.begin() as session:
                applied = await apply_batch(
                    session, events, policy, known, learning=learning, replaying=True
                )
                if rebuild and until is not None:
                    await session.execute(_REBUILT_UNTIL, {"until": until, "seq": last_seq})
                await session.execute(_HOLD_DECIDED_RETRIES)
                # The rows of the retries this batch brings: a retry's CrawlRequested
                # comes later in the stream than the attempt that decided it.
                requested = [event_uuid(e.id) for e in events if type(e) is CrawlRequested]
                if requested:
                    await session.execute(_MARK_RECORDED_OF, {"ids": requested})
            known.learn(applied.generation, applied.page_ids)
            return applied.count

        done, seq = False, first - 1
        catching_up = rebuild  # on past ``last``, to what the live recorders left waiting
        stalled: ReplayStalled | None = None
        read_until: datetime | None = None  # stored time of the last message read
        applied_until: datetime | None = None
        while not done:
            events: list[Event] = []
            for _ in range(batch):
                try:
                    msg = await _next_message(sub, bus, seq, last, patience, read_wait)
                except ReplayStalled as exc:
                    # What this batch read is applied first: a next run from the time
                    # the error gives misses nothing before it.
                    stalled, done = exc, True
                    break
                seq = msg.metadata.sequence.stream
                read_until = msg.metadata.timestamp
                # A consumer nats-py made again before the first message came starts at
                # the stream's start: what it holds before ``first`` is not the window's.
                if seq < first:
                    continue
                if msg.subject in subjects:
                    stats.events += 1
                    try:
                        events.append(read_event(msg))
                    except MalformedEvent:
                        stats.malformed += 1
                if seq >= last:
                    done = True
                    break
            # Before every batch: the live recorders leave the held retries alone only
            # while the lock is held, and a connection left idle for hours may be ended.
            await _check_lock(lock)
            try:
                stats.applied += await apply(events, read_until, seq)
            except Exception as exc:
                if as_retry(exc) is not None:
                    raise  # the database's trouble, not the events': the replay stops
                # An event the projection cannot apply (the live recorder parks it) stops
                # no replay: the batch again, an event a transaction, and only the one
                # that fails still is skipped.
                log.warning("replay: a batch failed (%s); applying it an event at a time", exc)
                for event in events:
                    await _check_lock(lock)
                    try:
                        stats.applied += await apply([event])
                    except Exception as one:
                        # A statement cancelled for one event alone met a slow or busy
                        # server, as the live recorder reads it (it waits, never parks).
                        if as_retry(one) is not None or canceled(one):
                            raise
                        stats.failed += 1
                        log.error("replay: %s %s skipped: %s", event.TYPE, event.id, one)
                if rebuild and read_until is not None:
                    async with sessions.begin() as session:  # the batch's end, marked
                        await session.execute(_REBUILT_UNTIL, {"until": read_until, "seq": seq})
            applied_until = read_until
            log.info("replayed up to %d of %d", seq, last)
            if done and stalled is None and catching_up:
                newer, _ = await _last_event(bus.js, subjects)
                if newer > seq:
                    # Under a batch came during this pass: the next one is the last.
                    catching_up = newer - seq >= batch
                    last, done = newer, False
        if stalled is not None:
            stalled.applied_until = applied_until
            raise stalled
        if rebuild:
            async with engine.begin() as conn:
                await conn.execute(_REBUILT)
        read_to_the_end = True
    finally:
        if sub is not None:
            # Before the connection drains: messages pushed to a subscription nobody
            # reads any more would hold the drain for its whole timeout (30 s).
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        # However the replay ends: a retry it held and nobody released would never go
        # out, which is worse than one sent again. One whose CrawlRequested came while
        # the replay ran (after the last event it read) is published already, if the
        # live recorder recorded it: marked so first.
        if holding and rebuild and not read_to_the_end:
            # A rebuild stopped partway: what it holds stays held, as the live
            # recorders wait, for the replay that finishes it to settle.
            log.warning("replay: the rebuild stopped before the end: the recorders wait")
        elif holding:
            try:
                async with engine.begin() as conn:
                    stopped = None if read_to_the_end else page_pending(bus)
                    await release_held_retries(conn, stopped=stopped)
            except Exception as exc:  # the database away: a live recorder releases them
                log.warning("replay: held retries not released: %s", exc)
        with contextlib.suppress(Exception):
            # Unlocked, not only closed: a closed connection goes back to the pool. Both
            # locks, and the live recorders go on once the held retries are released.
            await lock.execute(text("SELECT pg_advisory_unlock_all()"))
            await lock.close()
        await bus.close()
        await engine.dispose()
    stats.seconds = time.monotonic() - started
    return stats


def _innermost(exc: BaseException) -> str:
    """The first line of what is at the bottom of ``exc``'s causes: the refused connect,
    not SQLAlchemy's wrapping of it with its statement and link."""
    innermost = causes(exc)[-1]
    text = str(innermost).strip().splitlines()
    return f"{type(innermost).__name__}: {text[0] if text else ''}".rstrip(": ")


def run_replay(
    nats_url: str,
    database_url: str,
    policy: RetryPolicy,
    truncate: bool,
    learning: LearningConfig | None = None,
    since: datetime | None = None,
) -> int:
    try:
        stats = asyncio.run(
            replay(
                nats_url, database_url, policy, truncate=truncate, learning=learning, since=since
            )
        )
    except (NotEmpty, RecordIncomplete, RebuildUnfinished) as exc:
        print(f"error: {exc}")
        return 2
    except ReplayStalled as exc:
        if exc.applied_until is None:
            print(f"error: replay stopped: {exc}. Nothing was applied: run it again as it was")
            return 1
        print(
            f"error: replay stopped: {exc}. Everything stored before "
            f"{exc.applied_until.isoformat()} is applied: run it again --since "
            f"{exc.applied_until.isoformat()} (what was applied is skipped)"
        )
        return 1
    except LockLost as exc:
        print(
            f"error: replay stopped: {exc}. A live recorder may have released the retries "
            "it held. Run it again with --since a time before it stopped: what it applied "
            "is skipped"
        )
        return 1
    except BrokerClosed as exc:  # turned away: the URL's user, the CA
        print(f"error: replay stopped: {exc}")
        return 1
    except Exception as exc:
        if not infrastructure_away(exc):
            raise
        # The database away (refused, no answer, starting up): a line, not a traceback.
        print(f"error: replay stopped: a server is away: {_innermost(exc)}")
        return 1
    rate = stats.events / stats.seconds if stats.seconds else 0.0
    print(
        f"replayed {stats.events} events ({stats.applied} applied, {stats.malformed} malformed, "
        f"{stats.failed} failed) in {stats.seconds:.1f}s, {rate:.0f} events/s"
    )
    return 0
