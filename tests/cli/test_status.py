"""``trove status`` against a real NATS (JetStream, KV) and Postgres, no service running."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.support import run_trove
from trove_cli import status as status_module
from trove_cli.status import (
    ASKED_BY_ITS_ANSWER,
    ConsumerLag,
    Cooldown,
    Status,
    collect_status,
    render_status,
    size,
)
from trove_fetcher.politeness import DomainSlot, Granted, Politeness, PolitenessConfig
from trove_schema import server_time as server_time_module
from trove_schema.bus import Bus
from trove_schema.policy import HostPolicy
from trove_schema.server_time import server_now
from trove_schema.tables import REBUILD_LOCK
from trove_schema.topology import (
    CRAWL_COMPLETED,
    DEAD_PREFIX,
    DISCOVERY_LINKS,
    DOMAINS_BUCKET,
    EVENTS_STREAM,
    FETCHER,
    PAGE_DISCOVERED,
    RECORDER,
    SEEN_BUCKET,
)

pytestmark = pytest.mark.usefixtures("clean")


def slot(**times: float) -> bytes:
    """A DomainSlot record as the fetcher writes it."""
    fields = {"free_at": 0.0, "busy_until": 0.0, "next": 0.0, "gap": 10.0, "backoff_until": 0.0}
    return json.dumps(fields | times, separators=(",", ":")).encode()


def lag(status: Status, durable: str) -> ConsumerLag:
    (found,) = [c for c in status.consumers if c.durable == durable]
    return found


async def test_the_fetchers_instants_are_read_on_the_servers_clock_not_this_machines(
    bus: Bus, engine: AsyncEngine
) -> None:
    # The fetchers keep politeness on nats-server's time; an operator's machine an hour
    # behind must not show a two-minute back-off as an hour and two minutes.
    server = await server_now(bus.nc)
    assert abs(server - time.time()) < 1.0  # one machine here: the same clock
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    await kv.put("slow.example", slot(backoff_until=server + 120))

    status = await collect_status(bus.js, engine, now=server - 3600, server_now=server)

    ((domain, left),) = [(c.domain, c.seconds_left) for c in status.backing_off]
    assert domain == "slow.example"
    assert 119 < left <= 120


async def test_the_status_command_prints_a_pause_on_the_servers_clock_not_this_machines(
    stack: StackUrls, bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The operator's machine an hour behind nats-server (one machine here: the real
    # clock is the server's): the fetchers' two-minute pause must still print as two.
    server = time.time()
    behind = SimpleNamespace(time=lambda: time.time() - 3600, monotonic=time.monotonic)
    monkeypatch.setattr(status_module, "time", behind)
    monkeypatch.setattr(server_time_module, "time", behind)
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    await kv.put("slow.example", slot(backoff_until=server + 120))
    out = io.StringIO()

    code = await status_module.status_command(
        stack.nats_url, stack.database_url, Console(file=out, width=200, color_system=None)
    )

    assert code == 0
    printed = out.getvalue()
    row = next(line for line in printed.splitlines() if line.startswith("slow.example "))
    left = re.search(r"(\d+)m (\d\d)s", row)
    assert left is not None, row
    assert 115 <= int(left[1]) * 60 + int(left[2]) <= 120, row


async def test_backing_off_domain_is_listed_with_its_seconds_left(
    bus: Bus, engine: AsyncEngine
) -> None:
    now = time.time()
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    await kv.put("slow.example", slot(backoff_until=now + 120, next=now + 300, free_at=now + 120))
    await kv.put("later.example", slot(backoff_until=now + 30))
    await kv.put("queued.example", slot(next=now + 40, busy_until=now + 25))
    await kv.put("idle.example", slot(free_at=now - 5, next=now - 5, backoff_until=now - 60))
    await kv.put("broken.example", b"not a slot")
    await kv.put("gone.example", slot(backoff_until=now + 999))
    await kv.delete("gone.example")

    status = await collect_status(bus.js, engine, now=now)

    assert [(c.domain, round(c.seconds_left, 6)) for c in status.backing_off] == [
        ("slow.example", 120.0),
        ("later.example", 30.0),
    ]
    assert status.queued_domains == 2
    assert status.longest_queue is not None
    assert status.longest_queue.domain == "slow.example"
    assert status.longest_queue.seconds_left == pytest.approx(300.0)
    assert status.fetching_domains == 1
    assert status.unreadable_slots == 1


@pytest.mark.parametrize(
    "record",
    [b'{"backoff_until": 1' + b"0" * 400 + b"}", b'{"backoff_until": 1e400}', b'{"next": "inf"}'],
    ids=["an-integer-past-a-float", "an-infinity", "infinity-as-text"],
)
async def test_a_host_record_of_times_no_report_can_show_is_counted_unreadable(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, record: bytes
) -> None:
    """A hand-made record: one of these stopped the whole report (an OverflowError
    reading it, or drawing its pause's seconds left)."""
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    await kv.put("odd.example", record)
    out = io.StringIO()

    code = await status_module.status_command(
        stack.nats_url, stack.database_url, Console(file=out, width=200, color_system=None)
    )

    assert code == 0
    assert "odd.example" not in out.getvalue()
    status = await collect_status(bus.js, engine, now=time.time())
    assert status.unreadable_slots == 1


async def test_a_bucket_of_more_host_records_than_it_reads_is_counted_in_part_and_says_so(
    bus: Bus, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A crawl of months keeps a record for each host of half a year: the command reads
    # a bounded number, keeping none of them, and says its counts are of a part.
    monkeypatch.setattr(status_module, "MAX_SLOTS", 3)
    now = time.time()
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    for n in range(7):
        await kv.put(f"h{n}.example", slot(next=now + 60))
    status = await collect_status(bus.js, engine, now=now)
    assert (status.domains_read, status.domains_total) == (3, 7)
    assert status.queued_domains == 3
    out = io.StringIO()
    render_status(status, Console(file=out, width=200))
    assert "Counted over the first 3 host records of 7" in out.getvalue()


async def test_a_host_record_written_while_it_is_read_is_counted_once(
    bus: Bus, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A busy host's slot changes every few seconds, and reading a crawl's records takes
    # seconds: its news after the read began is not another host.
    monkeypatch.setattr(status_module, "BATCH", 1)
    now = time.time()
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    for name in ("a.example", "b.example", "c.example"):
        await kv.put(name, slot(next=now + 60))
    writes: list[asyncio.Task[int]] = []
    seen: list[str] = []

    def visit(domain: str, value: bytes) -> None:
        seen.append(domain)
        if len(seen) == 1:  # the first host's record changes while the others are read
            writes.append(asyncio.create_task(kv.put(domain, slot(next=now + 61))))

    handed, total = await status_module.visit_slots(bus.js, visit, limit=None)
    await asyncio.gather(*writes)

    assert sorted(seen) == ["a.example", "b.example", "c.example"]
    assert (handed, total) == (3, 3)


async def test_a_backoff_that_has_passed_is_not_listed(bus: Bus, engine: AsyncEngine) -> None:
    now = time.time()
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    await kv.put("slow.example", slot(backoff_until=now + 120))

    later = await collect_status(bus.js, engine, now=now + 121)

    assert later.backing_off == []
    assert later.queued_domains == 0
    assert later.longest_queue is None


async def test_consumer_lag_counts_discovered_pages_no_consumer_has_taken(
    bus: Bus, engine: AsyncEngine
) -> None:
    for i in range(3):
        await bus.js.publish(PAGE_DISCOVERED, f"page {i}".encode())

    status = await eventually(
        lambda: collect_status(bus.js, engine),
        until=lambda s: lag(s, FETCHER).pending == 3 and lag(s, RECORDER).pending == 3,
        timeout=10,
        what="3 pending for the fetcher and the recorder",
    )

    assert lag(status, FETCHER) == ConsumerLag(EVENTS_STREAM, FETCHER, pending=3)
    assert lag(status, DISCOVERY_LINKS).pending == 0  # it reads crawl.completed only
    assert all(c.exists for c in status.consumers)


async def test_in_flight_and_redelivered_messages_are_reported(
    bus: Bus, engine: AsyncEngine
) -> None:
    await bus.js.publish(PAGE_DISCOVERED, b"page")
    sub = await bus.js.pull_subscribe_bind(FETCHER, stream=EVENTS_STREAM)
    try:
        (msg,) = await sub.fetch(1, timeout=5)
        await msg.nak()  # given back at once: the next delivery is a redelivery
        (again,) = await sub.fetch(1, timeout=5)
        assert again.metadata.num_delivered == 2

        status = await collect_status(bus.js, engine)
    finally:
        await sub.unsubscribe()

    assert lag(status, FETCHER) == ConsumerLag(
        EVENTS_STREAM, FETCHER, pending=0, ack_pending=1, redelivered=1
    )


async def test_a_consumer_that_does_not_exist_is_reported_not_fatal(
    bus: Bus, engine: AsyncEngine
) -> None:
    await bus.js.delete_consumer(EVENTS_STREAM, RECORDER)

    status = await collect_status(bus.js, engine)

    assert lag(status, RECORDER) == ConsumerLag(EVENTS_STREAM, RECORDER, exists=False)
    assert lag(status, FETCHER).exists


async def test_dead_letters_are_counted_per_consumer(bus: Bus, engine: AsyncEngine) -> None:
    before = await collect_status(bus.js, engine)
    await bus.js.publish(
        f"{DEAD_PREFIX}.recorder", b"{not json", headers={"Trove-Dead-Reason": "malformed"}
    )

    status = await collect_status(bus.js, engine)

    assert before.dead_letters == 0
    assert status.dead_letters == 1
    assert status.dead_by_consumer == {"recorder": 1}


async def test_the_oldest_parked_message_says_how_long_it_has_waited(
    bus: Bus, engine: AsyncEngine
) -> None:
    await bus.js.publish(f"{DEAD_PREFIX}.recorder", b"first", headers={"Trove-Dead-Reason": "x"})
    await bus.js.publish(f"{DEAD_PREFIX}.fetcher", b"second", headers={"Trove-Dead-Reason": "y"})

    status = await collect_status(bus.js, engine, now=time.time() + 3 * 3600)
    out = io.StringIO()
    render_status(status, Console(file=out, width=200, color_system=None))

    assert status.dead_oldest_seconds == pytest.approx(3 * 3600, abs=30)
    assert "Dead letters: 2 (fetcher 1, recorder 1), oldest parked 3h 00m ago" in out.getvalue()


async def test_tables_give_pages_by_status_attempts_by_outcome_and_the_outbox_backlog(
    engine: AsyncEngine, bus: Bus
) -> None:
    now = time.time()
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO pages (url, domain, status, discovered_at) VALUES "
                "('https://a.example/', 'a.example', 'fetched', now()), "
                "('https://a.example/1', 'a.example', 'fetched', now()), "
                "('https://a.example/2', 'a.example', 'failed', now()), "
                "('https://a.example/3', 'a.example', 'discovered', now()), "
                "('https://a.example/logo.png', 'a.example', 'discovered', NULL)"
            )
        )
        for outcome, n in (("success", 2), ("timeout", 3), ("blocked_5xx", 1)):
            for _ in range(n):
                await conn.execute(
                    text(
                        "INSERT INTO page_crawls (page_id, domain, outcome, started_at, "
                        "completed_at, duration_ms, event_id) SELECT id, domain, :outcome, "
                        "now(), now(), 10, :event_id FROM pages WHERE url = 'https://a.example/'"
                    ),
                    {"outcome": outcome, "event_id": uuid.uuid4()},
                )
        for age, published in ((90, "no"), (30, "no"), (500, "yes"), (900, "held")):
            await conn.execute(
                text(
                    "INSERT INTO outbox (event_id, subject, payload, created_at, published_at) "
                    "VALUES (:id, 'trove.events.crawl.requested', '\\x7b7d', "
                    "to_timestamp(:created), CASE :published WHEN 'yes' THEN now() "
                    "WHEN 'held' THEN 'infinity'::timestamptz END)"
                ),
                {"id": uuid.uuid4(), "created": now - age, "published": published},
            )

    status = await collect_status(bus.js, engine, now=now)

    assert status.pages_by_status == {"discovered": 1, "failed": 1, "fetched": 2}
    assert status.linked_only == 1
    assert status.attempts_by_outcome == {"timeout": 3, "success": 2, "blocked_5xx": 1}
    assert status.outbox_backlog == 2
    assert status.outbox_oldest_seconds == pytest.approx(90.0, abs=0.01)
    assert status.outbox_held == 1  # a replay's, until it ends


async def test_a_whole_replay_is_shown_running_or_stopped_with_what_finishes_it(
    engine: AsyncEngine, bus: Bus
) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO rebuild_marks (started_at, applied_until) "
                "VALUES ('2026-12-01T10:00Z', '2026-12-01T11:30Z')"
            )
        )
    async with engine.connect() as replaying:
        await replaying.execute(text("SELECT pg_advisory_lock(:k)"), {"k": REBUILD_LOCK})
        running = await collect_status(bus.js, engine)
        await replaying.execute(text("SELECT pg_advisory_unlock_all()"))
    stopped = await collect_status(bus.js, engine)

    assert running.rebuild is not None
    assert running.rebuild[2]
    assert stopped.rebuild is not None
    assert not stopped.rebuild[2]
    shown = {}
    for name, status in (("running", running), ("stopped", stopped)):
        out = io.StringIO()
        render_status(status, Console(file=out, width=300))
        shown[name] = out.getvalue()
    assert (
        "A whole replay is rebuilding the tables (since 2026-12-01T10:00:00+00:00)"
        in shown["running"]
    )
    assert "stopped before its end" in shown["stopped"]
    assert "`trove replay --since 2026-12-01T11:30:00+00:00` finishes it" in shown["stopped"]
    assert (await collect_status(bus.js, engine)).rebuild is not None
    async with engine.begin() as conn:
        await conn.execute(text("DELETE FROM rebuild_marks"))
    assert (await collect_status(bus.js, engine)).rebuild is None


