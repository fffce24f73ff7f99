"""The fetcher as a real process (or two) against real NATS, Postgres and HTTP servers."""

from __future__ import annotations

import itertools
import os
import signal
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.fetcher._pods import (
    HOSTS,
    POD_A,
    POD_B,
    agent,
    fetcher_pod,
    hold_work,
    stalled_env,
    stalled_site,
    still_held,
)
from tests.support import outcomes, publish_work, query, sandbox_env, services
from trove_sandbox.server import serve_sandbox
from trove_sandbox.web import SandboxWeb
from trove_schema.bus import Bus

pytestmark = pytest.mark.usefixtures("clean")

ALLOW_ALL = "User-agent: *\nAllow: /\n"


async def test_two_fetchers_never_send_two_requests_to_one_host_closer_than_the_gap(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    gap = 1.0
    web = SandboxWeb.generate(hosts=4, pages_per_host=6)
    # One message in hand per pod and four unacked in all: each pod holds at most three,
    # so the work is shared out rather than taken by whichever pod pulls first.
    env = sandbox_env(web, gap, TROVE_CONCURRENCY="1", TROVE_MAX_ACK_PENDING="4")
    async with (
        serve_sandbox(web) as running,
        services(stack, state_dir, env, only=("recorder",)) as recorder,
        fetcher_pod(stack, state_dir, env, POD_A) as pod_a,
        fetcher_pod(stack, state_dir, env, POD_B) as pod_b,
    ):
        urls = [u for h in web.hosts for u in [web.url(h.name, "/"), *web.articles(h.name)]]
        await publish_work(bus, urls)

        async def done() -> int:
            for local in (recorder, pod_a, pod_b):
                local.check_alive()
            return len(await outcomes(engine))

        await eventually(done, until=lambda n: n == len(urls), timeout=90, what="all fetched")
    witness = running.witness
    # Both pods took part, and followed each other on a host: the gap below is kept
    # between two pods, not by one alone.
    senders = Counter(r.user_agent for r in witness.requests())
    assert set(senders) == {agent(POD_A), agent(POD_B)}, f"senders: {senders}"
    handovers = sum(
        a.user_agent != b.user_agent
        for host in web.hosts
        for a, b in itertools.pairwise(witness.requests(host.name))
    )
    assert handovers, "the pods never followed each other on a host"
    for host in web.hosts:
        floor = max(gap, web.crawl_delay(host.name) or 0.0)
        seen = witness.min_gap(host.name)
        assert seen is not None
        assert seen >= floor, f"{host.name}: two requests {seen:.3f}s apart (gap {floor})"
    assert not any("/private/" in r.path for r in witness.requests())


async def test_a_big_domain_does_not_hold_up_small_ones(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    """300 pages on one host, 3 on each of 30 others, gap 1 s, only 10 messages in flight."""
    gap = 1.0
    web = SandboxWeb.generate(hosts=31, pages_per_host=1, base_ip="127.0.0.100")
    big, *small = [h.name for h in web.hosts]
    for host in web.hosts:
        web.set_robots(host.name, ALLOW_ALL)
    for n in range(300):
        web.add_page(big, f"/p/{n}.html", f"<title>page {n}</title><p>big page {n}</p>")
    for h in small:
        for n in range(3):
            web.add_page(h, f"/s/{n}.html", f"<title>{h} {n}</title><p>small page</p>")
    env = sandbox_env(web, gap, TROVE_MAX_ACK_PENDING="10")
    async with serve_sandbox(web) as running, services(stack, state_dir, env):
        # URLs carry the port, known once the sandbox is serving.
        big_urls = [web.url(big, f"/p/{n}.html") for n in range(300)]
        small_urls = [web.url(h, f"/s/{n}.html") for h in small for n in range(3)]
        witness = running.witness
        await publish_work(bus, big_urls)  # the big domain's pages queue first
        await publish_work(bus, small_urls)

        def small_paths_done() -> bool:
            return all(
                len({r.path for r in witness.requests(h) if r.path.startswith("/s/")}) == 3
                for h in small
            )

        # The big queue takes a gap a page to drain: small domains held up behind it would
        # wait that long. The deadline is a share of that, not of this machine's speed.
        drain = len(big_urls) * gap
        try:
            await witness.wait_for(lambda _w: small_paths_done(), within=drain / 4)
        except TimeoutError:
            counts = {h: len(witness.requests(h)) for h in [big, *small]}
            log = (state_dir / "logs" / "fetcher-0.log").read_text()[-3000:]
            raise AssertionError(f"{counts}\n{log}") from None
        # Every small domain was done while the big queue was still draining.
        big_requests = witness.requests(big)
        big_pages = {r.path for r in big_requests if r.path.startswith("/p/")}
        assert len(big_pages) < len(big_urls), "the small domains waited for the big one"
        # Meanwhile the big one proceeds at one request per gap, never faster: its rate is
        # held to the span the witness saw (the small domains' work does not slow it), not
        # to seconds of this machine.
        shortest = witness.min_gap(big)
        assert shortest is not None
        assert shortest >= gap
        elapsed = big_requests[-1].monotonic - big_requests[0].monotonic
        assert len(big_requests) >= 0.8 * (elapsed / gap), (
            f"big domain: {len(big_requests)} requests in {elapsed:.1f}s"
        )


async def test_robots_rules_are_obeyed_and_recorded(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    web = SandboxWeb.generate(hosts=3, pages_per_host=2, base_ip="127.0.0.140")
    disallowing, missing, failing = (h.name for h in web.hosts)
    web.set_robots(
        disallowing, "User-agent: TroveBot\nDisallow: /posts/\n\nUser-agent: *\nAllow: /\n"
    )
    web.set_robots_status(missing, 404)
    web.set_robots_status(failing, 503)
    # A 503 on robots.txt pauses its host for the doubling rate pause: scaled down, or
    # the failing host's second page waits a minute, near the test's deadline.
    env = sandbox_env(web, 0.3, TROVE_RATE_PAUSE_SECONDS="1")
    async with serve_sandbox(web) as running, services(stack, state_dir, env):
        urls = {h.name: [web.url(h.name, "/"), *web.articles(h.name)] for h in web.hosts}
        await publish_work(bus, [u for group in urls.values() for u in group])

        async def recorded() -> dict[str, str]:
            return await outcomes(engine)

        result = await eventually(
            recorded, until=lambda r: len(r) == 6, timeout=60, what="every page recorded"
        )
        paths = {h.name: running.witness.paths(h.name) for h in web.hosts}
    # TroveBot's group wins over *: the disallowed articles are never requested.
    assert [result[u] for u in urls[disallowing]] == ["success", "blocked_robots"]
    assert not any(p.startswith("/posts/") for p in paths[disallowing])
    # robots.txt 404: everything allowed.
    assert [result[u] for u in urls[missing]] == ["success", "success"]
    # robots.txt 5xx: nothing but robots.txt is requested; the pages are retried later.
    assert [result[u] for u in urls[failing]] == ["failed", "failed"]
    assert paths[failing] == ["/robots.txt"]


async def test_misbehaving_servers_end_in_recorded_outcomes(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    web = SandboxWeb.generate(hosts=1, pages_per_host=1, base_ip="127.0.0.150", with_trap=True)
    trap = web.trap_host
    assert trap is not None
    cases = {
        "/huge": "success",  # cut at the body cap, still parsed
        "/slow-body": "timeout",
        "/redirect-loop": "failed",
        "/binary.pdf": "success",  # read by the PDF reader: unreadable, a thin extraction
        "/bad-charset": "success",
        "/gzip-bomb": "rejected",  # a decompression bomb is refused
        "/status/404": "blocked_4xx",
        "/status/500": "blocked_5xx",
        "/redirect-cross": "rejected",
    }
    # The host pauses after each failure (5xx, timeout) and its gap grows with its
    # response time (the stalled body): scaled down, or the pages would wait minutes.
    env = sandbox_env(
        web,
        0.2,
        TROVE_REQUEST_TIMEOUT="3",
        TROVE_READ_TIMEOUT="2",
        TROVE_HOST_PAUSE_SECONDS="0.2",
        TROVE_GAP_RESPONSE_FACTOR="0",
    )
    async with serve_sandbox(web), services(stack, state_dir, env) as local:
        await publish_work(bus, [web.url(trap, path) for path in cases])

        async def recorded() -> dict[str, str]:
            local.check_alive()
            return await outcomes(engine)

        # The cross-host redirect's target is crawled too (work published as here is a
        # page named directly): wait for the cases themselves.
        urls = [web.url(trap, path) for path in cases]
        result = await eventually(
            recorded, until=lambda r: all(u in r for u in urls), timeout=90, what="all outcomes"
        )
    got = {path: result[web.url(trap, path)] for path in cases}
    assert got == cases
    (cross,) = await query(
        engine,
        "SELECT t.url FROM page_links l JOIN pages f ON f.id = l.from_page_id "
        "JOIN pages t ON t.id = l.to_page_id WHERE f.url = :u AND l.kind = 'redirect'",
        u=web.url(trap, "/redirect-cross"),
    )
    # Not followed, but recorded in the graph (and discovered, to get its own lease).
    assert urlsplit(cross.url).hostname == web.hosts[0].name


async def test_a_fetcher_killed_mid_crawl_loses_nothing_and_stays_polite(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, state_dir: Path
) -> None:
    gap = 0.3
    # What the victim held comes back after the ack wait, and a lease it dies holding keeps
    # its host for the request timeout: both scaled down, as both are in a pod's death.
    # The request timeout outlasts the other pod's start, while the victim asks.
    env = stalled_env("127.0.0.160", gap, TROVE_ACK_WAIT_SECONDS="5", TROVE_REQUEST_TIMEOUT="15")
    with stalled_site("127.0.0.160") as site:
        urls = [site.stalled, *site.waiting]
        async with (
            services(stack, state_dir, env, only=("recorder",)) as recorder,
            fetcher_pod(stack, state_dir, env, POD_A) as pod_a,
        ):
            await hold_work(bus, site, POD_A)
            async with fetcher_pod(stack, state_dir, env, POD_B) as pod_b:
                await still_held(bus, site, POD_A)
                (victim,) = pod_a.children
                pod_a.children.remove(victim)  # not to be restarted
                os.killpg(victim.pid, signal.SIGKILL)  # mid-request, holding work it never acks
                victim.proc.wait(10)
                site.release.set()

                async def recorded() -> dict[str, str]:
                    recorder.check_alive()
                    pod_b.check_alive()
                    return await outcomes(engine)

                # Every page's latest attempt (an exploring one is followed by another).
                result = await eventually(
                    recorded,
                    until=lambda r: len(r) == len(urls) and set(r.values()) == {"success"},
                    timeout=90,
                    what="every page",
                )
    assert set(result.values()) == {"success"}
    # An exploring attempt that got nothing usable is rejected, and the page fetched again.
    sql = "SELECT count(*) AS n FROM page_crawls WHERE outcome = 'success'"
    (row,) = await query(engine, sql)
    assert row.n == len(urls)  # a redelivered job republishes the same attempt id
    # All the victim held came back, to the other pod: the page it was asking for, asked
    # again, and the pages it held unstarted.
    asked = site.senders(site.stalled)
    assert asked[0] == agent(POD_A)
    assert set(asked[1:]) == {agent(POD_B)}, asked
    for url in site.waiting:
        assert set(site.senders(url)) == {agent(POD_B)}, url
    for host in HOSTS:
        shortest = site.server.min_gap(host)
        assert shortest is None or shortest >= gap, host
