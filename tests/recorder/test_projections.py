from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from trove_recorder.projections import apply_batch
from trove_recorder.retries import RetryPolicy
from trove_schema.events import (
    ChangeHistory,
    CrawlCompleted,
    CrawlOutcome,
    CrawlRequested,
    Event,
    Link,
    LinkKind,
    PageDiscovered,
    Provenance,
    RequestReason,
    Scope,
    SeedRejected,
    attempt_id,
    decode_event,
    explored_attempt_id,
)

pytestmark = pytest.mark.usefixtures("clean")

URL = "https://blog.example/post"
POLICY = RetryPolicy(max_attempts=3, delay_seconds=60.0)


def completed(outcome: CrawlOutcome = CrawlOutcome.SUCCESS, **fields: Any) -> CrawlCompleted:
    now = datetime.now(UTC)
    base: dict[str, Any] = {
        "url": URL,
        "domain": "blog.example",
        "scope": Scope(value="blog.example"),
        "request_id": "00000000-0000-0000-0000-000000000001",
        "outcome": outcome,
        "started_at": now - timedelta(milliseconds=120),
        "completed_at": now,
    }
    base.update(fields)
    return CrawlCompleted(**base)


async def project(
    engine: AsyncEngine, *events: Event, policy: RetryPolicy = POLICY, replaying: bool = False
) -> list[bool]:
    """Each event in a transaction of its own; whether it was new."""
    sessions = async_sessionmaker(engine)
    applied = []
    for event in events:
        async with sessions.begin() as session:
            batch = await apply_batch(session, [event], policy, replaying=replaying)
            applied.append(batch.count == 1)
    return applied


async def rows(engine: AsyncEngine, sql: str, **params: Any) -> Sequence[Any]:
    async with engine.connect() as conn:
        return (await conn.execute(text(sql), params)).all()


async def page(engine: AsyncEngine, url: str = URL) -> Any:
    found = await rows(engine, "SELECT * FROM pages WHERE url = :url", url=url)
    assert len(found) == 1, f"expected one page row for {url}, found {len(found)}"
    return found[0]


async def test_page_discovered_creates_a_discovered_page(engine: AsyncEngine) -> None:
    event = PageDiscovered(
        url=URL, domain="blog.example", depth=2, scope=Scope(), provenance=Provenance(kind="seed")
    )
    await project(engine, event)
    row = await page(engine)
    assert (row.status, row.depth, row.discovered_at) == ("discovered", 2, event.occurred_at)


async def test_a_page_keeps_its_first_sighting_and_shallowest_depth_in_any_order(
    engine: AsyncEngine,
) -> None:
    # Two batches side by side may commit a later sighting first; a replay batches them.
    first = datetime.now(UTC) - timedelta(days=61)

    def sightings(url: str) -> list[PageDiscovered]:
        return [
            PageDiscovered(
                url=url,
                domain="blog.example",
                depth=depth,
                scope=Scope(),
                provenance=Provenance(kind="link"),
                occurred_at=first + timedelta(days=days),
            )
            for days, depth in ((0, 3), (61, 1))
        ]

    reversed_url, batched_url = f"{URL}/reversed", f"{URL}/batched"
    await project(engine, *reversed(sightings(reversed_url)))
    async with async_sessionmaker(engine).begin() as session:
        await apply_batch(session, sightings(batched_url), POLICY)
    for url in (reversed_url, batched_url):
        row = await page(engine, url)
        assert (row.discovered_at, row.depth) == (first, 1), url


