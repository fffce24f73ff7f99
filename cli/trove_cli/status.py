"""``trove status``: what the crawl holds and where it is waiting, read without changing anything.

* the tables: pages by status (plus pages only linked to), attempts by outcome;
* JetStream: each service's durable consumers (pending, in flight, redelivered);
* politeness (KV ``trove_domains``, the fetcher's ``DomainSlot`` records): domains
  backing off after a 429/503, domains with fetches queued for a later slot;
* the service processes of a ``trove up`` in this state folder, when there is one: pid,
  restarts, the last exit and restart (``services.json``, written by its supervisor);
* what needs an operator: dead letters (stream ``TROVE_DEAD``), and the outbox rows the
  recorder has not published yet.

Nothing is created: on a stack where a stream, consumer or bucket does not exist yet,
the status says so.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from trove_cli.broker import connect
from trove_cli.database import engine as database_engine
from trove_cli.supervisor import Supervised, describe_exit, read_supervised
from trove_schema.server_time import server_now
from trove_schema.tables import REBUILD_LOCK
from trove_schema.topology import DEAD_PREFIX, DEAD_STREAM, DOMAINS_BUCKET, declare

#: The fields of the fetcher's DomainSlot (services/fetcher/trove_fetcher/politeness.py),
#: unix times except ``gap``. Read here without importing the service.
SLOT_FIELDS = ("free_at", "busy_until", "next", "gap", "backoff_until")
#: Where the record keeps the host's policy (``politeness.POLICY_KEY``).
POLICY_KEY = "p"
#: Reading the domain records: messages per fetch, and the wait for each batch.
BATCH = 512
READ_TIMEOUT = 5.0
#: Host records read at most: past them, the domain counts are of a part, and say so.
MAX_SLOTS = 200_000


@dataclass(frozen=True, slots=True)
class ConsumerLag:
    stream: str
    durable: str
    #: False when the consumer does not exist (no service has started yet).
    exists: bool = True
    #: Messages not yet delivered to the consumer.
    pending: int = 0
    #: Delivered, not yet acknowledged (being handled, or waiting for a redelivery).
    ack_pending: int = 0
    redelivered: int = 0


@dataclass(frozen=True, slots=True)
class Cooldown:
    """A domain that every fetcher leaves alone until ``seconds_left`` have passed."""

    domain: str
    seconds_left: float
    #: Why, as the host's policy says (``rate_limited``, ``banned``, ``challenge``...).
    reason: str | None = None


@dataclass(slots=True)
class Status:
    #: This machine's time: what ``trove up``'s processes and the tables are read against.
    now: float
    #: nats-server's time (``trove_schema.server_time``): the fetchers' shared instants
    #: and the streams' message times are on it; None: this machine's.
    server_now: float | None = None
    pages_by_status: dict[str, int] = field(default_factory=dict)
    linked_only: int = 0
    attempts_by_outcome: dict[str, int] = field(default_factory=dict)
    #: The counts above are estimates from a sample of their table (``EXACT_ROWS``).
    pages_estimated: bool = False
    attempts_estimated: bool = False
    consumers: list[ConsumerLag] = field(default_factory=list)
    #: Domains with ``backoff_until`` in the future (429/503), longest first.
    backing_off: list[Cooldown] = field(default_factory=list)
    #: Domains with fetches reserved for a later slot (``next`` in the future).
    queued_domains: int = 0
    #: The domain whose reservations reach furthest, and how far.
    longest_queue: Cooldown | None = None
    #: Domains with a request in flight (``busy_until`` in the future).
    fetching_domains: int = 0
    #: KV values that are not a DomainSlot (skipped).
    unreadable_slots: int = 0
    #: Host records read for the counts above, of how many keys the bucket has.
    domains_read: int = 0
    domains_total: int = 0
    #: Messages in TROVE_DEAD; None when the stream does not exist.
    dead_letters: int | None = None
    dead_by_consumer: dict[str, int] = field(default_factory=dict)
    #: How long the oldest parked message has waited for an operator (`trove dead`).
    dead_oldest_seconds: float | None = None
    #: Outbox rows not yet published, and the age of the oldest in seconds.
    outbox_backlog: int = 0
    outbox_oldest_seconds: float | None = None
    #: Rows a replay holds (``published_at`` at infinity) until it ends.
    outbox_held: int = 0
    #: The processes ``trove up`` supervises; None when it does not run here.
    services: Supervised | None = None
    #: Bytes JetStream stores for the account, and its limit when one is set; by stream
    #: (the buckets' together), largest first.
    store_bytes: int | None = None
    store_limit: int | None = None
    store_by_stream: dict[str, int] = field(default_factory=dict)
    #: A whole replay's rebuild (``rebuild_marks``): when it started, when the stream
    #: stored the last event it applied, and whether a replay holds it now; None: none.
    rebuild: tuple[float, float | None, bool] | None = None


#: A table of more rows than this (as Postgres last counted them) is counted from a
#: sample of about ``SAMPLE_ROWS`` rows: after months, ``pages`` holds tens of millions
#: and ``page_crawls`` hundreds of millions, and a count of each would read them whole
#: at every `trove status`, beside the recorder's writes.
EXACT_ROWS = 1_000_000
SAMPLE_ROWS = 100_000


async def collect_status(
    js: JetStreamContext,
    engine: AsyncEngine,
    *,
    now: float | None = None,
    server_now: float | None = None,
    state_dir: Path | None = None,
    exact_rows: int = EXACT_ROWS,
) -> Status:
    """Read the tables, the consumers, the domain slots and the dead letters."""
    status = Status(now=time.time() if now is None else now, server_now=server_now)
    if state_dir is not None:
        status.services = read_supervised(state_dir)
    await _tables(engine, status, exact_rows)
    status.consumers = await consumer_lag(js)
    await _domains(js, status)
    await _dead_letters(js, status)
    await _store(js, status)
    return status


async def sample_source(
    conn: AsyncConnection, table: str, exact_rows: int
) -> tuple[str, float | None]:
    """What to read ``table`` from: itself, or a sample of its blocks of about
    ``SAMPLE_ROWS`` rows once Postgres last counted more than ``exact_rows`` (as ``_sampled``
    counts); and, for a sample, the table's rows it stands for. The sample is
    the same for each statement that reads it (``REPEATABLE``), so that one can count
    what another's rows are a share of."""
    estimate = (
        await conn.execute(
            text("SELECT reltuples FROM pg_class WHERE oid = CAST(:t AS regclass)"), {"t": table}
        )
    ).scalar_one()
    if estimate is None or estimate <= exact_rows:
        return table, None
    percent = min(100.0, 100.0 * SAMPLE_ROWS / float(estimate))
    seed = random.randrange(2**31)
    return f"{table} TABLESAMPLE SYSTEM ({percent:.6f}) REPEATABLE ({seed})", float(estimate)


