"""Trove's events: frozen, versioned records with stable wire type names.

Events are the record; the Postgres tables are projections of them. Every event has
an ``id`` (a UUID, also sent as the ``Nats-Msg-Id`` header so JetStream drops
duplicate publishes), a ``type`` (a stable string such as ``PageDiscovered``, never a
Python class path), a schema ``version`` and the UTC time it happened.

On the wire an event is one JSON object, readable with ``nats stream view``. Older
versions are upcast by the functions in ``UPCASTERS`` before validation, so a
consumer only ever sees the current shape.

Events are read tolerantly and written strictly. A model refuses fields it does not
know (``extra="forbid"``), so a producer cannot send a misspelt field; ``decode_event``
ignores them, and reads a version newer than its own with the current model, so a
consumer older than its producer (a rolling upgrade, a rollback) handles what it knows
rather than parking the event. Schema rules: only add fields; a version bump ships an
upcaster first; consumers are upgraded before producers (docs/deploy.md).

``CrawlCompleted`` never carries the page body: Trove stores signals, not content.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic.dataclasses import dataclass
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticKnownError, core_schema

from trove_schema.errors import MalformedEvent
from trove_schema.text import Storable, StorableItems, StorableTerms, storable

#: Longest URL Trove accepts anywhere (seeds, links, redirects).
MAX_URL_LENGTH = 2048
#: Most links one CrawlCompleted carries; a page with more is cut (and says so).
MAX_LINKS_PER_PAGE = 1000
#: Sitemaps an attempt carries from its origin's robots.txt (``CrawlCompleted.sitemaps``):
#: the first of a file's ``Sitemap`` lines. A site lists one or a few; a file of
#: thousands would otherwise fill the event, and each is a page of its own to fetch.
MAX_SITEMAPS = 10
#: Most keywords one CrawlCompleted carries.
MAX_KEYWORDS = 200

# Text from outside is cleaned where it enters an event (``trove_schema.text``): NULs
# and surrogates marked, over-long values cut (URLs refused instead: a cut URL is
# another page), so every event holds only text Postgres can store.
URLText = Annotated[str, Storable(MAX_URL_LENGTH, cut=False)]
#: A host name (at most 253 characters in DNS).
DomainText = Annotated[str, Storable(253)]
#: A free-text line: a reason, an error message.
MessageText = Annotated[str, Storable(2000)]
#: A header value kept for later (ETag, Last-Modified, Content-Type).
HeaderText = Annotated[str, Storable(1000)]
#: A content hash (a kind's prefix and 62 hex digits, or a sha256's 64): what
#: ``pages.content_hash`` holds, so that no event, however made, is refused there.
HashText = Annotated[str, Storable(64)]

#: Begins a ``CrawlCompleted.content_hash`` of what the page says (its signals); ``m:``
#: one of the markup of a page that says too little to be told apart by its signals;
#: any other is the sha256 of the body's bytes (the hashes of the releases before
#: signals, and a body that is no page: a PDF, binary, unparsable). ``s:`` began the
#: signals of the releases whose text ran an inline element's words apart: a kind of
#: its own, which tells nothing beside this one.
SIGNALS_HASH_PREFIX = "t:"
#: Begins the hash of a page's markup (the fetcher's ``markup_digest``).
MARKUP_HASH_PREFIX = "m:"
#: The kinds of one release's hashes of a page's content: which one a page gets is
#: decided by its content (how much text it has), so one content never has both.
_CONTENT_KINDS = frozenset({SIGNALS_HASH_PREFIX, MARKUP_HASH_PREFIX})


def _hash_kind(digest: str) -> str:
    return digest[:2] if digest[1:2] == ":" else ""


def comparable_hashes(a: str, b: str) -> bool:
    """Whether two content hashes (or their starts) can tell a change: both of one kind
    (signals, markup, bytes). Two kinds say nothing: the page's first visit after the
    release that began hashing so, or a page that grew or lost its text."""
    return _hash_kind(a) == _hash_kind(b)


def pages_told_apart(a: str, b: str) -> bool | None:
    """Whether two content hashes (or their starts) of two URLs' pages show two pages
    (True), one (False), or cannot say (None: a hash of bytes, of a release before,
    beside one of what a page says). A hash of what a page says and one of its markup
    are two pages: a page of under 200 characters of text is no page of more."""
    if comparable_hashes(a, b):
        return a != b
    if {_hash_kind(a), _hash_kind(b)} <= _CONTENT_KINDS:
        return True
    return None


#: An event's priority in a header, read by consumers that order the work in hand
#: (``bus.Consumer.prefetch``) without decoding the event.
PRIORITY_HEADER = "Trove-Priority"
#: ``PageDiscovered.siblings``: among due work of equal priority, the page of the host
#: with the longer queue starts first.
SIBLINGS_HEADER = "Trove-Siblings"


#: The validation context ``decode_event`` reads with (``Bounded`` cuts, not refuses).
_READING: dict[str, bool] = {"reading": True}


@dataclasses.dataclass(frozen=True, slots=True)
class Bounded:
    """Field metadata for a collection of at most ``max_items``: refused over it where an
    event is built, cut to it where one is read (``decode_event``).

    A release that raises a bound is then read by the release before it (a rollback, a
    replay with the older code, a consumer upgraded last): refused, the whole event
    would be parked, a page's re-crawl chain or a poll's cursor with it. Producers stay
    strict. ``keep`` says which end a cut keeps: the ``first`` items, or the ``last``
    (a list kept oldest first, whose newest matter).
    """

    max_items: int
    keep: Literal["first", "last"] = "first"

    def check(self, value: Any, info: ValidationInfo) -> Any:
        if len(value) <= self.max_items:
            return value
        if info.context is not _READING:
            raise PydanticKnownError(
                "too_long",
                {
                    "field_type": "Dictionary" if isinstance(value, dict) else "Tuple",
                    "max_length": self.max_items,
                    "actual_length": len(value),
                },
            )
        items = list(value.items()) if isinstance(value, dict) else value
        kept = items[: self.max_items] if self.keep == "first" else items[-self.max_items :]
        return dict(kept) if isinstance(value, dict) else kept

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        # The bound checked here, not by pydantic while it builds the collection, which
        # can only refuse.
        return core_schema.with_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        bound = "maxProperties" if json_schema.get("type") == "object" else "maxItems"
        json_schema[bound] = self.max_items
        return json_schema


#: Most response headers one CrawlCompleted carries for the audit, and their sizes.
MAX_AUDIT_HEADERS = 16
MAX_AUDIT_HEADER_NAME = 64
MAX_AUDIT_HEADER_VALUE = 256

#: Selected response headers (lower-case names), for the audit: never cookies, never a body.
AuditHeaders = Annotated[
    dict[
        Annotated[str, Storable(MAX_AUDIT_HEADER_NAME)],
        Annotated[str, Storable(MAX_AUDIT_HEADER_VALUE)],
    ],
    Bounded(MAX_AUDIT_HEADERS),
]


def new_event_id() -> str:
    return str(uuid.uuid4())


_NAMESPACE_URL = uuid.NAMESPACE_URL.bytes


def derived_event_id(cause: str, purpose: str) -> str:
    """A deterministic id for an event caused by another one.

    Publishing the same consequence twice (a redelivered cause) yields the same id, so
    JetStream's duplicate window and every consumer's idempotency drop the second.
    It is ``uuid.uuid5(NAMESPACE_URL, "trove:{purpose}:{cause}")``, written out: the
    ``UUID`` object cost two thirds of it, and discovery derives one for every link.
    """
    name = _NAMESPACE_URL + f"trove:{purpose}:{cause}".encode()
    digest = bytearray(hashlib.sha1(name, usedforsecurity=False).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # the RFC 4122 variant
    hex_ = digest.hex()
    return f"{hex_[:8]}-{hex_[8:12]}-{hex_[12:16]}-{hex_[16:20]}-{hex_[20:]}"


def attempt_id(request_id: str) -> str:
    """The id of the attempt a fetch request (a ``PageDiscovered``, a ``CrawlRequested``)
    gets: one per request, so a redelivered job publishes its attempt again as a copy."""
    return derived_event_id(request_id, "crawl")


def explored_attempt_id(own: str) -> str:
    """The id of an attempt asked first a way that got the wrong kind of answer, the
    page's own attempt (``own``, its id) to follow it, asked another way."""
    return derived_event_id(own, "explored")


