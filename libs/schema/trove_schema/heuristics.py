"""What an attempt says about its host: the audit verdict and its heuristic tags.

One pure function of the ``CrawlCompleted`` event (``audit``), so the recorder's live
projection and a replay derive the same verdict and the same tags. Tags are
(type, value, importance) triples of text: a new kind of tag is a change here, never
a migration. Tags come in two kinds:

* before the fetch, from the URL alone: ``domain``, ``tld``, ``extension``,
  ``path_depth``, ``has_query``, ``contains_cdn``, ``contains_static``, ``scheme``;
* after it, from the response: ``outcome``, ``status``, ``status_class``,
  ``error_type``, ``challenge``, ``content_type``, ``content_family``, ``empty_body``,
  ``server``, ``cdn``, ``retry_after``, ``x_robots_tag``, ``redirected``, ``has_spa``
  and ``text_chars`` (a bucket) when the body was parsed;
* how it was fetched: ``strategy`` (the event's ``fetcher``) and ``strategy_reason``.

The verdict:

* ``success`` means usable content for the strategy that asked, not merely a 200: a
  ``success`` outcome carrying a title, text, a keyword or a link (something a reader
  of the page could use), or a ``not_modified`` (the content already held is still
  current). A 200 with an empty body or none of these is ``empty_content``. A bot
  challenge is never a success, whatever its status.
* ``is_banned`` means the site refused Trove itself rather than the page: 403, 429,
  or a bot challenge (``CF-Mitigated: challenge``, or a 403/503 from a challenging
  CDN).
* ``error_type`` is one word for what went wrong (None on success): ``robots``,
  ``blocked_captcha``, ``blocked_403``, ``rate_limited``, ``not_found``,
  ``client_error``, ``server_error``, ``timeout``, ``network_error``, ``wrong_tool``,
  ``unparsed_type`` (a content type no strategy reads), ``offsite_redirect``,
  ``broken_answer`` (a redirect loop, a redirect without a Location, a body corrupt
  for its encoding), ``blocked_address`` (the SSRF guard), ``rejected``,
  ``empty_content``. Only ``network_error``, ``timeout`` and ``server_error`` say the
  host is unwell (``trove_schema.policy.HOST_FAILURES``).
* ``wrong_tool`` is content the strategy cannot use, which another strategy may: an
  application shell (``shell`` with under ``SHELL_MAX_TEXT_CHARS`` of text), a content
  type the strategy does not parse (an HTML page answered to an ``activitypub``
  request), a body its reader refused as not its kind (``NotActivityStreams``; a
  reader that broke on a hostile page is ``rejected``). A feed is content for
  ``http``: Trove reads feeds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from trove_schema.events import CrawlCompleted, CrawlOutcome
from trove_schema.media import media_type
from trove_schema.text import storable

#: Longest tag value stored (a content type or server header is a few dozen characters).
MAX_TAG_VALUE = 256
DEFAULT_IMPORTANCE = 0.5
#: Readable characters under which a page that looks like an application shell is one
#: (a shell's footer or "Loading..." is a few dozen; an article, thousands).
SHELL_MAX_TEXT_CHARS = 200

#: The content families each strategy reads, where a success of another family is not
#: usable for it (``http`` takes what its Accept header allows, feeds and PDFs included).
_STRATEGY_FAMILIES = {"activitypub": frozenset({"json"})}
#: Statuses that refuse the representation a strategy asks for, not the page.
_REFUSED_REPRESENTATIONS = frozenset({401, 406, 415})
#: Upper bounds of the ``text_chars`` tag's buckets, and the label of each.
_TEXT_BUCKETS = ((0, "0"), (199, "1-199"), (999, "200-999"), (9_999, "1k-10k"))

#: Content families some strategy reads (``http``: pages, feeds, PDF; ``activitypub``:
#: JSON): another strategy may read what one could not.
_READABLE_FAMILIES = frozenset({"html", "feed", "pdf", "xml", "json"})
#: How the fetcher's messages begin for an answer it could not follow (lower case).
_BROKEN_ANSWERS = (
    "redirect loop",
    "too many redirects",
    "invalid redirect location",
    "corrupt ",
    "http 304 to an unconditional request",
)
#: Servers that answer a bot with a challenge page on 403/503.
_CHALLENGING_SERVERS = ("cloudflare", "ddos-guard", "sucuri", "akamaighost")
#: A header that names the CDN in front of a site.
_CDN_HEADERS = (
    ("cf-ray", "cloudflare"),
    ("x-amz-cf-id", "cloudfront"),
    ("x-served-by", "fastly"),
    ("x-akamai-transformed", "akamai"),
)
_SERVER_FAMILIES = (
    "cloudflare",
    "nginx",
    "apache",
    "microsoft-iis",
    "caddy",
    "litespeed",
    "openresty",
    "gunicorn",
    "uvicorn",
    "envoy",
    "varnish",
    "akamaighost",
    "gws",
)


@dataclass(frozen=True, slots=True)
class Tag:
    type: str
    value: str
    importance: float = DEFAULT_IMPORTANCE


@dataclass(frozen=True, slots=True)
class Audit:
    """The verdict on one attempt and its tags."""

    success: bool
    is_banned: bool
    error_type: str | None
    tags: tuple[Tag, ...]


def audit(event: CrawlCompleted) -> Audit:
    """The verdict and tags of one attempt; the same event always gives the same answer."""
    headers = {name.lower(): value for name, value in event.response_headers.items()}
    challenge = is_challenge(event.status_code, headers)
    error_type = _error_type(event, challenge)
    is_banned = challenge or event.status_code in (403, 429)
    tags = [
        *url_tags(event.url),
        *_response_tags(event, headers, error_type, challenge),
        *_strategy_tags(event),
    ]
    return Audit(
        success=error_type is None,
        is_banned=is_banned,
        error_type=error_type,
        tags=tuple(Tag(t.type, storable(t.value, MAX_TAG_VALUE), t.importance) for t in tags),
    )


def usable(event: CrawlCompleted) -> bool:
    """``audit(event).success`` without the tags: whether the attempt brought the page's
    content (not a challenge, a shell, an empty body or the wrong kind)."""
    headers = {name.lower(): value for name, value in event.response_headers.items()}
    return _error_type(event, is_challenge(event.status_code, headers)) is None


def url_tags(url: str) -> list[Tag]:
    """Tags known before the fetch, from the URL alone."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    segments = [s for s in parts.path.split("/") if s]
    last = segments[-1] if segments else ""
    extension = last.rsplit(".", 1)[1].lower() if "." in last[1:] else "none"
    labels = host.rsplit(".", 1)
    lowered = url.lower()
    return [
        Tag("domain", host, 0.6),
        Tag("tld", labels[-1] if len(labels) > 1 else host, 0.3),
        Tag("scheme", parts.scheme.lower(), 0.2),
        Tag("extension", extension[:16], 0.4),
        Tag("path_depth", str(len(segments)), 0.3),
        Tag("has_query", _flag(bool(parts.query)), 0.3),
        Tag("contains_cdn", _flag("cdn" in lowered), 0.4),
        Tag("contains_static", _flag(any(w in lowered for w in ("static", "assets"))), 0.4),
    ]


