from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
import pytest
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    DeliverPolicy,
    DiscardPolicy,
    StoreCompression,
    StreamConfig,
)
from nats.js.errors import APIError, BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from tests.conftest import StackUrls, eventually
from trove_schema import topology
from trove_schema.bus import Bus, broker_trouble
from trove_schema.errors import RetentionRefused, TopologyError
from trove_schema.events import (
    CrawlCompleted,
    CrawlOutcome,
    CrawlRequested,
    Link,
    RequestReason,
    Scope,
    decode_event,
)
from trove_schema.topology import (
    CRAWL_COMPLETED,
    DAY,
    DEAD_PREFIX,
    DEAD_STREAM,
    DOMAINS_BUCKET,
    EVENTS_STREAM,
    FETCH_DEFERRED,
    FETCHER,
    FETCHER_DEFERRED,
    OWNERS,
    PAGE_DISCOVERED,
    RECORDER,
    REVISION,
    REVISION_KEY,
    SEEDS_STREAM,
    SEEDS_SUBJECT,
    SEEN_BUCKET,
    WORK_STREAM,
    TopologyOptions,
    _ensure_stream,
    _managed,
    declare,
    ensure_topology,
)
from trove_stack.nats import EmbeddedNats, NatsConfig


@pytest.mark.usefixtures("clean")
async def test_ensure_topology_is_idempotent(bus: Bus) -> None:
    top = declare()
    await ensure_topology(bus.js, top)
    await ensure_topology(bus.js, top)
    names = {s.config.name for s in await bus.js.streams_info()}
    assert {"TROVE_SEEDS", "TROVE_EVENTS", "TROVE_WORK", "TROVE_DEAD"} <= names


@pytest.mark.usefixtures("clean")
async def test_a_changed_consumer_config_is_reconciled(bus: Bus) -> None:
    stream, config = declare().consumer(FETCHER)
    await bus.js.add_consumer(stream, replace(config, max_ack_pending=7))
    assert (await bus.js.consumer_info(stream, FETCHER)).config.max_ack_pending == 7

    await ensure_topology(bus.js, declare(TopologyOptions(fetcher_max_ack_pending=1234)))

    assert (await bus.js.consumer_info(stream, FETCHER)).config.max_ack_pending == 1234


@pytest.mark.usefixtures("clean")
async def test_what_an_operator_set_on_a_durable_survives_its_owners_reconcile(bus: Bus) -> None:
    # The create API replaces a durable's whole config, as an update does a stream's.
    stream, config = declare().consumer(FETCHER)
    await bus.js.add_consumer(
        stream, replace(config, metadata={"team": "search"}, sample_freq="25%")
    )

    await ensure_topology(
        bus.js, declare(TopologyOptions(fetcher_max_ack_pending=1234)), owner="fetcher"
    )

    after = (await bus.js.consumer_info(stream, FETCHER)).config
    assert after.max_ack_pending == 1234
    assert (after.metadata or {}).get("team") == "search"
    assert after.sample_freq == "25%"


@pytest.mark.usefixtures("clean")
async def test_a_durable_made_with_one_filter_is_reconciled_to_the_declared_list(bus: Bus) -> None:
    # An older release's durable read one subject; this one's reads several.
    stream, config = declare().consumer(FETCHER)
    assert config.filter_subjects
    await bus.js.delete_consumer(stream, FETCHER)
    await bus.js.add_consumer(
        stream, replace(config, filter_subjects=None, filter_subject=config.filter_subjects[0])
    )

    await ensure_topology(bus.js, declare(), owner="fetcher")

    after = (await bus.js.consumer_info(stream, FETCHER)).config
    assert sorted(after.filter_subjects or []) == sorted(config.filter_subjects)
    assert not after.filter_subject


@pytest.mark.usefixtures("clean")
async def test_a_pod_of_an_older_release_leaves_a_newer_releases_durable_as_it_is(
    bus: Bus,
) -> None:
    # The newer release's durable reads one subject more; a pod of this release starts
    # beside it (a rolling update, a rollback) and would narrow it back.
    stream, config = declare().consumer(FETCHER)
    newer = replace(
        config,
        filter_subjects=[*(config.filter_subjects or []), "trove.events.newer.kind"],
        max_ack_pending=77,
        metadata={REVISION_KEY: str(REVISION + 1)},
    )
    await bus.js.delete_consumer(stream, FETCHER)
    await bus.js.add_consumer(stream, newer)

    await ensure_topology(bus.js, declare(), owner="fetcher")

    after = (await bus.js.consumer_info(stream, FETCHER)).config
    assert "trove.events.newer.kind" in (after.filter_subjects or [])
    assert after.max_ack_pending == 77
    # One this release or an older one wrote is reconciled, and stamped with this one.
    await bus.js.add_consumer(stream, replace(newer, metadata={REVISION_KEY: str(REVISION)}))
    await ensure_topology(bus.js, declare(), owner="fetcher")
    after = (await bus.js.consumer_info(stream, FETCHER)).config
    assert sorted(after.filter_subjects or []) == sorted(config.filter_subjects or [])
    assert (after.metadata or {}).get(REVISION_KEY) == str(REVISION)


