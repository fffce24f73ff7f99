"""The consumer loop's failure policy on a real nats-server: parking is for poison only."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypedDict, cast

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DiscardPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, NotFoundError, ServiceUnavailableError
from prometheus_client import REGISTRY

from tests.conftest import eventually, reading, unacked
from tests.ports import free_port
from trove_schema.bus import (
    REDRIVEN_FOR,
    BatchConsumer,
    Bus,
    Consumer,
    FailureCounts,
    MessageTooLarge,
    Retry,
    _Held,
    _Marks,
    broker_trouble,
)
from trove_schema.errors import TopologyError
from trove_schema.events import PageDiscovered, Provenance, Scope, decode_event
from trove_schema.pulls import Pulls
from trove_schema.topology import DEAD_PREFIX, DEAD_STREAM, EVENTS_STREAM
from trove_stack.nats import EmbeddedNats, NatsConfig, nats_server_binary

pytestmark = pytest.mark.usefixtures("clean")


class Quick(TypedDict):
    failure_backoff: float
    broker_retry_delay: float
    idle_wait: float


#: Backoffs scaled down so that a test's redeliveries take milliseconds.
FAST = Quick(failure_backoff=0.01, broker_retry_delay=0.01, idle_wait=0.2)


@dataclass
class Lane:
    """A stream of its own with one durable consumer, so a test sees only its messages."""

    stream: str
    subject: str
    durable: str

    @property
    def dead_subject(self) -> str:
        return f"{DEAD_PREFIX}.{self.durable}"


@pytest.fixture
async def lane(bus: Bus) -> AsyncIterator[Lane]:
    tag = uuid.uuid4().hex[:10]
    made = Lane(stream=f"TEST_BUS_{tag}", subject=f"test.bus.{tag}", durable=f"test-{tag}")
    await bus.js.add_stream(
        StreamConfig(name=made.stream, subjects=[made.subject], storage=StorageType.MEMORY)
    )
    await bus.js.add_consumer(
        made.stream,
        ConsumerConfig(
            durable_name=made.durable, ack_policy=AckPolicy.EXPLICIT, ack_wait=0.5, max_deliver=-1
        ),
    )
    try:
        yield made
    finally:
        await bus.js.delete_stream(made.stream)


@dataclass
class Script:
    """A handler that plays one step per call (an exception to raise, or None to succeed)."""

    steps: Sequence[Callable[[], Awaitable[None]] | None]
    then: Callable[[], Awaitable[None]] | None = None
    calls: int = 0
    handled: list[Msg] = field(default_factory=list)
    deliveries: list[int] = field(default_factory=list)

    async def __call__(self, msg: Msg) -> None:
        self.calls += 1
        self.deliveries.append(msg.metadata.num_delivered)
        step = self.steps[self.calls - 1] if self.calls <= len(self.steps) else self.then
        if step is not None:
            await step()
        self.handled.append(msg)


def raising(exc: BaseException) -> Callable[[], Awaitable[None]]:
    async def step() -> None:
        raise exc

    return step


@asynccontextmanager
async def running(consumer: Consumer | BatchConsumer) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)


def lane_consumer(
    bus: Bus,
    lane: Lane,
    handler: Callable[[Msg], Awaitable[None]],
    *,
    batched: bool,
    concurrency: int = 1,
    **options: Any,
) -> Consumer | BatchConsumer:
    """The lane's consumer: one message at a time, or in batches as the recorder's (each
    message of a batch handed to ``handler``)."""
    if batched:

        async def each(msgs: Sequence[Msg]) -> None:
            for msg in msgs:
                await handler(msg)

        return BatchConsumer(
            bus=bus,
            stream=lane.stream,
            durable=lane.durable,
            batch_handler=each,
            handler=handler,
            **options,
        )
    return Consumer(
        bus=bus,
        stream=lane.stream,
        durable=lane.durable,
        handler=handler,
        concurrency=concurrency,
        **options,
    )


async def parked(bus: Bus, lane: Lane) -> int:
    info = await bus.js.stream_info(DEAD_STREAM, subjects_filter=lane.dead_subject)
    return (info.state.subjects or {}).get(lane.dead_subject, 0)


async def outstanding(bus: Bus, lane: Lane) -> int:
    """Messages the lane's consumer has not acked or termed yet."""
    return await unacked(bus, lane.stream, lane.durable)


async def settled(bus: Bus, lane: Lane) -> None:
    await eventually(
        lambda: outstanding(bus, lane), until=lambda n: n == 0, timeout=10, what="all acked"
    )


async def test_a_handler_that_asks_for_retries_many_times_is_never_parked(
    bus: Bus, lane: Lane
) -> None:
    script = Script([raising(Retry("database away", delay=0.01))] * 12)
    await bus.js.publish(lane.subject, b"work")

    async with running(
        Consumer(bus=bus, stream=lane.stream, durable=lane.durable, handler=script, max_failures=2)
    ):
        await settled(bus, lane)

    assert script.calls == 13
    assert script.deliveries[-1] == 13  # JetStream counted every delivery; the consumer did not
    assert len(script.handled) == 1
    assert await parked(bus, lane) == 0


async def test_broker_errors_raised_in_a_handler_are_retried_not_parked(
    bus: Bus, lane: Lane
) -> None:
    silent = await bus.nc.subscribe(f"{lane.subject}.silent")  # never answers

    async def publish_to_no_stream() -> None:
        await bus.js.publish(f"nowhere.{lane.durable}", b"x")  # no responders: no stream

    async def request_nobody() -> None:
        await bus.nc.request(f"nobody.{lane.durable}", b"x", timeout=1)

    async def request_too_slow() -> None:
        await bus.nc.request(f"{lane.subject}.silent", b"x", timeout=0.05)

    unavailable = APIError(code=503, description="JetStream system temporarily unavailable")
    steps = [
        publish_to_no_stream,
        request_nobody,
        request_too_slow,
        raising(ServiceUnavailableError()),
        raising(unavailable),
        raising(TimeoutError()),
    ]
    script = Script(steps * 2)
    await bus.js.publish(lane.subject, b"work")

    async with running(
        Consumer(
            bus=bus,
            stream=lane.stream,
            durable=lane.durable,
            handler=script,
            max_failures=2,
            max_retry_pause=0.05,  # twelve pauses in a row, each doubled
            **FAST,
        )
    ):
        await settled(bus, lane)
    await silent.unsubscribe()

    assert script.calls == 13
    assert len(script.handled) == 1
    assert await parked(bus, lane) == 0


