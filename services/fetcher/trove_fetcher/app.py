"""The fetcher process: wiring and lifespan (one HTTP client, one NATS connection)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from nats.js.errors import NotFoundError

from trove_fetcher.clock import PROBE_INTERVAL, ServerClock, outlasting, stream_info
from trove_fetcher.deferral import horizon, purge_handled
from trove_fetcher.fetcher import Fetcher
from trove_fetcher.http import FetchLimits
from trove_fetcher.language import default_identifier
from trove_fetcher.politeness import Politeness, PolitenessConfig
from trove_fetcher.transport import build_client, build_network
from trove_schema.bus import Bus, Consumer, broker_trouble
from trove_schema.events import MAX_URL_LENGTH
from trove_schema.exclusions import Exclusions, ListedExclusions
from trove_schema.policy import LearningConfig
from trove_schema.service import together
from trove_schema.settings import FetcherSettings
from trove_schema.topology import (
    DOMAINS_BUCKET,
    EVENTS_STREAM,
    EXCLUSIONS_BUCKET,
    FETCHER,
    FETCHER_DEFERRED,
    ROBOTS_BUCKET,
    WORK_SCHEDULES_PREFIX,
    WORK_STREAM,
    TopologyOptions,
    declare,
    ensure_topology,
)

#: Pulled work a pod holds beyond its concurrency, per slot (``Consumer.prefetch``), and
#: never more than half the consumer's ``max_ack_pending``, so that one pod cannot
#: hold all of it.
HELD_PER_SLOT = 8
#: What a stopping pod keeps of its grace after waiting for its late writes: to say
#: which are lost and close its connections before it is killed.
STOP_MARGIN = 10.0


def prefetch(concurrency: int, max_ack_pending: int) -> int:
    """The messages a pod holds, per consumer, beyond those its handlers run: 512 at the
    default concurrency. KEDA's lag counts them (``k8s/base/fetcher-scaledobject.yaml``)."""
    return min(HELD_PER_SLOT * concurrency, max_ack_pending // 2)


log = logging.getLogger("trove.fetcher")


async def _stopped_at(stop: asyncio.Event) -> float:
    """When ``stop`` is set, on the loop's clock: the pod's grace runs from then."""
    await stop.wait()
    return asyncio.get_running_loop().time()


async def settle_within_grace(fetcher: Fetcher, stopped_at: float, grace: float) -> None:
    """Wait for what the pod's requests taught about their hosts and the broker did
    not take (``Fetcher.settle_late_writes``) until ``STOP_MARGIN`` before the end of
    the ``grace`` that began at ``stopped_at``. A node drained with its NATS server
    keeps the broker away for longer than a request's patience, and most of the grace
    is left once the work in hand is done: a 429's pause given up sooner would let the
    other pods ask the host again one gap later, not when it asked."""
    left = stopped_at + grace - STOP_MARGIN - asyncio.get_running_loop().time()
    await fetcher.settle_late_writes(max(0.0, left))


async def _message_limit(bus: Bus, configured: int) -> int:
    """The largest event this pod may publish: ``TROVE_MAX_MESSAGE_BYTES``, or less when
    the server's ``max_payload`` or the record's ``max_msg_size`` (its owner, the
    recorder, sets it from its own settings) is smaller. A pod configured above either
    had every event past it refused, five times, then parked."""
    limits = [configured, bus.nc.max_payload]
    with contextlib.suppress(Exception):  # no stream yet: this pod's own declaration holds
        stored = (await bus.js.stream_info(EVENTS_STREAM)).config.max_msg_size
        if stored is not None and stored > 0:
            limits.append(stored)
    limit = min(limits)
    if limit < configured:
        log.warning(
            "events are kept under %d bytes, not TROVE_MAX_MESSAGE_BYTES=%d: the server or "
            "the record takes no more",
            limit,
            configured,
        )
    return limit


#: Seconds between two reads of how long the work stream keeps a message.
WORK_AGE_REFRESH = 60.0


async def _work_age(bus: Bus, configured: float) -> float:
    """How long TROVE_WORK keeps a message (0: until it is handled):
    ``TROVE_WORK_MAX_AGE_SECONDS``, or less when the stream says so. An operator's
    ``nats stream edit``, or a pod of a release that knew only ages (started while this
    one rolls out, or a rollback), may give the stream one; a work message scheduled
    past it would age out before it fired."""
    with contextlib.suppress(Exception):  # the broker away: the age as last read holds
        kept = (await bus.js.stream_info(WORK_STREAM)).config.max_age
        if kept is not None and kept > 0:
            return min(configured, kept) if configured > 0 else kept
    return configured


def _age_text(age: float) -> str:
    return f"{age:.0f} s" if age > 0 else "until handled"


async def _keep_horizon(
    bus: Bus,
    configured: float,
    apply: Callable[[float], None],
    stop: asyncio.Event,
    interval: float = WORK_AGE_REFRESH,
) -> None:
    """Schedule work no further ahead than the stream keeps it (``deferral.horizon``),
    read again every ``interval`` until ``stop``."""
    shown = configured
    while not stop.is_set():
        age = await _work_age(bus, configured)
        if age != shown:
            log.warning(
                "%s keeps a message %s, TROVE_WORK_MAX_AGE_SECONDS says %s: work is "
                "scheduled within what the stream keeps",
                WORK_STREAM,
                _age_text(age),
                _age_text(configured),
            )
            shown = age
        apply(horizon(age))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)


