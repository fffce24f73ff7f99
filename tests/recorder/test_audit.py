"""The audit: every attempt projected into fetcher_attempts with its heuristic tags."""

from __future__ import annotations

import json

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from tests.recorder.test_projections import POLICY, URL, completed, project, rows
from trove_recorder.projections import apply_batch
from trove_schema.events import CrawlOutcome, Link
from trove_schema.heuristics import audit

pytestmark = pytest.mark.usefixtures("clean")


async def test_an_attempt_is_audited_with_its_verdict_headers_and_tags(
    engine: AsyncEngine,
) -> None:
    event = completed(
        CrawlOutcome.BLOCKED_4XX,
        status_code=403,
        response_headers={
            "server": "cloudflare",
            "cf-ray": "8f00-AMS",
            "cf-mitigated": "challenge",
        },
        duration_ms=87,
    )
    await project(engine, event)
    (attempt,) = await rows(engine, "SELECT * FROM fetcher_attempts")
    (page_id,) = await rows(engine, "SELECT id FROM pages WHERE url = :url", url=URL)
    assert str(attempt.event_id) == event.id
    assert (attempt.page_id, attempt.url, attempt.host, attempt.fetcher) == (
        page_id.id,
        URL,
        "blog.example",
        "http",
    )
    assert (attempt.success, attempt.is_banned, attempt.error_type, attempt.http_status) == (
        False,
        True,
        "blocked_captcha",
        403,
    )
    assert attempt.response_headers == dict(event.response_headers)
    assert (attempt.duration_ms, attempt.attempted_at) == (87, event.started_at)
    stored = await rows(
        engine,
        "SELECT heuristic_type, heuristic_value, importance_score FROM attempt_heuristics "
        "WHERE attempt_id = :id ORDER BY heuristic_type",
        id=attempt.id,
    )
    expected = sorted((t.type, t.value, t.importance) for t in audit(event).tags)
    assert [tuple(r) for r in stored] == expected
    assert ("challenge", "true", 0.9) in expected


async def test_duration_of_an_older_event_comes_from_its_times(engine: AsyncEngine) -> None:
    event = completed(title="Hello")  # started 120 ms before it completed, no duration_ms
    await project(engine, event)
    (attempt,) = await rows(engine, "SELECT duration_ms, success FROM fetcher_attempts")
    assert (attempt.duration_ms, attempt.success) == (120, True)


async def test_the_same_attempt_twice_is_audited_once(engine: AsyncEngine) -> None:
    event = completed(title="Hello", links=(Link(url="https://blog.example/a"),))
    assert await project(engine, event, event) == [True, False]
    sessions = async_sessionmaker(engine)
    async with sessions.begin() as session:  # twice in one batch, too
        await apply_batch(session, [event, event], POLICY)
    (count,) = await rows(engine, "SELECT count(*) AS n FROM fetcher_attempts")
    (tags,) = await rows(engine, "SELECT count(*) AS n FROM attempt_heuristics")
    assert (count.n, tags.n) == (1, len(audit(event).tags))


async def test_a_batch_audits_every_attempt_of_a_page(engine: AsyncEngine) -> None:
    first = completed(CrawlOutcome.TIMEOUT, error_message="ReadTimeout")
    second = completed(status_code=200, content_length=0)
    sessions = async_sessionmaker(engine)
    async with sessions.begin() as session:
        await apply_batch(session, [first, second], POLICY)
    found = await rows(
        engine, "SELECT event_id::text AS id, error_type FROM fetcher_attempts ORDER BY id"
    )
    assert {(r.id, r.error_type) for r in found} == {
        (first.id, "timeout"),
        (second.id, "empty_content"),
    }


async def test_cookies_are_never_part_of_the_audit(engine: AsyncEngine) -> None:
    # The fetcher never selects them; the column holds what the event says, nothing more.
    event = completed(title="x", response_headers={"server": "nginx"})
    await project(engine, event)
    (attempt,) = await rows(engine, "SELECT response_headers::text AS h FROM fetcher_attempts")
    assert json.loads(attempt.h) == {"server": "nginx"}


async def test_tag_values_with_copy_control_characters_are_stored_as_sent(
    engine: AsyncEngine,
) -> None:
    hostile = "noindex\tnofollow\n\\N back\\slash\r"
    event = completed(title="x", response_headers={"x-robots-tag": hostile})
    await project(engine, event)
    (tag,) = await rows(
        engine,
        "SELECT heuristic_value FROM attempt_heuristics WHERE heuristic_type = 'x_robots_tag'",
    )
    assert tag.heuristic_value == hostile.lower()