@pytest.mark.usefixtures("clean")
@pytest.mark.parametrize(
    ("durable", "subject", "advice"),
    [
        (FETCHER, PAGE_DISCOVERED, "--deliver <time>"),
        # TROVE_WORK holds the waiting work, which a later start would pass over for the
        # next purge to delete, and the handled work not yet purged, fetched again.
        (FETCHER_DEFERRED, FETCH_DEFERRED, "--deliver all"),
    ],
)
async def test_a_deleted_fetcher_durable_is_not_made_again_from_its_streams_first_message(
    bus: Bus, durable: str, subject: str, advice: str
) -> None:
    # Made again from the first message, the fetcher would fetch every page the record
    # ever asked for at once. Where it starts again is the operator's to say.
    stream, config = declare().consumer(durable)
    await bus.js.publish(subject, b"{}")  # the stream holds a message
    await bus.js.delete_consumer(stream, durable)

    with pytest.raises(
        TopologyError, match=rf"consumer {durable} is missing on {stream}"
    ) as refused:
        await ensure_topology(bus.js, declare(), owner="fetcher")
    assert advice in str(refused.value)
    with pytest.raises(NotFoundError):
        await bus.js.consumer_info(stream, durable)

    # Made by the operator from a point in time (`nats consumer add ... --deliver 1h
    # --defaults`): the start keeps the point and sets everything else Trove manages.
    since = datetime.now(UTC) - timedelta(hours=1)
    await bus.js.add_consumer(
        stream,
        ConsumerConfig(
            durable_name=durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.BY_START_TIME,
            opt_start_time=since,
            max_waiting=512,
        ),
    )
    await ensure_topology(bus.js, declare(), owner="fetcher")
    after = (await bus.js.consumer_info(stream, durable)).config
    assert after.deliver_policy == DeliverPolicy.BY_START_TIME
    wanted = config.filter_subjects or [str(config.filter_subject)]
    assert sorted(after.filter_subjects or [str(after.filter_subject)]) == sorted(wanted)
    assert after.ack_wait == config.ack_wait


@pytest.mark.usefixtures("clean")
async def test_a_deleted_recorder_durable_is_made_again_from_the_first_event(bus: Bus) -> None:
    # The projection takes the whole record again as a replay does: nothing applied twice.
    stream, _ = declare().consumer(RECORDER)
    await bus.js.publish(CRAWL_COMPLETED, b"{}")
    await bus.js.delete_consumer(stream, RECORDER)

    await ensure_topology(bus.js, declare(), owner="recorder")

    info = await bus.js.consumer_info(stream, RECORDER)
    assert info.num_pending == 1


#: Each revision of the topology and the digest of its shape: only ever added to.
SHAPES = {1: "2e652d13d8821661", 2: "3a08185ffceac9f2", 3: "8a21ef4d1e72fa93"}
#: The same for the buckets, since they are stamped: only ever added to, and a revision
#: raised for a change of either shape.
BUCKET_SHAPES = {3: "c22c3e5ce61d6385"}


def test_the_declared_topology_is_the_one_its_revision_names() -> None:
    # Changed without raising ``REVISION``, an older pod would take the new shape for
    # its own and undo it. Raise REVISION, then add its digest to ``SHAPES`` (never
    # change a listed one: that revision's pods are out there); the shape of an older
    # revision back under a new one fails.
    top = declare()
    shape = [
        (config.name, {k: v for k, v in _managed(config).items() if k != "metadata"})
        for config in top.streams
    ] + [
        (
            f"{stream}/{config.durable_name}",
            {k: v for k, v in _managed(config).items() if k != "metadata"},
        )
        for stream, config in top.consumers
    ]
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()
    assert max(SHAPES) == REVISION
    assert SHAPES[REVISION] == digest[:16]
    assert len(set(SHAPES.values())) == len(SHAPES)  # each revision a shape of its own
    # Buckets are stamped and guarded too (since revision 3): theirs is a shape of its own.
    buckets = [dataclasses.asdict(config) for config in top.buckets]
    digest = hashlib.sha256(json.dumps(buckets, sort_keys=True, default=str).encode()).hexdigest()
    assert max(BUCKET_SHAPES) == REVISION
    assert BUCKET_SHAPES[REVISION] == digest[:16]


