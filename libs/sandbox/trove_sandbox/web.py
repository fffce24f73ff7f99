"""A deterministic model of a small web: hosts, pages, links, robots.txt and feeds.

The model knows the answer to every question a crawler test asks (which pages a
polite crawl must fetch, which it must never fetch, which language each page is
in), so tests compare a crawl against ground truth instead of against itself.
"""

from __future__ import annotations

import html
import ipaddress
import posixpath
import random
import re
import struct
import unicodedata
import urllib.robotparser
import zlib
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from typing import Literal
from urllib.parse import parse_qsl, urljoin, urlsplit

from trove_sandbox.response import Response, not_found, ok
from trove_sandbox.texts import HOST_LABELS, LANGUAGE_ORDER, TEXTS, LanguageText
from trove_sandbox.trap import TRAP_HOST, trap_response

TLD = "trove.test"
ROBOTS_AGENT = "TroveBot"
PRIVATE_PREFIX = "/private/"
CRAWL_DELAY_SECONDS = 2.0
#: Pages the home page links directly; the rest hang below them (four per page).
HOME_FANOUT = 5
TREE_FANOUT = 4

PageKind = Literal["home", "article", "draft", "private"]
LinkStyle = Literal["absolute", "root", "relative", "fragment"]
RobotsStatus = int | Literal["timeout"]

#: Rendered pages kept in memory (benchmark webs do not fit; they re-render on demand).
_RENDER_CACHE_BYTES = 64 * 1024 * 1024
_STATIC_MODIFIED = datetime(2023, 11, 5, 8, 0, tzinfo=UTC)


@dataclass(slots=True, frozen=True)
class Host:
    """One site of the sandbox web; its own name, loopback IP and language."""

    name: str
    ip: str
    language: str
    index: int
    feed: Literal["rss", "atom"] = "rss"
    has_private: bool = False
    crawl_delay: float | None = None
    is_trap: bool = False


@dataclass(slots=True, frozen=True)
class Link:
    """An <a> on a page, kept as data so reachability is computed, not scraped."""

    host: str
    path: str
    text: str
    nofollow: bool = False
    style: LinkStyle = "root"
    fragment: str = ""


@dataclass(slots=True, frozen=True)
class PageSpec:
    """Everything needed to render one HTML page once the port is known."""

    host: str
    path: str
    kind: PageKind
    title: str
    paragraphs: tuple[tuple[int, ...], ...]
    published: datetime
    lang_attr: bool
    links: tuple[Link, ...]


@dataclass(slots=True, frozen=True)
class _Extra:
    """A page added by a test with ``add_page``."""

    response: Response
    links: tuple[tuple[str, str, bool], ...]
    is_html: bool