async def test_a_poison_message_is_parked_after_its_own_failures_with_the_reason(
    bus: Bus, lane: Lane, caplog: pytest.LogCaptureFixture
) -> None:
    retries = [raising(Retry("database away", delay=0.01))] * 4
    script = Script(retries, then=raising(ValueError("no such column")))
    await bus.js.publish(
        lane.subject, b"poison", headers={"Nats-Msg-Id": "m-1", "Trove-Event-Type": "Test"}
    )
    parked_before = REGISTRY.get_sample_value(
        "trove_messages_total", {"consumer": lane.durable, "ending": "parked"}
    )

    with caplog.at_level(logging.ERROR, logger="trove_schema.bus"):
        async with running(
            Consumer(
                bus=bus,
                stream=lane.stream,
                durable=lane.durable,
                handler=script,
                max_failures=3,
                **FAST,
            )
        ):
            await settled(bus, lane)
            assert REGISTRY.get_sample_value("trove_dead_letters", {"consumer": lane.durable}) == 1

    assert script.calls == 4 + 3  # the retries were not failures
    assert parked_before is None
    assert REGISTRY.get_sample_value(
        "trove_messages_total", {"consumer": lane.durable, "ending": "parked"}
    )
    assert await parked(bus, lane) == 1
    dead = await bus.js.get_last_msg(DEAD_STREAM, lane.dead_subject)
    assert dead.data == b"poison"
    assert dead.headers is not None
    assert dead.headers["Trove-Dead-Reason"] == "failed 3 times: ValueError: no such column"
    assert dead.headers["Trove-Dead-Subject"] == lane.subject
    assert dead.headers["Trove-Dead-Consumer"] == lane.durable
    assert dead.headers["Trove-Dead-Msg-Id"] == "m-1"
    assert dead.headers["Trove-Event-Type"] == "Test"
    # The log line names the message as `trove dead` and `nats stream get` take it.
    (said,) = [r for r in caplog.records if r.getMessage() == "parked a message"]
    named = {k: getattr(said, k, None) for k in ("stream", "stream_seq", "event_id", "event_type")}
    assert named == {
        "stream": lane.stream,
        "stream_seq": dead.headers["Trove-Dead-Stream-Seq"],
        "event_id": "m-1",
        "event_type": "Test",
    }


async def test_a_message_redelivered_after_its_holders_died_is_not_parked_on_a_failure(
    bus: Bus, lane: Lane
) -> None:
    await bus.js.publish(lane.subject, b"work")
    dying = await bus.js.pull_subscribe_bind(lane.durable, stream=lane.stream)
    for _ in range(3):  # three pods took it and died before acking (ack_wait 0.5 s)
        await dying.fetch(1, timeout=5)
    await dying.unsubscribe()
    script = Script([raising(RuntimeError("flaky"))])

    async with running(
        Consumer(
            bus=bus,
            stream=lane.stream,
            durable=lane.durable,
            handler=script,
            max_failures=2,
            **FAST,
        )
    ):
        await settled(bus, lane)

    assert script.deliveries[0] >= 4
    assert len(script.handled) == 1
    assert await parked(bus, lane) == 0


async def test_a_malformed_event_is_parked_at_once(bus: Bus, lane: Lane) -> None:
    async def handler(msg: Msg) -> None:
        decode_event(msg.data)

    await bus.js.publish(lane.subject, b"{not json")

    async with running(
        Consumer(bus=bus, stream=lane.stream, durable=lane.durable, handler=handler, **FAST)
    ):
        await settled(bus, lane)

    dead = await bus.js.get_last_msg(DEAD_STREAM, lane.dead_subject)
    assert dead.headers is not None
    assert dead.headers["Trove-Dead-Reason"].startswith("malformed: not JSON")


async def test_a_batch_meeting_a_broker_error_is_handed_back_whole_and_not_counted(
    bus: Bus, lane: Lane
) -> None:
    batches: list[int] = []
    singles: list[Msg] = []

    async def batch_handler(msgs: Any) -> None:
        batches.append(len(msgs))
        if len(batches) <= 6:
            await bus.nc.request(f"nobody.{lane.durable}", b"x", timeout=1)

    async def handler(msg: Msg) -> None:
        singles.append(msg)

    for i in range(3):
        await bus.js.publish(lane.subject, f"work {i}".encode())

    async with running(
        BatchConsumer(
            bus=bus,
            stream=lane.stream,
            durable=lane.durable,
            batch_handler=batch_handler,
            handler=handler,
            max_failures=2,
            **FAST,
        )
    ):
        await settled(bus, lane)

    assert len(batches) >= 7
    assert singles == []  # never split up, so nothing was counted against a message
    assert await parked(bus, lane) == 0


async def test_a_batch_consumer_holds_its_bytes_not_only_its_count(bus: Bus, lane: Lane) -> None:
    # A backlog of large events (pages of a thousand links): batches of 500 held every
    # one of them. Each batch keeps to its bytes (one event larger than that goes alone),
    # and the consumer asks the server for no more than two batches' worth, beside one
    # request's allowance for the largest message the server takes.
    size = bus.nc.max_payload // 4
    budget = 2 * size
    count = 24
    for i in range(count):
        await bus.js.publish(lane.subject, bytes([i]) * (3 * size if i == 7 else size))
    batches: list[int] = []
    held: list[int] = []

    async def batch_handler(msgs: Sequence[Msg]) -> None:
        batches.append(sum(len(msg.data) for msg in msgs))
        info = await bus.js.consumer_info(lane.stream, lane.durable)
        held.append(info.num_ack_pending)

    consumer = BatchConsumer(
        bus=bus,
        stream=lane.stream,
        durable=lane.durable,
        batch_handler=batch_handler,
        handler=lambda msg: batch_handler([msg]),
        batch_size=500,
        batch_max_bytes=budget,
        **FAST,
    )
    async with running(consumer):
        await settled(bus, lane)
    assert sum(batches) == (count + 2) * size
    assert all(total <= budget for total in batches if total != 3 * size), batches
    assert 3 * size in batches  # alone, whatever the budget
    # Two batches of two, and a request's allowance: the largest message (4 of these).
    assert max(held) <= 2 * 2 + 4 + 1, held


