"""Discovery as real processes on real NATS (and the rest of the pipeline where it matters)."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import nats
import pytest
from nats.js.errors import NotFoundError
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually, unacked
from tests.support import outcomes, query, sandbox_env, services
from trove_sandbox.server import serve_sandbox
from trove_sandbox.web import SandboxWeb
from trove_schema.bus import Bus
from trove_schema.events import (
    CrawlCompleted,
    CrawlOutcome,
    Link,
    PageDiscovered,
    Scope,
    ScopeKind,
    decode_event,
    utcnow,
)
from trove_schema.topology import (
    DISCOVERY_SEEDS,
    EVENTS_STREAM,
    PAGE_DISCOVERED,
    SEEDS_STREAM,
    SEEDS_SUBJECT,
    SEEN_BUCKET,
)

pytestmark = pytest.mark.usefixtures("clean")


async def publish_raw(stack: StackUrls, *payloads: bytes) -> None:
    """What `nats pub trove.seeds ...` sends: core NATS, raw bytes, no headers."""
    nc = await nats.connect(stack.nats_url)
    for payload in payloads:
        await nc.publish(SEEDS_SUBJECT, payload)
    await nc.flush()
    await nc.close()


async def discovered(bus: Bus) -> list[PageDiscovered]:
    """Every PageDiscovered in the record, in order."""
    info = await bus.js.stream_info(EVENTS_STREAM)
    found: list[PageDiscovered] = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            msg = await bus.js.get_msg(EVENTS_STREAM, seq)
        except Exception:  # noqa: S112 - deleted or purged sequence
            continue
        if msg.subject == PAGE_DISCOVERED and msg.data:
            event = decode_event(msg.data)
            assert isinstance(event, PageDiscovered)
            found.append(event)
    return found


async def test_seeds_as_raw_bytes_lines_and_json_are_all_crawled(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    web = SandboxWeb.generate(hosts=4, pages_per_host=1)
    env = sandbox_env(web, 0.2, TROVE_MAX_DEPTH="0")
    async with serve_sandbox(web) as running, services(stack, state_dir, env):
        a, b, c, d = running.seeds
        await publish_raw(
            stack,
            a.encode(),
            f"{b}\r\n# a comment\n\n{c}\n".encode(),
            json.dumps({"urls": [d], "priority": 5}).encode(),
        )

        async def fetched() -> dict[str, str]:
            return await outcomes(engine)

        result = await eventually(fetched, until=lambda r: len(r) == 4, timeout=60, what="4 seeds")
    assert result == dict.fromkeys(running.seeds, "success")


async def test_each_bad_seed_gets_a_rejection_with_its_reason(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    bad = {
        b"ftp://example.org/": "not http or https",
        b"https://10.0.0.1/admin": "private",
        b"https://example.org/" + b"a" * 3000: "longer than",
        b'{"url": "https://example.org/", "scope": ': "JSON",
        b"http://": "no host",
    }
    async with services(stack, state_dir, {}, only=("discovery", "recorder")):
        await publish_raw(stack, *bad)

        async def rejections() -> list[tuple[str, str]]:
            rows = await query(engine, "SELECT raw, reason FROM seed_rejections ORDER BY id")
            return [(r.raw, r.reason) for r in rows]

        rows = await eventually(
            rejections, until=lambda r: len(r) == len(bad), timeout=30, what="rejections"
        )
    for raw, expected in bad.items():
        (reason,) = [why for got, why in rows if got[:20] == raw.decode()[:20]]
        assert expected in reason, f"{raw[:40]!r}: {reason!r}"


async def test_a_seed_says_who_sent_it_when_its_header_does(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    """``nats pub -H Trove-Origin:alice trove.seeds ...``: recorded with what it was."""
    async with services(stack, state_dir, {}, only=("discovery", "recorder")):
        nc = await nats.connect(stack.nats_url)
        await nc.publish(SEEDS_SUBJECT, b"ftp://alice.example/", headers={"Trove-Origin": "alice"})
        await nc.publish(SEEDS_SUBJECT, b"ftp://anyone.example/")
        await nc.flush()
        await nc.close()

        async def origins() -> dict[str, str]:
            rows = await query(engine, "SELECT raw, origin FROM seed_rejections")
            return {r.raw: r.origin for r in rows}

        found = await eventually(origins, until=lambda o: len(o) == 2, timeout=30, what="both")
    assert found == {
        "ftp://alice.example/": f"{SEEDS_SUBJECT} (alice)",
        "ftp://anyone.example/": SEEDS_SUBJECT,
    }


async def test_a_seed_request_gets_a_reply_saying_what_was_accepted_and_why_not(
    stack: StackUrls, state_dir: Path
) -> None:
    async with services(stack, state_dir, {}, only=("discovery",)):
        nc = await nats.connect(stack.nats_url)
        try:

            async def ask() -> str:
                try:
                    reply = await nc.request(
                        SEEDS_SUBJECT, b"https://example.org/\nftp://nope.example/", timeout=2
                    )
                except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                    # The seeds stream always listens (silently): until discovery
                    # subscribes, a request times out rather than finding no responders.
                    return ""
                return reply.data.decode()

            text = await eventually(ask, until=bool, timeout=30, what="a reply")
            structured = await nc.request(
                SEEDS_SUBJECT,
                json.dumps({"urls": ["https://example.org/x", "mailto:a@b"]}).encode(),
                timeout=5,
            )
        finally:
            await nc.close()
    assert "accepted 1: https://example.org/" in text
    assert "ftp://nope.example/" in text
    assert "not http or https" in text
    body = json.loads(structured.data)
    assert (body["accepted_count"], body["rejected_count"]) == (1, 1)


async def test_two_discovery_processes_publish_each_canonical_url_once(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    links = tuple(Link(url=f"https://site.example/p/{n}") for n in range(40))
    async with services(stack, state_dir, {}, only=("discovery",), replicas={"discovery": 2}):
        # The same links found on 6 pages: 240 link sightings, 40 distinct URLs.
        for n in range(6):
            now = utcnow()
            await bus.publish(
                CrawlCompleted(
                    url=f"https://site.example/source/{n}",
                    domain="site.example",
                    scope=Scope(kind=ScopeKind.HOST, value="site.example", max_depth=3),
                    request_id=f"req-{n}",
                    outcome=CrawlOutcome.SUCCESS,
                    started_at=now,
                    completed_at=now,
                    links=links,
                )
            )

        async def urls() -> Counter[str]:
            return Counter(e.url for e in await discovered(bus))

        seen = await eventually(urls, until=lambda c: len(c) == 40, timeout=30, what="40 urls")
        # Let every sighting be processed before counting duplicates.
        await eventually(lambda: _consumer_idle(bus), until=bool, timeout=30, what="discovery idle")
        seen = await urls()
    assert set(seen.values()) == {1}


async def test_a_seed_sent_again_after_the_seeds_stream_is_made_anew_is_discovered_again(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    """A restore into an empty server (``TROVE_SEEDS`` and the seen set not kept, as
    docs/deploy.md says they need not be), then the same seed list sent again: its
    first seed has the place the old one had, sequence 1, and is a discovery of its
    own, not the old one's copy for the broker to drop and the recorder to skip."""
    url = "https://again.example/"
    with contextlib.suppress(NotFoundError):
        await bus.js.delete_stream(SEEDS_STREAM)
    async with services(stack, state_dir, {}, only=("discovery",)):
        await _seeds_stream_made(bus)
        await publish_raw(stack, url.encode())
        first = await eventually(
            lambda: discovered(bus), until=lambda found: len(found) == 1, timeout=30, what="seed"
        )
    await bus.js.delete_stream(SEEDS_STREAM)
    await bus.js.delete_key_value(SEEN_BUCKET)
    async with services(stack, state_dir, {}, only=("discovery",)):
        await _seeds_stream_made(bus)
        await publish_raw(stack, url.encode())
        both = await eventually(
            lambda: discovered(bus), until=lambda found: len(found) == 2, timeout=30, what="again"
        )
    assert [event.url for event in both] == [url, url]
    assert both[0].id == first[0].id
    assert both[1].id != both[0].id


