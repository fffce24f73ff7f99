"""A page's links are made canonical in the fetcher's parse threads, with its extraction,
never on the event loop's thread.

Canonicalizing is pure Python and slow on some shapes: a page of a thousand links of
long queries took seconds, and on the event loop every lease, timer, acknowledgement
and request of the pod stood still meanwhile. The ``Fetcher`` runs against real NATS
and a real HTTP server.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.fetcher._completions import Completions
from tests.fetcher._servers import Exchange, serving
from tests.fetcher.test_fetcher_outcomes import fetcher_on
from trove_fetcher import completion as completion_module
from trove_fetcher.fetcher import Job
from trove_fetcher.transport import build_client
from trove_schema.bus import Bus
from trove_schema.events import CrawlOutcome, PageDiscovered, Provenance, Scope
from trove_schema.settings import FetcherSettings
from trove_schema.urls import canonicalize, canonicalize_or_none

pytestmark = pytest.mark.usefixtures("clean")

IP = "127.0.0.232"
HOST = "links.canonical.test"
#: Spelled as pages write them: upper-case hosts, dot segments, an unsorted query.
HREFS = [f"HTTP://Blog.Example/a/../{n}?b=2&a=1#top" for n in range(50)]


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    settings = FetcherSettings(allowed_networks=(f"{IP}/32",), resolve=(f"{HOST}={IP}",))
    async with build_client(settings) as built:
        yield built


async def test_a_pages_links_are_made_canonical_in_the_parse_threads_not_the_event_loops(
    bus: Bus, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: set[threading.Thread] = set()

    def noting_the_thread(url: str) -> str | None:
        if "blog.example" in url.lower():
            threads.add(threading.current_thread())
        return canonicalize_or_none(url)

    monkeypatch.setattr(completion_module, "canonicalize_or_none", noting_the_thread)
    body = "".join(f'<a href="{href}">{n}</a>' for n, href in enumerate(HREFS))

    def page(ex: Exchange) -> None:
        ex.send(200, f"<title>links</title><p>{body}</p>".encode())

    routes = {f"{HOST}/robots.txt": lambda ex: ex.send(200, b"User-agent: *\n"), f"{HOST}/": page}
    with serving(routes, IP) as server:
        fetcher = await fetcher_on(bus, client)
        url = canonicalize(server.url("/", HOST))
        work = PageDiscovered(
            url=url, domain=HOST, scope=Scope(value=HOST), provenance=Provenance(kind="seed")
        )
        completions = Completions(bus.js)
        try:
            await fetcher.process(Job(work), work.to_wire())
            events = await completions.wait_for(1)
        finally:
            fetcher.close()
    event = events[url]
    assert event.outcome is CrawlOutcome.SUCCESS, event.error_message
    assert [link.url for link in event.links] == [
        f"http://blog.example/{n}?a=1&b=2" for n in range(50)
    ]
    assert threads
    assert threading.current_thread() not in threads
    assert {thread.name.split("_")[0] for thread in threads} == {"parse"}
