"""A month in minutes against a strict rate limiter: all three services, re-crawl cycles
scaled down to seconds, and a site that lets one request through a second (robots.txt
included) and answers any sooner with a 429.

Refused pages are retried and their chains go on, so every page is read each cycle; and
once the first run of refusals has taught the host's pace, the site refuses (almost)
nothing more, judged from its own log. Without a pace, each answer was followed by a
refusal at the next gap, every cycle."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import StackUrls, eventually
from tests.fetcher._servers import Exchange, LocalServer
from tests.support import cycle_env, services
from trove_schema.bus import Bus
from trove_schema.topology import SEEDS_SUBJECT

pytestmark = pytest.mark.usefixtures("clean")

#: The limiter's window: one request through a second.
WINDOW = 1.0
#: The re-crawl interval, a scaled-down week: a cycle of the site's pages at its pace
#: (about 1.3 s a page) fits in it.
RECRAWL = 12.0
PAGES = 4
#: Answers of every page the crawl must reach: the first, then two re-crawl cycles.
ANSWERS = 3


class Limiter:
    """The site's own log: each request's arrival (monotonic), path and status."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._let_through_at = -1e9
        self.log: list[tuple[float, str, int]] = []

    def admit(self, path: str) -> bool:
        with self._lock:
            now = time.monotonic()
            admitted = now - self._let_through_at >= WINDOW
            if admitted:
                self._let_through_at = now
            self.log.append((now, path, 200 if admitted else 429))
            return admitted

    def snapshot(self) -> list[tuple[float, str, int]]:
        with self._lock:
            return list(self.log)


async def test_a_strict_rate_limiter_is_crawled_every_cycle_and_refuses_little_once_paced(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    limiter = Limiter()
    paths = ["/"] + [f"/page/{n}" for n in range(PAGES)]
    links = "".join(f'<a href="{p}">{p}</a> ' for p in paths)
    # Rate pauses of 0.5 s, doubling, without Retry-After; refused pages retried a
    # second later (their chains go on from the retry's answer).
    env = cycle_env(RECRAWL, TROVE_RATE_PAUSE_SECONDS="0.5")
    with LocalServer("127.0.0.1") as server:

        def limited(exchange: Exchange) -> None:
            if not limiter.admit(exchange.path):
                exchange.send(429, b"slow down\n")
            elif exchange.path == "/robots.txt":
                exchange.send(200, b"User-agent: *\nAllow: /\n")
            else:
                body = f"<html><head><title>{exchange.path}</title></head><body>{links}</body>"
                exchange.send(200, f"{body}</html>".encode())

        server.routes.update(dict.fromkeys([*paths, "/robots.txt"], limited))
        async with services(stack, state_dir, env) as local:
            await bus.nc.publish(SEEDS_SUBJECT, server.url().encode())  # `nats pub`

            async def answered() -> dict[str, int]:
                local.check_alive()
                counts = dict.fromkeys(paths, 0)
                for _, path, status in limiter.snapshot():
                    if status == 200 and path in counts:
                        counts[path] += 1
                return counts

            await eventually(
                answered,
                until=lambda counts: min(counts.values()) >= ANSWERS,
                timeout=120,
                interval=0.5,
                what=f"every page answered {ANSWERS} times",
            )
        log = limiter.snapshot()

    refused = [at for at, _, status in log if status == 429]
    let_through = [at for at, _, status in log if status == 200]
    # The first cycle teaches the pace (its runs of refusals), and ends when every page
    # has been read once; after it, a refusal is the rare one a pace eased to the window
    # meets. Without a pace, a page asked a gap after an answer is refused every cycle.
    read_once = max(
        min(at for at, path, status in log if path == page and status == 200) for page in paths
    )
    later = [at for at in refused if at > read_once]
    later_answers = [at for at in let_through if at > read_once]
    assert len(later_answers) >= PAGES + 1
    assert len(later) <= 1, (len(later), len(later_answers), log)
    # The first cycle's runs: robots.txt's page, then the first page after an answer.
    assert len(refused) <= 6, (len(refused), log)
    # Never two requests closer than the configured gap, refusals included.
    arrivals = [at for at, _, _ in log]
    assert min(b - a for a, b in itertools.pairwise(arrivals)) >= 0.2
