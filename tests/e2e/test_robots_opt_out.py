"""A site that opts out in robots.txt, a day's cache and a week's re-crawl in seconds.

docs/bot.md tells site owners that a ``Disallow`` for TroveBot is picked up the next
time it reads robots.txt. The witness is the site's own request log: no page is asked
for once every robots.txt that allowed it is older than the robots.txt TTL, and the
site's pages leave the search at their next visit.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import nats
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.fetcher._servers import Exchange, LocalServer
from tests.support import cycle_env, services
from trove_cli.search import search
from trove_schema.topology import SEEDS_SUBJECT

#: How long a robots.txt is obeyed: a scaled-down day.
ROBOTS_TTL = 2.0
#: The re-crawl interval: a scaled-down week.
RECRAWL = 3.0
PAGES = 4
#: A word only this site's pages hold, to find them with `trove search`.
WORD = "kingfisher"
#: A page's request may leave up to a local wait after its robots.txt check (the host's
#: lease, ``trove_fetcher.fetcher.LOCAL_WAIT``), plus the request's own way there.
LATE = 1.5


class OptingOutSite:
    """A home page and PAGES pages linking to each other; robots.txt says yes, then no."""

    def __init__(self, server: LocalServer) -> None:
        self.server = server
        self._lock = threading.Lock()
        self._allow = True
        #: Server times at which a robots.txt that allowed everything was sent.
        self.allowed_at: list[float] = []
        self.paths = ["/"] + [f"/notes/{n}" for n in range(PAGES)]
        links = "".join(f'<a href="{p}">{p}</a> ' for p in self.paths)
        self.body = (
            f"<html><head><title>{WORD} notes</title></head>"
            f"<body><p>Watching the {WORD} by the river.</p>{links}</body></html>"
        ).encode()
        server.routes["/robots.txt"] = self._robots
        server.routes.update(dict.fromkeys(self.paths, self._page))

    def opt_out(self) -> None:
        with self._lock:
            self._allow = False

    def _robots(self, exchange: Exchange) -> None:
        with self._lock:
            allow = self._allow
            if allow:
                self.allowed_at.append(time.monotonic())
        rules = "User-agent: *\nAllow: /\n" if allow else "User-agent: TroveBot\nDisallow: /\n"
        exchange.send(200, rules.encode(), content_type="text/plain")

    def _page(self, exchange: Exchange) -> None:
        exchange.send(200, self.body)

    def page_requests(self) -> list[float]:
        return [s.at for s in self.server.seen if s.path in self.paths]


@pytest.mark.usefixtures("clean")
async def test_a_site_that_disallows_trovebot_is_left_alone_and_leaves_the_search(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    env = cycle_env(RECRAWL, TROVE_ROBOTS_TTL_SECONDS=str(ROBOTS_TTL))
    with LocalServer("127.0.0.3") as server:
        site = OptingOutSite(server)
        urls = {server.url(p) for p in site.paths}
        async with services(stack, state_dir, env) as local:
            nc = await nats.connect(stack.nats_url)
            await nc.publish(SEEDS_SUBJECT, server.url().encode())
            await nc.flush()
            await nc.close()

            async def found() -> set[str]:
                local.check_alive()
                return {hit.url for hit in await search(engine, WORD, limit=50)}

            await eventually(
                found, until=lambda hits: hits == urls, timeout=40, what="every page searchable"
            )
            site.opt_out()
            await eventually(
                found, until=lambda hits: not hits, timeout=40, what="the site out of the search"
            )
        requests = site.page_requests()

    # Every page was visited after the opt-out (that is how it left the search), and
    # none of those visits was a request: robots.txt answered for all of them.
    obeyed_until = max(site.allowed_at) + ROBOTS_TTL
    late = [round(at - obeyed_until, 3) for at in requests if at > obeyed_until + LATE]
    assert late == [], f"pages asked for after the site said no (s past its robots.txt): {late}"
    assert len(requests) >= len(urls)