def _response_tags(
    event: CrawlCompleted, headers: dict[str, str], error_type: str | None, challenge: bool
) -> list[Tag]:
    tags = [Tag("outcome", event.outcome.value, 0.7)]
    if event.status_code is not None:
        tags.append(Tag("status", str(event.status_code), 0.7))
        tags.append(Tag("status_class", f"{event.status_code // 100}xx", 0.6))
    if error_type is not None:
        tags.append(Tag("error_type", error_type, 0.8))
    tags.append(Tag("challenge", _flag(challenge), 0.9 if challenge else 0.3))
    kind = media_type(event.content_type or headers.get("content-type"))
    if kind is not None:
        tags.append(Tag("content_type", kind, 0.5))
        tags.append(Tag("content_family", _content_family(kind), 0.5))
    if event.content_length is not None:
        tags.append(Tag("empty_body", _flag(event.content_length == 0), 0.5))
    server = headers.get("server")
    if server:
        tags.append(Tag("server", _server_family(server), 0.5))
    for header, cdn in _CDN_HEADERS:
        if header in headers:
            tags.append(Tag("cdn", cdn, 0.5))
            break
    if event.retry_after is not None or "retry-after" in headers:
        tags.append(Tag("retry_after", "true", 0.8))
    robots = headers.get("x-robots-tag")
    if robots:
        tags.append(Tag("x_robots_tag", robots.lower(), 0.6))
    if event.final_url:
        tags.append(Tag("redirected", "true", 0.4))
    return tags


def _strategy_tags(event: CrawlCompleted) -> list[Tag]:
    tags = [Tag("strategy", event.fetcher, 0.7)]
    if event.strategy_reason:
        tags.append(Tag("strategy_reason", event.strategy_reason, 0.3))
    if event.text_chars is not None or event.shell:
        tags.append(Tag("has_spa", _flag(event.shell), 0.8 if event.shell else 0.4))
    if event.text_chars is not None:
        tags.append(Tag("text_chars", text_bucket(event.text_chars), 0.5))
    return tags


def text_bucket(chars: int) -> str:
    """The ``text_chars`` tag's value: a coarse bucket, so that tags group attempts."""
    for bound, label in _TEXT_BUCKETS:
        if chars <= bound:
            return label
    return "10k+"


