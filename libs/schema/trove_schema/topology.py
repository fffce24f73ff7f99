"""Every JetStream stream, subject, consumer and KV bucket Trove uses, declared in one place.

``ensure_topology`` creates what is missing and reconciles what its caller owns (a
durable consumer keeps its old config when a client merely re-subscribes, so it is
updated here, explicitly). Every service calls it at start; it is idempotent and safe
to run from many pods at once. Each stream, consumer and bucket has one owner
(``OWNERS``): only the owner's settings shape it, so a command or another service
started with other options (one replica, a shorter retention) never changes it.

Subjects
    trove.seeds                      operator input (raw URL, lines, or JSON); stream TROVE_SEEDS
    trove.follow, trove.unfollow     operator input: instances to (un)follow; stream TROVE_SEEDS
    trove.events.seed.rejected       SeedRejected
    trove.events.page.discovered     PageDiscovered
    trove.events.crawl.requested     CrawlRequested (retries and re-crawls, often scheduled)
    trove.events.crawl.completed     CrawlCompleted
    trove.events.instance.followed   InstanceFollowed
    trove.events.instance.unfollowed InstanceUnfollowed
    trove.events.timeline.requested  TimelinePollRequested (fetcher work, usually scheduled)
    trove.events.timeline.polled     TimelinePolled
    trove.schedules.timeline.<hash>  the one pending poll of a followed timeline
    trove.schedules.page.<hash>      the one pending CrawlRequested of a page (re-crawl or retry),
                                     a NATS scheduled message: a newer one replaces it
    trove.work.fetch                 fetch work deferred to a domain's next free slot
    trove.work.schedules.<id>        the schedules behind trove.work.fetch
    trove.dead.<consumer>            poison messages, parked with the reason
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StoreCompression,
    StreamConfig,
)
from nats.js.errors import APIError, BucketNotFoundError, NotFoundError

from trove_schema.errors import RetentionRefused, TopologyError

log = logging.getLogger(__name__)

SEEDS_SUBJECT = "trove.seeds"
FOLLOW_SUBJECT = "trove.follow"
UNFOLLOW_SUBJECT = "trove.unfollow"
EVENTS_PREFIX = "trove.events"
SEED_REJECTED = "trove.events.seed.rejected"
PAGE_DISCOVERED = "trove.events.page.discovered"
CRAWL_REQUESTED = "trove.events.crawl.requested"
CRAWL_COMPLETED = "trove.events.crawl.completed"
INSTANCE_FOLLOWED = "trove.events.instance.followed"
INSTANCE_UNFOLLOWED = "trove.events.instance.unfollowed"
TIMELINE_REQUESTED = "trove.events.timeline.requested"
TIMELINE_POLLED = "trove.events.timeline.polled"
EVENT_SCHEDULES_PREFIX = "trove.schedules"
FETCH_DEFERRED = "trove.work.fetch"
WORK_SCHEDULES_PREFIX = "trove.work.schedules"
DEAD_PREFIX = "trove.dead"

SEEDS_STREAM = "TROVE_SEEDS"
EVENTS_STREAM = "TROVE_EVENTS"
WORK_STREAM = "TROVE_WORK"
DEAD_STREAM = "TROVE_DEAD"

DISCOVERY_SEEDS = "discovery-seeds"
DISCOVERY_LINKS = "discovery-links"
DISCOVERY_FOLLOWS = "discovery-follows"
FETCHER = "fetcher"
FETCHER_DEFERRED = "fetcher-deferred"
RECORDER = "recorder"

DOMAINS_BUCKET = "trove_domains"
ROBOTS_BUCKET = "trove_robots"
SEEN_BUCKET = "trove_seen"
URL_RULES_BUCKET = "trove_url_rules"
FOLLOWS_BUCKET = "trove_follows"
EXCLUSIONS_BUCKET = "trove_exclusions"

DAY = 86_400.0

#: A host that is a valid key of ``trove_domains`` as it is: dot-separated labels, none
#: empty (a leading dot, or two in a row, is refused by the client or the server).
_PLAIN_DOMAIN_KEY = re.compile(r"^[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*$")


def domain_key(domain: str) -> str:
    """A host's key in ``trove_domains``: the host itself, or a hash of it when it would
    not make a valid key (a redirect may name any host a server writes)."""
    if len(domain) <= 200 and _PLAIN_DOMAIN_KEY.match(domain):
        return domain
    return "h." + hashlib.sha1(domain.encode(), usedforsecurity=False).hexdigest()


@dataclass(frozen=True, kw_only=True)
class TopologyOptions:
    """What an operator may tune about the topology (replicas, retention)."""

    replicas: int = 1
    #: How long the event record is kept; 0 keeps it forever (the default: it is the record).
    events_max_age: float = 0.0
    #: Whether the event record's finished blocks are S2-compressed on disk (a record
    #: kept for ever is the largest thing Trove stores; JSON events shrink several-fold).
    events_compression: bool = True
    #: How long deferred fetch work is kept in TROVE_WORK; 0 (the default) until a
    #: fetcher has handled it: the fetchers purge what they acked.
    work_max_age: float = 0.0
    seeds_max_age: float = 30 * DAY
    #: Parked messages; 0 keeps them until an operator re-drives or drops them.
    dead_max_age: float = 0.0
    max_message_bytes: int = 1 << 20
    robots_ttl: float = DAY
    #: How long a host's record in ``trove_domains`` outlives the last request to it
    #: (``FetcherSettings.host_record_ttl_seconds``); 0 keeps it for ever.
    domains_ttl: float = 180 * DAY
    #: How long a URL stays seen after its discovery or its last re-crawl request
    #: (``DiscoverySettings.seen_ttl``: longer than the longest re-crawl interval, so a page
    #: being re-crawled is never discovered a second time).
    seen_ttl: float = 60 * DAY
    #: How long a host's URL alias record outlives its last write
    #: (``DiscoverySettings.url_rules_ttl_seconds``); 0 keeps it for ever.
    url_rules_ttl: float = 180 * DAY
    #: How many messages a consumer hands out before any is acked (per consumer, all pods).
    fetcher_max_ack_pending: int = 2000
    #: How long a fetch may hold a message before JetStream redelivers it.
    fetcher_ack_wait: float = 90.0

    @classmethod
    def from_settings(cls, settings: Any, **extra: Any) -> TopologyOptions:
        """The options every service shares, from its settings (``CommonSettings``)."""
        return cls(
            replicas=settings.replicas,
            events_max_age=settings.events_max_age_seconds,
            events_compression=settings.events_compression == "s2",
            work_max_age=settings.work_max_age_seconds,
            seeds_max_age=settings.seeds_max_age_seconds,
            dead_max_age=settings.dead_max_age_seconds,
            max_message_bytes=settings.max_message_bytes,
            **extra,
        )


@dataclass(frozen=True)
class Topology:
    streams: tuple[StreamConfig, ...]
    consumers: tuple[tuple[str, ConsumerConfig], ...]
    buckets: tuple[KeyValueConfig, ...]
    options: TopologyOptions = field(default_factory=TopologyOptions)

    def consumer(self, name: str) -> tuple[str, ConsumerConfig]:
        for stream, config in self.consumers:
            if config.durable_name == name:
                return stream, config
        raise KeyError(name)


#: The shape of the streams, durables and buckets this release declares. A release
#: that changes what ``declare`` gives (a durable's subjects, a stream's, a bucket's
#: age, a setting's default) raises it (``tests/schema/test_topology.py`` holds digests
#: of the shape that fail until it does). Each stream, durable and bucket carries the
#: revision that last wrote it, in its metadata, and an owner reconciles only what a
#: release no newer than its own wrote: a pod of the release before, in a rolling
#: update's or a rollback's mixed minutes, would otherwise narrow a durable's subjects
#: back, and the messages of the dropped subject would be passed over for good rather
#: than parked where ``trove dead`` shows them.
REVISION = 3
REVISION_KEY = "trove-topology"


#: No limit on a stream's messages or bytes (the server's -1; nats-py's default is None,
#: so reconciling sends it): a stream of schedules must discard old, and would delete its
#: oldest messages at a limit.
NO_LIMIT: dict[str, Any] = {"max_msgs": -1, "max_bytes": -1}


def _window(wanted: float, max_age: float) -> float:
    """A duplicate window no longer than the stream keeps messages (the server insists)."""
    return min(wanted, max_age) if max_age else wanted


def declare(options: TopologyOptions | None = None) -> Topology:
    opts = options or TopologyOptions()
    storage = StorageType.FILE
    streams = (
        # Seeds are stored as they come, so a `nats pub` while discovery is down loses
        # nothing. no_ack keeps JetStream from answering a `nats req`: discovery does.
        # Nothing would tell a sender that a message was too large to store, so the
        # stream takes what the server takes (its max_payload); discovery reads at most
        # 10,000 URLs (100 instances) of a message. 64 MiB is the most a max_payload
        # may be; not -1, nats-py's default, which reconciling leaves as it is
        # (``_managed``) on a stream made with a lower limit. Its discard policy is
        # left old (nats-py's default, so an operator's choice stands): a write it
        # refused would be lost without a word (no_ack answers no `nats pub`), and
        # the oldest seeds, what a limit deletes, were read long ago.
        StreamConfig(
            name=SEEDS_STREAM,
            subjects=[SEEDS_SUBJECT, FOLLOW_SUBJECT, UNFOLLOW_SUBJECT],
            storage=storage,
            num_replicas=opts.replicas,
            retention=RetentionPolicy.LIMITS,
            max_age=opts.seeds_max_age,
            max_msg_size=64 << 20,
            no_ack=True,
            duplicate_window=_window(120.0, opts.seeds_max_age),
        ),
        StreamConfig(
            name=EVENTS_STREAM,
            description="Trove's event record: the tables are projections of it.",
            subjects=[f"{EVENTS_PREFIX}.>", f"{EVENT_SCHEDULES_PREFIX}.>"],
            storage=storage,
            num_replicas=opts.replicas,
            retention=RetentionPolicy.LIMITS,
            max_age=opts.events_max_age,
            max_msg_size=opts.max_message_bytes,
            duplicate_window=_window(600.0, opts.events_max_age),
            compression=StoreCompression.S2 if opts.events_compression else StoreCompression.NONE,
            allow_msg_schedules=True,
            # The server turns rollups on for schedules; saying so keeps reconcile quiet.
            allow_rollup_hdrs=True,
            # nats-server refuses discard new beside schedules, so a limit on the
            # messages or bytes, once reached, would delete the oldest: pending re-crawls
            # and polls, events not yet projected. The owner lifts one an operator set
            # (``_say_lifted_limits``): what caps the record is the server's store,
            # which refuses writes when full (503), and the services wait.
            discard=DiscardPolicy.OLD,
            **NO_LIMIT,
        ),
        StreamConfig(
            name=WORK_STREAM,
            description="Fetch work deferred to a domain's next free slot.",
            subjects=[FETCH_DEFERRED, f"{WORK_SCHEDULES_PREFIX}.>"],
            storage=storage,
            num_replicas=opts.replicas,
            # Kept until handled, not for an age (a fetcher away longer than it would lose
            # the work that came due meanwhile): the fetchers purge the work they acked
            # (``trove_fetcher.deferral.purge_handled``). nats-server does not change a
            # stream's retention to a work queue's in place.
            retention=RetentionPolicy.LIMITS,
            max_age=opts.work_max_age,
            max_msg_size=opts.max_message_bytes,
            # JetStream refuses a duplicate window longer than the stream's max_age.
            duplicate_window=_window(120.0, opts.work_max_age),
            allow_msg_schedules=True,
            allow_rollup_hdrs=True,
            # As the record's: at a limit the oldest deferred fetches would vanish.
            **NO_LIMIT,
        ),
        StreamConfig(
            name=DEAD_STREAM,
            description="Poison messages parked with the reason, for an operator to inspect.",
            subjects=[f"{DEAD_PREFIX}.>"],
            storage=storage,
            num_replicas=opts.replicas,
            retention=RetentionPolicy.LIMITS,
            max_age=opts.dead_max_age,
            duplicate_window=_window(120.0, opts.dead_max_age),
            # At a limit an operator set, the oldest parked messages (kept until an
            # operator acts) are not deleted for newer ones: a park refused (503) hands
            # its message back to its own stream, as when the broker is away
            # (``Consumer._park``). Not nats-py's default, so reconciled onto a stream
            # made before.
            discard=DiscardPolicy.NEW,
        ),
    )

    def pull(name: str, *subjects: str, **extra: Any) -> ConsumerConfig:
        config = ConsumerConfig(
            durable_name=name,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=30.0,
            max_deliver=-1,
            max_ack_pending=1000,
            max_waiting=512,
        )
        if len(subjects) == 1:
            config = replace(config, filter_subject=subjects[0])
        else:
            config = replace(config, filter_subjects=list(subjects))
        return replace(config, **extra)

    consumers = (
        (SEEDS_STREAM, pull(DISCOVERY_SEEDS, SEEDS_SUBJECT)),
        # One command at a time across replicas: an unfollow sent after a follow is
        # applied after it.
        (
            SEEDS_STREAM,
            pull(DISCOVERY_FOLLOWS, FOLLOW_SUBJECT, UNFOLLOW_SUBJECT, max_ack_pending=1),
        ),
        (EVENTS_STREAM, pull(DISCOVERY_LINKS, CRAWL_COMPLETED, TIMELINE_POLLED)),
        (
            EVENTS_STREAM,
            pull(
                FETCHER,
                PAGE_DISCOVERED,
                CRAWL_REQUESTED,
                TIMELINE_REQUESTED,
                ack_wait=opts.fetcher_ack_wait,
                max_ack_pending=opts.fetcher_max_ack_pending,
            ),
        ),
        (
            WORK_STREAM,
            pull(
                FETCHER_DEFERRED,
                FETCH_DEFERRED,
                ack_wait=opts.fetcher_ack_wait,
                max_ack_pending=opts.fetcher_max_ack_pending,
            ),
        ),
        (
            EVENTS_STREAM,
            pull(
                RECORDER,
                SEED_REJECTED,
                PAGE_DISCOVERED,
                CRAWL_REQUESTED,
                CRAWL_COMPLETED,
                INSTANCE_FOLLOWED,
                INSTANCE_UNFOLLOWED,
                TIMELINE_POLLED,
                max_ack_pending=10_000,
            ),
        ),
    )
    # direct=True: a key is read with a direct get (a plain request answered by the
    # stream, value in the body) instead of the JSON API (base64, headers parsed by
    # email.parser): ~30% less nats-server CPU a read, measured. On a replicated bucket a
    # follower may answer, a little behind; every write that decides (a lease, a budget,
    # a URL's first claim, a follow, a rule) is a compare-and-set or a create, which a
    # stale read can only make fail and retry, never make wrong. A robots.txt record and
    # a seen key's mark are plain puts, the last writer's as it should be.
    buckets = (
        KeyValueConfig(
            bucket=DOMAINS_BUCKET,
            description="Per-domain politeness: leases, next free slot, backoff.",
            direct=True,
            history=1,
            # Every request writes its host's record: only hosts left alone this long
            # go, so the bucket holds the hosts of the crawl's recent months, not all
            # it ever met.
            ttl=opts.domains_ttl,
            storage=storage,
            replicas=opts.replicas,
        ),
        KeyValueConfig(
            bucket=ROBOTS_BUCKET,
            description="Parsed robots.txt per origin, shared by every fetcher pod.",
            direct=True,
            history=1,
            ttl=opts.robots_ttl,
            storage=storage,
            replicas=opts.replicas,
        ),
        KeyValueConfig(
            bucket=URL_RULES_BUCKET,
            description="Per-host URL spellings learned to name the same page (aliases).",
            direct=True,
            history=1,
            ttl=opts.url_rules_ttl,
            storage=storage,
            replicas=opts.replicas,
        ),
        KeyValueConfig(
            bucket=FOLLOWS_BUCKET,
            description="Followed fediverse instances: each timeline's follow and last poll.",
            direct=True,
            history=1,
            storage=storage,
            replicas=opts.replicas,
        ),
        KeyValueConfig(
            bucket=EXCLUSIONS_BUCKET,
            description="The operator's shared list of excluded hosts (key hosts).",
            direct=True,
            # Earlier lists stay readable (`nats kv history`): who was taken off, and when.
            history=16,
            storage=storage,
            replicas=opts.replicas,
        ),
        KeyValueConfig(
            bucket=SEEN_BUCKET,
            description="Canonical URLs discovered this crawl cycle (the dedup set).",
            direct=True,
            history=1,
            ttl=opts.seen_ttl,
            storage=storage,
            replicas=opts.replicas,
        ),
    )
    stamp = {REVISION_KEY: str(REVISION)}
    return Topology(
        streams=tuple(replace(config, metadata=stamp) for config in streams),
        consumers=tuple((stream, replace(config, metadata=stamp)) for stream, config in consumers),
        buckets=buckets,
        options=opts,
    )


#: Which service's settings shape each stream, consumer and bucket: only the owner
#: reconciles it, so services (and the CLI, which owns nothing) started with other
#: options do not undo the deployment's. A stream belongs to the service that decides
#: what it must keep: the recorder the record (TROVE_EVENTS, its projections are
#: rebuilt from it) and the parked messages it is asked to re-drive (TROVE_DEAD);
#: discovery the seeds it reads; the fetcher the work it defers (TROVE_WORK).
OWNERS = {
    SEEDS_STREAM: "discovery",
    EVENTS_STREAM: "recorder",
    DEAD_STREAM: "recorder",
    WORK_STREAM: "fetcher",
    DISCOVERY_SEEDS: "discovery",
    DISCOVERY_LINKS: "discovery",
    DISCOVERY_FOLLOWS: "discovery",
    URL_RULES_BUCKET: "discovery",
    FOLLOWS_BUCKET: "discovery",
    EXCLUSIONS_BUCKET: "discovery",
    SEEN_BUCKET: "discovery",
    FETCHER: "fetcher",
    FETCHER_DEFERRED: "fetcher",
    DOMAINS_BUCKET: "fetcher",
    ROBOTS_BUCKET: "fetcher",
    RECORDER: "recorder",
}


async def ensure_topology(
    js: JetStreamContext, topology: Topology | None = None, *, owner: str | None = None
) -> Topology:
    """Create what is missing; reconcile what ``owner`` owns (``OWNERS``). Idempotent.

    An owner that owns nothing (``"cli"``) only creates. ``owner=None`` reconciles
    everything to ``topology``: for resetting a sandbox or test stack, never a deployment.
    """
    top = topology or declare()

    def mine(name: str) -> bool:
        return owner is None or OWNERS.get(name) == owner

    part = "the JetStream topology"
    try:
        for config in top.streams:
            assert config.name is not None
            part = f"stream {config.name}"
            await _ensure_stream(js, config, reconcile=mine(config.name))
        for bucket in top.buckets:
            part = f"bucket {bucket.bucket}"
            await _ensure_bucket(js, bucket, reconcile=mine(bucket.bucket))
        for stream, consumer in top.consumers:
            assert consumer.durable_name is not None
            part = f"consumer {consumer.durable_name} on {stream}"
            await _ensure_consumer(js, stream, consumer, reconcile=mine(consumer.durable_name))
    except (TimeoutError, APIError) as exc:
        # The cause says whether a start waits (``service.infrastructure_away``): JetStream
        # away or busy passes; a refusal (subjects overlapping another stream's, an
        # account that requires max_bytes) is met at every try, and ends the start with
        # its words.
        raise TopologyError(f"could not create or reconcile {part}: {exc}") from exc
    return top


async def _ensure_stream(js: JetStreamContext, config: StreamConfig, *, reconcile: bool) -> None:
    assert config.name is not None
    try:
        info = await js.stream_info(config.name)
    except NotFoundError:
        try:
            await js.add_stream(config)
            log.info("created stream %s", config.name)
            return
        except APIError as exc:
            if exc.err_code != 10058:  # created by another pod meanwhile
                raise
            info = await js.stream_info(config.name)
    if reconcile and _differs(info.config, config) and _not_newer(info.config, config.name):
        await _keeps_schedules(js, info.config, config, info.state.last_seq)
        _say_lifted_limits(info.config, config)
        await js.update_stream(_merged(info.config, config))
        log.info("reconciled stream %s", config.name)


def _say_lifted_limits(current: StreamConfig, wanted: StreamConfig) -> None:
    """Log each limit an operator set (`nats stream edit --max-bytes`) that the update
    lifts (``NO_LIMIT``), and why: the deployment's setting changes under it."""
    for name in NO_LIMIT:
        have = getattr(current, name) or -1
        if getattr(wanted, name) == -1 and have > 0:
            log.warning(
                "%s: %s=%d lifted: at that limit the stream would delete its oldest "
                "messages (pending schedules among them; discard new is refused beside "
                "schedules). Size the volume, or the server's max_file_store, instead: "
                "a full store refuses writes, which Trove waits on",
                wanted.name,
                name,
                have,
            )