async def test_a_pull_that_reached_its_bytes_was_served_and_the_next_is_asked_at_once(
    bus: Bus, lane: Lane
) -> None:
    size = bus.nc.max_payload // 2
    for i in range(3):
        await bus.js.publish(lane.subject, bytes([i]) * size)
    pulls = Pulls(bus.nc, lane.stream, lane.durable, expires=30.0, grace=30.0)

    async def state() -> tuple[float | None, int]:
        return pulls.next_deadline(), len(pulls)

    await pulls.start()
    try:
        await pulls.ask(10, max_bytes=1)  # asks for the largest message's room at least
        # Ended, with two: the third did not fit.
        await eventually(state, until=lambda now: now == (None, 2), timeout=10, what="the end")
        assert pulls.refused_for() == 0.0
        await pulls.ask(10, max_bytes=1)  # not held back as after a refusal
        await eventually(state, until=lambda now: now[1] == 3, timeout=10, what="the third")
    finally:
        await pulls.close()


async def test_a_pull_with_bytes_asked_that_its_count_ended_is_followed_at_once(
    bus: Bus, lane: Lane
) -> None:
    # Given bytes, nats-server ends a request its count filled with a status of its own
    # (409 "Batch Completed"), after the last message: the end of a served request,
    # which held every next one back for the grace (a recorder at a seventh of its pace).
    for i in range(20):
        await bus.js.publish(lane.subject, bytes([i]) * 100)
    woken = 0

    def wake() -> None:
        nonlocal woken
        woken += 1

    pulls = Pulls(bus.nc, lane.stream, lane.durable, expires=30.0, grace=30.0, wake=wake)
    await pulls.start()
    try:
        await pulls.ask(10, max_bytes=1 << 20)
        # Its ten messages, and the status after them, each woke the consumer.
        await eventually(reading(lambda: woken), until=lambda n: n == 11, timeout=10)
        assert len(pulls.take()) == 10
        assert pulls.refused_for() == 0.0
        await pulls.ask(10, max_bytes=1 << 20)
        await eventually(reading(lambda: len(pulls)), until=lambda n: n == 10, timeout=10)
    finally:
        await pulls.close()


async def test_a_batch_with_a_poison_message_parks_it_alone_after_its_failures(
    bus: Bus, lane: Lane
) -> None:
    handled: list[bytes] = []
    poison_calls = 0

    async def batch_handler(msgs: Any) -> None:
        if any(m.data == b"poison" for m in msgs):
            raise ValueError("bad batch")
        handled.extend(m.data for m in msgs)

    async def handler(msg: Msg) -> None:
        nonlocal poison_calls
        if msg.data == b"poison":
            poison_calls += 1
            raise ValueError("bad row")
        handled.append(msg.data)

    for body in (b"a", b"poison", b"b"):
        await bus.js.publish(lane.subject, body)

    async with running(
        BatchConsumer(
            bus=bus,
            stream=lane.stream,
            durable=lane.durable,
            batch_handler=batch_handler,
            handler=handler,
            max_failures=3,
            **FAST,
        )
    ):
        await settled(bus, lane)

    assert sorted(handled) == [b"a", b"b"]
    assert poison_calls == 3
    assert await parked(bus, lane) == 1


async def test_an_event_from_a_newer_producer_is_handled_not_parked(bus: Bus, lane: Lane) -> None:
    event = PageDiscovered(
        url="https://a.example/",
        domain="a.example",
        scope=Scope(value="a.example"),
        provenance=Provenance(kind="seed"),
    )
    wire = json.loads(event.to_wire())
    wire |= {"version": PageDiscovered.VERSION + 1, "language_hint": "pt"}
    wire["scope"]["subdomains"] = True
    decoded: list[Any] = []

    async def handler(msg: Msg) -> None:
        decoded.append(decode_event(msg.data))

    await bus.js.publish(lane.subject, json.dumps(wire).encode())

    async with running(
        Consumer(bus=bus, stream=lane.stream, durable=lane.durable, handler=handler, **FAST)
    ):
        await settled(bus, lane)

    assert decoded == [event]
    assert await parked(bus, lane) == 0


def test_failure_counts_forget_the_oldest_beyond_their_bound() -> None:
    counts = FailureCounts(limit=3)
    for seq in (1, 2, 3):
        counts.add(seq)
    assert counts.add(1) == 2  # 1 is now the newest
    counts.add(4)  # 2 goes

    assert len(counts) == 3
    assert counts.add(2) == 1  # forgotten, counted afresh (and 3 goes)
    counts.forget(1)
    assert len(counts) == 2
    assert counts.add(4) == 2


@pytest.mark.parametrize(
    ("exc", "trouble"),
    [
        (TimeoutError(), True),
        (ServiceUnavailableError(), True),
        (APIError(code=503, err_code=10008), True),
        (APIError(code=400, err_code=10071), False),  # wrong last sequence: a real answer
        (ValueError("bad"), False),
    ],
)
def test_broker_trouble_tells_an_unavailable_broker_from_a_bad_message(
    exc: BaseException, trouble: bool
) -> None:
    assert broker_trouble(exc) is trouble


async def test_confirmed_acks_are_taken_by_the_server_once_each(bus: Bus, lane: Lane) -> None:
    script = Script([], then=None)
    for n in range(5):
        await bus.js.publish(lane.subject, f"work {n}".encode())

    async with running(
        Consumer(
            bus=bus,
            stream=lane.stream,
            durable=lane.durable,
            handler=script,
            confirm_acks=5.0,
            **FAST,
        )
    ):
        await settled(bus, lane)

    assert sorted(m.data for m in script.handled) == [f"work {n}".encode() for n in range(5)]
    assert script.deliveries == [1] * 5


