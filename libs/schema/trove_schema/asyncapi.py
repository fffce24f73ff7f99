"""The AsyncAPI description of Trove's subjects and messages, generated from the code.

Each service declares here what it consumes and publishes, with the event models of
``trove_schema.events`` as the message schemas; ``make asyncapi`` runs
``faststream docs gen`` over this module into ``docs/asyncapi.yaml``, and a test keeps
that file current. The handlers are declarations only: the services consume with the
pull loops of ``trove_schema.bus`` (see PLATFORM.md for why).
"""

from __future__ import annotations

from faststream import FastStream
from faststream.nats import JStream, NatsBroker, PullSub
from faststream.specification import AsyncAPI, License

from trove_schema.events import (
    CrawlCompleted,
    CrawlRequested,
    InstanceFollowed,
    InstanceUnfollowed,
    PageDiscovered,
    SeedRejected,
    TimelinePolled,
    TimelinePollRequested,
)
from trove_schema.topology import (
    CRAWL_COMPLETED,
    CRAWL_REQUESTED,
    DISCOVERY_FOLLOWS,
    DISCOVERY_LINKS,
    DISCOVERY_SEEDS,
    EVENTS_STREAM,
    FETCHER,
    FOLLOW_SUBJECT,
    INSTANCE_FOLLOWED,
    INSTANCE_UNFOLLOWED,
    PAGE_DISCOVERED,
    RECORDER,
    SEED_REJECTED,
    SEEDS_STREAM,
    SEEDS_SUBJECT,
    TIMELINE_POLLED,
    TIMELINE_REQUESTED,
)

broker = NatsBroker("nats://nats:4222")
events = JStream(EVENTS_STREAM, declare=False)
seeds_stream = JStream(SEEDS_STREAM, declare=False)

app = FastStream(
    broker,
    specification=AsyncAPI(
        title="Trove",
        version="1",
        description=(
            "A polite crawler for the small web. Events are JSON objects with a stable "
            "`type`, a `version`, an `id` (also the Nats-Msg-Id header) and `occurred_at`."
        ),
        license=License(name="Apache-2.0"),
    ),
)

_page_discovered = broker.publisher(
    PAGE_DISCOVERED,
    schema=PageDiscovered,
    title="PageDiscovered",
    description=PageDiscovered.__doc__,
)
_seed_rejected = broker.publisher(
    SEED_REJECTED, schema=SeedRejected, title="SeedRejected", description=SeedRejected.__doc__
)
_crawl_requested = broker.publisher(
    CRAWL_REQUESTED,
    schema=CrawlRequested,
    title="CrawlRequested",
    description=CrawlRequested.__doc__,
)
_crawl_completed = broker.publisher(
    CRAWL_COMPLETED,
    schema=CrawlCompleted,
    title="CrawlCompleted",
    description=CrawlCompleted.__doc__,
)
_instance_followed = broker.publisher(
    INSTANCE_FOLLOWED,
    schema=InstanceFollowed,
    title="InstanceFollowed",
    description=InstanceFollowed.__doc__,
)
_instance_unfollowed = broker.publisher(
    INSTANCE_UNFOLLOWED,
    schema=InstanceUnfollowed,
    title="InstanceUnfollowed",
    description=InstanceUnfollowed.__doc__,
)
_timeline_requested = broker.publisher(
    TIMELINE_REQUESTED,
    schema=TimelinePollRequested,
    title="TimelinePollRequested",
    description=TimelinePollRequested.__doc__,
)
_timeline_polled = broker.publisher(
    TIMELINE_POLLED,
    schema=TimelinePolled,
    title="TimelinePolled",
    description=TimelinePolled.__doc__,
)


@broker.subscriber(
    SEEDS_SUBJECT,
    stream=seeds_stream,
    pull_sub=PullSub(),
    durable=DISCOVERY_SEEDS,
    title=f"discovery: {DISCOVERY_SEEDS}",
    description="Seeds as an operator types them: a URL, URLs (one a line or apart on a "
    'line), or JSON ({"url"|"urls", "priority", "scope", "pattern", "force", "max_depth"}). '
    "A `nats req` gets a reply saying what was accepted and rejected, and why.",
)
async def seeds(body: str) -> None:
    """Declared for the documentation: discovery's seeds consumer."""


@broker.subscriber(
    FOLLOW_SUBJECT,
    stream=seeds_stream,
    pull_sub=PullSub(),
    durable=DISCOVERY_FOLLOWS,
    title=f"discovery: {DISCOVERY_FOLLOWS}",
    description="Fediverse instances to follow (trove.unfollow: to stop): a URL, lines of "
    '"URL [TIMELINE]", or JSON ({"instance"|"instances", "timeline", "max_depth", '
    '"priority", "backfill"}). A `nats req` gets a reply saying what was accepted.',
)
async def follows(body: str) -> None:
    """Declared for the documentation: discovery's follows consumer."""


@broker.subscriber(
    TIMELINE_POLLED,
    stream=events,
    pull_sub=PullSub(),
    durable=f"{DISCOVERY_LINKS}-polls",
    title=f"discovery: {DISCOVERY_LINKS} (polls)",
    description="The links of public posts on followed timelines, discovered with their "
    "share provenance; the next poll of the timeline is scheduled from each answer.",
)
async def shares(event: TimelinePolled) -> None:
    """Declared for the documentation: discovery's links consumer (same durable)."""


@broker.subscriber(
    TIMELINE_REQUESTED,
    stream=events,
    pull_sub=PullSub(),
    durable=f"{FETCHER}-polls",
    title=f"fetcher: {FETCHER} (polls)",
    description="Polls of followed timelines through the Mastodon client API, each request "
    "under the instance host's lease; answered by a TimelinePolled.",
)
async def poll(event: TimelinePollRequested) -> None:
    """Declared for the documentation: the fetcher's work consumer (same durable)."""


@broker.subscriber(
    CRAWL_COMPLETED,
    stream=events,
    pull_sub=PullSub(),
    durable=DISCOVERY_LINKS,
    title=f"discovery: {DISCOVERY_LINKS}",
    description="Outbound links of crawled pages, discovered within their seed's scope.",
)
async def links(event: CrawlCompleted) -> None:
    """Declared for the documentation: discovery's links consumer."""


@broker.subscriber(
    PAGE_DISCOVERED,
    stream=events,
    pull_sub=PullSub(),
    durable=FETCHER,
    title=f"fetcher: {FETCHER}",
    description="Pages to fetch (also trove.events.crawl.requested): one lease per domain, "
    "robots.txt obeyed; answered by a CrawlCompleted.",
)
async def fetch(event: PageDiscovered) -> None:
    """Declared for the documentation: the fetcher's work consumer."""


@broker.subscriber(
    CRAWL_REQUESTED,
    stream=events,
    pull_sub=PullSub(),
    durable=f"{FETCHER}-requested",
    title=f"fetcher: {FETCHER} (requests)",
    description="Retries and re-crawls, often published as NATS scheduled messages.",
)
async def fetch_again(event: CrawlRequested) -> None:
    """Declared for the documentation: the fetcher's work consumer (same durable)."""


@broker.subscriber(
    SEED_REJECTED,
    stream=events,
    pull_sub=PullSub(),
    durable=RECORDER,
    title=f"recorder: {RECORDER}",
    description="Every event is projected into Postgres (pages, page_crawls, page_links, "
    "seed_rejections); this lists one subject of several.",
)
async def record(event: SeedRejected) -> None:
    """Declared for the documentation: the recorder's consumer."""
