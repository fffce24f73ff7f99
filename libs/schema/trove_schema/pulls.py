"""Pull requests that wait at the server, and messages taken as they arrive.

nats-py's ``fetch(n, timeout)`` returns when ``n`` messages have arrived or the timeout
has passed, and sends two pull requests each time (one that must answer at once, then
one that waits). A consumer with work in flight must either wait out the timeout for a
batch that may never fill, or poll with short fetches: at 50 ms that is some 80 NATS
messages a second for each consumer of each process, nearly all of them empty answers,
and at a polite crawl's pace that polling cost more CPU, in nats-server and in the
services, than the pages.

``Pulls`` keeps one pull request open at the server for up to ``expires`` seconds, for
as many messages as its consumer has room for, and receives each message the moment
JetStream delivers it. It asks again when the request ends: filled, or expired
(JetStream then says so with a 408 status). An open request means the server had no
more to give, so room freed meanwhile needs no second request, and one request at a
time keeps the count of what is still owed exact. An idle consumer costs one request
and one 408 per ``expires``. A request whose end never arrives (nats-server restarted,
the connection was replaced) is forgotten ``grace`` seconds after it expired, or at
once when the bus reconnects, and asked again. Nothing is asked while the connection is
down: nats-py only buffers a publish then, and sends all it buffered at the reconnect,
where each request would be served, however many had been given up meanwhile.

A message that arrives after its request was given up is still a message: it is handed
over like any other. The consumer holds what it cannot start yet (``Consumer``'s heap),
so asking twice costs memory for a moment, never a message.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import time
from collections.abc import Callable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

log = logging.getLogger(__name__)

#: The JetStream API's "next messages" request of a pull consumer (the default domain).
NEXT_SUBJECT = "$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
#: The status that ends a pull request at its expiry; a heartbeat (100) ends none.
REQUEST_TIMEOUT = "408"
HEARTBEAT = "100"
#: The status and description that end a request at its ``max_bytes``: the next
#: message would not fit. Served, not refused; a message larger than a request's
#: ``max_bytes`` is never delivered to it (nats-server 2.15), so ``ask`` never asks for
#: less than the largest message the server takes.
MAX_BYTES_REACHED = ("409", "Message Size Exceeds MaxBytes")
#: The status that follows the last message of a request given ``max_bytes`` that its
#: count filled. That request was over at its last message, counted here, and the
#: next may be open already: the status is news of neither.
BATCH_COMPLETED = ("409", "Batch Completed")
#: Room for a message's subject and headers beside its payload (``max_payload``) in
#: what the server counts against a request's ``max_bytes``.
MESSAGE_OVERHEAD = 64 * 1024
#: The server's refusal of a request larger than the consumer allows: an operator's
#: ``nats consumer edit --max-pull-batch``, which Trove's reconcile leaves in place.
_MAX_BATCH = re.compile(r"MaxRequestBatch of (\d+)")
_MAX_EXPIRES = re.compile(r"MaxRequestExpires of ([0-9.a-zµ]+)")
_GO_DURATION = re.compile(r"([0-9.]+)(ns|us|µs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class _Request:
    __slots__ = ("deadline", "remaining")

    def __init__(self, remaining: int, deadline: float) -> None:
        self.remaining = remaining
        self.deadline = deadline


class Pulls:
    """The open pull request on one durable consumer, and the messages it brought."""

    def __init__(
        self,
        nc: Client,
        stream: str,
        durable: str,
        *,
        expires: float = 5.0,
        grace: float = 2.0,
        wake: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nc = nc
        self.subject = NEXT_SUBJECT.format(stream=stream, durable=durable)
        self.expires = expires
        self.grace = grace
        self._wake = wake
        self._clock = clock
        self._inbox = nc.new_inbox()
        self._sub: Subscription | None = None
        self._request: _Request | None = None
        self._arrived: collections.deque[Msg] = collections.deque()
        #: Set when the server ended a request other than by its expiry: no new request
        #: before this time.
        self._quiet_until = 0.0
        self._reconnects = nc.stats.get("reconnects", 0)
        #: The most a request asks for, lowered to what the server says it allows.
        self.max_batch: int | None = None
        #: Since when every request has been refused (None: the last one was served or
        #: expired), and the last refusal's status and description.
        self.refused_since: float | None = None
        self.refusal = ""

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(self._inbox, cb=self._receive)

    async def close(self) -> list[Msg]:
        """Stop asking and receiving; returns the messages delivered and never taken,
        for the consumer to hand back.

        The subscription is drained: nats-py's ``unsubscribe`` drops at once what it
        has read and not yet passed to ``_receive``, and what the server sent before
        the UNSUB reached it, each then out of every pod's reach for ``ack_wait`` (90 s
        for the fetcher; one message in flight holds all of discovery's follows). A
        drain sends the UNSUB, waits for the answer to a ping sent after it, by which
        every delivery made before has arrived, and passes them all to ``_receive``:
        at most ``grace`` seconds. The server serves no request whose reply subject
        has lost its interest, so the open request ends with the UNSUB.
        """
        sub, self._sub = self._sub, None
        self._request = None
        if sub is not None:
            try:
                if self.nc.is_connected:
                    draining = sub.drain()  # type: ignore[no-untyped-call]  # unannotated in nats-py
                    await asyncio.wait_for(draining, self.grace)
                else:  # nothing arrives meanwhile, and the ping would wait for the reconnect
                    await sub.unsubscribe()
            except Exception as exc:  # closed, or lost while draining: what arrived is all
                log.debug("unsubscribe %s: %s", self._inbox, exc)
        return self.take()

    def __len__(self) -> int:
        """Messages delivered and not yet taken."""
        return len(self._arrived)

    def take(self) -> list[Msg]:
        msgs = list(self._arrived)
        self._arrived.clear()
        return msgs

    async def ask(self, room: int, max_bytes: int | None = None) -> None:
        """Ask for ``room`` messages, and (``max_bytes``) no more bytes than that, unless
        a request is still open or the connection is down. A request may bring a
        message larger than ``max_bytes``: one the server takes always fits."""
        now = self._clock()
        self._forget_lost(now)
        if room <= 0 or self._request is not None or now < self._quiet_until:
            return
        if not self.nc.is_connected:
            return
        if self.max_batch is not None:
            room = min(room, self.max_batch)
        expires = int(self.expires * 1_000_000_000)
        if max_bytes is None:
            request = b'{"batch":%d,"expires":%d}' % (room, expires)
        else:
            largest = self.nc.max_payload + MESSAGE_OVERHEAD
            request = b'{"batch":%d,"expires":%d,"max_bytes":%d}' % (
                room,
                expires,
                max(max_bytes, largest),
            )
        await self.nc.publish(self.subject, request, reply=self._inbox)
        self._request = _Request(room, now + self.expires)

    def next_deadline(self) -> float | None:
        """When the open request will be given up if its end never comes; None once it
        has been (a consumer waiting out a pause asks for nothing, and would otherwise
        wait on a deadline long past: a wait of 0 s, again and again)."""
        self._forget_lost(self._clock())
        if self._request is None:
            return None
        return self._request.deadline + self.grace

    def _forget_lost(self, now: float) -> None:
        reconnects = self.nc.stats.get("reconnects", 0)
        if reconnects != self._reconnects:
            # A request sent to a server that has gone may never be answered.
            self._reconnects = reconnects
            self._request = None
        elif self._request is not None and self._request.deadline + self.grace < now:
            self._request = None

    async def _receive(self, msg: Msg) -> None:
        # Every JetStream delivery has its ``$JS.ACK`` reply subject; a status has none.
        # A stored message may have a ``Status`` header of its own, which nats-py files
        # under the key it gives a status line: it is a message all the same.
        status = None if msg.reply else (msg.headers or {}).get("Status")
        if status is not None:
            said = (status, (msg.headers or {}).get("Description"))
            if said == BATCH_COMPLETED:
                self.refused_since = None
                self._wake()
                return
            if said == MAX_BYTES_REACHED:
                status = REQUEST_TIMEOUT  # ended as at its expiry: served, to ask again
        if status != HEARTBEAT and status not in (None, "", REQUEST_TIMEOUT):
            self._refused(status, (msg.headers or {}).get("Description", ""))
        elif status != HEARTBEAT:
            self.refused_since = None
        if not status:
            request = self._request
            if request is not None:
                request.remaining -= 1
                if request.remaining <= 0:
                    self._request = None
            self._arrived.append(msg)
        elif status == HEARTBEAT:
            return
        else:
            # 408: the request expired (or took its ``max_bytes``). Anything else ended
            # it for a reason that may hold for the next request too (409: a leadership
            # change, too many waiting, the consumer deleted; 503: nobody serves the
            # consumer): the next one waits ``grace``, or a refusal would be asked again
            # in a loop.
            self._request = None
            if status != REQUEST_TIMEOUT:
                self._quiet_until = self._clock() + self.grace
                log.debug("pull on %s ended: %s", self.subject, self.refusal)
        self._wake()

    def refused_for(self) -> float:
        """Seconds every request has been refused (0 while they are served)."""
        return 0.0 if self.refused_since is None else self._clock() - self.refused_since

    def restart_refusals(self) -> None:
        """Count the refusals' time afresh, if they go on (after a look at why)."""
        if self.refused_since is not None:
            self.refused_since = self._clock()

    def _refused(self, status: str, description: str) -> None:
        if self.refused_since is None:
            self.refused_since = self._clock()
        self.refusal = f"{status} {description}".strip()
        batch = _MAX_BATCH.search(description)
        if batch is not None and int(batch.group(1)) > 0:
            self.max_batch = int(batch.group(1))
            log.warning("pulls on %s ask for %s at most: %s", self.subject, batch[1], description)
        expires = _MAX_EXPIRES.search(description)
        if expires is not None:
            allowed = sum(
                float(n) * _GO_UNITS[unit] for n, unit in _GO_DURATION.findall(expires.group(1))
            )
            if 0 < allowed < self.expires:
                self.expires = allowed * 0.9
                log.warning(
                    "pulls on %s wait %.1f s at most: %s", self.subject, allowed, description
                )