class SandboxWeb:
    """A seeded, reproducible small web that is also its own ground truth.

    Benchmarks and end-to-end tests need a web whose every page, link and
    robots rule is known in advance; this class generates one and answers for
    it. It is mutable only through the test hooks (``set_robots``,
    ``set_robots_status``, ``add_page``) and the port the server binds.
    """

    __slots__ = (
        "_cache",
        "_extra",
        "_hosts",
        "_ips",
        "_links_per_page",
        "_page_kb",
        "_pages",
        "_port",
        "_robots_parsers",
        "_robots_status",
        "_robots_text",
        "_seed",
        "_targets",
    )

    def __init__(
        self,
        hosts: Iterable[Host],
        pages: Iterable[PageSpec],
        *,
        seed: int,
        port: int = 0,
        page_kb: int | None = None,
        links_per_page: int | None = None,
    ) -> None:
        self._hosts: dict[str, Host] = {h.name: h for h in hosts}
        self._ips: dict[str, str] = {h.ip: h.name for h in self._hosts.values()}
        self._pages: dict[tuple[str, str], PageSpec] = {(p.host, p.path): p for p in pages}
        self._port = port
        self._extra: dict[tuple[str, str], _Extra] = {}
        self._robots_text: dict[str, str] = {}
        self._robots_status: dict[str, RobotsStatus] = {}
        self._robots_parsers: dict[str, urllib.robotparser.RobotFileParser] = {}
        self._targets: list[tuple[str, str, str]] | None = None
        self._cache = _RenderCache(_RENDER_CACHE_BYTES)
        self._seed = seed
        self._page_kb = page_kb
        self._links_per_page = links_per_page

    # ------------------------------------------------------------------ building

    @classmethod
    def generate(
        cls,
        hosts: int = 6,
        pages_per_host: int = 8,
        seed: int = 7,
        base_ip: str = "127.0.0.10",
        port: int = 0,
        *,
        page_kb: int | None = None,
        links_per_page: int | None = None,
        with_trap: bool = False,
    ) -> SandboxWeb:
        """Build the web for ``seed``: same arguments, same bytes, every time.

        ``page_kb`` and ``links_per_page`` are the benchmark mode: pages are
        padded with more text and more links up to about that size and count.
        """
        if hosts < 1:
            raise ValueError("a sandbox web needs at least one host")
        if pages_per_host < 1:
            raise ValueError("every host needs at least its home page")
        first = ipaddress.IPv4Address(base_ip)
        last = first + hosts + (1 if with_trap else 0) - 1
        if not (first.is_loopback and last.is_loopback):
            raise ValueError(f"sandbox IPs must stay inside 127.0.0.0/8, not {first}..{last}")
        rng = random.Random(seed)
        private_index = min(1, hosts - 1)
        delay_index = min(2, hosts - 1)
        host_list = [
            Host(
                name=_host_name(i),
                ip=str(first + i),
                language=LANGUAGE_ORDER[i % len(LANGUAGE_ORDER)],
                index=i,
                feed="rss" if i % 2 == 0 else "atom",
                has_private=i == private_index,
                crawl_delay=CRAWL_DELAY_SECONDS if i == delay_index else None,
            )
            for i in range(hosts)
        ]
        if with_trap:
            host_list.append(
                Host(
                    name=TRAP_HOST, ip=str(first + hosts), language="en", index=hosts, is_trap=True
                )
            )
        normal = [h for h in host_list if not h.is_trap]
        titles = {h.name: _titles(h, pages_per_host - 1, rng) for h in normal}
        pages: list[PageSpec] = []
        for host in normal:
            pages.extend(_host_pages(host, titles, normal, rng))
        return cls(
            host_list,
            pages,
            seed=seed,
            port=port,
            page_kb=page_kb,
            links_per_page=links_per_page,
        )

    # ------------------------------------------------------------------ identity

    @property
    def port(self) -> int:
        """The port every host listens on (0 until a server has bound one)."""
        return self._port

    @port.setter
    def port(self, value: int) -> None:
        if value != self._port:
            self._port = value
            self._cache.clear()

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def page_kb(self) -> int | None:
        """Benchmark mode: pages are padded to about this many KiB (None: small pages)."""
        return self._page_kb

    @property
    def links_per_page(self) -> int | None:
        """Benchmark mode: pages carry about this many links (None: a handful)."""
        return self._links_per_page

    @property
    def hosts(self) -> tuple[Host, ...]:
        """Every host, the trap host (if any) last."""
        return tuple(self._hosts.values())

    @property
    def trap_host(self) -> str | None:
        return TRAP_HOST if TRAP_HOST in self._hosts else None

    def host(self, name: str) -> Host:
        return self._hosts[name.lower().rstrip(".")]

    def is_host(self, name: str) -> bool:
        return name.lower().rstrip(".") in self._hosts

    def host_for_ip(self, ip: str) -> str | None:
        return self._ips.get(ip)

    def origin(self, host: str) -> str:
        """``http://host:port`` (no port while none is bound)."""
        return f"http://{host}:{self._port}" if self._port else f"http://{host}"

    def url(self, host: str, path: str = "/") -> str:
        return self.origin(host) + path

    def seeds(self) -> list[str]:
        """The home page of every normal host (never the trap host)."""
        return [self.url(h.name) for h in self._hosts.values() if not h.is_trap]

    def resolve_map(self) -> dict[str, str]:
        """Host name -> IP for every host, the trap included (a fetcher must reach it)."""
        return {h.name: h.ip for h in self._hosts.values()}

    def resolve_setting(self) -> str:
        """The ``TROVE_RESOLVE`` value: ``host=ip,host=ip``."""
        return ",".join(f"{name}={ip}" for name, ip in self.resolve_map().items())

    def allowed_network(self) -> str:
        """A CIDR for TROVE_ALLOWED_NETWORKS: the first IP's /24, widened until all fit."""
        ips = [ipaddress.IPv4Address(h.ip) for h in self._hosts.values()]
        prefix = 24
        while True:
            net = ipaddress.IPv4Network(f"{min(ips)}/{prefix}", strict=False)
            if max(ips) in net:
                return str(net)
            prefix -= 1

    def language(self, url: str) -> str:
        """The BCP-47 code of the text at ``url`` (KeyError for a foreign host)."""
        parts = urlsplit(url)
        host = self.host(parts.hostname or "")
        if host.is_trap and parts.path == "/bad-charset":
            return "fr"
        return host.language

    def crawl_delay(self, host: str) -> float | None:
        """The Crawl-delay robots.txt gives TroveBot on ``host``, if any."""
        name = self.host(host).name
        if name in self._robots_status:
            return None
        delay = self._robots_parser(name).crawl_delay(ROBOTS_AGENT)
        return None if delay is None else float(delay)

    # ------------------------------------------------------------------ ground truth

    def expected_pages(self, follow_nofollow: bool = False) -> set[str]:
        """Every HTML page a host-scoped, robots-obeying crawl from the seeds must fetch.

        Home pages and what their ``<a>`` links reach on the same host, skipping
        what robots.txt forbids to TroveBot and, unless ``follow_nofollow``,
        links marked rel=nofollow. Never stylesheets, images, feeds or robots.txt.
        """
        found: set[str] = set()
        for host in self._hosts.values():
            if host.is_trap:
                continue
            queue = deque(["/"])
            seen = {"/"}
            while queue:
                path = queue.popleft()
                if not self._robots_allows(host.name, path):
                    continue
                is_html, links = self._outlinks(host.name, path)
                if not is_html:
                    continue
                found.add(self.url(host.name, path))
                for target_host, target_path, nofollow in links:
                    if target_host != host.name or (nofollow and not follow_nofollow):
                        continue
                    if target_path not in seen:
                        seen.add(target_path)
                        queue.append(target_path)
        return found

    def max_depth(self, follow_nofollow: bool = False) -> int:
        """The most link hops from a home page to any expected page (a crawl's needed depth)."""
        depth = 0
        for host in self._hosts.values():
            if host.is_trap or not self._robots_allows(host.name, "/"):
                continue
            levels = {"/": 0}
            queue = deque(["/"])
            while queue:
                path = queue.popleft()
                is_html, links = self._outlinks(host.name, path)
                if not is_html:
                    continue
                depth = max(depth, levels[path])
                for target_host, target_path, nofollow in links:
                    if target_host != host.name or (nofollow and not follow_nofollow):
                        continue
                    if target_path not in levels and self._robots_allows(host.name, target_path):
                        levels[target_path] = levels[path] + 1
                        queue.append(target_path)
        return depth

    def disallowed_urls(self) -> set[str]:
        """Every URL the sandbox serves that robots.txt forbids TroveBot to fetch."""
        urls: set[str] = set()
        for host in self._hosts.values():
            for path in self._known_paths(host.name):
                if not self._robots_allows(host.name, path):
                    urls.add(self.url(host.name, path))
        return urls

    def articles(self, host: str) -> list[str]:
        """The article URLs of ``host``, newest first."""
        name = self.host(host).name
        specs = [p for p in self._pages.values() if p.host == name and p.kind == "article"]
        specs.sort(key=lambda p: p.published, reverse=True)
        return [self.url(name, p.path) for p in specs]

    def page_specs(self) -> tuple[PageSpec, ...]:
        return tuple(self._pages.values())

    # ------------------------------------------------------------------ test hooks

    def set_robots(self, host: str, text: str | None) -> None:
        """Serve ``text`` as ``host``'s robots.txt (None restores the generated one)."""
        name = self.host(host).name
        self._robots_parsers.pop(name, None)
        if text is None:
            self._robots_text.pop(name, None)
        else:
            self._robots_text[name] = text

    def set_robots_status(self, host: str, status: RobotsStatus | None) -> None:
        """Make robots.txt answer a 4xx/5xx status or ``"timeout"`` (None restores it).

        Ground truth follows RFC 9309: a 4xx robots.txt allows everything, a 5xx
        or a timeout (the server waits 60 s) disallows the whole host.
        """
        name = self.host(host).name
        if status is None:
            self._robots_status.pop(name, None)
            return
        if status != "timeout" and not (isinstance(status, int) and 400 <= status <= 599):
            raise ValueError("robots status must be 400-599 or 'timeout'")
        self._robots_status[name] = status

    def add_page(
        self,
        host: str,
        path: str,
        html_text: str | bytes,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
    ) -> str:
        """Serve an ad-hoc page at ``path`` on ``host`` (it wins over generated content).

        Unless ``headers`` says otherwise the page is ``text/html`` with an ETag
        and a Last-Modified. Its <a> links count in ``expected_pages``. Returns its URL.
        """
        name = self.host(host).name
        if not path.startswith("/"):
            raise ValueError("path must start with '/'")
        if not 200 <= status <= 599:
            raise ValueError("status must be 200-599 (a 1xx is not a final answer)")
        given = {k.lower(): (k, v) for k, v in (headers or {}).items()}
        body = html_text.encode("utf-8") if isinstance(html_text, str) else html_text
        base = ok(body, modified=_STATIC_MODIFIED, status=status)
        merged: list[tuple[str, str]] = [(k, v) for k, v in base.headers if k.lower() not in given]
        merged.extend(given.values())
        response = Response(status=status, headers=tuple(merged), body=body)
        content_type = (response.content_type or "").lower()
        is_html = content_type.startswith(("text/html", "application/xhtml"))
        links: tuple[tuple[str, str, bool], ...] = ()
        if is_html and status == 200:
            links = _scrape_links(self.url(name, path), body.decode("utf-8", errors="replace"))
        self._extra[(name, path)] = _Extra(response=response, links=links, is_html=is_html)
        self._cache.discard((name, path))
        return self.url(name, path)

    # ------------------------------------------------------------------ serving

    def page(self, host: str, path: str) -> Response:
        """The answer for ``path`` (with any query) on ``host``; a 404 if there is none."""
        name = host.lower().rstrip(".")
        parts = urlsplit(path)
        bare = parts.path or "/"
        if name not in self._hosts:
            return not_found(path)
        if bare == "/robots.txt":
            return self._robots_response(name)
        extra = self._extra.get((name, bare))
        if extra is not None:
            return extra.response
        host_info = self._hosts[name]
        if host_info.is_trap:
            query = dict(parse_qsl(parts.query, keep_blank_values=True))
            first = next(iter(self._hosts.values()))
            return trap_response(
                bare, query, origin=self.origin(name), elsewhere=self.url(first.name)
            )
        key = (name, bare)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        response = self._render(host_info, bare)
        self._cache.put(key, response)
        return response

    def _render(self, host: Host, path: str) -> Response:
        spec = self._pages.get((host.name, path))
        if spec is not None:
            return ok(self._render_html(spec), modified=spec.published)
        if path == "/style.css":
            return ok(_stylesheet(host), "text/css; charset=utf-8", modified=_STATIC_MODIFIED)
        if path == "/logo.png":
            return ok(_logo_png(host), "image/png", modified=_STATIC_MODIFIED)
        if path == "/feed.xml":
            kind = "application/rss+xml" if host.feed == "rss" else "application/atom+xml"
            body = self._render_feed(host)
            return ok(body, f"{kind}; charset=utf-8", modified=self._newest(host.name))
        return not_found(path)

    # ------------------------------------------------------------------ robots

    def robots_txt(self, host: str) -> str:
        """The robots.txt text ``host`` serves (an override if a test set one)."""
        name = self.host(host).name
        override = self._robots_text.get(name)
        if override is not None:
            return override
        info = self._hosts[name]
        if info.is_trap:
            return "User-agent: *\nAllow: /\n"
        rules: list[str] = []
        if info.has_private:
            rules.append(f"Disallow: {PRIVATE_PREFIX}")
        if info.crawl_delay is not None:
            rules.append(f"Crawl-delay: {info.crawl_delay:g}")
        lines = [
            f"# robots.txt for {name}",
            "# TroveBot and everyone else get the same rules; BadBot gets nothing.",
            "",
            f"User-agent: {ROBOTS_AGENT}",
            *rules,
            "Allow: /",
            "",
            "User-agent: *",
            *rules,
            "Disallow: /cgi-bin/",
            "",
            "User-agent: BadBot",
            "Disallow: /",
            "",
        ]
        return "\n".join(lines)

    def _robots_response(self, name: str) -> Response:
        status = self._robots_status.get(name)
        text = self.robots_txt(name)
        plain = "text/plain; charset=utf-8"
        if status == "timeout":
            return Response(200, (("Content-Type", plain),), body=text.encode(), delay=60.0)
        if isinstance(status, int):
            body = f"robots.txt answers {status}\n".encode()
            return Response(status, (("Content-Type", plain),), body=body)
        return ok(text, plain, modified=_STATIC_MODIFIED)

    def _robots_parser(self, name: str) -> urllib.robotparser.RobotFileParser:
        parser = self._robots_parsers.get(name)
        if parser is None:
            parser = urllib.robotparser.RobotFileParser()
            parser.parse(self.robots_txt(name).splitlines())
            self._robots_parsers[name] = parser
        return parser

    def _robots_allows(self, name: str, path: str) -> bool:
        if path == "/robots.txt":
            return True
        status = self._robots_status.get(name)
        if status is not None:
            return isinstance(status, int) and status < 500
        return self._robots_parser(name).can_fetch(ROBOTS_AGENT, self.url(name, path))

    # ------------------------------------------------------------------ links

    def _outlinks(self, name: str, target: str) -> tuple[bool, list[tuple[str, str, bool]]]:
        """Whether ``target`` is an HTML page and its <a> targets as (host, path, nofollow)."""
        path = target.split("?", 1)[0]
        extra = self._extra.get((name, path))
        if extra is not None:
            return extra.is_html, list(extra.links)
        spec = self._pages.get((name, path))
        if spec is not None:
            links = [(link.host, link.path, link.nofollow) for link in spec.links]
            links.extend(
                (link.host, link.path, link.nofollow) for link in self._padding_links(spec)
            )
            return True, links
        if path in ("/style.css", "/logo.png", "/feed.xml", "/robots.txt"):
            return False, []
        return True, []  # a 404 page: HTML, fetched, no links

    def _known_paths(self, name: str) -> list[str]:
        paths = [p for (h, p) in self._pages if h == name]
        paths.extend(p for (h, p) in self._extra if h == name and p not in paths)
        if not self._hosts[name].is_trap:
            paths.extend(["/style.css", "/logo.png", "/feed.xml"])
        return paths

    def _link_targets(self) -> list[tuple[str, str, str]]:
        """(host, path, title) of every home page and article: where padding links go."""
        if self._targets is None:
            self._targets = [
                (p.host, p.path, p.title)
                for p in self._pages.values()
                if p.kind in ("home", "article")
            ]
        return self._targets

    def _padding_links(self, spec: PageSpec) -> list[Link]:
        if not self.links_per_page or len(spec.links) >= self.links_per_page:
            return []
        rng = random.Random(f"{self.seed}/links/{spec.host}{spec.path}")
        targets = self._link_targets()
        links = []
        for _ in range(self.links_per_page - len(spec.links)):
            host, path, title = rng.choice(targets)
            style: LinkStyle = "absolute" if host != spec.host else rng.choice(["root", "absolute"])
            text = title if host == spec.host else host
            links.append(Link(host, path, text, nofollow=rng.random() < 0.1, style=style))
        return links

    # ------------------------------------------------------------------ rendering

    def _href(self, source: PageSpec, link: Link) -> str:
        if link.style == "fragment":
            return "#" + link.fragment
        suffix = f"#{link.fragment}" if link.fragment else ""
        if link.style == "absolute" or link.host != source.host:
            return self.url(link.host, link.path) + suffix
        if link.style == "relative":
            return _relative(source.path, link.path) + suffix
        return link.path + suffix

    def _anchor(self, source: PageSpec, link: Link) -> str:
        rel = ' rel="nofollow"' if link.nofollow else ""
        return f'<a href="{html.escape(self._href(source, link))}"{rel}>{_text(link.text)}</a>'

    def _render_html(self, spec: PageSpec) -> str:
        host = self._hosts[spec.host]
        text = TEXTS[host.language]
        feed_type = "application/rss+xml" if host.feed == "rss" else "application/atom+xml"
        lang = f' lang="{host.language}"' if spec.lang_attr else ""
        site = _site_name(host)
        paragraphs = "\n".join(
            "<p>" + _text(" ".join(text.sentences[i] for i in para)) + "</p>"
            for para in spec.paragraphs
        )
        body_links = [link for link in spec.links if link.host == spec.host]
        cross = [link for link in spec.links if link.host != spec.host]
        intro = f"<p>{_text(text.site_intro)}</p>\n" if spec.kind == "home" else ""
        date = spec.published.date().isoformat()
        items = "\n".join(f"<li>{self._anchor(spec, link)}</li>" for link in body_links)
        heading = text.blogroll if spec.kind == "home" else text.elsewhere
        cross_items = "\n".join(f"<li>{self._anchor(spec, link)}</li>" for link in cross)
        mailto = f"mailto:{_site_name(host)}@{TLD}"
        contact = (
            f'<p><a href="{mailto}">{_text(text.contact)}</a></p>' if spec.kind == "home" else ""
        )
        padding = self._padding_html(spec, text)
        title = site if spec.kind == "home" else f"{spec.title} · {site}"
        page = (
            "<!DOCTYPE html>\n"
            f'<html{lang}>\n<head>\n<meta charset="utf-8">\n'
            f"<title>{_text(title)}</title>\n"
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            '<link rel="stylesheet" href="/style.css">\n'
            f'<link rel="alternate" type="{feed_type}" title="{html.escape(site)}"'
            ' href="/feed.xml">\n'
            "</head>\n<body>\n"
            f'<header><img src="/logo.png" alt="{html.escape(site)}" width="16" height="16"> '
            f"<strong>{_text(site)}</strong></header>\n"
            f"<main>\n<article>\n<h1>{_text(spec.title)}</h1>\n"
            f'<p class="date"><time datetime="{date}">{date}</time></p>\n'
            f"{intro}{paragraphs}\n</article>\n"
            f"<nav>\n<ul>\n{items}\n</ul>\n</nav>\n"
            f"<aside>\n<h2>{_text(heading)}</h2>\n<ul>\n{cross_items}\n</ul>\n</aside>\n"
            f"{padding}</main>\n"
            f'<footer>{contact}<p><a href="/feed.xml">{_text(text.feed)}</a></p></footer>\n'
            "</body>\n</html>\n"
        )
        if self.page_kb:
            page = self._pad_text(spec, text, page)
        return page

    def _padding_html(self, spec: PageSpec, text: LanguageText) -> str:
        links = self._padding_links(spec)
        if not links:
            return ""
        items = "\n".join(f"<li>{self._anchor(spec, link)}</li>" for link in links)
        return f"<section>\n<h2>{_text(text.related)}</h2>\n<ul>\n{items}\n</ul>\n</section>\n"

    def _pad_text(self, spec: PageSpec, text: LanguageText, page: str) -> str:
        target = (self.page_kb or 0) * 1024
        if len(page.encode()) >= target:
            return page
        rng = random.Random(f"{self.seed}/text/{spec.host}{spec.path}")
        extra: list[str] = []
        size = len(page.encode())
        while size < target:
            picks = rng.sample(range(len(text.sentences)), 4)
            para = "<p>" + _text(" ".join(text.sentences[i] for i in picks)) + "</p>\n"
            extra.append(para)
            size += len(para.encode())
        return page.replace("</article>", "".join(extra) + "</article>", 1)

    def _newest(self, name: str) -> datetime:
        dates = [p.published for p in self._pages.values() if p.host == name]
        return max(dates, default=_STATIC_MODIFIED)

    def _render_feed(self, host: Host) -> str:
        text = TEXTS[host.language]
        site = html.escape(_site_name(host))
        specs = sorted(
            (p for p in self._pages.values() if p.host == host.name and p.kind == "article"),
            key=lambda p: p.published,
            reverse=True,
        )
        home = html.escape(self.url(host.name))
        if host.feed == "rss":
            items = "".join(
                "<item>"
                f"<title>{html.escape(p.title)}</title>"
                f"<link>{html.escape(self.url(host.name, p.path))}</link>"
                f"<guid>{html.escape(self.url(host.name, p.path))}</guid>"
                f"<pubDate>{_rfc822(p.published)}</pubDate>"
                f"<description>{html.escape(text.sentences[p.paragraphs[0][0]])}</description>"
                "</item>\n"
                for p in specs
            )
            return (
                '<?xml version="1.0" encoding="utf-8"?>\n<rss version="2.0"><channel>\n'
                f"<title>{site}</title><link>{home}</link>"
                f"<description>{html.escape(text.site_intro)}</description>"
                f"<language>{host.language}</language>\n{items}</channel></rss>\n"
            )
        entries = "".join(
            "<entry>"
            f"<title>{html.escape(p.title)}</title>"
            f'<link href="{html.escape(self.url(host.name, p.path))}"/>'
            f"<id>{html.escape(self.url(host.name, p.path))}</id>"
            f"<updated>{p.published.strftime('%Y-%m-%dT%H:%M:%SZ')}</updated>"
            f"<summary>{html.escape(text.sentences[p.paragraphs[0][0]])}</summary>"
            "</entry>\n"
            for p in specs
        )
        updated = self._newest(host.name).strftime("%Y-%m-%dT%H:%M:%SZ")
        return (
            '<?xml version="1.0" encoding="utf-8"?>\n'
            f'<feed xmlns="http://www.w3.org/2005/Atom" xml:lang="{host.language}">\n'
            f"<title>{site}</title><id>{home}</id>"
            f'<link href="{home}"/><link rel="self" href="{home}feed.xml"/>'
            f"<updated>{updated}</updated>\n{entries}</feed>\n"
        )


