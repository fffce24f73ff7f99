"""The recorder as a real process: retries, poison messages, crashes, replay."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, async_sessionmaker

from tests.conftest import StackUrls, eventually
from tests.ports import free_port
from tests.support import outcomes, publish_work, query, ready, sandbox_env, services
from trove_recorder.projections import apply_batch
from trove_recorder.recorder import Recorder
from trove_recorder.replay import REPLAY_LOCK, release_held_retries
from trove_recorder.retries import RetryPolicy
from trove_sandbox.server import serve_sandbox
from trove_sandbox.web import SandboxWeb
from trove_schema.bus import Bus
from trove_schema.events import (
    CrawlCompleted,
    CrawlOutcome,
    CrawlRequested,
    Link,
    RequestReason,
    Scope,
    utcnow,
)
from trove_schema.topology import CRAWL_COMPLETED, DEAD_STREAM

pytestmark = pytest.mark.usefixtures("clean")


def pending_retry() -> CrawlRequested:
    """A page's second attempt, due in an hour: an outbox row's event."""
    return CrawlRequested(
        url="https://blog.example/1",
        domain="blog.example",
        scope=Scope(value="blog.example"),
        reason=RequestReason.RETRY,
        attempt=2,
        not_before=utcnow() + timedelta(hours=1),
    )


async def put_in_outbox(conn: AsyncConnection, retry: CrawlRequested) -> None:
    """``retry`` in the outbox, due at its ``not_before``, as the recorder writes one."""
    await conn.execute(
        text(
            "INSERT INTO outbox (event_id, subject, payload, deliver_at) "
            "VALUES (:id, :subject, :payload, :due)"
        ),
        {
            "id": retry.id,
            "subject": CrawlRequested.SUBJECT,
            "payload": retry.to_wire(),
            "due": retry.not_before,
        },
    )


def completed(n: int, links: int = 3) -> CrawlCompleted:
    now = utcnow()
    return CrawlCompleted(
        url=f"https://blog.example/{n}",
        domain="blog.example",
        scope=Scope(value="blog.example"),
        request_id=f"00000000-0000-0000-0000-{n:012d}",
        outcome=CrawlOutcome.SUCCESS,
        started_at=now,
        completed_at=now,
        title=f"Post {n}",
        links=tuple(
            Link(url=f"https://blog.example/{(n + k) % 3000}") for k in range(1, links + 1)
        ),
    )


async def count(engine: AsyncEngine, table: str) -> int:
    (row,) = await query(engine, f"SELECT count(*) AS n FROM {table}")  # noqa: S608 - test tables
    return int(row.n)


async def test_a_poison_message_is_parked_with_its_reason_and_the_rest_goes_on(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    async with services(stack, state_dir, {}, only=("recorder",)):
        await bus.js.publish(
            CRAWL_COMPLETED, b"this is not an event", headers={"Nats-Msg-Id": "p1"}
        )
        await bus.publish(completed(1))

        async def parked() -> int:
            info = await bus.js.stream_info(DEAD_STREAM)
            return info.state.messages

        await eventually(parked, until=lambda n: n >= 1, timeout=30, what="a parked message")
        await eventually(
            lambda: count(engine, "page_crawls"), until=lambda n: n == 1, timeout=30, what="row"
        )
    dead = await bus.js.get_last_msg(DEAD_STREAM, "trove.dead.recorder")
    assert dead.data == b"this is not an event"
    assert dead.headers is not None
    assert "malformed" in dead.headers["Trove-Dead-Reason"]


async def test_failures_are_retried_then_the_page_fails_after_three_attempts(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    web = SandboxWeb.generate(hosts=1, pages_per_host=1, with_trap=True)
    trap = web.trap_host
    assert trap is not None
    env = sandbox_env(web, 0.1, TROVE_RETRY_DELAY_SECONDS="1", TROVE_MAX_ATTEMPTS="3")
    async with serve_sandbox(web) as running, services(stack, state_dir, env):
        url = web.url(trap, "/status/503?after=2")
        await publish_work(bus, [url])

        async def history() -> list[tuple[str, str | None, int]]:
            rows = await query(
                engine,
                "SELECT c.outcome, p.status, c.attempt FROM page_crawls c "
                "JOIN pages p ON p.id = c.page_id ORDER BY c.completed_at",
            )
            return [(r.outcome, r.status, r.attempt) for r in rows]

        rows = await eventually(
            history,
            until=lambda h: len(h) >= 3 and h[-1][1] == "failed",
            timeout=60,
            what="three attempts, then failed",
        )
        requests = [r for r in running.witness.requests(trap) if r.path.startswith("/status/")]
    assert [(o, a) for o, _, a in rows] == [
        ("blocked_5xx", 1),
        ("blocked_5xx", 2),
        ("blocked_5xx", 3),
    ]
    assert len(requests) == 3
    # Retry-After (2 s, past the retry delay of 1 s) was honoured between attempts.
    gaps = [b.monotonic - a.monotonic for a, b in itertools.pairwise(requests)]
    assert all(g >= 2.0 for g in gaps), gaps
    # The fetcher's pause of the host keeps those gaps too: each retry itself was due
    # 2 s after the attempt it follows.
    retries = await query(
        engine,
        "SELECT extract(epoch FROM o.deliver_at - c.completed_at) AS due_in "
        "FROM page_crawls c JOIN page_crawls n ON n.page_id = c.page_id "
        "AND n.attempt = c.attempt + 1 JOIN outbox o ON o.event_id = n.request_id",
    )
    assert [float(r.due_in) for r in retries] == [2.0, 2.0]
    (page,) = await query(engine, "SELECT failed_at FROM pages")
    assert page.failed_at is not None


async def test_a_recorder_killed_mid_stream_loses_and_duplicates_nothing(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    total = 3000
    events = [completed(n, links=20) for n in range(total)]
    await asyncio.gather(*(bus.publish(event) for event in events))
    small_batches = {"TROVE_BATCH_SIZE": "20"}  # many transactions: the kill lands mid-stream
    async with services(stack, state_dir / "first", small_batches, only=("recorder",)) as local:
        await eventually(
            lambda: count(engine, "page_crawls"),
            until=lambda n: n >= 1,
            timeout=60,
            interval=0.02,
            what="the first rows",
        )
        (child,) = local.children
        os.killpg(child.pid, signal.SIGKILL)  # no goodbye: mid-transaction, before acks
        child.proc.wait(10)
        local.children.clear()
    killed_at = await count(engine, "page_crawls")
    async with services(stack, state_dir / "second", {}, only=("recorder",)):
        await eventually(
            lambda: count(engine, "page_crawls"),
            until=lambda n: n >= total,
            timeout=120,
            what="all",
        )
    assert killed_at < total, "the recorder finished before it was killed: the test proves nothing"
    assert await count(engine, "page_crawls") == total
    assert await count(engine, "projected_events") == total
    (row,) = await query(engine, "SELECT count(DISTINCT event_id) AS n FROM page_crawls")
    assert row.n == total
    assert len(await outcomes(engine)) == total


async def test_remembered_page_ids_are_dropped_when_the_pages_table_is_emptied(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    """The recorder's URL -> id memory must not outlive the rows it remembers."""

    async def edges() -> set[tuple[str, str]]:
        rows = await query(
            engine,
            "SELECT f.url AS source, t.url AS target FROM page_links l "
            "JOIN pages f ON f.id = l.from_page_id JOIN pages t ON t.id = l.to_page_id",
        )
        return {(r.source, r.target) for r in rows}

    async with services(stack, state_dir, {}, only=("recorder",)):
        await bus.publish(completed(1))  # links to /2, /3, /4: the recorder remembers them
        await eventually(edges, until=lambda e: len(e) == 3, timeout=30, what="first edges")
        async with engine.begin() as conn:  # new ids from 1 again, in another order
            await conn.execute(text("TRUNCATE pages, page_crawls, page_outlinks RESTART IDENTITY"))
            await conn.execute(
                text("INSERT INTO pages (url, domain) VALUES (:u, 'blog.example')"),
                [{"u": f"https://blog.example/{n}"} for n in (9, 8, 7, 6, 5, 4, 3, 2, 1)],
            )
        await bus.publish(completed(1))  # the same links again, now under other ids
        want = {("https://blog.example/1", f"https://blog.example/{n}") for n in (2, 3, 4)}
        await eventually(edges, until=lambda e: e == want, timeout=30, what="edges by url")


