"""The event bus: one NATS connection per process, publishing with PubAck, consuming durably.

Publishing an event waits for JetStream's acknowledgement, so a caller that acks its
input after ``publish`` returns never loses the consequence. An event for later is a
NATS scheduled message (nats-server 2.12+): JetStream itself publishes it at the due
time, so no process has to stay alive holding a timer.

Consumers are plain pull loops with an explicit policy for every way a message can
end (see ``Consumer``):

* handled              -> ack
* ``Retry`` raised     -> nak with the delay asked for (the broker or database is away)
* a broker error       -> the same as ``Retry`` (``broker_trouble``: no responders, a
                          timeout, a closed or reconnecting connection, JetStream 503),
                          and the consumer starts and pulls nothing for a while (``_Backoff``)
* ``MalformedEvent``   -> parked on ``trove.dead.<consumer>`` with the reason, then termed
* any other exception  -> nak with a growing delay; after ``max_failures`` failures of
                          the handler itself it is parked like a poison message

Parking is for poison only: the failures are counted by the consumer (``FailureCounts``),
never read from JetStream's delivery count, which also grows with every ``Retry``,
every ``ack_wait`` expiry and every pod that died holding the message.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
import logging
import math
import ssl
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import (
    ConnectionClosedError,
    ConnectionDrainingError,
    ConnectionReconnectingError,
    MaxPayloadError,
    NoRespondersError,
    OutboundBufferLimitError,
    StaleConnectionError,
)
from nats.js import JetStreamContext
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError, ServiceUnavailableError

from trove_schema.errors import BrokerClosed, MalformedEvent, TopologyError, TroveError
from trove_schema.events import PRIORITY_HEADER, SIBLINGS_HEADER, Event, as_stored, decode_event
from trove_schema.metrics import (
    BROKER_CONNECTED,
    DEAD_LETTERS,
    EVENTS_PUBLISHED,
    MESSAGES_HANDLED,
)
from trove_schema.nats_tls import client_tls
from trove_schema.pulls import Pulls
from trove_schema.topology import DEAD_PREFIX, DEAD_STREAM, EVENT_SCHEDULES_PREFIX, EVENTS_STREAM

log = logging.getLogger(__name__)


class Retry(TroveError):
    """Raised by a handler: hand the message back, to be redelivered after ``delay`` seconds."""

    def __init__(self, reason: str, delay: float = 5.0, *, expected: bool = False) -> None:
        super().__init__(reason)
        self.delay = delay
        #: Handed back on purpose (waiting for something), not for trouble: logged quietly.
        self.expected = expected


class MessageTooLarge(TroveError, MaxPayloadError):
    """A message whose headers and payload together exceed the server's ``max_payload``,
    refused before it is sent. The message's fault, not the broker's: a handler that
    meets it fails, and its input is parked after its failures like any other."""

    def __init__(self, subject: str, size: int, limit: int) -> None:
        super().__init__(subject, size, limit)
        self.subject, self.size, self.limit = subject, size, limit

    def __str__(self) -> str:
        return (
            f"a message of {self.size} bytes with its headers, to {self.subject}, is larger "
            f"than the server takes (max_payload {self.limit})"
        )


class Overtaken(TroveError):
    """A publish that expected its subject to hold what it last read there found
    another message written since: read again, and decide again."""


#: JetStream's answers to a publish whose expected last sequence on its subject is not
#: the subject's: a server's own (10071), and a clustered stream's when another write to
#: the subject is still being replicated (10164, before its sequence is known).
WRONG_LAST_SEQUENCE = frozenset({10071, 10164})


#: Errors that say the broker is away or busy, not that the message is bad. A handler's
#: own TimeoutError is among them (nats-py's is a subclass): it waited on something.
BROKER_ERRORS: tuple[type[BaseException], ...] = (
    TimeoutError,
    NoRespondersError,
    NoStreamResponseError,
    ConnectionClosedError,
    ConnectionReconnectingError,
    ConnectionDrainingError,
    StaleConnectionError,
    OutboundBufferLimitError,
    ServiceUnavailableError,
)
#: JetStream API answers that mean "not now": request timeout, server error, JetStream
#: temporarily unavailable (503, e.g. no meta leader), gateway timeout.
UNAVAILABLE_CODES = frozenset({408, 500, 503, 504})
#: A 500 that is no passing trouble: the deployment's own (``TROVE_REPLICAS`` above 1
#: against a nats-server that is no cluster, 10074). Waited on as the broker away, a
#: service stood not ready for ever, and only its log said why.
REFUSED_AS_500 = frozenset({10074})


#: JetStream's answer when an account's own storage limit (`max_file`, `max_mem`) is
#: reached: a 400, where a server's store full answers 503. The store is full either way.
ACCOUNT_RESOURCES_EXCEEDED = 10002


def broker_trouble(exc: BaseException) -> bool:
    """True when ``exc`` says NATS or JetStream is unavailable, so the message is not at fault."""
    if isinstance(exc, BROKER_ERRORS):
        return True
    return isinstance(exc, APIError) and (
        (exc.code in UNAVAILABLE_CODES and exc.err_code not in REFUSED_AS_500)
        or exc.err_code == ACCOUNT_RESOURCES_EXCEEDED
    )


def nats_servers(url: str) -> list[str]:
    """A cluster's seed servers, comma-separated as the nats CLI takes them."""
    return [part.strip() for part in url.split(",") if part.strip()]


async def nats_error(exc: Exception, untold: int = 0) -> None:
    """What the server said went wrong on the connection, in the service's log;
    ``untold``, how often it came again since it was last said (at DEBUG only).

    A refused publish or subscription is the deployment's mistake, not the broker's
    trouble: the request behind it only times out, and its consumer retries it until
    the user's permissions are mended, so the log names the cause at ERROR.
    """
    since = f" ({untold} times more since it was last said)" if untold else ""
    if "permissions violation" in str(exc).lower():
        log.error(
            "nats refused this service's user: %s; its permissions are in "
            "deploy/nats/users.conf (Compose) and k8s/nats/values.yaml (Kubernetes)%s",
            exc,
            since,
        )
    else:
        log.warning("nats: %s%s", _unprefixed(exc), since)


#: The most distinct errors a connection remembers having said (``Bus.connect``).
MAX_SAID = 32
#: How long a thing the client said is told again at DEBUG only. An outage's refused
#: connects end with it; a permissions violation or a slow consumer goes on while the
#: connection stays up, and is said again this often, with how often it came since.
SAY_AGAIN_SECONDS = 600.0


