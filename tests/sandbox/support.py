"""Helpers shared by the sandbox tests: reaching a host by name and reading its HTML."""

from __future__ import annotations

from html.parser import HTMLParser
from urllib.parse import urldefrag, urljoin, urlsplit

import httpx

from trove_sandbox import RunningSandbox


def by_ip(running: RunningSandbox, url: str) -> tuple[str, dict[str, str]]:
    """The IP form of ``url`` and the Host header that names the sandbox host."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    target = f"http://{running.resolve_map[host]}:{parts.port or 80}{parts.path or '/'}"
    if parts.query:
        target += "?" + parts.query
    return target, {"Host": parts.netloc}


async def get(
    client: httpx.AsyncClient,
    running: RunningSandbox,
    url: str,
    headers: dict[str, str] | None = None,
    method: str = "GET",
) -> httpx.Response:
    """Request ``url`` the way a crawler with TROVE_RESOLVE would: IP plus Host header."""
    target, host_header = by_ip(running, url)
    return await client.request(method, target, headers={**host_header, **(headers or {})})


class PageReader(HTMLParser):
    """Collects what the tests look at in a page: links, text, lang and head tags."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[tuple[str, bool]] = []
        self.lang: str | None = None
        self.title = ""
        self.paragraphs: list[str] = []
        self.head_links: list[dict[str, str]] = []
        self.images: list[str] = []
        self.meta: dict[str, str] = {}
        self._in: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        if tag == "html":
            self.lang = values.get("lang")
        elif tag == "a" and "href" in values:
            self.links.append((values["href"], "nofollow" in values.get("rel", "").split()))
        elif tag == "link":
            self.head_links.append(values)
        elif tag == "img":
            self.images.append(values.get("src", ""))
        elif tag == "meta" and "name" in values:
            self.meta[values["name"].lower()] = values.get("content", "")
        if tag in ("title", "p", "h1"):
            self._in.append(tag)
            if tag == "p":
                self.paragraphs.append("")

    def handle_endtag(self, tag: str) -> None:
        if self._in and self._in[-1] == tag:
            self._in.pop()

    def handle_data(self, data: str) -> None:
        if not self._in:
            return
        if self._in[-1] == "title":
            self.title += data
        elif self._in[-1] == "p" and self.paragraphs:
            self.paragraphs[-1] += data

    @property
    def text(self) -> str:
        return " ".join(self.paragraphs)


def read_page(html_text: str) -> PageReader:
    reader = PageReader()
    reader.feed(html_text)
    reader.close()
    return reader


def absolute_links(page_url: str, html_text: str) -> list[tuple[str, bool]]:
    """(absolute URL without fragment, nofollow) of every http(s) <a> on the page."""
    found = []
    for href, nofollow in read_page(html_text).links:
        url = urldefrag(urljoin(page_url, href)).url
        if urlsplit(url).scheme in ("http", "https"):
            found.append((url, nofollow))
    return found