async def test_a_page_keeps_where_it_was_last_read(engine: AsyncEngine) -> None:
    """Through a redirect on its host the page read is the target: the row says where
    (canonical), for search to show the page once. A 304 through a redirect says so too
    (a page whose chain moved may never be read whole under its old name again); a
    failure keeps it; the next success read at the page itself clears it."""
    start = datetime.now(UTC) - timedelta(hours=1)

    def at(minutes: int, **fields: Any) -> CrawlCompleted:
        when = start + timedelta(minutes=minutes)
        return completed(started_at=when, completed_at=when, **fields)

    await project(engine, at(0, title="Hello"))
    assert (await page(engine)).final_url is None
    await project(
        engine, at(1, outcome=CrawlOutcome.NOT_MODIFIED, final_url="HTTPS://Blog.Example:443/post/")
    )
    assert (await page(engine)).final_url == "https://blog.example/post/"
    await project(engine, at(2, outcome=CrawlOutcome.FAILED, error_message="timed out"))
    assert (await page(engine)).final_url == "https://blog.example/post/"
    await project(engine, at(3, final_url="https://blog.example/post/2"))
    assert (await page(engine)).final_url == "https://blog.example/post/2"
    await project(engine, at(4, title="Hello"))
    assert (await page(engine)).final_url is None


async def test_a_batch_does_not_wait_on_the_foreign_key_lock_another_batch_holds(
    engine: AsyncEngine,
) -> None:
    # Another batch's page_crawls insert for the same page holds a key-share lock on its
    # row until it commits, and would then wait for this batch's lock: a deadlock if this
    # batch waited for it.
    await project(engine, completed())
    (row,) = await rows(engine, "SELECT id FROM pages WHERE url = :url", url=URL)
    async with engine.connect() as other:
        await other.begin()
        await other.execute(
            text("SELECT 1 FROM pages WHERE id = :id FOR KEY SHARE"), {"id": row.id}
        )
        async with async_sessionmaker(engine).begin() as session:
            await session.execute(text("SET LOCAL lock_timeout = '3s'"))
            later = completed(completed_at=datetime.now(UTC) + timedelta(seconds=1))
            assert (await apply_batch(session, [later], POLICY)).count == 1
        await other.rollback()
    assert len(await rows(engine, "SELECT * FROM page_crawls")) == 2


async def test_the_same_event_twice_changes_nothing(engine: AsyncEngine) -> None:
    event = completed(title="Hello", links=(Link(url="https://blog.example/a"),))
    assert await project(engine, event, event) == [True, False]
    assert len(await rows(engine, "SELECT * FROM page_crawls")) == 1
    assert len(await rows(engine, "SELECT * FROM page_links")) == 1


async def test_success_records_title_language_keywords_and_validators(engine: AsyncEngine) -> None:
    event = completed(
        title="Gardening notes",
        language="en",
        keywords=("tomatoes", "watering"),
        etag='"v1"',
        last_modified="Wed, 21 Oct 2026 07:28:00 GMT",
        status_code=200,
    )
    await project(engine, event)
    row = await page(engine)
    assert (row.status, row.title, row.language, row.etag) == (
        "fetched",
        "Gardening notes",
        "en",
        '"v1"',
    )
    assert row.fetched_at == event.completed_at
    hits = await rows(
        engine,
        "SELECT url FROM pages WHERE keywords_tsv @@ to_tsquery('english', 'tomato')",
    )
    assert [h.url for h in hits] == [URL]


async def test_each_attempt_is_one_page_crawls_row(engine: AsyncEngine) -> None:
    await project(
        engine,
        completed(CrawlOutcome.TIMEOUT, error_message="read timeout"),
        completed(
            CrawlOutcome.SUCCESS, attempt=2, request_id="00000000-0000-0000-0000-000000000002"
        ),
    )
    crawls = await rows(engine, "SELECT outcome, duration_ms FROM page_crawls ORDER BY id")
    assert [c.outcome for c in crawls] == ["timeout", "success"]
    assert all(c.duration_ms >= 100 for c in crawls)


async def test_a_recrawl_that_drops_a_link_removes_it(engine: AsyncEngine) -> None:
    a, b, c = (f"https://blog.example/{n}" for n in "abc")
    await project(engine, completed(links=(Link(url=a), Link(url=b, nofollow=True))))
    await project(engine, completed(links=(Link(url=a), Link(url=c, kind=LinkKind.IMG))))
    links = await rows(
        engine,
        "SELECT t.url, l.kind, l.nofollow FROM page_links l JOIN pages t ON t.id = l.to_page_id "
        "ORDER BY t.url",
    )
    assert [(r.url, r.kind, r.nofollow) for r in links] == [(a, "a", False), (c, "img", False)]


