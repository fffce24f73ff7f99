"""Projections: events applied to pages, page_crawls, page_outlinks, seed_rejections and
the audit (fetcher_attempts, attempt_heuristics).

One path for every caller: the live recorder's batches, a batch of one when a failed
batch is handled message by message, and replay's batches. A batch is applied in the
caller's transaction with a few set-based statements: a page of 100 links costs one
row in each of a handful of ``unnest`` statements instead of a dozen statements of its
own. The pages a batch updates are locked in id order before any is written, so
concurrent batches never deadlock on each other's pages.

Applying an event first inserts its id into ``projected_events``; if the id is already
there the event was applied before (a redelivery) and nothing else happens. Both writes
share the transaction, so a crash between commit and ack only causes a harmless
redelivery. Events are applied in stream order within a batch, and the tables do not
depend on how the stream is cut into batches (replay, cutting it its own way,
reproduces the live tables; tested). One nuance: of a page's attempts in one batch only
the newest may schedule a retry, since a retry of an attempt already overtaken by a
newer one would be wasted.
"""

from __future__ import annotations

import functools
import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from trove_recorder.host_policies import fold_host_policies
from trove_recorder.page_ids import PageIds
from trove_recorder.retries import RetryPolicy, recheck_request, refused_for_now, retry_request
from trove_recorder.sql import Statement, Transaction, copy_text
from trove_schema.errors import InvalidURL
from trove_schema.events import (
    CrawlCompleted,
    CrawlOutcome,
    CrawlRequested,
    Event,
    InstanceFollowed,
    InstanceUnfollowed,
    PageDiscovered,
    SeedRejected,
    SharedPost,
    TimelinePolled,
)
from trove_schema.heuristics import Audit, audit
from trove_schema.policy import LearningConfig
from trove_schema.textsearch import ts_config
from trove_schema.urls import canonicalize_or_none, domain_of

FETCHED = (CrawlOutcome.SUCCESS, CrawlOutcome.NOT_MODIFIED)

STATUS_BY_OUTCOME = {
    CrawlOutcome.SUCCESS: "fetched",
    CrawlOutcome.NOT_MODIFIED: "fetched",
    CrawlOutcome.REJECTED: "rejected",
    # robots.txt forbids it: Trove declines the page (it may be allowed next cycle).
    CrawlOutcome.BLOCKED_ROBOTS: "rejected",
    CrawlOutcome.FAILED: "failed",
    CrawlOutcome.TIMEOUT: "failed",
    CrawlOutcome.BLOCKED_4XX: "failed",
    CrawlOutcome.BLOCKED_5XX: "failed",
}


@functools.cache
def _sql(statement: str) -> Statement:
    """The statement in asyncpg's form, made once (the literals are the keys)."""
    return Statement(statement)


def event_uuid(value: str) -> uuid.UUID:
    """The UUID the tables key an event id by (and the ids events name: a follow's, a
    request's). Every Trove producer writes UUIDs; another text, from a stranger's
    producer, stands for one derived from it, the same each time it is read: its event
    is applied once, as any, live and in a replay alike."""
    try:
        return uuid.UUID(value)
    except ValueError:
        return uuid.uuid5(uuid.NAMESPACE_URL, f"trove:event-id:{value}")


@dataclass(slots=True)
class _Plan:
    rejected: list[SeedRejected] = field(default_factory=list)
    #: URL -> its first sighting's time and shallowest depth in the batch.
    discovered: dict[str, tuple[datetime, int]] = field(default_factory=dict)
    completed: list[CrawlCompleted] = field(default_factory=list)
    urls: dict[str, str] = field(default_factory=dict)
    #: Follows, unfollows and polls, in stream order (see ``_fediverse``).
    fediverse: list[InstanceFollowed | InstanceUnfollowed | TimelinePolled] = field(
        default_factory=list
    )


@dataclass(slots=True)
class Applied:
    """What a batch did: how many events were new, and the page ids it resolved."""

    count: int = 0
    #: The pages table's generation the ids belong to (see ``PageIds``).
    generation: str | None = None
    #: Ids read from or created in the database (not those ``known`` already had).
    page_ids: dict[str, int] = field(default_factory=dict)


async def apply_batch(
    session: AsyncSession,
    events: Sequence[Event],
    policy: RetryPolicy,
    known: PageIds | None = None,
    *,
    learning: LearningConfig | None = None,
    replaying: bool = False,
) -> Applied:
    """Apply ``events`` (in stream order) in the caller's transaction.

    ``known`` saves the look-up of pages already seen; the caller teaches it the
    returned ids once the transaction has committed. ``learning`` is the per-host
    policy's configuration (the services' settings; the defaults when None).
    ``replaying``: the events are the record read again (``replay``), not news.
    """
    unique: dict[uuid.UUID, Event] = {}
    for event in events:
        unique.setdefault(event_uuid(event.id), event)
    if not unique:
        return Applied()
    ids = list(unique)
    types = [e.TYPE for e in unique.values()]
    tx = await Transaction.of(session)
    fresh = {
        row[0]
        for row in await tx.fetch(
            _sql(
                "INSERT INTO projected_events (event_id, event_type) "
                "SELECT * FROM unnest(CAST(:ids AS uuid[]), CAST(:types AS text[])) "
                "ON CONFLICT DO NOTHING RETURNING event_id"
            ),
            {"ids": ids, "types": types},
        )
    }
    plan = _Plan()
    for key, event in unique.items():
        if key not in fresh:
            continue
        # type() rather than isinstance(): pydantic's metaclass makes isinstance slow.
        if type(event) is CrawlCompleted:
            plan.urls[event.url] = event.domain
            plan.completed.append(event)
        elif isinstance(event, SeedRejected):
            plan.rejected.append(event)
        elif isinstance(event, PageDiscovered):
            plan.urls[event.url] = event.domain
            # The first sighting's time and the shallowest depth, as one batch each.
            seen = plan.discovered.get(event.url)
            plan.discovered[event.url] = (
                (event.occurred_at, event.depth)
                if seen is None
                else (min(seen[0], event.occurred_at), min(seen[1], event.depth))
            )
        elif isinstance(event, CrawlRequested):
            plan.urls[event.url] = event.domain
        elif isinstance(event, InstanceFollowed | InstanceUnfollowed | TimelinePolled):
            plan.fediverse.append(event)
    applied = Applied(count=len(fresh))
    if known is not None:
        applied.generation = await known.check_generation(tx)
    await _seed_rejections(tx, plan.rejected)
    page_ids, applied.page_ids = await _page_ids(tx, plan, known)
    newest_applied = await _lock_pages(
        tx, {page_ids[url] for url in plan.discovered} | {page_ids[e.url] for e in plan.completed}
    )
    await _discovered(tx, plan.discovered)
    verdicts = await _completed(
        tx, plan.completed, page_ids, policy, newest_applied, replaying=replaying
    )
    await fold_host_policies(tx, plan.completed, verdicts, learning or LearningConfig())
    await _fediverse(tx, plan.fediverse)
    return applied