@pytest.mark.usefixtures("clean")
async def test_many_pods_reconciling_at_once_all_succeed(bus: Bus) -> None:
    top = declare()
    for stream, consumer in top.consumers:
        assert consumer.durable_name is not None
        await bus.js.delete_consumer(stream, consumer.durable_name)
    await asyncio.gather(*(ensure_topology(bus.js, top) for _ in range(5)))
    for stream, consumer in top.consumers:
        assert consumer.durable_name is not None
        info = await bus.js.consumer_info(stream, consumer.durable_name)
        assert info.config.ack_policy == consumer.ack_policy
    assert (await bus.js.stream_info(SEEDS_STREAM)).config.no_ack is True


@pytest.mark.usefixtures("clean")
async def test_a_raw_seed_is_stored_even_with_no_discovery_running(
    bus: Bus, stack: StackUrls
) -> None:
    # What `nats pub trove.seeds https://example.org/` does: a core publish, no headers.
    nc = await nats.connect(stack.nats_url)
    await nc.publish(SEEDS_SUBJECT, b"https://example.org/")
    await nc.flush()
    await nc.close()

    async def stored() -> bytes | None:
        # The flush says the server read the publish; the stream stores it a moment later.
        try:
            return (await bus.js.get_last_msg(SEEDS_STREAM, SEEDS_SUBJECT)).data
        except NotFoundError:
            return None

    data = await eventually(stored, until=lambda d: d is not None, timeout=10, what="stored")
    assert data == b"https://example.org/"


@pytest.mark.usefixtures("clean")
async def test_reconciling_an_unchanged_topology_updates_nothing(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="trove_schema.topology")
    await ensure_topology(bus.js, declare())
    assert [r.getMessage() for r in caplog.records if "reconciled" in r.getMessage()] == []


@pytest.mark.usefixtures("clean")
async def test_a_service_does_not_undo_another_services_consumer_settings(bus: Bus) -> None:
    await ensure_topology(
        bus.js, declare(TopologyOptions(fetcher_max_ack_pending=10)), owner="fetcher"
    )
    # The recorder starts with default options: the fetcher's consumer is not its to change.
    await ensure_topology(bus.js, declare(), owner="recorder")
    stream, _ = declare().consumer(FETCHER)
    assert (await bus.js.consumer_info(stream, FETCHER)).config.max_ack_pending == 10


class _OvertakenAfterLooking(JetStreamContext):
    """A real JetStream context whose caller, having found a durable missing, is
    overtaken by ``meanwhile`` (another start that makes it) before it creates one."""

    def __init__(self, bus: Bus, meanwhile: Callable[[], Awaitable[object]]) -> None:
        super().__init__(bus.nc, timeout=10.0)
        self._meanwhile: Callable[[], Awaitable[object]] | None = meanwhile

    async def consumer_info(
        self, stream: str, consumer: str, timeout: float | None = None
    ) -> ConsumerInfo:
        try:
            info: ConsumerInfo = await super().consumer_info(stream, consumer, timeout)
            return info
        except NotFoundError:
            meanwhile, self._meanwhile = self._meanwhile, None
            if meanwhile is not None:
                await meanwhile()
            raise


@pytest.mark.usefixtures("clean")
@pytest.mark.parametrize("caller", ["cli", "discovery", "recorder"])
async def test_a_durable_its_owner_made_meanwhile_keeps_the_owners_settings(
    bus: Bus, caller: str
) -> None:
    # The caller finds the fetcher's durable missing; the fetcher's start makes it with
    # the deployment's settings before the caller's create arrives.
    stream, _ = declare().consumer(FETCHER)
    await bus.js.delete_consumer(stream, FETCHER)
    deployed = declare(TopologyOptions(fetcher_max_ack_pending=10, fetcher_ack_wait=300.0))
    overtaken = _OvertakenAfterLooking(
        bus, lambda: ensure_topology(bus.js, deployed, owner="fetcher")
    )

    await ensure_topology(overtaken, declare(), owner=caller)

    after = (await bus.js.consumer_info(stream, FETCHER)).config
    assert (after.max_ack_pending, after.ack_wait) == (10, 300.0)