async def test_work_in_hand_starts_highest_priority_first(bus: Bus, lane: Lane) -> None:
    # One slot, held busy by the first message while the rest are pulled into the hand:
    # the priority-50 message is handled next, then by the size of their host's queue
    # (Trove-Siblings); the rest keep their order.
    release = asyncio.Event()
    order: list[str] = []
    deliveries: list[int] = []

    async def handler(msg: Msg) -> None:
        order.append(msg.data.decode())
        deliveries.append(msg.metadata.num_delivered)
        while len(order) == 1 and not release.is_set():
            await msg.in_progress()  # the one in flight keeps itself, as a fetch would
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(release.wait(), timeout=0.1)

    async def handled() -> list[str]:
        return list(order)

    await bus.js.publish(lane.subject, b"first")
    consumer = Consumer(
        bus=bus,
        stream=lane.stream,
        durable=lane.durable,
        handler=handler,
        concurrency=1,
        prefetch=8,
        hold_refresh=0.1,  # the lane's ack_wait is 0.5 s: held messages must stay ours
        **FAST,
    )
    async with running(consumer):
        await eventually(handled, until=lambda o: o == ["first"], timeout=10, what="first started")
        for i in range(4):
            await bus.js.publish(lane.subject, f"low {i}".encode())
        await bus.js.publish(lane.subject, b"urgent", headers={"Trove-Priority": "50"})
        await bus.js.publish(lane.subject, b"below", headers={"Trove-Priority": "-5"})
        # A page of a host with a long queue goes before the other work of its priority.
        await bus.js.publish(lane.subject, b"pair", headers={"Trove-Siblings": "2"})
        await bus.js.publish(lane.subject, b"big site", headers={"Trove-Siblings": "21"})
        info = await eventually(
            lambda: bus.js.consumer_info(lane.stream, lane.durable),
            # Both counts: num_pending alone can read 0 right after a publish, before
            # the server counts the new messages (see ``outstanding``).
            until=lambda i: i.num_pending == 0 and i.num_ack_pending == 9,
            timeout=10,
            what="all eight pulled into the hand, the first still held",
        )
        assert info.num_redelivered == 0
        # The duration under test: held past the lane's ack_wait (0.5 s), they stay ours.
        await asyncio.sleep(0.6)
        release.set()
        await settled(bus, lane)
    assert order == [
        "first", "urgent", "big site", "pair", "low 0", "low 1", "low 2", "low 3", "below"
    ]  # fmt: skip
    assert deliveries == [1] * 9


async def test_an_event_with_a_priority_says_so_in_a_header() -> None:
    def event(priority: int) -> PageDiscovered:
        return PageDiscovered(
            url="https://a.example/",
            domain="a.example",
            priority=priority,
            scope=Scope(),
            provenance=Provenance(kind="seed"),
        )

    assert event(7).headers()["Trove-Priority"] == "7"
    assert "Trove-Priority" not in event(0).headers()


@asynccontextmanager
async def pull_requests(bus: Bus, lane: Lane) -> AsyncIterator[list[float]]:
    """Every pull request the consumer sends to the server, seen on its API subject."""
    seen: list[float] = []

    async def count(msg: Msg) -> None:
        seen.append(asyncio.get_running_loop().time())

    sub = await bus.nc.subscribe(
        f"$JS.API.CONSUMER.MSG.NEXT.{lane.stream}.{lane.durable}", cb=count
    )
    try:
        yield seen
    finally:
        await sub.unsubscribe()


async def test_a_busy_consumer_waits_at_the_server_instead_of_polling(bus: Bus, lane: Lane) -> None:
    # Two of four slots held by handlers that wait, as a fetcher's tasks wait for a
    # host's slot: the loop must not ask the server again and again for the other two
    # meanwhile (there is no more work to get). Pulls expire
    # after 0.2 s here, so over 1.5 s of waiting it may ask about 8 times; a loop that
    # polled every 50 ms with two requests each would ask some 60 times.
    release = asyncio.Event()
    started: list[bytes] = []

    async def handler(msg: Msg) -> None:
        started.append(msg.data)
        await release.wait()

    for n in range(2):
        await bus.js.publish(lane.subject, f"work {n}".encode())
    consumer = Consumer(
        bus=bus,
        stream=lane.stream,
        durable=lane.durable,
        handler=handler,
        concurrency=4,
        pull_expires=0.2,
        **FAST,
    )
    async with pull_requests(bus, lane) as requests, running(consumer):
        await eventually(
            lambda: _value(len(started)), until=lambda n: n == 2, timeout=10, what="both busy"
        )
        before = len(requests)
        # The duration under test: how often the loop asks while it waits.
        await asyncio.sleep(1.5)
        asked = len(requests) - before
        release.set()
        await settled(bus, lane)
    assert asked <= 1.5 / 0.2 + 2, f"{asked} pull requests in 1.5 s"


async def test_a_freed_slot_takes_waiting_work_at_once_however_long_pulls_wait(
    bus: Bus, lane: Lane
) -> None:
    # Pulls wait 30 s at the server: work published while the only slot is busy must
    # still start as soon as the slot frees, not when a pull expires.
    release = asyncio.Event()
    started: list[bytes] = []

    async def handler(msg: Msg) -> None:
        started.append(msg.data)
        if msg.data == b"first":
            await release.wait()

    await bus.js.publish(lane.subject, b"first")
    consumer = Consumer(
        bus=bus,
        stream=lane.stream,
        durable=lane.durable,
        handler=handler,
        concurrency=1,
        pull_expires=30.0,
        **FAST,
    )
    async with running(consumer):
        await eventually(lambda: _value(list(started)), until=lambda s: s == [b"first"], timeout=10)
        await bus.js.publish(lane.subject, b"second")
        release.set()
        await eventually(
            lambda: _value(list(started)),
            until=lambda s: s == [b"first", b"second"],
            timeout=5,
            what="the second started well before a pull expired",
        )
        await settled(bus, lane)


async def _value(value: Any) -> Any:
    return value


async def test_a_consumer_refused_by_the_server_does_not_ask_again_in_a_loop(
    bus: Bus, lane: Lane
) -> None:
    # The durable consumer is deleted under a running loop: every pull now ends at once
    # with a refusal. The loop must pause before each new request (``idle_wait``, 0.2 s
    # here), not ask again the moment it is refused: over 1.5 s, a handful of requests.
    consumer = Consumer(
        bus=bus,
        stream=lane.stream,
        durable=lane.durable,
        handler=Script([]),
        pull_expires=30.0,
        **FAST,
    )
    async with pull_requests(bus, lane) as requests, running(consumer):
        await eventually(lambda: _value(len(requests)), until=lambda n: n >= 1, timeout=10)
        await bus.js.delete_consumer(lane.stream, lane.durable)
        before = len(requests)
        # The duration under test: how often the loop asks while it is refused.
        await asyncio.sleep(1.5)
        asked = len(requests) - before
    assert 1 <= asked <= 1.5 / 0.2 + 2, f"{asked} pull requests in 1.5 s"