class Consuming(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


async def consume_on_the_servers_clock(
    stop: asyncio.Event,
    clock: ServerClock,
    consumers: Sequence[Consuming],
    interval: float = PROBE_INTERVAL,
) -> None:
    """Run the consumers, and read the server's time (``ServerClock.keep``) for as long
    as any of them runs: after ``stop`` too, while the work in hand finishes (robots.txt
    then its page, redirect hops: each takes a lease on the clock). A node drained moves
    the streams' leaders; a pod that stopped reading at ``stop`` would keep the old
    leader's time for the minutes its work takes, where the other pods read the new
    one's."""
    drained = asyncio.Event()

    async def consuming() -> None:
        try:
            await together(stop, *(c.run(stop) for c in consumers))
        finally:
            drained.set()

    await together(stop, clock.keep(drained, interval), consuming())


async def _keep_purging(bus: Bus, stop: asyncio.Event, interval: float, after: int) -> None:
    """Purge the deferred work the fetchers handled (``deferral.purge_handled``) once
    the stream holds ``after`` such messages, looked at every ``interval`` until
    ``stop``. A look that fails waits for the next, and the first of a run of failures
    is a warning: a deployment's NATS user that refuses the purge (a timeout, as
    nats-server answers what it refuses; the start checks it, ``_may_purge``) would let
    the stream keep every handled message."""
    failing = False
    while not stop.is_set():
        # Out of step with the other pods: two looking at once would both purge, the
        # second nothing, and make the server forget the queued redeliveries twice.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval * random.uniform(0.75, 1.25))
        if stop.is_set():
            return
        try:
            below = await purge_handled(bus.js, after)
        except Exception as exc:
            if not failing:
                log.warning(
                    "handled work not purged from %s (%s): the broker away or slow, or this "
                    "pod's NATS user not allowed $JS.API.STREAM.PURGE.%s; it stays until a "
                    "purge succeeds",
                    WORK_STREAM,
                    exc or type(exc).__name__,
                    WORK_STREAM,
                )
            failing = True
        else:
            if failing:
                log.info("handled work purged from %s again", WORK_STREAM)
            failing = False
            if below:
                log.debug("handled work purged", extra={"below": below})


#: A subject of TROVE_WORK no message is on, and no consumer reads: the start's purge
#: of it asks the permission ``purge_handled`` needs without touching ``fetcher-deferred``
#: (a purge on its subject, even of nothing, makes the server forget its redeliveries).
PURGE_PROBE = f"{WORK_SCHEDULES_PREFIX}.purge-probe"
#: Seconds the start waits for the probe's answer: nats-server says nothing to a
#: request it refuses.
PURGE_PROBE_TIMEOUT = 2.0


async def _may_purge(bus: Bus) -> bool:
    """Whether this pod's NATS user may purge TROVE_WORK (the users of the releases
    before did not allow it). A broker slow to answer passes for a refusal: the stream
    then keeps the age it has for this pod's run (``_work_max_age``)."""
    js = bus.nc.jetstream(timeout=PURGE_PROBE_TIMEOUT)
    try:
        await js.purge_stream(WORK_STREAM, subject=PURGE_PROBE)
    except NotFoundError:
        return True  # no stream yet: the topology makes it, and purges are asked later
    except Exception as exc:
        if broker_trouble(exc):  # a refusal, or a broker that cannot say now
            return False
        raise
    return True


async def _work_max_age(bus: Bus, configured: float, may_purge: bool) -> float:
    """TROVE_WORK's age: the setting; where it would keep work until handled and this
    pod may not purge, the age the stream has now (a week, on a stream the release
    before made), so that it does not start keeping every handled message. Not an age
    given where there was none: it would delete the waiting work older than it."""
    if configured > 0 or may_purge:
        return configured
    try:
        kept = float((await bus.js.stream_info(WORK_STREAM)).config.max_age or 0.0)
    except NotFoundError:
        kept = 0.0
    log.warning(
        "this pod's NATS user may not purge %s ($JS.API.STREAM.PURGE.%s), or the broker "
        "could not say (no answer in %.0f s, or unavailable): the stream keeps "
        "%s, and the work the fetchers handled %s; allow the purge (docs/deploy.md, "
        "Upgrading)",
        WORK_STREAM,
        WORK_STREAM,
        PURGE_PROBE_TIMEOUT,
        f"its age of {kept:.0f} s" if kept else "no age",
        "for that long" if kept else "for good",
    )
    return kept


#: What a cached robots.txt record (``RobotsPolicy.to_bytes``) adds to the file: its JSON
#: header, an origin as long as a URL and an error note (500 characters) at most.
ROBOTS_RECORD_OVERHEAD = MAX_URL_LENGTH + 1024


#: What RFC 9309 (2.5) asks a crawler to read of a robots.txt at least: the rules past a
#: shorter cut, Disallow lines for TroveBot among them, would not be obeyed.
ROBOTS_AT_LEAST = 500 * 1024


def _robots_limit(bus: Bus, configured: int) -> int:
    """The most of a robots.txt this pod reads: ``TROVE_ROBOTS_MAX_BYTES``, 500 KiB at
    least, and less when the server's ``max_payload`` would refuse the record it is
    cached in: a file read past it could not be cached, and every page of its host
    would ask for it again."""
    wanted = max(configured, ROBOTS_AT_LEAST)
    limit = min(wanted, bus.nc.max_payload - ROBOTS_RECORD_OVERHEAD)
    if limit != configured:
        log.warning(
            "robots.txt is read up to %d bytes, not TROVE_ROBOTS_MAX_BYTES=%d: %s",
            limit,
            configured,
            "RFC 9309 asks for 500 KiB at least"
            if limit == wanted
            else "the server takes no larger record to cache it in"
            + (" (less than the 500 KiB RFC 9309 asks for)" if limit < ROBOTS_AT_LEAST else ""),
        )
    return limit


#: A gap under this is said at start: sites ask for seconds (robots.txt's Crawl-delay),
#: and a shorter one belongs to a test or a benchmark against one's own servers.
SHORT_GAP_SECONDS = 1.0


def warn_of_a_short_gap(settings: FetcherSettings) -> None:
    """Say at start that a host may be asked more often than once a second.

    Allowed, not refused: the tests scale days down to seconds and the benchmarks run
    without a gap, against servers of their own.
    """
    if settings.min_domain_delay_seconds < SHORT_GAP_SECONDS:
        log.warning(
            "TROVE_MIN_DOMAIN_DELAY_SECONDS is %g: a host that sets no Crawl-delay may be "
            "asked that often, more than once a second (the default is 10 s)",
            settings.min_domain_delay_seconds,
        )


async def serve(settings: FetcherSettings, stop: asyncio.Event, ready: asyncio.Event) -> None:
    if not settings.nats_url:
        raise SystemExit("the fetcher needs TROVE_NATS_URL")
    warn_of_a_short_gap(settings)
    bus = await Bus.connect(settings.nats_url, name="trove-fetcher")
    # One object: the transport refuses the hosts, the fetcher records their work.
    exclusions = Exclusions.from_settings(settings)
    network = build_network(settings, exclusions=exclusions)
    client = build_client(settings, network=network)
    stopped_at = asyncio.ensure_future(_stopped_at(stop))
    try:
        may_purge = await _may_purge(bus)
        work_age = await _work_max_age(bus, settings.work_max_age_seconds, may_purge)
        options = TopologyOptions.from_settings(
            settings,
            robots_ttl=settings.robots_ttl_seconds,
            domains_ttl=settings.host_record_ttl_seconds,
            fetcher_max_ack_pending=settings.max_ack_pending,
            fetcher_ack_wait=settings.ack_wait_seconds,
        )
        await ensure_topology(
            bus.js, declare(dataclasses.replace(options, work_max_age=work_age)), owner="fetcher"
        )
        listed = ListedExclusions(
            exclusions,
            await bus.js.key_value(EXCLUSIONS_BUCKET),
            settings.exclusions_refresh_seconds,
        )
        await listed.refresh()
        polite = PolitenessConfig(
            min_delay=settings.min_domain_delay_seconds,
            max_delay=settings.max_domain_delay_seconds,
            request_timeout=settings.request_timeout,
            max_backoff=settings.max_backoff_seconds,
        )
        # The work stream's leader's time: the one its scheduled messages fire on.
        clock = ServerClock(stream_info(bus.nc, WORK_STREAM), outlast=outlasting(polite))
        await clock.start()
        fetcher = Fetcher(
            bus=bus,
            clock=clock,
            client=client,
            politeness=Politeness(
                await bus.js.key_value(DOMAINS_BUCKET),
                polite,
                LearningConfig.from_settings(settings),
                # The latest the shared time can be: a hold given from it is not short.
                clock=lambda: clock.at(time.time()),
            ),
            robots_kv=await bus.js.key_value(ROBOTS_BUCKET),
            limits=FetchLimits.from_settings(settings),
            robots_token=settings.robots_token,
            robots_max_bytes=_robots_limit(bus, settings.robots_max_bytes),
            robots_ttl=settings.robots_ttl_seconds,
            work_max_age=await _work_age(bus, work_age),
            max_message_bytes=await _message_limit(bus, settings.max_message_bytes),
            ack_wait=settings.ack_wait_seconds,
            poll_lookback=settings.poll_lookback_seconds,
            allowed_networks=settings.allowed_networks,
            nat64_prefixes=settings.nat64_prefixes,
            exclusions=exclusions,
            listed=listed,
            network_away=network.network_away,
            stopping=stop,
        )
        consumers = [
            Consumer(
                bus=bus,
                stream=stream,
                durable=durable,
                handler=fetcher.handle,
                concurrency=settings.concurrency,
                fetch_batch=min(64, settings.concurrency),
                # Work in hand starts by priority (the seed's, carried by every event),
                # then by its host's queue. When work comes due faster than a pod can
                # start it (a thousand hosts' next pages at once), the order is chosen
                # among what the pod holds, not in the order it came due.
                prefetch=prefetch(settings.concurrency, settings.max_ack_pending),
                hold_refresh=min(15.0, settings.ack_wait_seconds / 3),
                # A lost ack would cost the site the same request again.
                confirm_acks=settings.ack_wait_seconds / 2,
            )
            for stream, durable in ((EVENTS_STREAM, FETCHER), (WORK_STREAM, FETCHER_DEFERRED))
        ]
        started = time.perf_counter()
        await asyncio.to_thread(default_identifier().warm)
        log.info(
            "language models loaded", extra={"seconds": f"{time.perf_counter() - started:.2f}"}
        )
        ready.set()
        await together(
            stop,
            consume_on_the_servers_clock(stop, clock, consumers),
            _keep_horizon(
                bus,
                work_age,
                lambda ahead: setattr(fetcher, "horizon", ahead),
                stop,
            ),
            _keep_purging(
                bus,
                stop,
                settings.work_purge_interval_seconds,
                settings.work_purge_after_messages,
            ),
            listed.keep(stop),
            bus.until_closed(stop),
        )
        # Each part of ``together`` returns only at ``stop``.
        await settle_within_grace(fetcher, await stopped_at, settings.stop_grace_seconds)
        fetcher.close()
    finally:
        stopped_at.cancel()
        await client.aclose()
        await bus.close()