@pytest.mark.usefixtures("clean")
async def test_an_owner_that_found_its_durable_missing_leaves_a_newer_releases_made_meanwhile(
    bus: Bus,
) -> None:
    # A pod of the newer release makes the durable, reading one subject more, while a pod
    # of this release, having found it missing, is about to create it.
    stream, config = declare().consumer(FETCHER)
    await bus.js.delete_consumer(stream, FETCHER)
    newer = replace(
        config,
        filter_subjects=[*(config.filter_subjects or []), "trove.events.newer.kind"],
        metadata={REVISION_KEY: str(REVISION + 1)},
    )
    overtaken = _OvertakenAfterLooking(bus, lambda: bus.js.add_consumer(stream, newer))

    await ensure_topology(overtaken, declare(), owner="fetcher")

    after = (await bus.js.consumer_info(stream, FETCHER)).config
    assert "trove.events.newer.kind" in (after.filter_subjects or [])
    assert (after.metadata or {}).get(REVISION_KEY) == str(REVISION + 1)


@pytest.mark.usefixtures("clean")
async def test_an_owner_that_found_its_durable_missing_sets_its_settings_on_one_made_meanwhile(
    bus: Bus,
) -> None:
    # `trove seed` makes the durable with its defaults while the fetcher's start, having
    # found it missing, is about to create it: the fetcher's create is refused, and it
    # reconciles what it finds instead.
    stream, _ = declare().consumer(FETCHER)
    await bus.js.delete_consumer(stream, FETCHER)
    overtaken = _OvertakenAfterLooking(bus, lambda: ensure_topology(bus.js, owner="cli"))

    deployed = declare(TopologyOptions(fetcher_max_ack_pending=10, fetcher_ack_wait=300.0))
    await ensure_topology(overtaken, deployed, owner="fetcher")

    after = (await bus.js.consumer_info(stream, FETCHER)).config
    assert (after.max_ack_pending, after.ack_wait) == (10, 300.0)


@pytest.mark.usefixtures("clean")
async def test_buckets_made_before_direct_gets_are_reconciled_to_them(bus: Bus) -> None:
    # A bucket from an older release answers reads through the JSON API only.
    stream = f"KV_{SEEN_BUCKET}"
    info = await bus.js.stream_info(stream)
    await bus.js.update_stream(replace(info.config, allow_direct=False))
    assert (await bus.js.key_value(SEEN_BUCKET))._direct is False

    await ensure_topology(bus.js, declare(), owner="discovery")

    assert (await bus.js.stream_info(stream)).config.allow_direct is True
    seen = await bus.js.key_value(SEEN_BUCKET)
    assert seen._direct is True
    await seen.create("k", b"v")
    assert (await seen.get("k")).value == b"v"


SERVICES = {"discovery", "fetcher", "recorder"}

#: Each stream, its owner, and options that differ from the defaults (a deployment's).
DEPLOYED = [
    (SEEDS_STREAM, "discovery", TopologyOptions(seeds_max_age=90 * DAY)),
    (
        EVENTS_STREAM,
        "recorder",
        TopologyOptions(events_max_age=400 * DAY, events_compression=False),
    ),
    (DEAD_STREAM, "recorder", TopologyOptions(dead_max_age=60 * DAY)),
    (WORK_STREAM, "fetcher", TopologyOptions(work_max_age=3 * DAY, max_message_bytes=2 << 20)),
]


@pytest.mark.usefixtures("clean")
@pytest.mark.parametrize(("stream", "owner", "deployed"), DEPLOYED, ids=[d[0] for d in DEPLOYED])
async def test_only_a_streams_owner_changes_it(
    bus: Bus, stream: str, owner: str, deployed: TopologyOptions
) -> None:
    await ensure_topology(bus.js, declare(deployed), owner=owner)
    as_deployed = (await bus.js.stream_info(stream)).config
    assert (
        as_deployed.max_age
        == next(s for s in declare(deployed).streams if s.name == stream).max_age
    )

    # `trove crawl` pointed at the cluster, and every other service, with their defaults.
    for caller in sorted((SERVICES | {"cli"}) - {owner}):
        await ensure_topology(bus.js, declare(), owner=caller)
        after = (await bus.js.stream_info(stream)).config
        assert (after.max_age, after.max_msg_size, after.num_replicas, after.compression) == (
            as_deployed.max_age,
            as_deployed.max_msg_size,
            as_deployed.num_replicas,
            as_deployed.compression,
        ), f"{caller} changed {stream}"

    # Its owner, restarted with new settings, does reconcile it.
    await ensure_topology(bus.js, declare(), owner=owner)
    wanted = next(s for s in declare().streams if s.name == stream)
    now = (await bus.js.stream_info(stream)).config
    assert now.max_age == wanted.max_age
    assert now.compression == (wanted.compression or StoreCompression.NONE)