#: Schedules ``_keeps_schedules`` looks at: the oldest, and as many of the newest.
SCHEDULES_CHECKED = 1_000
#: The subjects of each stream whose messages wait to fire: a retention shorter than
#: their wait drops them, and what they carry (a re-crawl, a poll, a deferred fetch) is
#: lost with them.
_SCHEDULES = {
    EVENTS_STREAM: f"{EVENT_SCHEDULES_PREFIX}.>",
    WORK_STREAM: f"{WORK_SCHEDULES_PREFIX}.>",
}


async def _keeps_schedules(
    js: JetStreamContext, current: StreamConfig, wanted: StreamConfig, last_seq: int = 0
) -> None:
    """Raise ``RetentionRefused`` when ``wanted`` shortens the stream's retention so that
    a schedule it holds would be dropped: at once (older than the new retention), or
    before it fires (due later than its publication plus the new retention). The
    oldest ``SCHEDULES_CHECKED`` schedules are looked at, the most at risk under one
    setting, and the newest as many: after a rollback of a longer setting, the ones it
    let wait longest are the newest. An unfollow's tombstone on a schedule subject (no
    ``Nats-Schedule``) is none."""
    name = wanted.name or ""
    subject = _SCHEDULES.get(name)
    have, want = current.max_age or 0.0, wanted.max_age or 0.0
    if subject is None or not want or (have and want >= have):
        return
    await _keeps_schedules_from(js, name, subject, 1, SCHEDULES_CHECKED, have, want)
    # The newest: those of the stream's last messages, of which schedules are most.
    window = 4 * SCHEDULES_CHECKED
    if last_seq > window:
        start = last_seq - window + 1
        await _keeps_schedules_from(js, name, subject, start, window, have, want)


