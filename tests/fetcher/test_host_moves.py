"""A host that moved (``www.`` to the bare name, kept paths): after two redirects its
pages are asked for at the new address without a request to the old one, until the
recheck, when one request finds out whether it still redirects; a site back at its old
name is asked there again from its next recheck on, over two cycles here.

The fetcher runs as a real process against real NATS and a real HTTP server that plays
both hosts; the server's own request log is the witness."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import StackUrls, eventually
from tests.fetcher._completions import Completions
from tests.fetcher._servers import Exchange, LocalServer, Route, serving
from tests.support import publish_work, services
from trove_fetcher.politeness import Politeness, PolitenessConfig
from trove_schema.bus import Bus
from trove_schema.events import CrawlOutcome, LinkKind
from trove_schema.policy import LearningConfig, moved
from trove_schema.topology import DOMAINS_BUCKET
from trove_schema.urls import canonicalize

pytestmark = pytest.mark.usefixtures("clean")

IP = "127.0.0.185"
OLD, NEW = "www.moved.test", "moved.test"
GAP = 0.2
RECHECK = 6.0
LEARNING = LearningConfig(move_recheck=RECHECK)


def moves(server: LocalServer, path: str) -> Route:
    def redirect(exchange: Exchange) -> None:
        exchange.redirect(server.url(path, NEW), 301)

    return redirect


def text(body: str) -> Route:
    return lambda ex: ex.send(200, body.encode(), content_type="text/plain")


def page(title: str) -> Route:
    return lambda ex: ex.send(200, f"<title>{title}</title><p>{title}</p>".encode())


async def test_a_host_that_moved_is_not_asked_until_its_recheck_and_is_again_once_back(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    # The home page and pages of as many parts of the site: redirects of one part, or of
    # parts while the home page stays, are not the host moving.
    pages = ["/", *(f"/{n}/p" for n in range(1, 8))]
    with serving({f"{NEW}/robots.txt": text("User-agent: *\nAllow: /\n")}, IP) as server:
        for path in ["/robots.txt", *pages]:
            server.routes[f"{OLD}{path}"] = moves(server, path)
        old = [canonicalize(server.url(path, OLD)) for path in pages]
        new = [canonicalize(server.url(path, NEW)) for path in pages]
        origin = canonicalize(server.url("/", NEW)).rstrip("/")
        env = {
            "TROVE_RESOLVE": f"{OLD}={IP},{NEW}={IP}",
            "TROVE_ALLOWED_NETWORKS": f"{IP}/32",
            "TROVE_MIN_DOMAIN_DELAY_SECONDS": str(GAP),
            "TROVE_GAP_RESPONSE_FACTOR": "0",
            "TROVE_HOST_MOVE_RECHECK_SECONDS": str(RECHECK),
        }
        completions = Completions(bus.js)

        leases = Politeness(await bus.js.key_value(DOMAINS_BUCKET), PolitenessConfig())

        async def due(after: float) -> float:
            """Until the move the host's record holds, learnt after ``after``, is due for
            its recheck; when it was learnt. Judged half a second late: the fetcher keeps
            time on nats-server's clock, the earliest it can be, a little behind ours."""
            found = await eventually(
                lambda: leases.state(OLD),
                until=lambda slot: (
                    slot.policy.moved_at > after
                    and moved(slot.policy, time.time() - 0.5, LEARNING) is None
                ),
                timeout=RECHECK + 30,
                what="the move due for its recheck",
            )
            return found.policy.moved_at

        async with services(stack, state_dir, env, only=("fetcher",)) as local:
            # Two redirects that keep the path, to one origin: the host moved.
            await publish_work(bus, old[:2])
            events = await completions.wait_for(2)
            # Asked for at the new address, not sent to the old one.
            await publish_work(bus, old[2:4])
            events = await completions.wait_for(4)
            asked_meanwhile = {s.path for s in server.requests_for(OLD)}
            # Past the recheck, one request finds out: it still redirects.
            learned = await due(0.0)
            await publish_work(bus, old[4:5])
            events = await completions.wait_for(5)
            await publish_work(bus, old[5:6])
            events = await completions.wait_for(6)
            # The site comes back to its old name; the next recheck finds it there.
            for path in pages[6:]:
                server.routes[f"{OLD}{path}"] = page(path)
            await due(learned)
            await publish_work(bus, old[6:7])
            events = await completions.wait_for(7)
            await publish_work(bus, old[7:])
            events = await completions.wait_for(8)
            local.check_alive()
    for url, target in zip(old[:2] + old[4:5], new[:2] + new[4:5], strict=True):
        assert events[url].status_code == 301, events[url]
        assert [(link.url, link.kind) for link in events[url].links] == [
            (target, LinkKind.REDIRECT)
        ]
    for url, target in zip(old[2:4] + old[5:6], new[2:4] + new[5:6], strict=True):
        event = events[url]
        assert event.outcome is CrawlOutcome.REJECTED
        assert event.status_code is None
        assert event.error_message == f"not asked: the host moved to {origin}"
        assert [(link.url, link.kind) for link in event.links] == [(target, LinkKind.REDIRECT)]
    for url in old[6:]:
        assert events[url].outcome is CrawlOutcome.SUCCESS, events[url]
    assert asked_meanwhile == {"/robots.txt", "/", "/1/p"}
    asked = {s.path for s in server.requests_for(OLD)}
    assert asked == {"/robots.txt", "/", "/1/p", "/4/p", "/6/p", "/7/p"}
    shortest = server.min_gap(OLD)
    assert shortest is not None
    assert shortest >= GAP
