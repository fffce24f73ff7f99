"""What every Trove service process shares: JSON logs, signals, a health endpoint.

A service is an async ``main(stop, ready)`` function. ``run`` sets up logging, turns
SIGTERM/SIGINT into ``stop``, serves ``/healthz`` (alive) and ``/readyz`` (``ready``
set) when ``TROVE_HTTP_PORT`` is given, and exits with the service's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import re
import signal
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from trove_schema import sqlstates
from trove_schema.errors import (
    BrokerClosed,
    InvalidPriors,
    InvalidTLS,
    StackError,
)
from trove_schema.metrics import exposition
from trove_schema.settings import CommonSettings, check_environment

ServiceMain = Callable[[asyncio.Event, asyncio.Event], Awaitable[None]]

_RESERVED = set(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}


def _extra(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a call gave with ``extra=`` (the URL, the domain, the event id...)."""
    return {
        key: value
        for key, value in vars(record).items()
        if key not in _RESERVED and not key.startswith("_")
    }


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and any ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(_extra(record))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


#: A value written bare in a text line: no space, quote, equals sign or control character.
_BARE = re.compile(r"[^\s\\\"=\x00-\x1f\x7f]+")


class TextFormatter(logging.Formatter):
    """One line a record for a person's eyes: time, service, level, message, then each
    ``extra`` field as ``key=value``. A value of a stranger's (a URL, an error a server
    sent) is quoted as JSON when it is not a bare word, so a line is one line."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        message = json.dumps(record.getMessage(), ensure_ascii=False)[1:-1]
        parts = [self.formatTime(record), self.service, record.levelname, message]
        for key, value in _extra(record).items():
            text = str(value)
            parts.append(f"{key}={text if _BARE.fullmatch(text) else json.dumps(text)}")
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup_logging(settings: CommonSettings, service: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level)
    for noisy in ("nats", "httpx", "httpcore", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


async def _health_server(port: int, ready: asyncio.Event) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), timeout=5)
            path = line.split()[1].decode() if len(line.split()) > 1 else "/"
            while (await asyncio.wait_for(reader.readline(), timeout=5)) not in (b"\r\n", b""):
                pass
            content_type = "text/plain"
            if path == "/healthz":
                status, body = "200 OK", b"ok\n"
            elif path == "/metrics":
                body, content_type = exposition()
                status = "200 OK"
            elif path == "/readyz":
                status, body = (
                    ("200 OK", b"ready\n")
                    if ready.is_set()
                    else (
                        "503 Service Unavailable",
                        b"not ready\n",
                    )
                )
            else:
                status, body = "404 Not Found", b"not found\n"
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError, IndexError):
            pass
        finally:
            writer.close()

    # Every address of both families: the kubelet probes the pod's primary IP, an IPv6
    # one on an IPv6-first cluster (a family the machine lacks is left out).
    return await asyncio.start_server(handle, None, port)


#: Young-generation threshold of the cyclic garbage collector (CPython's default is 700).
GC_THRESHOLD = (200_000, 20, 20)


#: Seconds between two full collections (see ``collect_garbage``).
FULL_COLLECTION_INTERVAL = 60.0


async def collect_garbage(stop: asyncio.Event, interval: float = FULL_COLLECTION_INTERVAL) -> None:
    """A full collection every ``interval``: with the raised thresholds, cycles that
    reach the oldest generation wait for 20 x 20 young collections, and a service's RSS
    crept up between them. What start-up made is frozen, so a full pass is cheap."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval)
        gc.collect()


def tune_garbage_collector() -> None:
    """Collect cycles less often, and never rescan what start-up created.

    A batch of decoded events holds ~100 link records per page alive at once; with the
    default thresholds the collector rescanned them over and over: decoding batches of
    500 CrawlCompleted took 343 us per event, 124 us with these thresholds and 119 us
    with collection off. Services make few reference cycles (reference counting frees
    everything else at once), so rarer young collections cost little memory.
    ``gc.freeze`` moves the imported modules out of every later collection.
    """
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


#: Longest wait between two tries to start while a server is away.
START_BACKOFF_CAP = 30.0


def _misconfigured(exc: BaseException) -> bool:
    """The deployment's mistake, said at once rather than waited out as a server not
    there yet: the TLS files or the priors file missing, unreadable or malformed (each
    an OSError underneath), a server's certificate that does not verify, a NATS server
    that turns the service's user away (``trove_schema.bus.turned_away``): the process
    exits, and its restart reads the deployment's secrets anew."""
    from trove_schema.bus import turned_away

    return isinstance(exc, InvalidTLS | InvalidPriors) or turned_away(exc)


#: JetStream refusals a cluster still coming together gives (no peers to place a
#: replicated stream on yet: 10005, 10023), and one a pod's start meets while another
#: creates the same stream or bucket (in use with another configuration: 10058): the
#: next try settles them.
_JETSTREAM_SETTLING = frozenset({10005, 10023, 10058})


def causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it was raised from or during, outermost first, each once."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def infrastructure_away(exc: BaseException) -> bool:
    """Whether ``exc`` says a server is not there (yet), rather than that Trove is wrong.

    A JetStream cluster electing leaders, nats-server restarting, Postgres starting up,
    in recovery, read-only or out of disk while a migration waits to run: each fails a
    service's start-up for a while, and a process that exits on it only turns the
    outage into a crash loop.
    """
    # Imported here: only a failing start needs them (the fetcher never loads SQLAlchemy).
    import nats.errors
    from sqlalchemy.exc import InterfaceError, OperationalError

    from trove_schema.bus import broker_trouble

    chain = causes(exc)
    # A mistake anywhere in the chain is the deployment's, even behind an error that
    # alone would be waited for (a first connection given up as turned away).
    if any(_misconfigured(error) for error in chain):
        return False
    for current in chain:
        # A TopologyError is away only through its cause: JetStream unavailable or a
        # timeout, not a refusal that every try meets (subjects overlapping another
        # stream's, an account that requires max_bytes).
        if isinstance(
            current,
            BrokerClosed
            | StackError
            | OSError
            | TimeoutError
            | nats.errors.NoServersError
            | nats.errors.ConnectionClosedError
            | nats.errors.TimeoutError
            | OperationalError
            | InterfaceError,
        ) or broker_trouble(current):
            return True
        if getattr(current, "err_code", None) in _JETSTREAM_SETTLING:
            return True
        state = getattr(current, "sqlstate", None)  # asyncpg's, raw or under SQLAlchemy's
        if isinstance(state, str) and (
            sqlstates.away(state) or sqlstates.unwritable(state) or state in sqlstates.CONFLICT
        ):
            return True
    return False


async def _attempt(main: ServiceMain, stop: asyncio.Event, ready: asyncio.Event) -> None:
    """Run ``main``. A stop before it is ready cancels it: what it waits on then (a
    first connection that nats-py retries for ever at a wrong address, a server's slow
    answer) would hold a SIGTERM until the orchestrator's SIGKILL. Work in a thread (a
    migration) is not cancelled: the process exits once it returns. Once ready,
    ``main`` ends on ``stop`` itself, finishing what it holds."""
    task = asyncio.ensure_future(main(stop, ready))
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and not ready.is_set():
            task.cancel()
            await asyncio.wait({task})
            if task.cancelled():
                return
        await task
    finally:
        stopped.cancel()
        if not task.done():  # this coroutine itself cancelled
            task.cancel()


async def together(stop: asyncio.Event, *parts: Awaitable[object]) -> None:
    """Run a service's parts (its consumers, its loops) until each ends. One that fails
    sets ``stop``, so that the others finish what they hold, as on SIGTERM, before its
    error ends the service: ``asyncio.gather`` would end at once and leave them running
    under the connections the service then closes (a fetched page never published, its
    host's lease never released)."""

    async def stopping_on_failure(part: Awaitable[object]) -> None:
        try:
            await part
        except BaseException:
            stop.set()
            raise

    results = await asyncio.gather(
        *(stopping_on_failure(part) for part in parts), return_exceptions=True
    )
    failures = [result for result in results if isinstance(result, BaseException)]
    for later in failures[1:]:  # raised while the others finished: said, not lost
        logging.getLogger(__name__).error("also failed: %r", later, exc_info=later)
    if failures:
        raise failures[0]


async def _start_patiently(
    main: ServiceMain, stop: asyncio.Event, ready: asyncio.Event, log: logging.Logger
) -> None:
    """Run ``main``; while it fails before it is ready because a server is away, try again.

    Once ready, a failure ends the process (the orchestrator restarts it); before, the
    servers it needs are waited for with a growing pause, and a stop ends the wait.
    """
    pause = 1.0
    while True:
        try:
            await _attempt(main, stop, ready)
            return
        except Exception as exc:
            if ready.is_set() or stop.is_set() or not infrastructure_away(exc):
                raise
            log.warning("cannot start yet, trying again in %.0f s: %s", pause, exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=pause)
        if stop.is_set():
            return
        pause = min(pause * 2, START_BACKOFF_CAP)


def run(service: str, settings: CommonSettings, main: ServiceMain) -> int:
    """Run a service until SIGTERM/SIGINT; returns the process exit status."""
    check_environment()
    setup_logging(settings, service)
    tune_garbage_collector()
    log = logging.getLogger(service)

    async def runner() -> None:
        stop = asyncio.Event()
        ready = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        server = await _health_server(settings.http_port, ready) if settings.http_port else None
        log.info("starting", extra={"service": service})
        collector = asyncio.create_task(collect_garbage(stop))
        try:
            await _start_patiently(main, stop, ready, log)
        finally:
            collector.cancel()
            if server is not None:
                server.close()
                with contextlib.suppress(Exception):
                    await server.wait_closed()
        log.info("stopped", extra={"service": service})

    try:
        asyncio.run(runner())
    except Exception:
        log.exception("%s crashed", service)
        return 1
    return 0