@pytest.mark.usefixtures("clean")
async def test_the_event_record_is_stored_compressed_unless_its_owner_is_told_otherwise(
    bus: Bus,
) -> None:
    assert (await bus.js.stream_info(EVENTS_STREAM)).config.compression == StoreCompression.S2
    plain = declare(TopologyOptions(events_compression=False))
    await ensure_topology(bus.js, plain, owner="recorder")
    assert (await bus.js.stream_info(EVENTS_STREAM)).config.compression == StoreCompression.NONE


@pytest.mark.usefixtures("clean")
async def test_what_an_operator_set_outside_troves_settings_survives_the_owners_reconcile(
    bus: Bus,
) -> None:
    # An update replaces a stream's whole config: the owner must send back what it found.
    info = await bus.js.stream_info(EVENTS_STREAM)
    await bus.js.update_stream(
        replace(
            info.config,
            allow_direct=True,
            metadata={**(info.config.metadata or {}), "team": "search"},
        )
    )

    await ensure_topology(
        bus.js, declare(TopologyOptions(events_max_age=400 * DAY)), owner="recorder"
    )

    after = (await bus.js.stream_info(EVENTS_STREAM)).config
    assert after.max_age == 400 * DAY
    assert after.allow_direct is True
    assert (after.metadata or {}).get("team") == "search"


async def _as_the_release_before_left_it(
    bus: Bus, stream: str, *, max_msgs: int = -1, max_bytes: int = -1
) -> None:
    """``stream`` as the release before left it (discard old, its revision's stamp), with
    limits an operator set (`nats stream edit`)."""
    info = await bus.js.stream_info(stream)
    stamp = {**(info.config.metadata or {}), REVISION_KEY: "1"}
    await bus.js.update_stream(
        replace(
            info.config,
            discard=DiscardPolicy.OLD,
            metadata=stamp,
            max_msgs=max_msgs,
            max_bytes=max_bytes,
        )
    )


async def _without_limits(bus: Bus, stream: str) -> None:
    """The ``clean`` fixture keeps what an operator set: no limit may outlive a test."""
    info = await bus.js.stream_info(stream)
    await bus.js.update_stream(replace(info.config, max_msgs=-1, max_bytes=-1))


SCHEDULING = [
    (EVENTS_STREAM, "recorder", PAGE_DISCOVERED),
    (WORK_STREAM, "fetcher", FETCH_DEFERRED),
]


@pytest.mark.usefixtures("clean")
@pytest.mark.parametrize(("stream", "owner", "subject"), SCHEDULING, ids=[s[0] for s in SCHEDULING])
async def test_a_limit_that_would_delete_a_streams_oldest_schedules_is_lifted_by_its_owner(
    bus: Bus, caplog: pytest.LogCaptureFixture, stream: str, owner: str, subject: str
) -> None:
    # A stream that holds schedules must discard old (nats-server refuses new beside
    # them): at a limit of messages or bytes it would delete its oldest, the pending
    # re-crawls, polls and deferred fetches among them, without a word to anyone. Its
    # owner lifts such a limit, and says so; a full store refuses writes instead.
    caplog.set_level("WARNING", logger="trove_schema.topology")
    await _as_the_release_before_left_it(bus, stream, max_msgs=20, max_bytes=16 * 1024)
    try:
        await ensure_topology(bus.js, declare(), owner=owner)
        first = (await bus.js.publish(subject, os.urandom(512))).seq
        for _ in range(59):
            await bus.js.publish(subject, os.urandom(512))
        after = await bus.js.stream_info(stream)
    finally:
        await _without_limits(bus, stream)
    assert (after.state.first_seq, after.state.messages) == (first, 60), "the oldest deleted"
    assert (after.config.max_msgs, after.config.max_bytes) == (-1, -1)
    lifted = [r.getMessage() for r in caplog.records if "lifted" in r.getMessage()]
    assert [m.split(":")[0] for m in lifted] == [stream, stream], lifted


