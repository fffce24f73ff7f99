"""Every hostile input ends in a recorded answer: the real services on real NATS and Postgres.

The longer run (thousands of inputs) is ``make fuzz`` (``bench/bench_fuzz.py``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.fetcher._dns import dns_server
from tests.fuzz.harness import FUZZ_NAMESERVER, fuzz_env, fuzz_round, unexpected_log_lines
from tests.support import query, services
from trove_discovery.seeds import parse_seeds
from trove_fetcher.extract import extract
from trove_schema.bus import Bus
from trove_schema.events import (
    CrawlCompleted,
    CrawlOutcome,
    PageDiscovered,
    Provenance,
    Scope,
    ScopeKind,
    SeedRejected,
    derived_event_id,
)
from trove_schema.settings import DiscoverySettings
from trove_schema.text import NUL_MARK, SURROGATE_MARK, is_storable
from trove_schema.topology import DEAD_STREAM
from trove_schema.urls import canonicalize_or_none

HOSTILE = "x\x00y\ud800z"
MARKED = f"x{NUL_MARK}y{SURROGATE_MARK}z"


@pytest.mark.usefixtures("clean")
async def test_every_hostile_seed_and_page_ends_in_one_recorded_answer(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    report = await fuzz_round(
        stack, engine, state_dir, seed=20_261_123, seed_count=80, page_count=65, timeout=90
    )
    assert report.problems == []
    assert report.parked == 0
    assert report.unexpected_errors == []
    # The round exercised what it claims to: rejections, crawls, every page family.
    assert report.rejected_seeds > 40
    assert len({kind for kind, _ in report.page_outcomes}) >= 16


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.binary(max_size=300),
        st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
            lambda inner: (
                st.lists(inner, max_size=4)
                | st.dictionaries(
                    st.sampled_from(["url", "urls", "priority", "scope", "pattern", "max_depth"]),
                    inner,
                    max_size=4,
                )
            ),
            max_leaves=12,
        ).map(lambda doc: json.dumps(doc).encode()),
    )
)
def test_any_seed_message_parses_into_storable_answers(data: bytes) -> None:
    """Whatever is sent, discovery's parser answers (never raises), and every answer can
    be recorded: a rejection's text, once in its event, is storable."""
    batch = parse_seeds(data, origin="fuzz", settings=DiscoverySettings(max_depth=0))
    for rejected in batch.rejected:
        event = SeedRejected(
            raw=rejected.raw, reason=rejected.reason, provenance=Provenance(kind="seed")
        )
        assert rejected.reason
        assert is_storable(event.raw)
        assert is_storable(event.reason)
        event.to_wire()
    for accepted in batch.accepted:
        assert accepted.url.isascii()
        assert is_storable(accepted.url)


def _hand_made(event_type: str, fields: dict[str, Any]) -> bytes:
    """An event as an old or foreign producer might have written it: json.dumps, escapes."""
    return json.dumps({"type": event_type, "version": 1, **fields}).encode()


@pytest.mark.usefixtures("clean")
async def test_text_postgres_cannot_store_is_recorded_marked(
    stack: StackUrls, engine: AsyncEngine, bus: Bus, state_dir: Path
) -> None:
    """NULs and surrogates in every outside text field, projected by the real recorder."""
    now = datetime.now(UTC)
    built = [
        SeedRejected(
            raw="http://exa\x00mple.org/" + HOSTILE,
            reason=HOSTILE,
            provenance=Provenance(kind="seed", origin=HOSTILE),
        ),
        CrawlCompleted(
            url="https://hostile.example/built",
            domain="hostile.example",
            scope=Scope(),
            request_id=derived_event_id("built", "test"),
            outcome=CrawlOutcome.SUCCESS,
            status_code=200,
            started_at=now,
            completed_at=now,
            title=HOSTILE,
            language="en",
            keywords=("plain", HOSTILE),
            etag=HOSTILE,
            last_modified=HOSTILE,
            content_type=HOSTILE,
            canonical_url="https://hostile.example/canonical\x00",
            links=[{"url": "https://hostile.example/link\x00"}],
        ),
        CrawlCompleted(
            url="https://hostile.example/failed",
            domain="hostile.example",
            scope=Scope(),
            request_id=derived_event_id("failed", "test"),
            outcome=CrawlOutcome.FAILED,
            error_message=HOSTILE,
            started_at=now,
            completed_at=now,
        ),
    ]
    stamp = now.isoformat()
    hand_made = [
        _hand_made(
            "SeedRejected",
            {
                "id": derived_event_id("hand-rejected", "test"),
                "occurred_at": stamp,
                "raw": HOSTILE * 200,  # also far over the 512 characters a raw may hold
                "reason": HOSTILE,
                "provenance": {"kind": "seed", "origin": HOSTILE},
            },
        ),
        _hand_made(
            "CrawlCompleted",
            {
                "id": derived_event_id("hand-completed", "test"),
                "occurred_at": stamp,
                "url": "https://hostile.example/hand\x00",
                "domain": "hostile.example",
                "scope": {"kind": "host", "value": "hostile.example"},
                "request_id": derived_event_id("hand", "test"),
                "outcome": "success",
                "started_at": stamp,
                "completed_at": stamp,
                "title": HOSTILE,
                "keywords": [HOSTILE],
                "etag": HOSTILE,
                "last_modified": HOSTILE,
                "links": [{"url": "https://hostile.example/hand-link\x00"}],
            },
        ),
    ]
    async with services(stack, state_dir, {}, only=("recorder",)) as local:
        for event in built:
            await bus.publish(event)
        for number, data in enumerate(hand_made):
            await bus.js.publish(
                "trove.events.seed.rejected" if number == 0 else CrawlCompleted.SUBJECT, data
            )

        async def projected() -> int:
            local.check_alive()
            rows = await query(engine, "SELECT count(*) AS n FROM projected_events")
            return int(rows[0].n)

        await eventually(projected, until=lambda n: n >= 5, timeout=30, what="5 events projected")
    rejections = await query(engine, "SELECT raw, reason, origin FROM seed_rejections")
    assert len(rejections) == 2
    for row in rejections:
        assert MARKED in row.raw
        assert row.reason == MARKED
        assert row.origin == MARKED
    assert max(len(row.raw) for row in rejections) == 512
    pages = {
        row.url: row
        for row in await query(
            engine, "SELECT url, title, etag, last_modified, canonical_url FROM pages"
        )
    }
    built_page = pages["https://hostile.example/built"]
    assert (built_page.title, built_page.etag, built_page.last_modified) == (MARKED,) * 3
    assert built_page.canonical_url == f"https://hostile.example/canonical{NUL_MARK}"
    assert pages[f"https://hostile.example/hand{NUL_MARK}"].title == MARKED
    assert f"https://hostile.example/link{NUL_MARK}" in pages
    assert f"https://hostile.example/hand-link{NUL_MARK}" in pages
    failed = await query(engine, "SELECT error_message FROM page_crawls WHERE outcome = 'failed'")
    assert [row.error_message for row in failed] == [MARKED]
    dead = await bus.js.stream_info(DEAD_STREAM)
    assert dead.state.messages == 0
    assert unexpected_log_lines(state_dir / "logs") == []


