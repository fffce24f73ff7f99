"""A followed instance's posts are parsed in the fetcher's parse threads, renewed as its
pages' are, never on the event loop's thread.

libxml2 interns every element and attribute name a thread parses until the thread ends:
the event loop's thread never does, so posts of new names (``<b x1a=1 y1a=1>``...) from
an unsanitised or hostile instance would grow the pod poll after poll. The ``Fetcher``
runs against real NATS and a real HTTP server playing a Mastodon instance's client API.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.fetcher._servers import LocalServer, Route, serving
from trove_fetcher import timeline as timeline_module
from trove_fetcher.fetcher import Fetcher
from trove_fetcher.http import FetchLimits
from trove_fetcher.politeness import Politeness, PolitenessConfig
from trove_fetcher.transport import build_client
from trove_schema.bus import Bus
from trove_schema.events import (
    CrawlOutcome,
    TimelinePolled,
    TimelinePollRequested,
    decode_event,
)
from trove_schema.settings import FetcherSettings
from trove_schema.topology import DOMAINS_BUCKET, EVENTS_STREAM, ROBOTS_BUCKET

pytestmark = pytest.mark.usefixtures("clean")

IP = "127.0.0.231"
HOST = "posts.parsed.test"
#: The local timeline's pages from a cursor, as the poller asks for them (40 a page).
TIMELINE = "/api/v1/timelines/public?local=true&limit=40&min_id="
#: Two full pages after the cursor, then one that catches up.
PAGES = ((101, 40), (141, 40), (181, 10))
_POST = re.compile(r"https://blog\.example/(\d+)")


def statuses(first: int, count: int) -> bytes:
    """A timeline page: ``count`` public posts from id ``first`` on, newest first, each
    of element and attribute names no other post has."""
    return json.dumps(
        [
            {
                "id": str(i),
                "uri": f"https://{HOST}/users/ada/statuses/{i}",
                "url": f"https://{HOST}/@ada/{i}",
                "visibility": "public",
                "reblog": None,
                "account": {"acct": "ada"},
                "content": f'<p><x{i}a y{i}a=1><a href="https://blog.example/{i}">a post</a>'
                f"</x{i}a></p>",
            }
            for i in reversed(range(first, first + count))
        ]
    ).encode()


def api(body: bytes) -> Route:
    return lambda ex: ex.send(200, body, content_type="application/json")


@pytest.fixture
def server() -> Iterator[LocalServer]:
    routes: dict[str, Route] = {
        f"{HOST}/robots.txt": lambda ex: ex.send(200, b"User-agent: *\nAllow: /\n"),
    }
    for first, count in PAGES:
        routes[f"{HOST}{TIMELINE}{first - 1}"] = api(statuses(first, count))
    with serving(routes, IP) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    settings = FetcherSettings(allowed_networks=(f"{IP}/32",), resolve=(f"{HOST}={IP}",))
    async with build_client(settings) as built:
        yield built


async def test_a_polls_post_html_is_parsed_in_the_renewed_parse_threads_not_the_event_loops(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed_in: dict[int, threading.Thread] = {}
    content_links = timeline_module.content_links

    def noting_the_thread(content: str) -> list[str]:
        found = _POST.search(content)
        assert found is not None
        parsed_in[int(found.group(1))] = threading.current_thread()
        return content_links(content)

    monkeypatch.setattr(timeline_module, "content_links", noting_the_thread)
    fetcher = Fetcher(
        bus=bus,
        client=client,
        politeness=Politeness(
            await bus.js.key_value(DOMAINS_BUCKET), PolitenessConfig(min_delay=0.05)
        ),
        robots_kv=await bus.js.key_value(ROBOTS_BUCKET),
        limits=FetchLimits(total_timeout=5.0),
        robots_token="TroveBot",
        robots_max_bytes=64 * 1024,
        # Renewed after every page: each page's posts are read in threads of their own.
        parse_thread_bytes=1,
    )
    origin = f"http://{HOST}:{server.port}"
    request = TimelinePollRequested(
        instance=origin,
        domain=HOST,
        timeline="local",
        follow_id="follow-1",
        cursor="100",
        api=origin,
    )
    try:
        await fetcher.poll(request)
    finally:
        fetcher.close()
    sub = await bus.js.pull_subscribe(TimelinePolled.SUBJECT, durable=None, stream=EVENTS_STREAM)
    try:
        (msg,) = await sub.fetch(1, timeout=10)
    finally:
        await sub.unsubscribe()
    polled = decode_event(msg.data)
    assert isinstance(polled, TimelinePolled)

    assert polled.outcome is CrawlOutcome.SUCCESS, polled.error_message
    assert [post.links for post in polled.posts] == [
        (f"https://blog.example/{i}",) for i in range(101, 191)
    ]
    assert sorted(parsed_in) == list(range(101, 191))
    loop_thread = threading.current_thread()
    assert loop_thread not in parsed_in.values()
    assert {thread.name.split("_")[0] for thread in parsed_in.values()} == {"parse"}
    # Each page's body counted towards renewing them, as a page's is.
    pages = [{parsed_in[i] for i in range(first, first + count)} for first, count in PAGES]
    assert all(a.isdisjoint(b) for a in pages for b in pages if a is not b), pages