def is_explored(event: CrawlCompleted) -> bool:
    """Whether ``event`` is such an attempt: not the page's say, its own attempt is."""
    return event.id == explored_attempt_id(attempt_id(event.request_id))


def utcnow() -> datetime:
    return datetime.now(UTC)


#: No time of Trove's own (a crawl's, a schedule's) is in this year or later: each
#: service adds its delays to them (a century at most, ``settings.MAX_DURATION_SECONDS``),
#: and past year 9999 a datetime overflows, which failed a handler until its message was
#: parked. Such a time comes only from a clock that is wrong: refused where it is read.
LATEST_YEAR = 9000
#: Nor before this one, the Unix epoch's, which no clock reads: a retry due before the
#: year 1000 was written into its schedule as a year of three digits, which nats-server
#: refused, and the outbox's pass stopped at that row each time, every retry behind it
#: held.
EARLIEST_YEAR = 1970


def _within_reach(value: datetime) -> datetime:
    if value.year >= LATEST_YEAR:
        raise ValueError(f"a time in the year {LATEST_YEAR} or later: no clock is that far")
    if value.year < EARLIEST_YEAR:
        raise ValueError(f"a time before the year {EARLIEST_YEAR}: no clock reads one")
    return value


#: A time of Trove's own clocks (times a remote server gives stay plain datetimes).
Instant = Annotated[datetime, AfterValidator(_within_reach)]