def test_work_in_hand_forgets_what_it_started() -> None:
    # A pod that starts every message as it comes never asks for the oldest: what the
    # hand remembers of the messages it held must go with them.
    held = _Held()
    for round_ in range(1000):
        held.push(cast(Msg, SimpleNamespace(headers={"Trove-Siblings": str(round_ % 3)})))
        held.pop()
    assert len(held) == 0
    assert not held._queue
    assert not held._since


@pytest.mark.parametrize("batched", [False, True], ids=["one at a time", "in batches"])
async def test_a_message_handled_past_ack_wait_is_not_handed_out_again(
    bus: Bus, lane: Lane, batched: bool
) -> None:
    # A page behind a slow robots.txt and slow redirect hops, a batch on a busy
    # database: handled for three times the lane's ack_wait (0.5 s), with slots free
    # to take a redelivery, each message is delivered once.
    deliveries: list[tuple[bytes, int]] = []

    async def handler(msg: Msg) -> None:
        deliveries.append((msg.data, msg.metadata.num_delivered))
        await asyncio.sleep(1.0)  # the duration under test: twice ack_wait

    for i in range(3):
        await bus.js.publish(lane.subject, f"slow {i}".encode())
    consumer = lane_consumer(
        bus, lane, handler, batched=batched, concurrency=6, hold_refresh=0.15, **FAST
    )
    async with running(consumer):
        await settled(bus, lane)
    assert sorted(deliveries) == [(f"slow {i}".encode(), 1) for i in range(3)]


async def test_a_server_that_stops_answering_without_closing_is_left_for_another(
    tmp_path: Path,
) -> None:
    # A node lost: the socket stays open, nothing answers. The pings notice it (at
    # nats-py's defaults, after 4 to 6 minutes); here at a tenth of a second apart.
    server = EmbeddedNats(NatsConfig(store_dir=tmp_path / "nats")).start()
    assert server.pid is not None
    test_bus = await Bus.connect(server.url, name="test-pings", ping_interval=0.1)
    try:

        async def connected() -> bool:
            return bool(test_bus.nc.is_connected)

        os.kill(server.pid, signal.SIGSTOP)
        try:
            await eventually(connected, until=lambda up: not up, timeout=10, what="noticed")
        finally:
            os.kill(server.pid, signal.SIGCONT)
    finally:
        await test_bus.close()
        server.stop()


async def test_pulls_ask_for_no_more_than_an_operator_allows(bus: Bus, lane: Lane) -> None:
    # `nats consumer edit --max-pull-batch 2`, which Trove's reconcile leaves in place:
    # every request for more is refused, and was asked again for ever.
    config = (await bus.js.consumer_info(lane.stream, lane.durable)).config.as_dict()
    edit = {"stream_name": lane.stream, "config": {**config, "max_batch": 2}}
    answer = await bus.nc.request(
        f"$JS.API.CONSUMER.DURABLE.CREATE.{lane.stream}.{lane.durable}", json.dumps(edit).encode()
    )
    assert json.loads(answer.data)["config"]["max_batch"] == 2
    for i in range(6):
        await bus.js.publish(lane.subject, f"work {i}".encode())
    script = Script(steps=[])
    async with running(
        Consumer(bus=bus, stream=lane.stream, durable=lane.durable, handler=script, **FAST)
    ):
        await settled(bus, lane)
    assert sorted(m.data for m in script.handled) == [f"work {i}".encode() for i in range(6)]


@pytest.mark.parametrize("batched", [False, True], ids=["one at a time", "in batches"])
async def test_a_consumer_whose_durable_is_deleted_ends_its_service(
    bus: Bus, lane: Lane, batched: bool
) -> None:
    # `nats consumer rm`: nothing serves its pulls any more, and the service looked
    # ready for ever. It ends, and its restart makes the durable again.
    script = Script(steps=[])
    consumer = lane_consumer(bus, lane, script, batched=batched, refusal_patience=1.0, **FAST)
    stop = asyncio.Event()
    run = asyncio.create_task(consumer.run(stop))
    try:
        await bus.js.publish(lane.subject, b"before")
        await settled(bus, lane)
        await bus.js.delete_consumer(lane.stream, lane.durable)
        with pytest.raises(TopologyError, match=f"consumer {lane.durable} .* is gone"):
            await asyncio.wait_for(run, timeout=15)
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(run, timeout=10)


@pytest.mark.parametrize("batched", [False, True], ids=["one at a time", "in batches"])
async def test_a_redrive_is_handled_by_the_consumer_that_parked_it_alone(
    bus: Bus, lane: Lane, batched: bool
) -> None:
    # The other consumers of the subject handled the message when it first came: a page
    # the recorder parked, re-driven, is not fetched again.
    handled: list[bytes] = []

    async def handler(msg: Msg) -> None:
        handled.append(msg.data)

    await bus.js.publish(lane.subject, b"first time")
    await bus.js.publish(lane.subject, b"for another", headers={REDRIVEN_FOR: "recorder"})
    await bus.js.publish(lane.subject, b"for this one", headers={REDRIVEN_FOR: lane.durable})
    consumer = lane_consumer(bus, lane, handler, batched=batched, **FAST)
    async with running(consumer):
        await settled(bus, lane)
    assert sorted(handled) == [b"first time", b"for this one"]


async def test_a_message_answered_while_its_batch_goes_on_is_not_marked_again() -> None:
    # A batch's one-by-one fallback naks a message and handles the next: a mark sent
    # to the nak'd one would restart its delay at ack_wait.
    marked: list[str] = []

    def message(name: str, *, acked: bool) -> Msg:
        async def in_progress() -> None:
            marked.append(name)

        return cast(Msg, SimpleNamespace(is_acked=acked, in_progress=in_progress))

    marks = _Marks()
    answered, handled = message("nak'd", acked=True), message("handled", acked=False)
    marks.add(answered, time.monotonic() - 10)
    marks.add(handled, time.monotonic() - 10)
    await marks.refresh(1.0)
    assert marked == ["handled"]
    assert marks.next_look() is not None  # the handled one is still watched