async def test_a_recrawl_with_the_same_links_leaves_their_row_as_it_is(
    engine: AsyncEngine,
) -> None:
    # Most re-crawls find the same links: the row (and its GIN entries) is not rewritten.
    a, b = (f"https://blog.example/{n}" for n in "ab")
    same = (Link(url=a), Link(url=b, kind=LinkKind.IMG, nofollow=True))

    async def version() -> str:
        (row,) = await rows(engine, "SELECT xmin::text AS v FROM page_outlinks")
        return str(row.v)

    await project(engine, completed(links=same))
    first = await version()
    await project(engine, completed(links=same, request_id=str(uuid.uuid4())))
    assert await version() == first
    changed = (Link(url=a), Link(url=b, kind=LinkKind.IMG))  # only its nofollow
    await project(engine, completed(links=changed, request_id=str(uuid.uuid4())))
    assert await version() != first
    links = await rows(engine, "SELECT nofollow FROM page_links ORDER BY to_page_id")
    assert [r.nofollow for r in links] == [False, False]


async def test_a_link_to_an_unknown_page_creates_its_row(engine: AsyncEngine) -> None:
    await project(engine, completed(links=(Link(url="https://other.example/x"),)))
    row = await page(engine, "https://other.example/x")
    assert (row.status, row.domain, row.discovered_at) == ("discovered", "other.example", None)


async def test_a_link_to_no_host_is_left_out_and_its_page_applied(engine: AsyncEngine) -> None:
    # A stranger's event: Trove's fetcher sends canonical URLs only. No page can be made
    # of these, and refusing the whole attempt for them would park it.
    other = "https://blog.example/a"
    event = completed(links=(Link(url="about:blank"), Link(url=other), Link(url="https:///x")))
    hostless = completed(
        url=f"{URL}/2", links=(Link(url="mailto:ada@blog.example"),), request_id=str(uuid.uuid4())
    )
    async with async_sessionmaker(engine).begin() as session:
        assert (await apply_batch(session, [event, hostless], POLICY)).count == 2
    links = await rows(
        engine,
        "SELECT f.url AS source, t.url AS target FROM page_links l "
        "JOIN pages f ON f.id = l.from_page_id JOIN pages t ON t.id = l.to_page_id",
    )
    assert [(r.source, r.target) for r in links] == [(URL, other)]
    crawled = await rows(engine, "SELECT url FROM pages WHERE status = 'fetched' ORDER BY url")
    assert [r.url for r in crawled] == [URL, f"{URL}/2"]
    assert len(await rows(engine, "SELECT * FROM pages")) == 3


async def test_an_attempt_that_took_weeks_keeps_the_longest_duration_its_columns_hold(
    engine: AsyncEngine,
) -> None:
    # 2**31 ms is under 25 days: a stranger's times, or a clock set wrong, may be further
    # apart than that.
    now = datetime.now(UTC)
    event = completed(CrawlOutcome.TIMEOUT, started_at=now - timedelta(days=30), completed_at=now)
    assert await project(engine, event) == [True]
    (crawl,) = await rows(engine, "SELECT duration_ms FROM page_crawls")
    (attempt,) = await rows(engine, "SELECT duration_ms FROM fetcher_attempts")
    assert crawl.duration_ms == attempt.duration_ms == 2**31 - 1


async def test_an_event_whose_id_is_not_a_uuid_is_applied_once(engine: AsyncEngine) -> None:
    event = completed(id="attempt 1 of blog.example/post", title="Hello", status_code=200)
    request = completed(
        CrawlOutcome.TIMEOUT, id="attempt 2", request_id="a request of a stranger's producer"
    )
    assert await project(engine, event, event, request) == [True, False, True]
    crawls = await rows(engine, "SELECT event_id, request_id FROM page_crawls")
    assert len({r.event_id for r in crawls}) == 2
    assert all(r.request_id is not None for r in crawls)
    assert (await page(engine)).title == "Hello"
    (tags,) = await rows(engine, "SELECT count(*) AS n FROM attempt_heuristics")
    assert tags.n > 0