async def _sampled(
    conn: AsyncConnection, table: str, columns: str, group: str, exact_rows: int
) -> tuple[list[Sequence[Any]], bool]:
    """``SELECT group, columns FROM table GROUP BY group``, exactly, or scaled up from a
    sample of the table's blocks when it has more than ``exact_rows`` rows; and whether
    it was sampled. Each count is its share of the sample times the table's rows."""
    source, estimate = await sample_source(conn, table, exact_rows)
    rows = (
        await conn.execute(
            text(f"SELECT {group}, {columns} FROM {source} GROUP BY 1 ORDER BY 1")  # noqa: S608
        )
    ).all()
    if estimate is None:
        return list(rows), False
    seen = sum(int(n) for row in rows for n in row[1:]) or 1
    scale = estimate / seen
    return [(row[0], *(round(int(n) * scale) for n in row[1:])) for row in rows], True


async def _tables(engine: AsyncEngine, status: Status, exact_rows: int) -> None:
    async with engine.connect() as conn:
        rows, status.pages_estimated = await _sampled(
            conn,
            "pages",
            "count(*) FILTER (WHERE discovered_at IS NOT NULL), "
            "count(*) FILTER (WHERE discovered_at IS NULL)",
            "status",
            exact_rows,
        )
        for name, queued, linked in rows:
            if queued:
                status.pages_by_status[name] = int(queued)
            status.linked_only += int(linked)
        rows, status.attempts_estimated = await _sampled(
            conn, "page_crawls", "count(*)", "outcome", exact_rows
        )
        status.attempts_by_outcome = {
            o: int(n) for o, n in sorted(rows, key=lambda row: (-int(row[1]), row[0]))
        }
        backlog, oldest, held = (
            await conn.execute(
                text(
                    "SELECT count(*) FILTER (WHERE published_at IS NULL), "
                    "extract(epoch FROM to_timestamp(:now) - min(created_at) "
                    "FILTER (WHERE published_at IS NULL)), "
                    "count(*) FILTER (WHERE published_at = 'infinity') "
                    "FROM outbox WHERE published_at IS NULL OR published_at = 'infinity'"
                ),
                {"now": status.now},
            )
        ).one()
        status.outbox_backlog = int(backlog)
        status.outbox_held = int(held)
        status.outbox_oldest_seconds = None if oldest is None else max(float(oldest), 0.0)
        if (await conn.execute(text("SELECT to_regclass('rebuild_marks')"))).scalar() is None:
            return  # a database the services have not brought to this release yet
        started, until, running = (await conn.execute(_REBUILD, {"lock": REBUILD_LOCK})).one()
        if started is not None:
            status.rebuild = (
                started.timestamp(),
                None if until is None else until.timestamp(),
                bool(running),
            )