def _unprefixed(exc: Exception) -> str:
    """``exc`` in words, without the "nats: " nats-py starts most of its errors with."""
    return str(exc).removeprefix("nats: ")


#: Where a schedule's time is raised to before it is written: any time past is "at
#: once" to nats-server, and glibc's ``%Y`` writes a year before 1000 in fewer than four
#: digits, which nats-server refuses (10189, "pattern is invalid").
SCHEDULE_FLOOR = datetime(2000, 1, 1, tzinfo=UTC)


def schedule_header(at: datetime) -> str:
    """The ``Nats-Schedule`` header of a message to be published at ``at``."""
    at = max(at.astimezone(UTC), SCHEDULE_FLOOR)
    return "@at " + at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


#: Set by ``trove dead redrive``: the consumer that parked the message, the one it is
#: sent back for. The other consumers of its subject handled it when it first came (or
#: parked it themselves, to be re-driven for them): each acks it unread. Without it a
#: page the recorder parked, re-driven, was fetched again; an attempt discovery parked
#: was applied again by a recorder whose memory of applied events had moved on.
REDRIVEN_FOR = "Trove-Redriven-For"


def redriven_elsewhere(msg: Msg, durable: str) -> bool:
    """Whether ``msg`` is a re-drive meant for another consumer than ``durable``."""
    headers = msg.headers
    return headers is not None and headers.get(REDRIVEN_FOR, durable) != durable


#: Seconds between the client's pings, and the pings left unanswered before it takes
#: the connection for dead and reconnects. A server gone without closing the socket (its
#: node lost, a network partition) was noticed after 4 to 6 minutes with nats-py's
#: defaults (120 s, 2), every consumer idle meanwhile; now within 40 s.
PING_INTERVAL = 10.0
MAX_OUTSTANDING_PINGS = 3
#: How long the server may turn this service away, at every try, before the connection
#: counts as closed for good (``Bus.until_closed``), or the first one as refused.
REFUSED_PATIENCE = 30.0
AUTHORIZATION = "Authorization Violation"


def turned_away(exc: BaseException) -> bool:
    """Whether ``exc`` says the server turns this service away: its user refused (a
    password changed, a credential revoked) or its certificate not trusted by the
    deployment's CA. Every try meets the same until the deployment is mended, and only
    a restart reads its new secret."""
    return isinstance(
        exc, nats.errors.AuthorizationError | ssl.SSLCertVerificationError
    ) or AUTHORIZATION in str(exc)


#: What nats-py writes around a message's headers: the ``NATS/1.0`` line, and the empty
#: line after the last header.
_HEADER_FRAME = len(b"NATS/1.0\r\n\r\n")


def _message_size(payload: bytes, headers: dict[str, str] | None) -> int:
    """The bytes the server counts against ``max_payload``: the headers as nats-py
    (2.16) writes them (keys and values trimmed, ``key: value`` and CRLF each), then
    the payload."""
    if headers is None:
        return len(payload)
    size = _HEADER_FRAME + len(payload)
    for key, value in headers.items():
        if key.strip():
            size += len(key.strip().encode()) + len(value.strip().encode()) + 4
    return size