async def test_an_event_id_in_capitals_is_applied_once(engine: AsyncEngine) -> None:
    # The id names the same UUID in either case: applied the first time, whichever.
    event = completed(id=str(uuid.uuid4()).upper(), title="Hello", status_code=200)
    copy = event.model_copy(update={"id": event.id.lower()})
    assert await project(engine, event, copy) == [True, False]
    assert (await page(engine)).title == "Hello"
    assert len(await rows(engine, "SELECT * FROM page_crawls")) == 1
    (tags,) = await rows(engine, "SELECT count(*) AS n FROM attempt_heuristics")
    assert tags.n > 0


@pytest.mark.parametrize(
    ("outcome", "status"),
    [
        (CrawlOutcome.REJECTED, "rejected"),
        (CrawlOutcome.BLOCKED_ROBOTS, "rejected"),
        (CrawlOutcome.BLOCKED_4XX, "failed"),
    ],
)
async def test_final_outcomes_set_the_page_status(
    engine: AsyncEngine, outcome: CrawlOutcome, status: str
) -> None:
    await project(engine, completed(outcome))
    assert (await page(engine)).status == status
    assert await rows(engine, "SELECT * FROM outbox") == []


async def test_not_modified_keeps_what_the_page_had(engine: AsyncEngine) -> None:
    await project(engine, completed(title="Kept", language="en", etag='"v1"'))
    await project(
        engine,
        completed(
            CrawlOutcome.NOT_MODIFIED,
            status_code=304,
            request_id="00000000-0000-0000-0000-000000000009",
        ),
    )
    row = await page(engine)
    assert (row.status, row.title, row.language, row.etag) == ("fetched", "Kept", "en", '"v1"')


#: A page's attempts, in the order they completed: (outcome, title, etag), and the
#: attempt's number in its chain when it is not the first.
STATUS_CODES = {
    CrawlOutcome.NOT_MODIFIED: 304,
    CrawlOutcome.BLOCKED_4XX: 404,
    CrawlOutcome.BLOCKED_5XX: 503,
}

HISTORIES: dict[str, list[tuple[Any, ...]]] = {
    "a success then a 304": [
        (CrawlOutcome.SUCCESS, "First", '"v1"'),
        (CrawlOutcome.NOT_MODIFIED, None, None),
    ],
    "a success then a failure retried": [
        (CrawlOutcome.SUCCESS, "First", '"v1"'),
        (CrawlOutcome.BLOCKED_5XX, None, None),
    ],
    "a failure, a success, a refusal": [
        (CrawlOutcome.FAILED, None, None),
        (CrawlOutcome.SUCCESS, "Second", '"v2"'),
        (CrawlOutcome.BLOCKED_ROBOTS, None, None),
    ],
    "a 404, then a failure retried": [
        (CrawlOutcome.SUCCESS, "First", '"v1"'),
        (CrawlOutcome.BLOCKED_4XX, None, None),
        (CrawlOutcome.BLOCKED_5XX, None, None),
    ],
    "two successes then a 304": [
        (CrawlOutcome.SUCCESS, "First", '"v1"'),
        (CrawlOutcome.SUCCESS, "Second", '"v2"'),
        (CrawlOutcome.NOT_MODIFIED, None, None),
    ],
    "retries that run out, then a new chain retried": [
        (CrawlOutcome.SUCCESS, "First", '"v1"'),
        (CrawlOutcome.BLOCKED_5XX, None, None),
        (CrawlOutcome.BLOCKED_5XX, None, None, 2),
        (CrawlOutcome.BLOCKED_5XX, None, None, 3),
        (CrawlOutcome.BLOCKED_5XX, None, None),
    ],
    "a 404, then a refusal": [
        (CrawlOutcome.SUCCESS, "First", '"v1"'),
        (CrawlOutcome.BLOCKED_4XX, None, None),
        (CrawlOutcome.BLOCKED_ROBOTS, None, None),
    ],
}