async def _keeps_schedules_from(
    js: JetStreamContext,
    name: str,
    subject: str,
    seq: int,
    most: int,
    have: float,
    want: float,
) -> None:
    """``_keeps_schedules`` over ``most`` schedules from ``seq`` on."""
    now = datetime.now(UTC)
    for _ in range(most):
        try:
            msg = await js.get_msg(name, seq=seq, subject=subject, next=True)
        except NotFoundError:
            return  # no more schedules
        seq = (msg.seq or seq) + 1
        due = _schedule_time(msg.headers)
        if due is None or msg.time is None:
            continue
        dropped = msg.time + timedelta(seconds=want)
        if dropped <= now or dropped < due:
            kept = f"at {have:g} s" if have else "without an age"
            raise RetentionRefused(
                f"{name}: a retention of {want:g} s (TROVE_*_MAX_AGE_SECONDS) would drop "
                f"a schedule it holds ({msg.subject}, published {msg.time:%Y-%m-%d %H:%M}, "
                f"due {due:%Y-%m-%d %H:%M}); keep the retention {kept}, or longer "
                "than the longest wait of a schedule"
            )


def _schedule_time(headers: dict[str, str] | None) -> datetime | None:
    """When a message's ``Nats-Schedule: @at ...`` fires; None for any other message."""
    value = (headers or {}).get("Nats-Schedule", "")
    if not value.startswith("@at "):
        return None
    try:
        due = datetime.fromisoformat(value.removeprefix("@at ").strip())
    except ValueError:
        return None
    return due if due.tzinfo is not None else due.replace(tzinfo=UTC)


