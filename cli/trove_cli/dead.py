"""``trove dead``: the messages consumers parked, for an operator to re-drive or drop.

A consumer parks a message on ``trove.dead.<consumer>`` (stream ``TROVE_DEAD``) when it
is poison: malformed, or its handler failed ``max_failures`` times on its own (see
``trove_schema.bus``). It stays there until someone acts (``TROVE_DEAD_MAX_AGE_SECONDS``
is 0, forever, by default):

* ``trove dead`` lists them: sequence, time, consumer, subject, reason;
* ``trove dead redrive SEQ ... | --all`` publishes each to its original subject, then
  removes it. The event's own ``Nats-Msg-Id`` is not sent again: within the duplicate
  window JetStream would drop the re-drive as a copy of the original. Each re-drive has
  an id of its own instead, and is meant for the consumer that parked it alone
  (``Trove-Redriven-For``): the others of its subject ack it unread;
* ``trove dead drop SEQ ... | --all`` removes them.

Every re-drive and drop is logged (``trove_cli.dead``, on stderr) with what was removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import APIError, NotFoundError
from rich.console import Console
from rich.table import Table

from trove_cli.broker import connect
from trove_cli.outside import outside
from trove_schema.bus import REDRIVEN_FOR
from trove_schema.topology import DEAD_PREFIX, DEAD_STREAM

log = logging.getLogger(__name__)

#: Messages per fetch while listing, and the wait for each batch.
BATCH = 256
READ_TIMEOUT = 5.0
#: Parked messages ``trove dead`` lists, the newest: the others are counted.
DEFAULT_LAST = 100
#: How long a re-drive into a stream that sends no PubAck (``no_ack``, the seeds) waits
#: to see the message stored.
STORED_TIMEOUT = 5.0
#: How long the server keeps a listing's consumer nobody reads (it is deleted when done).
INACTIVE_THRESHOLD = 600.0
#: Subjects whose stream a re-drive remembers (one lookup each, not one a message).
STREAMS_KNOWN = 1024


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One parked message, as listed (headers only: the body stays on the server)."""

    seq: int
    parked_at: datetime
    consumer: str
    subject: str
    reason: str
    size: int


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one sequence number asked for."""

    seq: int
    done: bool
    #: Where it went (re-drive), or why nothing was done.
    note: str


def _filter(consumer: str | None) -> str:
    return f"{DEAD_PREFIX}.{consumer}" if consumer else f"{DEAD_PREFIX}.>"


@dataclass(frozen=True, slots=True)
class Parked:
    """The newest parked messages, and how many there are by consumer."""

    letters: list[DeadLetter]
    by_consumer: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.by_consumer.values())


async def list_dead(
    js: JetStreamContext, *, consumer: str | None = None, last: int | None = None
) -> list[DeadLetter]:
    """Every parked message (of ``consumer``, if given), oldest first; the ``last``
    newest only, when given."""
    return (await read_parked(js, consumer=consumer, last=last)).letters


async def read_parked(
    js: JetStreamContext, *, consumer: str | None = None, last: int | None = None
) -> Parked:
    """The parked messages (of ``consumer``, if given), oldest first, the ``last``
    newest only when given: a poison bug can park a million events, which a listing
    must neither read nor hold. The counts come from the stream's subject index; the
    newest are read from a window at the stream's end, widened until it holds them.
    Empty without the stream."""
    try:
        info = await js.stream_info(DEAD_STREAM, subjects_filter=_filter(consumer))
    except NotFoundError:
        return Parked([], {})
    prefix = f"{DEAD_PREFIX}."
    by_consumer = {s.removeprefix(prefix): n for s, n in (info.state.subjects or {}).items()}
    wanted = sum(by_consumer.values()) if last is None else min(last, sum(by_consumer.values()))
    letters: list[DeadLetter] = []
    stop = info.state.last_seq + 1
    span = max(2 * wanted, BATCH)
    while len(letters) < wanted and stop > info.state.first_seq:
        start = max(info.state.first_seq, stop - span)
        window = [letter async for letter in _parked_between(js, consumer, start, stop)]
        letters = window + letters
        stop, span = start, span * 4
    # Fewer than counted, if some were re-driven or dropped meanwhile: what is there.
    return Parked(letters[max(0, len(letters) - wanted) :], by_consumer)


async def _parked_between(
    js: JetStreamContext, consumer: str | None, start: int, stop: int
) -> AsyncGenerator[DeadLetter]:
    """The parked messages from sequence ``start`` up to ``stop`` (excluded), oldest
    first, read a batch at a time through an ephemeral consumer that delivers headers
    only (the bodies stay on the server); it is deleted afterwards."""
    config = ConsumerConfig(
        name=f"trove-dead-{uuid.uuid4().hex}",
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=start,
        ack_policy=AckPolicy.NONE,
        filter_subject=_filter(consumer),
        headers_only=True,
        mem_storage=True,
        # Read as ``--all`` acts on each batch: re-driving one into the seeds stream
        # waits up to STORED_TIMEOUT, and the server must not delete it meanwhile.
        inactive_threshold=INACTIVE_THRESHOLD,
    )
    try:
        info = await js.add_consumer(DEAD_STREAM, config)
    except NotFoundError:
        return
    try:
        sub = await js.pull_subscribe_bind(info.name, stream=DEAD_STREAM)
        try:
            remaining = info.num_pending or 0
            while remaining > 0:
                msgs = await sub.fetch(min(remaining, BATCH), timeout=READ_TIMEOUT)
                remaining = msgs[-1].metadata.num_pending if msgs else 0
                for msg in msgs:
                    if msg.metadata.sequence.stream >= stop:
                        return
                    yield _letter(msg)
        finally:
            await sub.unsubscribe()
    finally:
        with contextlib.suppress(NotFoundError):
            await js.delete_consumer(DEAD_STREAM, info.name)


def _letter(msg: Msg) -> DeadLetter:
    headers = msg.headers or {}
    md = msg.metadata
    return DeadLetter(
        seq=md.sequence.stream,
        parked_at=md.timestamp,
        consumer=headers.get("Trove-Dead-Consumer", msg.subject.removeprefix(f"{DEAD_PREFIX}.")),
        subject=headers.get("Trove-Dead-Subject", ""),
        reason=headers.get("Trove-Dead-Reason", ""),
        size=int(headers.get("Nats-Msg-Size", 0)),
    )


async def _sequences(
    js: JetStreamContext, seqs: Sequence[int], every: bool, consumer: str | None
) -> AsyncGenerator[int]:
    """The sequences to act on; with ``every``, those parked when the command began,
    read as it goes (a million are not held), and not what is parked again meanwhile
    (a re-driven message its consumer fails again would come round for ever)."""
    if not every:
        for seq in dict.fromkeys(seqs):
            yield seq
        return
    try:
        info = await js.stream_info(DEAD_STREAM)
    except NotFoundError:
        return
    if not info.state.messages:
        # A stream that never held one starts at sequence 0, where the server refuses
        # to start a consumer.
        return
    parked = _parked_between(js, consumer, info.state.first_seq, info.state.last_seq + 1)
    async with contextlib.aclosing(parked):
        async for letter in parked:
            yield letter.seq


async def redrive(
    nc: Client,
    seqs: Sequence[int] = (),
    *,
    every: bool = False,
    consumer: str | None = None,
) -> AsyncGenerator[Outcome]:
    """Publish parked messages to their original subjects, then remove them from
    TROVE_DEAD, telling what became of each as it goes.

    A message is removed only once its stream has stored the copy: a failure on the way
    leaves it parked, to be re-driven again.
    """
    js = nc.jetstream()
    streams: dict[str, tuple[str, bool]] = {}
    async with contextlib.aclosing(_sequences(js, seqs, every, consumer)) as sequences:
        async for seq in sequences:
            try:
                parked = await js.get_msg(DEAD_STREAM, seq)
            except NotFoundError:
                yield Outcome(seq, False, "no parked message with this sequence")
                continue
            headers = parked.headers or {}
            subject = headers.get("Trove-Dead-Subject", "")
            if not subject:
                yield Outcome(seq, False, "parked without its original subject")
                continue
            own = {k: v for k, v in headers.items() if not k.startswith(("Nats-", "Trove-Dead-"))}
            own["Nats-Msg-Id"] = f"trove-redrive:{DEAD_STREAM}:{seq}"
            parker = headers.get("Trove-Dead-Consumer", "")
            if parker:  # only the consumer that parked it handles it again
                own[REDRIVEN_FOR] = parker
            try:
                await _publish(nc, js, subject, parked.data or b"", own, streams)
            except Exception as exc:
                yield Outcome(seq, False, f"could not publish to {subject}: {exc}")
                continue
            if not await _removed(js, seq):
                # Another command took it between our read and our removal. Had it
                # re-driven it too, the copy's id made ours a duplicate the stream dropped.
                yield Outcome(seq, True, f"{subject} (removed meanwhile by another command)")
                continue
            log.warning(
                "re-drove parked message %d to %s (consumer %s, parked for: %s)",
                seq,
                subject,
                headers.get("Trove-Dead-Consumer", "?"),
                headers.get("Trove-Dead-Reason", "?"),
            )
            yield Outcome(seq, True, subject)


#: nats-server's answer to removing a message that is not there (a 500, not a 404).
_NO_MESSAGE = 10057


async def _removed(js: JetStreamContext, seq: int) -> bool:
    """Remove parked message ``seq``; False when it was gone already: another ``trove
    dead`` run at the same time took it after this one read it."""
    try:
        await js.delete_msg(DEAD_STREAM, seq)
    except NotFoundError:
        return False
    except APIError as exc:
        if exc.err_code == _NO_MESSAGE:
            return False
        raise
    return True


async def _publish(
    nc: Client,
    js: JetStreamContext,
    subject: str,
    data: bytes,
    headers: dict[str, str],
    streams: dict[str, tuple[str, bool]],
) -> None:
    """Publish to the stream that holds ``subject``, and make sure it stored the message.
    ``streams`` remembers each subject's stream and whether it acks, for the next."""
    if subject not in streams:
        if len(streams) >= STREAMS_KNOWN:
            streams.clear()  # a parked event's subject names its kind, not its page
        stream = await js.find_stream_name_by_subject(subject)
        streams[subject] = (stream, not (await js.stream_info(stream)).config.no_ack)
    stream, acks = streams[subject]
    if acks:
        await js.publish(subject, data, headers=headers)
        return
    # A stream that answers nothing (the seeds, so that discovery answers `nats req`):
    # publish plainly and wait until the stream's last sequence moves past ours.
    before = (await js.stream_info(stream)).state.last_seq
    await nc.publish(subject, data, headers=headers)
    await nc.flush()
    deadline = time.monotonic() + STORED_TIMEOUT
    while (await js.stream_info(stream)).state.last_seq <= before:
        if time.monotonic() > deadline:
            raise TimeoutError(f"stream {stream} did not store it")
        await asyncio.sleep(0.05)