#: Histories whose status, applied newest first, follows the success: the attempt that
#: settled the page arrives after a newer one that kept the status it found.
SETTLED_LATE = {"a 404, then a failure retried", "retries that run out, then a new chain retried"}


#: When the attempts of a history begin: one instant for every page of a test.
START = datetime.now(UTC) - timedelta(hours=3)


def attempts_of(history: str, url: str) -> list[CrawlCompleted]:
    """The attempts of ``history`` on ``url``, a minute apart from ``START``; each
    success links to a page of its own."""
    return [
        completed(
            outcome,
            url=url,
            title=title,
            etag=etag,
            language="en" if title else None,
            links=(Link(url=f"{URL}/from-{n}"),) if title else (),
            status_code=STATUS_CODES.get(outcome, 200),
            attempt=attempt[0] if attempt else 1,
            started_at=START + timedelta(minutes=n, milliseconds=-100),
            completed_at=START + timedelta(minutes=n),
        )
        for n, (outcome, title, etag, *attempt) in enumerate(HISTORIES[history])
    ]


@pytest.mark.parametrize("history", HISTORIES, ids=list(HISTORIES))
async def test_a_pages_row_does_not_depend_on_how_its_attempts_are_cut_into_batches(
    engine: AsyncEngine, history: str
) -> None:
    """A replay applies 500 events a transaction, a recorder catching up a backlog as many,
    a trickle one: a page's attempts in one batch leave its row as one batch each."""
    one_by_one, together = f"{URL}/one-by-one", f"{URL}/together"
    await project(engine, *attempts_of(history, one_by_one))
    async with async_sessionmaker(engine).begin() as session:
        await apply_batch(session, attempts_of(history, together), POLICY)
    row = (
        "SELECT status, last_outcome, last_crawled_at, last_status_code, fetched_at, "
        "failed_at, title, language, etag, keywords_tsv FROM pages WHERE url = :u"
    )
    (each,) = await rows(engine, row, u=one_by_one)
    (batched,) = await rows(engine, row, u=together)
    assert batched == each
    assert each.title is not None


@pytest.mark.parametrize("history", HISTORIES, ids=list(HISTORIES))
async def test_a_pages_content_does_not_depend_on_the_order_its_attempts_arrive_in(
    engine: AsyncEngine, history: str
) -> None:
    """A success redriven from the dead-letter stream, or in a batch that lost a race,
    arrives after a newer attempt: the page still has the newest success's content and
    links, the newest success or 304 as when it was fetched, the newest attempt as its
    last."""
    in_order, reversed_url = f"{URL}/in-order", f"{URL}/reversed"
    await project(engine, *attempts_of(history, in_order))
    await project(engine, *reversed(attempts_of(history, reversed_url)))
    row = (
        "SELECT last_outcome, last_crawled_at, last_status_code, fetched_at, title, language, "
        "etag, keywords_tsv, content_at, linked_at, status, failed_at FROM pages WHERE url = :u"
    )
    (forward,) = await rows(engine, row, u=in_order)
    (backward,) = await rows(engine, row, u=reversed_url)
    assert forward.title is not None
    if history in SETTLED_LATE:
        # The 404, or the 503 whose retries ran out, arriving after the newer 503 that
        # kept the page's status, is not known to be the newest settled attempt: the
        # status follows the success.
        assert (forward.status, backward.status) == ("failed", "fetched")
        assert backward[:-2] == forward[:-2]
    else:
        assert backward == forward
    links = (
        "SELECT t.url FROM page_links l JOIN pages f ON f.id = l.from_page_id "
        "JOIN pages t ON t.id = l.to_page_id WHERE f.url = :u"
    )
    assert [r.url for r in await rows(engine, links, u=reversed_url)] == [
        r.url for r in await rows(engine, links, u=in_order)
    ]


