"""A consumer's pull requests across a broker outage, on a real nats-server stopped and
started again: what it asked for while the server was away is not all served at once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig

from tests.conftest import eventually
from tests.ports import free_port
from tests.schema.test_bus import Lane, running
from trove_schema.bus import BatchConsumer, Bus, Consumer
from trove_schema.pulls import Pulls
from trove_stack.nats import EmbeddedNats, NatsConfig

#: Each consumer holds at most four messages: four handlers, or one batch of four.
BOUND = 4
#: A pull request lives 1.5 s at the server, and is given up 0.2 s after that.
QUICK_PULLS: dict[str, Any] = {"pull_expires": 1.5, "idle_wait": 0.2}
LANE = Lane(stream="TEST_OUTAGE", subject="test.outage", durable="test-outage")


@pytest.mark.parametrize("batched", [False, True], ids=["one at a time", "in batches"])
async def test_pulls_are_not_asked_while_the_broker_is_away(tmp_path: Path, batched: bool) -> None:
    # nats-py buffers a publish while it reconnects, and a pull request whose end never
    # came was given up and asked again: one more request buffered each time, all sent
    # at the reconnect and all served. A recorder came back from an outage holding up
    # to its whole ack window of 31 KB events, past its memory limit.
    config = NatsConfig(store_dir=tmp_path / "nats", port=free_port("127.0.0.1"))
    server = EmbeddedNats(config).start()
    bus = await Bus.connect(server.url, name="test-outage")
    release = asyncio.Event()
    started: list[bytes] = []

    async def handler(msg: Msg) -> None:
        started.append(msg.data)
        await release.wait()

    async def batch_handler(msgs: Sequence[Msg]) -> None:
        started.extend(msg.data for msg in msgs)
        await release.wait()

    async def connected() -> bool:
        return bool(bus.nc.is_connected)

    async def consumer_info() -> Any:
        return await bus.js.consumer_info(LANE.stream, LANE.durable)

    consumer: Consumer | BatchConsumer
    if batched:
        consumer = BatchConsumer(
            bus=bus,
            stream=LANE.stream,
            durable=LANE.durable,
            batch_handler=batch_handler,
            handler=handler,
            batch_size=BOUND,
            concurrency=1,
            **QUICK_PULLS,
        )
    else:
        consumer = Consumer(
            bus=bus,
            stream=LANE.stream,
            durable=LANE.durable,
            handler=handler,
            concurrency=BOUND,
            **QUICK_PULLS,
        )
    try:
        await bus.js.add_stream(
            StreamConfig(name=LANE.stream, subjects=[LANE.subject], storage=StorageType.FILE)
        )
        await bus.js.add_consumer(
            LANE.stream,
            ConsumerConfig(durable_name=LANE.durable, ack_policy=AckPolicy.EXPLICIT, ack_wait=30),
        )
        async with running(consumer):
            try:
                await eventually(
                    consumer_info, until=lambda i: i.num_waiting == 1, timeout=10, what="a pull"
                )
                reconnects = bus.nc.stats["reconnects"]
                server.stop()
                await eventually(connected, until=lambda up: not up, timeout=10, what="noticed")
                await asyncio.sleep(6.0)  # the duration under test: over three requests' lives
                server = EmbeddedNats(config).start()
                await eventually(
                    connected,
                    until=lambda up: up and bus.nc.stats["reconnects"] > reconnects,
                    timeout=20,
                    interval=0.05,
                    what="reconnected",
                )
                await bus.nc.flush()  # what the client sent at its return reached the server
                await asyncio.gather(
                    *(bus.js.publish(LANE.subject, f"work {i}".encode()) for i in range(40))
                )
                # Every request the server holds is served at once from the 40 waiting.
                info = await eventually(
                    consumer_info,
                    until=lambda i: i.num_ack_pending >= BOUND and i.num_waiting == 0,
                    timeout=10,
                    what="the requests served",
                )
                assert info.num_ack_pending == BOUND, (
                    f"{info.num_ack_pending} messages delivered to a consumer that holds {BOUND}"
                )
            finally:
                release.set()
            await eventually(
                consumer_info,
                until=lambda i: i.ack_floor.stream_seq == 40,
                timeout=20,
                what="all acked",
            )
        assert sorted(started) == sorted(f"work {i}".encode() for i in range(40))
    finally:
        await bus.close()
        server.stop()


async def test_a_request_whose_end_never_came_is_no_deadline_once_given_up(
    tmp_path: Path,
) -> None:
    # A consumer waiting out a pause asks for nothing, and asking was where a lost request
    # was given up: its deadline, long past, made every wait of the pause one of 0 s.
    server = EmbeddedNats(NatsConfig(store_dir=tmp_path / "nats")).start()
    bus = await Bus.connect(server.url, name="test-deadline")
    now = [1000.0]
    pulls = Pulls(bus.nc, LANE.stream, LANE.durable, expires=5.0, grace=1.0, clock=lambda: now[0])
    try:
        await bus.js.add_stream(
            StreamConfig(name=LANE.stream, subjects=[LANE.subject], storage=StorageType.FILE)
        )
        await bus.js.add_consumer(
            LANE.stream,
            ConsumerConfig(durable_name=LANE.durable, ack_policy=AckPolicy.EXPLICIT, ack_wait=30),
        )
        await pulls.start()
        await pulls.ask(1)
        deadline = pulls.next_deadline()
        assert deadline is not None
        assert deadline > now[0]
        now[0] = deadline + 1.0  # its end lost with a server that went: none will come
        late = pulls.next_deadline()
        assert late is None or late > now[0]
    finally:
        await pulls.close()
        await bus.close()
        server.stop()