async def drop(
    js: JetStreamContext,
    seqs: Sequence[int] = (),
    *,
    every: bool = False,
    consumer: str | None = None,
) -> AsyncGenerator[Outcome]:
    """Remove parked messages for good, logging each one's consumer, subject and reason."""
    async with contextlib.aclosing(_sequences(js, seqs, every, consumer)) as sequences:
        async for seq in sequences:
            try:
                parked = await js.get_msg(DEAD_STREAM, seq)
            except NotFoundError:
                yield Outcome(seq, False, "no parked message with this sequence")
                continue
            if not await _removed(js, seq):
                yield Outcome(seq, False, "removed meanwhile by another command")
                continue
            headers = parked.headers or {}
            log.warning(
                "dropped parked message %d from %s (consumer %s, subject %s, parked for: %s)",
                seq,
                parked.subject,
                headers.get("Trove-Dead-Consumer", "?"),
                headers.get("Trove-Dead-Subject", "?"),
                headers.get("Trove-Dead-Reason", "?"),
            )
            yield Outcome(seq, True, "dropped")


def render_dead(parked: Parked, console: Console) -> None:
    letters = parked.letters
    if not letters:
        console.print("No parked messages.")
        return
    title = f"Parked messages ({parked.total:,})"
    if len(letters) < parked.total:
        counts = ", ".join(f"{name} {n:,}" for name, n in sorted(parked.by_consumer.items()))
        title = f"Parked messages: the newest {len(letters):,} of {parked.total:,} ({counts})"
    table = Table(title=title, title_justify="left")
    for column in ("seq", "parked", "consumer", "subject", "reason"):
        table.add_column(column, justify="right" if column == "seq" else "left")
    for letter in letters:
        when = letter.parked_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
        # Headers are text, never markup, and a subject is shown whole: a redrive is
        # checked against it.
        table.add_row(
            str(letter.seq),
            when,
            outside(letter.consumer),
            outside(letter.subject, overflow="fold"),
            outside(letter.reason, overflow="fold"),
        )
    console.print(table)
    console.print("re-drive: trove dead redrive SEQ ... | --all;  remove: trove dead drop SEQ ...")


