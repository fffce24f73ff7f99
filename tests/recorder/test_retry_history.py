"""A retried re-crawl is still the page's re-crawl chain: its change history goes on."""

from __future__ import annotations

from datetime import timedelta

from trove_recorder.retries import RetryPolicy, recheck_request, retry_request
from trove_schema.events import (
    ChangeHistory,
    CrawlCompleted,
    CrawlOutcome,
    Scope,
    ScopeKind,
    utcnow,
)

HISTORY = ChangeHistory(
    content_hash="abc",
    visited_at=utcnow() - timedelta(days=3),
    visits=((86_400.0, True), (172_800.0, False)),
    interval=259_200.0,
)


def failed(history: ChangeHistory | None) -> CrawlCompleted:
    now = utcnow()
    return CrawlCompleted(
        url="https://site.example/page",
        domain="site.example",
        scope=Scope(kind=ScopeKind.HOST, value="site.example"),
        request_id="recrawl-request",
        outcome=CrawlOutcome.TIMEOUT,
        started_at=now,
        completed_at=now,
        history=history,
    )


def test_the_retry_of_a_recrawl_carries_the_pages_change_history() -> None:
    retry = retry_request(failed(HISTORY), attempts=1, policy=RetryPolicy(delay_seconds=60))
    assert retry.history == HISTORY


def test_the_retry_of_a_first_fetch_has_no_history() -> None:
    retry = retry_request(failed(None), attempts=1, policy=RetryPolicy(delay_seconds=60))
    assert retry.history is None


def test_a_recheck_carries_the_history_and_waits_no_longer_than_the_longest_retry_delay() -> None:
    week = 7 * 86_400.0
    policy = RetryPolicy(max_delay_seconds=week)
    event = failed(HISTORY).model_copy(update={"retry_after": 365 * 86_400.0})
    recheck = recheck_request(event, policy)
    assert recheck.history == HISTORY
    assert recheck.attempt == 1
    # The page's three-day interval is shorter than a week; the site's year is capped.
    assert recheck.not_before == event.completed_at + timedelta(seconds=week)
