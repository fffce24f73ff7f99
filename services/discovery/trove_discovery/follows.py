"""Following fediverse instances: the operator's commands, and what is followed.

Commands go to ``trove.follow`` and ``trove.unfollow`` (stream TROVE_SEEDS, consumer
``discovery-follows``), in the forms ``trove.seeds`` takes (UTF-8, a leading BOM ignored):

* a plain URL, as ``nats pub trove.follow https://social.example`` sends it: its local
  timeline;
* lines, one instance a line, each optionally followed by a timeline
  (``https://social.example tag:python``); blank lines and ``#`` comments are skipped;
* a JSON array of instance URLs;
* a JSON object: ``{"instance": "..."}`` or ``{"instances": [...]}`` with ``timeline``
  (``local``, ``public`` or ``tag:NAME``; default ``local``), ``max_depth`` (0..100,
  default 0: the shared pages alone; the crawl stays on each shared page's host),
  ``priority`` (-100..100, default 0) and ``backfill`` (0..1000 posts read back from the
  follow, default 40). An unfollow takes ``instance``/``instances`` and
  ``timeline`` only; without a timeline it stops every followed timeline of the
  instance. Unknown keys are refused, so that a typo is not silently a default.

An instance is an origin (``https://host[:port]``): a path, a query or credentials are
refused, as are a private address outside ``TROVE_ALLOWED_NETWORKS`` and a bad
timeline name. ``nats req`` gets an answer, text for text and JSON for JSON.

What is followed lives in the KV bucket ``trove_follows``, written only by
compare-and-set. One key per instance (so that "every timeline of it" is one read)
holds each timeline's current follow (the ``InstanceFollowed`` id, which every poll of
its chain carries) and its options: only commands write it. One key per timeline holds
its progress: the last poll handled, with the cursor (and when it was read), the
ids read behind it and the failures in a row it ended on; only its own polls write it.
Kept in the instance's key, a poll of any timeline rewrote every timeline of the
instance, and the polls of its timelines raced each other's writes; the instance's
value grew with the ids its timelines read (post ids are the instance's to choose, 200
characters each) until it passed nats-server's largest message, and every write of the
instance failed. Progress an earlier release kept in the instance's key is read from
there until the timeline's next poll writes its own (a record without the cursor's
time reads as not knowing it). Following a timeline already followed changes nothing:
its chain and cursor go on. An unfollowed timeline keeps its entry, marked, so that a
poll of its chain still under way is recognised and ignored; its progress is dropped.

Each follow starts its timeline's chain of polls: a ``TimelinePollRequested`` scheduled
on the timeline's own subject (``timeline_schedule_subject``), where JetStream keeps one
pending schedule, so a timeline never has two chains (``trove_discovery.shares`` goes
on with it). An unfollow drops the pending poll with a subject rollup (the stream
allows rollups), leaving a tombstone on the schedule subject that no one consumes.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlsplit

from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, field_validator

from trove_discovery.errors import InvalidFollow, InvalidURL
from trove_discovery.replies import (
    MAX_RAW_LENGTH,
    Refused,
    command_origin,
    command_place,
    listed,
    read_json,
    refused_item,
    reply_lines,
)
from trove_schema.bus import Bus, Retry
from trove_schema.events import (
    MAX_BACKFILL,
    MAX_RECENT_POSTS,
    InstanceFollowed,
    InstanceUnfollowed,
    Provenance,
    SeedRejected,
    TimelineName,
    TimelinePolled,
    TimelinePollRequested,
    derived_event_id,
    utcnow,
)
from trove_schema.exclusions import NO_EXCLUSIONS, Exclusions, ListedExclusions
from trove_schema.seed_text import LINE_ENDS
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import UNFOLLOW_SUBJECT, timeline_schedule_subject
from trove_schema.urls import canonicalize, domain_of, is_private_host, origin_of

log = logging.getLogger("trove.discovery.follows")

MAX_INSTANCES_PER_MESSAGE = 100
DEFAULT_TIMELINE = "local"
DEFAULT_BACKFILL = 40
#: Compare-and-set attempts on an entry before giving up (and retrying the message
#: later): an instance's is written by commands, a timeline's progress by its polls.
MAX_WRITES = 50

_FOLLOW_KEYS = frozenset({"instance", "instances", "timeline", "max_depth", "priority", "backfill"})
_UNFOLLOW_KEYS = frozenset({"instance", "instances", "timeline"})
_TIMELINE = TypeAdapter(TimelineName)

Verb = Literal["follow", "unfollow"]


@dataclass(frozen=True, slots=True)
class InstanceCommand:
    """One accepted (un)follow: the instance's origin and the timeline it is about."""

    instance: str
    domain: str
    #: None in an unfollow: every followed timeline of the instance.
    timeline: str | None
    #: What was sent (whitespace around it removed).
    original: str
    max_depth: int = 0
    priority: int = 0
    backfill: int = DEFAULT_BACKFILL

    @property
    def label(self) -> str:
        return f"{self.instance} {self.timeline or '(every timeline)'}"


