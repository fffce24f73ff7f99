"""host_policies: each host's policy folded from its attempts, on real Postgres and NATS."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

from tests.conftest import StackUrls
from tests.recorder.test_projections import POLICY, rows
from tests.recorder.test_replay import empty_database
from trove_recorder.projections import apply_batch
from trove_recorder.replay import replay
from trove_schema.bus import Bus
from trove_schema.events import CrawlCompleted, CrawlOutcome, Event, Scope
from trove_schema.policy import HostPolicy, LearningConfig, Observation, observe

pytestmark = pytest.mark.usefixtures("clean")

START = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
LEARNING = LearningConfig(pause_base=30.0, ban_pause=3600.0)


def attempt(host: str, n: int, outcome: CrawlOutcome, **fields: Any) -> CrawlCompleted:
    at = START + timedelta(minutes=n)
    return CrawlCompleted(
        url=f"https://{host}/p/{n}",
        domain=host,
        scope=Scope(value=host),
        request_id=f"00000000-0000-0000-0000-{n:012d}",
        outcome=outcome,
        started_at=at - timedelta(milliseconds=300),
        completed_at=at,
        duration_ms=300,
        fetcher=fields.pop("fetcher", "http"),
        **fields,
    )


def history() -> list[CrawlCompleted]:
    """Two hosts: one learns activitypub and then fails, the other bans Trove."""
    app_shell: dict[str, Any] = {"status_code": 200, "title": "App", "shell": True}
    post: dict[str, Any] = {"status_code": 200, "title": "Post", "fetcher": "activitypub"}
    post["content_type"] = "application/activity+json"
    challenge: dict[str, Any] = {"status_code": 403}
    challenge["response_headers"] = {"server": "cloudflare", "cf-mitigated": "challenge"}
    return [
        *(attempt("shell.example", n, CrawlOutcome.SUCCESS, **app_shell) for n in range(1, 5)),
        *(attempt("shell.example", n, CrawlOutcome.SUCCESS, **post) for n in range(5, 9)),
        attempt("shell.example", 9, CrawlOutcome.TIMEOUT, error_message="ReadTimeout"),
        attempt("waf.example", 1, CrawlOutcome.SUCCESS, status_code=200, title="Hi"),
        attempt("waf.example", 2, CrawlOutcome.BLOCKED_4XX, **challenge),
    ]


def folded(events: list[CrawlCompleted], host: str) -> HostPolicy:
    policy = HostPolicy()
    for event in events:
        if event.domain == host:
            policy = observe(policy, Observation.of(event), LEARNING)
    return policy


async def apply(engine: AsyncEngine, batches: Sequence[Sequence[Event]]) -> list[int]:
    sessions = async_sessionmaker(engine)
    counts = []
    for batch in batches:
        async with sessions.begin() as session:
            counts.append((await apply_batch(session, batch, POLICY, learning=LEARNING)).count)
    return counts


async def policies(engine: AsyncEngine) -> dict[str, Any]:
    return {
        row.host: row
        for row in await rows(
            engine,
            "SELECT host, policy, paused_until, pause_reason, risk_level, attempt_count, "
            "last_attempt_at, last_event_id FROM host_policies ORDER BY host",
        )
    }


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


async def test_each_attempt_is_folded_into_its_hosts_policy(engine: AsyncEngine) -> None:
    events = history()
    await apply(engine, [list(events)])
    found = await policies(engine)
    assert set(found) == {"shell.example", "waf.example"}

    shell = found["shell.example"]
    expected = folded(events, "shell.example")
    assert shell.policy == expected.to_json()
    assert HostPolicy.from_json(shell.policy).estimates["page:activitypub"][0] > 2
    assert (shell.attempt_count, shell.risk_level, shell.pause_reason) == (9, 1, "timeout")
    assert shell.paused_until == at(expected.paused_until)
    assert shell.last_attempt_at == START + timedelta(minutes=9)
    assert str(shell.last_event_id) == events[8].id

    waf = found["waf.example"]
    assert (waf.attempt_count, waf.pause_reason) == (2, "blocked_captcha")
    assert waf.paused_until == START + timedelta(minutes=2, seconds=LEARNING.ban_pause)
    assert HostPolicy.from_json(waf.policy).banned_at > 0


async def test_the_same_attempts_again_change_nothing(engine: AsyncEngine) -> None:
    events = history()
    await apply(engine, [list(events)])
    before = await policies(engine)
    # Redelivered one by one, and all together in one batch twice over.
    assert await apply(engine, [[e] for e in events]) == [0] * len(events)
    assert await apply(engine, [[*events, *events]]) == [0]
    assert await policies(engine) == before


async def test_the_policy_does_not_depend_on_how_the_stream_is_cut(engine: AsyncEngine) -> None:
    events = history()
    await apply(engine, [[e] for e in events[:3]] + [events[3:7], events[7:]])
    found = await policies(engine)
    for host in ("shell.example", "waf.example"):
        assert found[host].policy == folded(events, host).to_json()


async def test_replay_rebuilds_the_host_policies(
    stack: StackUrls, bus: Bus, engine: AsyncEngine
) -> None:
    events = history()
    for event in events:
        await bus.publish(event)
    await apply(engine, [[e] for e in events])  # as the live recorder did, one at a time
    live = await policies(engine)

    target = await empty_database(stack)
    await replay(stack.nats_url, target, POLICY, batch=4, learning=LEARNING)
    rebuilt = create_async_engine(target)
    try:
        assert await policies(rebuilt) == live
    finally:
        await rebuilt.dispose()
