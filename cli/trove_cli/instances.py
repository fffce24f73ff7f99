"""``trove follow``, ``trove unfollow`` and ``trove instances``: the fediverse as a source.

``trove follow URL`` sends the JSON form of a follow to ``trove.follow`` (``trove
unfollow`` to ``trove.unfollow``) as ``nats req`` does, and prints discovery's answer:
what was accepted, and what was refused and why. The subject belongs to ``TROVE_SEEDS``,
so the command is stored even while no discovery runs; the request then times out and
the command waits in the stream for the next discovery to handle it.

``trove instances`` lists the followed timelines from the ``instances`` table, the
recorder's projection of the follows and of every poll: the instance's software, the
last poll, what the polls read, and the state (ok, waiting for a first poll, paused
until a time the instance asked for, failing since when and why, unfollowed).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from rich.console import Console
from rich.table import Table
from rich.text import Text
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from trove_cli.broker import connect
from trove_cli.database import engine as database_engine
from trove_cli.outside import outside
from trove_schema.errors import InvalidURL
from trove_schema.server_time import server_now
from trove_schema.settings import CommonSettings
from trove_schema.topology import (
    FOLLOW_SUBJECT,
    UNFOLLOW_SUBJECT,
    TopologyOptions,
    declare,
    ensure_topology,
)
from trove_schema.urls import canonicalize, origin_of

#: How long ``trove follow`` waits for discovery's answer.
REPLY_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class FollowedTimeline:
    """One row of ``instances``, as ``trove instances`` shows it."""

    instance: str
    timeline: str
    max_depth: int
    followed_at: datetime | None
    unfollowed_at: datetime | None
    software: str | None
    software_version: str | None
    last_poll: int
    last_poll_at: datetime | None
    last_outcome: str | None
    last_status_code: int | None
    last_error: str | None
    polls: int
    posts_seen: int
    links_found: int
    skipped: int
    next_poll_after: datetime | None
    failing_since: datetime | None

    def state(self, now: datetime) -> str:
        """ok, waiting for a first poll, paused until X, failing since X and why, or
        unfollowed at X."""
        if self.unfollowed_at is not None:
            return f"unfollowed {_when(self.unfollowed_at)}"
        if self.failing_since is not None:
            why = self.last_error or self.last_outcome or "failed"
            if self.last_status_code is not None and str(self.last_status_code) not in why:
                why = f"{why} (HTTP {self.last_status_code})"
            paused = self.next_poll_after is not None and self.next_poll_after > now
            until = f", paused until {_when(self.next_poll_after)}" if paused else ""
            return f"failing since {_when(self.failing_since)}: {why}{until}"
        # A poll that succeeded may still say what cut it short (a rate limit).
        note = f": {self.last_error}" if self.last_error else ""
        if self.next_poll_after is not None and self.next_poll_after > now:
            return f"paused until {_when(self.next_poll_after)}{note}"
        if self.last_poll == 0:
            return "waiting for its first poll"
        return f"ok{note}"

    @property
    def software_label(self) -> str:
        if not self.software:
            return "?"
        return f"{self.software} {self.software_version or ''}".strip()


_LIST = text(
    "SELECT instance, timeline, max_depth, followed_at, unfollowed_at, software, "
    "software_version, last_poll, last_poll_at, last_outcome, last_status_code, last_error, "
    "polls, posts_seen, links_found, skipped, next_poll_after, failing_since "
    "FROM instances ORDER BY unfollowed_at IS NOT NULL, instance, timeline"
)


async def list_instances(engine: AsyncEngine) -> list[FollowedTimeline]:
    """Every timeline ever followed: the followed ones first, by instance and timeline."""
    async with engine.connect() as conn:
        rows = (await conn.execute(_LIST)).all()
    return [FollowedTimeline(*row) for row in rows]


async def timelines_never_polled(engine: AsyncEngine, instances: Sequence[str]) -> int:
    """How many of these instances have no poll recorded yet (or no follow at all)."""
    wanted = sorted({_origin(url) for url in instances})
    async with engine.connect() as conn:
        polled = (
            await conn.execute(
                text(
                    "SELECT count(DISTINCT instance) FROM instances "
                    "WHERE instance = ANY(CAST(:wanted AS text[])) AND polls > 0"
                ),
                {"wanted": wanted},
            )
        ).scalar_one()
    return len(wanted) - int(polled)


def _origin(url: str) -> str:
    """The instance as discovery records it (its canonical origin), when it is a URL."""
    try:
        return origin_of(canonicalize(url))
    except InvalidURL:
        return url


def _when(at: datetime | None) -> str:
    return "-" if at is None else f"{at.astimezone(UTC):%Y-%m-%d %H:%M:%S}"


def render_instances(
    timelines: list[FollowedTimeline], console: Console, *, now: datetime | None = None
) -> None:
    now = now or datetime.now(UTC)
    if not timelines:
        console.print(Text("no instance followed: trove follow https://social.example"))
        return
    table = Table(
        title=Text(f"{len(timelines)} followed timeline(s), times in UTC"),
        title_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    table.add_column("instance", overflow="fold")
    table.add_column("timeline")
    table.add_column("software")
    table.add_column("last poll")
    for column in ("polls", "posts", "links", "skipped"):
        table.add_column(column, justify="right")
    table.add_column("state", overflow="fold")
    for found in timelines:
        # Text(), not markup: software names and errors come from the instance.
        table.add_row(
            outside(found.instance),
            outside(found.timeline),
            outside(found.software_label),
            Text(_when(found.last_poll_at)),
            str(found.polls),
            str(found.posts_seen),
            str(found.links_found),
            str(found.skipped),
            outside(found.state(now)),
        )
    console.print(table)


async def instances_command(
    database_url: str, console: Console, nats_url: str | None = None
) -> int:
    """``trove instances``: the followed timelines and their state. A poll's times are
    nats-server's (the fetchers stamp them so): "now" is read there, when the broker
    answers, so that a machine an hour off does not show a pause as over or as an hour
    longer."""
    now = None
    if nats_url:
        with contextlib.suppress(Exception):  # the table is worth showing without it
            nc = await connect(nats_url)
            try:
                now = datetime.fromtimestamp(await server_now(nc), UTC)
            finally:
                await nc.close()
    engine = database_engine(database_url)
    try:
        timelines = await list_instances(engine)
    finally:
        await engine.dispose()
    render_instances(timelines, console, now=now)
    return 0


def command_payload(instance: str, timeline: str | None, max_depth: int | None) -> bytes:
    """The JSON form discovery reads on ``trove.follow`` / ``trove.unfollow``."""
    body: dict[str, object] = {"instance": instance}
    if timeline is not None:
        body["timeline"] = timeline
    if max_depth is not None:
        body["max_depth"] = max_depth
    return json.dumps(body).encode()


def render_reply(data: bytes, console: Console) -> int:
    """Discovery's JSON answer, in words; 0 when everything was accepted."""
    try:
        reply = json.loads(data)
        accepted, rejected = reply["accepted"], reply["rejected"]
        verb = reply.get("verb", "follow")
    except (ValueError, KeyError, TypeError):
        console.print(Text(f"unexpected answer: {data[:500]!r}"))
        return 1
    doing = "following" if verb == "follow" else "no longer following"
    for command in accepted:
        timeline = command.get("timeline") or "every timeline"
        console.print(Text(f"{doing} {command.get('instance')} ({timeline})"))
    for command in rejected:
        console.print(outside(f"refused {command.get('raw')!r}: {command.get('reason')}", "red"))
    return 1 if rejected or not accepted else 0


async def follow_command(
    nats_url: str,
    console: Console,
    *,
    instance: str,
    timeline: str | None,
    max_depth: int | None = None,
    unfollow: bool = False,
    timeout: float = REPLY_TIMEOUT,  # noqa: ASYNC109 - how long to wait for the answer
) -> int:
    """``trove follow`` / ``trove unfollow``: send the command and print discovery's answer."""
    subject = UNFOLLOW_SUBJECT if unfollow else FOLLOW_SUBJECT
    nc = await connect(nats_url)
    try:
        # The stream must exist, or a command sent while no discovery runs goes nowhere.
        # The CLI owns nothing: it creates what is missing and changes nothing else.
        options = TopologyOptions.from_settings(CommonSettings())
        await ensure_topology(nc.jetstream(), declare(options), owner="cli")
        payload = command_payload(instance, timeline, None if unfollow else max_depth)
        try:
            reply = await nc.request(subject, payload, timeout=timeout)
        except (NatsTimeout, NoRespondersError):
            console.print(
                Text(
                    f"no answer from discovery within {timeout:g} s: the command is kept in "
                    f"{subject} and will be handled when discovery runs",
                    "yellow",
                )
            )
            return 0
        return render_reply(reply.data, console)
    finally:
        await nc.close()