async def _ensure_bucket(js: JetStreamContext, config: KeyValueConfig, *, reconcile: bool) -> None:
    try:
        await js.key_value(config.bucket)
    except BucketNotFoundError:
        try:
            await js.create_key_value(config)
            log.info("created bucket %s", config.bucket)
        except APIError as exc:
            # Created by another pod meanwhile: stamped by its owner since, its config is
            # no longer the bare one nats-py asks to create, which the server refuses.
            if exc.err_code != 10058:
                raise
    if not reconcile:
        return
    stream = f"KV_{config.bucket}"
    info = await js.stream_info(stream)
    wanted_age = config.ttl or 0.0
    wanted_direct = bool(config.direct)
    # Stamped as streams and durables are, by its owner (nats-py makes a bucket without
    # metadata, and only the owner may update it): a pod of an older release started
    # beside a newer one's (a rolling update, a rollback, a restart) leaves its bucket
    # as it is. Reconciled back, a shorter age dropped at once every key older than it
    # (a host's pause and learned policy, a page's place in the crawl cycle).
    if (
        (info.config.max_age or 0.0) != wanted_age
        or info.config.num_replicas != config.replicas
        or bool(info.config.allow_direct) != wanted_direct
        or REVISION_KEY not in (info.config.metadata or {})
    ) and _not_newer(info.config, f"bucket {config.bucket}"):
        await js.update_stream(
            replace(
                info.config,
                max_age=wanted_age,
                num_replicas=config.replicas,
                allow_direct=wanted_direct,
                # As nats-py creates a bucket: the server refuses a window past the age.
                duplicate_window=min(wanted_age, 120.0) if wanted_age else 120.0,
                metadata={**(info.config.metadata or {}), REVISION_KEY: str(REVISION)},
            )
        )
        log.info("reconciled bucket %s", config.bucket)