#: A follow or unfollow that was not accepted, and why.
RejectedCommand = Refused


@dataclass(frozen=True, slots=True)
class CommandBatch:
    verb: Verb
    accepted: tuple[InstanceCommand, ...] = ()
    rejected: tuple[RejectedCommand, ...] = ()


@dataclass(frozen=True, slots=True)
class _Options:
    timeline: str | None
    max_depth: int = 0
    priority: int = 0
    backfill: int = DEFAULT_BACKFILL


def verb_of(subject: str) -> Verb:
    return "unfollow" if subject == UNFOLLOW_SUBJECT else "follow"


def parse_command(
    data: bytes,
    *,
    verb: Verb,
    settings: DiscoverySettings,
    exclusions: Exclusions = NO_EXCLUSIONS,
) -> CommandBatch:
    """Parse one follow or unfollow message (never raises: problems become rejections)."""
    try:
        text = data.decode("utf-8").removeprefix("\ufeff").strip()
    except UnicodeDecodeError as exc:
        raw = data[:MAX_RAW_LENGTH].decode("utf-8", "replace")
        return _rejected(verb, raw, f"not UTF-8 text ({exc.reason} at byte {exc.start})")
    if not text:
        return _rejected(verb, "", f"empty {verb} message")
    default = _Options(timeline=DEFAULT_TIMELINE if verb == "follow" else None)
    lines: list[tuple[object, _Options, str | None]]
    if text[0] in "{[":
        document, refusal = read_json(text)
        if refusal is not None:
            return _rejected(verb, text, refusal)
        try:
            lines = _from_json(document, verb, default)
        except InvalidFollow as exc:
            return _rejected(verb, text, exc.reason)
    else:
        lines = []
        for line in LINE_ENDS.split(text):  # as a seed message's lines
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            # Any whitespace between them (a tab, pasted from a sheet): the URL parser
            # drops tabs, and "https://social.example\tlocal" was another host.
            url, timeline = (*stripped.split(None, 1), "")[:2]
            timeline = timeline.strip()
            lines.append((url, _Options(timeline=timeline) if timeline else default, stripped))
    if not lines:
        return _rejected(verb, text, "no instances in the message")
    return _build(verb, lines, settings, exclusions)