async def test_a_stopping_consumer_keeps_marking_what_it_finishes(bus: Bus, lane: Lane) -> None:
    # A page still behind its robots.txt when the pod stops: handled for three times
    # the lane's ack_wait after the stop, it is not handed to another pod meanwhile.
    started = asyncio.Event()

    async def handler(msg: Msg) -> None:
        started.set()
        await asyncio.sleep(1.5)  # the duration under test: longer than ack_wait

    await bus.js.publish(lane.subject, b"slow")
    consumer = lane_consumer(bus, lane, handler, batched=False, hold_refresh=0.15)
    stop = asyncio.Event()
    run = asyncio.create_task(consumer.run(stop))
    other = await bus.js.pull_subscribe_bind(lane.durable, stream=lane.stream)
    try:
        await asyncio.wait_for(started.wait(), timeout=10)
        stop.set()
        with pytest.raises(nats.errors.TimeoutError):
            await other.fetch(1, timeout=1.2)  # another pod asking meanwhile
        await asyncio.wait_for(run, timeout=10)
    finally:
        await other.unsubscribe()
    await settled(bus, lane)


async def test_a_stopping_consumer_hands_back_what_it_holds_before_it_waits(
    bus: Bus, lane: Lane
) -> None:
    # Pulled work it will never start goes back at once, not after the wait for what
    # runs: held past ack_wait it would go to another pod, and a nak after that would
    # hand it out a second time.
    started = asyncio.Event()

    async def handler(msg: Msg) -> None:
        if msg.data == b"slow":
            started.set()
            await asyncio.sleep(2.0)  # the duration under test: the drain's length

    await bus.js.publish(lane.subject, b"slow")
    for i in range(3):
        await bus.js.publish(lane.subject, f"held {i}".encode())
    consumer = lane_consumer(bus, lane, handler, batched=False, prefetch=4, hold_refresh=0.1)
    stop = asyncio.Event()
    run = asyncio.create_task(consumer.run(stop))
    other = await bus.js.pull_subscribe_bind(lane.durable, stream=lane.stream)
    try:
        await asyncio.wait_for(started.wait(), timeout=10)
        await eventually(
            lambda: bus.js.consumer_info(lane.stream, lane.durable),
            until=lambda i: i.num_pending == 0 and i.num_ack_pending == 4,
            timeout=10,
            what="the rest held",
        )
        stop.set()
        # Sooner than ack_wait (0.5 s) after the last mark (0.1 s apart, so 0.4 s at the
        # soonest): handed back, each nak answered as the loaded machine gets to it.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 0.35
        taken: list[Msg] = []
        while len(taken) < 3 and (left := deadline - loop.time()) > 0:
            with contextlib.suppress(nats.errors.TimeoutError):
                taken += await other.fetch(3 - len(taken), timeout=left)
        assert sorted(m.data for m in taken) == [f"held {i}".encode() for i in range(3)]
        for msg in taken:
            await msg.ack()
        await asyncio.wait_for(run, timeout=10)
    finally:
        await other.unsubscribe()
    await settled(bus, lane)


@pytest.mark.parametrize("batched", [False, True], ids=["one at a time", "in batches"])
async def test_a_message_with_a_header_named_status_is_handled(
    bus: Bus, lane: Lane, batched: bool
) -> None:
    # `nats pub ... -H 'Status: new'`: nats-py files a stored message's own Status
    # header under the key it gives a server's status line. Taken for one, the message
    # was dropped at every delivery, never handled nor parked, and a consumer allowed
    # one message in flight waited on it for ever.
    handled: list[bytes] = []

    async def handler(msg: Msg) -> None:
        handled.append(msg.data)

    await bus.js.publish(lane.subject, b"with a status", headers={"Status": "new"})
    await bus.js.publish(lane.subject, b"after it")
    consumer = lane_consumer(bus, lane, handler, batched=batched, **FAST)
    async with running(consumer):
        await settled(bus, lane)
    assert sorted(handled) == [b"after it", b"with a status"]
    assert await parked(bus, lane) == 0


async def test_batches_handed_back_pause_the_consumer_instead_of_cycling_its_window(
    bus: Bus, lane: Lane
) -> None:
    # The recorder while Postgres refuses: every batch comes back `Retry` (2 s). Were
    # the next batch pulled at once, it would be decoded and handed back too, through
    # the whole ack window, and all of it again every 2 s: a hot loop for the whole
    # outage. The consumer waits out the delay, doubled while batches keep coming back
    # (0.1 s here, up to 0.8 s): over 3 s of refusals, a handful of batches of 10.
    refusing = True
    delivered: list[int] = []
    handled: list[bytes] = []

    async def batch_handler(msgs: Sequence[Msg]) -> None:
        delivered.append(len(msgs))
        if refusing:
            raise Retry("database unavailable", delay=0.1)
        handled.extend(m.data for m in msgs)

    async def handler(msg: Msg) -> None:
        raise AssertionError("a batch handed back is never split up")

    for i in range(200):
        await bus.js.publish(lane.subject, f"event {i}".encode())
    consumer = BatchConsumer(
        bus=bus,
        stream=lane.stream,
        durable=lane.durable,
        batch_handler=batch_handler,
        handler=handler,
        batch_size=10,
        concurrency=2,
        hold_refresh=0.15,
        max_retry_pause=0.8,
        **FAST,
    )
    async with running(consumer):
        await eventually(lambda: _value(len(delivered)), until=bool, timeout=10, what="a batch")
        await asyncio.sleep(3.0)  # the duration under test: the database away
        refused = sum(delivered)
        refusing = False
        await settled(bus, lane)
    # Waits of 0.1, 0.2, 0.4, 0.8, 0.8, 0.8 s: 7 rounds of two batches at most.
    assert refused <= 7 * 2 * 10, f"{refused} messages handed to a refusing database in 3 s"
    assert sorted(handled) == sorted(f"event {i}".encode() for i in range(200))
    assert await parked(bus, lane) == 0


