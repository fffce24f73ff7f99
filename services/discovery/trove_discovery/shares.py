"""Shared pages: each poll of a followed timeline becomes the pages its posts share, and
the timeline's next poll.

A ``TimelinePolled`` (from the fetcher) counts only while its follow is current: the
same follow id in ``trove_follows``, not unfollowed, and a poll newer than the last one
handled. Then every link of every post, and the post's own page, enters the crawl as a
``PageDiscovered`` with the post as its provenance (``Share``), scoped to the page's own
host with the follow's depth, deduplicated by the seen set like any link: a page seen
before gets nothing (the recorder keeps each page's shares from the ``TimelinePolled``
itself). Then the next ``TimelinePollRequested`` is scheduled on the timeline's subject:
at once when the poll stopped at its page bound, one poll interval after a poll that
read everything new, and after failures a pause doubling with each failure in a row up
to ``TROVE_POLL_MAX_BACKOFF_SECONDS``, or what the instance asked for (Retry-After, its
rate-limit reset; capped the same way, and doubled with each failure in a row before
it).

Every id derives from the ``TimelinePolled`` id and every time from its
``completed_at`` (no later than the record took the event: ``bus.read_event``), so a
redelivery publishes the same events, which JetStream drops.
An unfollowed timeline's chain stops at its next poll result; the unfollow also drops
the pending poll (``follows.stop_polls``), and a poll already under way when it came is
ignored when it ends. A poll result handled while an unfollow lands is caught by
reading the entry again after scheduling, and its schedule is dropped too; when a new
follow of the timeline landed as well, that schedule may have replaced the new chain's
first poll, so the new chain is resumed at once (also when the result comes back
redelivered, no longer current: its first handling may have scheduled and died).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from nats.aio.msg import Msg
from nats.js.errors import KeyWrongLastSequenceError

from trove_discovery.discovery import Discovery, delivery_count
from trove_discovery.follows import (
    MAX_WRITES,
    FollowStore,
    TimelineFollow,
    resume_polls,
    stop_polls,
)
from trove_discovery.traps import url_trap_reason
from trove_schema.bus import Bus, Retry, read_event
from trove_schema.events import (
    CrawlOutcome,
    PageDiscovered,
    Provenance,
    Scope,
    ScopeKind,
    Share,
    TimelinePolled,
    TimelinePollRequested,
    derived_event_id,
)
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import timeline_schedule_subject
from trove_schema.urls import canonicalize_or_none, domain_of, is_private_host

log = logging.getLogger("trove.discovery.shares")

#: Doublings of the poll interval after failures, at most (the cap is reached long before).
MAX_DOUBLINGS = 32


def poll_delay(event: TimelinePolled, failures: int, settings: DiscoverySettings) -> float:
    """Seconds from the end of ``event``'s poll to the next one."""
    cap = settings.poll_max_backoff_seconds
    asked = min(event.retry_after, cap) if event.retry_after is not None else None
    if event.outcome is not CrawlOutcome.SUCCESS:
        # A Retry-After of 0, or of a date gone by, says nothing: answered to every poll,
        # obeyed, it would make the chain a loop at the host's gap. The back-off then.
        # One asked for after failures in a row is doubled with each, as the host's
        # pause is: waited out, it did not end them.
        if asked:
            return min(cap, asked * 2.0 ** (min(max(failures, 1), MAX_DOUBLINGS) - 1))
        return min(cap, settings.poll_interval_seconds * 2.0 ** min(failures, MAX_DOUBLINGS))
    base = 0.0 if event.more else settings.poll_interval_seconds
    return max(base, asked or 0.0)


def next_poll(
    event: TimelinePolled, follow: TimelineFollow, settings: DiscoverySettings
) -> tuple[TimelinePollRequested, datetime]:
    """The chain's next request after ``event`` (``follow`` has it handled) and when."""
    at = event.completed_at + timedelta(seconds=poll_delay(event, follow.failures, settings))
    backfill: int | None = follow.backfill
    if follow.cursor is None and event.outcome is CrawlOutcome.SUCCESS and not event.more:
        # The timeline was read and held nothing to start a cursor at: whatever it
        # holds next came after the follow, so all of it is new (to the fetcher's own
        # bound). The follow's backfill, 0 say, would have left its first post out.
        backfill = None
    request = TimelinePollRequested(
        id=derived_event_id(event.id, "next-poll"),
        instance=event.instance,
        domain=event.domain,
        timeline=event.timeline,
        follow_id=event.follow_id,
        cursor=follow.cursor,
        cursor_at=follow.cursor_at,
        recent=follow.recent,
        backfill=backfill,
        back_from=follow.back_from,
        back_left=follow.back_left,
        back_failures=follow.back_failures,
        api=event.api,
        software=event.software,
        software_version=event.software_version,
        poll=event.poll + 1,
        failures=follow.failures,
        not_before=at,
        caused_by=event.id,
    )
    return request, at


def shared_pages(
    event: TimelinePolled, follow: TimelineFollow, settings: DiscoverySettings
) -> list[PageDiscovered]:
    """The pages ``event``'s posts share, and the posts' own pages, once each."""
    pages: dict[str, PageDiscovered] = {}
    for post in event.posts:
        provenance = Provenance(
            kind="share",
            share=Share(
                instance=event.instance,
                post_uri=post.uri,
                post_url=post.url,
                account=post.account,
                shared_at=post.shared_at,
                language=post.language,
            ),
        )
        # The post's page is crawled for itself only: its links came as the post's links.
        wanted = [(link, follow.max_depth) for link in post.links]
        if post.url is not None:
            wanted.append((post.url, 0))
        for raw, max_depth in wanted:
            url = canonicalize_or_none(raw)
            if url is None or url in pages:
                continue
            domain = domain_of(url)
            if is_private_host(domain, settings.allowed_networks, settings.nat64_prefixes):
                log.info("shared URL on a private address skipped", extra={"url": url})
                continue
            if url_trap_reason(
                url,
                max_length=settings.max_url_length,
                max_path_repetitions=settings.max_path_repetitions,
            ):
                continue
            pages[url] = PageDiscovered(
                id=derived_event_id(f"{event.id}:{url}", "shared"),
                url=url,
                domain=domain,
                depth=0,
                priority=follow.priority,
                scope=Scope(kind=ScopeKind.HOST, value=domain, max_depth=max_depth),
                provenance=provenance,
            )
    return list(pages.values())