async def test_tables_of_months_are_counted_from_a_sample(
    engine: AsyncEngine, bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A status of tens of millions of pages reads a sample of the table's blocks, not
    # the table: here 40,000 pages, over the (lowered) limit, sampled at a tenth.
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO pages (url, domain, status, discovered_at) "
                "SELECT 'https://a.example/' || n, 'a.example', "
                "CASE WHEN n % 4 = 0 THEN 'failed' ELSE 'fetched' END, now() "
                "FROM generate_series(1, 40000) AS n"
            )
        )
        await conn.execute(text("ANALYZE pages"))
    monkeypatch.setattr(status_module, "SAMPLE_ROWS", 4_000)

    status = await collect_status(bus.js, engine, exact_rows=10_000)

    assert status.pages_estimated
    assert not status.attempts_estimated  # an empty table is counted
    assert status.pages_by_status.keys() == {"failed", "fetched"}
    assert status.pages_by_status["fetched"] == pytest.approx(30_000, rel=0.1)
    assert status.pages_by_status["failed"] == pytest.approx(10_000, rel=0.1)
    out = io.StringIO()
    render_status(status, Console(file=out, width=200, color_system=None))
    assert "Pages by status (estimated from a sample)" in out.getvalue()
    assert f"≈{status.pages_by_status['fetched']}" in out.getvalue()