async def _ensure_consumer(
    js: JetStreamContext, stream: str, config: ConsumerConfig, *, reconcile: bool
) -> None:
    assert config.durable_name is not None
    try:
        info = await js.consumer_info(stream, config.durable_name)
    except NotFoundError:
        if config.durable_name in NOT_READ_AGAIN:
            await _refuse_to_read_again(js, stream, config.durable_name)
        try:
            await _create_consumer(js, stream, config)
            log.info("created consumer %s on %s", config.durable_name, stream)
            return
        except APIError as exc:
            if exc.err_code != 10148:  # created by another meanwhile, with its settings
                raise
            info = await js.consumer_info(stream, config.durable_name)
    if (
        reconcile
        and _differs(info.config, config)
        and _not_newer(info.config, f"{config.durable_name} on {stream}")
    ):
        # The create API updates a durable in place when only editable fields changed;
        # a filter change on an existing durable is editable since nats-server 2.10.
        await js.add_consumer(stream, _merged(info.config, config))
        log.info("reconciled consumer %s on %s", config.durable_name, stream)


async def _create_consumer(js: JetStreamContext, stream: str, config: ConsumerConfig) -> None:
    """Create a durable only where none is: one made meanwhile with other settings is
    refused (10148), as a stream is. nats-py's ``add_consumer`` asks the server to create
    or update, so whoever found the durable missing would replace the settings its owner
    (or a newer release) made it with; only the owner's reconcile may change them."""
    request = {"stream_name": stream, "config": config.as_dict(), "action": "create"}
    await js._api_request(
        f"{js._prefix}.CONSUMER.DURABLE.CREATE.{stream}.{config.durable_name}",
        json.dumps(request).encode(),
        timeout=js._timeout,
    )