@pytest.mark.usefixtures("clean")
async def test_a_dead_letter_stream_at_its_limit_refuses_a_park_instead_of_deleting_the_oldest(
    bus: Bus,
) -> None:
    # Parked messages are kept until an operator acts: at a limit an operator set, the
    # oldest must not make room for the newest. The park is refused (503, broker
    # trouble), and the consumer hands the message back to its own stream meanwhile.
    subject = f"{DEAD_PREFIX}.test"
    await _as_the_release_before_left_it(bus, DEAD_STREAM, max_msgs=3)
    try:
        await ensure_topology(bus.js, declare(), owner="recorder")
        first = (await bus.js.publish(subject, b"parked 0")).seq
        for n in (1, 2):
            await bus.js.publish(subject, f"parked {n}".encode())
        with pytest.raises(APIError) as refused:
            await bus.js.publish(subject, b"one more")
        after = await bus.js.stream_info(DEAD_STREAM)
    finally:
        await _without_limits(bus, DEAD_STREAM)
    assert broker_trouble(refused.value), refused.value
    assert (after.state.first_seq, after.state.messages) == (first, 3)
    assert after.config.discard == DiscardPolicy.NEW
    assert after.config.max_msgs == 3  # the operator's limit stands


async def test_a_deny_flag_an_operator_set_survives_the_owners_reconcile(bus: Bus) -> None:
    # A stream of its own: the server never lifts a deny flag, so no other test may
    # meet one on a stream of the crawl.
    name = "TROVE_TEST_DENY"
    config = StreamConfig(name=name, subjects=["trove.test.deny.>"], max_age=3600.0)
    with contextlib.suppress(NotFoundError):
        await bus.js.delete_stream(name)
    await bus.js.add_stream(config)
    try:
        info = await bus.js.stream_info(name)
        await bus.js.update_stream(
            replace(info.config, deny_delete=True, deny_purge=True, max_msgs_per_subject=5)
        )
        # The owner wants another age: its update must not send the flags back off,
        # which the server refuses (the owner would never start).
        await _ensure_stream(bus.js, replace(config, max_age=7200.0), reconcile=True)
        after = (await bus.js.stream_info(name)).config
    finally:
        await bus.js.delete_stream(name)
    assert after.max_age == 7200.0
    assert (after.deny_delete, after.deny_purge, after.max_msgs_per_subject) == (True, True, 5)


@pytest.mark.usefixtures("clean")
async def test_a_retention_that_would_drop_a_waiting_schedule_is_refused_not_applied(
    bus: Bus,
) -> None:
    before = (await bus.js.stream_info(EVENTS_STREAM)).config.max_age or 400 * DAY
    # An unfollow's tombstone on a poll's schedule subject is no schedule: the record
    # may be shortened past it.
    await bus.js.publish("trove.schedules.timeline.gone", b"", headers={"Nats-Rollup": "sub"})
    shorter = before - DAY
    await ensure_topology(
        bus.js, declare(TopologyOptions(events_max_age=shorter)), owner="recorder"
    )
    assert (await bus.js.stream_info(EVENTS_STREAM)).config.max_age == shorter
    # A page's re-crawl, due in a month: a record kept a week would drop it before then.
    recrawl = CrawlRequested(
        url="https://a.example/p",
        domain="a.example",
        scope=Scope(value="a.example"),
        reason=RequestReason.RECRAWL,
    )
    await bus.publish_at(recrawl, datetime.now(UTC) + timedelta(days=30))
    week = declare(TopologyOptions(events_max_age=7 * DAY))
    with pytest.raises(RetentionRefused, match="would drop a schedule"):
        await ensure_topology(bus.js, week, owner="recorder")
    assert (await bus.js.stream_info(EVENTS_STREAM)).config.max_age == shorter
    # Kept long enough for it, the shorter record is applied.
    enough = declare(TopologyOptions(events_max_age=31 * DAY))
    await ensure_topology(bus.js, enough, owner="recorder")
    assert (await bus.js.stream_info(EVENTS_STREAM)).config.max_age == 31 * DAY


