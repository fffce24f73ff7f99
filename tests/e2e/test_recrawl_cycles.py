"""A month in minutes: re-crawl cycles scaled down to seconds, all three services running.

The witness is the web server's own request log: however many pages link to a page,
and however many cycles pass, it is fetched once per cycle, never twice.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path

import nats
import pytest

from tests.conftest import StackUrls, eventually
from tests.fetcher._servers import Exchange, LocalServer
from tests.support import cycle_env, services
from trove_cli.local import LocalTrove
from trove_schema.bus import Bus
from trove_schema.topology import EVENT_SCHEDULES_PREFIX, EVENTS_STREAM, SEEDS_SUBJECT

#: The re-crawl interval, a scaled-down week.
RECRAWL = 3.0
#: Pages per site; each links to every other one, so each is linked from all of them.
PAGES = 6
#: Fetches of every page the crawl must reach: the first, then three re-crawl cycles.
FETCHES = 4


class RequestLog:
    """What a site was asked for, when (the server's clock, not the crawler's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.times: dict[str, list[float]] = defaultdict(list)

    def record(self, url: str) -> None:
        with self._lock:
            self.times[url].append(time.monotonic())

    def snapshot(self) -> dict[str, list[float]]:
        with self._lock:
            return {url: list(times) for url, times in self.times.items()}


async def seeded(
    stack: StackUrls, local: LocalTrove, log: RequestLog, *seeds: str
) -> Callable[[], Awaitable[dict[str, list[float]]]]:
    """Send ``seeds`` as `nats pub trove.seeds` does; what the sites were asked for, read
    while the services live."""
    nc = await nats.connect(stack.nats_url)
    await nc.publish(SEEDS_SUBJECT, "\n".join(seeds).encode())
    await nc.flush()
    await nc.close()

    async def fetches() -> dict[str, list[float]]:
        local.check_alive()
        return log.snapshot()

    return fetches


def interlinked_site(server: LocalServer, log: RequestLog) -> list[str]:
    """A home page and PAGES pages, every page linking to the home and all the others."""
    paths = ["/"] + [f"/page/{n}" for n in range(PAGES)]
    links = "".join(f'<a href="{p}">{p}</a> ' for p in paths)

    def page(exchange: Exchange) -> None:
        log.record(server.url(exchange.path))
        body = f"<html><head><title>{exchange.path}</title></head><body>{links}</body></html>"
        exchange.send(200, body.encode())

    server.routes.update(dict.fromkeys(paths, page))
    return [server.url(p) for p in paths]


@pytest.mark.usefixtures("clean")
async def test_every_page_is_fetched_once_per_recrawl_cycle_for_three_cycles(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    log = RequestLog()
    env = cycle_env(RECRAWL)
    with LocalServer("127.0.0.1") as first, LocalServer("127.0.0.2") as second:
        pages = interlinked_site(first, log) + interlinked_site(second, log)
        async with services(stack, state_dir, env) as local:
            fetches = await seeded(stack, local, log, first.url(), second.url())
            await eventually(
                fetches,
                until=lambda f: len(f) == len(pages) and min(map(len, f.values())) >= FETCHES,
                timeout=50,
                interval=0.5,
                what=f"every page fetched {FETCHES} times",
            )
            info = await bus.js.stream_info(
                EVENTS_STREAM, subjects_filter=f"{EVENT_SCHEDULES_PREFIX}.>"
            )
            pending = info.state.subjects or {}
        seen = log.snapshot()

    assert sorted(seen) == sorted(pages)
    # Each fetch is re-requested RECRAWL seconds after it *completed*, so two fetches of
    # a page are never closer than that; a second chain, or the page discovered again by
    # a link, would put a fetch in between.
    gaps = {url: [b - a for a, b in itertools.pairwise(times)] for url, times in seen.items()}
    too_close = {url: g for url, g in gaps.items() if min(g) < RECRAWL - 0.05}
    assert too_close == {}, f"fetched twice within a cycle: {too_close}"
    # And every chain went on (no page dropped out after a cycle or two).
    assert all(max(g) < 3 * RECRAWL for g in gaps.values()), gaps
    # At most one pending request per page, each on the page's own schedule subject.
    assert len(pending) <= len(pages)
    assert set(pending.values()) <= {1}


@pytest.mark.usefixtures("clean")
async def test_a_page_moved_for_good_is_recrawled_where_it_lives_each_cycle(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    """A home page links to /dir, which answers 301 to /dir/ (a site's slash policy, or
    http:// to https://). Re-crawled under the URL it was asked by, the page cost a
    redirect and two reads each cycle. Its chain goes on at /dir/: /dir is asked once,
    /dir/ once a cycle, while the seen key of /dir holds its place."""
    log = RequestLog()
    # Longer than the test: a link to /dir is answered "known" throughout.
    env = cycle_env(RECRAWL, TROVE_SEEN_TTL_SECONDS="300")
    with LocalServer("127.0.0.1") as server:

        def home(exchange: Exchange) -> None:
            log.record(server.url(exchange.path))
            body = b'<html><head><title>home</title></head><body><a href="/dir">d</a></body></html>'
            exchange.send(200, body)

        def moved(exchange: Exchange) -> None:
            log.record(server.url(exchange.path))
            exchange.send(301, headers={"Location": "/dir/"})

        def directory(exchange: Exchange) -> None:
            log.record(server.url(exchange.path))
            exchange.send(200, b"<html><head><title>dir</title></head><body>x</body></html>")

        server.routes.update({"/": home, "/dir": moved, "/dir/": directory})
        async with services(stack, state_dir, env) as local:
            fetches = await seeded(stack, local, log, server.url())
            await eventually(
                fetches,
                until=lambda f: (
                    len(f.get(server.url(), [])) >= FETCHES + 1
                    and len(f.get(server.url("/dir/"), [])) >= FETCHES + 1
                ),
                timeout=60,
                interval=0.5,
                what=f"the home page and /dir/ fetched {FETCHES + 1} times",
            )
        seen = log.snapshot()

    assert len(seen[server.url("/dir")]) == 1, seen
    # The first cycle reads /dir/ twice (through the redirect, then as a page of its
    # own, found by the redirect); from then on once a cycle, one chain.
    later = seen[server.url("/dir/")][2:]
    gaps = [b - a for a, b in itertools.pairwise(later)]
    assert min(gaps) >= RECRAWL - 0.05, gaps