async def test_an_empty_crawl_has_nothing_to_report(bus: Bus, engine: AsyncEngine) -> None:
    status = await collect_status(bus.js, engine)

    assert status.pages_by_status == {}
    assert status.attempts_by_outcome == {}
    assert status.backing_off == []
    assert status.queued_domains == 0
    assert status.dead_letters == 0
    assert status.outbox_backlog == 0
    assert status.outbox_oldest_seconds is None
    assert {c.durable for c in status.consumers} == {
        "discovery-seeds",
        "discovery-follows",
        "discovery-links",
        "fetcher",
        "fetcher-deferred",
        "recorder",
    }


async def test_the_store_shows_what_the_record_and_the_buckets_take(
    bus: Bus, engine: AsyncEngine
) -> None:
    before = await collect_status(bus.js, engine)
    await bus.js.publish(CRAWL_COMPLETED, b"x" * 50_000)
    seen = await bus.js.key_value(SEEN_BUCKET)
    await seen.put("k", b"y" * 20_000)

    after = await collect_status(bus.js, engine)

    assert before.store_bytes is not None
    assert after.store_bytes is not None
    assert after.store_bytes - before.store_bytes >= 70_000
    grew = {k: v - before.store_by_stream.get(k, 0) for k, v in after.store_by_stream.items()}
    assert grew[EVENTS_STREAM] >= 50_000
    assert grew["buckets"] >= 20_000
    assert next(iter(after.store_by_stream)) == EVENTS_STREAM  # largest first
    assert after.store_limit is None  # the test server's account has no limit