class _RenderCache:
    """Least-recently-used rendered pages, bounded by their total body size."""

    __slots__ = ("_budget", "_entries", "_size")

    def __init__(self, budget: int) -> None:
        self._budget = budget
        self._size = 0
        self._entries: OrderedDict[tuple[str, str], Response] = OrderedDict()

    def get(self, key: tuple[str, str]) -> Response | None:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: tuple[str, str], response: Response) -> None:
        self.discard(key)
        self._entries[key] = response
        self._size += len(response.body)
        while self._size > self._budget and len(self._entries) > 1:
            _, evicted = self._entries.popitem(last=False)
            self._size -= len(evicted.body)

    def discard(self, key: tuple[str, str]) -> None:
        gone = self._entries.pop(key, None)
        if gone is not None:
            self._size -= len(gone.body)

    def clear(self) -> None:
        self._entries.clear()
        self._size = 0


# ---------------------------------------------------------------------- generation


def _host_name(index: int) -> str:
    label = HOST_LABELS[index % len(HOST_LABELS)]
    round_ = index // len(HOST_LABELS)
    return f"{label}{'-' + str(round_ + 1) if round_ else ''}.{TLD}"


def _site_name(host: Host) -> str:
    return host.name.removesuffix("." + TLD)


def _slug(title: str) -> str:
    ascii_title = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "-", ascii_title.lower()).strip("-")