async def render_outcomes(outcomes: AsyncGenerator[Outcome], verb: str, console: Console) -> int:
    """Print what was done, and each thing that could not be (as it happens: ``--all``
    over a million is not held); 1 when something asked for could not be done."""
    done = failed = 0
    async with contextlib.aclosing(outcomes):
        async for o in outcomes:
            if o.done:
                done += 1
            else:
                failed += 1
                console.print(outside(f"{o.seq}: {o.note}", style="red"))
    console.print(f"{verb} {done} parked message(s).")
    return 0 if failed == 0 else 1


def _audit_log() -> None:
    """Re-drives and drops go to stderr with a time, whatever else logs (or not)."""
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


async def dead_command(
    nats_url: str,
    console: Console,
    *,
    action: str | None = None,
    seqs: Sequence[int] = (),
    every: bool = False,
    consumer: str | None = None,
    last: int | None = DEFAULT_LAST,
) -> int:
    """``trove dead [--last N] [redrive|drop] [SEQ ...] [--all] [--consumer NAME]``."""
    if action is not None and bool(seqs) == every:
        console.print("[red]give the sequence numbers to act on, or --all[/red]")
        return 2
    if seqs and consumer:
        # Said, not ignored: `drop --consumer fetcher 2810` dropped the recorder's 2810.
        console.print("[red]--consumer goes with --all; sequence numbers name their own[/red]")
        return 2
    _audit_log()
    nc = await connect(nats_url)
    try:
        js = nc.jetstream()
        if action is None:
            render_dead(await read_parked(js, consumer=consumer, last=last), console)
            return 0
        if action == "redrive":
            return await render_outcomes(
                redrive(nc, seqs, every=every, consumer=consumer), "re-drove", console
            )
        return await render_outcomes(
            drop(js, seqs, every=every, consumer=consumer), "dropped", console
        )
    finally:
        await nc.close()