def is_challenge(status: int | None, headers: Mapping[str, str]) -> bool:
    """Whether an answer (its status, its ``AUDIT_HEADERS`` by lower-case name) is a bot
    challenge rather than the page, whatever its status: Cloudflare's ``cf-mitigated``,
    AWS WAF's ``x-amzn-waf-action`` (a 202 or a 405), a challenging server's 403/503."""
    if headers.get("cf-mitigated", "").strip().lower() == "challenge":
        return True
    if headers.get("x-amzn-waf-action", "").strip().lower() in ("challenge", "captcha"):
        return True
    if status == 503 and "retry-after" in headers:
        # A CDN passes its origin's maintenance answer on under its own name; a
        # challenge asks for no time.
        return False
    if status in (403, 503):
        server = headers.get("server", "").lower()
        return any(name in server for name in _CHALLENGING_SERVERS)
    return False


def _error_type(event: CrawlCompleted, challenge: bool) -> str | None:
    outcome, status = event.outcome, event.status_code
    message = (event.error_message or "").lower()
    if outcome is CrawlOutcome.BLOCKED_ROBOTS or message.startswith("robots.txt"):
        return "robots"
    # Before the outcome: a challenge page sent with a 200 is still not the page.
    if challenge:
        return "blocked_captcha"
    if outcome is CrawlOutcome.SUCCESS:
        return _content_error(event)
    if outcome is CrawlOutcome.NOT_MODIFIED:
        return None
    if status == 429:
        return "rate_limited"
    if status == 403:
        return "blocked_403"
    if status in (404, 410):
        return "not_found"
    if status in _REFUSED_REPRESENTATIONS and event.fetcher in _STRATEGY_FAMILIES:
        # Asked for what a strategy reads (ActivityStreams), the server refused that, not
        # the page: a 406 or 415 of strict content negotiation (Mastodon's own, Rails',
        # Spring's), a 401 of an instance that serves its objects to signed requests
        # only. Taken for the page's status, the page failed, was never asked as a page,
        # and no estimate learned: a host's pages asked so for months.
        return "wrong_tool"
    if status is not None and 400 <= status < 500:
        return "client_error"
    if status is not None and status >= 500:
        return "server_error"
    if outcome is CrawlOutcome.TIMEOUT:
        return "timeout"
    if outcome is CrawlOutcome.REJECTED:
        # A reader refusing a body as not its kind (JSON that is no ActivityStreams
        # object) is the wrong tool; a reader that broke on a hostile page is not.
        if "content type" in message:
            # Another strategy may read a page or an object; none reads an archive.
            family = _content_family(media_type(event.content_type) or "")
            return "wrong_tool" if family in _READABLE_FAMILIES else "unparsed_type"
        if message.startswith("extraction failed: notactivitystreams"):
            return "wrong_tool"
        if "another host" in message:
            return "offsite_redirect"
        return "rejected"
    if message.startswith("blocked address"):
        return "blocked_address"
    if message.startswith(_BROKEN_ANSWERS) or "without a location" in message:
        # The host answered, promptly, with what leads nowhere (a redirect loop, say,
        # of a site that sets a cookie first): not a host to pause as unreachable.
        return "broken_answer"
    return "network_error"


def _content_error(event: CrawlCompleted) -> str | None:
    """What is wrong with a response the fetcher took as content (None: it is usable)."""
    if event.content_length == 0:
        return "empty_content"
    families = _STRATEGY_FAMILIES.get(event.fetcher)
    if families is not None:
        kind = media_type(event.content_type)
        if kind is None or _content_family(kind) not in families:
            return "wrong_tool"
    text = event.text_chars or 0
    if event.shell and text < SHELL_MAX_TEXT_CHARS:
        return "wrong_tool"
    usable = bool(event.title) or bool(event.keywords) or bool(event.links) or text > 0
    return None if usable else "empty_content"


def _content_family(kind: str) -> str:
    if kind in ("text/html", "application/xhtml+xml"):
        return "html"
    if kind in ("application/rss+xml", "application/atom+xml", "application/feed+json"):
        return "feed"
    if kind in ("application/pdf", "application/x-pdf"):
        return "pdf"
    if kind.endswith("xml"):
        return "xml"
    if kind.endswith("json"):
        return "json"
    family = kind.split("/", 1)[0]
    return family if family in ("image", "video", "audio", "text", "font") else "other"


def _server_family(server: str) -> str:
    product = server.strip().lower().split("/", 1)[0].split(" ", 1)[0]
    return product if product in _SERVER_FAMILIES else "other"


def _flag(value: bool) -> str:
    return "true" if value else "false"