#: A whole replay's mark, and whether its lock is held (by a replay running now).
_REBUILD = text(
    "SELECT min(started_at), max(applied_until), EXISTS (SELECT 1 FROM pg_locks "
    "WHERE locktype = 'advisory' AND granted AND mode = 'ExclusiveLock' AND objsubid = 1 "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND (CAST(classid AS bigint) << 32 | CAST(objid AS bigint)) = :lock) FROM rebuild_marks"
)


async def consumer_lag(js: JetStreamContext) -> list[ConsumerLag]:
    """Every durable consumer of the topology, in declaration order."""
    lags = []
    for stream, config in declare().consumers:
        assert config.durable_name is not None
        try:
            info = await js.consumer_info(stream, config.durable_name)
        except NotFoundError:
            lags.append(ConsumerLag(stream, config.durable_name, exists=False))
            continue
        lags.append(
            ConsumerLag(
                stream,
                config.durable_name,
                pending=info.num_pending or 0,
                ack_pending=info.num_ack_pending or 0,
                redelivered=info.num_redelivered or 0,
            )
        )
    return lags


def slot_times(value: bytes | None) -> dict[str, float] | None:
    """A host record's times (``SLOT_FIELDS``), or None when it is not one this reads:
    not an object, or a time that is not a finite number (an integer past a float's
    range, an infinity), which a report could not show."""
    try:
        raw = json.loads(value or b"")
        if not isinstance(raw, dict):
            return None
        times = {k: float(raw.get(k) or 0.0) for k in SLOT_FIELDS}
    except (ValueError, TypeError, OverflowError):
        return None
    return times if all(map(math.isfinite, times.values())) else None


#: Why a host is left alone past its policy's pause: a wait a timeline poll's answer
#: asked for (a spent rate limit, a 429), written with its request's release; the
#: poll's closing fold makes it the policy's pause, with its reason, a moment later.
ASKED_BY_ITS_ANSWER = "rate_limited (its answer's wait)"


def _pause_reason(value: bytes, backoff_until: float) -> str | None:
    """Why the host backs off until ``backoff_until``: its policy's ``pause_reason``
    when the policy's pause covers it, else the wait its answer asked; None for a record
    without a policy (an older pod's). Read tolerantly."""
    with contextlib.suppress(ValueError, TypeError, AttributeError, OverflowError):
        policy = json.loads(value).get(POLICY_KEY)
        if not isinstance(policy, dict):
            return None
        paused_until = float(policy.get("paused_until") or 0.0)
        if math.isfinite(paused_until) and paused_until + 1.0 < backoff_until:
            return ASKED_BY_ITS_ANSWER
        reason = policy.get("pause_reason")
        return reason[:64] if isinstance(reason, str) else None
    return None