class Shares:
    """Handles ``TimelinePolled``: the shared pages, then the timeline's next poll."""

    def __init__(
        self,
        *,
        bus: Bus,
        store: FollowStore,
        discovery: Discovery,
        settings: DiscoverySettings,
    ) -> None:
        self.bus = bus
        self.store = store
        self.discovery = discovery
        self.settings = settings

    async def handle_timeline_polled(self, msg: Msg) -> None:
        event = read_event(msg)
        if isinstance(event, TimelinePolled):
            await self.polled(event, redelivered=delivery_count(msg) > 1)

    async def polled(self, event: TimelinePolled, *, redelivered: bool = False) -> None:
        follow = await self._advance(event)
        if follow is not None:
            pages = shared_pages(event, follow, self.settings)
            await self.discovery.discover(pages, cause=event.id)
            request, at = next_poll(event, follow, self.settings)
            await self.bus.publish_at(
                request, at, schedule=timeline_schedule_subject(event.instance, event.timeline)
            )
        # A redelivery may have scheduled in its first handling, which then died.
        if follow is not None or redelivered:
            await self._after_commands(event, scheduled=follow is not None)

    async def _after_commands(self, event: TimelinePolled, *, scheduled: bool) -> None:
        """Commands applied since ``event``'s chain scheduled its next poll: an unfollow
        dropped nothing (drop it now); a follow after it had its first poll replaced by
        this chain's, whose answer is ignored (resume the new chain). And a later poll's
        result handled meanwhile (a redelivery of this one, come back after the events'
        duplicate window beside the next): the poll this handling ``scheduled`` may have
        replaced the one that result scheduled, and its answer would be ignored as older,
        the chain ended for good (resume it). Ids derive from ``event``: a redelivery
        repeats them."""
        current = await self.store.timeline(event.instance, event.timeline)
        if current is None:
            return
        known: TimelinePolled | None = None
        if current.follow_id == event.follow_id and current.following:
            if not scheduled or current.poll <= event.poll:
                return
            # Its own chain: what the instance answered to it stands.
            why, tag, known = "a later poll's result handled: the chain", "resume-later", event
        elif not current.following:
            msg_id = derived_event_id(event.id, "stop")
            await stop_polls(self.bus, event.instance, event.timeline, msg_id=msg_id)
            return
        else:
            why, tag = "timeline followed again while polled: the new chain", "resume"
        log.info(f"{why} resumed", extra={"instance": event.instance, "timeline": event.timeline})
        await resume_polls(
            self.bus,
            event.instance,
            event.domain,
            event.timeline,
            current,
            id=derived_event_id(event.id, tag),
            known=known,
        )

    async def _advance(self, event: TimelinePolled) -> TimelineFollow | None:
        """Record ``event`` as the follow's last poll; None when it no longer counts."""
        where = {"instance": event.instance, "timeline": event.timeline, "poll": event.poll}
        for _ in range(MAX_WRITES):
            # Read again after a write lost: a follow again may have landed meanwhile. One
            # landing after the read is caught once the next poll is scheduled
            # (``_after_commands``), as one landing after the write is.
            record, _ = await self.store.read(event.instance)
            entry = record.timelines.get(event.timeline)
            if entry is None or entry.follow_id != event.follow_id:
                log.info("poll of a follow that is no longer current ignored", extra=where)
                return None
            if not entry.following:
                log.info("timeline unfollowed: its polls stop", extra=where)
                return None
            follow, revision = await self.store.progress(event.instance, event.timeline, entry)
            if follow.polled_id == event.id:
                return follow  # a redelivery: publish the same events again
            if event.poll <= follow.poll:
                log.info("poll older than the last one handled ignored", extra=where)
                return None
            failed = event.outcome is not CrawlOutcome.SUCCESS
            # A poll that asked the instance nothing (its host's slot too far off: its
            # pause after a 403 or an outage grows to a day) ends no run of failures, or
            # the chain's own back-off would start again at each.
            failures = follow.failures + 1 if failed else 0 if event.requests else follow.failures
            cursor = event.cursor_after if event.cursor_after else follow.cursor
            # The time goes with its cursor. A poll that left the cursor where it was,
            # answered by a release that does not tell the time, keeps the one known.
            cursor_at = event.cursor_after_at
            if cursor_at is None and cursor == follow.cursor:
                cursor_at = follow.cursor_at
            advanced = follow.model_copy(
                update={
                    "poll": event.poll,
                    "polled_id": event.id,
                    "cursor": cursor,
                    "cursor_at": cursor_at,
                    "recent": follow.recent if failed else event.recent_after,
                    "back_from": follow.back_from if failed else event.back_from,
                    "back_left": follow.back_left if failed else event.back_left,
                    # Counted by the poll, a failed one too: it may be what it counted.
                    "back_failures": event.back_failures,
                    "failures": failures,
                }
            )
            try:
                await self.store.advance(event.instance, event.timeline, advanced, revision)
            except KeyWrongLastSequenceError:
                continue
            return advanced
        raise Retry(f"{event.instance} {event.timeline}: its progress kept changing", delay=1.0)
