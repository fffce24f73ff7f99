"""Projections: each event applied to pages, page_crawls, page_links in one transaction.

Applying an event first inserts its id into ``projected_events``; if the id is already
there the event was applied before (a redelivery) and nothing else happens. Both writes
share the transaction, so a crash between commit and ack only causes a harmless
redelivery.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import and_, delete, func, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from trove_schema.events import (
    CrawlCompleted,
    CrawlOutcome,
    CrawlRequested,
    Event,
    PageDiscovered,
    RequestReason,
    SeedRejected,
    derived_event_id,
)
from trove_schema.tables import (
    Outbox,
    Page,
    PageCrawl,
    PageOutlinks,
    ProjectedEvent,
    SeedRejection,
)
from trove_schema.textsearch import ts_config
from trove_schema.urls import domain_of

STATUS_BY_OUTCOME = {
    CrawlOutcome.SUCCESS: "fetched",
    CrawlOutcome.NOT_MODIFIED: "fetched",
    CrawlOutcome.REJECTED: "rejected",
    # robots.txt forbids it: Trove declines the page (it may be allowed next cycle).
    CrawlOutcome.BLOCKED_ROBOTS: "rejected",
    CrawlOutcome.FAILED: "failed",
    CrawlOutcome.TIMEOUT: "failed",
    CrawlOutcome.BLOCKED_4XX: "failed",
    CrawlOutcome.BLOCKED_5XX: "failed",
}


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
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    max_attempts: int = 3
    delay_seconds: float = 3600.0
    max_delay_seconds: float = 7 * 86_400.0


async def apply(session: AsyncSession, event: Event, policy: RetryPolicy) -> bool:
    """Apply one event inside the caller's transaction. False if it was applied before."""
    first = await session.execute(
        insert(ProjectedEvent)
        .values(event_id=uuid.UUID(event.id), event_type=event.TYPE)
        .on_conflict_do_nothing()
        .returning(ProjectedEvent.event_id)
    )
    if first.scalar_one_or_none() is None:
        return False
    if isinstance(event, SeedRejected):
        await session.execute(
            insert(SeedRejection).values(
                event_id=uuid.UUID(event.id),
                raw=event.raw,
                reason=event.reason,
                origin=event.provenance.origin,
                occurred_at=event.occurred_at,
            )
        )
    elif isinstance(event, PageDiscovered):
        await _page_discovered(session, event)
    elif isinstance(event, CrawlRequested):
        await _ensure_pages(session, [(event.url, event.domain)])
    elif isinstance(event, CrawlCompleted):
        await _crawl_completed(session, event, policy)
    return True


async def _ensure_pages(session: AsyncSession, urls: list[tuple[str, str]]) -> dict[str, int]:
    """Ids of these URLs' page rows, creating the missing ones (status discovered)."""
    unique = dict(urls)
    if not unique:
        return {}
    await session.execute(
        insert(Page)
        .values([{"url": u, "domain": d} for u, d in sorted(unique.items())])
        .on_conflict_do_nothing(index_elements=[Page.url])
    )
    rows = await session.execute(select(Page.url, Page.id).where(Page.url.in_(list(unique))))
    return {url: page_id for url, page_id in rows.all()}


async def _page_discovered(session: AsyncSession, event: PageDiscovered) -> None:
    await session.execute(
        insert(Page)
        .values(
            url=event.url,
            domain=event.domain,
            depth=event.depth,
            discovered_at=event.occurred_at,
        )
        .on_conflict_do_update(
            index_elements=[Page.url],
            set_={
                "discovered_at": func.coalesce(Page.discovered_at, event.occurred_at),
                "depth": func.least(func.coalesce(Page.depth, event.depth), event.depth),
                "updated_at": func.now(),
            },
        )
    )