async def read_slots(js: JetStreamContext) -> dict[str, bytes]:
    """The latest value of every key of ``trove_domains`` (deleted keys left out)."""
    values: dict[str, bytes] = {}
    await visit_slots(js, values.__setitem__, limit=None)
    return values


async def visit_slots(
    js: JetStreamContext, visit: Callable[[str, bytes], None], *, limit: int | None
) -> tuple[int, int]:
    """Hand each live key of ``trove_domains`` and its value to ``visit``, at most
    ``limit`` of them; how many were handed, and how many keys the bucket has.

    One ephemeral consumer (last message per subject, no acks) read in batches, rather
    than one request per key, and nothing kept: a crawl of months has a record for every
    host it asked in half a year. The consumer is deleted afterwards. (0, 0) when there
    is no bucket.
    """
    stream = f"KV_{DOMAINS_BUCKET}"
    prefix = f"$KV.{DOMAINS_BUCKET}."
    config = ConsumerConfig(
        name=f"trove-status-{uuid.uuid4().hex}",
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        ack_policy=AckPolicy.NONE,
        filter_subject=f"{prefix}>",
        mem_storage=True,
        inactive_threshold=READ_TIMEOUT * 6,
    )
    try:
        info = await js.add_consumer(stream, config)
    except NotFoundError:
        return 0, 0
    total = info.num_pending or 0
    handed = 0
    try:
        sub = await js.pull_subscribe_bind(info.name, stream=stream)
        remaining = total
        while remaining > 0 and (limit is None or handed < limit):
            wanted = min(remaining, BATCH, remaining if limit is None else limit - handed)
            msgs = await sub.fetch(wanted, timeout=READ_TIMEOUT)
            for msg in msgs:
                # The consumer's first ``total`` are each key's value when it began; what
                # comes after is news of keys already read (a busy host's slot changes
                # every few seconds), which would count the host again.
                if msg.metadata.sequence.consumer > total:
                    break
                headers = msg.headers or {}
                # The last message of a deleted key is its marker (nats-server 2.11+
                # places markers of its own too: expiry, purge).
                if headers.get("KV-Operation") in {"DEL", "PURGE"}:
                    continue
                if "Nats-Marker-Reason" in headers:
                    continue
                visit(msg.subject.removeprefix(prefix), msg.data)
                handed += 1
            # Each key's value when it began, or fewer: a record that expired meanwhile
            # is not delivered (the server's count of what is left says so).
            last = msgs[-1].metadata if msgs else None
            remaining = min(last.num_pending, total - last.sequence.consumer) if last else 0
        await sub.unsubscribe()
    finally:
        with contextlib.suppress(NotFoundError):
            await js.delete_consumer(stream, info.name)
    return handed, total


async def _domains(js: JetStreamContext, status: Status) -> None:
    now = status.now if status.server_now is None else status.server_now

    def count(domain: str, value: bytes) -> None:
        slot = slot_times(value)
        if slot is None:
            status.unreadable_slots += 1
            return
        if slot["backoff_until"] > now:
            left = slot["backoff_until"] - now
            reason = _pause_reason(value, slot["backoff_until"])
            status.backing_off.append(Cooldown(domain, left, reason))
        if slot["next"] > now:
            status.queued_domains += 1
            left = slot["next"] - now
            if status.longest_queue is None or left > status.longest_queue.seconds_left:
                status.longest_queue = Cooldown(domain, left)
        if slot["busy_until"] > now:
            status.fetching_domains += 1

    status.domains_read, status.domains_total = await visit_slots(js, count, limit=MAX_SLOTS)
    status.backing_off.sort(key=lambda c: (-c.seconds_left, c.domain))


