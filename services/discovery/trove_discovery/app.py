"""The discovery process: wiring and lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging

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

log = logging.getLogger("trove.discovery")


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
        warn_of_a_short_seen_ttl(settings)
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
    """Refuse to start if TROVE_EVENTS would age out the re-crawls or the timeline polls
    before they fire: a poll aged out ends its follow, without a word.

    The recorder owns that stream's retention, so discovery's own setting proves nothing.
    """
    max_age = (await bus.js.stream_info(EVENTS_STREAM)).config.max_age or 0.0
    schedules = (
        (
            "re-crawls",
            "the longest re-crawl interval",
            settings.recrawl_max,
            "TROVE_RECRAWL_MAX_SECONDS",
        ),
        (
            "timeline polls",
            "the longest pause of a timeline's polls",
            max(settings.poll_interval_seconds, settings.poll_max_backoff_seconds),
            "TROVE_POLL_MAX_BACKOFF_SECONDS",
        ),
    )
    for what, longest, delay, setting in schedules:
        if 0 < max_age <= delay:
            raise SystemExit(
                f"{EVENTS_STREAM} keeps messages for {max_age:g} s, not longer than "
                f"{longest} ({delay:g} s, {setting}): scheduled {what} wait in that stream "
                "and would be aged out; raise the recorder's TROVE_EVENTS_MAX_AGE_SECONDS "
                f"(or 0: keep for ever) or shorten {setting}"
            )


#: A seen TTL at least this many times the longest re-crawl interval leaves a re-crawl
#: room to run late (its host's gap, a pause, its retries) before its key expires.
SEEN_TTL_MARGIN = 1.5


def warn_of_a_short_seen_ttl(settings: DiscoverySettings) -> None:
    """Warn when the seen TTL leaves a re-crawl little room past the longest interval.

    Such a TTL is allowed (the settings refuse only one not longer than the interval),
    and costs no politeness: a page whose re-crawl fires or retries after its key
    expired is discovered again by the next link to it, one fetch more, counted against
    its host's page budget once more.
    """
    if settings.seen_ttl < SEEN_TTL_MARGIN * settings.recrawl_max:
        log.warning(
            "TROVE_SEEN_TTL_SECONDS (%g) is less than %g times the longest re-crawl "
            "interval (%g s, TROVE_RECRAWL_MAX_SECONDS): a page whose re-crawl waits or "
            "retries past its seen key is discovered again by the next link to it, one "
            "fetch more and one more count against its host's page budget",
            settings.seen_ttl,
            SEEN_TTL_MARGIN,
            settings.recrawl_max,
        )
