"""``trove domain HOST``: a host's audit and politeness record, on real Postgres and NATS."""

from __future__ import annotations

import io
import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from tests.conftest import StackUrls
from tests.recorder.test_lookups import indexes, plan_of
from tests.support import run_trove
from trove_cli.domain import _COUNTS, DomainAudit, collect_domain, host_named, render_domain
from trove_discovery.discovery import Discovery
from trove_recorder.projections import apply_batch
from trove_recorder.retries import RetryPolicy
from trove_schema.budgets import HostCount
from trove_schema.bus import Bus
from trove_schema.errors import InvalidURL
from trove_schema.events import CrawlCompleted, CrawlOutcome, Scope
from trove_schema.policy import HostPolicy, LearningConfig
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import DOMAINS_BUCKET, SEEN_BUCKET, domain_key

pytestmark = pytest.mark.usefixtures("clean")

HOST = "blog.example"
START = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def attempt(n: int, outcome: CrawlOutcome, **fields: Any) -> CrawlCompleted:
    at = START + timedelta(minutes=n)
    return CrawlCompleted(
        url=f"https://{fields.pop('host', HOST)}/{fields.pop('path', n)}",
        domain=fields.pop("domain", HOST),
        scope=Scope(value=HOST),
        request_id=f"00000000-0000-0000-0000-{n:012d}",
        outcome=outcome,
        started_at=at,
        completed_at=at + timedelta(milliseconds=40),
        duration_ms=fields.pop("duration_ms", 40),
        **fields,
    )


async def crawl_history(engine: AsyncEngine) -> None:
    events = [
        attempt(1, CrawlOutcome.SUCCESS, status_code=200, title="One"),
        attempt(2, CrawlOutcome.SUCCESS, status_code=200, title="Two"),
        attempt(3, CrawlOutcome.BLOCKED_4XX, status_code=429, retry_after=60.0),
        attempt(
            4,
            CrawlOutcome.BLOCKED_4XX,
            status_code=403,
            response_headers={"server": "cloudflare", "cf-mitigated": "challenge"},
        ),
        attempt(5, CrawlOutcome.TIMEOUT, error_message="ReadTimeout"),
        attempt(
            6, CrawlOutcome.SUCCESS, status_code=200, host="other.example", domain="other.example"
        ),
    ]
    async with async_sessionmaker(engine).begin() as session:
        await apply_batch(session, events, RetryPolicy(max_attempts=3, delay_seconds=60.0))


def slot(**values: float) -> bytes:
    return json.dumps(
        {
            "free_at": 0.0,
            "busy_until": 0.0,
            "next": 0.0,
            "gap": 10.0,
            "backoff_until": 0.0,
            **values,
        }
    ).encode()


async def test_the_audit_counts_attempts_by_result_and_lists_the_last_with_tags(
    engine: AsyncEngine, bus: Bus
) -> None:
    await crawl_history(engine)
    now = time.time()
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    await kv.put(domain_key(HOST), slot(gap=12.5, backoff_until=now + 300, free_at=now + 300))

    found = await collect_domain(engine, HOST.upper(), last=3, js=bus.js)

    assert (found.host, found.attempts, found.successes, found.banned) == (HOST, 5, 2, 2)
    assert found.by_error_type == {"blocked_captcha": 1, "rate_limited": 1, "timeout": 1}
    assert [a.url for a in found.recent] == [f"https://{HOST}/{n}" for n in (5, 4, 3)]
    challenge = found.recent[1]
    assert (challenge.error_type, challenge.is_banned, challenge.http_status) == (
        "blocked_captcha",
        True,
        403,
    )
    assert challenge.tags[0] == "challenge=true"  # the most telling tag first
    assert "server=cloudflare" in challenge.tags
    assert found.politeness is not None
    assert found.politeness["gap"] == 12.5

    out = io.StringIO()
    render_domain(found, Console(file=out, width=200), now=now)
    printed = out.getvalue()
    assert "5 attempt(s)" in printed
    assert "2 with usable content" in printed
    assert "errors: blocked_captcha 1, rate_limited 1, timeout 1" in printed
    assert "blocked_captcha (refused)" in printed
    assert "gap 12.5 s; backing off for 300 s more" in printed