def _guard_publishes(nc: Client) -> None:
    """Refuse a message too large for the server before it is sent, and make a request
    whose publish fails leave nothing behind.

    nats-py (2.16) compares the payload alone with the server's ``max_payload``; the
    server counts the headers too, and answers a larger message with ``-ERR 'Maximum
    Payload Violation'`` and closes the connection, which no reconnect follows: one
    message with long headers (a redirect chain carried along) would end the service
    (``BrokerClosed``). It is refused here with ``MessageTooLarge``, a failure of the
    handler that sent it.

    nats-py files a request's reply future before it publishes and removes it
    when the future completes; a publish that raises (the reconnect buffer full while
    the broker is away, the connection closed) leaves it filed for ever, about 700
    bytes. A pod's retries during an outage of hours (the late writes of its hosts'
    observations, ack confirmations, publishes) made that megabytes an hour. Its
    publish is wrapped to take the entry back when it fails (private names of the
    client: ``tests/schema/test_bus_connection.py`` fails when they change)."""
    publish = nc.publish

    async def publish_or_forget(
        subject: str,
        payload: bytes = b"",
        reply: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        try:
            size = _message_size(payload, headers)
            if size > nc.max_payload:
                raise MessageTooLarge(subject, size, nc.max_payload)
            await publish(subject, payload, reply=reply, headers=headers)
        except BaseException:
            prefix = bytes(nc._resp_sub_prefix or b"").decode()
            if reply and prefix and reply.startswith(prefix):
                future = nc._resp_map.pop(reply[len(prefix) :], None)
                if future is not None:
                    future.cancel()
            raise

    nc.publish = publish_or_forget  # type: ignore[method-assign]


class Bus:
    """One NATS connection and its JetStream context, opened in a service's lifespan."""

    def __init__(
        self, nc: Client, js: JetStreamContext, closed: asyncio.Event | None = None
    ) -> None:
        self.nc = nc
        self.js = js
        #: Set when the client closed the connection for good (``until_closed``).
        self.closed = closed if closed is not None else asyncio.Event()

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str,
        connect_timeout: float = 5.0,
        ping_interval: float = PING_INTERVAL,
        refused_patience: float = REFUSED_PATIENCE,
    ) -> Bus:
        async def disconnected_cb() -> None:
            BROKER_CONNECTED.set(0)
            if nc.is_closed:  # this service closing: every rollout's stop, not news
                log.info("nats: disconnected")
            else:
                log.warning("nats: disconnected")

        #: What the client said since the connection was last made, each with when and
        #: how often it came again since: each once a while (``SAY_AGAIN_SECONDS``). It
        #: tries again every second, and said the same refused connect 3,600 times an hour.
        said: dict[str, tuple[float, int]] = {}

        closed = asyncio.Event()
        # Started by the first of the turns away in a row: closes for good at its end.
        refusal: asyncio.TimerHandle | None = None

        def accepted() -> None:
            nonlocal refusal
            if refusal is not None:
                refusal.cancel()
                refusal = None

        async def reconnected_cb() -> None:
            accepted()
            said.clear()
            BROKER_CONNECTED.set(1)
            log.info("nats: reconnected")

        async def closed_cb() -> None:
            BROKER_CONNECTED.set(0)
            closed.set()

        async def error_cb(exc: Exception) -> None:
            # The server turns this service away at every try (its password changed by a
            # reload, a credential revoked, a certificate the CA does not sign): the
            # client would try for ever with what it has, and only a restart reads the
            # deployment's new secret. A timer, not the next try, ends the patience:
            # nats-py (2.16) tries no more after a certificate that does not verify, and
            # waits for ever on the socket the failed handshake closed.
            nonlocal refusal
            what = f"{type(exc).__name__}: {exc}"
            now = time.monotonic()
            when, untold = said.get(what, (-math.inf, 0))
            if now - when < SAY_AGAIN_SECONDS:
                said[what] = (when, untold + 1)
                log.debug("nats: %s", _unprefixed(exc))
            else:
                if what not in said and len(said) >= MAX_SAID:  # a server's changing words
                    said.clear()
                said[what] = (now, 0)
                await nats_error(exc, untold)
            # Only a connection made ends the patience: a try that meets the server away
            # (a reset, a refused connect) between two turns away says nothing of the
            # credentials, and cancelling on it kept a pod waiting for ever.
            if turned_away(exc) and refusal is None:
                refusal = asyncio.get_running_loop().call_later(refused_patience, closed.set)

        # Seconds as nats.connect passes them: nats-py annotates them as int, takes floats.
        options: dict[str, Any] = {
            "name": name,
            "connect_timeout": connect_timeout,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": 1.0,
            "error_cb": error_cb,
            "disconnected_cb": disconnected_cb,
            "reconnected_cb": reconnected_cb,
            "closed_cb": closed_cb,
            "allow_reconnect": True,
            "ping_interval": ping_interval,
            "max_outstanding_pings": MAX_OUTSTANDING_PINGS,
            # TROVE_NATS_TLS_*: the deployment's CA (and client certificate), if any.
            "tls": client_tls(),
        }
        nc = Client()
        # nats-py tries a first connection for ever, a refused one too: a pod started
        # with an old password would wait, alive and never ready, for a restart that
        # nothing asks for. A server away is waited for; one that turns the service away
        # for ``refused_patience`` ends the start as the deployment's mistake.
        connecting = asyncio.ensure_future(nc.connect(nats_servers(url), **options))
        refused = asyncio.ensure_future(closed.wait())
        try:
            await asyncio.wait({connecting, refused}, return_when=asyncio.FIRST_COMPLETED)
            if not connecting.done():
                reason = nc.last_error
                raise BrokerClosed(
                    f"the NATS server turned this service away for {refused_patience:.0f} s "
                    f"({type(reason).__name__}: {reason}): the user and password in "
                    "TROVE_NATS_URL, or the CA in TROVE_NATS_TLS_CA, are not the server's"
                ) from reason
            connecting.result()
        except BaseException:
            connecting.cancel()
            with contextlib.suppress(Exception):
                await nc.close()
            raise
        finally:
            refused.cancel()
            accepted()  # the turns away before this connection say nothing of later ones
        _guard_publishes(nc)
        BROKER_CONNECTED.set(1)
        return cls(nc, nc.jetstream(timeout=10.0), closed)

    async def until_closed(self, stop: asyncio.Event) -> None:
        """A service's part (``trove_schema.service.together``): returns at ``stop``, and
        raises ``BrokerClosed`` if the connection is lost for good before. The client
        reconnects after an outage by itself, but a server's ``-ERR`` closes it with no
        reconnect, and a user the server turns away (a password changed by a reload, a
        revoked credential) is turned away at every reconnect: every pull and publish
        fails, and the pod would idle, ready, for ever. Its restart connects anew."""
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self.closed.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if self.closed.is_set() and not stop.is_set():
            reason = self.nc.last_error
            raise BrokerClosed(
                "the NATS client closed the connection"
                + (f": {type(reason).__name__}: {reason}" if reason else "")
            )

    async def publish(self, event: Event, *, subject: str | None = None) -> None:
        """Publish and wait for JetStream's PubAck (duplicates by event id are dropped)."""
        await self.js.publish(subject or event.SUBJECT, event.to_wire(), headers=event.headers())
        EVENTS_PUBLISHED.labels(event.TYPE).inc()

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
        """Have JetStream publish ``event`` at ``at`` (at once if ``at`` is past).

        The schedule waits on ``schedule`` (default: a subject of its own under
        ``schedules_prefix``); a later schedule on the same subject replaces it.
        ``replacing``: only if the subject's last message is still the one of that
        sequence (``waiting``; 0 for none), else ``Overtaken``.
        """
        headers = event.headers()
        headers["Nats-Schedule"] = schedule_header(at)
        headers["Nats-Schedule-Target"] = subject or event.SUBJECT
        if replacing is not None:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(replacing)
        where = schedule or f"{schedules_prefix}.{event.id}"
        try:
            await self.js.publish(where, event.to_wire(), headers=headers)
        except APIError as exc:
            if exc.err_code in WRONG_LAST_SEQUENCE:
                raise Overtaken(f"{where} changed since it was read") from exc
            raise
        EVENTS_PUBLISHED.labels(event.TYPE).inc()

    async def scheduled_event(self, schedule: str) -> bytes | None:
        """The event a schedule waiting on the subject ``schedule`` of the events stream
        will publish, as sent; None when none waits (one that fired is gone from it).
        Raises if the broker cannot say."""
        return (await self.waiting(schedule))[0]

    async def waiting(self, schedule: str) -> tuple[bytes | None, int]:
        """``scheduled_event``, and the sequence to replace it by (``publish_at``)."""
        try:
            msg = await self.js.get_last_msg(EVENTS_STREAM, schedule)
        except NotFoundError:
            return None, 0
        return msg.data or None, msg.seq or 0

    async def park(self, consumer: str, msg: Msg, reason: str) -> None:
        """Move a message nobody can handle to the dead-letter stream, with the reason.

        The message keeps its own headers (``Trove-Event-Type``...), save the ``Nats-*``
        ones, which would make the dead-letter stream deduplicate or schedule it; its
        ``Nats-Msg-Id`` is kept as ``Trove-Dead-Msg-Id``. ``trove dead redrive`` sends it
        back to ``Trove-Dead-Subject``.
        """
        meta = jetstream_metadata(msg)
        stream, seq = ("", "") if meta is None else (meta.stream, str(meta.sequence.stream))
        own = msg.headers or {}
        headers = {k: v for k, v in own.items() if not k.startswith(("Nats-", "Trove-Dead-"))}
        headers |= {
            # One line: a header value cannot hold a line break (validation errors have many).
            "Trove-Dead-Reason": " ".join(reason.split())[:1000],
            "Trove-Dead-Subject": msg.subject,
            "Trove-Dead-Consumer": consumer,
            "Trove-Dead-Stream": stream,
            "Trove-Dead-Stream-Seq": seq,
        }
        if "Nats-Msg-Id" in own:
            headers["Trove-Dead-Msg-Id"] = own["Nats-Msg-Id"]
        # The same message parked twice (its term was lost, it failed again) is kept once.
        headers["Nats-Msg-Id"] = f"{consumer}:{stream}:{seq}"
        await self.js.publish(f"{DEAD_PREFIX}.{consumer}", msg.data, headers=headers)
        log.error(
            "parked a message",
            extra={"consumer": consumer, "reason": reason} | message_fields(msg),
        )

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.nc.drain()


