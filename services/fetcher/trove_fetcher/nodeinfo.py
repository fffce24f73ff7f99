"""NodeInfo: what software a fediverse instance runs, and whether it speaks Mastodon's API.

An instance says what it runs in two steps (https://nodeinfo.diaspora.software/):
``/.well-known/nodeinfo`` lists documents by schema (``.../ns/schema/2.0``, ``2.1``),
and the newest 2.x document names the software and its version. Pure functions over
parsed JSON, no I/O: the timeline poller (``trove_fetcher.timeline``) makes the
requests, each under the host's lease. Whatever an instance sends, these return an
answer or None, never raise.

Only a document on the instance's own host is read: a link elsewhere would be a
request to another host, outside the lease the poll holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

from trove_schema.events import MAX_URL_LENGTH
from trove_schema.urls import without_userinfo

WELL_KNOWN_PATH = "/.well-known/nodeinfo"
_SCHEMA = re.compile(r"^https?://nodeinfo\.diaspora\.software/ns/schema/2\.(\d{1,3})/?$")
_NAME_LENGTH = 100

#: Software known not to implement the Mastodon client API's public timelines: polling
#: it would only cost the instance requests. Any other is tried (Mastodon and its forks,
#: Pleroma, Akkoma, GoToSocial, Friendica, Pixelfed, and many small servers).
NOT_MASTODON_API_SOFTWARE = frozenset(
    {
        "misskey",
        "lemmy",
        "mbin",
        "kbin",
        "peertube",
        "writefreely",
        "funkwhale",
        "bookwyrm",
        "plume",
        "owncast",
        "mobilizon",
        "wordpress",
        "ghost",
        "castopod",
        "lotide",
    }
)


@dataclass(frozen=True, slots=True)
class Software:
    """``software.name`` (lower case) and ``software.version`` of a NodeInfo document."""

    name: str
    version: str | None = None

    @property
    def speaks_mastodon_api(self) -> bool:
        """False only for software known not to (unknown software is tried)."""
        return self.name not in NOT_MASTODON_API_SOFTWARE


def _same_host(url: str, origin: str) -> bool:
    """``url`` is on ``origin``'s host and port, over https when the origin is."""
    try:
        target, home = urlsplit(url), urlsplit(origin)
        return (
            target.scheme in ("http", "https")
            and (target.scheme == home.scheme or target.scheme == "https")
            and target.hostname is not None
            and target.hostname == home.hostname
            and target.port == home.port
        )
    except ValueError:
        return False


def document_link(index: Any, origin: str) -> str | None:
    """The URL of the newest NodeInfo 2.x document the index lists on ``origin``'s host.

    ``index`` is the parsed ``/.well-known/nodeinfo``; None when it lists none there.
    """
    if not isinstance(index, dict):
        return None
    links = index.get("links")
    if not isinstance(links, list):
        return None
    best: tuple[int, str] | None = None
    for link in links[:64]:
        if not isinstance(link, dict):
            continue
        rel, href = link.get("rel"), link.get("href")
        if not isinstance(rel, str) or not isinstance(href, str) or len(href) > MAX_URL_LENGTH:
            continue
        match = _SCHEMA.match(rel.strip())
        if match is None:
            continue
        try:
            url = without_userinfo(urljoin(origin + "/", href.strip()))
        except ValueError:
            continue
        if not _same_host(url, origin):
            continue
        minor = int(match.group(1))
        if best is None or minor > best[0]:
            best = (minor, url)
    return None if best is None else best[1]


def _text(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    value = value.strip()
    return value[:_NAME_LENGTH] if value else None


def software_of(document: Any) -> Software | None:
    """The software a NodeInfo 2.x document names; None when it names none readable."""
    if not isinstance(document, dict):
        return None
    software = document.get("software")
    if not isinstance(software, dict):
        return None
    name = _text(software.get("name"))
    if name is None:
        return None
    return Software(name=name.lower(), version=_text(software.get("version")))