async def _seed_rejections(tx: Transaction, rejected: list[SeedRejected]) -> None:
    if not rejected:
        return
    await tx.execute(
        _sql(
            "INSERT INTO seed_rejections (event_id, raw, reason, origin, occurred_at) "
            "SELECT * FROM unnest(CAST(:ids AS uuid[]), CAST(:raws AS text[]), "
            "CAST(:reasons AS text[]), CAST(:origins AS text[]), CAST(:ats AS timestamptz[])) "
            "ON CONFLICT DO NOTHING"
        ),
        {
            "ids": [event_uuid(e.id) for e in rejected],
            "raws": [e.raw for e in rejected],
            "reasons": [e.reason for e in rejected],
            "origins": [e.provenance.origin for e in rejected],
            "ats": [e.occurred_at for e in rejected],
        },
    )


#: The advisory locks (the two-key form, apart from the one-key locks of the migrations
#: and of replay) under which one transaction at a time writes an instance's rows; the
#: second key is a hash of the instance.
INSTANCE_LOCKS = 0x74726F76


def _instance_key(instance: str) -> int:
    digest = hashlib.blake2b(instance.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


# When the row's follow began; a row whose follow is not applied yet (made by its polls)
# dates it by its first poll.
_FOLLOWED_AT = (
    "coalesce(i.followed_at, (SELECT f.completed_at FROM timeline_polls f "
    "WHERE f.follow_id = i.follow_id ORDER BY f.poll LIMIT 1))"
)
# The first unfollow of the row's timeline (or of every timeline of its instance) at or
# after its follow. The row's own, when it is after the follow, counts too: one a
# recorder of the release before 0012 applied, which is in no ``instance_unfollows``.
_UNFOLLOWED_AT = (  # constants only: nothing to inject
    f"least(CASE WHEN i.unfollowed_at >= {_FOLLOWED_AT} THEN i.unfollowed_at END, "  # noqa: S608
    "(SELECT min(u.unfollowed_at) FROM instance_unfollows u WHERE u.instance = i.instance "
    # A tag's case: discovery stops `tag:Python` for an unfollow of `tag:python` (a
    # release before kept the case a follow was spelt in).
    "AND (u.timeline IS NULL OR lower(u.timeline) = lower(i.timeline)) "
    f"AND u.unfollowed_at >= {_FOLLOWED_AT}))"
)

# The columns of the row's follow: its newest poll's that asked the instance something
# (a poll deferred for its host's slot tells nothing of it) and when the newest poll
# said the next one comes, since when it has been failing (the first failure after its
# newest success; a poll 0 stands for the failures before migration 0012) and when it
# was unfollowed.
_FOLLOW_STATE = (  # constants only: nothing to inject
    "UPDATE instances i SET (last_poll, last_poll_at, last_outcome, last_status_code, "  # noqa: S608
    "last_error, cursor, next_poll_after) = (SELECT coalesce(p.poll, 0), p.completed_at, "
    "p.outcome, p.status_code, p.error, p.cursor, (SELECT n.next_poll_after FROM "
    "timeline_polls n WHERE n.follow_id = i.follow_id ORDER BY n.poll DESC LIMIT 1) "
    "FROM (SELECT 1) AS one LEFT JOIN (SELECT * FROM timeline_polls t "
    "WHERE t.follow_id = i.follow_id AND t.unasked_event IS DISTINCT FROM t.event_id "
    "ORDER BY t.poll DESC "
    "LIMIT 1) AS p ON true), "
    "failing_since = (SELECT min(t.completed_at) FROM timeline_polls t "
    "WHERE t.follow_id = i.follow_id AND t.outcome <> 'success' AND t.poll > "
    "coalesce((SELECT max(s.poll) FROM timeline_polls s WHERE s.follow_id = i.follow_id "
    "AND s.outcome = 'success' AND s.unasked_event IS DISTINCT FROM s.event_id), -1)), "
    f"unfollowed_at = {_UNFOLLOWED_AT}, updated_at = now() "
    "WHERE i.instance = :instance AND i.timeline = :timeline"
)


async def _fediverse(
    tx: Transaction, events: list[InstanceFollowed | InstanceUnfollowed | TimelinePolled]
) -> None:
    """Follows, unfollows and polls, whatever the order they are applied in.

    Stream order holds only within a batch: each recorder applies two batches at once,
    and a batch handed back commits after later ones. So a timeline's row is worked out
    from what its events left, not from their order: each poll is kept in
    ``timeline_polls`` and each unfollow in ``instance_unfollows``, where a follow applied
    after them finds them, and the row holds its newest follow. An instance's rows are
    written by one transaction at a time (its lock, taken in one order by every batch):
    an unfollow of every timeline of it and a follow, each in a batch of its own, would
    otherwise each miss the other's uncommitted rows. They are a few events a minute per
    timeline, against hundreds of pages a second, so a few statements each cost nothing
    worth batching.
    """
    if not events:
        return
    await tx.execute(
        _sql("SELECT pg_advisory_xact_lock(:space, k) FROM unnest(CAST(:keys AS int[])) AS k"),
        {"space": INSTANCE_LOCKS, "keys": sorted({_instance_key(e.instance) for e in events})},
    )
    for event in events:
        if type(event) is TimelinePolled:
            await _timeline_polled(tx, event)
        elif type(event) is InstanceFollowed:
            await _instance_followed(tx, event)
        elif type(event) is InstanceUnfollowed:
            await _instance_unfollowed(tx, event)


async def _instance_followed(tx: Transaction, event: InstanceFollowed) -> None:
    """The timeline's row now belongs to this follow, unless a newer follow holds it.

    A new follow starts a new poll chain (numbered from 1): the row's poll columns become
    those of its polls applied already (usually none); the counters go on across follows.
    A row made by polls alone (this follow's, or another's not applied yet) is taken.
    """
    taken = await tx.value(
        _sql(
            "INSERT INTO instances AS i (instance, domain, timeline, follow_id, followed_at, "
            "max_depth) VALUES (:instance, :domain, :timeline, :follow_id, :at, :max_depth) "
            "ON CONFLICT (instance, timeline) DO UPDATE SET domain = excluded.domain, "
            "follow_id = excluded.follow_id, followed_at = excluded.followed_at, "
            "max_depth = excluded.max_depth "
            # Two follows at the same instant: the larger id, in either order.
            "WHERE i.followed_at IS NULL OR (i.followed_at, i.follow_id) "
            "< (excluded.followed_at, excluded.follow_id) RETURNING true"
        ),
        {
            "instance": event.instance,
            "domain": event.domain,
            "timeline": event.timeline,
            "follow_id": event_uuid(event.id),
            "at": event.occurred_at,
            "max_depth": event.max_depth,
        },
    )
    if taken:
        await tx.execute(
            _sql(_FOLLOW_STATE), {"instance": event.instance, "timeline": event.timeline}
        )


async def _instance_unfollowed(tx: Transaction, event: InstanceUnfollowed) -> None:
    """The timeline (every timeline of the instance without one) is no longer followed.

    Kept for a follow applied after it; an unfollow older than a row's follow is about
    an earlier one, and changes nothing.
    """
    params = {"instance": event.instance, "timeline": event.timeline}
    await tx.execute(
        _sql(
            "INSERT INTO instance_unfollows (event_id, instance, timeline, unfollowed_at) "
            "VALUES (:id, :instance, :timeline, :at) ON CONFLICT DO NOTHING"
        ),
        {**params, "id": event_uuid(event.id), "at": event.occurred_at},
    )
    await tx.execute(
        _sql(
            f"UPDATE instances i SET unfollowed_at = {_UNFOLLOWED_AT}, updated_at = now() "  # noqa: S608
            "WHERE i.instance = :instance "
            "AND (CAST(:timeline AS text) IS NULL OR lower(i.timeline) = lower(:timeline)) "
            f"AND i.unfollowed_at IS DISTINCT FROM {_UNFOLLOWED_AT}"
        ),
        params,
    )


async def _timeline_polled(tx: Transaction, event: TimelinePolled) -> None:
    """A poll's outcome on its timeline's row, and a ``page_shares`` row per shared link.

    Shares are recorded whatever the poll's fate: they are keyed by (URL, post), and a
    second sighting of a post keeps the earliest.
    """
    follow_id = _uuid_or_none(event.follow_id)
    if follow_id is not None:
        await _count_poll(tx, event, follow_id)
    await _page_shares(tx, event)
    await _withdraw_shares(tx, event)


async def _withdraw_shares(tx: Transaction, event: TimelinePolled) -> None:
    """The shares of the accounts this poll found opted out, first seen before it ended:
    a person who opts out later is not kept as having shared what they shared before.

    Stream order holds within a batch only: a poll that showed such a share, applied
    after this one (handed back, or on the other recorder at the same time), writes it
    again, until a poll next skips a post of the account and withdraws it once more."""
    if not event.withdrawn:
        return
    await tx.execute(
        _sql(
            "DELETE FROM page_shares WHERE md5(account) = ANY(CAST(:keys AS text[])) "
            "AND first_seen_at <= :at"
        ),
        {"keys": sorted(set(event.withdrawn)), "at": event.completed_at},
    )


async def _count_poll(tx: Transaction, event: TimelinePolled, follow_id: uuid.UUID) -> None:
    """The poll in ``timeline_polls``, and its counts on its timeline's row, once.

    The same poll made again (its request redelivered) carries another event id: of the
    two, the poll is the one that ended first, whichever is applied first, and its counts
    replace the other's. Every poll counts, whichever follow it belongs to; the row's
    poll columns are those of its follow's newest poll (``_FOLLOW_STATE``), so a poll of
    a follow not applied yet waits in ``timeline_polls`` until its follow takes the row.
    """
    ok = event.outcome is CrawlOutcome.SUCCESS
    posts = len(event.posts)
    links = sum(len(post.links) for post in event.posts)
    key = {"follow_id": follow_id, "poll": event.poll}
    before = await tx.fetch(
        _sql(
            "SELECT completed_at, posts, links, skipped FROM timeline_polls "
            "WHERE follow_id = :follow_id AND poll = :poll"
        ),
        key,
    )
    chosen = await tx.value(
        _sql(
            "INSERT INTO timeline_polls AS t (follow_id, poll, event_id, completed_at, "
            "outcome, status_code, error, posts, links, skipped, cursor, next_poll_after, "
            "unasked_event) VALUES (:follow_id, :poll, :event_id, :at, :outcome, :code, "
            ":error, :posts, :links, :skipped, :cursor, :next, :unasked) "
            "ON CONFLICT (follow_id, poll) DO UPDATE SET "
            "event_id = excluded.event_id, completed_at = excluded.completed_at, "
            "outcome = excluded.outcome, unasked_event = excluded.unasked_event, "
            "status_code = excluded.status_code, "
            "error = excluded.error, posts = excluded.posts, links = excluded.links, "
            "skipped = excluded.skipped, cursor = excluded.cursor, "
            "next_poll_after = excluded.next_poll_after "
            "WHERE (excluded.completed_at, excluded.event_id) < (t.completed_at, t.event_id) "
            "RETURNING true"
        ),
        {
            **key,
            "event_id": event_uuid(event.id),
            "at": event.completed_at,
            "outcome": event.outcome.value,
            "unasked": event_uuid(event.id) if ok and not event.requests else None,
            "code": event.status_code,
            # A success may carry a note too (what stopped it early: a rate limit).
            "error": event.error_message or (None if ok else event.outcome.value),
            "posts": posts,
            "links": links,
            "skipped": event.skipped,
            "cursor": event.cursor_after,
            "next": (
                event.completed_at + timedelta(seconds=event.retry_after)
                if event.retry_after
                else None
            ),
        },
    )
    counts = (0, 0, 0, 0)
    ended = event.completed_at
    if chosen:
        counts = (1, posts, links, event.skipped)
        if before:
            old = before[0]
            counts = (0, posts - old["posts"], links - old["links"], event.skipped - old["skipped"])
    elif before:
        ended = before[0]["completed_at"]
    current = await tx.value(
        _sql(
            "INSERT INTO instances AS i (instance, domain, timeline, follow_id, polls, "
            "posts_seen, links_found, skipped, software, software_version, software_at) "
            "VALUES (:instance, :domain, :timeline, :follow_id, :polls, :posts, :links, "
            ":skipped, :software, :version, :software_at) "
            "ON CONFLICT (instance, timeline) DO UPDATE SET polls = i.polls + excluded.polls, "
            "posts_seen = i.posts_seen + excluded.posts_seen, "
            "links_found = i.links_found + excluded.links_found, "
            "skipped = i.skipped + excluded.skipped, "
            # A row no follow has taken yet: the follow of the poll that ended last.
            "follow_id = CASE WHEN i.followed_at IS NULL AND i.last_poll_at < :ended "
            "  THEN excluded.follow_id ELSE i.follow_id END, "
            # The software the latest poll that knew it named, whichever its follow.
            "software = CASE WHEN excluded.software_at > coalesce(i.software_at, '-infinity') "
            "  THEN excluded.software ELSE i.software END, "
            "software_version = CASE WHEN excluded.software_at "
            "  > coalesce(i.software_at, '-infinity') "
            "  THEN excluded.software_version ELSE i.software_version END, "
            "software_at = greatest(i.software_at, excluded.software_at), updated_at = now() "
            "RETURNING i.follow_id = :follow_id"
        ),
        {
            "instance": event.instance,
            "domain": event.domain,
            "timeline": event.timeline,
            "follow_id": follow_id,
            "polls": counts[0],
            "posts": counts[1],
            "links": counts[2],
            "skipped": counts[3],
            "software": event.software,
            "version": event.software_version if event.software else None,
            "software_at": event.completed_at if event.software else None,
            "ended": ended,
        },
    )
    if current:
        await tx.execute(
            _sql(_FOLLOW_STATE), {"instance": event.instance, "timeline": event.timeline}
        )


async def _page_shares(tx: Transaction, event: TimelinePolled) -> None:
    shares: dict[tuple[str, str], SharedPost] = {}
    for post in event.posts:
        for url in post.links:
            shares.setdefault((url, post.uri), post)  # one row a statement may touch once
    keys = sorted(shares)
    # A row a link, each repeating its post's uri, URL and account: a statement of them
    # all, for a poll of long ids (an event written before polls counted them, or by
    # hand), was hundreds of megabytes in the recorder and in a Postgres backend.
    for start in range(0, len(keys), SHARES_A_STATEMENT):
        await _insert_shares(tx, event, keys[start : start + SHARES_A_STATEMENT], shares)


#: Rows of ``page_shares`` one statement writes: at most ~6.5 KB each.
SHARES_A_STATEMENT = 1_000


async def _insert_shares(
    tx: Transaction,
    event: TimelinePolled,
    keys: list[tuple[str, str]],
    shares: dict[tuple[str, str], SharedPost],
) -> None:
    posts = [shares[key] for key in keys]
    await tx.execute(
        _sql(
            "INSERT INTO page_shares (url, post_uri, post_url, instance, account, shared_at, "
            "language, first_seen_at) SELECT u, p, pu, :instance, a, s, l, :at FROM unnest("
            "CAST(:urls AS text[]), CAST(:uris AS text[]), CAST(:post_urls AS text[]), "
            "CAST(:accounts AS text[]), CAST(:shared AS timestamptz[]), "
            "CAST(:languages AS text[])) AS v(u, p, pu, a, s, l) "
            "ON CONFLICT (url, md5(post_uri)) DO UPDATE SET post_uri = excluded.post_uri, "
            "post_url = excluded.post_url, instance = excluded.instance, "
            "account = excluded.account, shared_at = excluded.shared_at, "
            "language = excluded.language, first_seen_at = excluded.first_seen_at "
            "WHERE excluded.first_seen_at < page_shares.first_seen_at"
        ),
        {
            "instance": event.instance,
            "at": event.completed_at,
            "urls": [url for url, _ in keys],
            "uris": [uri for _, uri in keys],
            "post_urls": [post.url for post in posts],
            "accounts": [post.account for post in posts],
            "shared": [post.shared_at for post in posts],
            "languages": [post.language for post in posts],
        },
    )


async def _page_ids(
    tx: Transaction, plan: _Plan, known: PageIds | None
) -> tuple[dict[str, int], dict[str, int]]:
    """Ids of every page the plan names (its events' URLs and their links' targets).

    A link whose URL names no host (a stranger's event: Trove's fetcher sends canonical
    URLs) is no page, and has no id: its link is left out (``_outlinks_row``).
    Also returns the part of them that came from the database, for ``known`` to learn.
    """
    remembered = known.get if known is not None else _nothing.get
    urls = {link.url for event in plan.completed for link in event.links}
    urls.update(plan.urls)
    # Comprehensions and set algebra: this runs for every link of every page.
    ids = {url: page_id for url in urls if (page_id := remembered(url)) is not None}
    missing = {
        url: domain
        for url in urls.difference(ids)
        if (domain := _page_domain(url, plan.urls)) is not None
    }
    looked_up = await _ensure_pages(tx, missing)
    ids.update(looked_up)
    return ids, looked_up


_nothing: dict[str, int] = {}


def _page_domain(url: str, domains: Mapping[str, str]) -> str | None:
    """The domain of the page of ``url``: the one its event names, else its host; None
    for a link whose URL has none (an event's own URL without one raises)."""
    domain = domains.get(url)
    if domain:
        return domain
    try:
        return domain_of(url)
    except InvalidURL:
        if url in domains:
            raise
        return None


async def _ensure_pages(tx: Transaction, urls: dict[str, str]) -> dict[str, int]:
    """Ids of the pages of these URLs, creating the missing ones.

    Most link targets are known already: look them up first and insert only the rest,
    which is far cheaper than upserting every URL of every link.
    """
    if not urls:
        return {}
    lookup = _sql("SELECT url, id FROM pages WHERE url = ANY(CAST(:urls AS text[]))")
    ids = {url: page_id for url, page_id in await tx.fetch(lookup, {"urls": list(urls)})}
    missing = sorted(u for u in urls if u not in ids)
    if missing:
        created = await tx.fetch(
            _sql(
                "INSERT INTO pages (url, domain) "
                "SELECT * FROM unnest(CAST(:urls AS text[]), CAST(:domains AS text[])) "
                "ON CONFLICT (url) DO NOTHING RETURNING url, id"
            ),
            {"urls": missing, "domains": [urls[u] for u in missing]},
        )
        ids.update({url: page_id for url, page_id in created})
        raced = [u for u in missing if u not in ids]  # created by a concurrent batch
        if raced:
            ids.update({url: page_id for url, page_id in await tx.fetch(lookup, {"urls": raced})})
    return ids


@dataclass(frozen=True, slots=True)
class _Applied:
    """When the attempts a page's column groups come from completed (None: none yet)."""

    latest: datetime | None
    fetched: datetime | None
    content: datetime | None
    linked: datetime | None


_NOTHING_APPLIED = _Applied(None, None, None, None)


async def _lock_pages(tx: Transaction, page_ids: set[int]) -> dict[int, _Applied]:
    """Lock the rows the batch will update, in id order, before any is written (so two
    batches never wait on each other in a cycle); what each has applied.

    ``FOR NO KEY UPDATE``, as the updates themselves take: ``FOR UPDATE`` would also
    wait for the key-share locks a concurrent batch's ``page_crawls`` insert takes on
    the same page (its foreign key), while that batch waits for ours."""
    if not page_ids:
        return {}
    # A row from before ``content_at`` and ``linked_at`` that holds content or links
    # (a success that linked nowhere leaves no links row: content counts) has its newest
    # attempt as their time, as it had then.
    return {
        page_id: _Applied(*times)
        for page_id, *times in await tx.fetch(
            _sql(
                "SELECT id, last_crawled_at, fetched_at, coalesce(content_at, CASE WHEN "
                "content_hash IS NOT NULL OR title IS NOT NULL THEN last_crawled_at END), "
                "coalesce(linked_at, CASE WHEN content_hash IS NOT NULL OR title IS NOT NULL "
                "OR EXISTS (SELECT 1 FROM page_outlinks o WHERE o.from_page_id = pages.id) "
                "THEN last_crawled_at END) "
                "FROM pages WHERE id = ANY(CAST(:ids AS bigint[])) ORDER BY id "
                "FOR NO KEY UPDATE OF pages"
            ),
            {"ids": sorted(page_ids)},
        )
    }


async def _discovered(tx: Transaction, discovered: dict[str, tuple[datetime, int]]) -> None:
    """Each URL's first sighting and shallowest depth, whichever order they come in."""
    if not discovered:
        return
    ordered = sorted(discovered)
    await tx.execute(
        _sql(
            "UPDATE pages p SET discovered_at = least(p.discovered_at, v.at), "
            "depth = least(coalesce(p.depth, v.depth), v.depth), updated_at = now() "
            "FROM unnest(CAST(:urls AS text[]), CAST(:ats AS timestamptz[]), "
            "CAST(:depths AS int[])) AS v(url, at, depth) WHERE p.url = v.url"
        ),
        {
            "urls": ordered,
            "ats": [discovered[u][0] for u in ordered],
            "depths": [discovered[u][1] for u in ordered],
        },
    )


async def _completed(
    tx: Transaction,
    completed: list[CrawlCompleted],
    page_ids: dict[str, int],
    policy: RetryPolicy,
    applied: dict[int, _Applied],
    *,
    replaying: bool,
) -> list[Audit]:
    if not completed:
        return []
    await tx.execute(
        _sql(
            "INSERT INTO page_crawls (page_id, domain, priority, attempt, outcome, status_code, "
            "error_message, content_length, started_at, completed_at, duration_ms, event_id, "
            "request_id) SELECT * FROM unnest(CAST(:page_ids AS bigint[]), "
            "CAST(:domains AS text[]), CAST(:priorities AS int[]), CAST(:attempts AS int[]), "
            "CAST(:outcomes AS text[]), CAST(:codes AS int[]), CAST(:errors AS text[]), "
            "CAST(:lengths AS bigint[]), CAST(:starts AS timestamptz[]), "
            "CAST(:ends AS timestamptz[]), CAST(:durations AS int[]), CAST(:ids AS uuid[]), "
            "CAST(:requests AS uuid[]))"
        ),
        {
            "page_ids": [page_ids[e.url] for e in completed],
            "domains": [e.domain for e in completed],
            "priorities": [e.priority for e in completed],
            "attempts": [e.attempt for e in completed],
            "outcomes": [e.outcome.value for e in completed],
            "codes": [e.status_code for e in completed],
            "errors": [e.error_message for e in completed],
            "lengths": [e.content_length for e in completed],
            "starts": [e.started_at for e in completed],
            "ends": [e.completed_at for e in completed],
            "durations": [_elapsed_ms(e) for e in completed],
            "ids": [event_uuid(e.id) for e in completed],
            "requests": [_uuid_or_none(e.request_id) for e in completed],
        },
    )
    verdicts = await _audits(tx, completed, page_ids)
    # A page's attempts in one batch leave its row as they would one batch each, in
    # the order they completed: the newest attempt says how the page stands (or, when
    # it is retried, the newest that was not: one not retryable, or one whose retries
    # had run out), the newest success or 304
    # when it was last fetched, the newest success what it holds (its title, language,
    # keywords, validators) and the newest that says so what it links to. So the
    # tables do not depend on how the stream is cut into batches (a replay's 500, a
    # backlog after an outage, a trickle's one).
    latest: dict[int, CrawlCompleted] = {}
    settled: dict[int, CrawlCompleted] = {}
    # A retryable attempt whose retries had run out settled the page too (``failed``):
    # which did is known once their chains are counted (``_retries``).
    failing: dict[int, list[CrawlCompleted]] = {}
    fetched: dict[int, CrawlCompleted] = {}
    content: dict[int, CrawlCompleted] = {}
    indexing: dict[int, CrawlCompleted] = {}
    linking: dict[int, CrawlCompleted] = {}
    # An attempt older than what a group already holds (read under the page's lock)
    # leaves that group alone: a late success still gives content to a page whose
    # newest attempt was a 304 or a failure.
    for event in completed:
        page_id = page_ids[event.url]
        before = applied.get(page_id, _NOTHING_APPLIED)
        at = event.completed_at
        if before.latest is None or at >= before.latest:
            _keep_newest(latest, page_id, event)
            if not event.retryable:
                _keep_newest(settled, page_id, event)
            else:
                failing.setdefault(page_id, []).append(event)
        if event.outcome in FETCHED and (before.fetched is None or at >= before.fetched):
            _keep_newest(fetched, page_id, event)
        success = event.outcome is CrawlOutcome.SUCCESS
        if success and (before.content is None or at >= before.content):
            _keep_newest(content, page_id, event)
        # A 304's X-Robots-Tag says noindex as a success's would (the page is the same,
        # the site's wish is new); a 304 without one says nothing, as a 304 need not
        # repeat the headers of the answer it stands for.
        says = success or (event.outcome is CrawlOutcome.NOT_MODIFIED and event.noindex)
        if says and (before.content is None or at >= before.content):
            _keep_newest(indexing, page_id, event)
        if (success or event.links) and (before.linked is None or at >= before.linked):
            _keep_newest(linking, page_id, event)
    retried, ran_out = await _retries(tx, latest, failing, policy, replaying=replaying)
    for page_id, event in ran_out.items():
        _keep_newest(settled, page_id, event)
    await _page_state(tx, latest, settled, fetched, content, indexing, linking, retried)
    await _links(tx, linking, page_ids)
    return verdicts


def _keep_newest(newest: dict[int, CrawlCompleted], page_id: int, event: CrawlCompleted) -> None:
    """``event`` becomes the page's in ``newest`` unless one there completed later (a
    tie goes to the one later in the stream)."""
    kept = newest.get(page_id)
    if kept is None or event.completed_at >= kept.completed_at:
        newest[page_id] = event


async def _audits(
    tx: Transaction, completed: list[CrawlCompleted], page_ids: dict[str, int]
) -> list[Audit]:
    """One ``fetcher_attempts`` row per attempt, and its tags, in two statements.

    Returns each attempt's verdict, for the host policies' fold to reuse."""
    verdicts = [audit(e) for e in completed]
    ids = [event_uuid(e.id) for e in completed]
    created = await tx.fetch(
        _sql(
            "INSERT INTO fetcher_attempts (event_id, page_id, url, host, fetcher, success, "
            "is_banned, error_type, http_status, response_headers, duration_ms, attempted_at) "
            "SELECT i, p, u, h, f, s, b, e, c, CAST(r AS jsonb), d, a FROM unnest("
            "CAST(:ids AS uuid[]), CAST(:page_ids AS bigint[]), CAST(:urls AS text[]), "
            "CAST(:hosts AS text[]), CAST(:fetchers AS text[]), CAST(:oks AS boolean[]), "
            "CAST(:banned AS boolean[]), CAST(:errors AS text[]), CAST(:codes AS int[]), "
            "CAST(:headers AS text[]), CAST(:durations AS int[]), "
            "CAST(:ats AS timestamptz[])) AS v(i, p, u, h, f, s, b, e, c, r, d, a) "
            "ON CONFLICT (event_id) DO NOTHING RETURNING event_id, id"
        ),
        {
            "ids": ids,
            "page_ids": [page_ids[e.url] for e in completed],
            "urls": [e.url for e in completed],
            "hosts": [e.domain for e in completed],
            "fetchers": [e.fetcher for e in completed],
            "oks": [v.success for v in verdicts],
            "banned": [v.is_banned for v in verdicts],
            "errors": [v.error_type for v in verdicts],
            "codes": [e.status_code for e in completed],
            "headers": [json.dumps(e.response_headers) for e in completed],
            "durations": [_duration_ms(e) for e in completed],
            "ats": [e.started_at for e in completed],
        },
    )
    attempt_ids = dict(created)
    # COPY in text form, as for the links: ~20 tags an attempt made the unnest INSERT
    # (asyncpg checking every array element) the costliest statement of a batch.
    lines = [
        f"{attempt_id}\t{copy_text(tag.type)}\t{copy_text(tag.value)}\t{tag.importance!r}\n"
        for event_id, verdict in zip(ids, verdicts, strict=True)
        if (attempt_id := attempt_ids.get(event_id)) is not None
        for tag in verdict.tags
    ]
    if lines:
        await tx.copy(
            "attempt_heuristics",
            "".join(lines),
            ("attempt_id", "heuristic_type", "heuristic_value", "importance_score"),
        )
    return verdicts


def _duration_ms(event: CrawlCompleted) -> int:
    return event.duration_ms if event.duration_ms is not None else _elapsed_ms(event)


def _elapsed_ms(event: CrawlCompleted) -> int:
    """From start to completion, within the columns' ``int``: a stranger's times may be
    weeks apart, and 2**31 ms is under 25 days."""
    elapsed = int((event.completed_at - event.started_at).total_seconds() * 1000)
    return min(max(0, elapsed), 2**31 - 1)


# A page's attempts are counted in its chain, up to an attempt's completion: since its
# last success or 304, and since the chain's first attempt (``attempt`` 1: a discovery, a
# re-crawl): a page whose retries ran out in an outage is retried again when a link
# brings it back. And since when it has been failing: its first attempt after its last
# success. Each bound is the first entry found walking the page's attempts by completion
# (its index), newest first from the attempt or oldest after the success: the rows read
# are those since the page's last success, which are what is counted, never its history
# before it (kept for ever by default, a re-crawl a day for years). A page without a
# retryable attempt since is (0, NULL).
CHAIN_ATTEMPTS = (
    "SELECT v.n, (SELECT count(*) FROM page_crawls c WHERE c.page_id = v.id "
    "AND c.completed_at <= v.at AND c.completed_at > coalesce(ok.at, '-infinity') "
    "AND c.completed_at >= coalesce(began.at, '-infinity')), "
    "(SELECT min(c.completed_at) FROM page_crawls c WHERE c.page_id = v.id "
    "AND c.completed_at <= v.at AND c.completed_at > coalesce(ok.at, '-infinity')) "
    "FROM unnest(CAST(:ids AS bigint[]), CAST(:ats AS timestamptz[])) WITH ORDINALITY "
    "AS v(id, at, n) "
    "LEFT JOIN LATERAL (SELECT c.completed_at AS at FROM page_crawls c "
    "WHERE c.page_id = v.id AND c.completed_at <= v.at "
    "AND c.outcome IN ('success', 'not_modified') "
    "ORDER BY c.completed_at DESC LIMIT 1) ok ON true "
    # The chain's start counts only after the success: one before it bounds nothing.
    "LEFT JOIN LATERAL (SELECT c.completed_at AS at FROM page_crawls c "
    "WHERE c.page_id = v.id AND c.attempt <= 1 AND c.completed_at <= v.at "
    "AND c.completed_at > coalesce(ok.at, '-infinity') "
    "ORDER BY c.completed_at DESC LIMIT 1) began ON true"
)


async def _retries(
    tx: Transaction,
    latest: dict[int, CrawlCompleted],
    failing: dict[int, list[CrawlCompleted]],
    policy: RetryPolicy,
    *,
    replaying: bool,
) -> tuple[set[int], dict[int, CrawlCompleted]]:
    """Outbox rows for the retryable attempts: a retry while attempts are left, else a
    recheck while the page has not been failing too long (``retries``), and a recheck
    alone for a refusal that may be for now (``refused_for_now``). Returns the page ids
    retried, and for each of them the newest attempt before in ``failing`` (retryable,
    in this batch) whose retries had run out: it left the page failed, as it would have
    in a batch of its own."""
    retryable = {pid: e for pid, e in latest.items() if e.retryable or refused_for_now(e)}
    scheduled: set[int] = set()
    if not retryable:
        return scheduled, {}
    asked = sorted(retryable.items())
    asked += [
        (page_id, event)
        for page_id, newest in asked
        if newest.retryable
        for event in failing.get(page_id, ())
        if event is not newest
    ]
    counts: dict[int, tuple[int, datetime | None]] = {
        n - 1: (count, since)
        for n, count, since in await tx.fetch(
            _sql(CHAIN_ATTEMPTS),
            {"ids": [pid for pid, _ in asked], "ats": [e.completed_at for _, e in asked]},
        )
    }
    recheck_for = timedelta(seconds=policy.recheck_for_seconds)
    now = datetime.now(UTC)
    rows: list[tuple[uuid.UUID, bytes, datetime]] = []
    for n, (page_id, event) in enumerate(asked[: len(retryable)]):
        attempts, since = counts.get(n, (0, None))
        if attempts < policy.max_attempts and event.retryable:
            request = retry_request(event, attempts, policy)
            scheduled.add(page_id)
        elif since is not None and event.completed_at - since < recheck_for:
            request = recheck_request(event, policy)  # the page keeps its status
            assert request.not_before is not None
            if replaying and request.not_before <= now:
                # Decided again for old failures: it fired and is in the record, or
                # another request replaced it, or its chain ended before rechecks were
                # made. Sent now it would only replace what is pending. (Live, one
                # due already, the recorder behind, goes at once.)
                continue
        else:
            continue
        assert request.not_before is not None
        rows.append((uuid.UUID(request.id), request.to_wire(), request.not_before))
    ran_out: dict[int, CrawlCompleted] = {}
    for n, (page_id, event) in enumerate(asked[len(retryable) :], start=len(retryable)):
        if page_id in scheduled and counts.get(n, (0, None))[0] >= policy.max_attempts:
            _keep_newest(ran_out, page_id, event)
    if rows:
        await tx.execute(
            _sql(
                "INSERT INTO outbox (event_id, subject, payload, deliver_at) "
                "SELECT i, :subject, p, d FROM unnest(CAST(:ids AS uuid[]), "
                "CAST(:payloads AS bytea[]), CAST(:dues AS timestamptz[])) AS v(i, p, d) "
                "ON CONFLICT DO NOTHING"
            ),
            {
                "subject": CrawlRequested.SUBJECT,
                "ids": [r[0] for r in rows],
                "payloads": [r[1] for r in rows],
                "dues": [r[2] for r in rows],
            },
        )
    return scheduled, ran_out


async def _page_state(
    tx: Transaction,
    latest: dict[int, CrawlCompleted],
    settled: dict[int, CrawlCompleted],
    fetched: dict[int, CrawlCompleted],
    content: dict[int, CrawlCompleted],
    indexing: dict[int, CrawlCompleted],
    linking: dict[int, CrawlCompleted],
    retried: set[int],
) -> None:
    """Each page's row after its attempts in the batch: ``latest`` its newest attempt,
    ``settled`` its newest that is not retryable, ``fetched`` its newest success or 304,
    ``content`` its newest success, ``indexing`` the newest that said whether it may be
    indexed (a success, a 304 saying noindex) and ``linking`` the newest that said what
    it links to, each only if newer than what the row holds (a page may be in some, not
    all)."""
    ordered = sorted(
        latest.keys() | fetched.keys() | content.keys() | indexing.keys() | linking.keys()
    )
    if not ordered:
        return
    statuses: list[str | None] = []
    failed_at: list[datetime | None] = []
    for page_id in ordered:
        event = latest.get(page_id)
        if event is None:
            statuses.append(None)  # its newest attempt is older news: status as it is
            failed_at.append(None)
        elif event.outcome in FETCHED:
            statuses.append("fetched")
            failed_at.append(None)
        elif page_id in retried:
            # It keeps its status until the retries run out: the one an attempt earlier
            # in the batch settled, if any.
            before = settled.get(page_id)
            status = None if before is None else STATUS_BY_OUTCOME[before.outcome]
            statuses.append(status)
            failed_at.append(before.completed_at if before and status == "failed" else None)
        else:
            status = STATUS_BY_OUTCOME[event.outcome]
            statuses.append(status)
            failed_at.append(event.completed_at if status == "failed" else None)
    newest = [latest.get(p) for p in ordered]
    fetched_ends = [fetched[p].completed_at if p in fetched else None for p in ordered]
    # The content columns come from the newest success; a page without one in the
    # batch keeps what it had (``ok`` false), whatever the other arrays say.
    held = [content.get(p) for p in ordered]
    await tx.execute(
        _sql(
            "UPDATE pages p SET "
            "last_crawled_at = coalesce(v.ended, p.last_crawled_at), "
            "last_outcome = CASE WHEN v.ended IS NULL THEN p.last_outcome ELSE v.outcome END, "
            "last_status_code = CASE WHEN v.ended IS NULL THEN p.last_status_code "
            "  ELSE v.code END, "
            # A success or 304 arriving after a newer attempt that was retried (which
            # keeps the status it found) makes a page fetched that was not yet, or that
            # failed before it, as it would have in the order they completed.
            "status = CASE WHEN v.status IS NOT NULL THEN v.status "
            "  WHEN v.fetched IS NOT NULL AND (p.status = 'discovered' "
            "  OR p.status = 'failed' AND p.failed_at < v.fetched) THEN 'fetched' "
            "  ELSE p.status END, "
            "fetched_at = coalesce(v.fetched, p.fetched_at), "
            # Cleared with the failure it dates: by a status that is not a failure, not
            # by a success older than it, whose batch's newest attempt (a 503, retried)
            # kept the page failed.
            "failed_at = CASE WHEN v.failed_at IS NOT NULL THEN v.failed_at "
            "  WHEN v.status IS NOT NULL THEN NULL "
            "  WHEN v.fetched IS NOT NULL AND (p.failed_at IS NULL "
            "  OR p.failed_at < v.fetched) THEN NULL "
            "  ELSE p.failed_at END, "
            "content_at = CASE WHEN v.ok THEN v.content_at ELSE p.content_at END, "
            "title = CASE WHEN v.ok THEN v.title ELSE p.title END, "
            "language = CASE WHEN v.ok THEN v.language ELSE p.language END, "
            "keywords_tsv = CASE WHEN v.ok THEN to_tsvector(CAST(v.cfg AS regconfig), v.words) "
            "  ELSE p.keywords_tsv END, "
            "etag = CASE WHEN v.ok THEN v.etag ELSE p.etag END, "
            "last_modified = CASE WHEN v.ok THEN v.modified ELSE p.last_modified END, "
            "content_hash = CASE WHEN v.ok THEN v.hash ELSE p.content_hash END, "
            "canonical_url = CASE WHEN v.ok THEN v.canonical ELSE p.canonical_url END, "
            "final_url = CASE WHEN v.fetched IS NULL THEN p.final_url ELSE v.final END, "
            # A success older than the page's newest 304 already applied does not lift
            # a noindex that 304 may have said (which one did is not kept): the site's
            # wish is read again at the next visit, the page left out of search till then.
            "noindex = CASE WHEN v.noindex_at IS NULL THEN p.noindex WHEN v.noindex THEN true "
            "  WHEN p.fetched_at > v.noindex_at THEN p.noindex ELSE false END, "
            "linked_at = coalesce(v.linked, p.linked_at), "
            "updated_at = now() "
            "FROM unnest(CAST(:ids AS bigint[]), CAST(:ends AS timestamptz[]), "
            "CAST(:outcomes AS text[]), CAST(:codes AS int[]), CAST(:statuses AS text[]), "
            "CAST(:fetched AS timestamptz[]), "
            "CAST(:failed AS timestamptz[]), CAST(:oks AS boolean[]), "
            "CAST(:content_ats AS timestamptz[]), CAST(:titles AS text[]), "
            "CAST(:languages AS text[]), CAST(:cfgs AS text[]), CAST(:words AS text[]), "
            "CAST(:etags AS text[]), CAST(:modified AS text[]), CAST(:hashes AS text[]), "
            "CAST(:canonicals AS text[]), CAST(:finals AS text[]), "
            "CAST(:noindex_ats AS timestamptz[]), "
            "CAST(:noindexes AS boolean[]), CAST(:linked AS timestamptz[])) "
            "AS v(id, ended, outcome, code, status, fetched, failed_at, ok, content_at, title, "
            "language, cfg, words, etag, modified, hash, canonical, final, noindex_at, noindex, "
            "linked) "
            "WHERE p.id = v.id"
        ),
        {
            "ids": ordered,
            "ends": [e.completed_at if e else None for e in newest],
            "outcomes": [e.outcome.value if e else None for e in newest],
            "codes": [e.status_code if e else None for e in newest],
            "statuses": statuses,
            "fetched": fetched_ends,
            "failed": failed_at,
            "oks": [e is not None for e in held],
            "content_ats": [e.completed_at if e else None for e in held],
            "titles": [e.title if e else None for e in held],
            "languages": [e.language if e else None for e in held],
            "cfgs": [ts_config(e.language if e else None) for e in held],
            "words": [" ".join((e.title or "", *e.keywords)) if e else "" for e in held],
            "etags": [e.etag if e else None for e in held],
            "modified": [e.last_modified if e else None for e in held],
            "hashes": [e.content_hash if e else None for e in held],
            "canonicals": [e.canonical_url if e else None for e in held],
            "finals": [_read_at(fetched[p]) if p in fetched else None for p in ordered],
            "noindex_ats": [indexing[p].completed_at if p in indexing else None for p in ordered],
            "noindexes": [indexing[p].noindex if p in indexing else False for p in ordered],
            "linked": [linking[p].completed_at if p in linking else None for p in ordered],
        },
    )


def _read_at(event: CrawlCompleted) -> str | None:
    """Where ``event`` read the page (its content, or a 304 that it is unchanged),
    canonical, when not at its own URL."""
    if not event.final_url:
        return None
    final = canonicalize_or_none(event.final_url)
    return None if final == event.url else final


async def _links(
    tx: Transaction, linking: dict[int, CrawlCompleted], page_ids: dict[str, int]
) -> None:
    """Each page's outgoing link set becomes exactly the one of its newest crawl.

    A row whose links did not change is left as it is: most re-crawls find the same
    links, and rewriting the row at every visit of every page added its ~100 entries to
    the GIN index again and left a dead tuple and as many dead entries for vacuum, which
    over months is the table's bloat. Reading the rows first is one query a batch.
    """
    if not linking:
        return
    sources = sorted(linking)
    wanted = {
        source: row
        for source in sources
        if (row := _outlinks_row(source, linking[source], page_ids)) is not None
    }
    kept = {
        source: (list(targets), list(kinds), list(nofollow))
        for source, targets, kinds, nofollow in await tx.fetch(
            _sql(
                "SELECT from_page_id, to_page_ids, kinds, nofollow FROM page_outlinks "
                "WHERE from_page_id = ANY(CAST(:ids AS bigint[]))"
            ),
            {"ids": sources},
        )
    }
    unchanged = {s for s, row in wanted.items() if kept.get(s) == (row[1], row[2], row[3])}
    stale = [s for s in sources if s in kept and s not in unchanged]
    if stale:
        await tx.execute(
            _sql("DELETE FROM page_outlinks WHERE from_page_id = ANY(CAST(:ids AS bigint[]))"),
            {"ids": stale},
        )
    rows = [row for source, row in wanted.items() if source not in unchanged]
    if not rows:
        return
    # COPY in text form: the arrays hold only integers, link kinds ([a-z_]) and t/f, so
    # nothing needs escaping, and writing them as text skips asyncpg's per-element type
    # checks, which cost more than the rest of the row. The old rows of these pages are
    # gone and the pages are locked, so nothing can conflict.
    text_rows = "".join(
        f"{source}\t{{{','.join(map(str, targets))}}}\t{{{','.join(kinds)}}}\t"
        f"{{{','.join(['t' if n else 'f' for n in nofollow])}}}\n"
        for source, targets, kinds, nofollow in rows
    )
    await tx.copy("page_outlinks", text_rows, ("from_page_id", "to_page_ids", "kinds", "nofollow"))


#: No page's id (they count from 1): a link target without one.
_NO_PAGE = 0


def _outlinks_row(
    source: int, event: CrawlCompleted, page_ids: Mapping[str, int]
) -> tuple[int, list[int], list[str], list[bool]] | None:
    """The ``page_outlinks`` row of a crawl's links: one entry per (target, kind)."""
    links = event.links
    if not links:
        return None
    targets = [page_ids.get(link.url, _NO_PAGE) for link in links]
    if _NO_PAGE in targets:
        # A link whose URL names no host is no page (``_page_ids``): left out.
        links = tuple(link for link in links if link.url in page_ids)
        if not links:
            return None
        targets = [page_ids[link.url] for link in links]
    kinds: list[str] = [link.kind for link in links]
    if len(set(zip(targets, kinds, strict=True))) != len(links):
        # The fetcher sends each (url, kind) once; a stranger may not. Last one wins.
        edges = {(page_ids[link.url], link.kind): link.nofollow for link in links}
        return (source, [t for t, _ in edges], [k for _, k in edges], list(edges.values()))
    return (source, targets, kinds, [link.nofollow for link in links])


def _uuid_or_none(value: str | None) -> uuid.UUID | None:
    return event_uuid(value) if value else None
