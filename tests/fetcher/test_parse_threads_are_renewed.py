"""The threads pages are parsed in are renewed, so what lxml keeps of them has a bound.

libxml2 interns every element and attribute name a thread parses, for the thread's
life: pages of names no other page has would grow a pod whose parse threads never
end until it is killed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from tests.conftest import eventually
from tests.fetcher._completions import Completions
from tests.fetcher._servers import LocalServer, Route, serving
from trove_fetcher import fetcher as fetcher_module
from trove_fetcher.extract import Extraction, extract
from trove_fetcher.fetcher import Fetcher, Job
from trove_fetcher.http import FetchLimits
from trove_fetcher.politeness import Politeness, PolitenessConfig
from trove_fetcher.strategies import STRATEGIES
from trove_fetcher.transport import build_client
from trove_schema.bus import Bus
from trove_schema.events import CrawlOutcome, PageDiscovered, Provenance, Scope
from trove_schema.settings import FetcherSettings
from trove_schema.topology import DOMAINS_BUCKET, ROBOTS_BUCKET
from trove_schema.urls import canonicalize, domain_of

IP = "127.0.0.170"
HOST = "renewed.parse.test"
PAGES = 9
PAGE_BYTES = 64 * 1024
#: Three pages a set of threads.
RENEW_AFTER = 3 * PAGE_BYTES


def page(n: int) -> bytes:
    text = f"<p>Page {n} says something of its own.</p>" * (PAGE_BYTES // 40)
    return f"<html><head><title>Page {n}</title></head><body>{text}".encode()[:PAGE_BYTES]


def serve(body: bytes) -> Route:
    return lambda ex: ex.send(200, body)


@pytest.fixture
def server() -> Iterator[LocalServer]:
    routes = {f"{HOST}/{n}": serve(page(n)) for n in range(PAGES)}
    routes[f"{HOST}/robots.txt"] = serve(b"User-agent: *\nAllow: /\n")
    with serving(routes, IP) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    settings = FetcherSettings(allowed_networks=(f"{IP}/32",), resolve=(f"{HOST}={IP}",))
    async with build_client(settings) as built:
        yield built


@pytest.mark.usefixtures("clean")
async def test_a_fetchers_parse_threads_are_new_ones_after_they_have_read_their_share(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed_in: dict[str, threading.Thread] = {}

    def noting_the_thread(body: bytes, **kwargs: Any) -> Extraction:
        parsed_in[kwargs["url"]] = threading.current_thread()
        return extract(body, **kwargs)

    http = replace(STRATEGIES["http"], extractor=noting_the_thread)
    monkeypatch.setattr(fetcher_module, "STRATEGIES", {**STRATEGIES, "http": http})
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
        parse_thread_bytes=RENEW_AFTER,
    )
    urls = [canonicalize(server.url(f"/{n}", HOST)) for n in range(PAGES)]
    try:
        for url in urls:
            work = PageDiscovered(
                url=url,
                domain=domain_of(url),
                scope=Scope(value=HOST),
                provenance=Provenance(kind="seed"),
            )
            await fetcher.process(Job(work), work.to_wire())
        events = await Completions(bus.js).wait_for(PAGES, timeout=30)
        assert {events[url].outcome for url in urls} == {CrawlOutcome.SUCCESS}
        assert [events[url].title for url in urls] == [f"Page {n}" for n in range(PAGES)]

        sets = [{parsed_in[url] for url in urls[n : n + 3]} for n in range(0, PAGES, 3)]
        # Each three pages were read in threads no other pages were read in, named as
        # the pod's parse threads always were.
        assert all(a.isdisjoint(b) for a in sets for b in sets if a is not b), sets
        assert all(thread.name.startswith("parse_") for thread in parsed_in.values())
        # The replaced ones end (and what lxml kept for them goes).
        retired = sets[0] | sets[1]

        async def alive() -> list[threading.Thread]:
            return [thread for thread in retired if thread.is_alive()]

        await eventually(alive, until=lambda left: not left, timeout=10, what="old threads end")
        assert all(thread.is_alive() for thread in sets[2])
    finally:
        fetcher.close()


# A pod's worth of hostile pages: 2 MiB, every element and attribute name new, read
# one after another in the threads the fetcher reads them in.
HOSTILE_SERIES = """
import itertools, json, sys
from trove_fetcher.extract import ParseThreads, extract

names = itertools.count()

def hostile() -> bytes:
    tags, size = [], 0
    while size < 2 * 1024 * 1024 - 100:
        n = next(names)
        tags.append(f"<b x{n:x}a=1 y{n:x}a=1>.</b>")
        size += len(tags[-1])
    return ("<html><body>" + "".join(tags) + "</body></html>").encode()

def rss() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS"))

threads = ParseThreads(1)

def read(body: bytes) -> None:
    url, kind = "https://h.test/", "text/html"
    threads.pool(len(body)).submit(extract, body, url=url, content_type=kind).result()

read(hostile())
start = rss()
for _ in range(int(sys.argv[1])):
    read(hostile())
print(json.dumps({"start": start, "end": rss()}))
"""


def test_a_series_of_pages_of_new_names_leaves_the_parse_threads_memory_bounded() -> None:
    # Kept by one thread for its life, the names of 40 such pages took ~170 MiB, and
    # each page more; renewed threads hold those of a few pages at most (~30 MiB).
    ran = subprocess.run(
        [sys.executable, "-c", HOSTILE_SERIES, "40"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    rss = json.loads(ran.stdout)
    grown = (rss["end"] - rss["start"]) / 2**20
    assert grown < 120, f"{grown:.0f} MiB more after 40 pages of new names"
