"""The event bus: one NATS connection per process, publishing with PubAck, consuming durably.

Publishing an event waits for JetStream's acknowledgement, so a caller that acks its
input after ``publish`` returns never loses the consequence. An event for later is a
NATS scheduled message (nats-server 2.12+): JetStream itself publishes it at the due
time, so no process has to stay alive holding a timer.

Consumers are plain pull loops with an explicit policy for every way a message can
end (see ``Consumer``):

* handled              -> ack
* ``Retry`` raised     -> nak with the delay asked for (the broker or database is away)
* ``MalformedEvent``   -> parked on ``trove.dead.<consumer>`` with the reason, then acked
* any other exception  -> nak with a growing delay; after ``max_failures`` deliveries
                          it is parked like a poison message (no hot loop, no drop)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from trove_schema.errors import MalformedEvent, TroveError
from trove_schema.events import Event
from trove_schema.metrics import EVENTS_PUBLISHED, MESSAGES_HANDLED
from trove_schema.topology import DEAD_PREFIX, EVENT_SCHEDULES_PREFIX

log = logging.getLogger(__name__)


class Retry(TroveError):
    """Raised by a handler: hand the message back, to be redelivered after ``delay`` seconds."""

    def __init__(self, reason: str, delay: float = 5.0) -> None:
        super().__init__(reason)
        self.delay = delay


def schedule_header(at: datetime) -> str:
    return "@at " + at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Bus:
    """One NATS connection and its JetStream context, opened in a service's lifespan."""

    def __init__(self, nc: Client, js: JetStreamContext) -> None:
        self.nc = nc
        self.js = js

    @classmethod
    async def connect(cls, url: str, *, name: str, connect_timeout: float = 5.0) -> Bus:
        async def error_cb(exc: Exception) -> None:
            log.warning("nats: %s", exc)

        async def disconnected_cb() -> None:
            log.warning("nats: disconnected")

        async def reconnected_cb() -> None:
            log.info("nats: reconnected")

        nc = await nats.connect(
            url,
            name=name,
            connect_timeout=connect_timeout,
            max_reconnect_attempts=-1,
            reconnect_time_wait=1.0,
            error_cb=error_cb,
            disconnected_cb=disconnected_cb,
            reconnected_cb=reconnected_cb,
            allow_reconnect=True,
        )
        return cls(nc, nc.jetstream(timeout=10.0))

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
    ) -> None:
        """Have JetStream publish ``event`` at ``at`` (at once if ``at`` is past)."""
        headers = event.headers()
        headers["Nats-Schedule"] = schedule_header(at)
        headers["Nats-Schedule-Target"] = subject or event.SUBJECT
        await self.js.publish(f"{schedules_prefix}.{event.id}", event.to_wire(), headers=headers)
        EVENTS_PUBLISHED.labels(event.TYPE).inc()

    async def park(self, consumer: str, msg: Msg, reason: str) -> None:
        """Move a message nobody can handle to the dead-letter stream, with the reason."""
        meta = _metadata(msg)
        headers = {
            "Trove-Dead-Reason": reason[:1000],
            "Trove-Dead-Subject": msg.subject,
            "Trove-Dead-Consumer": consumer,
            "Trove-Dead-Stream-Seq": str(meta.get("stream_seq", "")),
        }
        msg_id = f"{consumer}:{meta.get('stream', '')}:{meta.get('stream_seq', '')}"
        headers["Nats-Msg-Id"] = msg_id
        await self.js.publish(f"{DEAD_PREFIX}.{consumer}", msg.data, headers=headers)
        log.error(
            "parked a message",
            extra={"consumer": consumer, "subject": msg.subject, "reason": reason},
        )

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.nc.drain()


def _metadata(msg: Msg) -> dict[str, Any]:
    try:
        md = msg.metadata
    except Exception:  # not a JetStream message
        return {}
    return {
        "stream": md.stream,
        "stream_seq": md.sequence.stream,
        "num_delivered": md.num_delivered,
    }


def deliveries(msg: Msg) -> int:
    return int(_metadata(msg).get("num_delivered", 1))


Handler = Callable[[Msg], Awaitable[None]]
BatchHandler = Callable[[Sequence[Msg]], Awaitable[None]]