def _build(
    verb: Verb,
    lines: list[tuple[object, _Options, str | None]],
    settings: DiscoverySettings,
    exclusions: Exclusions,
) -> CommandBatch:
    accepted: list[InstanceCommand] = []
    rejected: list[RejectedCommand] = []
    seen: set[tuple[str, str | None]] = set()
    rest = lines[MAX_INSTANCES_PER_MESSAGE:]
    for candidate, options, line in lines[:MAX_INSTANCES_PER_MESSAGE]:
        if not isinstance(candidate, str):
            rejected.append(RejectedCommand(json.dumps(candidate), "not a URL string"))
            continue
        original = candidate.strip()
        raw = line or original
        try:
            # An unfollow ends a follow made before the address was refused (the
            # allowed networks narrowed since), as before an exclusion (below).
            instance, domain = instance_origin(original, settings, private=verb != "follow")
            timeline = None if options.timeline is None else timeline_name(options.timeline)
        except InvalidFollow as exc:
            rejected.append(RejectedCommand(raw, exc.reason))
            continue
        refusal = exclusions.refusal(domain) if verb == "follow" else None
        if refusal is not None:  # an unfollow still ends a follow made before the rule
            rejected.append(RejectedCommand(raw, refusal))
            continue
        if (instance, timeline) in seen:
            continue
        seen.add((instance, timeline))
        accepted.append(
            InstanceCommand(
                instance=instance,
                domain=domain,
                timeline=timeline,
                original=original,
                max_depth=options.max_depth,
                priority=options.priority,
                backfill=options.backfill,
            )
        )
    if rest:
        # Together, as a seed message's: one refusal each would be a log line each, and
        # a megabyte of short lines half a million of them.
        candidate, _, line = rest[0]
        raw = line or (candidate if isinstance(candidate, str) else json.dumps(candidate))
        reason = (
            f"more than {MAX_INSTANCES_PER_MESSAGE} instances in one message: "
            f"{len(rest)} from this one on not read"
        )
        rejected.append(RejectedCommand(raw.strip(), reason))
    return CommandBatch(verb=verb, accepted=tuple(accepted), rejected=tuple(rejected))


def instance_origin(
    raw: str, settings: DiscoverySettings, *, private: bool = False
) -> tuple[str, str]:
    """The origin (``https://host[:port]``, no slash) and domain of an instance URL; one
    on a private address only when ``private`` (else ``InvalidFollow``)."""
    try:
        url = canonicalize(raw, max_length=settings.max_url_length)
    except InvalidURL as exc:
        raise InvalidFollow(exc.reason) from None
    try:
        # As canonicalize read it, a backslash a slash: read raw, a backslash and a
        # bracket after the host would be a broken IPv6 literal to urlsplit.
        parts = urlsplit(raw.strip().replace("\\", "/"))
    except ValueError as exc:
        raise InvalidFollow(f"not a URL: {exc}") from None
    if parts.username is not None or parts.password is not None:
        raise InvalidFollow("an instance URL carries no credentials")
    canonical = urlsplit(url)
    if canonical.path not in ("", "/") or canonical.query:
        where = canonical.path + (f"?{canonical.query}" if canonical.query else "")
        raise InvalidFollow(
            f"an instance is an origin (scheme://host[:port]), not a page: drop {where!r}"
        )
    domain = domain_of(url)
    if not private and is_private_host(domain, settings.allowed_networks, settings.nat64_prefixes):
        raise InvalidFollow(f"host {domain} is a private address (not in TROVE_ALLOWED_NETWORKS)")
    return origin_of(url), domain


def timeline_name(value: object) -> str:
    """The timeline's one spelling: a tag in lower case (Mastodon, Pleroma and GoToSocial
    match hashtags whatever their case: ``tag:Python`` and ``tag:python`` are one
    timeline, and two spellings were two chains reading the same posts)."""
    try:
        name = str(_TIMELINE.validate_python(value))
    except ValidationError:
        raise InvalidFollow(
            f'"timeline" must be "local", "public" or "tag:NAME" (NAME: up to 100 letters, '
            f"digits or _), not {value!r}"
        ) from None
    return "tag:" + name[4:].lower() if name.startswith("tag:") else name


def _spelled(record: InstanceFollows, timeline: str) -> str:
    """The key ``timeline`` has in ``record``: itself, unless it is not followed and a
    tag is under another case (kept so by a release that kept the case given)."""
    current = record.timelines.get(timeline)
    if not timeline.startswith("tag:") or (current is not None and current.following):
        return timeline
    for name, follow in record.timelines.items():
        if name.lower() == timeline and follow.following:
            return name
    return timeline


