"""The discovery process: wiring and lifespan."""

from __future__ import annotations

import asyncio
import contextlib

from nats.aio.msg import Msg

from trove_discovery.discovery import Discovery
from trove_discovery.follows import Follows, FollowStore
from trove_discovery.shares import Shares
from trove_discovery.url_rules import Holds, UrlRules
from trove_schema.aliases import AliasLimits
from trove_schema.bus import Bus, Consumer, Handler
from trove_schema.exclusions import Exclusions, ListedExclusions
from trove_schema.service import together
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import (
    DISCOVERY_FOLLOWS,
    DISCOVERY_LINKS,
    DISCOVERY_SEEDS,
    EVENTS_STREAM,
    EXCLUSIONS_BUCKET,
    FOLLOW_SUBJECT,
    FOLLOWS_BUCKET,
    SEEDS_STREAM,
    SEEDS_SUBJECT,
    SEEN_BUCKET,
    TIMELINE_POLLED,
    UNFOLLOW_SUBJECT,
    URL_RULES_BUCKET,
    TopologyOptions,
    declare,
    ensure_topology,
)


async def serve(settings: DiscoverySettings, stop: asyncio.Event, ready: asyncio.Event) -> None:
    if not settings.nats_url:
        raise SystemExit("discovery needs TROVE_NATS_URL")
    bus = await Bus.connect(settings.nats_url, name="trove-discovery")
    try:
        options = TopologyOptions.from_settings(
            settings, seen_ttl=settings.seen_ttl, url_rules_ttl=settings.url_rules_ttl
        )
        await ensure_topology(bus.js, declare(options), owner="discovery")
        await check_recrawls_are_kept(bus, settings)
        url_rules = UrlRules(
            await bus.js.key_value(URL_RULES_BUCKET),
            ttl=settings.url_rules_cache_seconds,
            limits=AliasLimits(confirmations=settings.alias_confirmations),
            # A quarter of the record's life: a host still crawled is written well
            # before its record would go.
            refresh=settings.url_rules_ttl / 4,
        )
        listed = ListedExclusions(
            Exclusions.from_settings(settings),
            await bus.js.key_value(EXCLUSIONS_BUCKET),
            settings.exclusions_refresh_seconds,
        )
        await listed.refresh()
        discovery = Discovery(
            bus=bus,
            seen=await bus.js.key_value(SEEN_BUCKET),
            settings=settings,
            url_rules=url_rules,
            holds=Holds(first=settings.alias_hold_seconds, rounds=settings.alias_hold_rounds),
            listed=listed,
        )
        store = FollowStore(await bus.js.key_value(FOLLOWS_BUCKET))
        follows = Follows(bus=bus, store=store, settings=settings, listed=listed)
        shares = Shares(bus=bus, store=store, discovery=discovery, settings=settings)
        replies = [
            await bus.nc.subscribe(
                SEEDS_SUBJECT, queue="discovery-replies", cb=discovery.reply_to_seed_request
            ),
            *[
                await bus.nc.subscribe(
                    subject, queue="discovery-replies", cb=follows.reply_to_request
                )
                for subject in (FOLLOW_SUBJECT, UNFOLLOW_SUBJECT)
            ],
        ]
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
                handler=events_handler(discovery, shares),
                concurrency=32,
            ),
            Consumer(
                bus=bus,
                stream=SEEDS_STREAM,
                durable=DISCOVERY_FOLLOWS,
                handler=follows.handle_command,
                concurrency=1,
            ),
        ]
        ready.set()
        try:
            await together(
                stop, listed.keep(stop), bus.until_closed(stop), *(c.run(stop) for c in consumers)
            )
        finally:
            for subscription in replies:
                with contextlib.suppress(Exception):
                    await subscription.unsubscribe()
    finally:
        await bus.close()


def events_handler(discovery: Discovery, shares: Shares) -> Handler:
    """The discovery-links consumer's handler: each event to its own, by subject."""

    async def handle(msg: Msg) -> None:
        if msg.subject == TIMELINE_POLLED:
            await shares.handle_timeline_polled(msg)
        else:
            await discovery.handle_crawl_completed(msg)

    return handle


async def check_recrawls_are_kept(bus: Bus, settings: DiscoverySettings) -> None:
    """Refuse to start if TROVE_EVENTS would age out the re-crawls before they fire.

    The recorder owns that stream's retention, so discovery's own setting proves nothing.
    """
    max_age = (await bus.js.stream_info(EVENTS_STREAM)).config.max_age or 0.0
    if 0 < max_age <= settings.recrawl_max:
        raise SystemExit(
            f"{EVENTS_STREAM} keeps messages for {max_age:g} s, not longer than the "
            f"longest re-crawl interval ({settings.recrawl_max:g} s, "
            "TROVE_RECRAWL_MAX_SECONDS): scheduled re-crawls wait in that stream and would "
            "be aged out; raise the recorder's TROVE_EVENTS_MAX_AGE_SECONDS (or 0: keep for "
            "ever) or shorten the intervals"
        )
