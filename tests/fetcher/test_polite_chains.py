"""Every request is polite, redirect hops included, and no work is lost to the horizon.

The fetcher runs as a real process against real NATS and a real HTTP server that plays
several hosts (by the Host header); the server's own request log is the witness.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
from nats.js.errors import KeyNotFoundError

from tests.conftest import StackUrls, eventually
from tests.fetcher._completions import Completions
from tests.fetcher._servers import Exchange, LocalServer, Route, serving
from tests.ports import free_port
from tests.support import publish_work, scraped, services
from trove_schema.bus import Bus
from trove_schema.topology import DOMAINS_BUCKET, EVENTS_STREAM, FETCHER
from trove_schema.urls import canonicalize

pytestmark = pytest.mark.usefixtures("clean")

IP = "127.0.0.181"
A, B = "a.chains.test", "b.chains.test"
GAP = 0.5


def env(gap: float = GAP, **extra: str) -> dict[str, str]:
    return {
        "TROVE_RESOLVE": f"{A}={IP},{B}={IP}",
        "TROVE_ALLOWED_NETWORKS": f"{IP}/32",
        "TROVE_MIN_DOMAIN_DELAY_SECONDS": str(gap),
        **extra,
    }


def text(body: str) -> Route:
    return lambda ex: ex.send(200, body.encode(), content_type="text/plain")


def page(title: str) -> Route:
    return lambda ex: ex.send(200, f"<title>{title}</title><p>{title}</p>".encode())


def to(location: str, status: int = 302) -> Route:
    return lambda ex: ex.redirect(location, status)


async def reservation_horizon(port: int) -> float:
    (value,) = [
        sample.value
        for sample in await scraped(port)
        if sample.name == "trove_reservation_horizon_seconds"
    ]
    return value


async def read_lag(port: int) -> tuple[float, float]:
    """``trove_fetch_read_lag_seconds``: how many answers, and their lags in all."""
    samples = {sample.name: sample.value for sample in await scraped(port)}
    return (
        samples["trove_fetch_read_lag_seconds_count"],
        samples["trove_fetch_read_lag_seconds_sum"],
    )


async def leases(port: int) -> dict[str, float]:
    """``trove_leases_total`` by decision."""
    return {
        sample.labels["decision"]: sample.value
        for sample in await scraped(port)
        if sample.name == "trove_leases_total"
    }


def url(server: LocalServer, host: str, path: str) -> str:
    return canonicalize(server.url(path, host))


def assert_polite(server: LocalServer, host: str, gap: float) -> None:
    seen = server.min_gap(host)
    assert seen is not None, f"fewer than two requests to {host}"
    assert seen >= gap, f"{host}: two requests {seen:.3f}s apart (gap {gap})"


async def test_each_redirect_hop_waits_for_the_gap(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    routes: dict[str, Route] = {f"{A}/robots.txt": text("User-agent: *\nDisallow: /private/\n")}
    for chain in ("c0", "c1"):  # four hops each: /0 -> /1 -> /2 -> /3 -> /4
        for hop in range(4):
            routes[f"{A}/{chain}/{hop}"] = to(f"/{chain}/{hop + 1}")
        routes[f"{A}/{chain}/4"] = page(chain)
    routes[f"{A}/c2/0"] = to("/c2/1")
    routes[f"{A}/c2/1"] = to("/private/2")  # a hop robots.txt disallows
    with serving(routes, IP) as server:
        starts = {c: url(server, A, f"/{c}/0") for c in ("c0", "c1", "c2")}
        async with services(stack, state_dir, env(), only=("fetcher",)) as local:
            await publish_work(bus, list(starts.values()))
            completions = Completions(bus.js)
            local.check_alive()
            events = await completions.wait_for(3)
        assert_polite(server, A, GAP)
        paths = [s.path for s in server.requests_for(A)]
    for chain in ("c0", "c1"):
        event = events[starts[chain]]  # the page keeps its identity, the original URL
        assert event.outcome.value == "success", event
        assert event.final_url == url(server, A, f"/{chain}/4")
        assert event.title == chain
        assert [p for p in paths if p.startswith(f"/{chain}/")] == [
            f"/{chain}/{n}" for n in range(5)
        ]
    assert events[starts["c2"]].outcome.value == "blocked_robots"
    assert "/private/2" not in paths
    assert paths.count("/robots.txt") == 1


async def test_a_page_moved_for_good_says_so_across_its_paused_hops(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    """Each hop waits for the host's gap (paused, deferred and resumed): the attempt says
    the page moved only when every hop was a permanent redirect (301, 308)."""
    gap = 1.5  # past the wait a hop may take in its task: each hop is deferred
    routes: dict[str, Route] = {f"{A}/robots.txt": text("User-agent: *\n")}
    chains = {"for-good": (301, 308), "for-now": (302, 302), "mixed": (301, 307)}
    for name, (first, second) in chains.items():
        routes[f"{A}/{name}/0"] = to(f"/{name}/1", first)
        routes[f"{A}/{name}/1"] = to(f"/{name}/2", second)
        routes[f"{A}/{name}/2"] = page(name)
    with serving(routes, IP) as server:
        starts = {name: url(server, A, f"/{name}/0") for name in chains}
        async with services(stack, state_dir, env(gap), only=("fetcher",)) as local:
            await publish_work(bus, list(starts.values()))
            completions = Completions(bus.js)
            local.check_alive()
            events = await completions.wait_for(len(chains), timeout=120)
        assert_polite(server, A, gap)
    for name, start in starts.items():
        assert events[start].final_url == url(server, A, f"/{name}/2")
    assert {name: events[start].moved for name, start in starts.items()} == {
        "for-good": True,
        "for-now": False,
        "mixed": False,
    }


async def test_a_robots_redirect_to_another_host_waits_for_that_hosts_gap(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    routes: dict[str, Route] = {
        f"{B}/robots.txt": text("User-agent: *\nDisallow: /no/\n"),
        f"{A}/p/0": page("a0"),
        f"{A}/no/1": page("a1"),
    }
    for n in range(3):
        routes[f"{B}/p/{n}"] = page(f"b{n}")
    with serving(routes, IP) as server:
        server.routes[f"{A}/robots.txt"] = to(server.url("/robots.txt", B), status=301)
        b_pages = [url(server, B, f"/p/{n}") for n in range(3)]
        a_pages = [url(server, A, "/p/0"), url(server, A, "/no/1")]
        async with services(stack, state_dir, env(), only=("fetcher",)) as local:
            await publish_work(bus, b_pages)  # B's own robots.txt and pages come first
            await publish_work(bus, a_pages)
            completions = Completions(bus.js)
            local.check_alive()
            events = await completions.wait_for(5)
        assert_polite(server, B, GAP)
        assert_polite(server, A, GAP)
        b_paths = [s.path for s in server.requests_for(B)]
        a_paths = [s.path for s in server.requests_for(A)]
    # B's file was read for B, and (redirected) for A, always under B's lease. While A's
    # chain waits for B, A's other page may take A's lease and ask A's robots.txt again.
    assert 2 <= b_paths.count("/robots.txt") <= a_paths.count("/robots.txt") + 1
    assert a_paths.count("/p/0") == 1
    assert "/no/1" not in a_paths
    # A's pages obey the file A's robots.txt redirected to.
    assert events[a_pages[0]].outcome.value == "success"
    assert events[a_pages[1]].outcome.value == "blocked_robots"
    assert all(events[u].outcome.value == "success" for u in b_pages)


async def test_a_crawl_delay_read_through_a_redirect_is_the_origins_gap_too(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    """A's robots.txt redirects to B's (www. to the bare domain), which asks for 1.5 s."""
    delay = 1.5
    routes: dict[str, Route] = {
        f"{B}/robots.txt": text(f"User-agent: *\nCrawl-delay: {delay}\n"),
        **{f"{A}/p/{n}": page(f"a{n}") for n in range(3)},
    }
    with serving(routes, IP) as server:
        server.routes[f"{A}/robots.txt"] = to(server.url("/robots.txt", B), status=301)
        a_pages = [url(server, A, f"/p/{n}") for n in range(3)]
        async with services(stack, state_dir, env(), only=("fetcher",)) as local:
            await publish_work(bus, a_pages)
            completions = Completions(bus.js)
            local.check_alive()
            events = await completions.wait_for(3)
        assert all(events[u].outcome.value == "success" for u in a_pages)
        assert_polite(server, A, delay)


async def test_a_robots_txt_redirected_to_another_hosts_page_leaves_that_hosts_gap_alone(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    """A's robots.txt redirects to B's home page, which is no robots.txt: B keeps the
    Crawl-delay its own file asks for."""
    delay = 1.5
    routes: dict[str, Route] = {
        f"{B}/robots.txt": text(f"User-agent: *\nCrawl-delay: {delay}\n"),
        f"{B}/": page("b home"),
        f"{A}/p/0": page("a0"),
        **{f"{B}/p/{n}": page(f"b{n}") for n in range(4)},
    }
    with serving(routes, IP) as server:
        server.routes[f"{A}/robots.txt"] = to(server.url("/", B), status=301)
        b_pages = [url(server, B, f"/p/{n}") for n in range(4)]
        async with services(stack, state_dir, env(), only=("fetcher",)) as local:
            completions = Completions(bus.js)
            await publish_work(bus, b_pages[:1])  # B's robots.txt and Crawl-delay first
            await completions.wait_for(1)
            await publish_work(bus, [url(server, A, "/p/0")])
            await completions.wait_for(2)
            await publish_work(bus, b_pages[1:])
            local.check_alive()
            events = await completions.wait_for(5)
        b_paths = [seen.path for seen in server.requests_for(B)]
    assert all(event.outcome.value == "success" for event in events.values())
    assert "/" in b_paths  # A's robots.txt was read at B's home page
    assert_polite(server, B, delay)


@pytest.mark.parametrize("other", ["missing", "sent home"])
async def test_a_crawl_delay_holds_for_every_origin_of_the_host(
    stack: StackUrls, bus: Bus, state_dir: Path, other: str
) -> None:
    """robots.txt is an origin's, the gap its host's: the ``http://`` origin of a host
    whose ``https://`` file asks for 1.5 s answers 404, or sends every path to the home
    page (nginx's ``return 301 https://$host;``), and says nothing of a Crawl-delay."""
    delay = 1.5
    with serving({f"{A}/robots.txt": text(f"User-agent: *\nCrawl-delay: {delay}\n")}, IP) as one:
        for n in range(3):
            one.routes[f"{A}/p/{n}"] = page(f"one {n}")
        with serving({f"{A}/q/{n}": page(f"two {n}") for n in range(3)}, IP) as two:
            if other == "sent home":
                two.routes[f"{A}/robots.txt"] = to(one.url("/", A), status=301)
                one.routes[f"{A}/"] = page("home")
            firsts = [url(one, A, "/p/0")]
            rest = [url(one, A, f"/p/{n}") for n in (1, 2)] + [
                url(two, A, f"/q/{n}") for n in range(3)
            ]
            async with services(stack, state_dir, env(), only=("fetcher",)) as local:
                completions = Completions(bus.js)
                await publish_work(bus, firsts)  # the first origin's Crawl-delay first
                await completions.wait_for(1)
                await publish_work(bus, rest)
                local.check_alive()
                events = await completions.wait_for(6)
            seen = sorted([*one.requests_for(A), *two.requests_for(A)], key=lambda s: s.at)
    assert all(event.outcome.value == "success" for event in events.values())
    closest = min(b.at - a.at for a, b in itertools.pairwise(seen))
    assert closest >= delay, f"two requests {closest:.3f}s apart (Crawl-delay {delay})"
    # Asked once: the pages queued behind a redirected file's next hop wait for it.
    assert [s.path for s in two.requests_for(A)].count("/robots.txt") == 1


async def test_the_pages_queued_behind_a_redirected_robots_txt_take_its_next_hop(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    """An ``http://`` origin sends its robots.txt to ``https://`` of the host: the hop
    waits for the host's gap, behind the pages queued before it. The first of them to
    come takes the hop: the file is asked for once at each origin, and no page is
    deferred more than once or twice."""
    pages = 12
    with (
        serving({f"{A}/robots.txt": text("User-agent: *\nDisallow: /no/\n")}, IP) as one,
        serving({f"{A}/q/{n}": page(f"q{n}") for n in range(pages)}, IP) as two,
    ):
        two.routes[f"{A}/robots.txt"] = to(one.url("/robots.txt", A), status=301)
        port = free_port()
        metrics = env(TROVE_HTTP_PORT=str(port))
        async with services(stack, state_dir, metrics, only=("fetcher",)) as local:
            completions = Completions(bus.js)
            await publish_work(bus, [url(two, A, f"/q/{n}") for n in range(pages)])
            local.check_alive()
            events = await completions.wait_for(pages)
            counts = await leases(port)
        asked = [*one.requests_for(A), *two.requests_for(A)]
    assert all(event.outcome.value == "success" for event in events.values())
    assert [s.path for s in asked].count("/robots.txt") == 2
    assert counts.get("deferred", 0) <= 2 * pages, counts


async def test_the_pages_queued_behind_a_robots_txt_sent_to_another_host_take_its_hop(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    """A's robots.txt is B's (``www.`` to the bare name), and B is busy: the hop waits
    for B's gap. The first page of A to come takes it under B's lease: A is asked for
    its file once."""
    pages = 12
    routes: dict[str, Route] = {f"{B}/robots.txt": text("User-agent: *\nDisallow: /no/\n")}
    for n in range(pages):
        routes[f"{B}/b/{n}"] = page(f"b{n}")
        routes[f"{A}/q/{n}"] = page(f"q{n}")
    with serving(routes, IP) as server:
        server.routes[f"{A}/robots.txt"] = to(server.url("/robots.txt", B), status=301)
        async with services(stack, state_dir, env(), only=("fetcher",)) as local:
            completions = Completions(bus.js)
            await publish_work(bus, [url(server, B, f"/b/{n}") for n in range(pages)])
            await publish_work(bus, [url(server, A, f"/q/{n}") for n in range(pages)])
            local.check_alive()
            events = await completions.wait_for(2 * pages)
        assert_polite(server, A, GAP)
        assert_polite(server, B, GAP)
        asked = [s.path for s in server.requests_for(A)]
    assert all(event.outcome.value == "success" for event in events.values())
    assert asked.count("/robots.txt") == 1, asked


async def test_a_robots_redirect_through_other_spellings_of_the_address_waits_for_its_gap(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    """A server crawled by its address sends its robots.txt through other spellings of
    that address: each one the same server, so each hop waits for its one gap."""
    ip = "127.0.0.189"
    spellings = ["2130706621", "0x7f0000bd", "127.0.0.0xbd", "0177.0.189"]
    routes: dict[str, Route] = {f"{ip}/p/{n}": page(f"p{n}") for n in range(3)}
    routes[f"{ip}/no/0"] = page("no")
    with serving(routes, ip) as server:
        for here, there in itertools.pairwise([ip, *spellings]):
            server.routes[f"{here}/robots.txt"] = to(server.url("/robots.txt", there), 301)
        server.routes[f"{spellings[-1]}/robots.txt"] = text("User-agent: *\nDisallow: /no/\n")
        pages = [url(server, ip, f"/p/{n}") for n in range(3)]
        refused = url(server, ip, "/no/0")
        spelt_env = env(TROVE_ALLOWED_NETWORKS=f"{ip}/32")
        async with services(stack, state_dir, spelt_env, only=("fetcher",)) as local:
            completions = Completions(bus.js)
            await publish_work(bus, pages[:1])  # robots.txt, through its chain, first
            await completions.wait_for(1)
            await publish_work(bus, [*pages[1:], refused])
            local.check_alive()
            events = await completions.wait_for(4)
        seen = sorted(server.seen, key=lambda s: s.at)
    # The server's own log, whatever name each request came by: one gap between any two.
    closest = min(b.at - a.at for a, b in itertools.pairwise(seen))
    assert closest >= GAP, f"two requests {closest:.3f}s apart (gap {GAP})"
    assert [s.host for s in seen if s.path == "/robots.txt"] == [ip, *spellings]
    assert sorted(s.path for s in seen if s.path != "/robots.txt") == ["/p/0", "/p/1", "/p/2"]
    assert all(events[u].outcome.value == "success" for u in pages)
    # The file at the end of the chain is the origin's.
    assert events[refused].outcome.value == "blocked_robots"


def _wait_stopped(pid: int, timeout: float = 5.0) -> None:
    """Until the kernel has stopped ``pid`` (a signal is delivered after ``kill`` returns)."""
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} not stopped within {timeout} s")
        time.sleep(0.001)  # the poll interval of a wait with a deadline


async def test_a_host_rests_from_when_its_answer_arrived_not_from_when_a_stalled_pod_read_it(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    # The fetcher stands still (SIGSTOP: a stalled event loop, a pod descheduled) for
    # ``stall``, and the first page's answer reaches its socket meanwhile. The host was
    # done when its answer arrived: its next request may go one gap after that.
    gap, stall = 3.0, 2.0
    fetcher: list[int] = []
    answered: list[tuple[float, float]] = []  # the first answer: before and after sending it

    def answer_then_stall(exchange: Exchange) -> None:
        if not answered:
            # Stopped before the answer is sent: stopped after, a fetcher on the other
            # core could read it first, and would not have been late.
            os.kill(fetcher[0], signal.SIGSTOP)
            _wait_stopped(fetcher[0])
            threading.Timer(stall, os.kill, (fetcher[0], signal.SIGCONT)).start()
        before = time.monotonic()
        exchange.send(200, b"<title>p</title><p>p</p>")
        if not answered:
            answered.append((before, time.monotonic()))

    routes: dict[str, Route] = {f"{A}/robots.txt": text("User-agent: *\nAllow: /\n")}
    routes |= {f"{A}/p/{n}": answer_then_stall for n in range(2)}
    port = free_port()
    with serving(routes, IP) as server:
        pages = [url(server, A, f"/p/{n}") for n in range(2)]
        fetcher_env = env(gap, TROVE_HTTP_PORT=str(port))
        async with services(stack, state_dir, fetcher_env, only=("fetcher",)) as local:
            fetcher.append(local.children[0].pid)
            await publish_work(bus, pages)
            events = await Completions(bus.js).wait_for(2)
            local.check_alive()
            lag = await read_lag(port)
        assert_polite(server, A, gap)
        first, second = sorted(
            (s for s in server.requests_for(A) if s.path.startswith("/p/")), key=lambda s: s.at
        )
    assert all(events[page].outcome.value == "success" for page in pages)
    sending, sent = answered[0]
    assert first.at <= sending
    # From the answer's arrival: one gap, give or take the scheduler's rounding; from when
    # the stopped pod read it, it would be the gap and the whole stall.
    assert second.at - sending >= gap
    assert second.at - sent < gap + stall / 2
    # The pod says how late it read: the stalled answer, and the other one.
    count, total = lag
    assert count == 2
    assert stall - 0.1 <= total < stall + 1.0


async def test_a_page_of_huge_links_is_fetched_once_and_its_event_fits(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    padding = "x" * 1880
    links = "".join(f'<a href="/l/{n:04d}/{padding}">{n}</a>\n' for n in range(1000))
    body = f"<html><title>many links</title><body>{links}</body></html>".encode()
    assert len(body) > 1_800_000
    routes: dict[str, Route] = {
        f"{A}/robots.txt": text("User-agent: *\nAllow: /\n"),
        f"{A}/huge": lambda ex: ex.send(200, body),
    }
    limit = 1 << 20
    with serving(routes, IP) as server:
        target = url(server, A, "/huge")
        async with services(stack, state_dir, env(0.2), only=("fetcher",)) as local:
            await publish_work(bus, [target])
            completions = Completions(bus.js)
            local.check_alive()
            events = await completions.wait_for(1)

            async def pending() -> tuple[int, int]:
                info = await bus.js.consumer_info(EVENTS_STREAM, FETCHER)
                return info.num_ack_pending, info.num_redelivered

            # The work was acked: nothing more will be delivered, so nothing more fetched.
            state = await eventually(
                pending, until=lambda s: s[0] == 0, timeout=20, what="work acked"
            )
        assert state == (0, 0), f"the work was redelivered: {state}"
        assert len(server.requests_to("/huge", A)) == 1
    event = events[target]
    assert event.outcome.value == "success"
    assert event.links_truncated
    assert completions.sizes[target] <= limit
    assert 100 < len(event.links) < 1000
    # Cut from the end: what is left is the start of the page, in document order.
    numbers = [int(link.url.split("/l/")[1][:4]) for link in event.links]
    assert numbers == list(range(len(event.links)))


async def test_work_beyond_the_horizon_is_not_lost_and_keeps_its_place(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    """TROVE_WORK keeps messages 3 s, so a slot 6 s ahead must come back via the horizon."""
    gap = 1.0
    routes: dict[str, Route] = {f"{A}/robots.txt": text("User-agent: *\nAllow: /\n")}
    for n in range(7):
        routes[f"{A}/p/{n}"] = page(f"p{n}")
    domains = await bus.js.key_value(DOMAINS_BUCKET)

    async def frontier() -> float:
        try:
            entry = await domains.get(A)
        except KeyNotFoundError:
            return 0.0
        raw: Mapping[str, float] = json.loads(entry.value or b"{}")
        return float(raw.get("next", 0.0))

    with serving(routes, IP) as server:
        pages = [url(server, A, f"/p/{n}") for n in range(7)]
        port = free_port()
        work_env = env(gap, TROVE_WORK_MAX_AGE_SECONDS="3", TROVE_HTTP_PORT=str(port))
        async with services(stack, state_dir, work_env, only=("fetcher",)) as local:

            async def first_page() -> int:
                return len(server.requests_to("/p/0", A))

            await publish_work(bus, pages[:1])  # robots.txt and the first page
            await eventually(first_page, until=lambda n: n == 1, timeout=20, what="first page")
            # One at a time, so that the slots are given in this order.
            for target in pages[1:]:
                before = await frontier()
                await publish_work(bus, [target])
                await eventually(frontier, until=before.__lt__, timeout=10, what="a slot")
            # The furthest slot planned lies past the horizon (1.5 s), and the gauge says so.
            assert await reservation_horizon(port) > 1.5
            completions = Completions(bus.js)
            local.check_alive()
            events = await completions.wait_for(7, timeout=40)
        assert_polite(server, A, gap)
        paths = [s.path for s in server.requests_for(A)]
    assert paths == ["/robots.txt", *(f"/p/{n}" for n in range(7))]
    assert all(events[u].outcome.value == "success" for u in pages)