def _titles(host: Host, count: int, rng: random.Random) -> list[tuple[str, str]]:
    """(title, path) of each article of ``host``, newest first."""
    text = TEXTS[host.language]
    offset = rng.randrange(len(text.topics))
    result: list[tuple[str, str]] = []
    used: set[str] = set()
    for j in range(count):
        topic = text.topics[(offset + j) % len(text.topics)]
        round_ = j // len(text.topics)
        title = f"{topic}, {text.part} {round_ + 1}" if round_ else topic
        slug = _slug(title)
        while slug in used:
            slug += "-x"
        used.add(slug)
        result.append((title, f"/posts/{slug}.html"))
    return result


def _paragraphs(rng: random.Random, sentences: int) -> tuple[tuple[int, ...], ...]:
    picks = rng.sample(range(sentences), rng.randint(5, 7))
    cut = rng.randint(2, len(picks) - 2)
    return (tuple(picks[:cut]), tuple(picks[cut:]))


def _host_pages(
    host: Host,
    titles: Mapping[str, list[tuple[str, str]]],
    normal: list[Host],
    rng: random.Random,
) -> list[PageSpec]:
    text = TEXTS[host.language]
    own = titles[host.name]
    others = [h for h in normal if h.name != host.name]
    newest = datetime(2024, 6, 1, 9, 30, tzinfo=UTC) - timedelta(days=rng.randrange(30))
    dates: list[datetime] = []
    when = newest
    for _ in own:
        dates.append(when)
        when -= timedelta(days=rng.randint(1, 20), hours=rng.randint(0, 12))

    def elsewhere(count: int) -> list[Link]:
        links = []
        for _ in range(count if others else 0):
            other = rng.choice(others)
            choices = [(_site_name(other), "/"), *titles[other.name]]
            _title, path = rng.choice(choices)
            links.append(Link(other.name, path, other.name, nofollow=rng.random() < 0.3))
        return links

    pages: list[PageSpec] = []
    draft_title = text.drafts
    draft_path = f"/drafts/{_slug(draft_title)}.html"

    home_links: list[Link] = [
        Link(host.name, path, title, style="relative" if k % 2 else "root")
        for k, (title, path) in enumerate(own[:HOME_FANOUT])
    ]
    home_links.append(Link(host.name, draft_path, draft_title, nofollow=True))
    if host.has_private:
        home_links.append(Link(host.name, PRIVATE_PREFIX + "diary.html", text.private))
    blogroll = [
        Link(other.name, "/", other.name, nofollow=k == 0 and len(others) > 1, style="absolute")
        for k, other in enumerate(others)
    ]
    pages.append(
        PageSpec(
            host=host.name,
            path="/",
            kind="home",
            title=_site_name(host),
            paragraphs=_paragraphs(rng, len(text.sentences)),
            published=dates[0] if dates else newest,
            lang_attr=True,
            links=(*home_links, *blogroll),
        )
    )
    for j, (title, path) in enumerate(own):
        links = [Link(host.name, "/", text.home, style="relative" if j % 3 == 0 else "root")]
        if j > 0:
            links.append(Link(host.name, own[j - 1][1], text.newer, style="relative"))
        if j + 1 < len(own):
            links.append(Link(host.name, own[j + 1][1], text.older, style="relative"))
        first_child = HOME_FANOUT + TREE_FANOUT * j
        for c in range(first_child, min(first_child + TREE_FANOUT, len(own))):
            style: LinkStyle = ("root", "relative", "absolute")[c % 3]
            links.append(Link(host.name, own[c][1], own[c][0], style=style))
        if len(own) > 1:
            other_title, other_path = rng.choice([t for t in own if t[1] != path])
            links.append(
                Link(
                    host.name, other_path, other_title, nofollow=rng.random() < 0.4, fragment="top"
                )
            )
        links.append(Link(host.name, path, text.comments, style="fragment", fragment="comments"))
        if host.has_private and j == 0:
            links.append(Link(host.name, PRIVATE_PREFIX + "diary.html", text.private))
        links.extend(elsewhere(rng.randint(1, 2)))
        pages.append(
            PageSpec(
                host=host.name,
                path=path,
                kind="article",
                title=title,
                paragraphs=_paragraphs(rng, len(text.sentences)),
                published=dates[j],
                lang_attr=(j + host.index) % 2 == 0,
                links=tuple(links),
            )
        )
    back_home = (Link(host.name, "/", text.home),)
    pages.append(
        PageSpec(
            host=host.name,
            path=draft_path,
            kind="draft",
            title=draft_title,
            paragraphs=_paragraphs(rng, len(text.sentences)),
            published=newest,
            lang_attr=False,
            links=back_home,
        )
    )
    if host.has_private:
        pages.append(
            PageSpec(
                host=host.name,
                path=PRIVATE_PREFIX + "diary.html",
                kind="private",
                title=text.private,
                paragraphs=_paragraphs(rng, len(text.sentences)),
                published=newest,
                lang_attr=True,
                links=back_home,
            )
        )
    return pages