async def _dead_letters(js: JetStreamContext, status: Status) -> None:
    try:
        info = await js.stream_info(DEAD_STREAM, subjects_filter=f"{DEAD_PREFIX}.>")
    except NotFoundError:
        return
    status.dead_letters = info.state.messages
    prefix = f"{DEAD_PREFIX}."
    status.dead_by_consumer = {
        subject.removeprefix(prefix): n
        for subject, n in sorted((info.state.subjects or {}).items())
    }
    if info.state.messages:
        # Parked messages are kept until an operator acts: how long has the oldest waited?
        with contextlib.suppress(NotFoundError):  # re-driven or dropped meanwhile
            oldest = await js.get_msg(DEAD_STREAM, info.state.first_seq)
            if oldest.time is not None:
                now = status.now if status.server_now is None else status.server_now
                status.dead_oldest_seconds = max(now - oldest.time.timestamp(), 0.0)


async def _store(js: JetStreamContext, status: Status) -> None:
    """What the record and the buckets take on nats-server's volume: a full store stops
    the crawl (it waits, losing nothing), so its growth is worth seeing coming."""
    info = await js.account_info()
    status.store_bytes = int(info.storage)
    limit = info.limits.max_storage if info.limits is not None else None
    status.store_limit = int(limit) if limit is not None and limit > 0 else None
    top = declare()
    by: dict[str, int] = {}
    names = [(s.name, s.name) for s in top.streams if s.name]
    names += [(f"KV_{b.bucket}", "buckets") for b in top.buckets]
    for stream, group in names:
        with contextlib.suppress(NotFoundError):
            used = (await js.stream_info(stream)).state.bytes
            by[group] = by.get(group, 0) + int(used)
    status.store_by_stream = dict(sorted(by.items(), key=lambda item: -item[1]))


def size(n: float) -> str:
    """``512 B``, ``3.4 MB``, ``1.2 GB``: bytes, for a person."""
    units = ("B", "KB", "MB", "GB", "TB")
    k = 0
    while n >= 1000 and k < len(units) - 1:
        n, k = n / 1000, k + 1
    return f"{n:.0f} B" if k == 0 else f"{n:.1f} {units[k]}"


