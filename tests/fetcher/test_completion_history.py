"""The attempt of a re-crawl carries the request's change history on to discovery."""

from __future__ import annotations

from datetime import timedelta

from trove_fetcher.completion import rejected
from trove_schema.events import (
    ChangeHistory,
    CrawlRequested,
    PageDiscovered,
    Provenance,
    RequestReason,
    Scope,
    ScopeKind,
    utcnow,
)

URL = "https://site.example/page"
SCOPE = Scope(kind=ScopeKind.HOST, value="site.example")
HISTORY = ChangeHistory(
    content_hash="abc",
    visited_at=utcnow() - timedelta(days=1),
    visits=((86_400.0, False),),
    interval=172_800.0,
)


def test_a_recrawl_attempt_carries_the_history_of_its_request() -> None:
    work = CrawlRequested(
        url=URL, domain="site.example", scope=SCOPE, reason=RequestReason.RECRAWL, history=HISTORY
    )
    assert rejected(work, "not parsed", utcnow()).history == HISTORY


def test_a_first_fetch_has_no_history() -> None:
    work = PageDiscovered(
        url=URL, domain="site.example", scope=SCOPE, provenance=Provenance(kind="seed")
    )
    assert rejected(work, "not parsed", utcnow()).history is None