async def test_a_busy_hosts_audit_is_counted_from_its_index_alone(engine: AsyncEngine) -> None:
    # A busy host has tens of millions of attempts in the audit: its counts by result and
    # by error type each fetched every one of them from the table. Here 20,000 of an
    # audit of ten hosts.
    async with engine.begin() as conn:
        # Flushed at its commit (the test server's commits are not): VACUUM marks a page
        # visible to all only once the commit of its rows is on disk.
        await conn.execute(text("SET LOCAL synchronous_commit = on"))
        await conn.execute(
            text(
                "INSERT INTO fetcher_attempts (event_id, url, host, fetcher, success, "
                "is_banned, error_type, duration_ms, attempted_at) SELECT gen_random_uuid(), "
                "'https://' || h || '/' || n, h, 'http', n % 4 <> 0, n % 8 = 0, "
                "CASE WHEN n % 8 = 0 THEN 'rate_limited' WHEN n % 4 = 0 THEN 'timeout' END, "
                "40, CAST(:start AS timestamptz) + n * interval '1 second' "
                "FROM generate_series(1, 20000) AS n, LATERAL (SELECT CASE WHEN k = 0 "
                "THEN CAST(:host AS text) ELSE 'other' || k || '.example' END AS h "
                "FROM generate_series(0, 9) AS k) AS hosts"
            ),
            {"start": START, "host": HOST},
        )
    async with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
        await conn.execute(text("VACUUM ANALYZE fetcher_attempts"))

    found = await collect_domain(engine, HOST, last=2)

    assert (found.attempts, found.successes, found.banned) == (20_000, 15_000, 2_500)
    assert found.by_error_type == {"rate_limited": 2_500, "timeout": 2_500}
    assert (found.first, found.last) == (
        START + timedelta(seconds=1),
        START + timedelta(seconds=20_000),
    )
    plan = await plan_of(engine, _COUNTS.text, host=HOST)
    assert indexes(plan, "fetcher_attempts") == {"ix_fetcher_attempts_host_attempted_at_verdict"}
    (scan,) = [node for node in plan if node.get("Relation Name") == "fetcher_attempts"]
    assert (scan["Node Type"], scan["Heap Fetches"]) == ("Index Only Scan", 0)


@pytest.mark.parametrize(
    "named", [f"https://{HOST.upper()}:8443/a/b?c", f"{HOST}.", f" http://{HOST}/ "]
)
async def test_the_audit_is_found_by_a_url_of_the_host_too(engine: AsyncEngine, named: str) -> None:
    # The audit keys hosts as requests name them (lower case, IDNA, no port): an
    # operator pastes a URL from a log, or the name in its own script.
    await crawl_history(engine)

    found = await collect_domain(engine, named)

    assert (found.host, found.attempts) == (HOST, 5)


def test_a_host_is_named_as_the_audit_keys_it() -> None:
    assert host_named("https://Bücher.example:8443/a") == "xn--bcher-kva.example"
    assert host_named("[2001:db8::1]") == "2001:db8::1"
    assert host_named("2001:db8::1") == "2001:db8::1"  # as the audit lists it
    with pytest.raises(InvalidURL, match="is not a host name"):
        host_named("ftp://x.example/")


