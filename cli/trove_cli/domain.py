"""``trove domain HOST``: every request Trove made to a host, why it went as it went.

Read from the audit (``fetcher_attempts`` and ``attempt_heuristics``, kept for
``TROVE_AUDIT_RETENTION_SECONDS``), the host's learned policy (``host_policies``, see
``trove_schema.policy``: the strategy estimates per URL class and which one is chosen,
the pause and its reason, the risk level, the gap, whether validators are sent) and,
when the broker is reachable, the host's politeness record (KV ``trove_domains``, the
fetcher's ``DomainSlot``): the gap kept between requests, a back-off after a 429/503,
when the next request may go; and discovery's budgets this cycle (KV ``trove_seen``,
``trove_schema.budgets``): the host's pages counted, and whether its site's host budget
counts it, which says why a host gets no page. Nothing is written.
"""

from __future__ import annotations

import contextlib
import ipaddress
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from rich.console import Console
from rich.table import Table
from rich.text import Text
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from trove_cli.broker import connect
from trove_cli.database import engine as database_engine
from trove_cli.outside import outside
from trove_cli.status import slot_times
from trove_schema.budgets import (
    PLATFORMS,
    HostCount,
    SiteCount,
    host_budget_key,
    site_budget_key,
    site_of,
)
from trove_schema.errors import InvalidPriors, InvalidURL
from trove_schema.policy import (
    PACE_EASE,
    STRATEGIES,
    HostPolicy,
    LearningConfig,
    estimate,
    host_gap,
    moved,
    send_validators,
    success_rate,
)
from trove_schema.server_time import server_now
from trove_schema.settings import CommonSettings, DiscoverySettings
from trove_schema.topology import DOMAINS_BUCKET, SEEN_BUCKET, domain_key
from trove_schema.urls import canonicalize, domain_of

DEFAULT_LAST = 10


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
    #: The learned policy (``host_policies``); None when no attempt was folded yet.
    policy: HostPolicy | None = None
    #: Discovery's count of the host's pages this cycle; None when not read.
    pages_counted: HostCount | None = None
    #: The host's site (registrable domain), and the hosts its budget counts this cycle
    #: (None when not read, or not counted: a platform, an address).
    site: str = ""
    site_hosts: list[str] | None = None


# The host's counts by error type (None: no error), summed for its totals: one read of
# its audit, from the index that holds each attempt's verdict beside its host and time
# (a busy host's tens of millions of rows are not fetched from the table).
_COUNTS = text(
    "SELECT error_type, count(*), count(*) FILTER (WHERE success), "
    "count(*) FILTER (WHERE is_banned), min(attempted_at), max(attempted_at) "
    "FROM fetcher_attempts WHERE host = :host GROUP BY error_type "
    "ORDER BY count(*) DESC, error_type"
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


_POLICY = text("SELECT policy FROM host_policies WHERE host = :host")


def host_named(raw: str) -> str:
    """The host as the audit keys it (lower case, IDNA, no port) from a name or a URL:
    ``https://Bücher.example:8443/a`` is ``xn--bcher-kva.example``. Raises InvalidURL."""
    text = raw.strip()
    with contextlib.suppress(ValueError):
        text = f"[{ipaddress.IPv6Address(text.strip('[]'))}]"  # as the audit keys it, bare
    url = text if "://" in text else f"http://{text.rstrip('.')}/"
    try:
        return domain_of(canonicalize(url))
    except InvalidURL as exc:
        raise InvalidURL(f"{raw!r} is not a host name: {exc.reason}") from None


async def collect_domain(
    engine: AsyncEngine, host: str, *, last: int = DEFAULT_LAST, js: JetStreamContext | None = None
) -> DomainAudit:
    """The host's audit, and its politeness record when ``js`` is given."""
    host = host_named(host)
    found = DomainAudit(host=host)
    async with engine.connect() as conn:
        counts = (await conn.execute(_COUNTS, {"host": host})).all()
        rows = (await conn.execute(_RECENT, {"host": host, "last": last})).all()
        learned = (await conn.execute(_POLICY, {"host": host})).scalar_one_or_none()
    for _, total, ok, banned, first, newest in counts:
        found.attempts += int(total)
        found.successes += int(ok)
        found.banned += int(banned)
        found.first = first if found.first is None else min(found.first, first)
        found.last = newest if found.last is None else max(found.last, newest)
    found.by_error_type = {kind: int(n) for kind, n, *_ in counts if kind is not None}
    if learned is not None:
        found.policy = HostPolicy.from_json(learned)
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
        await _read_budgets(js, found)
    return found


async def _read_kv(js: JetStreamContext, bucket: str, key: str) -> bytes | None:
    """A key's value as the bucket holds it now; None when it has none."""
    try:
        message = await js.get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{key}")
    except NotFoundError:
        return None
    headers = message.headers or {}
    if headers.get("KV-Operation") in {"DEL", "PURGE"} or "Nats-Marker-Reason" in headers:
        return None
    return message.data or b""


async def read_slot(js: JetStreamContext, host: str) -> tuple[dict[str, float] | None, str | None]:
    """The host's DomainSlot, or None and why not."""
    value = await _read_kv(js, DOMAINS_BUCKET, domain_key(host))
    if value is None:
        return None, "no politeness record for this host"
    slot = slot_times(value)
    return (slot, None) if slot is not None else (None, "the politeness record is unreadable")


async def _read_budgets(js: JetStreamContext, found: DomainAudit) -> None:
    """The budgets as discovery would count them now: a record older than its cycle
    (discovery's longest re-crawl interval, from this environment's settings) counts
    from nothing, though its key lives on."""
    now, cycle = time.time(), DiscoverySettings().recrawl_max
    with contextlib.suppress(ValueError, TypeError, AttributeError):  # unreadable: not shown
        found.pages_counted = HostCount.from_bytes(
            await _read_kv(js, SEEN_BUCKET, host_budget_key(found.host))
        ).in_cycle(now, cycle)
    site = site_of(found.host, frozenset())
    if site is None:
        return  # an address: its own site, never counted
    found.site = site
    if site in PLATFORMS:
        return
    value = await _read_kv(js, SEEN_BUCKET, site_budget_key(site))
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        counted = SiteCount.from_bytes(value).in_cycle(now, cycle)
        found.site_hosts = list(counted.hosts) if value is not None else []


def render_domain(
    found: DomainAudit,
    console: Console,
    *,
    now: float | None = None,
    learning: LearningConfig | None = None,
) -> None:
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
                outside(attempt.url),
                outside(" ".join(attempt.tags)),
            )
        console.print(table)
    render_policy(found, console, now, learning or LearningConfig())
    render_budgets(found, console)
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


