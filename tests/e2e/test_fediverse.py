"""End to end: following a fediverse instance, with the three services as real processes.

The sandbox instance (``trove_sandbox.fediverse``) serves NodeInfo, the Mastodon client
API and ActivityPub beside a sandbox web, and knows which links a polite follower may
take; its server's request log (the ``Witness``) is the evidence for politeness and for
the cursor. Durations are scaled down: a gap of a few tenths of a second, a poll
interval of a second.
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import nats
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.fetcher._servers import Exchange, LocalServer
from tests.support import query, run_trove, services
from trove_cli.local import LocalTrove
from trove_cli.search import search
from trove_fetcher.timeline import LOW_RATE_SHARE
from trove_sandbox.fediverse import (
    FediverseInstance,
    Misbehaviour,
    RunningInstance,
    Status,
    serve_instance,
)
from trove_sandbox.server import Witness, WitnessRecord, serve_sandbox
from trove_sandbox.web import SandboxWeb
from trove_schema.bus import Bus
from trove_schema.events import PageDiscovered, TimelinePolled, decode_event
from trove_schema.topology import (
    DEAD_STREAM,
    EVENTS_STREAM,
    FOLLOW_SUBJECT,
    PAGE_DISCOVERED,
    TIMELINE_POLLED,
)
from trove_schema.urls import canonicalize

pytestmark = pytest.mark.usefixtures("clean")

#: Seconds between two requests to one host.
GAP = 0.3
#: A followed timeline is polled again this long after a poll that read everything.
POLL_INTERVAL = 1.0
TIMELINE_PATH = "/api/v1/timelines/public"


@dataclass
class Followed:
    """The served web and instance, and the services crawling them."""

    web: SandboxWeb
    instance: FediverseInstance
    social: RunningInstance
    witness: Witness
    local: LocalTrove
    env: dict[str, str]

    @property
    def origin(self) -> str:
        return self.instance.origin

    def instance_requests(self) -> list[WitnessRecord]:
        return sorted(self.witness.requests(self.instance.host), key=lambda r: r.monotonic)

    def api_requests(self) -> list[WitnessRecord]:
        return [r for r in self.instance_requests() if r.path.startswith("/api/")]


@asynccontextmanager
async def fediverse(
    stack: StackUrls,
    state_dir: Path,
    *,
    posts: int,
    seed: int = 7,
    rate_limit: int = 300,
    rate_window: float = 300.0,
    **extra: str,
) -> AsyncIterator[Followed]:
    # Three hosts: the third asks for a Crawl-delay of 2 s in robots.txt, and is shared
    # least (the instance's people share the first pages of the web most).
    web = SandboxWeb.generate(hosts=3, pages_per_host=3, seed=seed)
    instance = FediverseInstance.generate(
        web=web, posts=posts, seed=seed, rate_limit=rate_limit, rate_window=rate_window
    )
    async with (
        serve_sandbox(web, port=0) as running,
        serve_instance(instance, port=running.port, witness=running.witness) as social,
    ):
        env = {
            "TROVE_RESOLVE": f"{web.resolve_setting()},{instance.host}={instance.ip}",
            "TROVE_ALLOWED_NETWORKS": "127.0.0.0/8",
            "TROVE_MIN_DOMAIN_DELAY_SECONDS": str(GAP),
            "TROVE_POLL_INTERVAL_SECONDS": str(POLL_INTERVAL),
            "TROVE_POLL_MAX_BACKOFF_SECONDS": "2",
            "TROVE_HOST_PAUSE_SECONDS": "1",
            "TROVE_RATE_PAUSE_SECONDS": "1",
            **extra,
        }
        async with services(stack, state_dir, env) as local:
            yield Followed(web, instance, social, running.witness, local, env)


async def follow_by_nats(stack: StackUrls, *commands: str) -> None:
    """What ``nats pub trove.follow URL`` sends: the plain text, no headers."""
    nc = await nats.connect(stack.nats_url)
    for command in commands:
        await nc.publish(FOLLOW_SUBJECT, command.encode())
    await nc.flush()
    await nc.close()


def expected_shares(instance: FediverseInstance, **kwargs: Any) -> set[tuple[str, str]]:
    """(canonical URL, post URI) for every link a follower of the local timeline may take."""
    return {
        (canonicalize(url), instance.status_uri(instance.status(sid)))
        for sid, urls in instance.links_by_post(**kwargs).items()
        for url in urls
    }


async def shares(engine: AsyncEngine) -> list[tuple[str, str]]:
    rows = await query(engine, "SELECT url, post_uri FROM page_shares")
    return [(r.url, r.post_uri) for r in rows]


async def fetched(engine: AsyncEngine, urls: Iterable[str]) -> set[str]:
    rows = await query(
        engine,
        "SELECT p.url FROM pages p WHERE p.url = ANY(:urls) AND p.status = 'fetched' "
        "AND EXISTS (SELECT 1 FROM page_crawls c WHERE c.page_id = p.id "
        "AND c.outcome = 'success')",
        urls=list(urls),
    )
    return {r.url for r in rows}


async def stream_messages(bus: Bus, stream: str) -> list[tuple[str, bytes]]:
    """Every message still in ``stream``: (subject, data)."""
    info = await bus.js.stream_info(stream)
    found: list[tuple[str, bytes]] = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            msg = await bus.js.get_msg(stream, seq)
        except Exception:  # noqa: S112 - a deleted sequence (a schedule that fired)
            continue
        found.append((msg.subject or "", msg.data or b""))
    return found


async def polls(bus: Bus) -> list[TimelinePolled]:
    found: dict[str, TimelinePolled] = {}
    for subject, data in await stream_messages(bus, EVENTS_STREAM):
        if subject == TIMELINE_POLLED and data:
            event = decode_event(data)
            assert isinstance(event, TimelinePolled)
            found[str(event.id)] = event
    return list(found.values())


async def wait_for_everything_shared(
    engine: AsyncEngine, setup: Followed, *, timeout: float = 60
) -> set[tuple[str, str]]:
    """Until every expected share is recorded and every shared page crawled."""
    want = expected_shares(setup.instance)
    urls = {url for url, _ in want}

    async def probe() -> tuple[set[tuple[str, str]], set[str]]:
        setup.local.check_alive()
        return set(await shares(engine)), await fetched(engine, urls)

    await eventually(
        probe,
        until=lambda got: want <= got[0] and got[1] == urls,
        timeout=timeout,
        interval=0.3,
        what="every shared page crawled with its shares",
    )
    return want


def twin_page(exchange: Exchange) -> None:
    body = (
        "<!DOCTYPE html><html lang='en'><head><title>Zymurgy at home</title></head>"
        "<body><p>Zymurgy is the study of fermentation: bread, beer and patience. "
        "A home zymurgy notebook keeps the temperatures and times.</p></body></html>"
    )
    exchange.send(200, body.encode())


async def test_following_with_nats_crawls_every_shared_page_with_its_shares_and_ranks_by_them(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    with LocalServer("127.0.0.3") as twins:
        twins.routes.update({"/once": twin_page, "/thrice": twin_page})
        once, thrice = twins.url("/once"), twins.url("/thrice")
        async with fediverse(stack, state_dir, posts=24) as setup:
            for account in ("ada", "bruno", "chiara"):
                setup.instance.add_post(account, links=[thrice], visibility="public", card=False)
            setup.instance.add_post("elif", links=[once], visibility="public", card=False)
            await follow_by_nats(stack, setup.origin)
            want = await wait_for_everything_shared(engine, setup)

    got = await shares(engine)
    assert len(got) == len(set(got))  # one row per (page, post)
    assert set(got) == want
    assert sum(1 for url, _ in got if url == canonicalize(thrice)) == 3
    # Pages shared by several posts are there with as many rows as posts.
    assert any(n > 1 for n in setup.instance.expected_links().values())
    hits = {hit.url: (rank, hit) for rank, hit in enumerate(await search(engine, "zymurgy"))}
    assert set(hits) == {canonicalize(once), canonicalize(thrice)}
    assert hits[canonicalize(thrice)][1].shares == 3
    assert hits[canonicalize(once)][1].shares == 1
    assert hits[canonicalize(thrice)][0] < hits[canonicalize(once)][0]
    assert hits[canonicalize(thrice)][1].score > hits[canonicalize(once)][1].score


async def test_following_with_trove_follow_crawls_the_shared_pages(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    async with fediverse(stack, state_dir, posts=10) as setup:
        env = {
            **os.environ,
            **setup.env,
            "TROVE_NATS_URL": stack.nats_url,
            "TROVE_DATABASE_URL": stack.database_url,
            "COLUMNS": "250",  # the listing is a table: wide enough for the whole URL
        }
        code, out = await run_trove("follow", setup.origin, env=env)
        assert code == 0, out
        # Discovery answers once it is up; until then the command waits in the stream.
        assert setup.instance.host in out or "kept in trove.follow" in out, out
        want = await wait_for_everything_shared(engine, setup)
        code, listing = await run_trove("instances", env=env)
    assert code == 0, listing
    assert setup.instance.host in listing
    assert set(await shares(engine)) == want
    rows = await query(engine, "SELECT instance, timeline, software, polls FROM instances")
    assert [(r.instance, r.timeline, r.software) for r in rows] == [
        (setup.origin, "local", "mastodon")
    ]
    assert rows[0].polls >= 1


def read_past(newest: int, cursors: list[int]) -> bool:
    return bool(cursors) and cursors[-1] >= newest


def _min_ids(requests: list[WitnessRecord]) -> list[int]:
    found = []
    for record in requests:
        parts = urlsplit(record.path)
        if parts.path == TIMELINE_PATH:
            cursor = dict(parse_qsl(parts.query)).get("min_id")
            if cursor is not None:
                found.append(int(cursor))
    return found


async def test_polling_is_incremental_and_a_killed_discovery_handles_each_post_once(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    async with fediverse(stack, state_dir, posts=12) as setup:
        instance = setup.instance
        await follow_by_nats(stack, setup.origin)
        await wait_for_everything_shared(engine, setup)
        discovery = next(c for c in setup.local.children if c.name.startswith("discovery"))
        killed = False
        for round_ in range(4):
            added: list[Status] = [
                instance.add_post(account, visibility="public")
                for account in ("ada", "hiro", "bruno")
            ]
            newest = added[-1].id

            async def cursors() -> list[int]:
                return _min_ids(setup.api_requests())

            # The poll that asks for posts after the newest one: the new posts were read.
            # After the kill, the poll discovery held unacked comes back only after its
            # consumer's ack_wait (30 s): the chain goes on from there.
            await eventually(
                cursors,
                until=functools.partial(read_past, newest),
                timeout=75 if killed else 30,
                interval=0.05,
                what=f"round {round_}: a poll read past post {newest}",
            )
            if round_ == 2:
                # Discovery is handling (or about to handle) the poll that read them.
                os.kill(discovery.proc.pid, signal.SIGKILL)
                killed = True

        async def everything() -> set[tuple[str, str]]:
            return set(await shares(engine))

        want = expected_shares(instance)
        await eventually(
            everything,
            until=lambda got: got == want,
            timeout=60,
            what="every post's links recorded after the restart",
        )
        restarted = next(c for c in setup.local.children if c.name.startswith("discovery"))
        assert killed
        assert restarted.proc.pid != discovery.proc.pid
        min_ids = _min_ids(setup.api_requests())
        events = await polls(bus)
        messages = await stream_messages(bus, EVENTS_STREAM)

    # The cursor only moves forward, and moved with every round of new posts.
    assert min_ids == sorted(min_ids)
    assert len(set(min_ids)) >= 4
    assert min_ids[-1] == max(s.id for s in instance.timeline())
    # No post in two polls, and none missed: every post of the timeline was read once.
    posts = [post.uri for event in events for post in event.posts]
    assert len(posts) == len(set(posts))
    allowed = {instance.status_uri(s) for s in instance.timeline() if instance.may_share(s)}
    assert set(posts) == allowed
    got = await shares(engine)
    assert len(got) == len(set(got))
    assert set(got) == want
    # Each shared page was discovered once, however many posts shared it.
    discovered = [
        event.url
        for subject, data in messages
        if subject == PAGE_DISCOVERED and data
        for event in [decode_event(data)]
        if isinstance(event, PageDiscovered) and event.provenance.kind == "share"
    ]
    assert len(discovered) == len(set(discovered))
    assert {url for url, _ in want} <= set(discovered)


async def instance_rows(engine: AsyncEngine) -> dict[str, Any]:
    rows = await query(engine, "SELECT * FROM instances")
    return {r.timeline: r for r in rows}


async def test_requests_to_the_instance_keep_the_gap_and_its_rate_limit(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    # Three API requests a window of 4 s: a poll a second would spend them in three.
    limit = 3
    async with fediverse(stack, state_dir, posts=12, rate_limit=limit, rate_window=4.0) as setup:
        await follow_by_nats(stack, setup.origin)
        await wait_for_everything_shared(engine, setup)

        async def stopped_for_the_limit() -> list[TimelinePolled]:
            setup.local.check_alive()
            # A poll that made requests and was told to wait: the limit was (nearly) spent.
            return [e for e in await polls(bus) if e.retry_after is not None and e.requests]

        # Polls that stopped at the limit, and the polls after them.
        await eventually(
            stopped_for_the_limit,
            until=lambda found: len(found) >= 2,
            timeout=40,
            what="two polls stopped by the rate limit",
        )
        await eventually(
            lambda: polls(bus),
            until=lambda found: (
                max(e.poll for e in found) > max(e.poll for e in found if e.retry_after is not None)
            ),
            timeout=20,
            what="a poll after the last reset",
        )
        seen = setup.instance_requests()
        api = setup.api_requests()
        events = await polls(bus)

    # Every request to the instance (robots.txt, NodeInfo, API pages, post pages).
    kinds = {r.path.split("?")[0].split("/")[1] for r in seen}
    assert {"robots.txt", ".well-known", "nodeinfo", "api"} <= kinds
    assert any(r.path.startswith("/@") for r in seen)
    gaps = [b.monotonic - a.monotonic for a, b in itertools.pairwise(seen)]
    assert min(gaps) >= GAP, f"two requests {min(gaps):.3f} s apart"
    # The limit was never overrun, and no API request came between an answer that said
    # it was (nearly) spent and the reset that answer named, as the instance logged both.
    assert [r.path for r in api if r.status == 429] == []
    assert len([e for e in events if e.retry_after is not None and e.requests]) >= 2
    floor = max(1, int(limit * LOW_RATE_SHARE))  # "nearly spent", as the poller reads it
    spent = [(named, reset) for named, reset, left in setup.instance.resets if left <= floor]
    assert spent, "no answer said the limit was spent"
    for named, reset in spent:
        inside = [r.wall - named for r in api if named < r.wall < reset - 0.05]
        assert not inside, (
            f"an API request {inside[0]:.2f} s after a spent answer, before its reset"
        )
    assert any(r.wall >= spent[0][1] for r in api), "no poll after a reset"


async def test_a_429_with_retry_after_is_obeyed_and_polling_resumes(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    retry_after = 2
    async with fediverse(stack, state_dir, posts=6) as setup:
        await follow_by_nats(stack, setup.origin)
        await wait_for_everything_shared(engine, setup)
        setup.instance.throttle(retry_after)

        async def refused() -> list[WitnessRecord]:
            setup.local.check_alive()
            return [r for r in setup.api_requests() if r.status == 429]

        await eventually(refused, until=lambda found: len(found) >= 2, timeout=30, what="two 429s")

        async def local_row() -> Any:
            return (await instance_rows(engine))["local"]

        throttled_row = await eventually(
            local_row,
            until=lambda found: found.last_status_code == 429,
            timeout=10,
            what="the 429 recorded",
        )
        setup.instance.throttle(None)
        last_429 = (await refused())[-1].monotonic

        async def answered() -> list[WitnessRecord]:
            return [r for r in setup.api_requests() if r.monotonic > last_429]

        await eventually(answered, until=lambda found: bool(found), timeout=30, what="a poll")

        row = await eventually(
            local_row,
            until=lambda row: row.last_outcome == "success",
            timeout=30,
            what="a successful poll after the 429s",
        )
        seen = setup.instance_requests()

    # Every request to the instance, post pages too, waits out each 429's Retry-After.
    throttled = [r for r in seen if r.status == 429]
    assert len(throttled) >= 2
    for answer in throttled:
        after = [r.monotonic for r in seen if r.monotonic > answer.monotonic]
        assert after
        assert min(after) - answer.monotonic >= retry_after, (
            f"a request {min(after) - answer.monotonic:.2f} s after a 429 asking for "
            f"{retry_after} s"
        )
    assert throttled_row.last_outcome == "blocked_4xx"
    assert throttled_row.next_poll_after is not None
    assert row.last_error is None
    assert row.polls >= 3


async def test_opted_out_accounts_leave_no_trace_in_any_table_or_event(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    with LocalServer("127.0.0.4") as theirs:
        async with fediverse(stack, state_dir, posts=30) as setup:
            instance = setup.instance
            opted_out = [a for a in instance.accounts if a.local and a.opted_out]
            assert {a.username for a in opted_out} == {"dmitri", "femi", "greta"}
            only_theirs = []
            for account in opted_out:
                link = theirs.url(f"/shared-by-{account.username}")
                only_theirs.append(link)
                instance.add_post(account.acct, links=[link], visibility="public", card=True)
            # Someone else posts last, so that the last poll reads past the opted-out posts.
            instance.add_post("ada", visibility="public")
            posts = {
                canonicalize(instance.status_url(s))
                for s in instance.timeline()
                if instance.may_share(s)
            }
            await follow_by_nats(stack, setup.origin)
            await wait_for_everything_shared(engine, setup)
            await eventually(
                lambda: fetched(engine, posts),
                until=lambda done: done == posts,
                timeout=30,
                what="every post page that may be crawled crawled",
            )
            requested = {r.path.split("?")[0] for r in setup.instance_requests()}
            rows = await instance_rows(engine)
        assert theirs.requests_for("127.0.0.4") == []
    messages = await stream_messages(bus, EVENTS_STREAM)
    theirs_posts = instance.opted_out_posts()
    assert theirs_posts, "the instance's opted-out accounts posted nothing public"
    # Their posts' pages are never asked for, in either form.
    for status in theirs_posts:
        for url in (instance.status_url(status), instance.status_uri(status)):
            assert urlsplit(url).path not in requested, url
    assert rows["local"].skipped >= len(theirs_posts)
    # Another person's post may link to an opted-out person's post (a quote): that link
    # is the other person's content, recorded with it as a link of their post's page
    # (never fetched, as asserted above; never shared). Only there may it appear.
    quoted = {
        instance.url(path)
        for status in instance.timeline()
        if instance.may_share(status)
        for path in status.own_links
    }
    traces = {
        *(instance.status_uri(s) for s in theirs_posts),
        *(instance.status_url(s) for s in theirs_posts if instance.status_url(s) not in quoted),
        *(canonicalize(link) for link in instance.forbidden_links()),
        *(canonicalize(link) for link in only_theirs),
        *(f"{a.acct}@{instance.host}" for a in opted_out),
    }
    # Their profiles, as whole URLs (a quoted post's URL starts with its author's profile).
    profiles = [canonicalize(instance.profile_url(a)) for a in opted_out]
    assert await query(engine, "SELECT url FROM pages WHERE url = ANY(:u)", u=profiles) == []

    columns = await query(
        engine,
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = 'public' AND data_type IN "
        "('text', 'character varying', 'jsonb', 'json', 'ARRAY', 'tsvector', 'bytea')",
    )
    found: dict[str, list[str]] = {}
    for table, column, kind in sorted({tuple(c) for c in columns}):
        as_text = (
            f"convert_from(\"{column}\", 'UTF8')"
            if kind == "bytea"
            else f'CAST("{column}" AS text)'
        )
        hits = await query(
            engine,
            f'SELECT {as_text} AS v FROM "{table}" WHERE {as_text} LIKE ANY(:patterns)',  # noqa: S608
            patterns=[f"%{trace}%" for trace in traces],
        )
        if hits:
            found[f"{table}.{column}"] = [hit.v[:200] for hit in hits]
    in_events = [
        (subject, trace)
        for subject, data in messages
        for trace in [*traces, *(f'{profile}"' for profile in profiles)]
        if trace in data.decode("utf-8", "replace")
    ]
    assert (found, in_events) == ({}, [])
    # A quoted post is a link target and nothing more: never crawled, never shared.
    quoted_theirs = [canonicalize(instance.status_url(s)) for s in theirs_posts]
    crawled = await query(
        engine,
        "SELECT p.url, p.status FROM pages p WHERE p.url = ANY(:urls) AND (p.status <> "
        "'discovered' OR EXISTS (SELECT 1 FROM page_crawls c WHERE c.page_id = p.id) "
        "OR EXISTS (SELECT 1 FROM page_shares s WHERE s.url = p.url))",
        urls=quoted_theirs,
    )
    assert crawled == []


async def test_an_account_that_opts_out_later_has_its_earlier_shares_withdrawn(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    async with fediverse(stack, state_dir, posts=30) as setup:
        instance = setup.instance
        await follow_by_nats(stack, setup.origin)
        await wait_for_everything_shared(engine, setup)
        rows = await query(engine, "SELECT account, url, post_uri FROM page_shares")
        local = [r.account for r in rows if r.account.endswith(f"@{instance.host}")]
        account = max(set(local), key=local.count)  # the one who shared most
        others = {(r.url, r.post_uri) for r in rows if r.account != account}
        assert others

        # They opt out and post again: the next poll skips the post and says so.
        instance.opt_out(account.split("@")[0], "indexable")
        instance.add_post(account.split("@")[0], visibility="public")

        async def theirs() -> int:
            setup.local.check_alive()
            found = await query(
                engine, "SELECT count(*) AS n FROM page_shares WHERE account = :a", a=account
            )
            return int(found[0].n)

        await eventually(theirs, until=lambda n: n == 0, timeout=30, what="their shares gone")
        assert set(await shares(engine)) == others


async def test_post_pages_are_crawled_as_activitystreams_with_title_language_and_keywords(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    async with fediverse(stack, state_dir, posts=10) as setup:
        instance = setup.instance
        posts = [s for s in instance.timeline() if instance.may_share(s)]
        urls = {canonicalize(instance.status_url(s)): s for s in posts}
        await follow_by_nats(stack, setup.origin)
        await eventually(
            lambda: fetched(engine, urls),
            until=lambda done: done == set(urls),
            timeout=60,
            what="every post's page fetched",
        )
        pages = await query(
            engine,
            "SELECT url, title, language, keywords_tsv IS NOT NULL AND keywords_tsv <> '' AS kw "
            "FROM pages WHERE url = ANY(:urls)",
            urls=list(urls),
        )
        attempts = await query(
            engine,
            "SELECT url, fetcher, success, attempted_at FROM fetcher_attempts "
            "WHERE url = ANY(:urls) ORDER BY attempted_at",
            urls=list(urls),
        )
        asked = [r.accept or "" for r in setup.instance_requests() if r.path.startswith("/@")]

    assert len(pages) == len(urls)
    for page in pages:
        status = urls[page.url]
        assert page.title, page.url
        assert page.language, page.url
        assert page.language.split("-")[0] == status.language, page
        assert page.kw, page.url
    by_url: dict[str, list[Any]] = {}
    for attempt in attempts:
        by_url.setdefault(attempt.url, []).append(attempt)
    assert set(by_url) == set(urls)
    for url, tried in by_url.items():
        good = [a for a in tried if a.success]
        assert good, (url, tried)
        assert good[-1].fetcher == "activitypub", (url, tried)
    # Once the host's post pages answered as ActivityStreams, they are asked for so.
    first = next(n for n, a in enumerate(attempts) if a.fetcher == "activitypub" and a.success)
    assert first < len(attempts) - len(urls) // 2, "learned too late to show"
    assert [a.fetcher for a in attempts[first:]] == ["activitypub"] * (len(attempts) - first)
    assert any("application/activity+json" in accept for accept in asked)


async def test_each_hostile_answer_is_a_recorded_error_and_polling_goes_on(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    with LocalServer("127.0.0.5") as elsewhere:
        elsewhere.routes["/fine"] = twin_page
        async with fediverse(stack, state_dir, posts=12) as setup:
            instance = setup.instance
            # A small backfill: the first poll reads back along several pages.
            await follow_by_nats(stack, f'{{"instance": "{setup.origin}", "backfill": 5}}')

            async def row(timeline: str = "local") -> Any:
                setup.local.check_alive()
                return (await instance_rows(engine)).get(timeline)

            def failed_after(before: int, found: Any) -> bool:
                return bool(found.polls > before and found.last_error)

            def healthy(found: Any) -> bool:
                return (
                    found is not None and found.last_outcome == "success" and not found.last_error
                )

            await eventually(row, until=healthy, timeout=30, what="a first good poll")
            recorded: dict[str, tuple[str, str]] = {}
            modes: tuple[Misbehaviour, ...] = (
                "wrong-types",
                "html",
                "bottomless",
                "redirect",
                "huge",
            )
            for mode in modes:
                before = (await row()).polls
                instance.misbehave(mode)
                bad = await eventually(
                    row,
                    until=functools.partial(failed_after, before),
                    timeout=20,
                    what=f"{mode}: a recorded error",
                )
                recorded[mode] = (bad.last_outcome, bad.last_error)
                instance.misbehave(None)
                await eventually(row, until=healthy, timeout=20, what=f"{mode}: polls recover")

            # Endless pagination shows on a first poll reading back along next links past
            # a full page: more posts on a tag than a page holds (from an account that
            # opted out, so that no post page is crawled meanwhile), and a large backfill.
            for _ in range(45):
                instance.add_post("dmitri", links=[], visibility="public", tags=["rivers"])
            instance.misbehave("endless")
            await follow_by_nats(
                stack,
                f'{{"instance": "{setup.origin}", "timeline": "tag:rivers", "backfill": 100}}',
            )
            bad = await eventually(
                lambda: row("tag:rivers"),
                until=lambda found: found is not None and bool(found.last_error),
                timeout=20,
                what="endless: a recorded error",
            )
            recorded["endless"] = (bad.last_outcome, bad.last_error)
            instance.misbehave(None)

            # A preview card on a private address: the link is dropped, the post kept.
            private = "http://10.20.30.40/admin"
            fine = elsewhere.url("/fine")
            post = instance.add_post("ada", links=[private, fine], visibility="public", card=True)
            assert post.card is not None
            assert instance.link_url(post.card.link) == private

            async def fine_shared() -> set[tuple[str, str]]:
                setup.local.check_alive()
                return set(await shares(engine))

            await eventually(
                fine_shared,
                until=lambda got: (canonicalize(fine), instance.status_uri(post)) in got,
                timeout=20,
                what="the post's other link shared",
            )
            await eventually(row, until=healthy, timeout=20, what="the local timeline polls on")
            await eventually(
                lambda: row("tag:rivers"), until=healthy, timeout=20, what="the tag's too"
            )
            setup.local.check_alive()  # no service exited, so nothing crash-looped
            dead = await bus.js.stream_info(DEAD_STREAM)
            messages = await stream_messages(bus, EVENTS_STREAM)

    assert set(recorded) == {*modes, "endless"}
    assert {mode for mode, (outcome, _) in recorded.items() if outcome == "rejected"} == {
        "wrong-types",
        "html",
        "redirect",
        "huge",
    }
    # Endless and bottomless pages end the poll with what it read, and say why.
    assert "already read" in recorded["endless"][1] or "repeated" in recorded["endless"][1]
    assert "already read" in recorded["bottomless"][1] or "repeated" in recorded["bottomless"][1]
    assert all(error for _, error in recorded.values()), recorded
    assert dead.state.messages == 0
    # Never taken as a shared page (the post page's own record lists it among the
    # post's links, as any page's record lists what it links to).
    taken = [
        subject
        for subject, data in messages
        if subject in (TIMELINE_POLLED, PAGE_DISCOVERED) and private.encode() in data
    ]
    assert taken == []
    assert await query(engine, "SELECT url FROM page_shares WHERE url LIKE '%10.20.30.40%'") == []


async def test_a_follow_whose_gap_is_longer_than_a_short_wait_reads_its_timeline(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    # A gap of 2 s, past what a task waits for a lease (``LOCAL_WAIT``, 1 s): a poll's
    # next request waits for its slot as a deferred poll, not in the task.
    gap = 2.0
    async with fediverse(
        stack, state_dir, posts=10, TROVE_MIN_DOMAIN_DELAY_SECONDS=str(gap)
    ) as setup:
        await follow_by_nats(stack, setup.origin)
        want = await wait_for_everything_shared(engine, setup, timeout=90)
        seen = setup.instance_requests()
    assert want  # the posts share links, and every one of them was read
    gaps = [b.monotonic - a.monotonic for a, b in itertools.pairwise(seen)]
    assert min(gaps) >= gap, f"two requests {min(gaps):.3f} s apart"


async def test_a_backfill_past_the_first_polls_pages_is_read_to_its_end_each_post_once(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    # A poll reads five pages of forty at most: a backfill of 250 took the first poll's
    # 200 and left the rest unread for good.
    backfill = 250
    async with fediverse(stack, state_dir, posts=400) as setup:
        instance = setup.instance
        local = instance.timeline(local=True)
        assert len(local) > backfill
        want = {instance.status_uri(s) for s in local[:backfill] if instance.may_share(s)}
        await follow_by_nats(stack, f'{{"instance": "{setup.origin}", "backfill": {backfill}}}')

        async def read() -> list[TimelinePolled]:
            setup.local.check_alive()
            return await polls(bus)

        def done(events: list[TimelinePolled]) -> bool:
            return any(e.cursor_before is not None and e.back_from is None for e in events)

        events = await eventually(read, until=done, timeout=60, what="the backfill read")
    events.sort(key=lambda e: e.poll)
    first = events[0]
    assert (first.cursor_before, first.more) == (None, True)
    assert first.back_from is not None
    assert first.back_left == backfill - len(first.posts) - first.skipped > 0
    posts = [post.uri for event in events for post in event.posts]
    assert len(posts) == len(set(posts))
    assert set(posts) == want
    assert sum(event.skipped for event in events) == backfill - len(want)
