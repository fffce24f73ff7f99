"""The sandbox web of ``bench_vs_scrapy.py``, served from its own process with a witness log.

Builds a ``SandboxWeb`` in benchmark mode (pages of ~``--page-kb`` KiB with ~``--links``
links), optionally with skewed site sizes (host *i* keeps ``round(articles / (i+1)**skew)``
of its articles, at least one, and every link to a dropped article is dropped too, so
no crawler meets a 404), gives every host the same robots.txt (no Crawl-delay: Scrapy
does not read it), renders every page once, and serves it on 127.0.0.0/8 with
``serve_sandbox``: every request's host, path, arrival time and user agent is appended to
the ``--witness`` JSONL file as it arrives. That file is the evidence both crawlers are
judged by.

Once serving, it writes ``--manifest`` (JSON, written whole then renamed): the port, the
host -> IP map, the seeds, every URL a host-scoped, robots-obeying crawl that skips
``rel=nofollow`` must fetch (HTML pages and each host's feed), the pages per host, the
link depth the crawl needs. It stops on SIGTERM or SIGINT, after ``--max-seconds``, or
when its parent process goes away.

    .venv/bin/python bench/witness_server.py --hosts 40 --articles 20 --skew 1 \\
        --witness /tmp/w.jsonl --manifest /tmp/m.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from trove_sandbox import SandboxWeb, serve_sandbox
from trove_sandbox.web import PageSpec

#: Every host serves this: TroveBot's group (Scrapy reads it too, with ROBOTSTXT_USER_AGENT)
#: forbids /private/ (one host links a page there), and there is no Crawl-delay.
ROBOTS_TXT = (
    "User-agent: TroveBot\nDisallow: /private/\nAllow: /\n\n"
    "User-agent: *\nDisallow: /private/\nDisallow: /cgi-bin/\n"
)
FEED_PATH = "/feed.xml"


def articles_per_host(hosts: int, articles: int, skew: float) -> list[int]:
    """Articles kept by each host: ``round(articles / (i+1)**skew)``, at least 1 (0: uniform)."""
    return [max(1, round(articles / (i + 1) ** skew)) for i in range(hosts)]


def build_web(
    *, hosts: int, articles: int, skew: float, page_kb: int, links: int, seed: int
) -> SandboxWeb:
    """The benchmark web; with ``skew`` > 0, host sizes fall off like a power law."""
    full = SandboxWeb.generate(
        hosts=hosts,
        pages_per_host=articles + 1,
        seed=seed,
        page_kb=page_kb,
        links_per_page=links,
    )
    if skew > 0:
        sizes = articles_per_host(hosts, articles, skew)
        by_host: dict[str, list[PageSpec]] = defaultdict(list)
        for spec in full.page_specs():
            if spec.kind == "article":
                by_host[spec.host].append(spec)
        dropped: set[tuple[str, str]] = set()
        for index, host in enumerate(full.hosts):
            newest_first = sorted(by_host[host.name], key=lambda s: s.published, reverse=True)
            dropped.update((s.host, s.path) for s in newest_first[sizes[index] :])
        kept = [
            dataclasses.replace(
                spec, links=tuple(ln for ln in spec.links if (ln.host, ln.path) not in dropped)
            )
            for spec in full.page_specs()
            if (spec.host, spec.path) not in dropped
        ]
        full = SandboxWeb(full.hosts, kept, seed=seed, page_kb=page_kb, links_per_page=links)
    for host in full.hosts:
        full.set_robots(host.name, ROBOTS_TXT)
    return full


def expected_urls(web: SandboxWeb) -> list[str]:
    """What a crawl from the seeds must fetch: every reachable HTML page and each feed."""
    pages = web.expected_pages() | {web.url(h.name, FEED_PATH) for h in web.hosts}
    return sorted(pages)


def manifest(web: SandboxWeb, port: int) -> dict[str, Any]:
    expected = expected_urls(web)
    per_host = Counter(urlsplit(u).hostname or "" for u in expected)
    sizes = [len(web.page(*_host_path(u)).body) for u in expected]
    html_sizes = [s for u, s in zip(expected, sizes, strict=True) if not u.endswith(FEED_PATH)]
    return {
        "port": port,
        "resolve": web.resolve_map(),
        "resolve_setting": web.resolve_setting(),
        "allowed_network": web.allowed_network(),
        "seeds": web.seeds(),
        "expected": expected,
        "per_host": dict(per_host),
        "max_depth": web.max_depth(),
        "disallowed": sorted(web.disallowed_urls()),
        "page_bytes_mean": sum(html_sizes) / max(1, len(html_sizes)),
        "links_per_page": web.links_per_page,
    }


def _host_path(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.hostname or "", parts.path or "/"


async def serve(args: argparse.Namespace) -> int:
    web = build_web(
        hosts=args.hosts,
        articles=args.articles,
        skew=args.skew,
        page_kb=args.page_kb,
        links=args.links,
        seed=args.seed,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    parent = os.getppid()
    async with serve_sandbox(web, witness_path=args.witness, port=args.port) as running:
        # The port is bound now, so URLs carry it: render everything once (no crawler
        # pays for rendering), then say where things are.
        data = manifest(web, running.port)
        for url in data["expected"]:
            web.page(*_host_path(url))
        for host in web.hosts:
            web.page(host.name, "/robots.txt")
        target = Path(args.manifest)
        partial = target.with_suffix(".partial")
        partial.write_text(json.dumps(data))
        partial.replace(target)
        print(
            f"witness server: {len(web.hosts)} hosts on port {running.port}, "
            f"{len(data['expected'])} pages to crawl",
            flush=True,
        )
        deadline = loop.time() + args.max_seconds
        while not stop.is_set() and loop.time() < deadline and os.getppid() == parent:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
    return 0


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--hosts", type=int, default=40, help="sites, one loopback IP each")
    parser.add_argument("--articles", type=int, default=20, help="articles of the largest site")
    parser.add_argument(
        "--skew", type=float, default=0.0, help="size fall-off exponent (0: every site equal)"
    )
    parser.add_argument("--page-kb", type=int, default=30, help="page size (KiB)")
    parser.add_argument("--links", type=int, default=100, help="links a page")
    parser.add_argument("--seed", type=int, default=7, help="generation seed")
    parser.add_argument("--port", type=int, default=0, help="shared port (0: a free one)")
    parser.add_argument("--witness", required=True, help="JSONL file every request goes to")
    parser.add_argument("--manifest", required=True, help="JSON file written once serving")
    parser.add_argument(
        "--max-seconds", type=float, default=1800.0, help="stop after this long whatever happens"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 1 <= args.hosts <= 1000 or args.articles < 1 or args.skew < 0:
        print("witness_server: --hosts 1..1000, --articles >= 1, --skew >= 0", file=sys.stderr)
        return 2
    try:
        return asyncio.run(serve(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