async def test_a_batch_split_up_hands_back_the_rest_at_the_first_retry(
    bus: Bus, lane: Lane
) -> None:
    # A batch fails for one bad event and is split up, and the database goes away
    # meanwhile: each of the rest would be tried alone, each a transaction that fails
    # the same way. The first `Retry` hands the rest back with it.
    refusing = True
    splits = 0
    singles: list[bytes] = []
    handled: list[bytes] = []

    async def batch_handler(msgs: Sequence[Msg]) -> None:
        nonlocal splits
        if refusing:
            splits += 1
            raise ValueError("one bad event")
        handled.extend(m.data for m in msgs)

    async def handler(msg: Msg) -> None:
        singles.append(msg.data)
        if refusing:
            raise Retry("database unavailable", delay=0.05)
        handled.append(msg.data)

    for i in range(10):
        await bus.js.publish(lane.subject, f"event {i}".encode())
    consumer = BatchConsumer(
        bus=bus,
        stream=lane.stream,
        durable=lane.durable,
        batch_handler=batch_handler,
        handler=handler,
        batch_size=10,
        concurrency=1,
        hold_refresh=0.15,
        max_retry_pause=0.2,
        **FAST,
    )
    async with running(consumer):
        await eventually(lambda: _value(len(singles)), until=bool, timeout=10, what="a split")
        refusing = False
        await settled(bus, lane)
    assert singles[0] == b"event 0"
    assert len(singles) == splits, f"{len(singles)} events tried alone in {splits} splits"
    assert sorted(handled) == sorted(f"event {i}".encode() for i in range(10))
    assert await parked(bus, lane) == 0


@pytest.fixture
async def full_stream(bus: Bus, lane: Lane) -> AsyncIterator[str]:
    """A subject whose stream is at its limit and refuses every write with a 503, as a
    full store does, while the lane's pulls are still served."""
    name, subject = f"{lane.stream}_FULL", f"{lane.subject}.full"
    await bus.js.add_stream(
        StreamConfig(
            name=name,
            subjects=[subject],
            storage=StorageType.MEMORY,
            max_msgs=1,
            discard=DiscardPolicy.NEW,
        )
    )
    await bus.js.publish(subject, b"the one it holds")
    try:
        yield subject
    finally:
        await bus.js.delete_stream(name)


