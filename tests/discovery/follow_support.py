"""Helpers for the follow and share tests: operator commands, and reading the record."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import nats
from nats.js.api import RawStreamMsg
from nats.js.errors import KeyNotFoundError, NotFoundError

from tests.conftest import StackUrls, eventually
from trove_discovery.follows import (
    FollowStore,
    InstanceFollows,
    TimelineFollow,
    follows_key,
    progress_key,
)
from trove_schema.bus import Bus
from trove_schema.events import (
    CrawlOutcome,
    Event,
    SharedPost,
    TimelinePolled,
    TimelinePollRequested,
    decode_event,
)
from trove_schema.topology import (
    DISCOVERY_FOLLOWS,
    EVENT_SCHEDULES_PREFIX,
    EVENTS_STREAM,
    SEEDS_STREAM,
    timeline_schedule_subject,
)

E = TypeVar("E", bound=Event)


class BusyReplicas(FollowStore):
    """The real store, with another replica writing the key again (the same value)
    between every read and write of this one: each compare-and-set loses."""

    async def _written_meanwhile(self, key: str, empty: bytes) -> None:
        try:
            value = (await self.kv.get(key)).value or empty
        except KeyNotFoundError:
            value = empty
        await self.kv.put(key, value)

    async def write(self, record: InstanceFollows, revision: int | None) -> None:
        empty = InstanceFollows(instance=record.instance).model_dump_json().encode()
        await self._written_meanwhile(follows_key(record.instance), empty)
        await super().write(record, revision)

    async def advance(
        self, instance: str, timeline: str, follow: TimelineFollow, revision: int | None
    ) -> None:
        await self._written_meanwhile(progress_key(instance, timeline), b"")
        await super().advance(instance, timeline, follow, revision)


class SchedulingBus(Bus):
    """The real bus, keeping the polls it is asked to schedule; ``before``, when set, is
    awaited with each first (the operator's commands landing just then)."""

    scheduled: list[TimelinePollRequested]
    before: Callable[[TimelinePollRequested], Awaitable[None]] | None = None

    async def publish_at(
        self,
        event: Event,
        at: datetime,
        *,
        subject: str | None = None,
        schedules_prefix: str = EVENT_SCHEDULES_PREFIX,
        schedule: str | None = None,
        replacing: int | None = None,
    ) -> None:
        if isinstance(event, TimelinePollRequested):
            self.scheduled.append(event)
            if self.before is not None:
                await self.before(event)
        await super().publish_at(
            event,
            at,
            subject=subject,
            schedules_prefix=schedules_prefix,
            schedule=schedule,
            replacing=replacing,
        )


async def ask(stack: StackUrls, subject: str, payload: bytes) -> str:
    """What `nats req trove.follow ...` prints, once discovery listens."""
    nc = await nats.connect(stack.nats_url)
    try:

        async def reply() -> str:
            try:
                return (await nc.request(subject, payload, timeout=2)).data.decode()
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                # The seeds stream listens silently: until discovery subscribes, a
                # request times out.
                return ""

        return await eventually(reply, until=bool, timeout=30, what="a reply")
    finally:
        await nc.close()


async def recorded(bus: Bus, kind: type[E]) -> list[E]:
    """Every event of ``kind`` in the record, in order."""
    info = await bus.js.stream_info(EVENTS_STREAM)
    found: list[E] = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            msg = await bus.js.get_msg(EVENTS_STREAM, seq)
        except NotFoundError:
            continue
        if msg.subject == kind.SUBJECT and msg.data:
            event = decode_event(msg.data)
            assert isinstance(event, kind)
            found.append(event)
    return found


async def pending_poll(bus: Bus, instance: str, timeline: str) -> RawStreamMsg | None:
    """The last message on the timeline's schedule subject (the pending poll, or a tombstone)."""
    try:
        return await bus.js.get_last_msg(
            EVENTS_STREAM, timeline_schedule_subject(instance, timeline)
        )
    except NotFoundError:
        return None


async def poll_due_now(bus: Bus, instance: str, timeline: str) -> TimelinePollRequested:
    """A poll asked for at once: pending on the timeline's schedule or, on a loaded
    machine, fired already (nats-server's scheduler quicker than the look)."""

    async def look() -> TimelinePollRequested | None:
        pending = await pending_poll(bus, instance, timeline)
        if pending is not None and pending.data:
            event = decode_event(pending.data)
            assert isinstance(event, TimelinePollRequested)
            return event
        fired = [
            request
            for request in await recorded(bus, TimelinePollRequested)
            if (request.instance, request.timeline) == (instance, timeline)
        ]
        return fired[-1] if fired else None

    found = await eventually(look, until=lambda r: r is not None, timeout=10, what="the poll")
    assert found is not None
    return found


async def publish_polled(bus: Bus, event: TimelinePolled, *, msg_id: str | None = None) -> int:
    """Publish a poll result as the fetcher would; ``msg_id``: as a redelivery would come
    back under another id (``trove dead redrive``). The stream sequence it got."""
    headers = event.headers() | ({"Nats-Msg-Id": msg_id} if msg_id else {})
    ack = await bus.js.publish(event.SUBJECT, event.to_wire(), headers=headers)
    return ack.seq


async def handled(bus: Bus, stream: str, durable: str, seq: int) -> bool:
    """The consumer got past ``seq`` and holds nothing unacked."""
    info = await bus.js.consumer_info(stream, durable)
    delivered = info.delivered.stream_seq or 0
    return delivered >= seq and info.num_ack_pending == 0 and info.num_pending == 0


async def commands_handled(bus: Bus, what: str = "the commands handled") -> None:
    """Wait until discovery has handled every follow and unfollow sent so far."""
    last = (await bus.js.stream_info(SEEDS_STREAM)).state.last_seq
    await eventually(
        lambda: handled(bus, SEEDS_STREAM, DISCOVERY_FOLLOWS, last),
        until=bool,
        timeout=30,
        what=what,
    )


def polled(
    request: TimelinePollRequested,
    *,
    outcome: CrawlOutcome = CrawlOutcome.SUCCESS,
    completed_at: datetime | None = None,
    posts: tuple[SharedPost, ...] = (),
    **fields: Any,
) -> TimelinePolled:
    """The fetcher's answer to ``request`` (the API it was given, unless found anew)."""
    end = completed_at or datetime.now(UTC)
    # One request at least: a poll deferred for its host's slot asks nothing (``requests``
    # 0), and tells nothing of the instance.
    found = {"api": request.api, "software": request.software, "requests": 1} | fields
    return TimelinePolled(
        request_id=request.id,
        instance=request.instance,
        domain=request.domain,
        timeline=request.timeline,
        follow_id=request.follow_id,
        poll=request.poll,
        outcome=outcome,
        started_at=end - timedelta(seconds=1),
        completed_at=end,
        cursor_before=request.cursor,
        posts=posts,
        **found,
    )