#: Durables that must not start from the first message of a stream that holds some
#: already: the fetcher would fetch every page the record ever asked for at once, its
#: attempts under the ids of those already recorded (which the recorder drops), and
#: the deferred fetches ``TROVE_WORK`` holds that were handled and not yet purged (up to
#: ``TROVE_WORK_PURGE_AFTER_MESSAGES`` while the purges run, all of them when refused);
#: discovery would ask every page's re-crawl again. The recorder's projection takes the
#: record again as a replay does, the follows' commands end where they ended, and the
#: seeds' only crawl again the forced ones of the stream's month. Every durable is
#: created at the first start, on empty streams: one is missing later only if it was
#: deleted.
NOT_READ_AGAIN = frozenset({FETCHER, FETCHER_DEFERRED, DISCOVERY_LINKS})


async def _refuse_to_read_again(js: JetStreamContext, stream: str, durable: str) -> None:
    """Raise ``TopologyError`` when ``stream`` holds messages: where ``durable`` should
    start again is the operator's to say (docs/deploy.md, "A durable deleted")."""
    held = (await js.stream_info(stream)).state.messages
    if held and durable == FETCHER_DEFERRED:
        raise TopologyError(
            f"consumer {durable} is missing on {stream}, which holds {held} messages: the "
            "deferred work not yet handled, which only it takes, and the handled work not "
            "yet purged, which it would fetch again. Create it from the first "
            f"(`nats consumer add {stream} {durable} --pull --deliver all "
            f"--filter {FETCH_DEFERRED} --defaults`) to "
            "lose no work, or from a later point to repeat less: the waiting work before "
            "it is passed over, and the next purge deletes it. The next start sets the rest"
        )
    if held:
        raise TopologyError(
            f"consumer {durable} is missing on {stream}, which holds {held} messages: "
            "created from the first of them it would handle the whole record again. "
            f"Create it where it should start (`nats consumer add {stream} {durable} "
            "--pull --deliver <time> --defaults`), and the next start sets the rest"
        )


