"""A host the operator excludes, all three services running, re-crawls scaled to seconds.

Two sites are crawled; then one of them is excluded, as an operator does after a
removal request: by rolling the services out with it in ``TROVE_EXCLUDED_HOSTS``, or
with ``trove exclude`` while they run (the shared list). The witness is that site's own
request log: from the rollout, or from the list's reading, on it gets no request at all
(robots.txt included), though its pages' re-crawls were already scheduled and the other
site still links to it; its pages leave the search within seconds; a seed for it
is refused with the reason; a third site whose robots.txt redirects to it is not
crawled, its rules unread; and the other site is crawled as before.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.fetcher._servers import Exchange, LocalServer
from tests.support import cycle_env, query, run_trove, services
from trove_cli.local import LocalTrove
from trove_cli.search import search
from trove_schema.changes import changed_pages, window_end
from trove_schema.topology import FOLLOW_SUBJECT, SEEDS_SUBJECT

RECRAWL = 3.0
PAGES = 3


def site(server: LocalServer, word: str) -> set[str]:
    """A home page and PAGES pages about ``word``, each linking to all of them."""
    paths = ["/"] + [f"/{word}/{n}" for n in range(PAGES)]
    links = "".join(f'<a href="{p}">{p}</a> ' for p in paths)
    body = f"<html><head><title>{word}</title></head><body><p>{word}</p>{links}</body></html>"

    def page(exchange: Exchange) -> None:
        exchange.send(200, body.encode())

    server.routes.update(dict.fromkeys(paths, page))
    return {server.url(p) for p in paths}


def found(engine: AsyncEngine, local: LocalTrove, word: str) -> Callable[[], Awaitable[set[str]]]:
    """A probe: the URLs a search for ``word`` finds, while the services are alive."""

    async def probe() -> set[str]:
        local.check_alive()
        return {hit.url for hit in await search(engine, word, limit=50)}

    return probe


async def seeded(stack: StackUrls, *urls: str) -> None:
    """``urls`` published as seeds, one a line, as `nats pub trove.seeds` does."""
    nc = await nats.connect(stack.nats_url)
    try:
        await nc.publish(SEEDS_SUBJECT, "\n".join(urls).encode())
        await nc.flush()
    finally:
        await nc.close()


async def searchable(engine: AsyncEngine, local: LocalTrove, pages: dict[str, set[str]]) -> None:
    """Wait until a search for each word finds exactly its pages."""
    for word, urls in pages.items():
        await eventually(
            found(engine, local, word),
            until=lambda hits, u=urls: hits == u,  # type: ignore[misc]
            timeout=40,
            what=f"the {word} pages searchable",
        )


@pytest.mark.usefixtures("clean")
async def test_an_excluded_host_gets_no_request_and_leaves_the_search(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    env = cycle_env(RECRAWL)
    with (
        LocalServer("127.0.0.6") as gone,
        LocalServer("127.0.0.4") as kept,
        LocalServer("127.0.0.7") as redirecting,
    ):
        redirecting.routes["/robots.txt"] = lambda ex: ex.redirect(gone.url("/robots.txt"), 301)
        redirecting_urls = site(redirecting, "plover")
        gone_urls = site(gone, "kingfisher")
        kept_urls = site(kept, "heron")
        # The kept site links to every page of the other one.
        links = "".join(f'<a href="{u}">x</a>' for u in sorted(gone_urls))
        kept.routes["/links"] = lambda exchange: exchange.send(
            200, f"<html><body><p>heron</p>{links}</body></html>".encode()
        )
        kept_urls.add(kept.url("/links"))

        async with services(stack, state_dir, env) as local:
            await seeded(stack, kept.url(), kept.url("/links"), gone.url())
            await searchable(engine, local, {"kingfisher": gone_urls, "heron": kept_urls})

        rollout = time.monotonic()
        kept_before = len(kept.seen)
        async with services(stack, state_dir, env | {"TROVE_EXCLUDED_HOSTS": gone.ip}) as local:
            await eventually(
                found(engine, local, "kingfisher"),
                until=lambda hits: not hits,
                timeout=40,
                what="the excluded site out of the search",
            )
            # Out of the search at once (the recorder marks the pages); each page's
            # next visit, already scheduled, is refused without a request.
            await eventually(
                lambda: query(
                    engine,
                    "SELECT count(DISTINCT page_id) FROM page_crawls"
                    " WHERE domain = :d AND outcome = 'rejected'",
                    d=gone.ip,
                ),
                until=lambda counted: counted[0][0] == len(gone_urls),
                timeout=40,
                what="each page's next visit refused",
            )
            nc = await nats.connect(stack.nats_url)
            try:
                reply = await nc.request(
                    SEEDS_SUBJECT, json.dumps({"url": gone.url("/new")}).encode(), timeout=10
                )
                follow = await nc.request(
                    FOLLOW_SUBJECT, json.dumps({"instance": gone.url()}).encode(), timeout=10
                )
                await nc.publish(SEEDS_SUBJECT, redirecting.url().encode())
            finally:
                await nc.close()
            # Its rules live on the excluded host: none of its pages is asked for.
            redirected = await eventually(
                lambda: query(
                    engine,
                    "SELECT c.outcome, c.error_message FROM page_crawls c"
                    " JOIN pages p ON p.id = c.page_id WHERE p.url = :u",
                    u=redirecting.url(),
                ),
                until=bool,
                timeout=40,
                what="the redirecting site's home recorded",
            )
            # The kept site goes on: its pages are visited again after the rollout.
            await eventually(
                found(engine, local, "heron"),
                until=lambda hits: hits == kept_urls and len(kept.seen) > kept_before,
                timeout=40,
                what="the kept site re-crawled",
            )
        after = [s.path for s in gone.seen if s.at >= rollout]
        statuses = dict(
            await query(engine, "SELECT url, status FROM pages WHERE domain = :d", d=gone.ip)
        )
        reasons = {
            row[0]
            for row in await query(
                engine,
                "SELECT DISTINCT error_message FROM page_crawls WHERE domain = :d"
                " AND completed_at > now() - interval '1 minute' AND outcome <> 'success'",
                d=gone.ip,
            )
        }

    assert after == [], f"requests to the excluded host after the rollout: {after}"
    assert [row.outcome for row in redirected] == ["blocked_robots"]
    assert [s.path for s in redirecting.seen] == ["/robots.txt"]
    assert len(redirecting_urls) == PAGES + 1  # pages it would have had asked for
    (refused,) = json.loads(reply.data)["rejected"]
    (not_followed,) = json.loads(follow.data)["rejected"]
    for answer in (refused, not_followed):
        assert answer["reason"] == f"host {gone.ip} is excluded by the operator ({gone.ip})"
    # Declined as the operator's choice, without a request: not a failure to retry.
    assert statuses == dict.fromkeys(gone_urls, "rejected")
    assert reasons == {f"host {gone.ip} is excluded by the operator ({gone.ip})"}


@pytest.mark.usefixtures("clean")
async def test_a_host_put_on_the_shared_list_mid_crawl_is_left_alone_within_seconds(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    """No rollout: `trove exclude` while the services run, then `trove include`."""
    refresh = 0.5
    env = cycle_env(RECRAWL, TROVE_EXCLUSIONS_REFRESH_SECONDS=str(refresh))
    cli = {**os.environ, "TROVE_NATS_URL": stack.nats_url}
    with LocalServer("127.0.0.7") as gone, LocalServer("127.0.0.8") as kept:
        gone_urls = site(gone, "sandpiper")
        kept_urls = site(kept, "plover")

        async with services(stack, state_dir, env) as local:
            nc = await nats.connect(stack.nats_url)
            try:
                await nc.publish(SEEDS_SUBJECT, f"{kept.url()}\n{gone.url()}".encode())
                await nc.flush()
                await searchable(engine, local, {"sandpiper": gone_urls, "plover": kept_urls})
                # Both sites are being visited again, every RECRAWL seconds.
                code, printed = await run_trove(
                    "exclude", gone.ip, "--reason", "removal request", env=cli
                )
                assert code == 0, printed
                # Read within the refresh; a request already past the check still lands.
                settled = time.monotonic() + refresh + 1.5
                await eventually(
                    found(engine, local, "sandpiper"),
                    until=lambda hits: not hits,
                    timeout=40,
                    what="the excluded site out of the search",
                )
                reply = await nc.request(
                    SEEDS_SUBJECT, json.dumps({"url": gone.url("/new")}).encode(), timeout=10
                )
                kept_before = len(kept.seen)
                await eventually(
                    found(engine, local, "plover"),
                    until=lambda hits: hits == kept_urls and len(kept.seen) > kept_before,
                    timeout=40,
                    what="the kept site visited again",
                )
                after = [s.path for s in gone.seen if s.at >= settled]

                code, printed = await run_trove("include", gone.ip, env=cli)
                assert code == 0, printed
                lifted = time.monotonic()

                async def seed_answer() -> dict[str, list[dict[str, str]]]:
                    answer = await nc.request(
                        SEEDS_SUBJECT,
                        json.dumps({"url": gone.url(), "force": True}).encode(),
                        timeout=10,
                    )
                    return json.loads(answer.data)  # type: ignore[no-any-return]

                accepted = await eventually(
                    seed_answer,
                    until=lambda answer: not answer["rejected"],
                    timeout=10,
                    what="a seed for the host accepted again",
                )
                await eventually(
                    found(engine, local, "sandpiper"),
                    until=lambda hits: gone.url() in hits,
                    timeout=40,
                    what="the host crawled again",
                )
            finally:
                await nc.close()

    assert after == [], f"requests to the excluded host after the list was read: {after}"
    (refused,) = json.loads(reply.data)["rejected"]
    assert refused["reason"] == f"host {gone.ip} is excluded by the operator ({gone.ip})"
    assert [a["url"] for a in accepted["accepted"]] == [gone.url()]
    assert any(s.at >= lifted for s in gone.seen)


@pytest.mark.usefixtures("clean")
async def test_an_excluded_hosts_pages_leave_the_tables_index_before_their_next_visit(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    """A removal request reaches an index kept from the tables within the refresh, not
    at the pages' next visits (here an hour away): the recorder marks them rejected, a
    change the index reads (``trove_schema.changes``)."""
    refresh = 0.5
    env = cycle_env(3600.0, TROVE_EXCLUSIONS_REFRESH_SECONDS=str(refresh))
    cli = {**os.environ, "TROVE_NATS_URL": stack.nats_url}
    with LocalServer("127.0.0.9") as gone, LocalServer("127.0.0.10") as kept:
        gone_urls = site(gone, "avocet")
        kept_urls = site(kept, "dunlin")
        async with services(stack, state_dir, env) as local:
            await seeded(stack, kept.url(), gone.url())
            await searchable(engine, local, {"avocet": gone_urls, "dunlin": kept_urls})
            async with engine.connect() as conn:
                since = await window_end(conn)
            code, printed = await run_trove("exclude", gone.ip, env=cli)
            assert code == 0, printed
            await eventually(
                found(engine, local, "avocet"),
                until=lambda hits: not hits,
                timeout=10 * refresh + 10,
                what="the excluded site's pages out of the tables' index",
            )
            assert await found(engine, local, "dunlin")() == kept_urls
            async with engine.connect() as conn:
                changed = await changed_pages(conn, since, await window_end(conn))
            requests = len(gone.seen)
    # An index reading the window since the exclusion drops exactly those pages.
    assert {page.url: page.indexable for page in changed} == dict.fromkeys(gone_urls, False)
    assert requests == len(gone_urls) + 1  # each page once and robots.txt: no visit since


@pytest.mark.usefixtures("clean")
async def test_a_seed_or_a_follow_right_after_exclude_or_include_is_judged_on_the_new_list(
    stack: StackUrls, state_dir: Path
) -> None:
    """An operator's next command must not meet the old list: discovery reads it again
    for each seed and follow, while links wait for the periodic refresh (here never)."""
    env = cycle_env(RECRAWL, TROVE_EXCLUSIONS_REFRESH_SECONDS="3600")
    cli = {**os.environ, "TROVE_NATS_URL": stack.nats_url}
    host = "127.0.0.9"
    seed = json.dumps({"url": f"http://{host}:8080/"}).encode()
    follow = json.dumps({"instance": f"http://{host}:8080/"}).encode()

    async def ask(nc: NATS, subject: str, payload: bytes) -> dict[str, list[Any]]:
        answer = await nc.request(subject, payload, timeout=10)
        return json.loads(answer.data)  # type: ignore[no-any-return]

    async with services(stack, state_dir, env, only=("discovery",)):
        nc = await nats.connect(stack.nats_url)
        try:
            code, printed = await run_trove("exclude", host, "--reason", "asked", env=cli)
            assert code == 0, printed
            refused_seed = await ask(nc, SEEDS_SUBJECT, seed)
            refused_follow = await ask(nc, FOLLOW_SUBJECT, follow)
            code, printed = await run_trove("include", host, env=cli)
            assert code == 0, printed
            accepted_seed = await ask(nc, SEEDS_SUBJECT, seed)
            accepted_follow = await ask(nc, FOLLOW_SUBJECT, follow)
        finally:
            await nc.close()

    reason = f"host {host} is excluded by the operator ({host})"
    assert [r["reason"] for r in refused_seed["rejected"]] == [reason]
    assert [r["reason"] for r in refused_follow["rejected"]] == [reason]
    assert (len(accepted_seed["accepted"]), accepted_seed["rejected"]) == (1, [])
    assert (len(accepted_follow["accepted"]), accepted_follow["rejected"]) == (1, [])


@pytest.mark.usefixtures("clean")
async def test_an_included_host_comes_back_at_its_pages_next_visit_without_a_seed(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    """Excluded long enough for every page's visit to come due, then included: each page
    is crawled again at its next visit, though its seen key (a production-like seen TTL,
    far longer than the interval) says it is known to any link or plain seed."""
    refresh = 0.5
    env = cycle_env(
        RECRAWL, TROVE_EXCLUSIONS_REFRESH_SECONDS=str(refresh), TROVE_SEEN_TTL_SECONDS="600"
    )
    cli = {**os.environ, "TROVE_NATS_URL": stack.nats_url}
    with LocalServer("127.0.0.10") as gone, LocalServer("127.0.0.11") as kept:
        gone_urls = site(gone, "curlew")
        kept_urls = site(kept, "dunlin")
        async with services(stack, state_dir, env) as local:
            await seeded(stack, kept.url(), gone.url())
            await searchable(engine, local, {"curlew": gone_urls, "dunlin": kept_urls})
            code, printed = await run_trove("exclude", gone.ip, env=cli)
            assert code == 0, printed
            # Every page's visit came due and was refused: all of them out of the search.
            await eventually(
                found(engine, local, "curlew"),
                until=lambda hits: not hits,
                timeout=40,
                what="the excluded site out of the search",
            )
            # Taken before the command: a visit may come due between the rule's lifting
            # and the command's exit, and none could reach the site while it held.
            lifted = time.monotonic()
            code, printed = await run_trove("include", gone.ip, env=cli)
            assert code == 0, printed
            await searchable(engine, local, {"curlew": gone_urls})
        statuses = dict(
            await query(engine, "SELECT url, status FROM pages WHERE domain = :d", d=gone.ip)
        )

    assert {s.path for s in gone.seen if s.at >= lifted} >= {
        "/",
        *(f"/curlew/{n}" for n in range(PAGES)),
    }
    assert statuses == dict.fromkeys(gone_urls, "fetched")
