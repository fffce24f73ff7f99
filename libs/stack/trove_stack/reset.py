"""An empty crawl on running servers: for tests and benchmarks, never for production."""

from __future__ import annotations

import contextlib

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from trove_schema.errors import TopologyError
from trove_schema.tables import Base
from trove_schema.topology import declare, ensure_topology


async def reset(js: JetStreamContext, engine: AsyncEngine) -> None:
    """Streams and buckets purged, consumers recreated, every projection table truncated.

    Purge rather than delete streams: recreating a just-deleted stream can race the
    server's removal of its store. Consumers are deleted so they start from the
    beginning. Run it while no service is connected.

    A purge keeps a stream's duplicate window: a message id published before the reset
    is dropped as a duplicate after it, for the window (ten minutes on the events
    stream). Tests that publish fixed ids (an event derived from a command's place)
    give each test its own.
    """
    top = declare()
    # Makes what is missing. A reset cut short after its deletes (a message published
    # before its consumers were made again) leaves a stream with messages and no
    # consumer, which this refuses: every reset after it failed here. What follows
    # empties the stream, and the second look makes the consumers.
    with contextlib.suppress(TopologyError):
        await ensure_topology(js, top)
    for stream, consumer in top.consumers:
        assert consumer.durable_name is not None
        with contextlib.suppress(NotFoundError):
            await js.delete_consumer(stream, consumer.durable_name)
    for config in top.streams:
        assert config.name is not None
        await js.purge_stream(config.name)
    for bucket in top.buckets:
        await js.purge_stream(f"KV_{bucket.bucket}")
    await ensure_topology(js, top)
    tables = ", ".join(t.name for t in Base.metadata.sorted_tables)
    async with engine.begin() as conn:
        await conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
