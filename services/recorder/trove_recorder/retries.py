"""When a failed attempt is tried again: the policy and the delayed requests it yields.

A failure worth another attempt (a timeout, a 5xx, a 429) is retried
``max_attempts`` - 1 times, ``delay_seconds`` apart (or the site's Retry-After). When
they run out the page is not dropped: while it has been failing for less than
``recheck_for_seconds`` (since its first attempt after its last success) it is asked
again as a new chain after ``max_delay_seconds``, or its re-crawl interval if longer.
Ended there, a site down a weekend would be out of the crawl until its pages' seen
keys expired (two re-crawl intervals), and a seed nothing links to for good.

A page fetched before that is refused (a 4xx other than 429 and 410: a bot challenge, a
403 of a firewall, a 401, a 404 of a broken deploy) is not tried again soon, which
would only ask a refusing site again, but it is rechecked the same way: its chain ended
there, and a challenge left on for a week, or a weekend's 404s, took the pages they met
out of the crawl until their seen keys expired. A 410 says the page is gone for good.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from trove_schema.events import (
    CrawlCompleted,
    CrawlOutcome,
    CrawlRequested,
    RequestReason,
    derived_event_id,
    is_explored,
)
from trove_schema.settings import RecorderSettings


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    max_attempts: int = 3
    delay_seconds: float = 3600.0
    max_delay_seconds: float = 7 * 86_400.0
    #: How long a page whose retries ran out is still asked again; 0: never.
    recheck_for_seconds: float = 0.0

    @classmethod
    def from_settings(cls, settings: RecorderSettings) -> RetryPolicy:
        return cls(
            max_attempts=settings.max_attempts,
            delay_seconds=settings.retry_delay_seconds,
            max_delay_seconds=settings.retry_max_delay_seconds,
            recheck_for_seconds=settings.recheck_failing_for_seconds,
        )


def refused_for_now(event: CrawlCompleted) -> bool:
    """Whether ``event`` is a refusal of a page fetched before that may not be for good
    (a 4xx but 429, retried as any failure, and 410): rechecked, never retried soon. Not
    an attempt asked first a way that got the wrong kind of answer (a 406 to
    ActivityPub): the page's own attempt follows it, and its recheck would replace the
    page's re-crawl."""
    return (
        event.outcome is CrawlOutcome.BLOCKED_4XX
        and not is_explored(event)
        and not event.retryable
        and event.status_code != 410
        and event.history is not None
        and event.history.visited_at is not None
    )


def retry_request(event: CrawlCompleted, attempts: int, policy: RetryPolicy) -> CrawlRequested:
    """The delayed request for the next attempt after ``event`` (``attempts`` made so far).

    Its id derives from the failed attempt's, so it is published at most once per attempt.
    """
    delay = min(max(policy.delay_seconds, event.retry_after or 0.0), policy.max_delay_seconds)
    return _after(event, "retry", RequestReason.RETRY, attempts + 1, delay)


def recheck_request(event: CrawlCompleted, policy: RetryPolicy) -> CrawlRequested:
    """The new chain for a page whose retries ran out with ``event``: its first attempt
    after the longest retry delay, or the page's re-crawl interval if longer (a site's
    Retry-After is capped by the longest retry delay, as a retry's is)."""
    interval = event.history.interval if event.history is not None else None
    delay = max(policy.max_delay_seconds, interval or 0.0)
    return _after(event, "recheck", RequestReason.RECRAWL, 1, delay)


def _after(
    event: CrawlCompleted, kind: str, reason: RequestReason, attempt: int, delay: float
) -> CrawlRequested:
    """The page's next request, ``delay`` seconds after ``event`` ended, caused by it."""
    return CrawlRequested(
        id=derived_event_id(event.id, kind),
        url=event.url,
        domain=event.domain,
        depth=event.depth,
        priority=event.priority,
        scope=event.scope,
        reason=reason,
        attempt=attempt,
        not_before=event.completed_at + timedelta(seconds=delay),
        caused_by=event.id,
        # A retried re-crawl, a recheck, are still the page's chain: its history goes on.
        history=event.history,
    )