_Config = TypeVar("_Config", StreamConfig, ConsumerConfig)


def _not_newer(current: StreamConfig | ConsumerConfig, name: str) -> bool:
    """Whether the server's config was written by this release's topology or an older
    one (``REVISION``); a newer release's is left as it is, said once a start."""
    written = (current.metadata or {}).get(REVISION_KEY, "0")
    try:
        newer = int(written) > REVISION
    except ValueError:
        newer = False  # not Trove's stamp: an operator's, which Trove's replaces
    if newer:
        log.warning(
            "%s was declared by a newer release of Trove (topology %s, this one %d): left "
            "as it is; messages this release cannot read are parked, not passed over",
            name,
            written,
            REVISION,
        )
    return not newer


def _merged(current: _Config, wanted: _Config) -> _Config:
    """The server's config with the fields Trove sets replaced by the wanted values.

    An update replaces a stream's or a durable's whole config, so sending only Trove's
    fields would reset what an operator set that Trove does not manage (a stream's
    placement, metadata, ``max_bytes`` where Trove sets none; a durable's metadata,
    ``inactive_threshold``, ``sample_freq``) to the server's defaults on every reconcile.
    """
    fields = _managed(wanted)
    if "metadata" in fields:  # Trove's stamp beside what an operator keeps there
        fields["metadata"] = {**(current.metadata or {}), **fields["metadata"]}
    # A durable has one filter or a list of them, never both: the wanted one replaces
    # whichever the server holds.
    if "filter_subject" in fields:
        fields["filter_subjects"] = None
    elif "filter_subjects" in fields:
        fields["filter_subject"] = None
    return replace(current, **fields)