async def test_a_paused_domain_is_listed_with_why_its_policy_paused_it(
    bus: Bus, engine: AsyncEngine
) -> None:
    # Not every pause is a 429's: a challenge page or a ban pauses a host too.
    now = time.time()
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    policy = HostPolicy(paused_until=now + 3600, pause_reason="challenge")
    await kv.put("walled.example", DomainSlot(backoff_until=now + 3600, policy=policy).encode())
    await kv.put("slow.example", slot(backoff_until=now + 120))  # an older pod's record

    status = await collect_status(bus.js, engine, now=now)
    out = io.StringIO()
    render_status(status, Console(file=out, width=120, color_system=None))

    assert [(c.domain, c.reason) for c in status.backing_off] == [
        ("walled.example", "challenge"),
        ("slow.example", None),
    ]
    assert "Domains paused" in out.getvalue()
    assert re.search(r"walled\.example\W+1h 00m\W+challenge", out.getvalue())


async def test_a_wait_a_polls_answer_asked_is_listed_as_such_not_as_an_old_pause(
    bus: Bus, engine: AsyncEngine
) -> None:
    """A poll's request released with the wait its answer asked (a spent rate limit):
    the host backs off before the poll folds the answer into its policy, whose last
    pause, long over, was a ban's."""
    now = time.time()
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    over = HostPolicy(paused_until=now - 600, pause_reason="banned", attempts=4)
    await kv.put("social.example", DomainSlot(policy=over).encode())
    polite = Politeness(kv, PolitenessConfig(min_delay=1.0))
    grant = await polite.acquire("social.example", now)
    assert isinstance(grant, Granted)
    await polite.finish("social.example", grant, now, rest_until=now + 1800)

    status = await collect_status(bus.js, engine, now=now)

    assert [(c.domain, c.reason) for c in status.backing_off] == [
        ("social.example", ASKED_BY_ITS_ANSWER)
    ]