async def test_a_success_arriving_late_makes_a_page_that_failed_before_it_fetched(
    engine: AsyncEngine,
) -> None:
    # A 404, then a success, then a 503 retried: the success arrives last.
    start = datetime.now(UTC) - timedelta(hours=1)
    missing, found, busy = (
        completed(outcome, status_code=code, completed_at=start + timedelta(minutes=n), **more)
        for n, (outcome, code, more) in enumerate(
            [
                (CrawlOutcome.BLOCKED_4XX, 404, {}),
                (CrawlOutcome.SUCCESS, 200, {"title": "Back"}),
                (CrawlOutcome.BLOCKED_5XX, 503, {}),
            ]
        )
    )
    await project(engine, missing, busy, found)
    row = await page(engine)
    assert (row.status, row.failed_at, row.title) == ("fetched", None, "Back")
    assert (row.last_outcome, row.fetched_at) == ("blocked_5xx", found.completed_at)


async def test_a_failure_newer_than_a_late_success_keeps_its_date_however_batched(
    engine: AsyncEngine,
) -> None:
    # A 404 at t2 applied; then a success at t1 (late) and a 503 at t3, retried.
    start = datetime.now(UTC) - timedelta(hours=1)

    def history(url: str) -> list[CrawlCompleted]:
        return [
            completed(outcome, url=url, status_code=code, completed_at=start + timedelta(minutes=n))
            for outcome, code, n in (
                (CrawlOutcome.BLOCKED_4XX, 404, 2),
                (CrawlOutcome.SUCCESS, 200, 1),
                (CrawlOutcome.BLOCKED_5XX, 503, 3),
            )
        ]

    one_by_one, batched = f"{URL}/each", f"{URL}/batched"
    await project(engine, *history(one_by_one))
    missing, *rest = history(batched)
    await project(engine, missing)
    async with async_sessionmaker(engine).begin() as session:
        await apply_batch(session, rest, POLICY)
    for url in (one_by_one, batched):
        row = await page(engine, url)
        assert (row.status, row.failed_at) == ("failed", missing.completed_at), url


async def test_a_row_from_before_its_groups_times_keeps_its_newest_attempt_as_their_floor(
    engine: AsyncEngine,
) -> None:
    # A page whose newest success linked nowhere, projected by a release that kept no
    # content or link times; an older success with links arrives late.
    start = datetime.now(UTC) - timedelta(hours=1)
    newer = completed(title="Newer", completed_at=start + timedelta(minutes=2))
    older = completed(title="Older", links=(Link(url=f"{URL}/old-link"),), completed_at=start)
    await project(engine, newer)
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE pages SET content_at = NULL, linked_at = NULL"))
    await project(engine, older)
    row = await page(engine)
    assert row.title == "Newer"
    assert await rows(engine, "SELECT * FROM page_outlinks") == []


async def test_failures_are_retried_until_attempts_run_out(engine: AsyncEngine) -> None:
    for attempt in (1, 2):
        await project(engine, completed(CrawlOutcome.BLOCKED_5XX, status_code=503, attempt=attempt))
        assert (await page(engine)).status == "discovered"
    await project(engine, completed(CrawlOutcome.FAILED, attempt=3))
    row = await page(engine)
    assert row.status == "failed"
    assert row.failed_at is not None
    retries = [
        decode_event(r.payload)
        for r in await rows(engine, "SELECT payload FROM outbox ORDER BY created_at")
    ]
    assert [r.attempt for r in retries if isinstance(r, CrawlRequested)] == [2, 3]


async def test_a_page_whose_retries_ran_out_is_retried_again_in_its_next_chain(
    engine: AsyncEngine,
) -> None:
    # Three failures in an outage; two months later a link brings the page back, and
    # its first attempt meets one timeout: that chain has its own three attempts.
    start = datetime.now(UTC) - timedelta(days=60)
    for attempt in (1, 2, 3):
        at = start + timedelta(hours=attempt)
        failed = completed(
            CrawlOutcome.FAILED,
            attempt=attempt,
            started_at=at - timedelta(seconds=1),
            completed_at=at,
        )
        await project(engine, failed)
    await project(engine, completed(CrawlOutcome.TIMEOUT, attempt=1))
    retries = [
        decode_event(r.payload)
        for r in await rows(engine, "SELECT payload FROM outbox ORDER BY created_at")
    ]
    assert [r.attempt for r in retries if isinstance(r, CrawlRequested)] == [2, 3, 2]


