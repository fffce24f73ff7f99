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
        options = TopologyOptions.from_settings(settings, seen_ttl=settings.seen_ttl)
        await ensure_topology(bus.js, declare(options), owner="discovery")
        await check_recrawls_are_kept(bus, settings)
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


async def check_recrawls_are_kept(bus: Bus, settings: DiscoverySettings) -> None:
    """Refuse to start if TROVE_EVENTS would age out the re-crawls before they fire.

    The recorder owns that stream's retention, so discovery's own setting proves nothing.
    """
    max_age = (await bus.js.stream_info(EVENTS_STREAM)).config.max_age or 0.0
    if 0 < max_age <= settings.recrawl_after_seconds:
        raise SystemExit(
            f"{EVENTS_STREAM} keeps messages for {max_age:g} s, not longer than "
            f"TROVE_RECRAWL_AFTER_SECONDS ({settings.recrawl_after_seconds:g}): scheduled "
            "re-crawls wait in that stream and would be aged out; raise the recorder's "
            "TROVE_EVENTS_MAX_AGE_SECONDS (or 0: keep for ever) or shorten the interval"
        )