async def test_the_domain_shows_the_learned_policy_and_why(engine: AsyncEngine) -> None:
    await crawl_history(engine)
    found = await collect_domain(engine, HOST)
    assert found.policy is not None
    assert found.policy.attempts == 5
    assert found.policy.pause_reason == "blocked_captcha"  # the timeout after it is shorter
    challenged = (START + timedelta(minutes=4, milliseconds=40)).timestamp()
    assert found.policy.paused_until == challenged + LearningConfig().ban_pause

    out = io.StringIO()
    render_domain(found, Console(file=out, width=200), now=challenged + 60)
    printed = out.getvalue()
    assert "policy: learned from 5 attempt(s)" in printed
    assert "paused until 2026-11-24 12:04:00 UTC (86340 s more): blocked_captcha" in printed
    assert "risk level 1" in printed  # the timeout
    assert "rate level 1" in printed  # the 429
    assert "banned Trove at 2026-11-23 12:04:00 UTC" in printed
    assert "gap 10 s: at least 10 x the median answer time of 4 answer(s), 40 ms" in printed
    # A minute after its last answer, told to wait another; no answer has ended the run.
    assert "refusing with 429s: 120 s after its last answer at least" in printed
    assert "validators sent: 0 answered 304" in printed
    estimates = next(line for line in printed.splitlines() if "│ page" in line and "http" in line)
    assert "chosen" in estimates
    assert "5.32" in estimates  # the prior's 4.8 and two successes, discounted

    # After the pause, with slow answers: not paused, a longer gap.
    slow = [
        attempt(n, CrawlOutcome.SUCCESS, status_code=200, title="Slow", duration_ms=2500)
        for n in range(1600, 1610)
    ]
    async with async_sessionmaker(engine).begin() as session:
        await apply_batch(session, slow, RetryPolicy(max_attempts=3, delay_seconds=60.0))
    found = await collect_domain(engine, HOST)
    out = io.StringIO()
    render_domain(found, Console(file=out, width=200), now=challenged + 86_400 * 2)
    printed = out.getvalue()
    assert "not paused (last pause: blocked_captcha)" in printed
    assert "risk level 0" in printed
    assert "gap 25 s" in printed  # 10 x 2.5 s: the last five answers


def test_the_domain_shows_a_pace_its_429s_taught_as_what_decides_its_gap() -> None:
    config = LearningConfig()
    paced = DomainAudit(
        host=HOST, policy=HostPolicy(pace=400.0, response_ms=40.0, recent_ms=(40.0,))
    )
    out = io.StringIO()
    render_domain(paced, Console(file=out, width=200), now=START.timestamp())
    printed = out.getvalue()
    assert "gap 400 s: the pace its 429s taught" in printed
    assert "pace 400 s between requests' starts: learned from its 429s" in printed
    # One past the longest back-off (a hand-made record) is read within it.
    far = DomainAudit(host=HOST, policy=HostPolicy(pace=1e9))
    out = io.StringIO()
    render_domain(far, Console(file=out, width=200), now=START.timestamp())
    assert f"gap {config.rate_max:g} s: the pace" in out.getvalue()


async def test_the_domain_shows_where_a_host_moved_and_until_when(engine: AsyncEngine) -> None:
    old = "www.moved.example"
    # The home page and another part of the site: the host moved.
    redirects = [
        attempt(
            n,
            CrawlOutcome.REJECTED,
            status_code=301,
            host=old,
            domain=old,
            path=path,
            error_message="redirected to another host",
            links=[{"url": f"https://moved.example/{path}", "kind": "redirect"}],
        )
        for n, path in ((1, ""), (2, "2"))
    ]
    async with async_sessionmaker(engine).begin() as session:
        await apply_batch(session, redirects, RetryPolicy(max_attempts=3, delay_seconds=60.0))
    found = await collect_domain(engine, old)
    learned = (START + timedelta(minutes=2, milliseconds=40)).timestamp()
    out = io.StringIO()
    render_domain(found, Console(file=out, width=200), now=learned + 60)
    assert (
        "moved to https://moved.example (its redirects keep the path): its pages are asked for"
        " there until 2026-11-30 12:02:00 UTC"
    ) in out.getvalue()
    out = io.StringIO()
    render_domain(found, Console(file=out, width=200), now=learned + 8 * 86_400)
    assert "its next request finds out whether it still redirects" in out.getvalue()


async def test_a_host_without_a_policy_says_it_rests_on_the_priors(engine: AsyncEngine) -> None:
    out = io.StringIO()
    render_domain(await collect_domain(engine, "never.example"), Console(file=out, width=200))
    assert "policy: nothing learned yet (priors only)" in out.getvalue()


async def test_a_host_without_attempts_or_record_says_so(engine: AsyncEngine, bus: Bus) -> None:
    found = await collect_domain(engine, "never.example", js=bus.js)
    assert (found.attempts, found.recent, found.politeness) == (0, [], None)
    out = io.StringIO()
    render_domain(found, Console(file=out, width=200))
    assert "no attempt on never.example in the audit" in out.getvalue()
    assert "no politeness record for this host" in out.getvalue()