def render_budgets(found: DomainAudit, console: Console) -> None:
    """Discovery's budgets this cycle: why a host that gets no page gets none."""
    if found.pages_counted is None:
        return
    since = found.pages_counted.since
    began = (
        f", since {_when(since, '%Y-%m-%d %H:%M')}" if since and found.pages_counted.pages else ""
    )
    console.print(
        Text(
            f"discovery this cycle: {found.pages_counted.pages} page(s) of this host counted "
            f"against its page budget (TROVE_HOST_PAGE_BUDGET){began}"
        )
    )
    if not found.site:
        return
    if found.site_hosts is None:
        console.print(Text(f"site {found.site}: a platform, each of its hosts its own site"))
        return
    counted = len(found.site_hosts)
    if not counted:
        # Discovery's own platforms (TROVE_PLATFORM_DOMAINS) are not known here.
        console.print(Text(f"site {found.site}: none of its hosts counted this cycle"))
        return
    among = (
        "this host is among them"
        if found.host in found.site_hosts
        else "this host is not: once the budget is spent, links to it are refused this cycle"
    )
    console.print(
        Text(
            f"site {found.site}: {counted} host(s) counted this cycle against its host "
            f"budget (TROVE_SITE_HOST_BUDGET); {among}"
        )
    )


async def domain_command(
    nats_url: str, database_url: str, host: str, last: int, console: Console
) -> int:
    """``trove domain HOST``: print the host's audit and its politeness record."""
    engine = database_engine(database_url)
    nc = None
    now = None  # the fetchers' instants are on nats-server's clock: read "now" there
    try:
        js = None
        if nats_url:
            with contextlib.suppress(Exception):  # the audit is worth showing without it
                nc = await connect(nats_url)
                js = nc.jetstream()
                now = await server_now(nc)
        found = await collect_domain(engine, host, last=last, js=js)
        if js is None:
            found.politeness_note = "broker not reachable"
    finally:
        if nc is not None:
            await nc.close()
        await engine.dispose()
    try:
        learning = LearningConfig.from_settings(CommonSettings())
    except InvalidPriors as exc:
        console.print(Text(f"TROVE_PRIORS_FILE: {exc}; the shipped priors are shown instead"))
        learning = LearningConfig()
    render_domain(found, console, now=now, learning=learning)
    return 0