def message_fields(msg: Msg) -> dict[str, str]:
    """What names ``msg`` in a log line: its subject, stream and sequence (as `trove
    dead` and `nats stream get` take them), its event's id and type."""
    meta = jetstream_metadata(msg)
    fields = {"subject": msg.subject}
    if meta is not None:
        fields |= {"stream": meta.stream, "stream_seq": str(meta.sequence.stream)}
    headers = msg.headers or {}
    for header, name in (("Nats-Msg-Id", "event_id"), ("Trove-Event-Type", "event_type")):
        if header in headers:
            fields[name] = headers[header]
    return fields


def jetstream_metadata(msg: Msg) -> Msg.Metadata | None:
    """``msg``'s JetStream metadata; None for a message handed over directly (a test's,
    a core NATS publish), which has none."""
    try:
        return msg.metadata
    except Exception:  # nats-py: NotJSMessageError, or a reply subject it cannot read
        return None


def read_event(msg: Msg) -> Event:
    """The event ``msg`` carries (MalformedEvent when it holds none), its times no later
    than the record took it (``events.as_stored``): how the recorder and discovery read
    what happened, since an attempt or a poll stamped a year ahead would otherwise order
    its page's row and plan its next visit by that year. (The fetcher reads requests,
    whose times it does not use.) A message handed over directly has no record's time
    and is read as it is."""
    event = decode_event(msg.data)
    meta = jetstream_metadata(msg)
    return event if meta is None else as_stored(event, meta.timestamp)


def _sequence(msg: Msg) -> int | None:
    meta = jetstream_metadata(msg)
    return None if meta is None else int(meta.sequence.stream)


class FailureCounts:
    """How many times this process's handler failed each message, by stream sequence.

    Counted here rather than read from JetStream's ``num_delivered``, which also counts
    redeliveries after a ``Retry``, an ``ack_wait`` expiry or a pod's death: a message
    that only waited for the database must never be parked. The count lives in the
    process, so with several pods a poison message is parked after at most
    ``max_failures`` failures in each pod that meets it (and a restart starts it again):
    bounded either way, and a failure costs no write to the broker, which may be the
    thing that is away. ``limit`` bounds the memory: a failing message stays unacked in
    its consumer, so at most ``max_ack_pending`` (10,000 for the recorder) are failing
    at once; the oldest entries go first.
    """

    __slots__ = ("_counts", "_limit")

    def __init__(self, limit: int = 10_000) -> None:
        self._limit = limit
        self._counts: OrderedDict[int, int] = OrderedDict()

    def add(self, seq: int) -> int:
        """Count one more failure of message ``seq``; return its count."""
        n = self._counts.pop(seq, 0) + 1
        self._counts[seq] = n
        while len(self._counts) > self._limit:
            self._counts.popitem(last=False)
        return n

    def forget(self, seq: int | None) -> None:
        if seq is not None and self._counts:
            self._counts.pop(seq, None)

    def __len__(self) -> int:
        return len(self._counts)


Handler = Callable[[Msg], Awaitable[None]]
BatchHandler = Callable[[Sequence[Msg]], Awaitable[None]]