def _relative(source: str, target: str) -> str:
    base = posixpath.dirname(source) or "/"
    directory, name = posixpath.split(target)
    rel_dir = posixpath.relpath(directory, base)
    if name == "":
        return "./" if rel_dir == "." else rel_dir + "/"
    return name if rel_dir == "." else f"{rel_dir}/{name}"


def _text(value: str) -> str:
    """Escape text content (quotes may stay as they are outside attributes)."""
    return html.escape(value, quote=False)


def _rfc822(when: datetime) -> str:
    return when.strftime("%a, %d %b %Y %H:%M:%S +0000")


# ---------------------------------------------------------------------- static files


def _stylesheet(host: Host) -> str:
    hue = (host.index * 57) % 360
    return (
        "body { font-family: Georgia, serif; max-width: 40rem; margin: 2rem auto; "
        f"color: hsl({hue}, 30%, 20%); background: hsl({hue}, 40%, 97%); }}\n"
        f"a {{ color: hsl({hue}, 60%, 35%); }}\n"
        "header img { vertical-align: middle; }\n"
        "nav ul, aside ul { padding-left: 1.2rem; }\n"
    )


def _logo_png(host: Host) -> bytes:
    """A real 16x16 PNG in the host's colour (a diagonal stripe on a plain field)."""
    rng = random.Random(host.name)
    field = bytes(rng.randrange(256) for _ in range(3))
    stripe = bytes(255 - c for c in field)
    rows = b"".join(
        b"\x00" + b"".join(stripe if abs(x - y) < 3 else field for x in range(16))
        for y in range(16)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    header = struct.pack(">IIBBBBB", 16, 16, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows, 9))
        + chunk(b"IEND", b"")
    )


# ---------------------------------------------------------------------- scraping


class _LinkScraper(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, bool]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag != "a":
            return
        values = dict(attrs)
        href = values.get("href")
        if href:
            rel = (values.get("rel") or "").lower().split()
            self.found.append((href, "nofollow" in rel))


def _scrape_links(page_url: str, text: str) -> tuple[tuple[str, str, bool], ...]:
    """(host, path, nofollow) of the http <a> links of an ad-hoc page."""
    scraper = _LinkScraper()
    scraper.feed(text)
    scraper.close()
    links: list[tuple[str, str, bool]] = []
    for href, nofollow in scraper.found:
        target = urlsplit(urljoin(page_url, href))
        if target.scheme in ("http", "https") and target.hostname:
            path = (target.path or "/") + (f"?{target.query}" if target.query else "")
            links.append((target.hostname, path, nofollow))
    return tuple(links)