async def test_a_page_whose_retries_ran_out_is_asked_again_until_it_failed_too_long(
    engine: AsyncEngine,
) -> None:
    # A site down a weekend: its pages come back within a week, not when a link brings
    # them back after their seen keys expire (and a seed nothing links to, never).
    week, month = 7 * 86_400.0, 30 * 86_400.0
    policy = RetryPolicy(
        max_attempts=3, delay_seconds=60.0, max_delay_seconds=week, recheck_for_seconds=month
    )
    now = datetime.now(UTC)

    async def fail_three_times(
        url: str, first: datetime, *, replaying: bool = False, **fields: Any
    ) -> datetime:
        """A chain's three failures from ``first`` on; when the last one ended."""
        for attempt in (1, 2, 3):
            at = first + timedelta(hours=attempt - 1)
            failed = completed(
                CrawlOutcome.TIMEOUT,
                url=url,
                attempt=attempt,
                started_at=at - timedelta(seconds=1),
                completed_at=at,
                **fields,
            )
            await project(engine, failed, policy=policy, replaying=replaying)
        return at

    down, slow, ok, gone = (f"{URL}/{name}" for name in ("down", "slow", "ok", "gone"))
    down_at = await fail_three_times(down, now - timedelta(days=2))
    slow_at = await fail_three_times(slow, now, history=ChangeHistory(interval=2 * week))
    # Fetched 45 days ago, re-crawled without answer two days ago: failing for two days.
    await project(engine, completed(url=ok, completed_at=now - timedelta(days=45)))
    ok_at = await fail_three_times(ok, now - timedelta(days=2))
    # Failing since 31 days ago: its first chain's recheck, projected by a recorder that
    # far behind, goes at once; the chain that fails now is its last.
    gone_at = await fail_three_times(gone, now - timedelta(days=31))
    await fail_three_times(gone, now)
    # A replay of failures of 20 days ago: their recheck, due 13 days ago, fired then or
    # was replaced; decided again, it is not made.
    await fail_three_times(f"{URL}/old", now - timedelta(days=20), replaying=True)
    found = await rows(engine, "SELECT payload, deliver_at FROM outbox ORDER BY deliver_at")
    rechecks = sorted(
        (request.url, deliver_at, request.reason)
        for payload, deliver_at in found
        if isinstance(request := decode_event(payload), CrawlRequested) and request.attempt == 1
    )
    assert rechecks == sorted(
        [
            (down, down_at + timedelta(seconds=week), RequestReason.RECRAWL),
            (slow, slow_at + timedelta(seconds=2 * week), RequestReason.RECRAWL),
            (ok, ok_at + timedelta(seconds=week), RequestReason.RECRAWL),
            (gone, gone_at + timedelta(seconds=week), RequestReason.RECRAWL),
        ]
    )
    # The page is failed meanwhile, as when its chain ended.
    assert (await page(engine, down)).status == "failed"