async def test_a_stopping_recorder_does_not_sit_out_its_idle_outbox_pause(
    stack: StackUrls, state_dir: Path
) -> None:
    # An idle recorder's outbox pauses grow 1, 2, 4, 8 s, up to the default 30: a
    # SIGTERM must not wait for the pause to end (Kubernetes kills a pod after 30 s).
    port = free_port("127.0.0.1")
    async with services(
        stack, state_dir, {"TROVE_HTTP_PORT": str(port)}, only=("recorder",)
    ) as local:
        await ready(port)
        # Idle for the duration under test: the outbox is in its 8 s pause from ~7 s on.
        await asyncio.sleep(7.5)
        (child,) = local.children
        asked = time.monotonic()
        child.proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(child.proc.wait, 30)
        took = time.monotonic() - asked
        local.children.clear()
    assert code == 0
    # Sitting the pause out would take 7.5 s more; a stop on a machine shared with other
    # tests (consumers closed, the engine disposed, the interpreter's exit) may take 2.
    assert took < 4.0, f"took {took:.1f}s to stop"


async def test_an_outbox_row_no_pod_was_woken_for_is_published_however_long_it_was_idle(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    # A recorder that died between its commit and its publish leaves a row that no pod is
    # woken for. An idle recorder looks less and less often, but never less than this.
    longest = 2.0
    port = free_port("127.0.0.1")
    env = {"TROVE_OUTBOX_POLL_MAX_SECONDS": str(longest), "TROVE_HTTP_PORT": str(port)}
    retry = pending_retry()

    async def sent() -> bool:
        rows = await query(engine, "SELECT published_at FROM outbox")
        return bool(rows) and rows[0].published_at is not None

    async with services(stack, state_dir, env, only=("recorder",)):
        # The outbox's first look comes as the recorder reports ready.
        await ready(port)
        # Idle for the duration under test: without the bound its pauses (1, 2, 4, 8 s)
        # would leave the row below unseen for ~7 s.
        await asyncio.sleep(4 * longest)
        async with engine.begin() as conn:
            await put_in_outbox(conn, retry)
        await eventually(sent, until=bool, timeout=2 * longest + 1, what="the row published")


@pytest.mark.usefixtures("clean")
async def test_outbox_rows_this_release_cannot_read_are_passed_over_and_the_rest_published(
    bus: Bus, engine: AsyncEngine
) -> None:
    # What a newer release wrote, read by the one rolled back to: a whole batch of them
    # (the publisher reads 100 rows at a time), then a retry it can read.
    unreadable = b'{"type":"CrawlRequested","version":1,"reason":"from-a-newer-release"}'
    retry = pending_retry()
    insert = text(
        "INSERT INTO outbox (event_id, subject, payload, deliver_at, created_at) "
        "VALUES (:id, :subject, :payload, :due, now() - make_interval(secs => :age))"
    )
    async with engine.begin() as conn:
        for n in range(100):
            row = {"id": uuid.uuid4(), "subject": CrawlRequested.SUBJECT, "payload": unreadable}
            await conn.execute(insert, {**row, "due": None, "age": 1000 - n})
        await conn.execute(
            insert,
            {
                "id": retry.id,
                "subject": CrawlRequested.SUBJECT,
                "payload": retry.to_wire(),
                "due": retry.not_before,
                "age": 0,
            },
        )
    recorder = Recorder(engine, bus, RetryPolicy())
    assert await recorder._publish_batch() == 0  # the unreadable batch, passed over
    assert await recorder._publish_batch() == 1  # then the retry behind it
    rows = await query(engine, "SELECT event_id, published_at FROM outbox")
    published = {row.event_id for row in rows if row.published_at is not None}
    assert published == {uuid.UUID(str(retry.id))}
    assert len(rows) == 101


@pytest.mark.usefixtures("clean")
async def test_an_outbox_row_the_broker_refuses_is_passed_over_and_the_rest_published(
    bus: Bus, engine: AsyncEngine
) -> None:
    # A retry meant for a subject the events stream does not take (a release that
    # routes it elsewhere, rolled back from): nats-server refuses its schedule (400,
    # "target is invalid"), and that refusal stopped the pass at it, every retry
    # created after it held for ever.
    refused, retry = pending_retry(), pending_retry().model_copy(update={"id": str(uuid.uuid4())})
    insert = text(
        "INSERT INTO outbox (event_id, subject, payload, deliver_at, created_at) "
        "VALUES (:id, :subject, :payload, :due, now() - make_interval(secs => :age))"
    )
    async with engine.begin() as conn:
        for event, subject, age in (
            (refused, "trove.elsewhere.requested", 10),
            (retry, CrawlRequested.SUBJECT, 0),
        ):
            await conn.execute(
                insert,
                {
                    "id": event.id,
                    "subject": subject,
                    "payload": event.to_wire(),
                    "due": event.not_before,
                    "age": age,
                },
            )
    recorder = Recorder(engine, bus, RetryPolicy())
    assert await recorder._publish_batch() == 1
    rows = await query(engine, "SELECT event_id, published_at FROM outbox")
    published = {row.event_id: row.published_at is not None for row in rows}
    assert published == {uuid.UUID(str(retry.id)): True, uuid.UUID(str(refused.id)): False}


async def test_retries_a_killed_replay_held_are_released_by_the_live_recorder(
    bus: Bus, engine: AsyncEngine
) -> None:
    # A replay holds the retries it decides until it ends; one killed outright (a
    # SIGKILL, its terminal closed) released none, and they never went out.
    held, due = pending_retry(), pending_retry().model_copy(update={"id": str(uuid.uuid4())})
    async with engine.begin() as conn:
        for retry, held_by_replay in ((held, True), (due, False)):
            await conn.execute(
                text(
                    "INSERT INTO outbox (event_id, subject, payload, deliver_at, published_at) "
                    "VALUES (:id, :subject, :payload, :due, "
                    "CASE WHEN :held THEN timestamptz 'infinity' END)"
                ),
                {
                    "id": retry.id,
                    "subject": CrawlRequested.SUBJECT,
                    "payload": retry.to_wire(),
                    "due": retry.not_before,
                    "held": held_by_replay,
                },
            )

    async def published(retry: CrawlRequested) -> str:
        (row,) = await query(
            engine,
            "SELECT CASE WHEN published_at IS NULL THEN 'pending' "
            "WHEN published_at = 'infinity' THEN 'held' ELSE 'sent' END AS state "
            "FROM outbox WHERE event_id = :id",
            id=retry.id,
        )
        return str(row.state)

    recorder = Recorder(engine, bus, RetryPolicy())
    async with engine.connect() as replaying:  # a replay running: its hold stands
        await replaying.execute(text("SELECT pg_advisory_lock(:k)"), {"k": REPLAY_LOCK})
        assert await recorder._publish_batch() == 1
        assert (await published(held), await published(due)) == ("held", "sent")
        await replaying.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": REPLAY_LOCK})
    # The replay's lock is gone: the next look lets its hold go, and publishes it.
    assert await recorder._publish_batch() == 1
    assert await published(held) == "sent"


async def test_a_held_retry_its_pages_chain_went_on_without_is_not_sent(
    bus: Bus, engine: AsyncEngine
) -> None:
    # A retry decided again by a replay, which another request replaced on the page's
    # schedule subject before it fired (so it is not in the record): sent when the hold
    # ends, it would replace what the page has pending now.
    start = utcnow() - timedelta(days=3)
    sessions = async_sessionmaker(engine)
    first, later, other = (
        completed(n).model_copy(
            update={
                "outcome": CrawlOutcome.TIMEOUT,
                "completed_at": start + timedelta(hours=n),
                "url": "https://blog.example/overtaken" if n < 3 else "https://blog.example/not",
            }
        )
        for n in (1, 2, 3)
    )
    async with sessions.begin() as session:
        await apply_batch(session, [first, later, other], RetryPolicy())
    overtaken = pending_retry().model_copy(update={"caused_by": first.id})
    standing = pending_retry().model_copy(update={"id": str(uuid.uuid4()), "caused_by": other.id})
    # And ones this release cannot read (a newer one wrote them, or not JSON, or with a
    # cause that is no uuid): released as they are, the others' release not stopped.
    unread = [str(uuid.uuid4()) for _ in range(3)]
    rows = [
        (overtaken.id, overtaken.to_wire()),
        (standing.id, standing.to_wire()),
        (unread[0], b'{"type":"CrawlRequested","version":1,"reason":"from-a-newer-release"}'),
        (unread[1], b"\xff\xfe not json"),
        (unread[2], b'{"type":"CrawlRequested","version":1,"caused_by":"not-a-uuid"}'),
    ]
    async with engine.begin() as conn:
        await conn.execute(text("DELETE FROM outbox"))
        for event_id, payload in rows:
            await conn.execute(
                text(
                    "INSERT INTO outbox (event_id, subject, payload, deliver_at, published_at) "
                    "VALUES (:id, :subject, :payload, :due, timestamptz 'infinity')"
                ),
                {
                    "id": event_id,
                    "subject": CrawlRequested.SUBJECT,
                    "payload": payload,
                    "due": overtaken.not_before,
                },
            )
        await release_held_retries(conn)
    found = await query(engine, "SELECT event_id, published_at FROM outbox")
    state = {str(r.event_id): r.published_at is not None for r in found}
    assert state == {overtaken.id: True, standing.id: False} | dict.fromkeys(unread, False)
