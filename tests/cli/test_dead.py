"""``trove dead`` against a real NATS: list, re-drive and drop parked messages."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg
from prometheus_client import REGISTRY
from rich.console import Console
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.support import run_trove
from trove_cli import dead
from trove_cli.dead import DeadLetter, Outcome, dead_command, drop, list_dead, read_parked, redrive
from trove_cli.status import collect_status
from trove_schema.bus import Bus, Consumer
from trove_schema.events import PageDiscovered, Provenance, Scope, decode_event
from trove_schema.topology import (
    DEAD_PREFIX,
    DEAD_STREAM,
    DISCOVERY_SEEDS,
    EVENTS_STREAM,
    FETCHER,
    RECORDER,
    SEEDS_STREAM,
    SEEDS_SUBJECT,
    declare,
    ensure_topology,
)

pytestmark = pytest.mark.usefixtures("clean")


def page(n: int) -> PageDiscovered:
    return PageDiscovered(
        url=f"https://a.example/{n}",
        domain="a.example",
        scope=Scope(value="a.example"),
        provenance=Provenance(kind="seed"),
    )


async def park_next(bus: Bus, stream: str, durable: str, reason: str) -> Msg:
    """Take the consumer's next message and park it, as the consumer loop does."""
    sub = await bus.js.pull_subscribe_bind(durable, stream=stream)
    try:
        (msg,) = await sub.fetch(1, timeout=5)
        await bus.park(durable, msg, reason)
        await msg.term()
    finally:
        await sub.unsubscribe()
    return msg


async def acted(outcomes: AsyncIterator[Outcome]) -> list[Outcome]:
    return [o async for o in outcomes]


async def pending(bus: Bus, stream: str, durable: str) -> int:
    # Read with ``eventually`` after a publish: the server counts a new message a moment
    # after it acknowledges it.
    return (await bus.js.consumer_info(stream, durable)).num_pending or 0


@pytest.fixture
async def three_parked(bus: Bus) -> list[PageDiscovered]:
    """Two pages parked by the recorder and one by the fetcher."""
    events = [page(1), page(2)]
    for event in events:
        await bus.publish(event)
    await park_next(bus, EVENTS_STREAM, RECORDER, "failed 5 times: ValueError: one")
    await park_next(bus, EVENTS_STREAM, RECORDER, "failed 5 times: ValueError: two")
    await park_next(bus, EVENTS_STREAM, FETCHER, "malformed: invalid PageDiscovered")
    return events


async def test_parked_messages_are_listed_with_consumer_subject_reason_and_time(
    bus: Bus, three_parked: list[PageDiscovered]
) -> None:
    before = datetime.now(UTC)
    letters = await list_dead(bus.js)

    assert [(d.consumer, d.subject, d.reason) for d in letters] == [
        (RECORDER, PageDiscovered.SUBJECT, "failed 5 times: ValueError: one"),
        (RECORDER, PageDiscovered.SUBJECT, "failed 5 times: ValueError: two"),
        (FETCHER, PageDiscovered.SUBJECT, "malformed: invalid PageDiscovered"),
    ]
    assert all(abs((before - d.parked_at).total_seconds()) < 30 for d in letters)
    assert letters[0].size == len(three_parked[0].to_wire())
    assert [d.consumer for d in await list_dead(bus.js, consumer=FETCHER)] == [FETCHER]


async def test_a_listing_prints_headers_as_text_and_a_long_subject_whole() -> None:
    # A header is no markup and no terminal sequence; a subject was cut at 80 columns.
    subject = "trove.events.[bold]x[/bold]." + "Z" * 100 + "\x1b]52;c;eA==\x07"
    letter = DeadLetter(
        seq=7,
        parked_at=datetime.now(UTC),
        consumer="[red]recorder",
        subject=subject,
        reason="failed",
        size=1,
    )
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100, color_system="standard")
    dead.render_dead(dead.Parked([letter], {"recorder": 1}), console)
    printed = out.getvalue()
    assert "[red]recorder" in printed
    assert "[bold]x[/bold]" in printed
    assert printed.count("Z") == 100
    assert "\x1b]52" not in printed

    async def failed() -> AsyncGenerator[Outcome]:
        yield Outcome(seq=7, done=False, note="[bold]not found[/bold]")

    out.truncate(0)
    assert await dead.render_outcomes(failed(), "redrove", console) == 1
    assert "7: [bold]not found[/bold]" in out.getvalue()