@dataclass(kw_only=True)
class Consumer:
    """A durable pull consumer run as a loop until ``stop`` is set.

    ``concurrency`` messages are handled at once; a slow one never holds the others
    (each runs in its own task). In-flight handlers are awaited on stop, so a SIGTERM
    finishes or hands back (nak) what it holds. After a handler meets broker trouble
    the consumer starts and pulls nothing for a while (``_Backoff``).
    """

    bus: Bus
    stream: str
    durable: str
    handler: Handler
    concurrency: int = 16
    #: Most messages one pull request asks for.
    fetch_batch: int = 64
    #: Failures of the handler itself (not deliveries) before a message is parked.
    max_failures: int = 5
    #: Delay after the first failure, doubled after each one, up to ``max_failure_backoff``.
    failure_backoff: float = 2.0
    max_failure_backoff: float = 300.0
    #: Delay before a message whose handler met a broker error is redelivered.
    broker_retry_delay: float = 2.0
    #: Messages whose failures are remembered at most (see ``FailureCounts``).
    failure_memory: int = 10_000
    #: How often this consumer's parked messages are counted for ``trove_dead_letters``.
    dead_letters_refresh: float = 60.0
    #: Longest the loop sleeps before it looks at ``stop`` and its pulls again.
    idle_wait: float = 1.0
    #: How long a pull request waits at the server for messages (``Pulls``).
    pull_expires: float = 5.0
    #: When > 0, an ack waits for the server to confirm it, and is sent again for up to
    #: this many seconds while the broker is away. For work whose redelivery costs a
    #: site a request (the fetcher): an ack lost while a cluster elects a consumer
    #: leader would bring the message back after ``ack_wait``. Costs a reply per ack.
    confirm_acks: float = 0.0
    #: Messages held in hand beyond ``concurrency``, started highest ``Trove-Priority``
    #: header first, then most ``Trove-Siblings``, then in arrival order: among the work
    #: a pod has pulled and could start, priority decides. 0 starts every message as it
    #: arrives.
    prefetch: int = 0
    #: A message held or handled this many seconds is marked in progress (again), so
    #: JetStream does not give it to another pod meanwhile (a third of ``ack_wait`` or
    #: less). Across a reconnect those marks may have been lost: what was held is
    #: dropped from the hand and left to JetStream's redelivery.
    hold_refresh: float = 10.0
    #: Pulls refused this long in a row (not expired: refused) make the consumer look
    #: at its durable (``_still_served``).
    refusal_patience: float = 60.0
    #: Longest wait after broker trouble (``_Backoff``): how late, at most, the consumer
    #: notices that the broker takes writes again.
    max_retry_pause: float = 30.0
    failures: FailureCounts = field(init=False, repr=False)
    backoff: _Backoff = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.failures = FailureCounts(self.failure_memory)
        self.backoff = _Backoff(self.max_retry_pause)

    async def run(self, stop: asyncio.Event) -> None:
        if not await self._bind(stop):
            return
        pulls, wake, waker = await _open_pulls(self, stop)
        watcher = asyncio.create_task(self.watch_dead_letters(stop))
        tasks: dict[asyncio.Task[Retry | None], Msg] = {}
        held = _Held()
        marks = _Marks()
        capacity = self.concurrency + self.prefetch
        reconnects = self.bus.nc.stats.get("reconnects", 0)

        def done(task: asyncio.Task[Retry | None]) -> None:
            msg = tasks.pop(task, None)
            if msg is not None:
                marks.discard(msg)
            wake.set()

        try:
            while not stop.is_set():
                wake.clear()
                if self.bus.nc.stats.get("reconnects", 0) != reconnects:
                    reconnects = self.bus.nc.stats.get("reconnects", 0)
                    # While the connection was down no mark in progress reached
                    # JetStream: what was held may have gone to another pod meanwhile.
                    # Left to JetStream's redelivery, each is started once.
                    forgotten = held.drain()
                    if forgotten:
                        log.info("%s: %d held messages left to redelivery after a reconnect",
                                 self.durable, len(forgotten))  # fmt: skip
                for msg in pulls.take():
                    held.push(msg)
                paused = self.backoff.left()
                if paused:
                    # Held through a pause, work would be stranded by a reconnect (left
                    # to JetStream's redelivery, an ack_wait away): it goes back to the
                    # stream, due again when the pause ends.
                    for msg in held.drain():
                        await _quiet(msg.nak(delay=paused))
                else:
                    while held and len(tasks) < self.concurrency:
                        self._start(held.pop(), tasks, done, marks)
                    room = min(capacity - len(tasks) - len(held), self.fetch_batch)
                    try:
                        await pulls.ask(room)
                    except Exception as exc:  # connection trouble: nats-py reconnects
                        log.warning("pull from %s failed: %s", self.durable, exc)
                await held.refresh(self.hold_refresh)
                await marks.refresh(self.hold_refresh)
                await _still_served(self, pulls)
                if pulls:
                    continue
                await _wait(wake, self._next_look(pulls, held, marks))
        finally:
            waker.cancel()
            # Pulled, never started: straight back to the stream, before the wait for
            # what runs (longer than ack_wait, it would let them go to another pod
            # meanwhile, and a nak after that would hand them out twice).
            for msg in [*held.drain(), *await pulls.close()]:
                await _quiet(msg.nak())
            await marks.drain(tasks, self.hold_refresh)
            watcher.cancel()

    def _next_look(self, pulls: Pulls, held: _Held, marks: _Marks) -> float:
        """How long the loop may sleep if nothing wakes it: until a lost pull is given
        up, a held or handled message needs marking in progress or a pause after broker
        trouble ends, at most ``idle_wait``."""
        now = time.monotonic()
        look = now + self.idle_wait
        paused = self.backoff.left()
        if paused:
            look = min(look, now + paused)
        deadline = pulls.next_deadline()
        if deadline is not None:
            look = min(look, deadline)
        if held:
            look = min(look, held.oldest() + self.hold_refresh)
        marking = marks.next_look()
        if marking is not None:
            look = min(look, marking)
        return max(0.0, look - now)

    def _start(
        self,
        msg: Msg,
        tasks: dict[asyncio.Task[Retry | None], Msg],
        done: Callable[[asyncio.Task[Retry | None]], object],
        marks: _Marks,
    ) -> None:
        task = asyncio.create_task(self._handle(msg))
        tasks[task] = msg
        marks.add(msg, time.monotonic())
        task.add_done_callback(done)

    async def watch_dead_letters(self, stop: asyncio.Event) -> None:
        """Keep ``trove_dead_letters{consumer}`` current (parked, re-driven, dropped)."""
        while not stop.is_set():
            await self.count_dead_letters()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.dead_letters_refresh)

    async def count_dead_letters(self) -> None:
        subject = f"{DEAD_PREFIX}.{self.durable}"
        try:
            info = await self.bus.js.stream_info(DEAD_STREAM, subjects_filter=subject)
        except Exception as exc:  # no stream yet, or the broker is away: next time
            log.debug("could not count %s: %s", subject, exc)
            return
        DEAD_LETTERS.labels(self.durable).set((info.state.subjects or {}).get(subject, 0))

    async def _bind(self, stop: asyncio.Event) -> bool:
        """Wait until the durable consumer exists (its owner creates it); False on stop."""
        while not stop.is_set():
            try:
                await self.bus.js.consumer_info(self.stream, self.durable)
                return True
            except NotFoundError:
                log.warning("consumer %s not found yet on %s", self.durable, self.stream)
            except Exception as exc:
                log.warning("binding %s failed: %s", self.durable, exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)
        return False

    async def _handle(self, msg: Msg) -> Retry | None:
        """Handle ``msg`` and answer it; returns the ``Retry`` that handed it back, if any."""
        if redriven_elsewhere(msg, self.durable):
            await _quiet(msg.ack())
            return None
        try:
            await self.handler(msg)
        except Retry as retry:
            await self._retry(msg, retry)
            return retry
        except MalformedEvent as exc:
            await self._park(msg, f"malformed: {exc}")
            return None
        except Exception as exc:
            if broker_trouble(exc):
                reason = f"broker unavailable: {type(exc).__name__}: {exc}"
                trouble = Retry(reason, delay=self.broker_retry_delay)
                # Said once a pause: while the store is full every message meets it.
                if self.backoff.handed_back(trouble):
                    pause = self.backoff.pause
                    log.warning("%s: %s; nothing new starts for %.1fs", self.durable, reason, pause)
                await self._retry(msg, trouble, quiet=True)
                return trouble
            await self._failed(msg, exc)
            return None
        self.backoff.handled()
        if len(self.failures):  # usually empty: no metadata parsed for nothing
            self.failures.forget(_sequence(msg))
        MESSAGES_HANDLED.labels(self.durable, "acked").inc()
        if self.confirm_acks > 0:
            await self._confirmed_ack(msg)
        else:
            await _quiet(msg.ack())
        return None

    async def _confirmed_ack(self, msg: Msg) -> None:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.confirm_acks
        while True:
            try:
                await msg.ack_sync(timeout=1.0)
                return
            except Exception as exc:
                if not broker_trouble(exc) or loop.time() >= give_up:
                    log.warning("ack not confirmed: %s", exc)
                    return
            await asyncio.sleep(0.25)

    async def _retry(self, msg: Msg, retry: Retry, *, quiet: bool = False) -> None:
        """Hand the message back for later: not the message's fault, so not counted."""
        level = logging.DEBUG if retry.expected or quiet else logging.WARNING
        log.log(level, "%s: retrying in %.1fs: %s", self.durable, retry.delay, retry)
        MESSAGES_HANDLED.labels(self.durable, "retried").inc()
        await _quiet(msg.nak(delay=retry.delay))

    async def _failed(self, msg: Msg, exc: Exception) -> None:
        seq = _sequence(msg)
        # A message outside a stream is never redelivered: parking is the only way to keep it.
        n = self.failures.add(seq) if seq is not None else self.max_failures
        if n >= self.max_failures:
            await self._park(msg, f"failed {n} times: {type(exc).__name__}: {exc}")
            return
        delay = min(self.failure_backoff * (2 ** (n - 1)), self.max_failure_backoff)
        log.exception(
            "%s: handler failed (%d times), retry in %.1fs",
            self.durable,
            n,
            delay,
            extra=message_fields(msg),
        )
        MESSAGES_HANDLED.labels(self.durable, "failed").inc()
        await _quiet(msg.nak(delay=delay))

    async def _park(self, msg: Msg, reason: str) -> None:
        try:
            await self.bus.park(self.durable, msg, reason)
        except Exception as exc:
            # Could not park: hand it back rather than lose it. Its count is kept, so
            # its next failure tries to park it again, later each time: a dead-letter
            # stream at an operator's limit refuses every park (discard new) until
            # someone acts, and a poison message handled again every 2 s meanwhile
            # would be a busy loop.
            seq = _sequence(msg)
            n = self.failures.add(seq) if seq is not None else 1
            backoff = self.failure_backoff * (2 ** (n - 1))
            delay = max(self.broker_retry_delay, min(backoff, self.max_failure_backoff))
            log.warning("could not park a message (%s); handing it back for %.1fs", exc, delay)
            await _quiet(msg.nak(delay=delay))
            return
        self.failures.forget(_sequence(msg))
        MESSAGES_HANDLED.labels(self.durable, "parked").inc()
        await _quiet(msg.term())
        await self.count_dead_letters()