async def test_a_host_record_of_an_integer_past_a_floats_range_is_said_unreadable(
    engine: AsyncEngine, bus: Bus
) -> None:
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    await kv.put(domain_key("odd.example"), b'{"free_at": 1' + b"0" * 400 + b"}")

    found = await collect_domain(engine, "odd.example", js=bus.js)

    assert found.politeness is None
    assert found.politeness_note == "the politeness record is unreadable"


async def test_the_domain_says_whether_its_site_budget_counts_it(
    engine: AsyncEngine, bus: Bus
) -> None:
    # Written by discovery's own budget, as a crawl of a farm of subdomains writes it.
    settings = DiscoverySettings(host_page_budget=50, site_host_budget=2)
    discovery = Discovery(bus=bus, seen=await bus.js.key_value(SEEN_BUCKET), settings=settings)
    for k, host in enumerate(["a.farm.example", "b.farm.example", "c.farm.example"]):
        await discovery._within_budget(host, [f"page-{k}-{n}" for n in range(3)])

    async def shown(host: str) -> str:
        out = io.StringIO()
        render_domain(await collect_domain(engine, host, js=bus.js), Console(file=out, width=300))
        return out.getvalue()

    found = await collect_domain(engine, "b.farm.example", js=bus.js)
    assert (found.site, found.site_hosts) == ("farm.example", ["a.farm.example", "b.farm.example"])
    text = await shown("b.farm.example")
    assert "discovery this cycle: 3 page(s) of this host counted" in text
    assert "site farm.example: 2 host(s) counted this cycle" in text
    assert "this host is among them" in text

    text = await shown("c.farm.example")
    assert "discovery this cycle: 0 page(s) of this host counted" in text
    assert "this host is not: once the budget is spent, links to it are refused" in text

    assert "site other.example: none of its hosts counted this cycle" in await shown(
        "a.other.example"
    )
    platform = await shown("alice.wordpress.com")
    assert "site wordpress.com: a platform, each of its hosts its own site" in platform
    assert "site " not in await shown("127.0.0.9")


async def test_the_domain_shows_a_budget_whose_cycle_is_over_as_counting_from_nothing(
    engine: AsyncEngine, bus: Bus
) -> None:
    # Counted 31 days ago: the keys live on (they expire after two cycles), the counts
    # do not, as discovery reads them.
    month_ago = time.time() - 31 * 86_400
    settings = DiscoverySettings(host_page_budget=3, site_host_budget=1)
    discovery = Discovery(
        bus=bus,
        seen=await bus.js.key_value(SEEN_BUCKET),
        settings=settings,
        clock=lambda: month_ago,
    )
    await discovery._within_budget("a.farm.example", ["page-0", "page-1", "page-2"])
    found = await collect_domain(engine, "a.farm.example", js=bus.js)
    assert found.pages_counted is not None
    assert found.pages_counted.pages == 0
    assert found.site_hosts == []


def test_a_budget_count_dated_past_any_calendar_is_shown_as_its_number() -> None:
    # A damaged host count in trove_seen: the audit is shown, not a traceback.
    found = DomainAudit(host="odd.example", pages_counted=HostCount(pages=3, since=1e18))
    out = io.StringIO()
    render_domain(found, Console(file=out, width=200))
    assert "since 1e+18 (not a time)" in out.getvalue()


async def test_trove_domain_command_prints_the_audit(
    stack: StackUrls, engine: AsyncEngine, bus: Bus, tmp_path: Path
) -> None:
    await crawl_history(engine)
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    await kv.put(domain_key(HOST), slot(gap=10.0))
    env = {
        **os.environ,
        "TROVE_DATABASE_URL": stack.database_url,
        "TROVE_NATS_URL": stack.nats_url,
        "TROVE_STATE_DIR": str(tmp_path / "state"),
        "COLUMNS": "200",
    }
    code, printed = await run_trove("domain", HOST, "--last", "2", env=env)
    assert code == 0, printed
    assert f"{HOST}: 5 attempt(s)" in printed
    assert f"https://{HOST}/5" in printed
    assert f"https://{HOST}/3" not in printed
    assert "politeness: gap 10 s; no back-off; free now" in printed
    assert "policy: learned from 5 attempt(s)" in printed