async def _crawl_completed(
    session: AsyncSession, event: CrawlCompleted, policy: RetryPolicy
) -> None:
    page_id = (await _ensure_pages(session, [(event.url, event.domain)]))[event.url]
    duration = max(0, int((event.completed_at - event.started_at).total_seconds() * 1000))
    await session.execute(
        insert(PageCrawl).values(
            page_id=page_id,
            domain=event.domain,
            priority=event.priority,
            attempt=event.attempt,
            outcome=event.outcome.value,
            status_code=event.status_code,
            error_message=event.error_message,
            content_length=event.content_length,
            started_at=event.started_at,
            completed_at=event.completed_at,
            duration_ms=duration,
            event_id=uuid.UUID(event.id),
            request_id=uuid_or_none(event.request_id),
        )
    )
    # Lock the page row: attempts on one page are applied one at a time, and one older
    # than the newest applied adds history (above) but changes nothing else.
    newest = (
        await session.execute(
            select(Page.last_crawled_at).where(Page.id == page_id).with_for_update()
        )
    ).scalar_one_or_none()
    if newest is not None and event.completed_at < newest:
        return
    outcome = event.outcome
    values: dict[str, object] = {
        "last_crawled_at": event.completed_at,
        "last_outcome": outcome.value,
        "last_status_code": event.status_code,
        "updated_at": func.now(),
    }
    if outcome is CrawlOutcome.SUCCESS:
        words = " ".join((event.title or "", *event.keywords))
        values |= {
            "status": "fetched",
            "fetched_at": event.completed_at,
            "failed_at": None,
            "title": event.title,
            "language": event.language,
            "keywords_tsv": func.to_tsvector(
                text(f"'{ts_config(event.language)}'::regconfig"), words
            ),
            "etag": event.etag,
            "last_modified": event.last_modified,
            "content_hash": event.content_hash,
            "canonical_url": event.canonical_url,
            "noindex": event.noindex,
        }
    elif outcome is CrawlOutcome.NOT_MODIFIED:
        values |= {"status": "fetched", "fetched_at": event.completed_at, "failed_at": None}
    elif event.retryable and await _schedule_retry(session, page_id, event, policy):
        pass  # the page keeps its status until the retries run out
    else:
        values["status"] = STATUS_BY_OUTCOME[outcome]
        if values["status"] == "failed":
            values["failed_at"] = event.completed_at
    if outcome is CrawlOutcome.SUCCESS or event.links:
        # A failed attempt keeps the page's last known links, unless it says where the
        # page points now (a redirect to another host).
        await _replace_links(session, page_id, event)
    await session.execute(update(Page).where(Page.id == page_id).values(**values))


async def _replace_links(session: AsyncSession, page_id: int, event: CrawlCompleted) -> None:
    """The page's outgoing link set becomes exactly the one in this crawl."""
    ids = await _ensure_pages(
        session, sorted({(link.url, domain_of(link.url)) for link in event.links})
    )
    row = outlinks_row(page_id, event, ids)
    if row is None:
        await session.execute(delete(PageOutlinks).where(PageOutlinks.from_page_id == page_id))
        return
    _, targets, kinds, nofollow = row
    stmt = insert(PageOutlinks).values(
        from_page_id=page_id, to_page_ids=targets, kinds=kinds, nofollow=nofollow
    )
    await session.execute(
        stmt.on_conflict_do_update(
            index_elements=[PageOutlinks.from_page_id],
            set_={
                "to_page_ids": stmt.excluded.to_page_ids,
                "kinds": stmt.excluded.kinds,
                "nofollow": stmt.excluded.nofollow,
            },
        )
    )


def outlinks_row(
    source: int, event: CrawlCompleted, page_ids: Mapping[str, int]
) -> tuple[int, list[int], list[str], list[bool]] | None:
    """The ``page_outlinks`` row of a crawl's links: one entry per (target, kind)."""
    links = event.links
    if not links:
        return None
    targets = [page_ids[link.url] for link in links]
    kinds: list[str] = [link.kind for link in links]
    if len(set(zip(targets, kinds, strict=True))) != len(links):
        # The fetcher sends each (url, kind) once; a stranger may not. Last one wins.
        edges = {(page_ids[link.url], link.kind): link.nofollow for link in links}
        return (source, [t for t, _ in edges], [k for _, k in edges], list(edges.values()))
    return (source, targets, kinds, [link.nofollow for link in links])


async def _schedule_retry(
    session: AsyncSession, page_id: int, event: CrawlCompleted, policy: RetryPolicy
) -> bool:
    """Write a delayed CrawlRequested to the outbox if attempts remain. True if it did."""
    since = (
        await session.execute(
            select(func.max(PageCrawl.completed_at)).where(
                PageCrawl.page_id == page_id,
                PageCrawl.outcome.in_(
                    [CrawlOutcome.SUCCESS.value, CrawlOutcome.NOT_MODIFIED.value]
                ),
            )
        )
    ).scalar_one_or_none()
    conditions = [PageCrawl.page_id == page_id]
    if since is not None:
        conditions.append(PageCrawl.completed_at > since)
    attempts = (
        await session.execute(select(func.count()).select_from(PageCrawl).where(and_(*conditions)))
    ).scalar_one()
    if attempts >= policy.max_attempts:
        return False
    retry = retry_request(event, attempts, policy)
    due = retry.not_before
    await session.execute(
        insert(Outbox)
        .values(
            event_id=uuid.UUID(retry.id),
            subject=retry.SUBJECT,
            payload=retry.to_wire(),
            deliver_at=due,
        )
        .on_conflict_do_nothing()
    )
    return True


def uuid_or_none(value: str | None) -> uuid.UUID | None:
    if not value:
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        return None