def _header_int(msg: Msg, name: str) -> int:
    value = (msg.headers or {}).get(name)
    if value is None:
        return 0
    try:
        return int(value)
    except ValueError:
        return 0


def message_priority(msg: Msg) -> int:
    """A message's ``Trove-Priority`` header (``Event.headers``), 0 when absent or unreadable."""
    return _header_int(msg, PRIORITY_HEADER)


class _Marks:
    """Messages being handled, each marked in progress once ``every`` seconds have passed
    since it was started or last marked. Without the marks JetStream hands a message
    whose handling outlasts ``ack_wait`` to another pod while it is still handled: a page
    behind a slow robots.txt and slow redirect hops (each up to the request timeout),
    or a batch on a busy database, would be handled twice, the site asked twice.

    Looked at every ``every / 2`` at most, so a mark is sent within ``1.5 * every`` of
    the last: the consumers' ``hold_refresh`` is a third of ``ack_wait`` or less.
    """

    __slots__ = ("_next", "_since")

    def __init__(self) -> None:
        self._since: dict[int, tuple[Msg, float]] = {}
        self._next = 0.0

    def add(self, msg: Msg, now: float) -> None:
        self._since[id(msg)] = (msg, now)

    def discard(self, msg: Msg) -> None:
        self._since.pop(id(msg), None)

    def next_look(self) -> float | None:
        """When ``refresh`` may next have a mark to send (monotonic), if anything is handled."""
        return self._next if self._since else None

    async def refresh(self, every: float) -> None:
        now = time.monotonic()
        if now < self._next or not self._since:
            return
        self._next = now + every / 2
        for key, (msg, since) in list(self._since.items()):
            if key not in self._since or now - since < every:
                continue
            if msg.is_acked:  # answered (a batch's fallback naks as it goes): a mark
                del self._since[key]  # would restart a nak's delay at ack_wait
                continue
            self._since[key] = (msg, now)
            await _quiet(msg.in_progress())

    async def drain(
        self, tasks: Collection[asyncio.Task[Any]], every: float, within: float = math.inf
    ) -> None:
        """Wait for ``tasks`` (a stopping consumer's handlers), marking their messages
        meanwhile: a page still behind its robots.txt when the pod stops is as much in
        progress as before. Returns after ``within`` seconds, whatever still runs."""
        deadline = time.monotonic() + within
        while tasks and (left := deadline - time.monotonic()) > 0:
            await asyncio.wait(list(tasks), timeout=min(every / 2, left))
            await self.refresh(every)


