"""``trove domain HOST``: every request Trove made to a host, why it went as it went.

Read from the audit (``fetcher_attempts`` and ``attempt_heuristics``, kept for
``TROVE_AUDIT_RETENTION_SECONDS``) and, when the broker is reachable, the host's
politeness record (KV ``trove_domains``, the fetcher's ``DomainSlot``): the gap kept
between requests, a back-off after a 429/503, when the next request may go. Nothing is
written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from datetime import datetime

import nats
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from rich.console import Console
from rich.table import Table
from rich.text import Text
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from trove_cli.status import SLOT_FIELDS
from trove_schema.bus import nats_servers
from trove_schema.nats_tls import client_tls
from trove_schema.topology import DOMAINS_BUCKET

DEFAULT_LAST = 10
#: The fetcher's KV key rule for a host (``politeness.DomainSlots.key``), read here
#: without importing the service.
_KEY_OK = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")


@dataclass(frozen=True, slots=True)
class Attempt:
    attempted_at: datetime
    url: str
    http_status: int | None
    success: bool
    is_banned: bool
    error_type: str | None
    duration_ms: int
    #: ``type=value`` of each tag, the most telling first.
    tags: tuple[str, ...]


@dataclass(slots=True)
class DomainAudit:
    host: str
    attempts: int = 0
    successes: int = 0
    banned: int = 0
    first: datetime | None = None
    last: datetime | None = None
    by_error_type: dict[str, int] = field(default_factory=dict)
    recent: list[Attempt] = field(default_factory=list)
    #: The host's DomainSlot fields (unix times but ``gap``); None when not read.
    politeness: dict[str, float] | None = None
    #: Why the politeness record is missing: no broker, no record.
    politeness_note: str | None = None


def slot_key(host: str) -> str:
    if _KEY_OK.match(host):
        return host
    return "h." + hashlib.sha1(host.encode(), usedforsecurity=False).hexdigest()


_COUNTS = text(
    "SELECT count(*), count(*) FILTER (WHERE success), count(*) FILTER (WHERE is_banned), "
    "min(attempted_at), max(attempted_at) FROM fetcher_attempts WHERE host = :host"
)
_BY_ERROR = text(
    "SELECT error_type, count(*) FROM fetcher_attempts WHERE host = :host "
    "AND error_type IS NOT NULL GROUP BY error_type ORDER BY count(*) DESC, error_type"
)
_RECENT = text(
    "SELECT a.attempted_at, a.url, a.http_status, a.success, a.is_banned, a.error_type, "
    "a.duration_ms, coalesce(array_agg(h.heuristic_type || '=' || h.heuristic_value "
    "ORDER BY h.importance_score DESC, h.heuristic_type) FILTER (WHERE h.id IS NOT NULL), "
    "'{}') FROM (SELECT * FROM fetcher_attempts WHERE host = :host "
    "ORDER BY attempted_at DESC, id DESC LIMIT :last) a "
    "LEFT JOIN attempt_heuristics h ON h.attempt_id = a.id "
    "GROUP BY a.id, a.attempted_at, a.url, a.http_status, a.success, a.is_banned, "
    "a.error_type, a.duration_ms ORDER BY a.attempted_at DESC, a.id DESC"
)


async def collect_domain(
    engine: AsyncEngine, host: str, *, last: int = DEFAULT_LAST, js: JetStreamContext | None = None
) -> DomainAudit:
    """The host's audit, and its politeness record when ``js`` is given."""
    host = host.strip().lower().rstrip(".")
    found = DomainAudit(host=host)
    async with engine.connect() as conn:
        total, ok, banned, first, newest = (await conn.execute(_COUNTS, {"host": host})).one()
        found.attempts, found.successes, found.banned = int(total), int(ok), int(banned)
        found.first, found.last = first, newest
        found.by_error_type = {
            kind: int(n) for kind, n in (await conn.execute(_BY_ERROR, {"host": host})).all()
        }
        rows = (await conn.execute(_RECENT, {"host": host, "last": last})).all()
    found.recent = [
        Attempt(
            attempted_at=at,
            url=url,
            http_status=status,
            success=success,
            is_banned=is_banned,
            error_type=error_type,
            duration_ms=duration,
            tags=tuple(tags),
        )
        for at, url, status, success, is_banned, error_type, duration, tags in rows
    ]
    if js is not None:
        found.politeness, found.politeness_note = await read_slot(js, host)
    return found