class ScopeKind(StrEnum):
    HOST = "host"  # same host as the seed (default)
    DOMAIN = "domain"  # same registrable domain (public suffix list)
    PATTERN = "pattern"  # URLs matching a regular expression
    OPEN = "open"  # the open web


class CrawlOutcome(StrEnum):
    SUCCESS = "success"
    FAILED = "failed"
    TIMEOUT = "timeout"
    BLOCKED_ROBOTS = "blocked_robots"
    BLOCKED_4XX = "blocked_4xx"
    BLOCKED_5XX = "blocked_5xx"
    REJECTED = "rejected"
    NOT_MODIFIED = "not_modified"


#: Outcomes worth another attempt later (transient on the site's side).
RETRYABLE_OUTCOMES = frozenset(
    {CrawlOutcome.FAILED, CrawlOutcome.TIMEOUT, CrawlOutcome.BLOCKED_5XX}
)


class LinkKind(StrEnum):
    A = "a"
    IMG = "img"
    SCRIPT = "script"
    STYLESHEET = "stylesheet"
    FEED = "feed"
    CANONICAL = "canonical"
    ALTERNATE = "alternate"
    FEED_ITEM = "feed_item"
    REDIRECT = "redirect"
    OTHER = "other"
    #: rel=me: the page's author says the target is also them (IndieWeb identity).
    ME = "me"
    #: rel=webmention: the endpoint that takes Webmentions for the page, never a page.
    WEBMENTION = "webmention"


class RequestReason(StrEnum):
    DISCOVERED = "discovered"
    RETRY = "retry"
    RECRAWL = "recrawl"
    #: Sent by no release (a forced seed is a ``PageDiscovered`` with ``force``); kept so
    #: that an event that says it is still read.
    FORCED = "forced"


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)


#: Most times a scope moves with the redirects of a page named directly (as a browser's
#: redirect limit: a shortener to a shortener to the page).
MAX_SCOPE_MOVES = 5
#: Most of a page's redirects and canonical links in a row that keep its depth: a page
#: whose refresh or canonical names a new URL at every visit (a timestamp, a cache
#: buster) would otherwise lead on for ever at one depth. Past it, one counts a step.
MAX_SAME_PAGE_HOPS = 5


class Scope(Frozen):
    """Where a crawl may go, carried along from the seed to every page it reaches."""

    kind: ScopeKind = ScopeKind.HOST
    #: The seed's host (HOST), registrable domain (DOMAIN) or regex (PATTERN).
    value: str = ""
    max_depth: int = Field(default=5, ge=0, le=100)
    #: How many redirects of a page named directly (a seed, a shared link) moved this
    #: scope to where the page answers; 0 for the scope the operator or the post gave.
    #: Not bounded here (``MAX_SCOPE_MOVES`` is discovery's rule, which a release may
    #: change: a reader must not refuse the event), and not written when 0, so events
    #: read by a release that does not know it stay as they were.
    moves: int = Field(default=0, ge=0, exclude_if=lambda moves: moves == 0)
    #: How many redirects and canonical links in a row led here at the same depth (each
    #: names the page it came from); 0 after an ordinary link. Unbounded and left out
    #: when 0, as ``moves`` (``MAX_SAME_PAGE_HOPS`` is discovery's rule).
    same_page_hops: int = Field(default=0, ge=0, exclude_if=lambda hops: hops == 0)


#: A fediverse account, ``user@instance`` (what Mastodon calls ``acct``, made absolute).
AccountText = Annotated[str, Storable(320)]
#: A language tag (BCP-47).
LanguageText = Annotated[str, Storable(35)]
#: A timeline of a followed instance: ``local``, ``public`` or ``tag:NAME``.
TimelineName = Annotated[str, Field(pattern=r"^(local|public|tag:[A-Za-z0-9_]{1,100})$")]
#: A post id as an instance's API gives it.
PostId = Annotated[str, Storable(200)]
#: Most ids a poll chain carries of the posts it read behind its cursor.
MAX_RECENT_POSTS = 200
#: Most posts a follow reads back from before it.
MAX_BACKFILL = 1000
#: An account's key (``account_key``).
AccountKey = Annotated[str, Storable(64)]
#: Most accounts a poll says opted out.
MAX_WITHDRAWN = 1000


def account_key(account: str) -> str:
    """The key of a fediverse account (``user@instance``) in ``TimelinePolled.withdrawn``:
    the md5 of the account as a share keeps it, which Postgres computes alike
    (``md5(account)``). Not a secret (an account is guessed and hashed in no time): it
    names the account to the record without writing it down."""
    kept = storable(account, 320).encode("utf-8", "surrogatepass")
    return hashlib.md5(kept, usedforsecurity=False).hexdigest()


class Share(Frozen):
    """A public post on a followed instance that shared a URL (the page's provenance)."""

    #: The followed instance's origin (``https://social.example``).
    instance: URLText
    #: The post's ActivityPub id, the one identity of a post across instances.
    post_uri: URLText
    #: The post's own page, when the instance gives one.
    post_url: URLText | None = None
    account: AccountText
    shared_at: datetime | None = None
    language: LanguageText | None = None