@pytest.mark.parametrize(
    ("n", "shown"),
    [(512, "512 B"), (3_400_000, "3.4 MB"), (1_234_000_000, "1.2 GB"), (5e15, "5000.0 TB")],
)
def test_sizes_are_shown_for_a_person(n: float, shown: str) -> None:
    assert size(n) == shown


def test_render_shows_each_section() -> None:
    status = Status(
        now=0.0,
        pages_by_status={"fetched": 7},
        linked_only=2,
        attempts_by_outcome={"success": 7, "timeout": 1},
        consumers=[
            ConsumerLag(EVENTS_STREAM, FETCHER, pending=12, ack_pending=3, redelivered=1),
            ConsumerLag(EVENTS_STREAM, RECORDER, exists=False),
        ],
        backing_off=[Cooldown(f"slow{i}.example", 3725.0 - i) for i in range(3)],
        queued_domains=4,
        longest_queue=Cooldown("busy.example", 75.0),
        dead_letters=2,
        dead_by_consumer={"recorder": 2},
        outbox_backlog=5,
        outbox_oldest_seconds=42.0,
        store_bytes=15_000_000_000,
        store_limit=20_000_000_000,
        store_by_stream={EVENTS_STREAM: 14_000_000_000, "buckets": 1_000_000_000},
    )
    out = io.StringIO()

    render_status(status, Console(file=out, width=120, color_system=None), max_domains=2)

    printed = out.getvalue()
    for expected in (
        "Pages by status",
        "linked only",
        "Attempts by outcome",
        "timeout",
        "Domains paused",
        "slow0.example",
        "1h 02m",
        "... and 1 more",
        "4 domain(s) with fetches queued for a later slot (longest: busy.example, 1m 15s left)",
        "not created yet",
        "Dead letters: 2 (recorder 2)",
        "Outbox backlog: 5 unpublished (oldest 42s)",
        "JetStream store: 15.0 GB of 20.0 GB (75%) (TROVE_EVENTS 14.0 GB, buckets 1.0 GB)",
    ):
        assert expected in printed, expected
    assert "slow2.example" not in printed
    fetcher_row = next(line for line in printed.splitlines() if line.startswith("fetcher "))
    assert fetcher_row.replace("│", " ").split() == ["fetcher", EVENTS_STREAM, "12", "3", "1"]


async def test_trove_status_command_prints_the_status(
    stack: StackUrls, bus: Bus, tmp_path: Path
) -> None:
    kv = await bus.js.key_value(DOMAINS_BUCKET)
    await kv.put("slow.example", slot(backoff_until=time.time() + 600))
    await bus.js.publish(f"{DEAD_PREFIX}.fetcher", b"poison")
    env = {
        **os.environ,
        "TROVE_DATABASE_URL": stack.database_url,
        "TROVE_NATS_URL": stack.nats_url,
        "TROVE_STATE_DIR": str(tmp_path / "state"),
        "COLUMNS": "200",
    }
    code, printed = await run_trove("status", env=env)

    assert code == 0, printed
    assert "slow.example" in printed
    assert "Dead letters: 1 (fetcher 1)" in printed
    assert "recorder" in printed