def duration(seconds: float) -> str:
    """``45s``, ``12m 05s``, ``3h 04m``: seconds left, for a person."""
    s = max(round(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def _table(title: str, *columns: str, numeric: int = 1) -> Table:
    """A table whose last ``numeric`` columns are right-aligned numbers."""
    t = Table(
        title=title, title_justify="left", show_edge=False, pad_edge=False, min_width=len(title)
    )
    for i, column in enumerate(columns):
        t.add_column(column, justify="right" if i >= len(columns) - numeric else "left")
    return t


def _services(status: Status) -> list[Table | Text | str]:
    if status.services is None:
        return []
    table = _table(
        "Service processes", "process", "pid", "state", "last exit", "restarts", numeric=1
    )
    for p in status.services.processes:
        if p.restart_due_at is not None:
            state = f"[yellow]down, restart in {duration(p.restart_due_at - status.now)}[/yellow]"
        else:
            state = f"up {duration(status.now - p.started_at)}"
        last = "" if p.last_exit_code is None else describe_exit(p.last_exit_code)
        if p.last_exit_at is not None:
            last += f", {duration(status.now - p.last_exit_at)} ago"
        table.add_row(p.name, str(p.pid), state, last, str(p.restarts))
    parts: list[Table | Text | str] = [table]
    if not status.services.supervisor_alive:
        parts.append(Text("(left by a `trove up` that is no longer running)"))
    return [*parts, ""]


def render_status(status: Status, console: Console, *, max_domains: int = 20) -> None:
    about = "≈" if status.pages_estimated else ""
    pages = _table("Pages by status" + (" (estimated from a sample)" if about else ""),
                   "status", "pages")  # fmt: skip
    for name, n in status.pages_by_status.items():
        pages.add_row(name, f"{about}{n}")
    pages.add_row("[dim]linked only (not crawled)[/dim]", f"[dim]{about}{status.linked_only}[/dim]")
    about = "≈" if status.attempts_estimated else ""
    attempts = _table("Attempts by outcome" + (" (estimated from a sample)" if about else ""),
                      "outcome", "attempts")  # fmt: skip
    for name, n in status.attempts_by_outcome.items():
        attempts.add_row(name, f"{about}{n}")
    consumers = _table(
        "Consumers", "consumer", "stream", "pending", "in flight", "redelivered", numeric=3
    )
    for lag in status.consumers:
        if lag.exists:
            consumers.add_row(
                lag.durable,
                lag.stream,
                str(lag.pending),
                str(lag.ack_pending),
                str(lag.redelivered),
            )
        else:
            consumers.add_row(lag.durable, lag.stream, "[dim]not created yet[/dim]", "", "")
    parts: list[Table | Text | str] = [*_services(status), pages, "", attempts, "", consumers, ""]

    if status.backing_off:
        cooling = _table("Domains paused", "domain", "left", "why")
        for c in status.backing_off[:max_domains]:
            cooling.add_row(Text(c.domain), duration(c.seconds_left), Text(c.reason or ""))
        more = len(status.backing_off) - max_domains
        if more > 0:
            cooling.add_row(f"[dim]... and {more} more[/dim]", "", "")
        parts.extend([cooling, ""])
    else:
        parts.append(Text("No domain is paused."))
    line = f"{status.queued_domains} domain(s) with fetches queued for a later slot"
    if status.longest_queue is not None:
        line += (
            f" (longest: {status.longest_queue.domain}, "
            f"{duration(status.longest_queue.seconds_left)} left)"
        )
    parts.append(Text(f"{line}; {status.fetching_domains} fetching now."))
    if status.unreadable_slots:
        parts.append(Text(f"{status.unreadable_slots} unreadable domain record(s) skipped."))
    if status.domains_read >= MAX_SLOTS:
        parts.append(
            Text(
                f"(Counted over the first {status.domains_read:,} host records of "
                f"{status.domains_total:,}: there are more than `trove status` reads.)",
                "yellow",
            )
        )
    parts.append("")

    if status.dead_letters is None:
        parts.append(Text(f"Dead letters: stream {DEAD_STREAM} not created yet."))
    else:
        by = ", ".join(f"{c} {n}" for c, n in status.dead_by_consumer.items())
        dead = f"Dead letters: {status.dead_letters}" + (f" ({by})" if by else "")
        if status.dead_oldest_seconds is not None:
            dead += f", oldest parked {duration(status.dead_oldest_seconds)} ago: `trove dead`"
        parts.append(Text(dead))
    outbox = f"Outbox backlog: {status.outbox_backlog} unpublished"
    if status.outbox_oldest_seconds is not None:
        outbox += f" (oldest {duration(status.outbox_oldest_seconds)})"
    if status.outbox_held:
        outbox += f", {status.outbox_held} held by a replay (released when it ends)"
    parts.append(Text(outbox))
    if status.rebuild is not None:
        started, until, running = status.rebuild
        begun = datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds")
        if running:
            parts.append(
                Text(f"A whole replay is rebuilding the tables (since {begun}).", "yellow")
            )
        else:
            finish = (
                f"--since {datetime.fromtimestamp(until, UTC).isoformat()}"
                if until is not None
                else "--truncate"
            )
            parts.append(
                Text(
                    f"A whole replay begun {begun} stopped before its end: the recorders wait, "
                    f"the tables half rebuilt. `trove replay {finish}` finishes it.",
                    "red",
                )
            )
    if status.store_bytes is not None:
        store = f"JetStream store: {size(status.store_bytes)}"
        if status.store_limit:
            share = 100 * status.store_bytes / status.store_limit
            store += f" of {size(status.store_limit)} ({share:.0f}%)"
        if status.store_by_stream:
            store += " (" + ", ".join(f"{k} {size(v)}" for k, v in status.store_by_stream.items())
            store += ")"
        parts.append(Text(store))
    console.print(Group(*parts))


async def status_command(
    nats_url: str, database_url: str, console: Console, *, state_dir: Path | None = None
) -> int:
    """``trove status`` against these servers (and ``trove up``'s processes in ``state_dir``)."""
    engine = database_engine(database_url)
    nc = await connect(nats_url)
    try:
        status = await collect_status(
            nc.jetstream(), engine, server_now=await server_now(nc), state_dir=state_dir
        )
    finally:
        await nc.close()
        await engine.dispose()
    render_status(status, console)
    return 0
