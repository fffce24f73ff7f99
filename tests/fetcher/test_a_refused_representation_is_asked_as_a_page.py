"""A server that refuses the ActivityStreams representation (a 406 or 415 of strict
content negotiation, a 401 of an instance that serves its objects to signed requests
only) is asked for the page: the refusal is not the page's status.

A real fetcher process against real NATS and a real HTTP server; the server's log,
with each request's ``Accept``, is the witness.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import StackUrls, eventually
from tests.fetcher._completions import Completions
from tests.fetcher._servers import Exchange, serving
from tests.support import publish_work, services
from trove_schema.bus import Bus
from trove_schema.events import CrawlCompleted, CrawlOutcome, derived_event_id
from trove_schema.urls import canonicalize

pytestmark = pytest.mark.usefixtures("clean")

IP = "127.0.0.175"
HOST = "notices.refusing.test"
ARTICLE = b"<html><head><title>A notice</title></head><body>" + b"<p>words " * 50


def asks_for_activitystreams(exchange: Exchange) -> bool:
    return "activity+json" in exchange.headers.get("Accept", "")


@pytest.mark.parametrize("status", [401, 406])
async def test_a_post_whose_server_refuses_activitystreams_is_fetched_as_a_page(
    stack: StackUrls, bus: Bus, state_dir: Path, status: int
) -> None:
    """``/notice/N`` looks like a Pleroma post, which the seed priors ask as ActivityPub
    first. Taken for the page's status, the refusal failed every such page of the host,
    none was ever asked as a page, and nothing was learned: for months."""

    def notice(exchange: Exchange) -> None:
        if asks_for_activitystreams(exchange):
            exchange.send(status, b'{"error":"refused"}', content_type="application/json")
        else:
            exchange.send(200, ARTICLE)

    paths = [f"/notice/{n}" for n in range(3)]
    routes = {f"{HOST}/robots.txt": lambda ex: ex.send(404, b"")}
    routes |= {f"{HOST}{path}": notice for path in paths}
    settings = {
        "TROVE_RESOLVE": f"{HOST}={IP}",
        "TROVE_ALLOWED_NETWORKS": f"{IP}/32",
        "TROVE_MIN_DOMAIN_DELAY_SECONDS": "0.1",
        "TROVE_EXPLORE_EVERY": "0",
    }
    with serving(routes, IP) as server:
        urls = [canonicalize(server.url(path, HOST)) for path in paths]
        async with services(stack, state_dir, settings, only=("fetcher",)) as local:
            await publish_work(bus, urls)
            completions = Completions(bus.js)

            async def own_attempts() -> dict[str, CrawlCompleted]:
                local.check_alive()
                return await completions.poll()

            def each_page_ended(events: dict[str, CrawlCompleted]) -> bool:
                return len(events) == len(urls) and all(
                    e.id == derived_event_id(e.request_id, "crawl") for e in events.values()
                )

            events = await eventually(
                own_attempts, until=each_page_ended, timeout=60, what="each page's own attempt"
            )
        first = server.requests_to(paths[0], HOST)
    assert {url: (e.outcome, e.fetcher) for url, e in events.items()} == dict.fromkeys(
        urls, (CrawlOutcome.SUCCESS, "http")
    )
    assert events[urls[0]].title == "A notice"
    # The first page: asked as ActivityPub, as its prior says, then as a page.
    assert ["activity+json" in s.headers.get("accept", "") for s in first] == [True, False]
