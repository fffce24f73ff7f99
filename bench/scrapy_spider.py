"""The Scrapy side of ``bench_vs_scrapy.py``: the same crawl, done the way a Scrapy user would.

Run in its own process by the benchmark (``python bench/scrapy_spider.py CONFIG.json``);
the config names the witness server's manifest, the gap, the concurrency and where
the results go. What the spider does, set to match Trove's work and politeness:

* it starts from the sandbox's home pages (``mode: discover``) or from every page the
  crawl must fetch (``mode: known``, nothing followed) and follows same-host ``<a>``
  links and ``<link rel=alternate>`` feeds, and the links of feed items, that are not
  ``rel=nofollow`` (Trove's defaults), to ``DEPTH_LIMIT`` = Trove's ``TROVE_MAX_DEPTH``;
* robots.txt obeyed (``ROBOTSTXT_OBEY``, Protego, the ``TroveBot`` token as Trove reads
  it); one request in flight per host (``CONCURRENT_REQUESTS_PER_DOMAIN = 1``); the same
  gap between requests to a host with no jitter (``DOWNLOAD_DELAY``,
  ``DOWNLOAD_DELAY_JITTER = 0``, which replaces ``RANDOMIZE_DOWNLOAD_DELAY = False`` in
  Scrapy 2.19); AutoThrottle off; no cookies (Trove sends none);
* host names resolve through the sandbox's map (``SandboxResolver``, installed as
  ``TWISTED_DNS_RESOLVER``): URLs and ``Host`` headers are the real names, a download
  slot is a host, as in Trove, and a name outside the map fails (loopback only);
* each page is parsed with lxml: title, links with nofollow, the visible text, its
  language with Trove's own ``detect_language`` (lingua, 28 languages, low accuracy)
  and a keyword bag with Trove's ``keywords`` (the same functions, so the same work);
  feeds (RSS, Atom) give their items' links and text;
* one item per page goes to a JSON-lines feed (``FEEDS``), links included. There is no
  database: Trove commits every page to Postgres, Scrapy appends to a buffered file.

In ``mode: frontier`` it crawls next to nothing: one ``data:`` page yields the
frontier's requests (``frontier_urls``, the same URLs the benchmark hands Trove, on
the loopback hosts of ``frontier_server.py``), which wait in Scrapy's scheduler (its
default memory queues) behind the gap once each host's robots.txt is fetched. The
spider samples its RSS and the scheduler's length every second, holds the frontier
``hold`` seconds after the last request was queued, writes its stats and exits.

At the end it writes a stats file: when the spider opened and closed, CPU seconds and
peak RSS of this process (``getrusage``) at both moments, and for each item the time
from the response's arrival (``response_received``) to ``item_scraped``.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import resource
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence, Sized
from pathlib import Path
from typing import Any, Self, cast
from urllib.parse import urldefrag, urljoin, urlsplit

# The repository root, for the frontier shared with the benchmark (bench/_common.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import scrapy
from lxml import etree
from scrapy import Request, Spider, signals
from scrapy.crawler import Crawler, CrawlerProcess
from scrapy.http import Response
from scrapy.resolver import CachingThreadedResolver
from twisted.internet import defer
from twisted.internet.base import ReactorBase
from twisted.internet.error import DNSLookupError
from twisted.internet.task import LoopingCall

from bench._common import frontier_urls
from trove_fetcher.keywords import keywords
from trove_fetcher.language import default_identifier, detect_language

MIN_SCRAPY = (2, 19)
ROBOTS_TOKEN = "TroveBot"  # noqa: S105 - the robots.txt user-agent token
USER_AGENT = "TroveBot-Scrapy/bench (+https://scrapy.org)"
HTML_TYPES = ("text/html", "application/xhtml+xml")
FEED_TYPES = ("application/rss+xml", "application/atom+xml")
_INVISIBLE = ("head", "script", "style", "noscript", "template", "nav", "svg")
_NOFOLLOW = frozenset({"nofollow", "ugc", "sponsored"})
_ATOM = "{http://www.w3.org/2005/Atom}"
_HTML_PARSER = etree.HTMLParser(recover=True, no_network=True, remove_comments=True)
_FEED_PARSER = etree.XMLParser(
    recover=True, no_network=True, resolve_entities=False, remove_comments=True
)


class SandboxResolver(CachingThreadedResolver):
    """Host names of the sandbox web -> their loopback IPs; any other name fails.

    A subclass of Scrapy's default resolver, so that it is installed the usual way
    (``TWISTED_DNS_RESOLVER``); no lookup ever leaves the process.
    """

    def __init__(self, reactor: ReactorBase, mapping: Mapping[str, str]) -> None:
        super().__init__(reactor, cache_size=0, timeout=1.0)
        self.mapping = {k.lower(): v for k, v in mapping.items()}

    @classmethod
    def from_crawler(cls, crawler: Crawler, reactor: ReactorBase) -> Self:
        # Scrapy passes the CrawlerProcess here; only its settings are read.
        mapping = crawler.settings.getdict("SANDBOX_RESOLVE")
        return cls(reactor, {str(k): str(v) for k, v in mapping.items()})

    def getHostByName(self, name: str, timeout: Sequence[int] = ()) -> defer.Deferred[str]:
        ip = self.mapping.get(name.lower().rstrip("."))
        if ip is None and _is_loopback(name):
            ip = name
        if ip is None:
            return defer.fail(DNSLookupError(f"{name} is not a sandbox host"))
        return defer.succeed(ip)


class SandboxSpider(Spider):
    """Crawls the sandbox from its seeds (or from a list of URLs) and measures itself."""

    name = "sandbox"

    def __init__(self, *, start: list[str], follow: bool, stats_path: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.start_list = start
        self.follow = follow
        self.stats_path = stats_path
        self.opened_at = 0.0
        self.cpu_opened = 0.0
        self.last_item_at = 0.0
        self.first_item_at = 0.0
        self.latencies: list[float] = []
        # As Trove's fetcher does before it reports ready: lingua's models are loaded
        # before the crawl, not on its first page (~0.3 s, inside the measured window).
        default_identifier().warm()

    @classmethod
    def from_crawler(cls, crawler: Crawler, *args: Any, **kwargs: Any) -> Self:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.on_opened, signal=signals.spider_opened)
        crawler.signals.connect(spider.on_response, signal=signals.response_received)
        crawler.signals.connect(spider.on_item, signal=signals.item_scraped)
        crawler.signals.connect(spider.on_closed, signal=signals.spider_closed)
        return spider

    # --- measurement ------------------------------------------------------------------

    def on_opened(self, spider: Spider) -> None:
        self.opened_at = time.time()
        self.cpu_opened = _cpu()

    def on_response(self, response: Response, request: Request, spider: Spider) -> None:
        request.meta["bench_received"] = time.time()

    def on_item(self, item: Any, response: Response, spider: Spider) -> None:
        now = time.time()
        received = response.meta.get("bench_received")
        if received is not None:
            self.latencies.append(now - float(received))
        self.first_item_at = self.first_item_at or now
        self.last_item_at = now

    def on_closed(self, spider: Spider, reason: str) -> None:
        stats = self.crawler.stats.get_stats() if self.crawler.stats else {}
        data = {
            "reason": reason,
            "opened_at": self.opened_at,
            "closed_at": time.time(),
            "first_item_at": self.first_item_at,
            "last_item_at": self.last_item_at,
            "cpu_opened": self.cpu_opened,
            "cpu_closed": _cpu(),
            "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "latencies": self.latencies,
            "scrapy_stats": {k: v for k, v in stats.items() if isinstance(v, int | float)},
        }
        Path(self.stats_path).write_text(json.dumps(data))

    # --- crawling ---------------------------------------------------------------------

    async def start(self) -> AsyncIterator[Any]:
        for url in self.start_list:
            yield Request(url, callback=self.parse)

    def parse(self, response: Response) -> Iterator[Any]:
        kind = (response.headers.get(b"Content-Type") or b"").decode("latin-1")
        media = kind.split(";", 1)[0].strip().lower()
        if media in FEED_TYPES:
            item, links = _feed(response)
        elif media in HTML_TYPES or not media:
            item, links = _html(response)
        else:
            return
        yield item
        if not self.follow:
            return
        host = urlsplit(response.url).hostname
        for url, nofollow in links:
            if not nofollow and urlsplit(url).hostname == host:
                yield Request(url, callback=self.parse)


def _is_loopback(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _rss_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return math.nan


class FrontierSpider(Spider):
    """Queues the frontier in the scheduler, holds it, measures its memory, closes."""

    name = "frontier"

    def __init__(
        self, *, frontier: dict[str, Any], hold: float, stats_path: str, **kw: Any
    ) -> None:
        super().__init__(**kw)
        self.frontier = frontier
        self.hold = hold
        self.stats_path = stats_path
        self.opened_at = 0.0
        self.cpu_opened = 0.0
        self.rss_opened = math.nan
        self.queued_at = 0.0
        self.rss_queued = math.nan
        self.samples: list[tuple[float, float, int]] = []
        self.failures = 0
        self.loop: LoopingCall | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler, *args: Any, **kwargs: Any) -> Self:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.on_opened, signal=signals.spider_opened)
        crawler.signals.connect(spider.on_closed, signal=signals.spider_closed)
        return spider

    def on_opened(self, spider: Spider) -> None:
        self.opened_at = time.time()
        self.cpu_opened = _cpu()
        self.rss_opened = _rss_mib()
        self.loop = LoopingCall(self.sample)
        self.loop.start(1.0)

    def queued(self) -> int:
        scheduler = self.crawler.engine.scheduler if self.crawler.engine else None
        return len(scheduler) if isinstance(scheduler, Sized) else -1

    def sample(self) -> None:
        now = time.time()
        self.samples.append((now - self.opened_at, _rss_mib(), self.queued()))
        if self.queued_at and now - self.queued_at >= self.hold:
            # Not a graceful close: Scrapy's would wait for the requests its downloader
            # holds, each behind a gap of an hour.
            self.write_stats("frontier held")
            os._exit(0)

    async def start(self) -> AsyncIterator[Any]:
        yield Request("data:,frontier", callback=self.parse, dont_filter=True)

    def parse(self, response: Response) -> Iterator[Any]:
        for url in frontier_urls(**self.frontier):
            yield Request(url, callback=self.parse_page, errback=self.failed)
        self.queued_at = time.time()
        self.rss_queued = _rss_mib()

    def parse_page(self, response: Response) -> Iterator[Any]:
        return iter(())

    def failed(self, failure: Any) -> None:
        self.failures += 1

    def on_closed(self, spider: Spider, reason: str) -> None:
        self.write_stats(reason)

    def write_stats(self, reason: str) -> None:
        data = {
            "reason": reason,
            "opened_at": self.opened_at,
            "closed_at": time.time(),
            "queued_at": self.queued_at,
            "cpu_opened": self.cpu_opened,
            "cpu_closed": _cpu(),
            "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "rss_opened": self.rss_opened,
            "rss_queued": self.rss_queued,
            "samples": self.samples,
            "failures": self.failures,
        }
        Path(self.stats_path).write_text(json.dumps(data))


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _absolute(base: str, href: str | None) -> str | None:
    """``href`` resolved against ``base``, without its fragment; None unless http(s)."""
    if not href:
        return None
    href = href.strip()
    try:
        url = urldefrag(urljoin(base, href))[0]
    except ValueError:
        return None
    return url if url.startswith(("http://", "https://")) else None


def _html(response: Response) -> tuple[dict[str, Any], list[tuple[str, bool]]]:
    root = etree.fromstring(response.body, _HTML_PARSER, base_url=response.url)
    links: list[tuple[str, bool]] = []
    title = None
    lang_hint = None
    text = ""
    if root is not None:
        title = " ".join((root.findtext(".//title") or "").split()) or None
        lang_hint = root.get("lang")
        for element in root.iter("a", "area", "link"):
            rel = set((element.get("rel") or "").lower().split())
            if element.tag == "link":
                feed = "alternate" in rel and (element.get("type") or "").lower() in FEED_TYPES
                if not feed:
                    continue
            url = _absolute(response.url, element.get("href"))
            if url is not None:
                links.append((url, not rel.isdisjoint(_NOFOLLOW)))
        etree.strip_elements(root, *_INVISIBLE, with_tail=False)
        text = " ".join(cast("Iterator[str]", root.itertext()))
    return _item(response, title, text, lang_hint, links), links


def _feed(response: Response) -> tuple[dict[str, Any], list[tuple[str, bool]]]:
    root = etree.fromstring(response.body, _FEED_PARSER)
    links: list[tuple[str, bool]] = []
    words: list[str] = []
    title = None
    lang_hint = None
    if root is not None:
        atom = root.tag == _ATOM + "feed"
        ns = _ATOM if atom else ""
        channel = root if atom else root.find("channel")
        if channel is not None:
            title = " ".join((channel.findtext(ns + "title") or "").split()) or None
            lang_hint = channel.findtext("language")
        entries = root.iter(_ATOM + "entry") if atom else root.iter("item")
        for entry in entries:
            if atom:
                hrefs = [ln.get("href") for ln in entry.iter(_ATOM + "link")]
            else:
                hrefs = [ln.text for ln in entry.iter("link")]
            for href in hrefs:
                url = _absolute(response.url, href)
                if url is not None:
                    links.append((url, False))
            for part in ("title", "description", "summary", "content"):
                words.append(entry.findtext(ns + part) or "")
    return _item(response, title, " ".join(words), lang_hint, links), links


def _item(
    response: Response,
    title: str | None,
    text: str,
    lang_hint: str | None,
    links: list[tuple[str, bool]],
) -> dict[str, Any]:
    language = detect_language(text or title or "", hint=lang_hint)
    return {
        "url": response.url,
        "status": response.status,
        "title": title,
        "language": language,
        "keywords": list(keywords(text, title=title, language=language)),
        "links": [{"url": url, "nofollow": nofollow} for url, nofollow in links],
    }


def settings(config: Mapping[str, Any], manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Scrapy settings for the run described by ``config``."""
    return {
        "BOT_NAME": "trove-bench",
        "USER_AGENT": USER_AGENT,
        "ROBOTSTXT_OBEY": True,
        "ROBOTSTXT_USER_AGENT": ROBOTS_TOKEN,
        "CONCURRENT_REQUESTS": int(config["concurrency"]),
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "CONCURRENT_REQUESTS_PER_IP": 0,
        "DOWNLOAD_DELAY": float(config["gap"]),
        "DOWNLOAD_DELAY_JITTER": 0.0,
        "AUTOTHROTTLE_ENABLED": False,
        "COOKIES_ENABLED": False,
        "HTTPPROXY_ENABLED": False,
        "TELNETCONSOLE_ENABLED": False,
        "DOWNLOAD_TIMEOUT": float(config.get("download_timeout", 30)),
        "DOWNLOAD_MAXSIZE": 2 * 1024 * 1024,
        "DEPTH_LIMIT": int(config["max_depth"]),
        "CLOSESPIDER_TIMEOUT": float(config["timeout"]),
        "TWISTED_DNS_RESOLVER": SandboxResolver,
        "SANDBOX_RESOLVE": dict(manifest["resolve"]),
        "FEEDS": {
            Path(config["items"]).as_uri(): {"format": "jsonlines", "overwrite": True},
        },
        "LOG_LEVEL": "WARNING",
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: scrapy_spider.py CONFIG.json", file=sys.stderr)
        return 2
    if scrapy.version_info < MIN_SCRAPY:
        # Older versions ignore DOWNLOAD_DELAY_JITTER (the delay would be jittered by
        # +-50%) and TWISTED_DNS_RESOLVER (host names would go to the system's DNS).
        print(f"scrapy_spider.py needs Scrapy >= 2.19, not {scrapy.__version__}", file=sys.stderr)
        return 2
    config = json.loads(Path(args[0]).read_text())
    if config["mode"] == "frontier":
        process = CrawlerProcess(settings(config, {"resolve": {}}))
        process.crawl(
            FrontierSpider,
            frontier=dict(config["frontier"]),
            hold=float(config["hold"]),
            stats_path=str(config["stats"]),
        )
        process.start()
        return 0 if Path(config["stats"]).exists() else 1
    manifest = json.loads(Path(config["manifest"]).read_text())
    known = config["mode"] == "known"
    process = CrawlerProcess(settings(config, manifest))
    process.crawl(
        SandboxSpider,
        start=list(manifest["expected"] if known else manifest["seeds"]),
        follow=not known,
        stats_path=str(config["stats"]),
    )
    process.start()
    return 0 if Path(config["stats"]).exists() else 1


if __name__ == "__main__":
    raise SystemExit(main())