async def _seeds_stream_made(bus: Bus) -> None:
    """Wait until discovery, starting, has made ``TROVE_SEEDS``: a seed sent before it
    is there is stored nowhere."""

    async def made() -> bool:
        try:
            await bus.js.consumer_info(SEEDS_STREAM, DISCOVERY_SEEDS)
        except NotFoundError:
            return False
        return True

    await eventually(made, until=bool, timeout=30, what="TROVE_SEEDS made")


async def _consumer_idle(bus: Bus) -> bool:
    info = await bus.js.consumer_info(EVENTS_STREAM, "discovery-links")
    return (info.num_pending or 0) == 0 and (info.num_ack_pending or 0) == 0


async def test_spellings_of_one_url_collapse_to_one_page(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    spellings = [
        b"https://Example.ORG:443/a/./b/../c?utm_source=x&b=2&a=1#top",
        b"https://example.org/a/c?a=1&b=2",
        b"HTTPS://example.org/a/c;jsessionid=ABC123?b=2&a=1&fbclid=zzz",
        b"https://example.org/a/%63?a=1&b=2&PHPSESSID=deadbeef",
    ]
    async with services(stack, state_dir, {}, only=("discovery", "recorder")):
        before = (await bus.js.stream_info(SEEDS_STREAM)).state.last_seq
        await publish_raw(stack, *spellings)
        await eventually(
            lambda: bus.js.stream_info(SEEDS_STREAM),
            until=lambda i: i.state.last_seq >= before + len(spellings),
            timeout=30,
            what="all four seeds stored",
        )
        await eventually(
            lambda: unacked(bus, SEEDS_STREAM, DISCOVERY_SEEDS),
            until=lambda n: n == 0,
            timeout=30,
            what="all four seeds handled",
        )

        async def pages() -> list[str]:
            return [r.url for r in await query(engine, "SELECT url FROM pages")]

        rows = await eventually(pages, until=lambda r: len(r) >= 1, timeout=30, what="a page")
    assert rows == ["https://example.org/a/c?a=1&b=2"]
    assert [e.url for e in await discovered(bus)] == ["https://example.org/a/c?a=1&b=2"]


async def test_a_calendar_trap_stops_at_the_host_budget(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    web = SandboxWeb.generate(hosts=1, pages_per_host=1, with_trap=True)
    trap = web.trap_host
    assert trap is not None
    env = sandbox_env(web, 0.1, TROVE_HOST_PAGE_BUDGET="15")
    async with serve_sandbox(web) as running, services(stack, state_dir, env):
        seed = {"url": web.url(trap, "/calendar/2024/01"), "max_depth": 100}
        await publish_raw(stack, json.dumps(seed).encode())

        async def trap_pages() -> int:
            rows = await query(
                engine,
                "SELECT count(*) AS n FROM pages WHERE domain = :d AND discovered_at IS NOT NULL",
                d=trap,
            )
            return int(rows[0].n)

        await eventually(trap_pages, until=lambda n: n >= 16, timeout=60, what="budget reached")
        await eventually(
            lambda: outcomes(engine), until=lambda r: len(r) >= 16, timeout=60, what="all fetched"
        )
        final = await trap_pages()
        calendar_requests = [p for p in running.witness.paths(trap) if p.startswith("/calendar/")]
    # The seed and 15 more: the budget counts the pages discovered from links.
    assert final == 16
    assert len(calendar_requests) == 16


async def test_a_scope_pattern_keeps_the_crawl_inside_it(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    web = SandboxWeb.generate(hosts=2, pages_per_host=5)
    env = sandbox_env(web, 0.1)
    async with serve_sandbox(web) as running, services(stack, state_dir, env):
        home = running.seeds[0]
        pattern = r"^http://[^/]+/(posts/.*)?$"
        await publish_raw(stack, json.dumps({"url": home, "pattern": pattern}).encode())

        async def crawled() -> dict[str, str]:
            return await outcomes(engine)

        result = await eventually(
            crawled, until=lambda r: len(r) >= 5, timeout=60, what="the posts crawled"
        )
    paths = {urlsplit(u).path for u in result}
    assert all(p == "/" or p.startswith("/posts/") for p in paths), paths
    assert any(p.startswith("/posts/") for p in paths)


async def test_a_recrawl_sends_the_validators_and_records_not_modified(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    web = SandboxWeb.generate(hosts=1, pages_per_host=1)
    env = sandbox_env(web, 0.1, TROVE_MAX_DEPTH="0", TROVE_RECRAWL_AFTER_SECONDS="2")
    async with serve_sandbox(web) as running, services(stack, state_dir, env):
        seed = running.seeds[0]
        await publish_raw(stack, seed.encode())

        async def attempts() -> list[str]:
            rows = await query(
                engine,
                "SELECT c.outcome FROM page_crawls c JOIN pages p ON p.id = c.page_id "
                "WHERE p.url = :u ORDER BY c.completed_at",
                u=seed,
            )
            return [r.outcome for r in rows]

        history = await eventually(
            attempts, until=lambda a: len(a) >= 2, timeout=60, what="a re-crawl"
        )
        home_requests = [r for r in running.witness.requests() if r.path == "/"]
    assert history[:2] == ["success", "not_modified"]
    assert home_requests[0].if_none_match is None
    assert home_requests[1].if_none_match is not None
    (page,) = await query(engine, "SELECT status, title FROM pages WHERE url = :u", u=seed)
    assert page.status == "fetched"
    assert page.title


async def test_new_pages_of_a_host_found_together_say_how_many_came_with_them(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    # The fetcher starts a big site's pages first among due work: its queue is the
    # longest. What discovery knows of it: the new pages of the host one page revealed.
    scope = Scope(kind=ScopeKind.HOST, value="site.example", max_depth=3)

    def crawled(n: int, paths: range) -> CrawlCompleted:
        now = utcnow()
        return CrawlCompleted(
            url=f"https://site.example/source/{n}",
            domain="site.example",
            scope=scope,
            request_id=f"req-{n}",
            outcome=CrawlOutcome.SUCCESS,
            started_at=now,
            completed_at=now,
            links=tuple(Link(url=f"https://site.example/p/{k}") for k in paths),
        )

    async with services(stack, state_dir, {}, only=("discovery",)):
        await bus.publish(crawled(1, range(5)))

        async def found() -> dict[str, int]:
            return {e.url: e.siblings for e in await discovered(bus)}

        await eventually(found, until=lambda f: len(f) == 5, timeout=30, what="five pages")
        await bus.publish(crawled(2, range(3, 7)))  # 3 and 4 are known: two are new
        siblings = await eventually(found, until=lambda f: len(f) == 7, timeout=30, what="7")
    assert siblings == {f"https://site.example/p/{k}": 5 if k < 5 else 2 for k in range(7)}
    assert all(e.headers().get("Trove-Siblings") == str(e.siblings) for e in await discovered(bus))


async def test_links_to_an_excluded_host_are_never_discovered(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    now = utcnow()
    page = CrawlCompleted(
        url="https://blog.example/",
        domain="blog.example",
        scope=Scope(kind=ScopeKind.OPEN, max_depth=3),
        request_id="req",
        outcome=CrawlOutcome.SUCCESS,
        started_at=now,
        completed_at=now,
        links=tuple(
            Link(url=url)
            for url in (
                "https://spam.example/a",
                "https://www.spam.example/b",
                "https://friend.example/",
                "https://notspam.example/",
            )
        ),
    )
    env = {"TROVE_EXCLUDED_HOSTS": "spam.example"}
    async with services(stack, state_dir, env, only=("discovery",)):
        await bus.publish(page)

        async def found() -> set[str]:
            return {e.url for e in await discovered(bus)}

        # Both kept links come from the one event: once they are out, it was handled whole.
        urls = await eventually(found, until=lambda f: len(f) >= 2, timeout=30, what="links")
    assert urls == {"https://friend.example/", "https://notspam.example/"}
