"""A stopping consumer on a real nats-server: what was delivered to it goes to another
consumer of its durable at once, and a batch that never ends does not hold its stop."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import nats.errors
import pytest
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig

from tests.conftest import StackUrls, eventually
from tests.schema.test_bus import Lane, settled
from trove_schema.bus import BatchConsumer, Bus, Consumer

pytestmark = pytest.mark.usefixtures("clean")

#: Long enough that a message back within ``PROMPTLY`` was handed back, not expired.
ACK_WAIT = 60.0
PROMPTLY = 5.0


@pytest.fixture
async def lane(bus: Bus) -> AsyncIterator[Lane]:
    tag = uuid.uuid4().hex[:10]
    made = Lane(stream=f"TEST_STOP_{tag}", subject=f"test.stop.{tag}", durable=f"test-{tag}")
    await bus.js.add_stream(
        StreamConfig(name=made.stream, subjects=[made.subject], storage=StorageType.MEMORY)
    )
    await bus.js.add_consumer(
        made.stream,
        ConsumerConfig(
            durable_name=made.durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ACK_WAIT,
            max_deliver=-1,
        ),
    )
    try:
        yield made
    finally:
        await bus.js.delete_stream(made.stream)


async def taken_by_another(bus: Bus, lane: Lane, n: int) -> list[bytes]:
    """What another consumer of the durable is given within ``PROMPTLY``, acked."""
    other = await bus.js.pull_subscribe_bind(lane.durable, stream=lane.stream)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PROMPTLY
    taken: list[Msg] = []
    try:
        while len(taken) < n and (left := deadline - loop.time()) > 0:
            with contextlib.suppress(nats.errors.TimeoutError):
                taken += await other.fetch(n - len(taken), timeout=left)
        for msg in taken:
            await msg.ack()
    finally:
        await other.unsubscribe()
    return sorted(msg.data for msg in taken)


def delivered_while_busy(url: str, lane: Lane, payloads: Sequence[bytes]) -> None:
    """Publish ``payloads`` from a client of its own, in a thread, and return once the
    server has delivered them all: the calling event loop, blocked meanwhile as by a
    page being parsed, has them in its socket, not yet read."""

    async def publish() -> None:
        publisher = await Bus.connect(url, name="trove-tests-publisher")
        try:
            for payload in payloads:
                await publisher.js.publish(lane.subject, payload)
            await eventually(
                lambda: publisher.js.consumer_info(lane.stream, lane.durable),
                until=lambda info: info.num_ack_pending == len(payloads),
                timeout=10,
                interval=0.05,
                what="all delivered",
            )
        finally:
            await publisher.close()

    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, publish()).result(timeout=30)


async def test_what_was_delivered_to_a_stopping_consumer_goes_to_another_at_once(
    bus: Bus, lane: Lane, stack: StackUrls
) -> None:
    # A pod scaled down as work comes due: deliveries read from the socket after the
    # stop were dropped with the subscription, and waited out ack_wait (90 s for the
    # fetcher; for discovery's follows, one message in flight, every command waited).
    handled: list[bytes] = []

    async def handler(msg: Msg) -> None:
        handled.append(msg.data)

    consumer = Consumer(
        bus=bus, stream=lane.stream, durable=lane.durable, handler=handler, concurrency=4
    )
    stop = asyncio.Event()
    run = asyncio.create_task(consumer.run(stop))
    await eventually(
        lambda: bus.js.consumer_info(lane.stream, lane.durable),
        until=lambda info: info.num_waiting == 1,
        timeout=10,
        what="a pull request open",
    )
    late = [f"late {i}".encode() for i in range(3)]
    delivered_while_busy(stack.nats_url, lane, late)
    stop.set()
    await asyncio.wait_for(run, timeout=10)

    assert handled == []
    assert await taken_by_another(bus, lane, len(late)) == late
    await settled(bus, lane)


async def test_a_batch_that_never_ends_is_handed_back_within_the_drain_timeout(
    bus: Bus, lane: Lane
) -> None:
    # A recorder whose database went away without closing its connections: its batch
    # never ends, and the stop waited for it until SIGKILL, marking its messages in
    # progress meanwhile so that no other pod had them.
    begun: list[bytes] = []

    async def stuck(msgs: Sequence[Msg]) -> None:
        begun.extend(msg.data for msg in msgs)
        await asyncio.Event().wait()

    async def one(msg: Msg) -> None:
        raise AssertionError("a batch that never ends is not split")

    payloads = [b"first", b"second"]
    for payload in payloads:
        await bus.js.publish(lane.subject, payload)
    consumer = BatchConsumer(
        bus=bus,
        stream=lane.stream,
        durable=lane.durable,
        batch_handler=stuck,
        handler=one,
        hold_refresh=0.2,
        idle_wait=0.2,
        drain_timeout=0.5,
    )
    stop = asyncio.Event()
    run = asyncio.create_task(consumer.run(stop))

    async def started() -> list[bytes]:
        return sorted(begun)

    await eventually(started, until=lambda b: b == payloads, timeout=10, what="both in batches")
    stop.set()
    await asyncio.wait_for(run, timeout=0.5 + 3.0)

    assert await taken_by_another(bus, lane, len(payloads)) == payloads
    await settled(bus, lane)