def test_a_feed_referring_to_a_surrogate_is_extracted() -> None:
    """libxml2 kept ``&#xD800;`` as bytes lxml could not decode: extraction raised."""
    for reference in ("&#xD800;", "&#55296;", "&#xdfff;"):
        body = (
            f'<?xml version="1.0"?><rss version="2.0"><channel><title>a{reference}b</title>'
            f"<item><title>x{reference}</title><link>http://a.example/{reference}</link>"
            "</item></channel></rss>"
        ).encode()
        found = extract(
            body,
            url="http://a.example/",
            content_type="application/rss+xml",
            x_robots_tag=None,
            robots_token="TroveBot",
        )
        assert found.title == "a\ufffdb"
        assert [link.url for link in found.links] == ["http://a.example/\ufffd"]


@pytest.mark.usefixtures("clean")
async def test_work_for_a_url_no_stage_can_fetch_is_recorded_rejected(
    stack: StackUrls, engine: AsyncEngine, bus: Bus, state_dir: Path
) -> None:
    """An emoji host accepted before the IDNA rule, still in the stream: the fetcher
    answers `rejected` with the reason, never `failed` (retried as if the site were away)."""
    url = "http://xn--ls8h.la/"
    with dns_server(FUZZ_NAMESERVER) as names:
        env = fuzz_env(hosts=1, nameserver=names.address)
        async with services(stack, state_dir, env, only=("fetcher", "recorder")):
            await bus.publish(
                PageDiscovered(
                    url=url,
                    domain="xn--ls8h.la",
                    scope=Scope(kind=ScopeKind.HOST, value="xn--ls8h.la", max_depth=0),
                    provenance=Provenance(kind="seed", origin="before the rule"),
                )
            )

            async def attempts() -> list[Any]:
                return list(
                    await query(
                        engine,
                        "SELECT c.outcome, c.error_message FROM page_crawls c "
                        "JOIN pages p ON p.id = c.page_id WHERE p.url = :url",
                        url=url,
                    )
                )

            rows = await eventually(attempts, until=bool, timeout=30, what="the attempt recorded")
    assert [row.outcome for row in rows] == ["rejected"]
    assert "internationalized name" in rows[0].error_message
    outbox = await query(engine, "SELECT count(*) AS n FROM outbox")
    assert outbox[0].n == 0  # no retry scheduled
    assert unexpected_log_lines(state_dir / "logs") == []


@pytest.mark.parametrize("seed", [b"http://xn--ls8h.la/", "http://\U0001f4a9.la/".encode()])
def test_a_seed_no_stage_can_fetch_is_rejected_with_the_reason(seed: bytes) -> None:
    batch = parse_seeds(seed, origin="fuzz", settings=DiscoverySettings())
    assert batch.accepted == ()
    assert [r.reason for r in batch.rejected] == [
        "host 'xn--ls8h.la' is not a valid internationalized name (IDNA 2008): "
        "Codepoint U+1F4A9 at position 1 of '\U0001f4a9' not allowed"
    ]


def test_a_link_no_stage_can_fetch_is_dropped() -> None:
    assert canonicalize_or_none("/x", base="http://xn--ls8h.la/") is None
    assert canonicalize_or_none("http://www.\u2615.example/") is None
    assert canonicalize_or_none("http://bücher.example/") == "http://xn--bcher-kva.example/"