async def test_broker_trouble_pauses_a_consumer_instead_of_cycling_its_window(
    bus: Bus, lane: Lane, full_stream: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A store that refuses every write still serves every pull: were the next messages
    # pulled and run the moment one came back, each handler's write would be refused,
    # the whole ack window run against the server again each `broker_retry_delay`, with
    # a warning each. The consumer pauses instead, starting and pulling nothing for the
    # delay, doubled while the trouble lasts (0.5 s, then 1 s here). The window is the
    # server's count of the first message's deliveries: by its third, a consumer that
    # pauses has run a few rounds of 4; one that does not, the 200 messages over and over.
    refusing = True
    refused = 0
    first_delivered = 0
    handled: list[bytes] = []

    async def handler(msg: Msg) -> None:
        nonlocal refused, first_delivered
        if refusing:
            refused += 1
            if msg.metadata.sequence.stream == 1:
                first_delivered = msg.metadata.num_delivered
            await bus.js.publish(full_stream, msg.data)  # refused: 503
        handled.append(msg.data)

    for i in range(200):
        await bus.js.publish(lane.subject, f"work {i}".encode())
    consumer = Consumer(
        bus=bus,
        stream=lane.stream,
        durable=lane.durable,
        handler=handler,
        concurrency=4,
        failure_backoff=0.01,
        broker_retry_delay=0.5,
        max_retry_pause=1.0,
        idle_wait=0.2,
    )
    with caplog.at_level(logging.WARNING, logger="trove_schema.bus"):
        async with running(consumer):
            await eventually(
                lambda: _value(first_delivered),
                until=lambda n: n >= 3,
                timeout=30,
                what="the first message delivered three times",
            )
            during = refused
            # The consumer's own: a connection's "nats: ..." lines may be another test's
            # bus in this process reconnecting to a server it stopped.
            warnings = [
                r.getMessage()
                for r in caplog.records
                if r.name == "trove_schema.bus" and not r.getMessage().startswith("nats: ")
            ]
            refusing = False
            await settled(bus, lane)
    # Rounds of 4 at 0, 0.5, 1.5, 2.5 s...: the first message is among the four of
    # every other round at least, and each pause is said once, not each message (a
    # round's four failures can come apart on a loaded machine, each then a pause).
    assert during <= 8 * 4, f"{during} messages run against a refusing store"
    assert len(warnings) <= max(8, during // 2), (during, warnings[:10])
    assert sorted(handled) == sorted(f"work {i}".encode() for i in range(200))
    assert await parked(bus, lane) == 0


async def test_a_message_too_large_with_its_headers_is_refused_before_it_is_sent(
    bus: Bus, lane: Lane
) -> None:
    # nats-py weighs the payload alone; the server weighs headers and payload, and
    # answers a larger message by closing the connection. It must never be sent.
    limit = bus.nc.max_payload
    headers = {"Trove-Chain": "h" * 512}
    with pytest.raises(MessageTooLarge, match=f"max_payload {limit}"):
        await bus.js.publish(lane.subject, b"x" * (limit - 256), headers=headers)

    ack = await bus.js.publish(lane.subject, b"x" * (limit - 1024), headers=headers)
    assert ack.seq == 1
    assert bus.nc.is_connected
    assert not bus.closed.is_set()


async def test_a_handler_whose_message_is_too_large_is_parked_and_the_connection_kept(
    bus: Bus, lane: Lane
) -> None:
    # A handler whose output is too large for the server fails as any bad message
    # does, counted and parked; the service's connection, which every other message
    # needs, is kept.
    limit = bus.nc.max_payload

    async def handler(msg: Msg) -> None:
        await bus.js.publish(
            f"{lane.subject}.out", b"x" * (limit - 256), headers={"Trove-Chain": "h" * 512}
        )

    await bus.js.publish(lane.subject, b"work")
    consumer = Consumer(
        bus=bus, stream=lane.stream, durable=lane.durable, handler=handler, max_failures=2, **FAST
    )
    async with running(consumer):
        await settled(bus, lane)
    assert await parked(bus, lane) == 1
    dead = await bus.js.get_last_msg(DEAD_STREAM, lane.dead_subject)
    assert dead.headers is not None
    assert "MessageTooLarge" in dead.headers["Trove-Dead-Reason"]
    assert bus.nc.is_connected
    assert not bus.closed.is_set()


async def test_work_in_hand_at_a_pause_is_handed_back_not_stranded_by_a_reconnect(
    tmp_path: Path,
) -> None:
    # A pod holds work it cannot start yet (a free slot's worth, or its prefetch) when
    # broker trouble pauses it. Held through the pause, a reconnect meanwhile (the
    # server restarted once its volume was grown) would leave that work to JetStream's
    # redelivery, a whole ack_wait away (90 s for the fetcher). Handed back to the
    # stream, due when the pause ends, it is started soon after the pause.
    config = NatsConfig(store_dir=tmp_path / "nats", port=free_port("127.0.0.1"))
    server = EmbeddedNats(config).start()
    own = await Bus.connect(server.url, name="test-pause")
    lane = Lane(stream="TEST_PAUSE", subject="test.pause", durable="test-pause")
    await own.js.add_stream(StreamConfig(name=lane.stream, subjects=[lane.subject]))
    await own.js.add_consumer(
        lane.stream,
        ConsumerConfig(
            durable_name=lane.durable, ack_policy=AckPolicy.EXPLICIT, ack_wait=60.0, max_deliver=-1
        ),
    )
    started: list[bytes] = []
    handled: list[bytes] = []

    async def handler(msg: Msg) -> None:
        started.append(msg.data)
        if started == [b"first"]:
            raise ServiceUnavailableError()  # the store full
        handled.append(msg.data)

    await own.js.publish(lane.subject, b"first")
    await own.js.publish(lane.subject, b"held")
    consumer = Consumer(
        bus=own,
        stream=lane.stream,
        durable=lane.durable,
        handler=handler,
        concurrency=1,
        prefetch=1,
        broker_retry_delay=3.0,
        max_retry_pause=3.0,
        pull_expires=1.0,
        idle_wait=0.2,
    )
    reconnects = own.nc.stats["reconnects"]

    async def reconnected() -> bool:
        return bool(own.nc.is_connected and own.nc.stats["reconnects"] > reconnects)

    try:
        async with running(consumer):
            await eventually(lambda: _value(list(started)), until=bool, timeout=10)
            server.stop()
            server = EmbeddedNats(config).start()
            await eventually(reconnected, until=bool, timeout=20, interval=0.05)
            await eventually(
                lambda: _value(sorted(handled)),
                until=lambda h: h == [b"first", b"held"],
                timeout=20,
                what="both handled well before ack_wait",
            )
    finally:
        await own.close()
        server.stop()
    assert started.count(b"held") == 1


async def test_a_message_whose_park_is_refused_comes_back_later_each_time(
    bus: Bus, lane: Lane, caplog: pytest.LogCaptureFixture
) -> None:
    # The dead-letter stream at an operator's limit refuses every park (discard new):
    # the poison message is handed back, and handled again ever later, not every 2 s.
    info = await bus.js.stream_info(DEAD_STREAM)
    await bus.js.update_stream(dataclasses.replace(info.config, max_msgs=1))
    try:
        await bus.js.publish(f"{DEAD_PREFIX}.someone-else", b"parked before")
        await bus.js.publish(lane.subject, b"poison")
        script = Script([], then=raising(ValueError("no such column")))
        with caplog.at_level(logging.WARNING, logger="trove_schema.bus"):
            async with running(
                Consumer(
                    bus=bus,
                    stream=lane.stream,
                    durable=lane.durable,
                    handler=script,
                    max_failures=1,
                    failure_backoff=0.05,
                    broker_retry_delay=0.01,
                    idle_wait=0.2,
                )
            ):

                async def refusals() -> list[float]:
                    return [
                        float(m) for m in re.findall(r"handing it back for ([0-9.]+)s", caplog.text)
                    ]

                delays = await eventually(
                    refusals, until=lambda d: len(d) >= 3, timeout=20, what="three refusals"
                )
    finally:
        await bus.js.update_stream(dataclasses.replace(info.config, max_msgs=-1))
    assert delays[:3] == sorted(set(delays[:3])), delays  # each later than the one before
    assert await parked(bus, lane) == 0


async def test_an_accounts_jetstream_limit_reached_is_the_brokers_trouble(tmp_path: Path) -> None:
    # An account's `max_file` reached answers a publish 400 with err_code 10002, not the
    # 503 of a server's store full: read as the message's fault, every write of a crawl
    # whose account filled up was counted and its message parked.
    port = free_port("127.0.0.1")
    conf = tmp_path / "account.conf"
    conf.write_text(
        f"listen: 127.0.0.1:{port}\n"
        f'jetstream {{ store_dir: "{tmp_path / "js"}" }}\n'
        "accounts { TENANT { jetstream { max_file: 64KB, max_mem: 1MB }\n"
        "  users: [{ user: tenant, password: tenant }] } }\n"
    )
    server = subprocess.Popen(
        [str(nats_server_binary()), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        nc = await eventually(
            lambda: _connected(f"nats://tenant:tenant@127.0.0.1:{port}"),
            until=lambda c: c is not None,
            timeout=20,
            what="the tenant's server",
        )
        assert nc is not None
        try:
            js = nc.jetstream()
            await js.add_stream(StreamConfig(name="FULL", subjects=["full.>"]))
            with pytest.raises(APIError) as refused:
                await _fill(js)
        finally:
            await nc.close()
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert refused.value.err_code == 10002, refused.value
    assert broker_trouble(refused.value)


async def _fill(js: JetStreamContext) -> None:
    for _ in range(100):  # 400 KB into an account that may store 64 KB
        await js.publish("full.x", b"x" * 4096)


async def _connected(url: str) -> NatsClient | None:
    try:
        return await nats.connect(url, allow_reconnect=False, connect_timeout=1)
    except Exception:
        return None


async def test_a_schedule_due_before_the_year_1000_is_taken_and_fires_at_once(bus: Bus) -> None:
    # Its time written with a year of three digits, nats-server refused it (10189,
    # "pattern is invalid"), and the outbox's pass stopped there at every look. Any time
    # past is "at once" to the broker.
    event = PageDiscovered(
        url="https://a.example/",
        domain="a.example",
        scope=Scope(value="a.example"),
        provenance=Provenance(kind="seed"),
    )
    target = "trove.events.tests.scheduled"
    await bus.publish_at(event, datetime(999, 6, 1, tzinfo=UTC), subject=target)

    async def fired() -> bytes | None:
        try:
            return (await bus.js.get_last_msg(EVENTS_STREAM, target)).data
        except NotFoundError:
            return None

    data = await eventually(fired, until=lambda d: d is not None, timeout=10)
    assert data is not None
    assert decode_event(data).id == event.id