def _managed(wanted: _Config) -> dict[str, Any]:
    """The fields Trove sets in ``wanted``: those not None and not at nats-py's default.

    nats-py's configs default some fields to a value rather than None (a stream's
    ``deny_delete=False``, ``max_msgs_per_subject=-1``): sent back on every reconcile,
    they would undo what an operator set (``nats stream edit --deny-delete``), and the
    server refuses to lift a deny flag, so the owner would never start. A field Trove
    wants at its default is then left as the server holds it.
    """
    default = vars(type(wanted)())
    return {k: v for k, v in vars(wanted).items() if v is not None and v != default.get(k)}


def _differs(current: Any, wanted: Any) -> bool:
    """True when a field we set differs from the server's (fields we leave None, or at
    nats-py's default, are ignored: ``_managed``)."""
    for name, value in _managed(wanted).items():
        if name in {"name", "description"}:
            continue
        have = getattr(current, name, None)
        if isinstance(value, float) or isinstance(have, float):
            if abs(float(value or 0) - float(have or 0)) > 1e-6:
                return True
        elif isinstance(value, list):
            if sorted(map(str, value)) != sorted(map(str, have or [])):
                return True
        elif isinstance(value, dict):  # metadata: Trove's keys, not an operator's
            if any((have or {}).get(key) != item for key, item in value.items()):
                return True
        elif value != have:
            return True
    return False


def page_schedule_subject(url: str) -> str:
    """The schedule subject of a page's next CrawlRequested (see ``Bus.publish_at``).

    JetStream keeps one schedule per subject, and a new schedule message on it replaces
    the pending one: with a subject per page, a page has at most one pending request
    whoever schedules it (a re-crawl, a retry), so no second re-crawl chain can start.
    """
    return f"{EVENT_SCHEDULES_PREFIX}.page.{hashlib.sha256(url.encode()).hexdigest()[:40]}"


def timeline_schedule_subject(instance: str, timeline: str) -> str:
    """The schedule subject of a followed timeline's next poll: one pending poll per
    timeline (a newer schedule replaces it), so two polls of one timeline never overlap."""
    digest = hashlib.sha256(f"{instance} {timeline}".encode()).hexdigest()[:40]
    return f"{EVENT_SCHEDULES_PREFIX}.timeline.{digest}"
