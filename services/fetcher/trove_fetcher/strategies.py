"""Fetch strategies: named ways of asking a URL for its content, and of reading the answer.

A strategy is the Accept header a request sends, which responses it reads (checked on
the Content-Type, before the body is read), and how it reads them. All go through
the same ``fetch()``: the same client, SSRF guard, redirects, limits, lease and gap.
Which one a URL gets is the learned policy's choice (``trove_schema.policy.choose``)
among the ones that apply to it; the choice is recorded in the attempt's event
(``CrawlCompleted.fetcher``), so the audit can say what was asked and why.

* ``http``: what a browser gets: HTML, XHTML, RSS, Atom and PDF documents.
* ``activitypub``: the same URL asked for its ActivityStreams object, which fediverse
  servers answer with the post itself where their HTML is an empty JavaScript shell.
  Not for URLs of documents and media (``.pdf``, images, ...), which have no such
  object. An HTML answer is not parsed: the server ignored the Accept header, and the
  audit calls that ``wrong_tool``.

A new strategy is one more entry in ``STRATEGIES``: its name is text everywhere it is
stored, so it needs no migration.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from urllib.parse import urlsplit

from trove_fetcher import activitystreams
from trove_fetcher.extract import PARSEABLE_TYPES, PDF_TYPES, Extraction, extract
from trove_fetcher.http import ACCEPT as HTTP_ACCEPT
from trove_schema.media import media_type

Extractor = Callable[..., Extraction]

#: Extensions of URLs that name a document or a media file, never an ActivityStreams
#: object (lower case, without the dot).
MEDIA_EXTENSIONS = frozenset(
    {
        # documents and data
        "pdf", "txt", "csv", "json", "xml", "rss", "atom", "epub", "doc", "docx", "odt",
        "xls", "xlsx", "ppt", "pptx", "rtf", "md", "ics", "vcf",
        # images
        "png", "jpg", "jpeg", "gif", "webp", "avif", "svg", "ico", "bmp", "tif", "tiff",
        "heic",
        # audio and video
        "mp3", "ogg", "oga", "opus", "flac", "wav", "m4a", "aac", "mp4", "m4v", "webm",
        "mov", "mkv", "avi", "ogv",
        # code, fonts, archives
        "js", "mjs", "css", "map", "wasm", "woff", "woff2", "ttf", "otf", "eot",
        "zip", "gz", "tgz", "bz2", "xz", "7z", "rar", "tar", "iso", "dmg", "exe", "apk",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Strategy:
    """One way of fetching a URL: its ``name`` (recorded with every attempt), the
    ``accept`` header it sends, the media types it reads and how it reads them."""

    name: str
    accept: str
    media_types: frozenset[str]
    extractor: Extractor
    #: Paths whose extension names a file of this kind are not for this strategy.
    skip_extensions: frozenset[str] = frozenset()

    def applies(self, url: str) -> bool:
        """Whether this strategy may be tried for ``url`` (before any request)."""
        if not self.skip_extensions:
            return True
        try:
            path = urlsplit(url).path
        except ValueError:
            return False
        last = path.rsplit("/", 1)[-1]
        extension = last.rsplit(".", 1)[1].lower() if "." in last[1:] else ""
        return extension not in self.skip_extensions

    def is_parseable(self, content_type: str | None) -> bool:
        """Whether a 2xx with this Content-Type (or bare media type) is read at all."""
        return media_type(content_type) in self.media_types

    def extract(
        self,
        body: bytes,
        *,
        url: str,
        content_type: str | None,
        x_robots_tag: str | None,
        robots_token: str,
    ) -> Extraction:
        """The signals of a body this strategy fetched. ``http`` never raises for what a
        site sent; ``activitypub`` raises a ``ValueError`` (``NotActivityStreams``) for
        a body that is not a usable ActivityStreams object."""
        result: Extraction = self.extractor(
            body,
            url=url,
            content_type=content_type,
            x_robots_tag=x_robots_tag,
            robots_token=robots_token,
        )
        return result


HTTP = Strategy(
    name="http",
    accept=HTTP_ACCEPT,
    media_types=PARSEABLE_TYPES | PDF_TYPES,
    extractor=extract,
)
ACTIVITYPUB = Strategy(
    name="activitypub",
    accept=activitystreams.ACCEPT,
    media_types=activitystreams.ACTIVITY_TYPES,
    extractor=activitystreams.extract_activity,
    skip_extensions=MEDIA_EXTENSIONS,
)

#: Every strategy by name; ``http`` first, the one every URL can have.
STRATEGIES: Mapping[str, Strategy] = MappingProxyType(
    {strategy.name: strategy for strategy in (HTTP, ACTIVITYPUB)}
)


def applicable(url: str) -> list[str]:
    """Names of the strategies that may be tried for ``url``, ``http`` first."""
    return [name for name, strategy in STRATEGIES.items() if strategy.applies(url)]