async def read_slot(js: JetStreamContext, host: str) -> tuple[dict[str, float] | None, str | None]:
    """The host's DomainSlot, or None and why not."""
    try:
        message = await js.get_last_msg(
            f"KV_{DOMAINS_BUCKET}", f"$KV.{DOMAINS_BUCKET}.{slot_key(host)}"
        )
    except NotFoundError:
        return None, "no politeness record for this host"
    headers = message.headers or {}
    if headers.get("KV-Operation") in {"DEL", "PURGE"} or "Nats-Marker-Reason" in headers:
        return None, "no politeness record for this host"
    try:
        raw = json.loads(message.data or b"")
        return {k: float(raw.get(k) or 0.0) for k in SLOT_FIELDS}, None
    except (ValueError, TypeError, AttributeError):
        return None, "the politeness record is unreadable"


def render_domain(found: DomainAudit, console: Console, *, now: float | None = None) -> None:
    now = time.time() if now is None else now
    if not found.attempts:
        console.print(Text(f"no attempt on {found.host} in the audit"))
    else:
        assert found.first is not None
        assert found.last is not None
        console.print(
            Text(
                f"{found.host}: {found.attempts} attempt(s) from {found.first:%Y-%m-%d %H:%M} "
                f"to {found.last:%Y-%m-%d %H:%M} UTC; {found.successes} with usable content, "
                f"{found.banned} refused (403, 429 or a challenge)"
            )
        )
        if found.by_error_type:
            errors = ", ".join(f"{kind} {n}" for kind, n in found.by_error_type.items())
            console.print(Text(f"errors: {errors}"))
        table = Table(title=Text(f"last {len(found.recent)} attempt(s)"), title_justify="left")
        for column in ("when (UTC)", "status", "result", "ms", "url", "tags"):
            table.add_column(column, overflow="fold")
        for attempt in found.recent:
            result = "ok" if attempt.success else (attempt.error_type or "failed")
            if attempt.is_banned:
                result += " (refused)"
            # Text(), not markup: URLs and header-derived tags come from the web.
            table.add_row(
                Text(f"{attempt.attempted_at:%Y-%m-%d %H:%M:%S}"),
                Text(str(attempt.http_status or "-")),
                Text(result),
                Text(str(attempt.duration_ms)),
                Text(attempt.url),
                Text(" ".join(attempt.tags)),
            )
        console.print(table)
    slot = found.politeness
    if slot is None:
        console.print(Text(f"politeness: {found.politeness_note or 'not read'}"))
        return
    backoff = slot["backoff_until"] - now
    free = slot["free_at"] - now
    console.print(
        Text(
            f"politeness: gap {slot['gap']:g} s; "
            + (f"backing off for {backoff:.0f} s more; " if backoff > 0 else "no back-off; ")
            + (f"next request in {free:.1f} s" if free > 0 else "free now")
        )
    )


async def domain_command(
    nats_url: str, database_url: str, host: str, last: int, console: Console
) -> int:
    """``trove domain HOST``: print the host's audit and its politeness record."""
    engine = create_async_engine(database_url)
    nc = None
    try:
        js = None
        if nats_url:
            with contextlib.suppress(Exception):  # the audit is worth showing without it
                nc = await nats.connect(
                    nats_servers(nats_url), name="trove-cli", tls=client_tls(), connect_timeout=2,
                    max_reconnect_attempts=0, allow_reconnect=False,
                )  # fmt: skip
                js = nc.jetstream()
        found = await collect_domain(engine, host, last=last, js=js)
        if js is None:
            found.politeness_note = "broker not reachable"
    finally:
        if nc is not None:
            await nc.close()
        await engine.dispose()
    render_domain(found, console)
    return 0