class Provenance(Frozen):
    """Where a URL came from: a seed (and who sent it), a link on a page, a shared post."""

    kind: Literal["seed", "link", "feed", "redirect", "canonical", "recrawl", "share"]
    #: The page the link was found on, for links; absent for seeds.
    source_url: URLText | None = None
    #: Free text about the seed's origin: subject, client, file, operator name.
    origin: Annotated[str, Storable(512)] | None = None
    #: The post that shared the URL, for ``share``.
    share: Share | None = None


@dataclass(frozen=True, slots=True, config=ConfigDict(extra="forbid"))
class Link:
    """One outbound link of a page.

    A slotted dataclass rather than a model: a page carries up to a thousand, every
    service holds decoded events, and a model keeps a dict and a fields-set per
    instance, several times the link itself. Validated, serialized and strict like the
    models.
    """

    #: Cleaned with the whole tuple of links (``CrawlCompleted.links``), for speed.
    url: Annotated[str, Field(max_length=MAX_URL_LENGTH)]
    kind: LinkKind = LinkKind.A
    nofollow: bool = False


class Event(Frozen):
    """Base of every event. Subclasses set ``TYPE`` and ``VERSION``."""

    TYPE: ClassVar[str]
    VERSION: ClassVar[int] = 1
    #: Subject the event is published on (see ``trove_schema.topology``).
    SUBJECT: ClassVar[str]

    id: str = Field(default_factory=new_event_id)
    occurred_at: Instant = Field(default_factory=utcnow)

    @field_validator("occurred_at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        try:
            return value.astimezone(UTC)
        except OverflowError:  # year 1 at +14:00: before any UTC instant a datetime holds
            raise ValueError("a time out of range once in UTC") from None

    def to_wire(self) -> bytes:
        """Compact JSON, type and version first (``decode_event``'s fast path relies on it)."""
        body = self.__pydantic_serializer__.to_json(self)  # pydantic's own, no dict between
        head = f'{{"type":"{self.TYPE}","version":{self.VERSION}'.encode()
        return head + (b"}" if body == b"{}" else b"," + body[1:])

    def headers(self) -> dict[str, str]:
        headers = {"Nats-Msg-Id": self.id, "Trove-Event-Type": self.TYPE}
        priority = getattr(self, "priority", 0)
        if priority:
            # Read by consumers that order the work in hand (``bus.Consumer.prefetch``)
            # without decoding the event.
            headers[PRIORITY_HEADER] = str(priority)
        siblings = getattr(self, "siblings", 0)
        if siblings > 1:
            headers[SIBLINGS_HEADER] = str(siblings)
        return headers


class SeedRejected(Event):
    """A seed, or a follow or unfollow command, could not be accepted; ``reason`` says
    why, in words for the operator (a command's starts "follow refused: " or "unfollow
    refused: ")."""

    TYPE = "SeedRejected"
    SUBJECT = "trove.events.seed.rejected"

    #: What was sent, cut to 512 characters.
    raw: Annotated[str, Storable(512)]
    reason: MessageText
    provenance: Provenance


class PageDiscovered(Event):
    """A canonical URL entered the crawl: from a seed or from a link on a fetched page."""

    TYPE = "PageDiscovered"
    SUBJECT = "trove.events.page.discovered"

    url: URLText
    domain: DomainText
    depth: int = Field(default=0, ge=0)
    priority: int = Field(default=0, ge=-100, le=100)
    scope: Scope
    provenance: Provenance
    #: Re-request even if the URL was already seen this cycle (a forced seed).
    force: bool = False
    #: New pages of the same host that the same page revealed, this one included: a
    #: big site's queue is long, and the fetcher starts such pages first among due work
    #: of equal priority (``SIBLINGS_HEADER``), so that the longest queue, which
    #: sets when a crawl is done, is not the one left waiting.
    siblings: int = Field(default=0, ge=0)


#: Visits a page's change history keeps (the newest).
MAX_VISITS = 32


class ChangeHistory(Frozen):
    """What a page's visits said about how often it changes.

    It travels with the page's re-crawl chain: discovery puts it in each re-crawl
    request, the fetcher copies it into the attempt's ``CrawlCompleted``, and the next
    request carries it on with this visit added. The change-rate estimate and the next
    interval are computed from it (``trove_schema.change_rate``), so no service reads a
    database to plan a re-crawl.
    """

    #: ``CrawlCompleted.content_hash`` at the last successful visit.
    content_hash: HashText | None = None
    #: When that visit completed.
    visited_at: Instant | None = None
    #: (seconds since the visit before, changed since it), oldest first, newest last.
    visits: Annotated[tuple[tuple[float, bool], ...], Bounded(MAX_VISITS, keep="last")] = ()
    #: The re-crawl interval chosen after the last visit, in seconds.
    interval: float | None = None
    #: When the page was last answered with its body, which shows its links (a 304 shows
    #: none); None: not known (a chain an older release planned).
    read_whole_at: Instant | None = None


class CrawlRequested(Event):
    """A page is to be fetched (again): a retry, a re-crawl after its shelf life, or forced.

    Published as a NATS scheduled message when it is for later; ``not_before`` is when.
    """

    TYPE = "CrawlRequested"
    SUBJECT = "trove.events.crawl.requested"

    url: URLText
    domain: DomainText
    depth: int = Field(default=0, ge=0)
    priority: int = Field(default=0, ge=-100, le=100)
    scope: Scope
    reason: RequestReason
    #: Which attempt this will be (1 for the first fetch of a page).
    attempt: int = Field(default=1, ge=1)
    not_before: Instant | None = None
    #: Validators for a conditional GET (from the previous successful fetch).
    etag: HeaderText | None = None
    last_modified: HeaderText | None = None
    #: The URL whose answer gave those validators (the previous attempt's ``final_url``,
    #: or its ``url`` when it was not redirected): they are sent to that URL only, as
    #: the page's redirect may lead elsewhere now. None: the page's own URL only.
    validators_url: Annotated[str, Storable(MAX_URL_LENGTH)] | None = None
    #: The event that caused this request (the failed attempt, the earlier success).
    caused_by: str | None = None
    #: The page's change history so far (re-crawls, and the retries of re-crawls).
    history: ChangeHistory | None = None


class CrawlCompleted(Event):
    """One fetch attempt ended, whatever its outcome. Never carries the body."""

    TYPE = "CrawlCompleted"
    SUBJECT = "trove.events.crawl.completed"

    #: The URL as requested (the page's identity).
    url: URLText
    domain: DomainText
    #: Where the last redirect hop landed, when it differs from ``url``.
    final_url: Annotated[str, Storable(MAX_URL_LENGTH)] | None = None
    #: Every hop to ``final_url`` was a permanent redirect (301, 308): the page lives
    #: there now, and is re-crawled there rather than under ``url``.
    moved: bool = False
    depth: int = Field(default=0, ge=0)
    priority: int = Field(default=0, ge=-100, le=100)
    scope: Scope
    attempt: int = Field(default=1, ge=1)
    #: The work event (PageDiscovered or CrawlRequested) this attempt answered.
    request_id: str
    outcome: CrawlOutcome
    status_code: int | None = None
    error_message: MessageText | None = None
    started_at: Instant
    completed_at: Instant
    #: Seconds the site asked us to wait (Retry-After), when it did.
    retry_after: float | None = None
    content_type: HeaderText | None = None
    content_length: int | None = None
    #: A hash of what the page says (``SIGNALS_HASH_PREFIX``: its title, visible text,
    #: links, media, canonical and noindex), or the sha256 of the body's bytes when it
    #: says too little; to tell unchanged pages apart, and spellings of one page. Only
    #: hashes of one kind are compared (``comparable_hashes``).
    content_hash: HashText | None = None
    title: Annotated[str, Storable(1000)] | None = None
    #: BCP-47 tag, or None when the detector was not sure.
    language: Annotated[str, Storable(35)] | None = None
    #: A bounded bag of terms for the search index: never text the body could be rebuilt from.
    keywords: Annotated[tuple[str, ...], StorableTerms(100), Bounded(MAX_KEYWORDS)] = ()
    links: Annotated[tuple[Link, ...], Bounded(MAX_LINKS_PER_PAGE), StorableItems("url")] = ()
    links_truncated: bool = False
    #: The ``Sitemap`` lines of the origin's robots.txt (canonical), on an attempt at
    #: the origin's home page: the site's own list of its pages, which discovery
    #: follows as feeds. Not the page's links: the link graph does not hold them.
    sitemaps: Annotated[tuple[URLText, ...], Bounded(MAX_SITEMAPS)] = ()
    canonical_url: URLText | None = None
    noindex: bool = False
    nofollow: bool = False
    etag: HeaderText | None = None
    last_modified: HeaderText | None = None
    #: The fetch strategy that made the attempt (``http``: the plain HTTP client).
    fetcher: Annotated[str, Storable(32)] = "http"
    #: Selected response headers of the final response (``MAX_AUDIT_HEADERS`` at most).
    response_headers: AuditHeaders = Field(default_factory=dict)
    #: Milliseconds the requests took (waits between redirect hops left out); None when
    #: no request was made. Older events: derive it from ``started_at``/``completed_at``.
    duration_ms: int | None = Field(default=None, ge=0, le=2**31 - 1)
    #: Why the fetcher chose ``fetcher`` for this URL (``trove_schema.policy``): ``only``
    #: (the one strategy that applies), ``prior``, ``learned``, ``explore``.
    strategy_reason: Annotated[str, Storable(32)] | None = None
    #: Characters of readable text the page gave; None when it was not parsed.
    text_chars: int | None = Field(default=None, ge=0)
    #: The page is an application shell: scripts and a mount point, no text to read.
    shell: bool = False
    #: The request carried validators (If-None-Match / If-Modified-Since).
    conditional: bool = False
    #: ``rejected`` by the operator's exclusions, before any request: the page's chain
    #: goes on, each visit refused alike while the rule holds, so that its pages come
    #: back at their next visit once it is lifted.
    excluded: bool = False
    #: The page's change history, copied from the request this attempt answered.
    history: ChangeHistory | None = None

    @property
    def retryable(self) -> bool:
        return self.outcome in RETRYABLE_OUTCOMES or self.status_code in (429, 503)


class InstanceFollowed(Event):
    """An operator follows a timeline of a fediverse instance: its posts' links are crawled."""

    TYPE = "InstanceFollowed"
    SUBJECT = "trove.events.instance.followed"

    #: The instance's origin (``https://social.example``).
    instance: URLText
    domain: DomainText
    timeline: TimelineName = "local"
    #: How far the crawl goes from a shared page, on the shared page's own host.
    max_depth: int = Field(default=0, ge=0, le=100)
    priority: int = Field(default=0, ge=-100, le=100)
    #: Posts read back in time from the follow: by the first poll, and on by the polls
    #: after it where its pages did not reach.
    backfill: int = Field(default=40, ge=0, le=MAX_BACKFILL)
    provenance: Provenance


class InstanceUnfollowed(Event):
    """An operator stops following a timeline (every timeline of it when ``timeline`` is None)."""

    TYPE = "InstanceUnfollowed"
    SUBJECT = "trove.events.instance.unfollowed"

    instance: URLText
    domain: DomainText
    timeline: TimelineName | None = None
    provenance: Provenance


class TimelinePollRequested(Event):
    """Read a followed timeline from its cursor on (fetcher work, usually scheduled).

    Each poll answers one of these with a ``TimelinePolled``, which carries the cursor
    on; the next request is published from it. The chain of requests and answers is the
    durable cursor: nothing is kept anywhere else, and one chain per timeline means one
    poll at a time, whatever the number of replicas.
    """

    TYPE = "TimelinePollRequested"
    SUBJECT = "trove.events.timeline.requested"

    instance: URLText
    domain: DomainText
    timeline: TimelineName
    #: The ``InstanceFollowed`` this chain belongs to (a new follow starts a new chain).
    follow_id: str
    #: The newest post id handled (the API's ``min_id``); None before the first poll.
    cursor: PostId | None = None
    #: When the cursor was read, on the instance's clock: the newest posts made after
    #: it yet numbered before it are an instance that numbers its posts anew. None when
    #: not known (an answer without a ``Date``, a chain from a release before).
    cursor_at: datetime | None = None
    #: Ids of the posts handled in the lookback behind the cursor (the poller reads it
    #: again, for posts that reached the instance after a newer one): not handled twice.
    #: In id order, the newest last.
    recent: Annotated[tuple[PostId, ...], Bounded(MAX_RECENT_POSTS, keep="last")] = ()
    #: Posts to read back while there is no cursor yet (the follow's ``backfill``);
    #: None: the fetcher's own bound.
    backfill: int | None = Field(default=None, ge=0, le=MAX_BACKFILL)
    #: A backfill the first poll's pages did not finish: the oldest post read back so
    #: far, and how many posts are still to be read back below it (after the new ones,
    #: in the pages a poll has left). None and 0 once it is done.
    back_from: PostId | None = None
    back_left: int = Field(default=0, ge=0, le=MAX_BACKFILL)
    #: Pages of the backfill in a row the instance asked to wait for (a 429, a
    #: ``Retry-After``) or failed to answer (a 5xx, a timeout, a connection refused or
    #: lost), none of it read since: the poller gives it up at a few.
    back_failures: int = Field(default=0, ge=0)
    #: The API's base URL found through NodeInfo; None until then.
    api: URLText | None = None
    software: Annotated[str, Storable(100)] | None = None
    software_version: Annotated[str, Storable(100)] | None = None
    #: Which poll of the chain this is (1 for the first).
    poll: int = Field(default=1, ge=1)
    #: Polls in a row that failed (the pause grows with it).
    failures: int = Field(default=0, ge=0)
    not_before: Instant | None = None
    caused_by: str | None = None


class SharedPost(Frozen):
    """One public post of a polled timeline and the links it shares (opted-out accounts
    never appear: they are counted in ``TimelinePolled.skipped`` and keyed in its
    ``withdrawn``)."""

    uri: URLText
    url: URLText | None = None
    account: AccountText
    shared_at: datetime | None = None
    language: LanguageText | None = None
    #: The preview card's URL and the links in the content (canonical; no mentions,
    #: hashtags or the instance's own pages).
    links: Annotated[tuple[URLText, ...], Bounded(100)] = ()


class TimelinePolled(Event):
    """One poll of a followed timeline ended, whatever its outcome."""

    TYPE = "TimelinePolled"
    SUBJECT = "trove.events.timeline.polled"

    request_id: str
    instance: URLText
    domain: DomainText
    timeline: TimelineName
    follow_id: str
    poll: int = Field(default=1, ge=1)
    #: success, or what went wrong (``CrawlOutcome`` values: failed, timeout, blocked_4xx,
    #: blocked_5xx, blocked_robots, rejected).
    outcome: CrawlOutcome
    status_code: int | None = None
    error_message: MessageText | None = None
    started_at: Instant
    completed_at: Instant
    api: URLText | None = None
    software: Annotated[str, Storable(100)] | None = None
    software_version: Annotated[str, Storable(100)] | None = None
    #: The cursor the poll started from and the one it ends on (the same when nothing
    #: new was read or the poll failed: the cursor is never lost).
    cursor_before: Annotated[str, Storable(200)] | None = None
    cursor_after: Annotated[str, Storable(200)] | None = None
    #: When ``cursor_after`` was read, on the instance's clock, for the next request (as
    #: ``TimelinePollRequested.cursor_at``); None when not known.
    cursor_after_at: datetime | None = None
    #: The ids handled in the lookback behind ``cursor_after``, for the next request (as
    #: ``TimelinePollRequested.recent``).
    recent_after: Annotated[tuple[PostId, ...], Bounded(MAX_RECENT_POSTS, keep="last")] = ()
    #: The backfill still to be read back, for the next request (as
    #: ``TimelinePollRequested.back_from``, ``back_left`` and ``back_failures``; the
    #: count is the one this poll leaves, whatever its outcome).
    back_from: PostId | None = None
    back_left: int = Field(default=0, ge=0, le=MAX_BACKFILL)
    back_failures: int = Field(default=0, ge=0)
    #: There is more to read past ``cursor_after`` (the poll stopped at its page bound),
    #: or a backfill still to read.
    more: bool = False
    posts: Annotated[tuple[SharedPost, ...], Bounded(1000)] = ()
    #: Posts left out: not public, or their account opted out of search or discovery.
    skipped: int = Field(default=0, ge=0)
    #: The accounts (``account_key``) whose public posts this poll left out because they
    #: opted out: the shares of their earlier posts, from before they did, are withdrawn.
    withdrawn: Annotated[tuple[AccountKey, ...], Bounded(MAX_WITHDRAWN)] = ()
    #: Seconds before the next poll: what the instance asked (Retry-After, or its
    #: rate-limit reset), or how long until the host's lease is free again.
    retry_after: float | None = None
    #: The instance asked us to wait (a 429, a 503 with Retry-After, its limit spent);
    #: a wait for the host's own lease is not its asking.
    rate_limited: bool = False
    #: Requests made (NodeInfo and API pages), each under the instance host's lease.
    requests: int = Field(default=0, ge=0)
    #: A ``success`` that read on and was then cut short by the instance: how its last
    #: answer ended (``timeout``, ``failed``, ``blocked_5xx``...), which the instance's
    #: host is judged by as after a failed poll. None when nothing cut it short, and for
    #: a failed poll (its ``outcome`` says it).
    stopped_by: CrawlOutcome | None = None
    #: The last answer was a bot challenge (``trove_schema.heuristics.is_challenge``),
    #: whatever its status: the host is left alone as after a challenge to a page.
    challenged: bool = False


EVENT_TYPES: dict[str, type[Event]] = {
    cls.TYPE: cls
    for cls in (
        SeedRejected,
        PageDiscovered,
        CrawlRequested,
        CrawlCompleted,
        InstanceFollowed,
        InstanceUnfollowed,
        TimelinePollRequested,
        TimelinePolled,
    )
}

#: (type, from_version) -> function turning that version's JSON into the next version's.
UPCASTERS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {}


#: ``to_wire`` writes the type and version first: events in the current version take a
#: fast path (pydantic parses the bytes itself, ~2x faster than json.loads + validate).
_WIRE_PREFIX = re.compile(rb'^\{"type":"([A-Za-z]+)","version":(\d+),')


_log = logging.getLogger(__name__)
#: What was already logged about reading tolerantly: (type, newer version) and (type,
#: "unknown fields"). Bounded by the event types and the versions producers use.
_LOGGED: set[tuple[str, int | str]] = set()


def decode_event(data: bytes | str) -> Event:
    """Parse an event from the wire, tolerantly. Raises MalformedEvent.

    Old versions are upcast; a version newer than this code is read with the current
    model (its known fields), logged once; unknown fields, at any depth, are ignored.
    What is still invalid (a known field of the wrong type, a required field missing)
    is a MalformedEvent.
    """
    raw_bytes = data.encode() if isinstance(data, str) else data
    prefix = _WIRE_PREFIX.match(raw_bytes)
    if prefix is not None:
        fast = EVENT_TYPES.get(prefix.group(1).decode())
        if fast is not None and int(prefix.group(2)) == fast.VERSION:
            try:
                return fast.model_validate_json(b"{" + raw_bytes[prefix.end() :], context=_READING)
            except ValidationError as exc:
                # pydantic's JSON parser refuses a lone surrogate escape, which json.loads
                # reads (and the text types then mark): the path below reads those too.
                unparsed = any(error["type"] == "json_invalid" for error in exc.errors())
                if not unparsed and len(_tolerable(exc)) < exc.error_count():
                    raise MalformedEvent(f"invalid {fast.TYPE}: {exc}") from exc
                # Only fields this code does not know: the tolerant path below drops them.
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedEvent(f"not JSON: {exc}") from exc
    except RecursionError:
        raise MalformedEvent("not JSON this reader can hold: nested too deeply") from None
    if not isinstance(raw, dict):
        raise MalformedEvent("an event is a JSON object")
    type_name = raw.pop("type", None)
    version = raw.pop("version", 1)
    cls = EVENT_TYPES.get(type_name) if isinstance(type_name, str) else None
    if cls is None:
        raise MalformedEvent(f"unknown event type {type_name!r}")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise MalformedEvent(f"unsupported version {version!r} of {type_name}")
    if version > cls.VERSION and (cls.TYPE, version) not in _LOGGED:
        _LOGGED.add((cls.TYPE, version))
        _log.warning(
            "reading %s version %d with this code's version %d: fields it does not know "
            "are ignored (upgrade this service)",
            cls.TYPE,
            version,
            cls.VERSION,
        )
    while version < cls.VERSION:
        raw = UPCASTERS[(cls.TYPE, version)](raw)
        version += 1
    return _validate_tolerantly(cls, raw)


#: How pydantic names a field it does not know: in a model, and in a dataclass (``Link``).
_UNKNOWN_FIELD_ERRORS = frozenset({"extra_forbidden", "unexpected_keyword_argument"})


#: An event's times that say when something happened, never when it is due.
_HAPPENED = ("occurred_at", "started_at", "completed_at")


_Read = TypeVar("_Read", bound=Event)


def as_stored(event: _Read, stored_at: datetime) -> _Read:
    """``event`` with no time of what happened later than ``stored_at``, when the record
    took it (its message's stream timestamp), which nothing that happened can follow.

    An attempt stamped a year ahead (a producer's clock, a hand-made event) was newer
    than every real one, and froze its page's row for that year: each later attempt read
    as older. Taken at the record's time, it is ordered as the record has it, and a
    replay, which reads the same timestamps, orders it the same way. Within a clock's
    doubt of the server's (a fetcher's times are on nats-server's) it moves by that."""
    late = {
        name: stored_at
        for name in _HAPPENED
        if (value := getattr(event, name, None)) is not None and value > stored_at
    }
    return event.model_copy(update=late) if late else event


def _unknown_fields(exc: ValidationError) -> list[tuple[int | str, ...]]:
    return [tuple(e["loc"]) for e in exc.errors() if e["type"] in _UNKNOWN_FIELD_ERRORS]


def _unknown_link_kinds(exc: ValidationError) -> list[tuple[int | str, ...]]:
    """Link kinds a newer producer added (``me`` was one): read as ``other``."""
    return [
        tuple(e["loc"])
        for e in exc.errors()
        if e["type"] == "enum" and len(e["loc"]) == 3 and e["loc"][::2] == ("links", "kind")
    ]


def _tolerable(exc: ValidationError) -> list[tuple[int | str, ...]]:
    return _unknown_fields(exc) + _unknown_link_kinds(exc)


def _validate_tolerantly(cls: type[Event], raw: dict[str, Any]) -> Event:
    """Validate; if the only objections are unknown fields, drop them and validate again.

    The models stay ``extra="forbid"`` so that constructing an event is strict; reading
    asks pydantic where the unknown fields are instead of walking the schema here.
    """
    try:
        return cls.model_validate(raw, context=_READING)
    except ValidationError as exc:
        unknown = _unknown_fields(exc)
        kinds = _unknown_link_kinds(exc)
        if not unknown and not kinds:
            raise MalformedEvent(f"invalid {cls.TYPE}: {exc}") from exc
    for loc in unknown:
        _drop(raw, loc)
    for _, index, _ in kinds:
        raw["links"][index]["kind"] = LinkKind.OTHER.value
    if (cls.TYPE, "unknown fields") not in _LOGGED:
        _LOGGED.add((cls.TYPE, "unknown fields"))
        names = sorted({".".join(str(p) for p in loc if isinstance(p, str)) for loc in unknown})
        _log.info("ignoring fields of %s this code does not know: %s", cls.TYPE, names)
    try:
        return cls.model_validate(raw, context=_READING)
    except ValidationError as exc:
        raise MalformedEvent(f"invalid {cls.TYPE}: {exc}") from exc


def _drop(raw: Any, loc: tuple[int | str, ...]) -> None:
    """Delete the value at ``loc`` (keys and list indexes) from parsed JSON, if it is there."""
    *path, last = loc
    for step in path:
        if isinstance(raw, dict) and isinstance(step, str):
            raw = raw.get(step)
        elif isinstance(raw, list) and isinstance(step, int) and 0 <= step < len(raw):
            raw = raw[step]
        else:
            return
    if isinstance(raw, dict) and isinstance(last, str):
        raw.pop(last, None)
