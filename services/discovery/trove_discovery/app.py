"""The discovery process: wiring and lifespan."""

from __future__ import annotations

import asyncio
import contextlib

from trove_discovery.discovery import Discovery
from trove_schema.bus import Bus, Consumer
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import (
    DISCOVERY_LINKS,
    DISCOVERY_SEEDS,
    EVENTS_STREAM,
    SEEDS_STREAM,
    SEEDS_SUBJECT,
    SEEN_BUCKET,
    TopologyOptions,
    declare,
    ensure_topology,
)


async def serve(settings: DiscoverySettings, stop: asyncio.Event, ready: asyncio.Event) -> None:
    if not settings.nats_url:
        raise SystemExit("discovery needs TROVE_NATS_URL")
    bus = await Bus.connect(settings.nats_url, name="trove-discovery")
    try:
        await ensure_topology(
            bus.js, declare(TopologyOptions.from_settings(settings)), owner="discovery"
        )
        discovery = Discovery(bus=bus, seen=await bus.js.key_value(SEEN_BUCKET), settings=settings)
        replies = await bus.nc.subscribe(
            SEEDS_SUBJECT, queue="discovery-replies", cb=discovery.reply_to_seed_request
        )
        consumers = [
            Consumer(
                bus=bus,
                stream=SEEDS_STREAM,
                durable=DISCOVERY_SEEDS,
                handler=discovery.handle_seed,
                concurrency=4,
            ),
            Consumer(
                bus=bus,
                stream=EVENTS_STREAM,
                durable=DISCOVERY_LINKS,
                handler=discovery.handle_crawl_completed,
                concurrency=32,
            ),
        ]
        ready.set()
        try:
            await asyncio.gather(*(c.run(stop) for c in consumers))
        finally:
            with contextlib.suppress(Exception):
                await replies.unsubscribe()
    finally:
        await bus.close()