async def test_a_listing_shows_the_newest_and_counts_the_rest_by_consumer(
    stack: StackUrls, bus: Bus, three_parked: list[PageDiscovered]
) -> None:
    # A poison bug can park a million events: the listing holds and prints a few.
    _first, second, third = await list_dead(bus.js)
    assert [d.seq for d in await list_dead(bus.js, last=2)] == [second.seq, third.seq]
    out = io.StringIO()
    code = await dead_command(stack.nats_url, Console(file=out, width=200), last=1)
    text = out.getvalue()
    assert code == 0
    assert f"the newest 1 of 3 ({FETCHER} 1, {RECORDER} 2)" in text
    assert "malformed: invalid PageDiscovered" in text
    assert "ValueError: one" not in text


async def park_directly(bus: Bus, consumer: str, n: int) -> None:
    """``n`` messages parked by ``consumer``, as the bus parks them."""
    for i in range(n):
        await bus.js.publish(
            f"{DEAD_PREFIX}.{consumer}",
            b"{}",
            headers={
                "Trove-Dead-Consumer": consumer,
                "Trove-Dead-Subject": PageDiscovered.SUBJECT,
                "Trove-Dead-Reason": f"{consumer} {i}",
            },
        )


async def test_the_newest_of_one_consumer_are_found_behind_many_of_another(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The listing reads a window at the stream's end, and widens it until it holds the
    # newest asked for: here they lie behind a full batch of the fetcher's.
    await park_directly(bus, RECORDER, 3)
    await park_directly(bus, FETCHER, 600)
    read = []
    between = dead._parked_between

    async def counted(*args: Any) -> AsyncIterator[DeadLetter]:
        async for letter in between(*args):
            read.append(letter.seq)
            yield letter

    monkeypatch.setattr(dead, "_parked_between", counted)

    parked = await read_parked(bus.js, consumer=RECORDER, last=2)

    assert [d.reason for d in parked.letters] == [f"{RECORDER} 1", f"{RECORDER} 2"]
    assert parked.by_consumer == {RECORDER: 3}
    read.clear()
    every = await read_parked(bus.js, last=5)
    assert [d.reason for d in every.letters] == [f"{FETCHER} {i}" for i in range(595, 600)]
    assert every.by_consumer == {RECORDER: 3, FETCHER: 600}
    assert len(read) <= dead.BATCH  # not the 603 parked: one window was enough


async def test_redrive_all_leaves_what_is_parked_again_meanwhile(bus: Bus) -> None:
    # A re-driven message its consumer fails again is parked again: `--all` acts on what
    # was parked when it began, or it would go round for ever.
    await park_directly(bus, RECORDER, 2)
    seen = []
    async for outcome in redrive(bus.nc, every=True):
        assert outcome.done, outcome
        seen.append(outcome.seq)
        await park_directly(bus, RECORDER, 1)

    assert len(seen) == 2
    assert len(await list_dead(bus.js)) == 2
    assert not set(seen) & {d.seq for d in await list_dead(bus.js)}


async def test_redrive_republishes_to_the_original_subject_within_the_duplicate_window(
    bus: Bus, engine: AsyncEngine, three_parked: list[PageDiscovered]
) -> None:
    first, _second, third = await list_dead(bus.js)
    recorder_before = await pending(bus, EVENTS_STREAM, RECORDER)

    outcomes = await acted(redrive(bus.nc, [first.seq]))

    assert [(o.seq, o.done, o.note) for o in outcomes] == [
        (first.seq, True, PageDiscovered.SUBJECT)
    ]
    # Seconds after the original: its Nats-Msg-Id would have been dropped as a duplicate.
    await eventually(
        lambda: pending(bus, EVENTS_STREAM, RECORDER),
        until=lambda n: n == recorder_before + 1,
        timeout=5,
        what="the redriven event counted",
    )
    latest = await bus.js.get_last_msg(EVENTS_STREAM, PageDiscovered.SUBJECT)
    assert decode_event(latest.data or b"") == three_parked[0]
    assert latest.headers is not None
    assert latest.headers["Trove-Event-Type"] == "PageDiscovered"
    assert not any(k.startswith("Trove-Dead-") for k in latest.headers)
    assert latest.headers["Trove-Redriven-For"] == RECORDER  # the others ack it unread
    assert [d.seq for d in await list_dead(bus.js)] == [_second.seq, third.seq]
    status = await collect_status(bus.js, engine)
    assert status.dead_letters == 2
    assert status.dead_by_consumer == {FETCHER: 1, RECORDER: 1}


async def test_redrive_all_of_one_consumer_leaves_the_others_parked(
    bus: Bus, three_parked: list[PageDiscovered]
) -> None:
    outcomes = await acted(redrive(bus.nc, every=True, consumer=RECORDER))

    assert [o.done for o in outcomes] == [True, True]
    assert [d.consumer for d in await list_dead(bus.js)] == [FETCHER]
    await eventually(
        lambda: pending(bus, EVENTS_STREAM, RECORDER),
        until=lambda n: n == 2,
        timeout=5,
        what="both redriven events counted",
    )


async def test_a_parked_seed_is_redriven_into_the_seeds_stream_that_sends_no_acks(
    bus: Bus,
) -> None:
    await bus.nc.publish(SEEDS_SUBJECT, b"https://seed.example/")
    await eventually(
        lambda: pending(bus, SEEDS_STREAM, DISCOVERY_SEEDS),
        until=lambda n: n == 1,
        timeout=5,
        what="the seed stored",
    )
    await park_next(bus, SEEDS_STREAM, DISCOVERY_SEEDS, "failed 5 times: OSError: x")
    (letter,) = await list_dead(bus.js)

    (outcome,) = await acted(redrive(bus.nc, [letter.seq]))

    assert outcome.done, outcome
    await eventually(
        lambda: pending(bus, SEEDS_STREAM, DISCOVERY_SEEDS),
        until=lambda n: n == 1,
        timeout=5,
        what="the redriven seed counted",
    )
    assert await list_dead(bus.js) == []


async def test_a_message_that_cannot_be_redriven_stays_parked(bus: Bus) -> None:
    await bus.js.publish(
        f"{DEAD_PREFIX}.{RECORDER}",
        b"{}",
        headers={"Trove-Dead-Subject": "nowhere.at.all", "Trove-Dead-Reason": "x"},
    )
    (letter,) = await list_dead(bus.js)

    outcomes = await acted(redrive(bus.nc, [letter.seq, letter.seq + 1000]))

    assert [o.done for o in outcomes] == [False, False]
    assert "nowhere.at.all" in outcomes[0].note
    assert outcomes[1].note == "no parked message with this sequence"
    assert [d.seq for d in await list_dead(bus.js)] == [letter.seq]


async def test_drop_removes_parked_messages_and_logs_each_one(
    bus: Bus, three_parked: list[PageDiscovered], caplog: pytest.LogCaptureFixture
) -> None:
    first, second, third = await list_dead(bus.js)
    caplog.set_level(logging.WARNING, logger="trove_cli.dead")

    outcomes = await acted(drop(bus.js, [first.seq, third.seq]))

    assert [o.done for o in outcomes] == [True, True]
    assert [d.seq for d in await list_dead(bus.js)] == [second.seq]
    lines = [r.getMessage() for r in caplog.records if r.name == "trove_cli.dead"]
    assert len(lines) == 2
    assert f"dropped parked message {first.seq}" in lines[0]
    assert "consumer recorder" in lines[0]
    assert PageDiscovered.SUBJECT in lines[0]
    assert "ValueError: one" in lines[0]


class TakenMeanwhile:
    """The real JetStream context, where another ``trove dead`` removes message ``seq``
    right after this one has read it."""

    def __init__(self, js: Any, seq: int) -> None:
        self._js, self._seq = js, seq

    async def get_msg(self, stream: str, seq: int) -> Any:
        parked = await self._js.get_msg(stream, seq)
        if seq == self._seq:
            await self._js.delete_msg(stream, seq)
        return parked

    def __getattr__(self, name: str) -> Any:
        return getattr(self._js, name)


async def test_a_drop_goes_on_past_a_message_another_command_removed_meanwhile(
    bus: Bus, three_parked: list[PageDiscovered]
) -> None:
    first, second, third = await list_dead(bus.js)

    js = TakenMeanwhile(bus.js, second.seq)
    outcomes = await acted(drop(js, [first.seq, second.seq, third.seq]))  # type: ignore[arg-type]

    assert [(o.seq, o.done, o.note) for o in outcomes][1] == (
        second.seq,
        False,
        "removed meanwhile by another command",
    )
    assert [o.done for o in outcomes] == [True, False, True]
    assert await list_dead(bus.js) == []


async def test_a_redrive_goes_on_past_a_message_another_command_removed_meanwhile(
    bus: Bus, three_parked: list[PageDiscovered], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second, third = await list_dead(bus.js)
    publish = dead._publish

    async def published_then_taken(nc: Any, js: Any, subject: str, *args: Any) -> None:
        await publish(nc, js, subject, *args)
        if args[1]["Nats-Msg-Id"].endswith(f":{second.seq}"):
            await bus.js.delete_msg(DEAD_STREAM, second.seq)  # another command's removal

    monkeypatch.setattr(dead, "_publish", published_then_taken)
    outcomes = await acted(redrive(bus.nc, [first.seq, second.seq, third.seq]))

    assert [o.done for o in outcomes] == [True, True, True]
    assert outcomes[1].note == f"{PageDiscovered.SUBJECT} (removed meanwhile by another command)"
    assert await list_dead(bus.js) == []


async def test_a_sequence_no_stream_can_hold_is_refused_before_anything_is_done(
    stack: StackUrls, bus: Bus, three_parked: list[PageDiscovered], tmp_path: Path
) -> None:
    first, _, third = await list_dead(bus.js)
    env = {
        **os.environ,
        "TROVE_NATS_URL": stack.nats_url,
        "TROVE_STATE_DIR": str(tmp_path / "state"),
    }
    for bad, why in (("0", "at least 1"), ("-5", "at least 1"), (str(2**64), "at most")):
        code, printed = await run_trove(
            "dead", "drop", str(first.seq), bad, str(third.seq), env=env
        )
        assert code == 2, printed
        assert why in printed
    assert len(await list_dead(bus.js)) == 3


async def test_the_dead_letter_gauge_follows_parking_and_dropping(bus: Bus) -> None:
    async def poison(msg: Msg) -> None:
        raise ValueError("poison")

    consumer = Consumer(
        bus=bus,
        stream=EVENTS_STREAM,
        durable=FETCHER,
        handler=poison,
        max_failures=1,
        dead_letters_refresh=0.1,
    )

    def gauge() -> float | None:
        return REGISTRY.get_sample_value("trove_dead_letters", {"consumer": FETCHER})

    async def read_gauge() -> float | None:
        return gauge()

    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        await bus.publish(page(1))
        await eventually(read_gauge, until=lambda v: v == 1, timeout=10, what="gauge at 1")
        await acted(drop(bus.js, every=True))
        await eventually(read_gauge, until=lambda v: v == 0, timeout=10, what="gauge at 0")
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)


@pytest.mark.parametrize(("action", "verb"), [("redrive", "re-drove"), ("drop", "dropped")])
async def test_all_on_a_dead_stream_that_never_held_a_message_acts_on_none(
    stack: StackUrls, bus: Bus, action: str, verb: str
) -> None:
    # A new cluster's: its first sequence is 0, where no consumer may start.
    await bus.js.delete_stream(DEAD_STREAM)
    await ensure_topology(bus.js, declare(), owner="cli")
    assert (await bus.js.stream_info(DEAD_STREAM)).state.first_seq == 0
    out = io.StringIO()

    code = await dead_command(stack.nats_url, Console(file=out), action=action, every=True)

    assert code == 0
    assert f"{verb} 0 parked message(s)." in out.getvalue()


async def test_dead_command_refuses_an_action_without_sequences_or_all(stack: StackUrls) -> None:
    out = io.StringIO()

    code = await dead_command(stack.nats_url, Console(file=out), action="drop")

    assert code == 2
    assert "--all" in out.getvalue()


@pytest.mark.parametrize("action", ["redrive", "drop"])
async def test_dead_command_refuses_a_consumer_beside_sequence_numbers(
    stack: StackUrls, bus: Bus, three_parked: list[PageDiscovered], action: str
) -> None:
    recorders = [d.seq for d in await list_dead(bus.js) if d.consumer == RECORDER]
    out = io.StringIO()

    code = await dead_command(
        stack.nats_url, Console(file=out), action=action, seqs=recorders, consumer=FETCHER
    )

    assert code == 2
    assert "--consumer goes with --all" in out.getvalue()
    assert len(await list_dead(bus.js)) == 3


async def test_trove_dead_lists_and_redrives_from_the_command_line(
    stack: StackUrls, bus: Bus, three_parked: list[PageDiscovered], tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "TROVE_NATS_URL": stack.nats_url,
        "TROVE_DATABASE_URL": stack.database_url,
        "TROVE_STATE_DIR": str(tmp_path / "state"),
        "COLUMNS": "200",
    }

    async def trove(*argv: str) -> tuple[int, str]:
        return await run_trove(*argv, env=env)

    started = time.monotonic()
    code, listed = await trove("dead")
    assert code == 0, listed
    for expected in ("Parked messages (3)", "recorder", "fetcher", "ValueError: two"):
        assert expected in listed, expected

    code, printed = await trove("dead", "redrive", "--all", "--consumer", RECORDER)
    assert code == 0, printed
    assert "re-drove 2 parked message(s)" in printed
    assert "re-drove parked message" in printed  # the log line, on stderr
    assert [d.consumer for d in await list_dead(bus.js)] == [FETCHER]
    assert time.monotonic() - started < 30