@pytest.mark.usefixtures("clean")
async def test_a_long_wait_among_the_newest_schedules_refuses_a_shorter_retention(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The older schedules wait a day; the newest, published under a longer setting that
    # a rollback undoes, a month. Fewer are looked at here than a stream holds.
    monkeypatch.setattr(topology, "SCHEDULES_CHECKED", 5)

    def recrawl(n: int) -> CrawlRequested:
        return CrawlRequested(
            url=f"https://a.example/{n}",
            domain="a.example",
            scope=Scope(value="a.example"),
            reason=RequestReason.RECRAWL,
        )

    for n in range(40):
        await bus.publish_at(recrawl(n), datetime.now(UTC) + timedelta(days=1))
    await bus.publish_at(recrawl(40), datetime.now(UTC) + timedelta(days=30))
    before = (await bus.js.stream_info(EVENTS_STREAM)).config.max_age

    with pytest.raises(RetentionRefused, match="would drop a schedule"):
        await ensure_topology(
            bus.js, declare(TopologyOptions(events_max_age=7 * DAY)), owner="recorder"
        )
    assert (await bus.js.stream_info(EVENTS_STREAM)).config.max_age == before


def _crawled(n: int, links: int = 100) -> list[bytes]:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return [
        CrawlCompleted(
            url=f"https://blog{i % 20}.example/posts/{i}.html",
            domain=f"blog{i % 20}.example",
            scope=Scope(value=f"blog{i % 20}.example"),
            request_id=f"00000000-0000-0000-0000-{i:012d}",
            outcome=CrawlOutcome.SUCCESS,
            status_code=200,
            started_at=at,
            completed_at=at,
            title=f"Notes on gardening, part {i}",
            keywords=("garden", "tomato", "compost", "seeds"),
            links=tuple(
                Link(url=f"https://blog{(i + k) % 20}.example/posts/{(i * 7 + k) % n}.html")
                for k in range(links)
            ),
        ).to_wire()
        for i in range(n)
    ]


def _blocks_bytes(store: Path) -> int:
    blocks = [p for p in store.rglob("*.blk") if EVENTS_STREAM in p.parts]
    return sum(p.stat().st_size for p in blocks)


async def test_a_record_written_uncompressed_is_read_whole_after_an_upgrade_compresses_it(
    tmp_path: Path,
) -> None:
    """An older release's record, then this one's recorder, then nats-server restarted.

    The server takes a stream's new compression for the blocks it seals after its next
    start (docs/deploy.md), in the background; the blocks already written stay as they
    are, and both kinds read.
    """
    batch = _crawled(1500)  # ~13 MB: a sealed 8 MB block and part of the next
    config = NatsConfig(store_dir=tmp_path / "nats")

    async def publish(url: str) -> None:
        nc = await nats.connect(url)
        js = nc.jetstream()
        for start in range(0, len(batch), 250):
            await asyncio.gather(
                *(js.publish(CRAWL_COMPLETED, p) for p in batch[start : start + 250])
            )
        await nc.close()

    async def written_since_restart() -> int:
        return _blocks_bytes(config.store_dir) - before

    server = EmbeddedNats(config).start()
    try:
        nc = await nats.connect(server.url)
        await ensure_topology(nc.jetstream(), declare(TopologyOptions(events_compression=False)))
        await publish(server.url)
        before = _blocks_bytes(config.store_dir)
        await ensure_topology(nc.jetstream(), declare(), owner="recorder")
        await nc.close()
        server.stop()
        server = EmbeddedNats(config).start()
        await publish(server.url)

        # The same events again take a fraction of the room once their blocks are sealed.
        await eventually(
            written_since_restart,
            until=lambda grown: grown < 0.5 * before,
            timeout=30,
            what="the blocks sealed after the restart compressed",
        )
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        info = await js.stream_info(EVENTS_STREAM)
        assert info.config.compression == StoreCompression.S2
        assert info.state.messages == 2 * len(batch)
        for seq in (1, len(batch), len(batch) + 1, 2 * len(batch)):
            data = (await js.get_msg(EVENTS_STREAM, seq)).data
            assert data is not None
            event = decode_event(data)
            assert isinstance(event, CrawlCompleted)
            assert len(event.links) == 100
        await nc.close()
    finally:
        server.stop()


@pytest.mark.usefixtures("clean")
async def test_the_cli_creates_a_missing_stream_with_the_declared_options(bus: Bus) -> None:
    await bus.js.delete_stream(DEAD_STREAM)
    await ensure_topology(bus.js, declare(), owner="cli")
    assert (await bus.js.stream_info(DEAD_STREAM)).config.subjects == ["trove.dead.>"]


def test_every_stream_consumer_and_bucket_has_an_owning_service() -> None:
    top = declare()
    names = [s.name for s in top.streams] + [c.durable_name for _, c in top.consumers]
    names += [b.bucket for b in top.buckets]
    unowned = [name for name in names if OWNERS.get(str(name)) not in SERVICES]
    assert unowned == []


@pytest.mark.usefixtures("clean")
async def test_a_domains_bucket_kept_for_ever_takes_the_fetchers_ttl_and_keeps_its_hosts(
    bus: Bus,
) -> None:
    # A bucket from an older release keeps every host for ever; the fetcher's start sets
    # its TTL, and the records in it stay (each ages from its own last write).
    stream = f"KV_{DOMAINS_BUCKET}"
    info = await bus.js.stream_info(stream)
    await bus.js.update_stream(replace(info.config, max_age=0.0))
    domains = await bus.js.key_value(DOMAINS_BUCKET)
    await domains.create("old.example", b"{}")

    wanted = TopologyOptions(domains_ttl=30 * DAY)
    await ensure_topology(bus.js, declare(wanted), owner="discovery")
    assert (await bus.js.stream_info(stream)).config.max_age == 0.0  # not discovery's
    await ensure_topology(bus.js, declare(wanted), owner="fetcher")

    assert (await bus.js.stream_info(stream)).config.max_age == 30 * DAY
    assert (await domains.get("old.example")).value == b"{}"


@pytest.mark.usefixtures("clean")
async def test_a_pod_of_an_older_release_leaves_a_newer_releases_bucket_as_it_is(
    bus: Bus,
) -> None:
    # The newer release keeps hosts longer; a pod of this release restarts beside it (a
    # rolling update, a rollback) and would shorten the age back, which drops at once
    # every record older than it: a host's pause, its learned policy.
    stream = f"KV_{DOMAINS_BUCKET}"
    made = (await bus.js.stream_info(stream)).config
    assert (made.metadata or {}).get(REVISION_KEY) == str(REVISION)  # stamped when made
    longer = made.max_age * 6 if made.max_age else 180 * DAY
    try:
        await bus.js.update_stream(
            replace(made, max_age=longer, metadata={REVISION_KEY: str(REVISION + 1)})
        )

        await ensure_topology(bus.js, declare(), owner="fetcher")

        assert (await bus.js.stream_info(stream)).config.max_age == longer
        # One this release or an older one wrote is reconciled, and stamped with this one.
        await bus.js.update_stream(replace(made, max_age=longer, metadata={}))
        await ensure_topology(bus.js, declare(), owner="fetcher")
        after = (await bus.js.stream_info(stream)).config
        assert after.max_age == made.max_age
        assert (after.metadata or {}).get(REVISION_KEY) == str(REVISION)
    finally:
        await bus.js.update_stream(replace(made, metadata={REVISION_KEY: str(REVISION)}))


class _LookedBeforeItWasMade(JetStreamContext):
    """A real JetStream context whose caller looked for ``bucket`` a moment before
    another pod made it (and its owner stamped it): its first look finds none."""

    def __init__(self, bus: Bus, bucket: str) -> None:
        super().__init__(bus.nc, timeout=10.0)
        self._bucket: str | None = bucket

    async def key_value(self, bucket: str) -> KeyValue:
        if bucket == self._bucket:
            self._bucket = None
            raise BucketNotFoundError
        return await super().key_value(bucket)


@pytest.mark.usefixtures("clean")
async def test_a_bucket_made_and_stamped_by_another_pod_meanwhile_is_taken_as_made(
    bus: Bus,
) -> None:
    # The server refuses the bare create (its config differs by the stamp): a pod, or
    # the CLI, that lost that race goes on with the bucket as it is.
    top = declare()
    (bucket,) = [b for b in top.buckets if b.bucket == DOMAINS_BUCKET]
    with pytest.raises(APIError) as refused:
        await bus.js.create_key_value(bucket)
    assert refused.value.err_code == 10058

    for owner in ("cli", "fetcher"):
        await ensure_topology(_LookedBeforeItWasMade(bus, DOMAINS_BUCKET), top, owner=owner)

    stamped = (await bus.js.stream_info(f"KV_{DOMAINS_BUCKET}")).config.metadata or {}
    assert stamped.get(REVISION_KEY) == str(REVISION)


@pytest.mark.usefixtures("clean")
async def test_the_seen_bucket_takes_a_ttl_shorter_than_its_duplicate_window(bus: Bus) -> None:
    # A scaled-down crawl cycle: the bucket was made with the default (days) first.
    await ensure_topology(bus.js, declare(TopologyOptions(seen_ttl=8.0)), owner="discovery")
    assert (await bus.js.stream_info(f"KV_{SEEN_BUCKET}")).config.max_age == 8.0


@pytest.mark.usefixtures("clean")
async def test_a_retention_shorter_than_the_duplicate_window_is_accepted(bus: Bus) -> None:
    """The server refuses a duplicate window longer than a stream keeps its messages."""
    short = TopologyOptions(events_max_age=300.0, work_max_age=60.0, dead_max_age=90.0)
    await ensure_topology(bus.js, declare(short))
    events = await bus.js.stream_info(EVENTS_STREAM)
    work = await bus.js.stream_info(WORK_STREAM)
    assert events.config.max_age == 300.0
    assert events.config.duplicate_window == 300.0
    assert work.config.duplicate_window == 60.0
    await ensure_topology(bus.js, declare())  # and back to the defaults: kept for ever
    assert (await bus.js.stream_info(EVENTS_STREAM)).config.max_age == 0.0