def _from_json(
    document: Any, verb: Verb, default: _Options
) -> list[tuple[object, _Options, str | None]]:
    if isinstance(document, list):
        return [(item, default, None) for item in document]
    if not isinstance(document, dict):  # pragma: no cover - json of "{"/"[" is one of both
        raise InvalidFollow("a JSON message is an object or an array")
    known = _FOLLOW_KEYS if verb == "follow" else _UNFOLLOW_KEYS
    unknown = sorted(set(document) - known)
    if unknown:
        names = ", ".join(repr(key) for key in unknown)
        raise InvalidFollow(f"unknown key(s) {names}; known keys are {', '.join(sorted(known))}")
    if ("instance" in document) == ("instances" in document):
        raise InvalidFollow('give exactly one of "instance" and "instances"')
    if "instance" in document:
        candidates: list[object] = [document["instance"]]
    elif isinstance(document["instances"], list):
        candidates = list(document["instances"])
    else:
        raise InvalidFollow('"instances" must be an array of strings')
    timeline = document.get("timeline", default.timeline)
    # None is every timeline, which only an unfollow can name: a follow's null is refused.
    if timeline is not None or verb == "follow":
        timeline = timeline_name(timeline)
    options = _Options(
        timeline=timeline,
        max_depth=_integer(document, "max_depth", default=0, low=0, high=100),
        priority=_integer(document, "priority", default=0, low=-100, high=100),
        backfill=_integer(document, "backfill", default=DEFAULT_BACKFILL, low=0, high=MAX_BACKFILL),
    )
    return [(candidate, options, None) for candidate in candidates]


def _integer(document: dict[str, Any], key: str, *, default: int, low: int, high: int) -> int:
    value = document.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidFollow(f'"{key}" must be an integer from {low} to {high}, not {value!r}')
    return value


def _rejected(verb: Verb, raw: str, reason: str) -> CommandBatch:
    return CommandBatch(verb=verb, rejected=(RejectedCommand(raw, reason),))


def reply_text(batch: CommandBatch) -> str:
    """A short summary for the reply to ``nats req trove.follow ...``."""
    return reply_lines(
        "following" if batch.verb == "follow" else "unfollowing",
        [command.label for command in batch.accepted],
        [(command.raw, command.reason) for command in batch.rejected],
    )


def reply_json(batch: CommandBatch) -> bytes:
    """The same summary as JSON, its lists cut as a seed request's (``replies.listed``)."""
    accepted, more_accepted = listed(
        {
            "instance": command.instance,
            "timeline": command.timeline,
            "original": command.original,
            **(
                {
                    "max_depth": command.max_depth,
                    "priority": command.priority,
                    "backfill": command.backfill,
                }
                if batch.verb == "follow"
                else {}
            ),
        }
        for command in batch.accepted
    )
    rejected, more_rejected = listed(refused_item(command) for command in batch.rejected)
    body = {
        "verb": batch.verb,
        "accepted_count": len(batch.accepted),
        "rejected_count": len(batch.rejected),
        "accepted": accepted,
        "rejected": rejected,
        "truncated": more_accepted or more_rejected,
    }
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


# state ----------------------------------------------------------------------------


class PollProgress(BaseModel):
    """How far a follow's chain of polls has come: a timeline's own key."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    #: The ``InstanceFollowed`` id: the chain of polls it started carries it.
    follow_id: str
    #: The last poll handled: its number, its ``TimelinePolled`` id, the cursor and the
    #: failures in a row it ended on.
    poll: int = 0
    polled_id: str | None = None
    cursor: str | None = None
    #: When the cursor was read, on the instance's clock (the poller tells a timeline
    #: numbered anew by it); None when not known, as in a record written before it was
    #: kept.
    cursor_at: datetime | None = None
    #: The ids the last poll handled in the lookback behind the cursor (the next reads
    #: it again for late posts, and leaves these alone).
    recent: tuple[str, ...] = ()
    #: The backfill still to be read back below ``back_from`` (its first poll's pages
    #: did not finish it); None and 0 once done.
    back_from: str | None = None
    back_left: int = 0
    #: The backfill's pages refused in a row (``TimelinePolled.back_failures``).
    back_failures: int = 0
    failures: int = 0

    @field_validator("recent")
    @classmethod
    def _newest(cls, recent: tuple[str, ...]) -> tuple[str, ...]:
        # A release with a higher limit may have written more, and been rolled back: the
        # poll request built from the record would be refused, and the timeline stop.
        return recent[-MAX_RECENT_POSTS:]

    @field_validator("back_left")
    @classmethod
    def _within_a_backfill(cls, left: int) -> int:
        return min(max(left, 0), MAX_BACKFILL)  # as ``recent``: what a request takes

    @field_validator("back_failures")
    @classmethod
    def _counted(cls, failures: int) -> int:
        return max(failures, 0)  # as ``back_left``: what a request takes


class TimelineFollow(PollProgress):
    """A followed (or formerly followed) timeline: its entry in the instance's key, and
    as read, its progress from the timeline's key (``FollowStore.timeline``)."""

    followed_at: datetime
    max_depth: int = 0
    priority: int = 0
    backfill: int = DEFAULT_BACKFILL
    #: The ``InstanceUnfollowed`` that stopped it; None while it is followed.
    unfollowed_by: str | None = None

    @property
    def following(self) -> bool:
        return self.unfollowed_by is None

    @property
    def progress(self) -> PollProgress:
        return PollProgress.model_validate(self.model_dump(include=_PROGRESS_FIELDS))