class _Held:
    """Pulled messages waiting for a free slot: a heap, highest priority first, then the
    most siblings (``SIBLINGS_HEADER``), then FIFO. A pod holds hundreds when work
    comes due faster than it can start it, so nothing here walks them all but
    ``refresh``, and that only when one is due for it."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, int, Msg]] = []
        self._order = itertools.count()
        #: When each held message arrived or was last marked in progress, by order...
        self._since: dict[int, float] = {}
        #: ... and the same, oldest first (stale entries are skipped when read).
        self._queue: deque[tuple[float, int]] = deque()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, msg: Msg) -> None:
        order, now = next(self._order), time.monotonic()
        key = (-message_priority(msg), -_header_int(msg, SIBLINGS_HEADER), order, msg)
        heapq.heappush(self._heap, key)
        self._since[order] = now
        self._queue.append((now, order))

    def pop(self) -> Msg:
        entry = heapq.heappop(self._heap)
        del self._since[entry[2]]
        if not self._heap:
            # All the queue holds now is stale, and a hand that empties between
            # messages never asks for the oldest, which is what trims it.
            self._queue.clear()
        return entry[3]

    def oldest(self) -> float:
        """Since when the longest-held message has waited (or was last marked in progress)."""
        queue, since = self._queue, self._since
        while queue and since.get(queue[0][1]) != queue[0][0]:
            queue.popleft()
        return queue[0][0] if queue else time.monotonic()

    def drain(self) -> list[Msg]:
        msgs = [entry[3] for entry in self._heap]
        self._heap.clear()
        self._since.clear()
        self._queue.clear()
        return msgs

    async def refresh(self, after: float) -> None:
        now = time.monotonic()
        if not self._heap or now - self.oldest() < after:
            return
        for _, _, order, msg in self._heap:
            if now - self._since[order] >= after:
                await _quiet(msg.in_progress())
                self._since[order] = now
                self._queue.append((now, order))


@dataclass(kw_only=True)
class BatchConsumer:
    """A durable pull consumer handling up to ``batch_size`` messages at a time.

    The batch handler applies them together (one transaction); then all are acked.
    ``Retry`` hands the whole batch back, and the consumer waits before it starts or
    pulls another (``_Backoff``). Any other failure falls back to handling the messages
    one by one with ``handler``, so one poison message is parked on its own and the rest
    of its batch still goes through; a ``Retry`` there hands the rest back with it.
    """

    bus: Bus
    stream: str
    durable: str
    batch_handler: BatchHandler
    handler: Handler
    batch_size: int = 256
    #: The most bytes of messages a batch holds (one message at least, whatever its
    #: size); the consumer holds ``concurrency`` times this at most, in hand and in
    #: batches, and asks the server for no more. Counted in messages alone, a backlog
    #: of pages of a thousand links each held ~250 MB in two batches of 500.
    batch_max_bytes: int = 8 * 1024 * 1024
    concurrency: int = 2
    max_failures: int = 5
    failure_backoff: float = 2.0
    broker_retry_delay: float = 2.0
    dead_letters_refresh: float = 60.0
    #: Longest the loop sleeps before it looks at ``stop`` and its pulls again.
    idle_wait: float = 1.0
    #: How long a pull request waits at the server for messages (``Pulls``).
    pull_expires: float = 5.0
    #: A batch short of ``batch_size`` waits this long after its first message before it
    #: is handled: a crawl trickles events in a few at a time, and each batch costs a
    #: transaction.
    linger: float = 0.0
    #: A message in hand or in a batch being handled this many seconds is marked in
    #: progress (again): a third of ``ack_wait`` or less (``Consumer.hold_refresh``).
    hold_refresh: float = 10.0
    #: As ``Consumer.refusal_patience``.
    refusal_patience: float = 60.0
    #: Longest wait after batches handed back (``_Backoff``): how late, at most, the
    #: consumer notices that the database or the broker is back.
    max_retry_pause: float = 30.0
    #: Longest a stopping consumer waits for its batches; then they are cancelled and
    #: their messages handed back (the projection applies them again unchanged). A
    #: batch on a database gone without closing its connections never ends: the stop
    #: lasted until SIGKILL, its messages marked in progress, out of every pod's reach,
    #: all the while. Well below the recorder's 30 s grace (k8s/base/recorder.yaml,
    #: compose.yaml), leaving it time to close its connections.
    drain_timeout: float = 8.0

    async def run(self, stop: asyncio.Event) -> None:
        # Handles the messages of a failed batch one by one, and counts their failures.
        single = Consumer(
            bus=self.bus,
            stream=self.stream,
            durable=self.durable,
            handler=self.handler,
            max_failures=self.max_failures,
            failure_backoff=self.failure_backoff,
            broker_retry_delay=self.broker_retry_delay,
            dead_letters_refresh=self.dead_letters_refresh,
            max_retry_pause=self.max_retry_pause,
        )
        if not await single._bind(stop):
            return
        pulls, wake, waker = await _open_pulls(self, stop)
        watcher = asyncio.create_task(single.watch_dead_letters(stop))
        #: Batches being handled, and the messages each holds.
        tasks: dict[asyncio.Task[None], list[Msg]] = {}
        in_hand: list[Msg] = []
        #: Bytes of the messages in hand, and of those in batches being handled.
        hand_bytes, busy_bytes = 0, 0
        since = 0.0  # when the oldest message in hand arrived
        loop = asyncio.get_running_loop()
        marks = _Marks()
        # One pause for both: a message of a split batch that meets broker trouble
        # starts it (``Consumer._handle``).
        backoff = single.backoff

        def done(task: asyncio.Task[None]) -> None:
            nonlocal busy_bytes
            for msg in tasks.pop(task, ()):
                marks.discard(msg)
                busy_bytes -= _size(msg)
            wake.set()

        try:
            while not stop.is_set():
                wake.clear()
                arrived = pulls.take()
                if arrived:
                    if not in_hand:
                        since = loop.time()
                    in_hand += arrived
                    arrival = time.monotonic()
                    for msg in arrived:
                        marks.add(msg, arrival)
                        hand_bytes += _size(msg)
                now = loop.time()
                waiting = backoff.left()
                # A trickle waits up to ``linger`` for company: each batch is a transaction.
                if (
                    in_hand
                    and not waiting
                    and len(tasks) < self.concurrency
                    and (
                        len(in_hand) >= self.batch_size
                        or hand_bytes >= self.batch_max_bytes
                        or now - since >= self.linger
                    )
                ):
                    taken = _batch_bytes(in_hand, self.batch_size, self.batch_max_bytes)
                    batch, in_hand = in_hand[: len(taken)], in_hand[len(taken) :]
                    moved = sum(taken)
                    hand_bytes -= moved
                    busy_bytes += moved
                    since = now
                    task = asyncio.create_task(self._handle(single, batch, backoff))
                    tasks[task] = batch
                    task.add_done_callback(done)
                    continue
                await marks.refresh(self.hold_refresh)
                await _still_served(self, pulls)
                handled = sum(len(batch) for batch in tasks.values())
                room = self.batch_size * self.concurrency - handled - len(in_hand)
                byte_room = self.batch_max_bytes * self.concurrency - busy_bytes - hand_bytes
                if not waiting and byte_room > 0:
                    try:
                        await pulls.ask(min(room, self.batch_size), max_bytes=byte_room)
                    except Exception as exc:  # connection trouble: nats-py reconnects
                        log.warning("pull from %s failed: %s", self.durable, exc)
                if pulls:
                    continue
                look = self.idle_wait
                deadline = pulls.next_deadline()
                if deadline is not None:
                    look = min(look, deadline - time.monotonic())
                if waiting:
                    look = min(look, waiting)
                elif in_hand and len(tasks) < self.concurrency:
                    look = min(look, since + self.linger - now)
                marking = marks.next_look()
                if marking is not None:
                    look = min(look, marking - time.monotonic())
                await _wait(wake, max(0.0, look))
        finally:
            waker.cancel()
            for msg in [*in_hand, *await pulls.close()]:  # pulled, never handled: back first
                marks.discard(msg)
                await _quiet(msg.nak())
            await marks.drain(tasks, self.hold_refresh, self.drain_timeout)
            if tasks:
                log.warning(
                    "%s: %d batches still running %.1fs after the stop, handed back",
                    self.durable,
                    len(tasks),
                    self.drain_timeout,
                )
            for task, batch in list(tasks.items()):
                task.cancel()  # before the naks: no ack of its may follow them
                for msg in batch:
                    if not msg.is_acked:
                        marks.discard(msg)
                        await _quiet(msg.nak())
            watcher.cancel()

    async def _handle(self, single: Consumer, msgs: Sequence[Msg], backoff: _Backoff) -> None:
        if any(redriven_elsewhere(msg, self.durable) for msg in msgs):
            for msg in msgs:
                if redriven_elsewhere(msg, self.durable):
                    await _quiet(msg.ack())
            msgs = [msg for msg in msgs if not redriven_elsewhere(msg, self.durable)]
            if not msgs:
                return
        try:
            await self.batch_handler(msgs)
        except Retry as retry:
            await self._retry(msgs, retry, backoff)
            return
        except Exception as exc:
            if broker_trouble(exc):
                reason = f"broker unavailable: {type(exc).__name__}: {exc}"
                await self._retry(msgs, Retry(reason, delay=self.broker_retry_delay), backoff)
                return
            log.warning("%s: batch failed (%s), handling one by one", self.durable, exc)
            for n, msg in enumerate(msgs):
                trouble = await single._handle(msg)
                if trouble is not None:  # the database or the broker away: the rest would be
                    await self._retry(msgs[n + 1 :], trouble, backoff)
                    return
            backoff.handled()
            return
        backoff.handled()
        MESSAGES_HANDLED.labels(self.durable, "acked").inc(len(msgs))
        for msg in msgs:  # an ack is a publish into the client's buffer: no task each
            if len(single.failures):
                single.failures.forget(_sequence(msg))
            await _quiet(msg.ack())

    async def _retry(self, msgs: Sequence[Msg], retry: Retry, backoff: _Backoff) -> None:
        backoff.handed_back(retry)
        if not msgs:
            return
        # An expected wait (a replay rebuilding the tables) is said once by whoever waits.
        level = logging.DEBUG if retry.expected else logging.WARNING
        log.log(level, "%s: batch retried in %.1fs: %s", self.durable, retry.delay, retry)
        MESSAGES_HANDLED.labels(self.durable, "retried").inc(len(msgs))
        await asyncio.gather(*(_quiet(m.nak(delay=retry.delay)) for m in msgs))


class _Backoff:
    """How long a consumer starts and pulls nothing after work is handed back: a
    ``BatchConsumer``'s batches (``Retry``: the database or the broker away), a
    ``Consumer``'s messages that met broker trouble. The retry's delay, doubled while
    the work started after each wait comes back too, up to ``limit``; work handled
    ends the doubling.

    Otherwise a recorder whose database refuses would pull and decode the next batch
    the moment one came back, through its whole ack window, and all of it again each
    time a delay passed: a hot loop for as long as the database is away. A fetcher or
    discovery whose store is full (every write refused, every pull served) would run
    each message of its ack window, thousands, against the refusing server every 2 s,
    with a warning each, for as long as the store stays full."""

    __slots__ = ("limit", "pause", "until")

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.pause = 0.0
        #: Nothing starts before this time (monotonic).
        self.until = 0.0

    def handed_back(self, retry: Retry) -> bool:
        """Start a pause, unless one is under way; whether one started."""
        now = time.monotonic()
        if now < self.until:
            return False  # work started before this wait met the trouble it waits out
        self.pause = min(self.limit, max(retry.delay, 2 * self.pause))
        self.until = now + self.pause
        return True

    def handled(self) -> None:
        self.pause = 0.0

    def left(self) -> float:
        """Seconds still to wait (0: batches may start)."""
        return max(0.0, self.until - time.monotonic())


async def _still_served(consumer: Consumer | BatchConsumer, pulls: Pulls) -> None:
    """Once every pull has been refused for ``refusal_patience``, look at the durable.
    Gone (``nats consumer rm``, its stream deleted and made again), nothing would ever
    serve the pulls again while the service looked ready: ``TopologyError`` ends the
    process, and its restart makes the consumer again (its owner's start does; another
    service's waits for it). There, the refusal is logged once a patience.
    """
    if pulls.refused_for() < consumer.refusal_patience:
        return
    waited = pulls.refused_for()
    pulls.restart_refusals()
    try:
        await consumer.bus.js.consumer_info(consumer.stream, consumer.durable)
    except NotFoundError:
        raise TopologyError(
            f"consumer {consumer.durable} on {consumer.stream} is gone (pulls refused for "
            f"{waited:.0f} s: {pulls.refusal}); a restart makes it again"
        ) from None
    except Exception as exc:  # the broker away: the pulls go on, and say when it is back
        log.debug("could not look at %s: %s", consumer.durable, exc)
        return
    log.warning("pulls on %s refused for %.0f s: %s", consumer.durable, waited, pulls.refusal)


async def _wait(wake: asyncio.Event, seconds: float) -> None:
    """Until ``wake`` is set or ``seconds`` have passed: a timer, not a task per wait."""
    if wake.is_set():
        return
    timer = asyncio.get_running_loop().call_later(seconds, wake.set)
    try:
        await wake.wait()
    finally:
        timer.cancel()


def _size(msg: Msg) -> int:
    """A message's bytes as held: its payload (its subject and headers are small)."""
    return len(msg.data)


def _batch_bytes(in_hand: Sequence[Msg], count: int, max_bytes: int) -> list[int]:
    """The sizes of the messages from the start of ``in_hand`` that make the next batch:
    ``count`` at most and ``max_bytes`` at most, the first one whatever its size."""
    sizes: list[int] = []
    total = 0
    for msg in in_hand[:count]:
        size = _size(msg)
        if sizes and total + size > max_bytes:
            break
        sizes.append(size)
        total += size
    return sizes


async def _open_pulls(
    consumer: Consumer | BatchConsumer, stop: asyncio.Event
) -> tuple[Pulls, asyncio.Event, asyncio.Task[None]]:
    """The consumer's pulls, started; the event that wakes its loop (a message arrived,
    a request ended, ``stop``); the task that sets it on ``stop``."""
    wake = asyncio.Event()
    pulls = Pulls(
        consumer.bus.nc,
        consumer.stream,
        consumer.durable,
        expires=consumer.pull_expires,
        grace=consumer.idle_wait,
        wake=wake.set,
    )
    await pulls.start()
    return pulls, wake, asyncio.create_task(_wake_on(stop, wake))


async def _wake_on(stop: asyncio.Event, wake: asyncio.Event) -> None:
    await stop.wait()
    wake.set()


async def _quiet(op: Awaitable[Any]) -> None:
    """Ack/nak/term: a lost ack only means a redelivery, which every consumer tolerates."""
    try:
        await op
    except Exception as exc:
        log.warning("ack/nak failed: %s", exc)


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), default=str).encode()