@dataclass(kw_only=True)
class Consumer:
    """A durable pull consumer run as a loop until ``stop`` is set.

    ``concurrency`` messages are handled at once; a slow one never holds the others
    (each runs in its own task). In-flight handlers are awaited on stop, so a SIGTERM
    finishes or hands back (nak) what it holds.
    """

    bus: Bus
    stream: str
    durable: str
    handler: Handler
    concurrency: int = 16
    fetch_batch: int = 64
    max_failures: int = 5
    failure_backoff: float = 2.0
    idle_wait: float = 1.0
    busy_wait: float = 0.05

    async def run(self, stop: asyncio.Event) -> None:
        psub = await self._bind(stop)
        if psub is None:
            return
        slots = asyncio.Semaphore(self.concurrency)
        tasks: set[asyncio.Task[None]] = set()
        try:
            while not stop.is_set():
                free = max(1, min(self.fetch_batch, self.concurrency - (len(tasks))))
                if len(tasks) >= self.concurrency:
                    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                    continue
                # A pull for N messages lingers until N arrive or it expires; with work in
                # flight (and so maybe at max_ack_pending) keep pulls short, so freed
                # capacity is refilled at once rather than at the end of a long pull.
                wait = self.busy_wait if tasks else self.idle_wait
                try:
                    msgs = await psub.fetch(free, timeout=wait)
                except (TimeoutError, NatsTimeoutError):
                    continue
                except Exception as exc:  # connection trouble: nats-py reconnects
                    log.warning("fetch from %s failed: %s", self.durable, exc)
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=1.0)
                    continue
                for msg in msgs:
                    await slots.acquire()
                    task = asyncio.create_task(self._handle(msg))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    task.add_done_callback(lambda _t: slots.release())
        finally:
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await psub.unsubscribe()

    async def _bind(self, stop: asyncio.Event) -> JetStreamContext.PullSubscription | None:
        while not stop.is_set():
            try:
                return await self.bus.js.pull_subscribe_bind(self.durable, stream=self.stream)
            except NotFoundError:
                log.warning("consumer %s not found yet on %s", self.durable, self.stream)
            except Exception as exc:
                log.warning("binding %s failed: %s", self.durable, exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)
        return None

    async def _handle(self, msg: Msg) -> None:
        try:
            await self.handler(msg)
        except Retry as retry:
            log.warning("%s: retrying in %.1fs: %s", self.durable, retry.delay, retry)
            MESSAGES_HANDLED.labels(self.durable, "retried").inc()
            await _quiet(msg.nak(delay=retry.delay))
            return
        except MalformedEvent as exc:
            await self._park(msg, f"malformed: {exc}")
            return
        except Exception as exc:
            n = deliveries(msg)
            if n >= self.max_failures:
                await self._park(msg, f"failed {n} times: {type(exc).__name__}: {exc}")
                return
            delay = self.failure_backoff * (2 ** (n - 1))
            log.exception(
                "%s: handler failed (delivery %d), retry in %.1fs", self.durable, n, delay
            )
            MESSAGES_HANDLED.labels(self.durable, "failed").inc()
            await _quiet(msg.nak(delay=delay))
            return
        MESSAGES_HANDLED.labels(self.durable, "acked").inc()
        await _quiet(msg.ack())

    async def _park(self, msg: Msg, reason: str) -> None:
        try:
            await self.bus.park(self.durable, msg, reason)
        except Exception as exc:
            # Could not park: hand it back rather than lose it.
            log.warning("could not park a message (%s); handing it back", exc)
            await _quiet(msg.nak(delay=5.0))
            return
        MESSAGES_HANDLED.labels(self.durable, "parked").inc()
        await _quiet(msg.term())


@dataclass(kw_only=True)
class BatchConsumer:
    """A durable pull consumer handling up to ``batch_size`` messages at a time.

    The batch handler applies them together (one transaction); then all are acked.
    ``Retry`` hands the whole batch back. Any other failure falls back to handling the
    messages one by one with ``handler``, so one poison message is parked on its own
    and the rest of its batch still goes through.
    """

    bus: Bus
    stream: str
    durable: str
    batch_handler: BatchHandler
    handler: Handler
    batch_size: int = 256
    concurrency: int = 2
    idle_wait: float = 1.0
    fetch_wait: float = 0.05
    #: After a short fetch, keep collecting for up to this long before handling: a crawl
    #: trickles events in a few at a time, and each batch costs a transaction.
    linger: float = 0.0

    async def run(self, stop: asyncio.Event) -> None:
        single = Consumer(
            bus=self.bus, stream=self.stream, durable=self.durable, handler=self.handler
        )
        psub = await single._bind(stop)
        if psub is None:
            return
        tasks: set[asyncio.Task[None]] = set()
        try:
            while not stop.is_set():
                if len(tasks) >= self.concurrency:
                    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                    continue
                try:
                    msgs = await psub.fetch(
                        self.batch_size, timeout=self.fetch_wait if tasks else self.idle_wait
                    )
                except (TimeoutError, NatsTimeoutError):
                    continue
                except Exception as exc:
                    log.warning("fetch from %s failed: %s", self.durable, exc)
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=1.0)
                    continue
                if self.linger > 0 and len(msgs) < self.batch_size:
                    msgs = await self._fill(psub, list(msgs), stop)
                task = asyncio.create_task(self._handle(single, msgs))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await psub.unsubscribe()

    async def _fill(
        self, psub: JetStreamContext.PullSubscription, msgs: list[Msg], stop: asyncio.Event
    ) -> list[Msg]:
        """More messages for a short batch, until it is full or ``linger`` has passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.linger
        while len(msgs) < self.batch_size and not stop.is_set():
            left = deadline - loop.time()
            if left <= 0.005:
                break
            try:
                msgs += await psub.fetch(self.batch_size - len(msgs), timeout=left)
            except (TimeoutError, NatsTimeoutError):
                break
            except Exception as exc:
                log.warning("fetch from %s failed: %s", self.durable, exc)
                break
        return msgs

    async def _handle(self, single: Consumer, msgs: Sequence[Msg]) -> None:
        try:
            await self.batch_handler(msgs)
        except Retry as retry:
            log.warning("%s: batch retried in %.1fs: %s", self.durable, retry.delay, retry)
            MESSAGES_HANDLED.labels(self.durable, "retried").inc(len(msgs))
            await asyncio.gather(*(_quiet(m.nak(delay=retry.delay)) for m in msgs))
            return
        except Exception as exc:
            log.warning("%s: batch failed (%s), handling one by one", self.durable, exc)
            for msg in msgs:
                await single._handle(msg)
            return
        MESSAGES_HANDLED.labels(self.durable, "acked").inc(len(msgs))
        for msg in msgs:  # an ack is a publish into the client's buffer: no task each
            await _quiet(msg.ack())


async def _quiet(op: Awaitable[Any]) -> None:
    """Ack/nak/term: a lost ack only means a redelivery, which every consumer tolerates."""
    try:
        await op
    except Exception as exc:
        log.warning("ack/nak failed: %s", exc)


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), default=str).encode()
