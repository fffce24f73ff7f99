"""Every attempt's CrawlCompleted is built, and fits in a stream message."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from trove_fetcher.completion import completed, event_budget, fit
from trove_fetcher.extract import Extraction, FoundLink
from trove_fetcher.http import FetchResult
from trove_schema.events import (
    MAX_SITEMAPS,
    CrawlCompleted,
    CrawlOutcome,
    CrawlRequested,
    Link,
    LinkKind,
    PageDiscovered,
    Provenance,
    RequestReason,
    Scope,
)

URL = "http://hostile.trove.test/page"
WORK = PageDiscovered(
    url=URL,
    domain="hostile.trove.test",
    scope=Scope(value="hostile.trove.test"),
    provenance=Provenance(kind="seed"),
)


def result(**overrides: object) -> FetchResult:
    now = time.monotonic()
    values: dict[str, object] = {
        "url": URL,
        "outcome": CrawlOutcome.SUCCESS,
        "final_url": URL,
        "status_code": 200,
        "body": b"<html></html>",
        "content_type": "text/html",
        "started": now,
        "completed": now,
    }
    values.update(overrides)
    return FetchResult(**values)  # type: ignore[arg-type]


def long_links(count: int, length: int) -> tuple[FoundLink, ...]:
    return tuple(
        FoundLink(f"http://hostile.trove.test/l/{n:04d}/" + "x" * length, LinkKind.A, False)
        for n in range(count)
    )


def test_an_event_over_budget_drops_links_from_the_end_until_it_fits() -> None:
    extraction = Extraction(content_hash="0" * 64, title="many", links=long_links(1000, 1900))
    event = completed(WORK, result(), extraction, datetime.now(UTC))
    budget = event_budget(1 << 20)
    assert len(event.to_wire()) > budget
    cut = fit(event, budget)
    assert len(cut.to_wire()) <= budget
    assert cut.links_truncated
    assert 0 < len(cut.links) < 1000
    assert cut.links == event.links[: len(cut.links)]  # the start of the page, in order
    one_more = cut.model_copy(update={"links": event.links[: len(cut.links) + 1]})
    assert len(one_more.to_wire()) > budget  # no more was dropped than needed
    assert cut.title == "many"


def test_an_event_within_budget_is_left_alone() -> None:
    extraction = Extraction(content_hash="0" * 64, links=long_links(10, 50))
    event = completed(WORK, result(), extraction, datetime.now(UTC))
    assert fit(event, event_budget(1 << 20)) is event
    assert not event.links_truncated


def test_an_event_too_big_without_links_keeps_only_its_outcome() -> None:
    event = completed(WORK, result(), Extraction(content_hash="0" * 64), datetime.now(UTC))
    huge = event.model_copy(update={"final_url": "http://hostile.trove.test/" + "y" * 200_000})
    cut = fit(huge, 64 * 1024)
    assert len(cut.to_wire()) <= 64 * 1024
    assert cut.outcome is CrawlOutcome.SUCCESS
    assert cut.final_url is None


def test_a_home_pages_sitemaps_count_in_its_size_and_go_when_nothing_else_fits() -> None:
    # The largest a robots.txt can make them: every sitemap URL of 2,048 characters.
    event = completed(WORK, result(), Extraction(content_hash="0" * 64), datetime.now(UTC))
    sitemaps = tuple(f"http://hostile.trove.test/{n}/" + "s" * 2000 for n in range(MAX_SITEMAPS))
    listed = event.model_copy(update={"sitemaps": sitemaps})
    size = len(listed.to_wire())
    assert fit(listed, size) is listed  # they fit: kept
    cut = fit(listed, size - 1000)
    assert len(cut.to_wire()) <= size - 1000
    assert cut.sitemaps == ()
    assert cut.outcome is CrawlOutcome.SUCCESS


def test_an_event_that_cannot_be_built_is_a_rejected_attempt_with_the_reason() -> None:
    # A value the event refuses (a status no HTTP response has) stands for any surprise.
    event = completed(WORK, result(status_code="two hundred"), None, datetime.now(UTC))
    assert isinstance(event, CrawlCompleted)
    assert event.outcome is CrawlOutcome.REJECTED
    assert event.error_message is not None
    assert event.error_message.startswith("could not record the response")
    assert event.url == URL


def test_the_quick_size_check_never_lets_an_oversized_event_through() -> None:
    # Control characters take six bytes each in JSON, the most any character takes.
    event = completed(WORK, result(), Extraction(content_hash="0" * 64), datetime.now(UTC))
    hostile = tuple(Link(url="\x01" * 2000, kind=LinkKind.A) for _ in range(200))
    heavy = event.model_copy(update={"links": hostile, "keywords": ("\x02" * 50,) * 200})
    size = len(heavy.to_wire())
    assert size > 2_400_000
    cut = fit(heavy, size - 1)
    assert cut is not heavy
    assert cut.links_truncated
    assert len(cut.to_wire()) <= size - 1


def _recrawl(etag: str | None, last_modified: str | None) -> CrawlRequested:
    return CrawlRequested(
        url=URL,
        domain="hostile.trove.test",
        scope=Scope(value="hostile.trove.test"),
        reason=RequestReason.RECRAWL,
        not_before=datetime.now(UTC),
        etag=etag,
        last_modified=last_modified,
    )


def test_a_304_without_its_validators_keeps_the_ones_it_answered() -> None:
    """RFC 9110 lets a 304 leave Last-Modified out: the next visit must still ask
    conditionally, not read the page whole every other time."""
    work = _recrawl('"v1"', "Tue, 03 Nov 2026 10:00:00 GMT")
    answer = result(outcome=CrawlOutcome.NOT_MODIFIED, status_code=304, body=None)
    event = completed(work, answer, None, datetime.now(UTC), conditional=True)
    assert event.outcome is CrawlOutcome.NOT_MODIFIED
    assert (event.etag, event.last_modified) == ('"v1"', "Tue, 03 Nov 2026 10:00:00 GMT")


def test_a_304_with_a_new_validator_passes_the_new_one_on() -> None:
    work = _recrawl('"v1"', None)
    answer = result(outcome=CrawlOutcome.NOT_MODIFIED, status_code=304, body=None, etag='"v1-gzip"')
    event = completed(work, answer, None, datetime.now(UTC), conditional=True)
    assert event.etag == '"v1-gzip"'


def test_a_changed_page_without_validators_drops_the_old_ones() -> None:
    event = completed(_recrawl('"v1"', "x"), result(), None, datetime.now(UTC))
    assert (event.etag, event.last_modified) == (None, None)
