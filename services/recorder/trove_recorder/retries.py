"""When a failed attempt is tried again: the policy and the delayed request it yields."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from trove_schema.events import CrawlCompleted, CrawlRequested, RequestReason, derived_event_id


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    max_attempts: int = 3
    delay_seconds: float = 3600.0
    max_delay_seconds: float = 7 * 86_400.0


def retry_request(event: CrawlCompleted, attempts: int, policy: RetryPolicy) -> CrawlRequested:
    """The delayed request for the next attempt after ``event`` (``attempts`` made so far).

    Its id derives from the failed attempt's, so it is published at most once per attempt.
    """
    delay = min(max(policy.delay_seconds, event.retry_after or 0.0), policy.max_delay_seconds)
    return CrawlRequested(
        id=derived_event_id(event.id, "retry"),
        url=event.url,
        domain=event.domain,
        depth=event.depth,
        priority=event.priority,
        scope=event.scope,
        reason=RequestReason.RETRY,
        attempt=attempts + 1,
        not_before=event.completed_at + timedelta(seconds=delay),
        caused_by=event.id,
        # A retried re-crawl is still the page's chain: its change history goes on.
        history=event.history,
    )