@pytest.mark.parametrize(
    ("status", "fetched_before", "rechecked"),
    [
        (403, True, True),  # a firewall's, a challenge's
        (200, True, True),  # a challenge sent with a 2xx
        (401, True, True),
        (404, True, True),  # a weekend's broken deploy
        (410, True, False),  # gone for good, as the site says
        (404, False, False),  # a link to nothing
    ],
)
async def test_a_refused_page_fetched_before_is_rechecked_not_retried(
    engine: AsyncEngine, status: int, fetched_before: bool, rechecked: bool
) -> None:
    """A re-crawl that meets a challenge, a 403 or a 404 ended the page's chain: a
    challenge left on a week, a weekend's 404s, took the pages they met out of the crawl
    until their seen keys expired (a seed nothing links to, for good)."""
    week, month = 7 * 86_400.0, 30 * 86_400.0
    policy = RetryPolicy(
        max_attempts=3, delay_seconds=60.0, max_delay_seconds=week, recheck_for_seconds=month
    )
    now = datetime.now(UTC)
    history = ChangeHistory(visited_at=now - timedelta(days=3), interval=86_400.0)
    refused = completed(
        CrawlOutcome.BLOCKED_4XX,
        status_code=status,
        history=history if fetched_before else None,
    )
    await project(engine, refused, policy=policy)
    found = [
        (decode_event(r.payload), r.deliver_at)
        for r in await rows(engine, "SELECT payload, deliver_at FROM outbox")
    ]
    expected = [(refused.completed_at + timedelta(seconds=week), 1, RequestReason.RECRAWL)]
    assert [(at, r.attempt, r.reason) for r, at in found if isinstance(r, CrawlRequested)] == (
        expected if rechecked else []
    )
    assert (await page(engine)).status == "failed"


async def test_an_attempt_asked_first_another_way_is_not_rechecked(engine: AsyncEngine) -> None:
    """A 406 to ActivityPub, the page asked again as a page at once: the page's own
    attempt follows, and a recheck of the first would replace the page's re-crawl."""
    history = ChangeHistory(visited_at=datetime.now(UTC) - timedelta(days=3), interval=86_400.0)
    own = completed(history=history, fetcher="http")
    own = own.model_copy(update={"id": attempt_id(own.request_id)})
    first = completed(
        CrawlOutcome.BLOCKED_4XX,
        status_code=406,
        history=history,
        fetcher="activitypub",
        id=explored_attempt_id(own.id),
    )
    policy = RetryPolicy(max_delay_seconds=86_400.0, recheck_for_seconds=30 * 86_400.0)
    await project(engine, first, own, policy=policy)
    assert await rows(engine, "SELECT payload FROM outbox") == []


async def test_retry_waits_for_retry_after_when_longer(engine: AsyncEngine) -> None:
    event = completed(CrawlOutcome.BLOCKED_4XX, status_code=429, retry_after=7200.0)
    await project(engine, event)
    (row,) = await rows(engine, "SELECT deliver_at FROM outbox")
    assert row.deliver_at - event.completed_at == timedelta(seconds=7200)


async def test_seed_rejections_are_recorded_with_their_reason(engine: AsyncEngine) -> None:
    await project(
        engine,
        SeedRejected(
            raw="ftp://x",
            reason="scheme 'ftp' is not http or https",
            provenance=Provenance(kind="seed"),
        ),
    )
    (row,) = await rows(engine, "SELECT raw, reason FROM seed_rejections")
    assert (row.raw, row.reason) == ("ftp://x", "scheme 'ftp' is not http or https")


async def test_a_batch_whose_transaction_rolls_back_leaves_nothing(engine: AsyncEngine) -> None:
    """The statements run on asyncpg's connection, inside the session's transaction:
    whatever ends it without a commit takes every row of the batch with it."""
    event = completed(
        CrawlOutcome.TIMEOUT,
        error_message="read timeout",
        links=(Link(url="https://blog.example/a"),),
    )
    sessions = async_sessionmaker(engine)
    applied = []

    async def project_then_fail() -> None:
        async with sessions.begin() as session:
            applied.append((await apply_batch(session, [event], POLICY)).count)
            raise LookupError("a failure after the projection, before the commit")

    with pytest.raises(LookupError, match="after the projection"):
        await project_then_fail()
    assert applied == [1]
    for table in (
        "projected_events",
        "pages",
        "page_crawls",
        "page_outlinks",
        "fetcher_attempts",
        "attempt_heuristics",
        "host_policies",
        "outbox",
    ):
        assert await rows(engine, f"SELECT 1 FROM {table}") == [], table  # noqa: S608
    assert await project(engine, event) == [True]
