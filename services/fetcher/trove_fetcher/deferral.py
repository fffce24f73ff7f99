"""What a deferred work message carries, and how far ahead it may be scheduled.

A work message that must wait for its host is re-published as a NATS scheduled message
onto ``trove.work.fetch``. Its headers carry what it needs when it comes back:

* ``Trove-Slot``: the slot it was given (a ``time.time()``) on the host of its next
  request (for a paused robots.txt chain, the host the chain points to): it keeps that
  place in the host's queue, and never takes an earlier one.
* ``Trove-Avoid``: a strategy the page's attempt already found wrong (``wrong_tool``):
  the page is being asked again another way, and must not be asked that way again.
* ``Trove-Chain`` and ``Trove-Hops``: a redirect chain paused between two hops, so
  that the next hop waits for its host's gap like any request without holding a
  consumer slot: ``page`` (same-host hops of the page, which keeps its identity, the
  original URL) or ``robots`` (robots.txt hops, to any host). The hops are the URLs
  followed so far, the last one still to request; ``Trove-Permanent: 1`` when each was
  a permanent redirect (its absence, as from an older pod, says nothing).

**Kept until handled.** TROVE_WORK keeps its messages for no age by default: a
fetcher stopped for a fortnight (scaled to zero, the whole stack stopped) finds every
deferred fetch that came due meanwhile waiting, where an age would delete them unread
and end their pages' chains. What the fetchers have handled goes instead: each pod
looks every ``TROVE_WORK_PURGE_INTERVAL_SECONDS`` and, once the stream holds
``TROVE_WORK_PURGE_AFTER_MESSAGES`` handled ones, purges the fired work messages at or
below the ``fetcher-deferred`` consumer's ack floor (``purge_handled``), every one of
them acked, and nothing else (the schedules waiting to fire are on other subjects).

**The horizon.** With an age (``TROVE_WORK_MAX_AGE_SECONDS``), TROVE_WORK keeps a
message for ``work_max_age`` from when it is stored, and a scheduled message is stored
when it is published, not when it fires. A slot further out than that (a Crawl-delay
of 120 s and thousands of queued pages on one host) would age out before it fires and
the page would be lost. So a message is never scheduled further than
``HORIZON_FRACTION`` of ``work_max_age`` ahead: one whose slot lies beyond is scheduled
at the horizon, keeps its slot in ``Trove-Slot``, and is scheduled again when it comes
back early. The other half of the age is room for the scheduler's lateness and for a
backlog in front of the consumer. Without an age, a slot is scheduled as it is.

**The size.** nats-server counts a message's headers with its payload against its
``max_payload``, and closes the connection of a client that sends more. The hops are
URLs of ``MAX_URL_LENGTH`` at most (a redirect to a longer one is not followed), and a
deferred message that would still be larger than the pod's message limit
(``message_bytes``) is not published: its attempt is recorded ``rejected`` instead.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from trove_fetcher.politeness import finite
from trove_schema.topology import FETCH_DEFERRED, FETCHER_DEFERRED, WORK_STREAM

SLOT_HEADER = "Trove-Slot"
CHAIN_HEADER = "Trove-Chain"
HOPS_HEADER = "Trove-Hops"
PERMANENT_HEADER = "Trove-Permanent"
AVOID_HEADER = "Trove-Avoid"
_STRATEGY_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
#: Furthest ahead, as a fraction of TROVE_WORK's max_age, a message is scheduled.
HORIZON_FRACTION = 0.5


class ChainKind(StrEnum):
    PAGE = "page"
    ROBOTS = "robots"


@dataclass(frozen=True, slots=True)
class Chain:
    """A redirect chain paused before ``hops[-1]``."""

    kind: ChainKind
    hops: tuple[str, ...]
    #: Every hop so far was a permanent redirect (301, 308).
    permanent: bool = False

    @property
    def next_url(self) -> str:
        return self.hops[-1]


@dataclass(frozen=True, slots=True)
class Carried:
    """The state a work message carries in its headers (none on a fresh message)."""

    slot: float | None = None
    chain: Chain | None = None
    avoid: str | None = None

    @classmethod
    def from_headers(cls, headers: Mapping[str, str] | None) -> Carried:
        """Read it back; anything unreadable is as if absent (the work starts afresh)."""
        if not headers:
            return cls()
        slot = finite(headers.get(SLOT_HEADER))
        chain: Chain | None = None
        kind, hops = headers.get(CHAIN_HEADER), headers.get(HOPS_HEADER)
        if kind and hops:
            try:
                urls = json.loads(hops)
                if isinstance(urls, list) and urls and all(isinstance(u, str) for u in urls):
                    permanent = headers.get(PERMANENT_HEADER) == "1"
                    chain = Chain(ChainKind(kind), tuple(urls), permanent)
            except ValueError:
                chain = None
        avoid = headers.get(AVOID_HEADER)
        return cls(slot, chain, avoid if avoid and _STRATEGY_NAME.match(avoid) else None)

    def headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.slot is not None:
            out[SLOT_HEADER] = f"{self.slot:.3f}"
        if self.chain is not None:
            out[CHAIN_HEADER] = self.chain.kind.value
            out[HOPS_HEADER] = json.dumps(list(self.chain.hops), separators=(",", ":"))
            if self.chain.permanent:
                out[PERMANENT_HEADER] = "1"
        if self.avoid is not None:
            out[AVOID_HEADER] = self.avoid
        return out


def message_bytes(payload: bytes, headers: Mapping[str, str]) -> int:
    """What nats-server counts of a message against its ``max_payload``: the payload and
    the header block as the client writes it (``NATS/1.0``, a line a header, a blank line)."""
    block = len(b"NATS/1.0\r\n\r\n") + sum(
        len(name.encode()) + len(value.encode()) + len(b": \r\n") for name, value in headers.items()
    )
    return len(payload) + block


def horizon(work_max_age: float) -> float:
    """Seconds ahead a work message may be scheduled, for a stream keeping it
    ``work_max_age`` (0: until it is handled, and so any distance ahead)."""
    return work_max_age * HORIZON_FRACTION if work_max_age > 0 else math.inf


def schedule_at(slot: float, now: float, horizon_seconds: float) -> float:
    """When to schedule a message whose slot is ``slot``: the slot, or the horizon if sooner."""
    return min(slot, now + horizon_seconds)


#: How many times ``purge_after`` handled messages TROVE_WORK may hold, while no pull
#: waits, before they are purged all the same.
PURGE_ANYWAY = 4


async def purge_handled(js: JetStreamContext, purge_after: int) -> int:
    """Purge from TROVE_WORK the fired work messages the fetchers have acked, those at or
    below the ``fetcher-deferred`` consumer's ack floor on ``trove.work.fetch`` alone,
    once it holds ``purge_after`` handled ones (its messages on the subject less those
    the consumer has still to deliver or to see acked) while the consumer has pulls
    waiting, or ``PURGE_ANYWAY`` times as many. Returns the sequence purged below; 0
    when nothing was purged.

    The floor only rises, so a purge never reaches a message delivered and not yet
    acked, nor one not yet delivered; nats-server moves the consumer past what it
    purged and keeps its pending messages (a purge filtered on the consumer's own
    subject). But it forgets the consumer's queue of redeliveries (nats-server 2.15,
    ``consumer.purge``): a message queued there (handed back, or its ack wait run out)
    would come again only at its next ack wait. A queued message goes at once to a
    waiting pull, so with pulls waiting the queue is empty. Pods whose hands are full
    wait none, for as long as work comes due faster than they start it (with fewer pods
    than ``max_ack_pending`` fills): then the purge waits for more, and a redelivery it
    makes the server forget comes an ack wait later. Counted on the stream, not by a
    clock: once one pod has purged, the others find too few below the floor, so the
    purges of all the pods come once every ``purge_after`` handled messages or so."""
    try:
        info = await js.consumer_info(WORK_STREAM, FETCHER_DEFERRED)
    except NotFoundError:
        return 0  # no consumer yet
    floor = info.ack_floor.stream_seq if info.ack_floor is not None else 0
    if not floor:
        return 0
    held = await js.stream_info(WORK_STREAM, subjects_filter=FETCH_DEFERRED)
    stored = (held.state.subjects or {}).get(FETCH_DEFERRED, 0)
    handled = stored - (info.num_pending or 0) - (info.num_ack_pending or 0)
    wanted = purge_after if info.num_waiting else PURGE_ANYWAY * purge_after
    if handled < wanted:
        return 0
    # Those acked past a message still in hand are counted, and stay until the floor
    # passes them: a purge of a few at or below the floor (or none) would still make the
    # server forget the redeliveries queued. So the floor must stand as many sequences
    # past the oldest as the count asked for (the schedules in between are counted too:
    # at least half of a deferral's two messages are work).
    try:
        oldest = await js.get_msg(WORK_STREAM, seq=1, subject=FETCH_DEFERRED, next=True)
    except NotFoundError:
        return 0
    if oldest.seq is None or floor + 1 - oldest.seq < wanted:
        return 0
    await js.purge_stream(WORK_STREAM, seq=floor + 1, subject=FETCH_DEFERRED)
    return floor + 1
