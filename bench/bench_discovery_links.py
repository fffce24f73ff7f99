"""What discovery spends on a crawled page's links, with the shortcut for known pages and
without it.

Most of a page's links lead to pages its site has already shown: its menu, its archive,
its tags, the posts beside it. Once such a link has passed the checks every link goes
through (scope, traps, exclusions), discovery asks whether this replica remembers its
page as claimed this cycle by another cause (``Discovery._claimed_by_another``) and
drops it; without the shortcut it becomes a candidate, and the seen set's claim (a task
of its own) answers "known" from the same memory. Here one process handles the same
blog-like pages both ways, alternating by round, against a real nats-server (each
page's new links are claimed in the seen bucket and published, as in a crawl):

* a page has ``--links`` links: ``--new`` to posts never seen, ``--foreign`` to other
  hosts (out of scope), and the rest to the site's menu and older posts, claimed by the
  page before it;
* CPU is the process's (``time.process_time``), the client's part of NATS included and
  nats-server's left out; the same pages' messages go out either way.

It prints microseconds of CPU a page for each way and their ratio, medians of
``--rounds``, and the cost of a derived event id (``derived_event_id``) beside the
``uuid.uuid5`` it spells out. Nothing is asserted.

    .venv/bin/python bench/bench_discovery_links.py [--pages 300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nats.aio.msg import Msg

from trove_discovery.discovery import Discovery
from trove_schema.bus import Bus
from trove_schema.events import (
    CrawlCompleted,
    CrawlOutcome,
    Link,
    Scope,
    ScopeKind,
    derived_event_id,
    utcnow,
)
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import SEEN_BUCKET, ensure_topology
from trove_stack.nats import EmbeddedNats, NatsConfig


class WithoutShortcut(Discovery):
    """Discovery as it was before the shortcut: every link judged in full."""

    def _claimed_by_another(self, url: str, event_id: str) -> bool:
        return False


def page(host: str, number: int, args: argparse.Namespace) -> CrawlCompleted:
    """Page ``number`` of ``host``: new posts, links to other hosts, and the rest to the
    menu and to the posts of the pages before it."""
    site = f"https://{host}"
    known = args.links - args.new - args.foreign
    menu = [f"{site}/tags/{i}" for i in range(known // 2)]
    older = [f"{site}/posts/{number - 1}-{i}" for i in range(args.new)]
    older += [f"{site}/archive/{i}" for i in range(known - len(menu) - len(older))]
    new = [f"{site}/posts/{number}-{i}" for i in range(args.new)]
    foreign = [f"https://elsewhere{i}.example/" for i in range(args.foreign)]
    at = utcnow()
    return CrawlCompleted(
        url=f"{site}/page/{number}",
        domain=host,
        scope=Scope(kind=ScopeKind.HOST, value=host, max_depth=50),
        depth=1,
        request_id=f"work-{host}-{number}",
        outcome=CrawlOutcome.SUCCESS,
        status_code=200,
        started_at=at,
        completed_at=at,
        links=tuple(Link(url=url) for url in [*menu, *older, *new, *foreign]),
    )


async def handle_all(discovery: Discovery, bus: Bus, events: list[CrawlCompleted]) -> float:
    """CPU seconds ``discovery`` took to handle ``events`` after the first, which claims
    the site's menu and archive."""
    messages = [
        Msg(_client=bus.nc, subject=CrawlCompleted.SUBJECT, data=e.to_wire()) for e in events
    ]
    await discovery.handle_crawl_completed(messages[0])
    start = time.process_time()
    for message in messages[1:]:
        await discovery.handle_crawl_completed(message)
    return time.process_time() - start


async def bench(args: argparse.Namespace) -> None:
    folder = Path(tempfile.mkdtemp(prefix="trove-discovery-links-"))
    broker = EmbeddedNats(NatsConfig(folder / "nats")).start()
    try:
        bus = await Bus.connect(broker.url, name="bench-discovery-links")
        await ensure_topology(bus.js)
        seen = await bus.js.key_value(SEEN_BUCKET)
        settings = DiscoverySettings()
        ways = {"with the shortcut": Discovery, "without": WithoutShortcut}
        per_page: dict[str, list[float]] = {name: [] for name in ways}
        for number in range(1, args.rounds + 1):
            # Each way first in every other round: neither pays for a warmer process.
            order = list(ways.items())
            for name, kind in order if number % 2 else order[::-1]:
                discovery = kind(bus=bus, seen=seen, settings=settings)
                host = f"blog-{number}-{len(per_page[name])}-{kind.__name__.lower()}.example"
                events = [page(host, n, args) for n in range(args.pages + 1)]
                cpu = await handle_all(discovery, bus, events)
                per_page[name].append(1e6 * cpu / args.pages)
            print(
                f"round {number}: "
                + ", ".join(f"{name} {values[-1]:.0f} µs" for name, values in per_page.items())
            )
        await bus.close()
    finally:
        broker.stop()
    medians = {name: statistics.median(values) for name, values in per_page.items()}
    print(
        f"\n{args.pages} pages a round, {args.links} links a page ({args.new} new, "
        f"{args.foreign} to other hosts); µs of CPU a page, medians of {args.rounds} rounds:"
    )
    for name, value in medians.items():
        print(f"  {name:<18} {value:8.0f}")
    print(f"  ratio              {medians['with the shortcut'] / medians['without']:8.2f}")
    causes = [f"{uuid.uuid4()}:https://blog.example/posts/{i}" for i in range(20_000)]
    spelt = min(_timed(lambda c: derived_event_id(c, "discovered"), causes) for _ in range(5))
    stdlib = min(
        _timed(lambda c: str(uuid.uuid5(uuid.NAMESPACE_URL, f"trove:discovered:{c}")), causes)
        for _ in range(5)
    )
    print(
        f"a derived event id: {spelt:.2f} µs, uuid.uuid5 {stdlib:.2f} µs "
        f"(ratio {spelt / stdlib:.2f}; best of 5 rounds of {len(causes)})"
    )


def _timed(make: Callable[[str], object], causes: list[str]) -> float:
    """µs of CPU ``make`` takes a cause, over ``causes``."""
    start = time.process_time()
    for cause in causes:
        make(cause)
    return 1e6 * (time.process_time() - start) / len(causes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--links", type=int, default=100)
    parser.add_argument("--new", type=int, default=10)
    parser.add_argument("--foreign", type=int, default=10)
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