_PROGRESS_FIELDS = set(PollProgress.model_fields)


class InstanceFollows(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    instance: str
    timelines: dict[str, TimelineFollow] = {}


def follows_key(instance: str) -> str:
    return "i." + hashlib.sha256(instance.encode()).hexdigest()[:40]


def progress_key(instance: str, timeline: str) -> str:
    # As the instance's entry names it: a release before kept a tag in the case given,
    # and two follows of one tag in two cases are two chains, each its own progress.
    name = f"{instance} {timeline}"
    return "p." + hashlib.sha256(name.encode()).hexdigest()[:40]


class FollowStore:
    """The ``trove_follows`` bucket: an instance's entry and its timelines' progress,
    each written by compare-and-set."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    async def read(self, instance: str) -> tuple[InstanceFollows, int | None]:
        """The instance's entry and its revision (an empty entry and None when absent)."""
        try:
            entry = await self.kv.get(follows_key(instance))
        except KeyNotFoundError:
            return InstanceFollows(instance=instance), None
        if not entry.value:
            return InstanceFollows(instance=instance), entry.revision
        return InstanceFollows.model_validate_json(entry.value), entry.revision

    async def write(self, record: InstanceFollows, revision: int | None) -> None:
        """Raises ``KeyWrongLastSequenceError`` when someone wrote since ``revision``."""
        value = record.model_dump_json().encode()
        if revision is None:
            await self.kv.create(follows_key(record.instance), value)
        else:
            await self.kv.update(follows_key(record.instance), value, last=revision)

    async def progress(
        self, instance: str, timeline: str, follow: TimelineFollow
    ) -> tuple[TimelineFollow, int | None]:
        """``follow`` with its chain's progress, and the revision of the timeline's key
        (None when absent). A key of another follow of the timeline (one before an
        unfollow whose drop was lost) says nothing of this one."""
        try:
            entry = await self.kv.get(progress_key(instance, timeline))
        except KeyNotFoundError:
            return follow, None
        if entry.value:
            progress = PollProgress.model_validate_json(entry.value)
            if progress.follow_id == follow.follow_id:
                return follow.model_copy(update=progress.model_dump()), entry.revision
        return follow, entry.revision

    async def timeline(self, instance: str, timeline: str) -> TimelineFollow | None:
        """The timeline's follow as it stands, with its progress; None if never followed."""
        record, _ = await self.read(instance)
        follow = record.timelines.get(timeline)
        if follow is None:
            return None
        return (await self.progress(instance, timeline, follow))[0]

    async def advance(
        self, instance: str, timeline: str, follow: TimelineFollow, revision: int | None
    ) -> None:
        """Write ``follow``'s progress; raises ``KeyWrongLastSequenceError`` when someone
        wrote since ``revision``."""
        key = progress_key(instance, timeline)
        value = follow.progress.model_dump_json().encode()
        if revision is None:
            await self.kv.create(key, value)
        else:
            await self.kv.update(key, value, last=revision)

    async def drop_progress(self, instance: str, timeline: str) -> None:
        await self.kv.delete(progress_key(instance, timeline))


def with_timeline(record: InstanceFollows, name: str, follow: TimelineFollow) -> InstanceFollows:
    return record.model_copy(update={"timelines": {**record.timelines, name: follow}})


# the chain ------------------------------------------------------------------------


async def start_polls(bus: Bus, followed: InstanceFollowed, follow: TimelineFollow) -> None:
    """The first poll of a new follow: now, on the timeline's schedule subject."""
    await resume_polls(
        bus,
        followed.instance,
        followed.domain,
        followed.timeline,
        follow,
        id=derived_event_id(followed.id, "first-poll"),
    )


async def resume_polls(
    bus: Bus,
    instance: str,
    domain: str,
    timeline: str,
    follow: TimelineFollow,
    *,
    id: str,
    known: TimelinePolled | None = None,
) -> None:
    """The follow's next poll, now (its first, for a follow that has not polled yet).

    After a first poll: its chain may have lost its pending poll to another chain's
    schedule on the same subject. A poll of it already pending or under way is then
    answered twice under one number, and the second answer ignored. ``known``: a poll
    result of this chain, whose API and software the poll need not ask NodeInfo for."""
    now = utcnow()
    # A successful empty read leaves no cursor and no failure: all that comes is new.
    read_empty = follow.poll > 0 and follow.cursor is None and follow.failures == 0
    request = TimelinePollRequested(
        id=id,
        instance=instance,
        domain=domain,
        timeline=timeline,
        follow_id=follow.follow_id,
        cursor=follow.cursor,
        cursor_at=follow.cursor_at,
        recent=follow.recent,
        backfill=None if read_empty else follow.backfill,
        back_from=follow.back_from,
        back_left=follow.back_left,
        back_failures=follow.back_failures,
        poll=follow.poll + 1,
        failures=follow.failures,
        not_before=now,
        caused_by=follow.polled_id or follow.follow_id,
    )
    if known is not None:
        request = request.model_copy(
            update={
                "api": known.api,
                "software": known.software,
                "software_version": known.software_version,
            }
        )
    await bus.publish_at(request, now, schedule=timeline_schedule_subject(instance, timeline))


async def stop_polls(bus: Bus, instance: str, timeline: str, *, msg_id: str) -> None:
    """Drop the timeline's pending poll: a rollup of its schedule subject (a tombstone)."""
    subject = timeline_schedule_subject(instance, timeline)
    headers = {"Nats-Rollup": "sub", "Nats-Msg-Id": msg_id}
    await bus.js.publish(subject, b"", headers=headers)


# commands ---------------------------------------------------------------------------


class Follows:
    """Applies follow and unfollow commands; answers ``nats req`` on their subjects."""

    def __init__(
        self,
        *,
        bus: Bus,
        store: FollowStore,
        settings: DiscoverySettings,
        exclusions: Exclusions = NO_EXCLUSIONS,
        listed: ListedExclusions | None = None,
    ) -> None:
        self.bus = bus
        self.store = store
        self.settings = settings
        #: A follow is judged on the shared list as it is (``ListedExclusions.fresh``).
        self.listed = listed
        self.exclusions = listed.exclusions if listed else exclusions

    async def _fresh(self) -> Exclusions:
        return await self.listed.fresh() if self.listed else self.exclusions

    async def handle_command(self, msg: Msg) -> None:
        place = command_place(msg)
        verb = verb_of(msg.subject)
        batch = parse_command(
            msg.data, verb=verb, settings=self.settings, exclusions=await self._fresh()
        )
        origin = command_origin(msg)
        for n, rejected in enumerate(batch.rejected):
            log.warning(f"{verb} refused", extra={"raw": rejected.raw, "reason": rejected.reason})
            # Recorded as a refused seed is (``seed_rejections``): a ``nats pub`` gets no
            # answer, and the log is not kept for months.
            await self.bus.publish(
                SeedRejected(
                    id=derived_event_id(f"{verb}:{place}:{n}", "rejected"),
                    raw=rejected.raw[:512],
                    reason=f"{verb} refused: {rejected.reason}",
                    provenance=Provenance(kind="seed", origin=origin),
                )
            )
        for command in batch.accepted:
            if verb == "follow":
                await self.follow(command, place=place, origin=origin)
            else:
                await self.unfollow(command, place=place, origin=origin)

    async def reply_to_request(self, msg: Msg) -> None:
        """A ``nats req trove.follow ...`` gets what was accepted and rejected, and why."""
        if not msg.reply:
            return  # a plain publish: the stream consumer handles it
        batch = parse_command(
            msg.data,
            verb=verb_of(msg.subject),
            settings=self.settings,
            exclusions=await self._fresh(),
        )
        as_json = msg.data.lstrip()[:1] in (b"{", b"[")
        await msg.respond(reply_json(batch) if as_json else reply_text(batch).encode())

    async def follow(self, command: InstanceCommand, *, place: str, origin: str) -> bool:
        """Follow the timeline unless it is followed already; True when this command did."""
        assert command.timeline is not None
        timeline = command.timeline
        event = InstanceFollowed(
            id=derived_event_id(f"follow:{place}:{command.instance} {timeline}", "followed"),
            instance=command.instance,
            domain=command.domain,
            timeline=timeline,
            max_depth=command.max_depth,
            priority=command.priority,
            backfill=command.backfill,
            provenance=Provenance(kind="seed", origin=origin),
        )
        for _ in range(MAX_WRITES):
            record, revision = await self.store.read(command.instance)
            spelled = _spelled(record, timeline)
            current = record.timelines.get(spelled)
            if current is not None and current.follow_id == event.id:
                if not current.following:
                    return False  # this follow was redelivered after its unfollow
                # A redelivery: publish again, idempotently.
                follow, _ = await self.store.progress(command.instance, spelled, current)
                break
            if current is not None and current.following:
                log.info(
                    "already followed",
                    extra={"instance": command.instance, "timeline": timeline},
                )
                return False
            follow = TimelineFollow(
                follow_id=event.id,
                followed_at=event.occurred_at,
                max_depth=command.max_depth,
                priority=command.priority,
                backfill=command.backfill,
            )
            try:
                await self.store.write(with_timeline(record, timeline, follow), revision)
            except KeyWrongLastSequenceError:
                continue
            break
        else:
            raise Retry(f"{command.instance}: its follow entry kept changing", delay=1.0)
        await self.bus.publish(event)
        if follow.poll == 0:
            # A redelivery after polls were handled (the command's ack lost, then
            # redelivered past the record's 10-minute duplicate window) would replace
            # the chain's pending poll with its first, whose answer is then stale: the
            # chain would end. Its chain is under way.
            await start_polls(self.bus, event, follow)
        log.info("following", extra={"instance": command.instance, "timeline": timeline})
        return True

    async def unfollow(self, command: InstanceCommand, *, place: str, origin: str) -> list[str]:
        """Stop the timeline (every timeline when None); the timelines this command stopped."""
        event = InstanceUnfollowed(
            id=derived_event_id(
                f"unfollow:{place}:{command.instance} {command.timeline or '*'}", "unfollowed"
            ),
            instance=command.instance,
            domain=command.domain,
            timeline=command.timeline,
            provenance=Provenance(kind="seed", origin=origin),
        )
        for _ in range(MAX_WRITES):
            record, revision = await self.store.read(command.instance)
            stopped = [
                name
                for name, follow in record.timelines.items()
                if (command.timeline is None or name.lower() == command.timeline.lower())
                and (follow.following or follow.unfollowed_by == event.id)
            ]
            if not stopped:
                log.info(
                    "not followed",
                    extra={"instance": command.instance, "timeline": command.timeline},
                )
                return []
            changed = {
                name: follow.model_copy(update={"unfollowed_by": event.id, "recent": ()})
                for name, follow in record.timelines.items()
                if name in stopped
            }
            updated = record.model_copy(update={"timelines": {**record.timelines, **changed}})
            try:
                if updated != record:
                    await self.store.write(updated, revision)
            except KeyWrongLastSequenceError:
                continue
            break
        else:
            raise Retry(f"{command.instance}: its follow entry kept changing", delay=1.0)
        await self.bus.publish(event)
        for name in stopped:
            await stop_polls(
                self.bus, command.instance, name, msg_id=derived_event_id(event.id, f"stop {name}")
            )
            await self.store.drop_progress(command.instance, name)
        log.info("unfollowed", extra={"instance": command.instance, "timelines": stopped})
        return stopped