def render_policy(found: DomainAudit, console: Console, now: float, config: LearningConfig) -> None:
    """The learned policy, each decision with what it rests on."""
    policy = found.policy
    if policy is None:
        console.print(Text("policy: nothing learned yet (priors only)"))
        return
    console.print(
        Text(
            f"policy: learned from {policy.attempts} attempt(s), the last at "
            f"{_when(policy.last_attempt_at)}"
        )
    )
    if policy.paused_until > now:
        console.print(
            Text(
                f"  paused until {_when(policy.paused_until)} ({policy.paused_until - now:.0f} s "
                f"more): {policy.pause_reason or 'no reason recorded'}"
            )
        )
    else:
        last = f" (last pause: {policy.pause_reason})" if policy.pause_reason else ""
        console.print(Text(f"  not paused{last}"))
    console.print(
        Text(
            f"  risk level {policy.risk_level} (failures in a row: refused, timed out, 5xx), "
            f"rate level {policy.rate_level} (429/503 in a row)"
            + (f"; banned Trove at {_when(policy.banned_at)}" if policy.banned_at else "")
        )
    )
    if policy.moved_to:
        recheck = policy.moved_at + config.move_recheck
        asked = (
            f"its pages are asked for there until {_when(recheck)}"
            if moved(policy, now, config)
            else "its next request finds out whether it still redirects"
        )
        console.print(Text(f"  moved to {policy.moved_to} (its redirects keep the path): {asked}"))
    # Read as the fetchers read it: a record's gap within the longest configured.
    base = min((found.politeness or {}).get("gap") or config.min_gap, config.max_gap)
    gap = host_gap(policy, base, config)
    paced = not policy.refused_after and gap == min(policy.pace, config.rate_max) > base
    if paced:
        console.print(Text(f"  gap {gap:g} s: the pace its 429s taught (below)"))
    elif policy.response_ms is None:
        console.print(Text(f"  gap {gap:g} s (no response timed yet)"))
    else:
        console.print(
            Text(
                f"  gap {gap:g} s: at least {config.response_factor:g} x the median answer "
                f"time of {len(policy.recent_ms) or 1} answer(s), {policy.response_ms:.0f} ms,"
                f" never below {base:g} s"
            )
        )
    if policy.refused_after:
        console.print(
            Text(
                f"  refusing with 429s: {policy.refused_after:g} s after its last answer "
                "at least (the wait it asked included); the pauses decide until it answers"
            )
        )
    elif policy.pace:
        pace = min(policy.pace, config.rate_max)
        console.print(
            Text(
                f"  pace {pace:g} s between requests' starts: learned from its 429s, a floor "
                f"of the gap that eases by {1 - PACE_EASE:.1%} with each answer"
            )
        )
    sent = "sent" if send_validators(policy) else "not sent (the host ignores them)"
    console.print(
        Text(
            f"  validators {sent}: {policy.validators_honoured} answered 304, "
            f"{policy.validators_ignored} answered 200 with the same content"
        )
    )
    classes = sorted({key.split(":", 1)[0] for key in policy.estimates})
    if not classes:
        console.print(Text("  strategies: no usable evidence yet, chosen by the priors"))
        return
    table = Table(title=Text("strategy estimates (discounted outcomes)"), title_justify="left")
    for column in ("URL class", "strategy", "usable", "wrong kind", "success rate", "choice"):
        table.add_column(column)
    for url_class in classes:
        names = list(STRATEGIES) + sorted(
            key.split(":", 1)[1]
            for key in policy.estimates
            if key.startswith(url_class + ":") and key.split(":", 1)[1] not in STRATEGIES
        )
        rates = {name: success_rate(estimate(policy, url_class, name, config)) for name in names}
        best = max(names, key=lambda name: rates[name])
        for name in names:
            successes, failures = estimate(policy, url_class, name, config)
            learned = f"{url_class}:{name}" in policy.estimates
            table.add_row(
                Text(url_class),
                Text(name),
                Text(f"{successes:.2f}"),
                Text(f"{failures:.2f}"),
                Text(f"{rates[name]:.2f}"),
                Text(("chosen" if name == best else "") + ("" if learned else " (prior)")),
            )
    console.print(table)


def _when(at: float, spec: str = "%Y-%m-%d %H:%M:%S") -> str:
    """``at`` as a UTC time; one past any calendar (a damaged record's) as its number,
    where it raised and the operator got a traceback instead of the host."""
    try:
        return f"{datetime.fromtimestamp(at, UTC):{spec}} UTC"
    except (OverflowError, OSError, ValueError):
        return f"{at:g} (not a time)"
