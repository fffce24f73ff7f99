"""Polling a followed fediverse timeline: one ``TimelinePollRequested`` in, one
``TimelinePolled`` out, whatever the instance sends.

``TimelinePoller.poll`` reads the timeline through the Mastodon client API, which
Mastodon, Pleroma/Akkoma, GoToSocial and others implement:

* **NodeInfo first** while the request knows no API, and again on one poll in
  ``SOFTWARE_CHECK_EVERY``: ``/.well-known/nodeinfo``, then the newest 2.x document it
  lists on the instance's own host, for the software's name and version, by whose
  rules ids are read. Software known not to speak the API is ``rejected`` unless its
  API has answered (a cursor); unknown software, or an instance without NodeInfo (or
  whose document fails), is tried anyway.
* **From the cursor on.** ``local`` reads ``/api/v1/timelines/public?local=true``,
  ``public`` the same without it, ``tag:NAME`` ``/api/v1/timelines/tag/NAME``; with
  ``min_id=<cursor>`` each page holds the posts right after the cursor, and the next
  page is asked for right after the page's newest post (not along the Link header,
  whose ``prev`` may read on from elsewhere and skip posts). At most ``max_pages``
  pages a poll (then ``more``); a page shorter than asked for means the poll caught
  up. The first poll (no cursor) reads back from the newest post, each page before
  the last one's oldest, at most ``backfill`` posts, and starts the cursor at the
  newest post. What its pages did not reach of the backfill (``back_from``, the
  oldest post it handled, and ``back_left``) the polls after it read on back, after
  the new posts, in the requests they have left (one at least); only they take posts
  below ``back_from``, which only ever moves down. A wait the instance asks for there
  (a 429, a ``Retry-After``), or a failure to answer (a 5xx, a timeout, no connection),
  ends the poll and keeps the rest for after it (a poll that read neither new posts
  nor old ones is then a failure), until the ``BACK_FAILURES``-th in a row with none
  of it read between (``back_failures``); a page of it refused otherwise (another 4xx,
  a challenge, an answer not JSON, posts unreadable or dated ahead, a redirect loop)
  leaves the rest unread, with a note (a refusal of the host's still ends the poll, a
  success, and the host is judged by it).
* **The cursor** (``cursor_after``) is the newest post id handled (kept or skipped),
  ids compared as numbers when they are digits (Mastodon's snowflakes), else as
  strings (GoToSocial's ULIDs, Pleroma's flake ids sort so). Posts not newer than the
  cursor (but the lookback's and the backfill's, each in its own range), or seen
  before in the poll, are ignored: a misbehaving instance cannot make a post be
  handled twice. An id no instance can have given (a number past 64 bits;
  a snowflake of Mastodon's dated more than ``FUTURE_ID_SLACK`` past the instance's
  clock, its ``Date`` when within a day of the pods', else ``FUTURE_ID_SLACK_UNTOLD``
  past the pods'; on software not known, one dated so by less than
  ``OTHER_NUMBERS_AHEAD``) is malformed: as the cursor it would hide every later post.
  The cursor goes with when it was read, on the instance's clock (``cursor_after_at``:
  the ``Date`` of the answer that held it, when believed, ``_read_at``; the request's
  ``cursor_at`` while the cursor stays; a chain that does not know it, or knows one
  more than a day later than the instance's clock, takes it from the answer to the
  page after its cursor).
* **Numbered anew.** A page after the cursor of ids of the other kind only (or one that
  brings nothing new, on one poll in ``RENUMBERING_CHECK_EVERY``) asks for the newest
  posts. When most are of that kind, or every one sorts at or before the cursor and
  most were made after it was read (``_made_after``, by more than
  ``MADE_AFTER_SLACK``), or every one is a number far below the cursor's
  (``_numbered_below``: other software numbering from where it started), the instance
  numbers its posts anew (other software, or installed again): the poll starts again
  as a first poll. The times tell what ids alone cannot (Pixelfed's numbers to
  Mastodon's, text to other text, small numbers anew, all a little below the cursor,
  as a newest post deleted leaves them), and never keep the ids from telling. When the
  cursor was read, not when its post was made: software that numbers posts by arrival
  (Pleroma's flake ids) may hold a late post as the cursor, made before posts that came
  ahead of it, and a remote author may date a post at any time (a post dated past the
  instance's clock says nothing; a snowflake's own date bounds its post's: Mastodon
  numbers a post dated ahead by its arrival).
* **A lookback on timelines of other instances' posts** (``public``, tags). Mastodon
  numbers a post from elsewhere by the time it was published, not by its arrival: one
  that arrives after a newer post was read lands behind the cursor. A poll of such a
  timeline first reads one page behind the cursor, the newest posts within
  ``lookback`` seconds (snowflake ids tell their time); the ids handled there
  (``recent``, at most ``MAX_RECENT_POSTS``, carried by the chain) are left alone, and a
  late post never moves the cursor back, and posts after the cursor there are the
  forward read's; a page there refused for its posts (below) or for its query (a 4xx
  other than 401, 403 and 429, an error object, robots.txt) is left unread.
  ``local`` holds only the instance's own posts, numbered as they are made: read from
  the cursor.

**Politeness.** Every request (NodeInfo, each page, each same-host redirect hop) is
asked of ``robots_allows`` and made inside ``gate(url)``, which the fetcher implements
with the host's lease: it waits for the host's gap, and raises ``GateDeferred`` when the
slot is too far away. The poll then ends with what it has: ``more``, ``retry_after``
until the slot, the cursor advanced over what was read. The gate also says how long the
request may take (what is left of the lease's hold), which bounds it with the total
timeout: a request never outlasts the hold that keeps other pods off the host.
``X-RateLimit-Remaining`` at or under ``max(1, 5 %)`` of ``X-RateLimit-Limit`` stops the
poll before the next request, with ``retry_after`` until ``X-RateLimit-Reset``; a 429 is
``blocked_4xx`` with ``retry_after`` from ``Retry-After`` (else the reset).

**What is kept.** Public posts only, and none of an account that opted out of search
or discovery (``indexable: false``, ``noindex: true``, ``discoverable: false``): those
are counted in ``skipped``, and of the account only its key (``account_key``) leaves
this module, in ``withdrawn``, so that its earlier shares are withdrawn. A kept post
gives a ``SharedPost`` whose links are the content's ``<a href>`` and the preview
card's URL, canonical, without mentions, hashtags, the instance's own pages, non-HTTP
links or private addresses (unless ``allowed_networks`` opens them).

**Outcomes.** A poll that fails before reading any page is a failure (``failed``,
``timeout``, ``blocked_4xx``, ``blocked_5xx``, ``blocked_robots``, ``rejected``) with no
posts and the cursor unchanged. One that fails after reading pages is a ``success``
that keeps what it read, with ``more`` and the reason in ``error_message`` (and the
status, ``retry_after`` and outcome, ``stopped_by``, of what stopped it): the next poll
continues from there, and the host is judged by that answer as after a failure. (A
refusal of the backfill's old pages that will not pass, or the ``BACK_FAILURES``-th
in a row of those that may, leaves no ``more`` for them: it ends the backfill.) So
a consumer takes the posts and ``cursor_after`` of every ``TimelinePolled``, and never
loses or repeats one. Hostile answers: HTML or other non-JSON, a redirect off the
instance (not followed), a body over ``max_body_bytes`` are ``rejected``; a bot
challenge (``trove_schema.heuristics.is_challenge``, whatever its status) is
``blocked_4xx`` and ``challenged``; malformed entries are skipped and counted (a page
of nothing else is ``rejected``); endless pagination ends at ``max_pages`` or at the
first repeated page. A page after the cursor refused for its posts would come back
every poll: one of nothing readable is passed over whole (its newest id, else its
Link's ``prev``), its entries counted malformed; one over ``max_body_bytes`` is asked
again with half as many posts, among the poll's ``max_pages`` (its last asks for one),
and a page of one still too large is passed over (its Link's ``prev``). Only errors of
the caller's own machinery (the gate, ``robots_allows``) leave ``poll``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence, Sized
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit

import httpx
import pydantic

from trove_fetcher.activitystreams import opted_out
from trove_fetcher.completion import event_budget
from trove_fetcher.errors import BlockedAddress, ContentError, GateDeferred, NetworkAway
from trove_fetcher.extract import ParseThreads, parse_fragment
from trove_fetcher.http import (
    ACCEPT_ENCODING,
    REDIRECT_STATUSES,
    BodyReader,
    FetchLimits,
    error_text,
    redirect_url,
    response_date,
    retry_after,
    same_site,
    site_now,
)
from trove_fetcher.nodeinfo import WELL_KNOWN_PATH, Software, document_link, software_of
from trove_schema.events import (
    MAX_RECENT_POSTS,
    MAX_URL_LENGTH,
    MAX_WITHDRAWN,
    CrawlOutcome,
    SharedPost,
    TimelinePolled,
    TimelinePollRequested,
    account_key,
    derived_event_id,
)
from trove_schema.heuristics import is_challenge
from trove_schema.media import media_type
from trove_schema.urls import canonicalize_or_none, is_private_host, origin_of, without_userinfo

log = logging.getLogger("trove.fetcher.timeline")

#: Awaited around each request to a URL: enters when the request may go (the host's
#: gap), with the longest the request may take from there (its lease's hold; None: no
#: bound but the poller's own timeout), exits when its response has been read; raises
#: ``GateDeferred`` instead of waiting long.
RequestGate = Callable[[str], AbstractAsyncContextManager[float | None]]

#: Most posts one ``TimelinePolled`` carries, and links one post (the event's bounds).
MAX_POSTS = 1000
MAX_LINKS_PER_POST = 100
#: What an account's key adds to the event: 32 hex digits, quoted, and a comma.
WITHDRAWN_KEY_SIZE = 35
#: The rate limit is nearly spent at this share of it left (or one request).
LOW_RATE_SHARE = 0.05
#: Seconds to wait when the rate limit is spent and the instance does not say until
#: when: Mastodon's window is five minutes.
DEFAULT_RATE_WINDOW = 300.0
#: Longest wait taken from an instance's headers: a year-long Retry-After is a typo.
MAX_RETRY_AFTER = 86_400.0
#: Pages of the backfill in a row the instance asked to wait for or failed to answer
#: (``_passing``), none of it read between, that end it: an instance that always does
#: so for its old pages would else have every poll spend a request on them, and its
#: host a pause, for good.
BACK_FAILURES = 3
ACCEPT_JSON = "application/json"
#: Characters of a post's HTML content searched for links: Mastodon counts a link as 23
#: of a post's 500 characters, so twenty links of 2,000 characters fit in one post.
MAX_CONTENT_CHARS = 256 * 1024
#: Links looked at per post before canonicalization (the rest are ignored).
_MAX_ANCHORS = 4 * MAX_LINKS_PER_POST
_MAX_ID_LENGTH = 200
_MAX_ACCT_LENGTH = 320
_MAX_MESSAGE = 2000
_LANGUAGE = re.compile(r"[A-Za-z]{2,8}(?:-[A-Za-z0-9]{1,8}){0,6}")
_LINK_ENTRY = re.compile(r"<([^<>]{1,4096})>([^<]*)")
_REL = re.compile(r"""(?:^|;)\s*rel\s*=\s*(?:"([^"]*)"|([^\s;,"]+))""", re.IGNORECASE)
_ENVELOPE = 2048  # JSON of the event around its posts (ids, cursors, message)


def utcnow() -> datetime:
    return datetime.now(UTC)


# --- ids and cursors ----------------------------------------------------------------


def id_key(post_id: str) -> tuple[int, int, str]:
    """Sort key of a post id: numerically when it is digits, else as a string."""
    if post_id.isascii() and post_id.isdigit():
        return (0, int(post_id), "")
    return (1, 0, post_id)


#: Mastodon's ids are the milliseconds since the epoch above 16 bits of sequence
#: (``Mastodon::Snowflake``): an id at least this large is one (a time past 2001).
_SNOWFLAKE_FLOOR = 1_000_000_000_000 << 16
#: Mastodon's ids are a 64-bit integer: at most this many digits.
_SNOWFLAKE_DIGITS = 19
#: The largest id a number may be: every server whose ids are numbers keeps them in a
#: signed 64-bit column. A larger one taken as the cursor would hide every later post.
_MAX_NUMERIC_ID = (1 << 63) - 1
#: Software whose ids are Mastodon's snowflakes (``Mastodon::Snowflake``), dated.
SNOWFLAKE_SOFTWARE = frozenset({"mastodon", "glitchsoc", "hometown", "fedibird", "kmyblue"})
#: An empty page after the cursor is a quiet timeline far more often than other
#: software on the instance, whose ids of the other kind may sort before the cursor's
#: (GoToSocial's ULIDs before Mastodon's numbers, as text): one poll in this many asks
#: for the newest posts then. A quiet follow pays a request more in as many polls; one
#: whose instance moved starts again at most as many polls late, within its backfill.
RENUMBERING_CHECK_EVERY = 24
#: One poll in this many asks NodeInfo for the software again (every other check's).
SOFTWARE_CHECK_EVERY = 2 * RENUMBERING_CHECK_EVERY
#: The fewest posts a server gives in a page when more follow, whatever it is asked
#: for: Mastodon, Pleroma, Akkoma, GoToSocial and Misskey's forks give 20 by default,
#: and some cap a page there. A page of fewer posts than asked is the timeline's end
#: only when it holds fewer than this too: one of 20 asked for 40 may be the server's
#: whole page, and taken for the end, a busy timeline fell behind by its excess each
#: poll, and a backfill ended at its first page.
FULL_PAGE_FLOOR = 20
#: How far past the instance's clock (``TimelinePoller._instance_time``) a snowflake's
#: time may be. Mastodon numbers a post by the time it is stored (a remote post's
#: claimed date only when that is past), on its database's clock, a second's random
#: at most ahead: told the instance's clock (its ``Date``), a minute covers its hosts'
#: clocks; not told, the pods' clock stands in and the instance's may be off by more.
#: An id dated later, taken as the cursor, would hide the posts made until its time.
FUTURE_ID_SLACK = 60.0
FUTURE_ID_SLACK_UNTOLD = 600.0
#: How much later than the cursor was read a post numbered before it must have been
#: made to count as made after it (``_made_after``), and how far past the instance's
#: clock a time may lie and still be believed: the ``Date`` of an answer and a post's
#: time come from different hosts of the instance (its proxy, its application), whose
#: clocks may be minutes apart. A new numbering is told a little later for it: its
#: posts made in the first minutes after the read do not count.
MADE_AFTER_SLACK = 600.0
#: How far ahead of the instance's clock a number of software not known (its NodeInfo
#: fails) must be dated, read as a snowflake, to be taken for another numbering rather
#: than Mastodon's on a fast clock: Pixelfed's read as centuries ahead, a clock is not
#: years off.
OTHER_NUMBERS_AHEAD = 10 * 365 * 86_400.0
#: How far from the pods' clock an instance's ``Date`` is believed, ahead or behind.
MAX_CLOCK_SKEW = 86_400.0
#: An id in ``recent_after`` on the wire, at most: its digits, quoted, a comma.
_RECENT_ID_BYTES = _SNOWFLAKE_DIGITS + 3


def lookback_floor(timeline: str, cursor: str | None, lookback: float) -> int | None:
    """The id a poll reads from, ``lookback`` seconds behind ``cursor``; None: the cursor.

    Mastodon gives a post from another instance the id of the time it was published,
    not of its arrival: one that arrives after a newer post was read lands behind the
    cursor, where reading on from the cursor never finds it. So timelines that carry
    other instances' posts (``public``, tags) are read again a little way back, where
    the ids tell their time (snowflakes); ``local`` only holds the instance's own.
    """
    if timeline == "local" or lookback <= 0 or cursor is None:
        return None
    number = _snowflake(cursor)
    if number is None:
        return None
    return max(0, (number >> 16) - int(lookback * 1000)) << 16


def _snowflake(post_id: str) -> int | None:
    """``post_id`` as a Mastodon snowflake (a 64-bit number dated past 2001), or None."""
    if not (post_id.isascii() and post_id.isdigit()) or len(post_id) > _SNOWFLAKE_DIGITS:
        return None
    number = int(post_id)
    return number if number >= _SNOWFLAKE_FLOOR else None


def _post_id(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        # JSON gives no int past Python's 4,300 digits
        return str(value) if 0 <= value <= _MAX_NUMERIC_ID else None
    if (
        isinstance(value, str)
        and 0 < len(value) <= _MAX_ID_LENGTH
        and value.isascii()
        and value.isprintable()
        and " " not in value
    ):
        if value.isdigit() and (len(value) > _SNOWFLAKE_DIGITS or int(value) > _MAX_NUMERIC_ID):
            return None
        return value
    return None


def _numbered_below(ids: list[str], cursor: str) -> bool:
    """Whether every one of ``ids`` is a number below ``cursor``'s by a change of scale
    (65,536 times): another software's small numbers after Mastodon's snowflakes. Not
    merely before it: the newest posts of a timeline whose newest post was deleted (by
    its author, a moderator, an account suspended) are all a little before the cursor."""
    if not ids or not (cursor.isascii() and cursor.isdigit()):
        return False
    bound = int(cursor) >> 16
    return all(i.isascii() and i.isdigit() and int(i) < bound for i in ids)


def _made_after(
    posts: Sequence[tuple[str, datetime | None]],
    cursor: str,
    cursor_at: datetime | None,
    now: datetime | None,
) -> bool:
    """Whether the newest ``posts`` (their ids, and when each says it was made) are an
    instance that numbers its posts anew: every one sorts at or before ``cursor``, and
    most were made more than ``MADE_AFTER_SLACK`` after the cursor was read
    (``cursor_at``). Ids alone cannot tell a change of numbering that stays below the
    cursor (Pixelfed's numbers to Mastodon's, text to other text, small numbers anew)
    from a newest post deleted, whose timeline's newest posts are all before the cursor
    too but were there when it was read. False when the times cannot tell: the
    instance's time (``now``) or the cursor's not known, or the cursor's later than
    ``now`` (a clock set back since). A post dated past ``now`` says nothing (a remote
    author's clock, or a hostile one), and one whose id is a snowflake dated before its
    time was made no later than its id says (Mastodon numbers a remote post dated ahead
    by its arrival). Only ever a reason to start again: the ids' own rules stand."""
    if cursor_at is None or now is None or not posts:
        return False
    latest = now.timestamp() + MADE_AFTER_SLACK
    after = _in_utc(cursor_at).timestamp() + MADE_AFTER_SLACK
    if after > latest:
        return False
    key = id_key(cursor)
    # The cursor's own post among them (or one after it): the instance numbers its
    # posts as it did.
    if any(post_id == cursor or id_key(post_id) > key for post_id, _ in posts):
        return False
    made_after = 0
    for post_id, made in posts:
        if made is None or made.timestamp() > latest:
            continue
        moment = made.timestamp()
        number = _snowflake(post_id)
        if number is not None and (number >> 16) / 1000 <= latest:
            moment = min(moment, (number >> 16) / 1000)
        made_after += moment > after
    return made_after * 2 > len(posts)


def _in_utc(moment: datetime) -> datetime:
    """``moment``, a time without a zone read as UTC's (an event's, hand-published)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def dated_after(post_id: str, moment: float) -> bool:
    """Whether ``post_id``, a Mastodon snowflake, is dated after ``moment`` (epoch
    seconds). Ids that are not snowflakes carry no date: never."""
    number = _snowflake(post_id)
    return number is not None and (number >> 16) > moment * 1000


# --- reading a status ---------------------------------------------------------------


def content_links(content: str) -> list[str]:
    """The hrefs of a post's HTML content, mentions and hashtags left out.

    Read with lxml (linear), as pages are: html.parser takes quadratic time on a post
    of unclosed tags ("<a <a <a ..."), minutes for one post."""
    fragment = content[:MAX_CONTENT_CHARS]
    root = parse_fragment(fragment)
    if root is None:
        return []
    hrefs: list[str] = []
    for anchor in root.iter("a"):
        href = anchor.get("href")
        if not href:
            continue
        classes = (anchor.get("class") or "").lower().split()
        rels = (anchor.get("rel") or "").lower().split()
        # Mastodon: "u-url mention", "mention hashtag" + rel=tag; Pleroma/Akkoma:
        # "hashtag"; GoToSocial: "mention", "mention hashtag".
        if "mention" in classes or "hashtag" in classes or "tag" in rels:
            continue
        hrefs.append(href)
        if len(hrefs) >= _MAX_ANCHORS:
            break
    return hrefs


def _entity_urls(value: Any) -> set[str]:
    """The ``url`` of each mention or tag object (never shared links, whatever the HTML)."""
    if not isinstance(value, list):
        return set()
    return {
        item["url"]
        for item in value[:200]
        if isinstance(item, dict) and isinstance(item.get("url"), str)
    }


def _http_url(value: Any) -> str | None:
    if not isinstance(value, str) or len(value) > MAX_URL_LENGTH:
        return None
    try:
        parts = urlsplit(value)
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    # A remote server's post may name itself with a user:pass@: no URL Trove keeps does.
    return without_userinfo(value)


def _created_at(value: Any) -> datetime | None:
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        # In UTC here: year 1 at +14:00 is before the first instant a datetime holds,
        # and would fail where the recorder writes it, losing the whole poll.
        return (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).astimezone(UTC)
    except (ValueError, OverflowError):
        return None


def _language(value: Any) -> str | None:
    if isinstance(value, str) and len(value) <= 35 and _LANGUAGE.fullmatch(value):
        return value
    return None


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of a timeline page: its id when readable, and what became of it."""

    id: str | None
    verdict: Literal["kept", "skipped", "malformed"]
    post: SharedPost | None = None
    #: A public post skipped because its account opted out: the account's key.
    withdrawn: str | None = None


def read_entry(
    entry: Any,
    *,
    host: str,
    allowed_networks: Sequence[str] = (),
    nat64_prefixes: Sequence[str] = (),
) -> Entry:
    """What to make of one timeline entry (``host``: the instance's host name).

    ``malformed`` when it is not a status Trove can read (no id, no account object, no
    ``uri``), ``skipped`` when it is not public or its account opted out, else ``kept``
    with its ``SharedPost``. Never raises.
    """
    try:
        return _read_entry(entry, host, allowed_networks, nat64_prefixes)
    except Exception:
        # A case nobody foresaw: this entry is lost, not the page or the cursor.
        log.exception("unreadable timeline entry on %s", host)
        post_id = _post_id(entry.get("id")) if isinstance(entry, dict) else None
        return Entry(post_id, "malformed")


def _read_entry(
    entry: Any, host: str, allowed_networks: Sequence[str], nat64_prefixes: Sequence[str]
) -> Entry:
    if not isinstance(entry, dict):
        return Entry(None, "malformed")
    post_id = _post_id(entry.get("id"))
    account = entry.get("account")
    uri = _http_url(entry.get("uri"))
    acct = account.get("acct") if isinstance(account, dict) else None
    if (
        post_id is None
        or not isinstance(account, dict)
        or uri is None
        or not isinstance(acct, str)
        or not 0 < len(acct) <= _MAX_ACCT_LENGTH
        or any(c.isspace() for c in acct)
    ):
        return Entry(post_id, "malformed")
    if entry.get("visibility") != "public" or entry.get("reblog") is not None:
        return Entry(post_id, "skipped")
    absolute = acct if "@" in acct else f"{acct}@{host}"
    if opted_out(account):
        return Entry(post_id, "skipped", withdrawn=account_key(absolute))
    try:
        post = SharedPost(
            uri=uri,
            url=_http_url(entry.get("url")),
            account=absolute,
            shared_at=_created_at(entry.get("created_at")),
            language=_language(entry.get("language")),
            links=shared_links(
                entry,
                host=host,
                allowed_networks=allowed_networks,
                nat64_prefixes=nat64_prefixes,
            ),
        )
    except pydantic.ValidationError:
        return Entry(post_id, "malformed")
    return Entry(post_id, "kept", post)


def shared_links(
    entry: dict[str, Any],
    *,
    host: str,
    allowed_networks: Sequence[str] = (),
    nat64_prefixes: Sequence[str] = (),
) -> tuple[str, ...]:
    """The canonical URLs a status shares: its content's links, then its card's URL.

    Never mentions, hashtags, the instance's own pages (``host``), non-HTTP links, or
    literal private addresses unless ``allowed_networks`` covers them (an address in
    one of ``nat64_prefixes`` judged by the IPv4 address in it, as discovery and the
    transport judge it).
    """
    content = entry.get("content")
    hrefs = content_links(content) if isinstance(content, str) else []
    card = entry.get("card")
    if isinstance(card, dict) and isinstance(card.get("url"), str):
        hrefs.append(card["url"])
    entities = _entity_urls(entry.get("mentions")) | _entity_urls(entry.get("tags"))
    home = host.lower().rstrip(".")
    found: dict[str, None] = {}
    for href in hrefs:
        if href in entities or len(href) > 4 * MAX_URL_LENGTH:
            continue
        url = canonicalize_or_none(href)
        if url is None:
            continue
        target = (urlsplit(url).hostname or "").rstrip(".")
        if (
            not target
            or target == home
            or is_private_host(target, allowed_networks, nat64_prefixes)
        ):
            continue
        found[url] = None
        if len(found) >= MAX_LINKS_PER_POST:
            break
    return tuple(found)


# --- HTTP ---------------------------------------------------------------------------


def _seconds_until(value: str | None, now: datetime) -> float | None:
    """Seconds until ``X-RateLimit-Reset``: an ISO date (Mastodon), an HTTP date, or
    epoch seconds; a small number is taken as seconds from now."""
    if value is None or len(value) > 64:
        return None
    value = value.strip()
    seconds: float | None = None
    if re.fullmatch(r"\d{1,12}(\.\d{1,6})?", value):
        number = float(value)
        seconds = number - now.timestamp() if number > 1e9 else number
    else:
        try:
            when = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            try:
                when = parsedate_to_datetime(value)
            except (TypeError, ValueError, IndexError, OverflowError):  # a year past 9999
                return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - now).total_seconds()
    return min(max(0.0, seconds), MAX_RETRY_AFTER)


def _header_ints(headers: httpx.Headers, name: str) -> list[int | None]:
    """The header's numbers, one a value: sent twice (an app's and its proxy's), or
    folded into one line by a proxy, ``headers.get`` would join them with a comma and
    read them as none. A value that is no number is None, keeping the others' places."""
    return [
        int(value) if value and len(value) <= 18 and re.fullmatch(r"-?\d+", value) else None
        for value in (raw.strip() for raw in headers.get_list(name, split_commas=True))
    ]


def _reset_waits(headers: httpx.Headers, now: datetime) -> list[float | None]:
    """Seconds until each rate limit's reset, on the instance's clock when it says the
    time (the reset is a time on that clock). Not split at commas: an HTTP date has one."""
    moment = site_now(headers, now)
    return [_seconds_until(value, moment) for value in headers.get_list("x-ratelimit-reset")]


def _reset_wait(headers: httpx.Headers, now: datetime) -> float | None:
    """The latest reset the answer names."""
    return max((wait for wait in _reset_waits(headers, now) if wait is not None), default=None)


def rate_limit_wait(headers: httpx.Headers, *, now: datetime | None = None) -> float | None:
    """Seconds to leave the API alone when its rate limit is (nearly) spent, else None.

    Limits sent twice (an app's and its proxy's) are read as pairs when their counts
    match: either pair nearly spent is the limit spent, until that pair's reset. Two
    healthy limits are no spent one (the fewest left against the largest limit read an
    app's 100 of 300 beside a proxy's 5,000 of 10,000 as spent, for the proxy's hour)."""
    remaining = _header_ints(headers, "x-ratelimit-remaining")
    if not any(left is not None for left in remaining):
        return None
    limits = _header_ints(headers, "x-ratelimit-limit")
    known = [limit for limit in limits if limit is not None and limit > 0]
    paired = len(limits) == len(remaining)
    spent = [
        n
        for n, left in enumerate(remaining)
        if left is not None
        and left <= _floor(limits[n] if paired else (min(known) if known else None))
    ]
    if not spent:
        return None
    waits = _reset_waits(headers, now or utcnow())
    if len(waits) == len(remaining):
        waits = [waits[n] for n in spent]
    reset = max((wait for wait in waits if wait is not None), default=None)
    # A reset that reads as now or past (a "0", an instance whose clock runs slow) says
    # no more than none: the limit is spent, and a wait of 0 brought the poll back at
    # once, its one request spent again, for as long as the instance said so.
    return DEFAULT_RATE_WINDOW if reset is None or reset <= 0 else reset


def _floor(limit: int | None) -> int:
    """The requests left at which a limit of ``limit`` counts as spent."""
    return max(1, int(limit * LOW_RATE_SHARE)) if limit and limit > 0 else 1


def retry_after_of(headers: httpx.Headers, *, now: datetime | None = None) -> float | None:
    """Seconds a 429 or 503 asks for: ``Retry-After``, else the rate limit's reset. A
    ``Retry-After: 0`` asks for nothing (a proxy's default), and does not hide a reset."""
    moment = now or utcnow()
    wait = retry_after(headers, now=moment)
    if wait is None or wait <= 0:
        reset = _reset_wait(headers, moment)
        wait = reset if reset is not None else wait
    return None if wait is None else min(max(0.0, wait), MAX_RETRY_AFTER)


def link_relation(headers: httpx.Headers, rel: str, current: str) -> str | None:
    """The URL of ``rel`` in the Link header, when it stays on ``current``'s timeline
    (same scheme, host, port, path and choice of posts); None otherwise."""
    value = headers.get("link", "")[:16_384]
    for match in _LINK_ENTRY.finditer(value):
        params = _REL.search(match.group(2))
        if params is None:
            continue
        rels = (params.group(1) or params.group(2) or "").lower().split()
        if rel not in rels:
            continue
        try:
            target = without_userinfo(urljoin(current, match.group(1).strip()))
            here, there = urlsplit(current), urlsplit(target)
            same = (
                there.scheme == here.scheme
                and there.hostname == here.hostname
                and there.port == here.port
                and there.path == here.path
                and _selection(there.query) == _selection(here.query)
            )
        except ValueError:
            return None
        return target if same and len(target) <= MAX_URL_LENGTH else None
    return None


#: A timeline's paging parameters: everything else in its query chooses the posts.
_PAGING = frozenset({"min_id", "max_id", "since_id", "limit"})
_UNCHOSEN = frozenset({"", "false", "0"})


def _selection(query: str) -> list[tuple[str, str]]:
    """What a timeline URL's query chooses (``local``, ``only_media``...): a Link that
    changes it (GoToSocial 0.12 dropped ``local``) would read another timeline. A choice
    spelt out as its default (``local=false``, which GoToSocial and Pleroma write) is
    the same as none."""
    return sorted(
        (k, v)
        for k, v in parse_qsl(query, keep_blank_values=True)
        if k not in _PAGING and v.strip().lower() not in _UNCHOSEN
    )


def timeline_url(
    api: str,
    timeline: str,
    *,
    limit: int,
    min_id: str | None = None,
    since_id: str | None = None,
    max_id: str | None = None,
) -> str:
    """The first page's URL of ``timeline`` (``local``, ``public``, ``tag:NAME``)."""
    params: list[tuple[str, str]] = []
    if timeline.startswith("tag:"):
        path = f"/api/v1/timelines/tag/{timeline[4:]}"
    else:
        path = "/api/v1/timelines/public"
        if timeline == "local":
            params.append(("local", "true"))
    params.append(("limit", str(limit)))
    for name, value in (("min_id", min_id), ("since_id", since_id), ("max_id", max_id)):
        if value is not None:
            params.append((name, value))
    return f"{api.rstrip('/')}{path}?{urlencode(params)}"


class _Stop(Exception):
    """The poll cannot go on: how it ended."""

    def __init__(
        self,
        outcome: CrawlOutcome,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        challenge: bool = False,
        for_its_posts: bool = False,
        unreachable: bool = False,
        answer: _Answer | None = None,
    ) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.message = message
        self.status = status
        self.retry_after = retry_after
        #: The answer was a bot challenge (``is_challenge``), whatever its status.
        self.challenge = challenge
        #: The page was refused for the posts it holds (too large, none readable): a
        #: page of fewer of them may be read.
        self.for_its_posts = for_its_posts
        #: No connection was made, or one was lost: the instance's reach, not its answer.
        self.unreachable = unreachable
        #: The answer refused, when its headers came: its rate limit is read, and its
        #: Link leads past it.
        self.answer = answer


def _backfill_left(request: TimelinePollRequested) -> tuple[str | None, int]:
    """The backfill ``request`` leaves to be read back: below which post, how many."""
    if request.cursor is None or request.back_from is None or request.back_left <= 0:
        return None, 0
    return request.back_from, request.back_left


def _asked_to_wait(stop: _Stop) -> bool:
    """Whether ``stop`` is the instance asking for time (a 429, a ``Retry-After``): not
    now, rather than not this. A bot challenge is no wait, whatever its status."""
    return (stop.status == 429 or stop.retry_after is not None) and not stop.challenge


def _passing(stop: _Stop) -> bool:
    """Whether ``stop`` may be gone at the next poll: a wait the instance asked for, or
    its failure to answer (a 5xx, a timeout, a connection refused or lost). Not a bot
    challenge, nor what no answer mends (a redirect loop, a blocked address)."""
    failed = stop.outcome in (CrawlOutcome.TIMEOUT, CrawlOutcome.BLOCKED_5XX) or stop.unreachable
    return _asked_to_wait(stop) or (failed and not stop.challenge)


def _last_page(entries: Sized, limit: int) -> bool:
    """Whether a page of ``entries``, asked for ``limit`` posts, is the last there is:
    fewer than asked, and fewer than a server's own page may hold (``FULL_PAGE_FLOOR``).
    """
    return len(entries) < min(limit, FULL_PAGE_FLOOR)


def _of_the_host(stop: _Stop) -> bool:
    """Whether ``stop`` tells of the host (its load, its defences, its reach) rather
    than of the request that met it: what every request to the host would meet now."""
    return (
        stop.challenge
        or stop.retry_after is not None
        or stop.status in (401, 403, 429)
        or stop.outcome in (CrawlOutcome.FAILED, CrawlOutcome.TIMEOUT, CrawlOutcome.BLOCKED_5XX)
    )


class _MachineryFailed(Exception):
    """The gate or ``robots_allows`` failed for its own reasons: passed to the caller."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass(slots=True)
class _Answer:
    url: str
    status: int
    headers: httpx.Headers
    data: Any = None
    #: Bytes of its body: what reading its posts counts towards renewing the parse threads.
    size: int = 0


@dataclass(slots=True)
class _Progress:
    """What the poll has found so far: kept posts, counts, and where the cursor stands."""

    cursor: str | None
    budget: int
    #: When the cursor was read, on the instance's clock (``TimelinePollRequested.cursor_at``).
    cursor_at: datetime | None = None
    #: Read again behind the cursor down to this id (``lookback_floor``), leaving alone
    #: the ``recent`` ids handled there before.
    floor: int | None = None
    recent: frozenset[str] = frozenset()
    #: The newest and the oldest id on the last page read (of the timeline's kind).
    page_top: str | None = None
    page_bottom: str | None = None
    api: str | None = None
    software: str | None = None
    version: str | None = None
    newest: str | None = None
    #: When ``newest`` was read, on the instance's clock.
    newest_at: datetime | None = None
    posts: list[SharedPost] = field(default_factory=list)
    size: int = 0
    skipped: int = 0
    #: Keys of the accounts whose public posts were skipped because they opted out.
    withdrawn: dict[str, None] = field(default_factory=dict)
    malformed: int = 0
    requests: int = 0
    pages: int = 0
    seen: set[str] = field(default_factory=set)
    retry_after: float | None = None
    rate_spent: bool = False
    full: bool = False
    more: bool = False
    #: What the poll's message tells besides how it ended, in the order first told: a
    #: note of a ``kind`` told again takes the place of the one before.
    notes: dict[str, str] = field(default_factory=dict)
    #: The last page's ids were all of the other kind than the timeline's.
    other_kind: bool = False
    #: The cursor started again at the instance's newest posts (``rebase``).
    rebased: bool = False
    #: The oldest id of the last page, when all its ids were dated ahead (``_trusted``).
    ahead_bottom: str | None = None
    #: This poll asked NodeInfo for the software (``software`` is the instance's now).
    software_asked: bool = False
    #: The backfill still to read back: the oldest post read back so far, and how many
    #: posts below it (``TimelinePollRequested.back_from``); None and 0 once done.
    back_from: str | None = None
    back_left: int = 0
    #: The backfill's pages refused in a row (``_passing``), none of it read since.
    back_failures: int = 0
    #: Reading the backfill on back (``_read_on_back``): only posts below ``back_from``
    #: are new.
    reading_back: bool = False
    #: A refusal cut the backfill's reading short: the rest is left unread.
    back_cut: bool = False

    def tell(self, note: str, *, kind: str | None = None) -> None:
        self.notes[kind or note] = note

    def read_back_below(self, mark: str | None) -> bool:
        """Whether any of the backfill was read back below ``mark`` (where the back
        read stood before): ``back_from`` only moves down, and only as it reads. Once
        the backfill is done or ended (``back_from`` None), no read is left to count."""
        return (
            mark is not None
            and self.back_from is not None
            and id_key(self.back_from) < id_key(mark)
        )

    def wait(self, seconds: float | None) -> None:
        if seconds is not None:
            seconds = min(max(0.0, seconds), MAX_RETRY_AFTER)
            self.retry_after = (
                seconds if self.retry_after is None else max(self.retry_after, seconds)
            )

    def knows_its_cursor_by(self, moment: datetime | None) -> None:
        """The cursor was this chain's at ``moment`` (the page after it came then): a
        time to tell a new numbering by, for a chain that did not know when it was read
        (one from a release before, an answer without a believed ``Date``), or knew one
        later than the instance's clock can have been (more than ``MAX_CLOCK_SKEW``
        past ``moment``: a time no believed ``Date`` gives), which would tell nothing
        for years. Not one merely later than ``moment``: an instance whose clock ran
        hours fast at the read, set right since, dated its posts before the read on
        that clock too, and put back the read would count them as made after it."""
        if moment is None:
            return
        if self.cursor_at is None or _in_utc(self.cursor_at) > moment + timedelta(
            seconds=MAX_CLOCK_SKEW
        ):
            self.cursor_at = moment

    def advance(self, post_id: str, read_at: datetime | None) -> None:
        """``post_id`` handled, read at ``read_at``: the newest, if it is."""
        if self.newest is None or id_key(post_id) > id_key(self.newest):
            self.newest, self.newest_at = post_id, read_at

    def of_the_timelines_kind(self, entries: list[Entry]) -> list[Entry]:
        """The entries whose ids are of the timeline's kind (digits, or text), the rest
        counted malformed. No order holds between the two kinds, and an id of the other
        taken as the cursor would hide every later post for good. The kind is the
        cursor's, else the one most of the first page's ids have."""
        self.other_kind = False
        if not entries:
            return entries
        known = self.cursor or self.newest
        if known is not None:
            kind = id_key(known)[0]
        else:
            kinds = [id_key(entry.id or "")[0] for entry in entries]
            kind = max(set(kinds), key=kinds.count)
        same = [entry for entry in entries if id_key(entry.id or "")[0] == kind]
        self.malformed += len(entries) - len(same)
        self.other_kind = not same
        return same

    def rebase(self) -> None:
        """Read on as a first poll does, from the newest posts: the instance numbers its
        posts anew (it runs other software, or was installed again), and a cursor of the
        old numbering finds nothing of the new, for good."""
        self.cursor = self.cursor_at = None
        self.floor = None
        self.recent = frozenset()
        self.newest = self.newest_at = None
        self.seen.clear()
        self.page_top = self.page_bottom = None
        self.pages = 0
        self.rebased = True
        self.backfilled()
        if not self.software_asked:
            # Other software than the chain knew: the next poll asks NodeInfo again
            # (its ids' rules go with it).
            self.software = self.version = self.api = None

    def is_new(self, post_id: str) -> bool:
        if post_id in self.seen or post_id in self.recent:
            return False
        if self.cursor is None:
            return True
        key = id_key(post_id)
        if self.back_from is not None and key < id_key(self.back_from):
            # The backfill's, and the back read's alone: one the lookback took would be
            # met again there, past what ``recent`` keeps of it.
            return self.reading_back
        if self.reading_back:
            return False  # an answer to "older than" that is not
        if key > id_key(self.cursor):
            return True
        return self.floor is not None and key[0] == 0 and key[1] > self.floor

    def backfilled(self) -> None:
        """The backfill is read: nothing more to read back."""
        self.back_from, self.back_left, self.back_failures = None, 0, 0

    def withdraw(self, key: str) -> None:
        """Say that the account of ``key`` opted out, if the event has room for it (a key
        left out is said again at the account's next post a poll skips)."""
        if key in self.withdrawn or len(self.withdrawn) >= MAX_WITHDRAWN:
            return
        if self.size + WITHDRAWN_KEY_SIZE > self.budget:
            return
        self.withdrawn[key] = None
        self.size += WITHDRAWN_KEY_SIZE

    def add(self, post: SharedPost) -> bool:
        """Keep ``post`` if the event has room for it; False (and ``full``) when not.

        A post too big for an event of its own keeps the links that fit: left for the
        next poll, it would come first again, never fit, and the poll would end with
        nothing read and more to read, at once, for good."""
        size = _size(post)
        if not self.posts and size > self.budget and post.links:
            post = _trimmed(post, self.budget)
            size = _size(post)
            self.tell("a post's links cut to fit the event")
        if len(self.posts) >= MAX_POSTS or self.size + size > self.budget:
            self.full = True
            return False
        self.posts.append(post)
        self.size += size
        return True


def _size(post: SharedPost) -> int:
    """What ``post`` takes of a poll's budget: its JSON, and for each link after the
    first the post's uri, URL and account again, as the recorder projects them (a row of
    ``page_shares`` a link). Counted once, a poll of 1 MiB whose posts had ids of 2,000
    characters and 100 links each was 65 MB of rows, and of a statement's parameters,
    past the recorder's memory and a Postgres backend's."""
    links = len(post.links)
    return len(post.__pydantic_serializer__.to_json(post)) + 1 + max(links - 1, 0) * _row(post)


def _row(post: SharedPost) -> int:
    """The bytes each of ``post``'s links repeats of it where it is projected."""
    return len(post.uri.encode()) + len((post.url or "").encode()) + len(post.account.encode())


def _trimmed(post: SharedPost, budget: int) -> SharedPost:
    """``post`` with as many of its links, in order, as an event of ``budget`` holds."""
    room = budget - _size(post.model_copy(update={"links": ()}))
    kept: list[str] = []
    for link in post.links:
        room -= len(json.dumps(link)) + 1 + (_row(post) if kept else 0)
        if room < 0:
            break
        kept.append(link)
    return post.model_copy(update={"links": tuple(kept)})


# --- the poller ---------------------------------------------------------------------


class TimelinePoller:
    """Answers each ``TimelinePollRequested`` with one ``TimelinePolled`` (see the module).

    ``backfill`` bounds the posts the first poll reads back when the request does not
    say (default: ``max_pages`` times ``page_limit``); ``allowed_networks``
    (``TROVE_ALLOWED_NETWORKS``) opens private addresses in shared links, and an
    address in one of ``nat64_prefixes`` (``TROVE_NAT64_PREFIXES``) is judged by the
    IPv4 address in it; the event fits
    a stream message of ``max_message_bytes`` (``TROVE_MAX_MESSAGE_BYTES``). ``now`` is
    the clock a wait given as a date (``Retry-After``, ``X-RateLimit-Reset``) is read on:
    the fetcher's is the pods' shared one (``trove_fetcher.clock``), so the wait is as
    long as the instance asked however far this pod's own clock is. A page's posts are
    read in ``parser``'s threads (the fetcher's, renewed as for its pages; else the
    poller's own).
    """

    def __init__(
        self,
        *,
        client: httpx.AsyncClient,
        gate: RequestGate,
        limits: FetchLimits,
        max_pages: int = 5,
        page_limit: int = 40,
        robots_allows: Callable[[str], Awaitable[bool]],
        backfill: int | None = None,
        allowed_networks: Sequence[str] = (),
        nat64_prefixes: Sequence[str] = (),
        max_message_bytes: int = 1 << 20,
        lookback: float = 600.0,
        now: Callable[[], float] = time.time,
        parser: ParseThreads | None = None,
        told: Callable[[float], None] | None = None,
    ) -> None:
        if max_pages < 1 or not 1 <= page_limit <= 40:
            raise ValueError("max_pages must be >= 1 and page_limit within 1..40")
        self._client = client
        self._gate = gate
        self._limits = limits
        self._max_pages = max_pages
        self._page_limit = page_limit
        self._robots_allows = robots_allows
        self._backfill = max_pages * page_limit if backfill is None else max(0, backfill)
        self._networks = tuple(allowed_networks)
        self._nat64 = tuple(nat64_prefixes)
        # The posts' room, less the envelope and the lookback's ids.
        self._budget = max(
            1024, event_budget(max_message_bytes) - _ENVELOPE - MAX_RECENT_POSTS * _RECENT_ID_BYTES
        )
        self._lookback = lookback
        self._now = now
        self._parser = parser if parser is not None else ParseThreads(1)
        #: Told, inside the gate, of a wait an answer asks of every request to its host
        #: (seconds): the fetcher keeps it in the host's record with the request's
        #: lease, not only with the poll's end, which may come seconds later.
        self._told = told

    async def poll(self, request: TimelinePollRequested) -> TimelinePolled:
        """Read the timeline from the request's cursor on. Never raises for what the
        instance sends; the gate's and ``robots_allows``' own errors pass through."""
        started = utcnow()
        floor = lookback_floor(request.timeline, request.cursor, self._lookback)
        recent = [i for i in request.recent if i.isascii() and i.isdigit()]
        if floor is not None and len(recent) >= MAX_RECENT_POSTS:
            # A window busier than the ids kept of it: read back only as far as they go.
            floor = max(floor, min(int(i) for i in recent))
        progress = _Progress(
            cursor=request.cursor,
            cursor_at=request.cursor_at if request.cursor is not None else None,
            floor=floor,
            recent=frozenset(recent),
            budget=self._budget,
            software=request.software,
            version=request.software_version,
        )
        progress.back_from, progress.back_left = _backfill_left(request)
        if progress.back_from is not None:
            progress.back_failures = request.back_failures
        stop: _Stop | None = None
        try:
            await self._poll(request, progress)
        except GateDeferred as deferred:
            progress.more = True
            progress.wait(deferred.wait)
        except _Stop as stopped:
            stop = stopped
        except _MachineryFailed as failed:
            # With what it carries (a hop gate's broker trouble): the caller judges it.
            raise failed.cause from failed.cause.__cause__
        except Exception as exc:
            log.exception("timeline poll of %s failed unexpectedly", request.instance)
            stop = _Stop(CrawlOutcome.FAILED, f"unexpected error: {error_text(exc)}")
        return self._event(request, progress, stop, started)

    # the poll ----------------------------------------------------------------------

    async def _poll(self, request: TimelinePollRequested, progress: _Progress) -> None:
        origin = origin_of(request.instance)
        api = request.api
        if api is not None and urlsplit(api).hostname != urlsplit(origin).hostname:
            api = None  # an API elsewhere would be requests outside the host's lease
        check = request.poll % RENUMBERING_CHECK_EVERY == 0
        # Its API answered before: the chain read it (a cursor), or found it.
        answered = api is not None or request.cursor is not None
        if api is None or request.poll % SOFTWARE_CHECK_EVERY == 0:
            # Asked again now and then: an instance followed for months may run other
            # software now, whose ids the rules of the old one would not read (Pixelfed's
            # numbers look like Mastodon's dated centuries ahead). Not on every check's
            # poll: on a host that allows a poll two requests, NodeInfo's would leave
            # none for the renumbering check, every time.
            software = await self._software(origin, progress, known_api=answered)
            if software is not None:
                progress.software, progress.version = software.name, software.version
                # Software said not to speak the API is not asked for it, unless it has
                # answered (a plugin, a bridge, software that learned it): read on.
                if not software.speaks_mastodon_api and not answered:
                    raise _Stop(
                        CrawlOutcome.REJECTED,
                        f"{software.name} does not speak the Mastodon client API",
                    )
            api = origin
        progress.api = api
        if progress.rate_spent:
            progress.more = True
            return
        host = urlsplit(origin).hostname or request.domain
        if request.cursor is None:
            backfill = self._backfill if request.backfill is None else request.backfill
            await self._read_back(api, request.timeline, host, progress, backfill)
        else:
            backfill = self._backfill if request.backfill is None else request.backfill
            asked = progress.requests
            await self._read_forward(
                api,
                request.timeline,
                request.cursor,
                host,
                progress,
                backfill,
                check_renumbering=check,
            )
            # What the first poll left of the backfill, once the new posts are read, in
            # the requests left: one at least, or a timeline whose lookback and new
            # posts take a poll's pages would never read it.
            pages = max(1, self._max_pages - (progress.requests - asked))
            caught_up = not (progress.more or progress.rebased or progress.rate_spent)
            if progress.back_from is not None and caught_up:
                await self._read_on_back(api, request.timeline, host, progress, pages)

    async def _software(
        self, origin: str, progress: _Progress, *, known_api: bool
    ) -> Software | None:
        """The software NodeInfo names now (``_discover``). Asked again of an instance
        whose API the chain knows, an index unavailable leaves the software as it was:
        the API may answer, and is read. A wait it asked for, or a challenge, ends the
        poll all the same."""
        try:
            software = await self._discover(origin, progress)
        except _Stop as stop:
            if not known_api or _asked_to_wait(stop) or stop.challenge:
                raise
            return None
        progress.software_asked = True
        return software

    async def _discover(self, origin: str, progress: _Progress) -> Software | None:
        """The software NodeInfo names; None when the instance gives no usable NodeInfo.

        A 429 or a bot challenge, or an index that is unreachable, times out or answers
        5xx, ends the poll; anything else (404, HTML, garbage, a link elsewhere, a
        document that fails) leaves the software unknown: a document that always fails
        would else keep a working API from ever being read.
        """
        link: str | None = None
        try:
            index = await self._get_json(origin + WELL_KNOWN_PATH, progress)
            link = document_link(index.data, origin)
            if link is None:
                return None
            document = await self._get_json(link, progress)
        except _Stop as stop:
            unavailable = link is None and stop.outcome in (
                CrawlOutcome.FAILED,
                CrawlOutcome.TIMEOUT,
                CrawlOutcome.BLOCKED_5XX,
            )
            # A wait the instance asked for (a 429, a 503 with Retry-After) is kept.
            if unavailable or _asked_to_wait(stop) or stop.challenge:
                raise
            return None
        return software_of(document.data)

    async def _read_forward(
        self,
        api: str,
        timeline: str,
        cursor: str,
        host: str,
        progress: _Progress,
        backfill: int,
        *,
        check_renumbering: bool,
    ) -> None:
        """From ``cursor`` on, page after page. ``check_renumbering``: a page after the
        cursor with nothing new asks whether the instance numbers its posts anew
        (``_renumbered``)."""
        limit = self._page_limit
        if progress.floor is not None:
            try:
                await self._look_back(api, timeline, cursor, host, progress)
            except _Stop as stop:
                if not stop.for_its_posts and _of_the_host(stop):
                    raise
                # The lookback is an extra: a page refused for its posts would be the same
                # every poll until the cursor moves on, which reading on does, and a
                # query the instance will not answer (a 422, an error object, a path
                # robots.txt keeps out) must not keep the new posts from being read.
                progress.tell(f"the page behind the cursor left unread: {stop.message}")
            if progress.full or progress.rate_spent:
                progress.more = True
                return
            progress.page_top = None
        url = timeline_url(api, timeline, limit=limit, min_id=cursor)
        requested: set[str] = set()
        for page in range(self._max_pages):
            requested.add(url)
            answer: _Answer | None = None
            entries: list[Any] = []
            try:
                answer = await self._get_json(url, progress)
                if page == 0:
                    progress.knows_its_cursor_by(self._read_at(answer))
                entries = self._entries(answer)
                new = await self._take(answer, entries, host, progress, oldest_first=True)
            except _Stop as stop:
                # Asked again, the same page comes back every poll: fewer posts a page get
                # past the ones that cannot be read, down to one, which is passed over.
                if not stop.for_its_posts:
                    raise
                after = cursor
                if progress.newest is not None and id_key(progress.newest) > id_key(cursor):
                    after = progress.newest
                if entries:
                    # Read, and none of them readable: the whole page is passed over.
                    passed = self._passed_over(answer, entries, after, progress, newest=True)
                    if passed is None:
                        raise
                    progress.malformed += len(entries)
                    progress.seen.add(passed)
                    progress.advance(passed, self._read_at(answer))
                    progress.tell(f"a page that cannot be read passed over ({stop.message})")
                    limit, after = self._page_limit, passed
                elif limit > 1:
                    if page + 1 == self._max_pages:
                        raise
                    # The poll's last page asks for one: however few its pages, it gets past.
                    limit = 1 if page + 2 == self._max_pages else limit // 2
                    progress.tell(
                        f"asked again with fewer posts a page, down to {limit}", kind="fewer"
                    )
                else:
                    passed = self._passed_over(stop.answer or answer, entries, after, progress)
                    if passed is None:
                        raise
                    progress.malformed += 1
                    progress.seen.add(passed)
                    progress.advance(passed, self._read_at(stop.answer or answer))
                    progress.tell(f"a post that cannot be read passed over ({stop.message})")
                    limit, after = self._page_limit, passed
                url = timeline_url(api, timeline, limit=limit, min_id=after)
                continue
            if page == 0 and (progress.other_kind or (new == 0 and check_renumbering)):
                newest = await self._renumbered(api, timeline, cursor, progress, backfill)
                if newest is not None:
                    progress.rebase()
                    await self._read_back(api, timeline, host, progress, backfill, first=newest)
                    return
            if progress.full:
                progress.more = True
                return
            if _last_page(entries, limit):
                return  # caught up
            if new == 0:
                if progress.ahead_bottom is not None:
                    # The oldest after the cursor: every post past them is further ahead.
                    progress.tell("a page of posts dated ahead, left for their time")
                else:
                    progress.tell("the instance served a page of posts already read")
                return
            if progress.rate_spent:
                progress.more = True
                return
            if progress.page_top is None:
                progress.more = True
                return
            # The page right after this page's newest post, asked as this one was. Not the
            # Link's ``prev``: one that reads on from elsewhere (``since_id``, which gives
            # the newest posts, or a ``min_id`` past the page) skips the posts between,
            # for good once the cursor passes them.
            following = timeline_url(api, timeline, limit=limit, min_id=progress.page_top)
            if following in requested:
                progress.tell("the instance's pagination repeated a page")
                return
            url = following
        progress.more = True

    async def _renumbered(
        self, api: str, timeline: str, cursor: str, progress: _Progress, backfill: int
    ) -> tuple[_Answer, int] | None:
        """The instance's newest page and the posts it was asked with, when most of its
        ids are of the other kind than ``cursor``, or every one sorts at or before it and
        most were made after the cursor was read (``_made_after``), or every one is a
        number far below it (``_numbered_below``: other software numbering from where it
        started), handed to ``_read_back`` as its first
        page; None when none of these, or the page is refused for what was asked. Told
        by the posts, not by the software NodeInfo names, so a check cut short before it
        could act finds the same at the next. A page after the cursor of nothing else
        may be one odd page, which starting again from the newest posts would skip the
        posts behind it for: a few posts at least are asked for, to judge by."""
        limit = max(self._back_limit(timeline, backfill), min(self._page_limit, 8))
        try:
            answer = await self._get_json(timeline_url(api, timeline, limit=limit), progress)
        except _Stop as stop:
            if _of_the_host(stop):
                raise
            return None  # the page after the cursor was read: the poll goes on from it
        if not isinstance(answer.data, list):
            return None
        posts = [
            (post_id, _created_at(entry.get("created_at")))
            for entry in answer.data
            if isinstance(entry, dict)
            and (post_id := _post_id(entry.get("id"))) is not None
            and self._trusted(post_id, progress, answer)
        ]
        ids = [post_id for post_id, _ in posts]
        other = sum(1 for post_id in ids if id_key(post_id)[0] != id_key(cursor)[0])
        if other * 2 > len(ids):
            kind = "in another kind of id"
        elif _made_after(posts, cursor, progress.cursor_at, self._read_at(answer)):
            kind = "anew, made after the cursor was read but numbered before it,"
        elif _numbered_below(ids, cursor):
            kind = "anew, every one numbered far below the cursor,"
        else:
            return None
        progress.tell(
            f"the instance numbers its posts {kind} now: read again from its newest posts"
        )
        return answer, limit

    def _lookback_covered(self, timeline: str, progress: _Progress) -> bool:
        """Whether a first poll has seen (taken, or left alone as before the follow) as
        far back as the next poll's lookback reads: a page below the cursor, or down to
        its floor. Short of it, that lookback would take posts from before the follow
        as late ones (the page read first holds the cursor's post, and posts dated
        ahead take places on it)."""
        if not self._looks_back(timeline) or progress.newest is None:
            return True
        floor = lookback_floor(timeline, progress.newest, self._lookback)
        if floor is None:
            return True
        newest = int(progress.newest)
        below = [
            int(post_id)
            for post_id in progress.seen
            if post_id.isascii() and post_id.isdigit() and int(post_id) < newest
        ]
        return len(below) >= self._page_limit or (bool(below) and min(below) <= floor)

    def _back_limit(self, timeline: str, backfill: int) -> int:
        """Posts a page a first poll asks for: the backfill's, at most a page; a whole
        page where the next poll looks back behind the cursor it starts, since the
        first poll reads as far back as that lookback will (``_lookback_covered``): in
        as few pages as it can."""
        if self._looks_back(timeline):
            return self._page_limit
        return min(self._page_limit, max(1, backfill))

    def _trusted(self, post_id: str | None, progress: _Progress, answer: _Answer | None) -> bool:
        """Whether ``post_id`` may move the cursor: not a snowflake dated past the
        instance's clock (``_instance_time``, and its slack) on software that numbers
        posts so. Such a post is left for its time: counted malformed until then, read
        once its id is no longer ahead."""
        if post_id is None:
            return False
        # Started again, the software is asked for by the next poll: numbers meanwhile
        # are taken for what the software most likely to give them gives.
        snowflakes = progress.software in SNOWFLAKE_SOFTWARE or (
            progress.rebased and progress.software is None
        )
        if not snowflakes and progress.software is not None:
            return True
        moment, told = self._instance_time(answer)
        ahead = dated_after(post_id, moment + (FUTURE_ID_SLACK if told else FUTURE_ID_SLACK_UNTOLD))
        if snowflakes or not ahead:
            return not ahead
        # The software unknown (its NodeInfo fails): a number dated ahead as a snowflake,
        # but by less than another software's numbers read as one are (Pixelfed's:
        # centuries), is most likely Mastodon's on a clock running fast, and as the
        # cursor would hide every post made until its time.
        return dated_after(post_id, moment + OTHER_NUMBERS_AHEAD)

    def _read_at(self, answer: _Answer | None) -> datetime | None:
        """When ``answer`` came, as its ``Date`` says, when believed (``_instance_time``):
        compared with the times the instance gives its posts, on the same clock. None
        otherwise: the pods' clock is no measure of those, and a ``Date`` days off (a
        host started without its clock) is the one to doubt when it is set right."""
        moment, told = self._instance_time(answer)
        return datetime.fromtimestamp(moment, UTC) if told else None

    @staticmethod
    def _date(answer: _Answer | None) -> datetime | None:
        """``answer``'s ``Date``; None without one that parses."""
        return None if answer is None else response_date(answer.headers)

    def _instance_time(self, answer: _Answer | None) -> tuple[float, bool]:
        """The time of ``answer`` on the instance's clock, and whether the instance told
        it: its ``Date`` when it is within ``MAX_CLOCK_SKEW`` of the pods' clock, else
        the pods' clock. Believed either way within it: an instance numbers its own
        posts by its own clock, fast or slow, and a post dated ahead of that clock would
        hide the posts it makes until then. Not past it: a ``Date`` years ahead (a hostile answer, a
        clock that jumped) would let any id be the cursor, and one years behind would
        leave every post aside for good."""
        now = self._now()
        said = self._date(answer)
        if said is None:
            return now, False
        moment = said.timestamp()
        return (moment, True) if abs(moment - now) <= MAX_CLOCK_SKEW else (now, False)

    def _passed_over(
        self,
        answer: _Answer | None,
        entries: list[Any],
        after: str,
        progress: _Progress,
        *,
        newest: bool = False,
    ) -> str | None:
        """Where reading goes on past a page that cannot be read, after ``after``: its
        first post's id (its newest's, with ``newest``) when the entries give one, else
        where the page's Link ``prev`` reads on from; None when neither does."""
        prev = link_relation(answer.headers, "prev", answer.url) if answer is not None else None
        linked = [dict(parse_qsl(urlsplit(prev).query)).get("min_id")] if prev else []
        key = id_key(after)
        for ids in ([entry.get("id") for entry in entries if isinstance(entry, dict)], linked):
            later = [
                post_id
                for post_id in map(_post_id, ids)
                if post_id is not None
                and self._trusted(post_id, progress, answer)
                and id_key(post_id)[0] == key[0]
                and id_key(post_id) > key
            ]
            if later:
                return (max if newest else min)(later, key=id_key)
        return None

    async def _look_back(
        self, api: str, timeline: str, cursor: str, host: str, progress: _Progress
    ) -> None:
        """One page, the newest posts behind the cursor within the lookback: the late ones
        among them (not in ``recent``) are handled. One request a poll, whatever the
        timeline's pace: on a busy one the lookback is that page's posts."""
        url = timeline_url(
            api, timeline, limit=self._page_limit, since_id=str(progress.floor), max_id=cursor
        )
        answer = await self._get_json(url, progress)
        # Only what is behind the cursor: an instance that ignores the query answers
        # with its newest posts, which are the forward read's, in order; taken here,
        # they would move the cursor past the posts between.
        await self._take(
            answer, self._entries(answer), host, progress, oldest_first=True, ceiling=cursor
        )

    async def _read_back(
        self,
        api: str,
        timeline: str,
        host: str,
        progress: _Progress,
        backfill: int,
        *,
        first: tuple[_Answer, int] | None = None,
        below: str | None = None,
        pages: int | None = None,
    ) -> None:
        """The first poll: the newest posts, back page by page to the backfill (the
        follow's, carried by the request; else this poller's bound). ``first``: the
        newest page and the posts it was asked with, when it was asked for already
        (the backfill still bounds what is taken of it). What its pages did not read
        of the backfill is left in ``progress.back_from`` and ``back_left``, for the
        polls after it (``_read_on_back``): ``below``, that post, from which a later
        poll reads on back, in the ``pages`` it has left after the new posts."""
        remaining = backfill
        limit = self._back_limit(timeline, backfill)
        if first is not None:
            limit = first[1]
        url = timeline_url(api, timeline, limit=limit, max_id=below)
        requested: set[str] = set()
        for _ in range(self._max_pages if pages is None else pages):
            requested.add(url)
            # Past the backfill, with the cursor found: a page read only to see what the
            # next poll's lookback will (``_lookback_covered``).
            covering = remaining <= 0 and progress.newest is not None
            try:
                if first is not None and first[0].url == url:
                    answer, first = first[0], None
                else:
                    answer = await self._get_json(url, progress)
                entries = self._entries(answer)
                before = set(progress.seen)
                new = await self._take(
                    answer, entries, host, progress, oldest_first=False, bound=remaining
                )
            except _Stop as stop:
                if not covering or _of_the_host(stop):
                    raise
                # An extra, as the lookback is: the poll has what it came for.
                progress.tell(f"the posts below the first ones left unseen: {stop.message}")
                return
            remaining -= new
            handled = progress.seen - before
            if remaining <= 0:
                progress.backfilled()
            elif handled:
                # Read on from the oldest post handled, not the page's: a poll whose
                # event is full leaves the rest of the page unread. Never from a newer
                # one (an answer to "older than" that is not): the posts between were
                # handled, and would be again. (Such a page that fills the event leaves
                # its older posts below the cursor and above this: never read.)
                oldest = min(handled, key=id_key)
                if progress.back_from is None or id_key(oldest) < id_key(progress.back_from):
                    progress.back_from = oldest
                progress.back_left = remaining
            # A page of posts dated ahead only: no backfill counts them, and the cursor
            # starts at the newest post behind them.
            ahead_only = new == 0 and progress.ahead_bottom is not None
            exhausted = _last_page(entries, limit)
            if exhausted and not progress.full:
                progress.backfilled()  # the timeline's oldest post is read
            if progress.full or exhausted or progress.rate_spent:
                return
            if remaining <= 0 and (
                below is not None
                or (
                    not (ahead_only and progress.newest is None)
                    and self._lookback_covered(timeline, progress)
                )
            ):
                return
            if not handled and not ahead_only:
                progress.tell("the instance served a page of posts already read")
                progress.backfilled()
                return
            if ahead_only and below is not None:
                # Posts older than one trusted cannot be dated ahead: the instance does
                # not answer what was asked, and no page past these would either.
                progress.tell("the backfill's older posts answered with posts dated ahead")
                progress.backfilled()
                return
            # The page right before this page's oldest post (not the Link's ``next``,
            # which may read on from elsewhere, as in ``_read_forward``).
            bottom = progress.ahead_bottom if ahead_only else progress.page_bottom
            if bottom is None:
                progress.backfilled()
                return
            if ahead_only:
                limit = self._page_limit  # past them in whole pages (the bound stays)
            following = timeline_url(api, timeline, limit=limit, max_id=bottom)
            if following in requested:
                progress.tell("the instance's pagination repeated a page")
                progress.backfilled()
                return
            url = following

    async def _read_on_back(
        self, api: str, timeline: str, host: str, progress: _Progress, pages: int
    ) -> None:
        """The rest of a backfill a poll before left (``progress.back_from``), in
        ``pages``. A page the instance asks to wait for or fails to answer (``_passing``)
        ends the poll and keeps the rest for the polls after it, until the
        ``BACK_FAILURES``-th in a row with none of it read between. Else an extra, as the
        lookback is: a page refused (for its query, its posts, or the host's defences)
        leaves the rest unread, with a note, or an old page the instance will not serve
        would be asked every poll for good; a refusal of the host's still ends the poll,
        which keeps what it read, and judges the host. So does an error of this code's
        own there: the backfill ends, not every poll of the follow."""
        progress.reading_back = True
        below = progress.back_from
        try:
            await self._read_back(
                api,
                timeline,
                host,
                progress,
                progress.back_left,
                below=below,
                pages=pages,
            )
        except (GateDeferred, _MachineryFailed):
            raise
        except _Stop as stop:
            why = stop.message
            if _passing(stop):
                # Read on after it from the oldest post read so far (``_read_back``).
                read = progress.read_back_below(below)
                progress.back_failures = 0 if read else progress.back_failures + 1
                if progress.back_failures < BACK_FAILURES:
                    if progress.back_failures:
                        progress.tell(
                            f"the backfill's page refused, {progress.back_failures} of "
                            f"{BACK_FAILURES} in a row"
                        )
                    raise
                why = f"{BACK_FAILURES} of its pages refused in a row ({stop.message})"
            self._end_backfill(progress, why)
            if _of_the_host(stop):
                raise
        except Exception as exc:
            log.exception("reading the backfill of %s failed unexpectedly", host)
            self._end_backfill(progress, f"unexpected error: {error_text(exc)}")
        finally:
            progress.reading_back = False

    @staticmethod
    def _end_backfill(progress: _Progress, why: str) -> None:
        progress.tell(f"the rest of the backfill left unread: {why}")
        progress.backfilled()
        progress.back_cut = True

    @staticmethod
    def _entries(answer: _Answer) -> list[Any]:
        data = answer.data
        if not isinstance(data, list):
            raise _Stop(
                CrawlOutcome.REJECTED,
                f"a timeline page is a JSON {type(data).__name__}, not a list",
                status=answer.status,
            )
        return data

    async def _read(self, answer: _Answer, entries: list[Any], host: str) -> list[Entry]:
        """The page's entries, read in a parse thread: libxml2 keeps every name a thread
        parses until the thread ends, and the event loop's never does, so a followed
        instance's posts of new names would grow the pod for good (``ParseThreads``)."""

        def read() -> list[Entry]:
            return [
                read_entry(
                    entry, host=host, allowed_networks=self._networks, nat64_prefixes=self._nat64
                )
                for entry in entries
            ]

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._parser.pool(answer.size), read)

    async def _take(
        self,
        answer: _Answer,
        entries: list[Any],
        host: str,
        progress: _Progress,
        *,
        oldest_first: bool,
        bound: int | None = None,
        ceiling: str | None = None,
    ) -> int:
        """Handle a page's entries; the number of new ones (kept, skipped, malformed).
        ``ceiling``: entries after this id are left alone, as if not on the page."""
        read = await self._read(answer, entries, host)
        malformed = sum(1 for entry in read if entry.verdict == "malformed")
        if read and malformed == len(read):
            # Nothing on the page can be read: its ids (if any) say nothing trustworthy.
            raise _Stop(
                CrawlOutcome.REJECTED,
                f"none of the page's {len(read)} entries is a readable status",
                for_its_posts=True,
            )
        # A post whose id is ahead of what the instance can have given is left for its
        # time (``_trusted``): counted, and not a reason to pass the page over.
        usable, ahead = [], []
        for entry in read:
            if self._trusted(entry.id, progress, answer):
                usable.append(entry)
            elif entry.id is not None:
                ahead.append(entry.id)
        progress.malformed += len(read) - len(usable)
        # Reading back, a page of nothing else is read past, not taken as the end.
        progress.ahead_bottom = min(ahead, key=id_key) if ahead and not usable else None
        usable = progress.of_the_timelines_kind(usable)
        usable.sort(key=lambda entry: id_key(entry.id or ""), reverse=not oldest_first)
        if usable:
            progress.page_top = (usable[-1] if oldest_first else usable[0]).id
            progress.page_bottom = (usable[0] if oldest_first else usable[-1]).id
        new = 0
        read_at = self._read_at(answer)
        # The first page of posts a first poll reads (past any dated ahead only).
        first_page = progress.cursor is None and progress.newest is None
        progress.pages += 1
        for entry in usable:
            assert entry.id is not None
            if ceiling is not None and id_key(entry.id) > id_key(ceiling):
                continue
            if not progress.is_new(entry.id):
                continue
            if bound is not None and new >= bound:
                # Older than the backfill: left alone, but the cursor starts at the newest.
                if first_page:
                    progress.advance(entry.id, read_at)
                progress.seen.add(entry.id)  # decided: not taken by the next lookback
                continue
            if entry.verdict == "kept":
                assert entry.post is not None
                if not progress.add(entry.post):
                    break
            elif entry.verdict == "skipped":
                progress.skipped += 1
                if entry.withdrawn is not None:
                    progress.withdraw(entry.withdrawn)
            else:
                progress.malformed += 1
            progress.seen.add(entry.id)
            progress.advance(entry.id, read_at)
            new += 1
        return new

    # requests ----------------------------------------------------------------------

    async def _allowed(self, url: str) -> bool:
        try:
            return await self._robots_allows(url)
        except GateDeferred:
            raise  # robots.txt must wait for the host's slot: the poll ends there
        except Exception as exc:
            raise _MachineryFailed(exc) from exc

    async def _get_json(self, url: str, progress: _Progress) -> _Answer:
        """GET ``url`` (following same-site redirects) and parse its JSON, or ``_Stop``."""
        current = url
        visited = {url}
        for _ in range(self._limits.max_redirects + 1):
            # The limit first: a robots.txt not yet read would be asked of a host the
            # instance asked to be left alone.
            if progress.rate_spent:
                raise GateDeferred(progress.retry_after or 0.0)
            if not await self._allowed(current):
                raise _Stop(
                    CrawlOutcome.BLOCKED_ROBOTS,
                    f"robots.txt disallows {urlsplit(current).path}",
                )
            try:
                async with self._gate(current) as within:
                    progress.requests += 1
                    outcome = await self._exchange(current, within)
                    # A page refused for its size still says how much of the rate is
                    # left: the pages of fewer posts asked next stay within it.
                    answered = outcome.answer if isinstance(outcome, _Stop) else outcome[0]
                    rate = None if answered is None else self._rate_wait(answered.headers, progress)
                    asked = outcome.retry_after if isinstance(outcome, _Stop) else None
                    told = max((w for w in (rate, asked) if w is not None), default=None)
                    if told is not None and self._told is not None:
                        # Before the lease is let go: another poll of the instance may
                        # take the host a gap later, before this one has ended.
                        self._told(told)
            except GateDeferred:
                raise
            except Exception as exc:
                raise _MachineryFailed(exc) from exc
            progress.wait(rate)
            if isinstance(outcome, _Stop):
                raise outcome
            answer, location = outcome
            if location is None:
                return answer
            hop = location
            if not same_site(httpx.URL(current), httpx.URL(hop)):
                raise _Stop(
                    CrawlOutcome.REJECTED,
                    f"redirected off the instance to {hop[:300]} (not followed)",
                    status=answer.status,
                )
            if hop in visited:
                raise _Stop(CrawlOutcome.FAILED, f"redirect loop back to {hop[:300]}")
            visited.add(hop)
            current = hop
        raise _Stop(
            CrawlOutcome.FAILED, f"too many redirects (more than {self._limits.max_redirects})"
        )

    def _moment(self) -> datetime:
        """Now, on the clock a dated wait is read on."""
        return datetime.fromtimestamp(self._now(), UTC)

    def _rate_wait(self, headers: httpx.Headers, progress: _Progress) -> float | None:
        wait = rate_limit_wait(headers, now=self._moment())
        if wait is not None:
            progress.rate_spent = True
        return wait

    async def _exchange(
        self, url: str, within: float | None = None
    ) -> tuple[_Answer, str | None] | _Stop:
        """One request and its bounded body, within the total timeout and ``within`` (the
        gate's bound: what is left of the lease's hold); what went wrong as a ``_Stop``,
        never raised."""
        timeout = self._limits.total_timeout
        if within is not None:
            timeout = max(0.0, min(timeout, within))
        try:
            async with asyncio.timeout(timeout):
                return await self._request(url)
        except _Stop as stop:
            return stop
        except NetworkAway:
            raise  # not the instance's answer: the poll waits for the pod's network
        except TimeoutError:
            return _Stop(CrawlOutcome.TIMEOUT, f"no complete answer within {timeout:g} s")
        except httpx.TimeoutException as exc:
            return _Stop(CrawlOutcome.TIMEOUT, error_text(exc))
        except BlockedAddress as exc:
            return _Stop(CrawlOutcome.FAILED, f"blocked address: {exc}")
        except ContentError as exc:
            return _Stop(CrawlOutcome.REJECTED, str(exc))
        except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            return _Stop(CrawlOutcome.FAILED, error_text(exc), unreachable=True)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            return _Stop(CrawlOutcome.FAILED, error_text(exc))
        except Exception as exc:
            log.exception("unexpected error requesting %s", url)
            return _Stop(CrawlOutcome.FAILED, f"unexpected error: {error_text(exc)}")

    async def _request(self, url: str) -> tuple[_Answer, str | None]:
        headers = {"Accept": ACCEPT_JSON, "Accept-Encoding": ACCEPT_ENCODING}
        request = self._client.build_request("GET", url, headers=headers)
        response = await self._client.send(request, stream=True)
        try:
            status = response.status_code
            answer = _Answer(url=url, status=status, headers=response.headers)
            if status in REDIRECT_STATUSES:
                location = response.headers.get("location", "").strip()
                if not location:
                    raise _Stop(CrawlOutcome.FAILED, f"HTTP {status} without a Location")
                try:
                    hop = str(redirect_url(httpx.URL(url), location))
                except (ValueError, httpx.InvalidURL) as exc:
                    raise _Stop(CrawlOutcome.REJECTED, f"unusable redirect: {exc}") from None
                return answer, hop
            if is_challenge(status, response.headers):
                # Not the API's answer but the host's defence (AWS WAF's 202, a CDN's 403):
                # the host is left alone as after a challenge to a page.
                raise _Stop(
                    CrawlOutcome.BLOCKED_4XX,
                    f"HTTP {status}: a bot challenge",
                    status=status,
                    challenge=True,
                )
            if status == 429 or (status == 503 and "retry-after" in response.headers):
                outcome = CrawlOutcome.BLOCKED_4XX if status == 429 else CrawlOutcome.BLOCKED_5XX
                raise _Stop(
                    outcome,
                    f"HTTP {status}: the instance asks to slow down",
                    status=status,
                    retry_after=retry_after_of(response.headers, now=self._moment()),
                )
            # An error still counts against the API's rate limit: its headers are read (a
            # 429 names its own wait, and a challenge is not the API's answer).
            if 400 <= status < 500:
                raise _Stop(
                    CrawlOutcome.BLOCKED_4XX, f"HTTP {status}", status=status, answer=answer
                )
            if 500 <= status < 600:
                raise _Stop(
                    CrawlOutcome.BLOCKED_5XX, f"HTTP {status}", status=status, answer=answer
                )
            if not 200 <= status < 300:
                raise _Stop(
                    CrawlOutcome.REJECTED, f"unexpected HTTP {status}", status=status, answer=answer
                )
            kind = media_type(response.headers.get("content-type"))
            if kind is not None and kind != "application/json" and not kind.endswith("+json"):
                raise _Stop(
                    CrawlOutcome.REJECTED,
                    f"the API answered {kind[:100]}, not JSON",
                    status=status,
                    answer=answer,
                )
            reader = BodyReader(
                max_bytes=self._limits.max_body_bytes,
                max_ratio=self._limits.max_decompression_ratio,
            )
            body = await reader.read(response)
            if reader.truncated:
                raise _Stop(
                    CrawlOutcome.REJECTED,
                    f"the API answer is larger than {self._limits.max_body_bytes} bytes",
                    status=status,
                    for_its_posts=True,
                    answer=answer,
                )
        finally:
            await response.aclose()
        answer.size = len(body)
        try:
            # In a parse thread, as the entries are read: a hostile instance's 2 MiB of
            # "[{},{},...]" held the event loop for ~35 ms. Nothing of libxml2's is
            # touched, so it counts nothing towards the pool's renewal.
            loop = asyncio.get_running_loop()
            answer.data = await loop.run_in_executor(self._parser.pool(0), json.loads, body)
        except (ValueError, RecursionError) as exc:
            # A list that does not parse is most likely one post's bytes (a broken
            # instance's Latin-1, a number of thousands of digits): asked again with fewer
            # posts, as a page too large is, and passed over, or every poll failed on it.
            # An HTML page stays one request.
            raise _Stop(
                CrawlOutcome.REJECTED,
                f"the API answer is not JSON: {exc}"[:300],
                status=status,
                for_its_posts=body.lstrip()[:1] == b"[",
                answer=answer,
            ) from None
        return answer, None

    # the event ---------------------------------------------------------------------

    def _event(
        self,
        request: TimelinePollRequested,
        progress: _Progress,
        stop: _Stop | None,
        started: datetime,
    ) -> TimelinePolled:
        # Read something new: the cursor moves. Late posts the lookback found behind it
        # are not progress: a poll whose next page failed after them is a failure (the
        # next poll's lookback finds them again), or an instance whose new posts fail
        # would be asked again at once, for ever, with nothing counted against it.
        advanced = progress.newest is not None and (
            request.cursor is None
            or progress.rebased  # a cursor of a new numbering, not compared with the old
            or id_key(progress.newest) > id_key(request.cursor)
        )
        # Read on back: the backfill's posts are progress too, kept through a wait.
        read_back = progress.read_back_below(_backfill_left(request)[0])
        # A refusal of the backfill's old pages (``back_cut``) comes after the new posts
        # were read: the poll did what it is for.
        failed = stop is not None and not (advanced or read_back or progress.back_cut)
        outcome = stop.outcome if failed and stop is not None else CrawlOutcome.SUCCESS
        status = stop.status if stop is not None else None
        notes: list[str] = []
        if stop is not None:
            progress.wait(stop.retry_after)
            if not failed:
                # Cut short reading on: more to read, but of a backfill the refusal ended.
                progress.more = progress.more or not progress.back_cut
                notes.append(f"stopped after {progress.pages} page(s): {stop.message}")
            else:
                notes.append(stop.message)
        if progress.back_from is not None and not failed:
            # What ``trove instances`` shows of it (the chain's own progress is in KV):
            # before the notes, which the message's bound may cut.
            notes.append(f"{progress.back_left} posts of the backfill left to read back")
        notes.extend(progress.notes.values())
        if progress.malformed and not failed:
            notes.append(f"{progress.malformed} malformed entries skipped")
        message = "; ".join(notes)[:_MAX_MESSAGE] or None
        base: dict[str, Any] = {
            "id": derived_event_id(request.id, "polled"),
            "request_id": request.id,
            "instance": request.instance,
            "domain": request.domain,
            "timeline": request.timeline,
            "follow_id": request.follow_id,
            "poll": request.poll,
            "started_at": started,
            "cursor_before": request.cursor,
            "requests": progress.requests,
            "retry_after": progress.retry_after,
            "rate_limited": progress.rate_spent or status in (429, 503),
        }
        cursor_after = request.cursor
        cursor_after_at = progress.cursor_at if cursor_after is not None else None
        # A failed poll's posts are not kept: the backfill left is the request's, and
        # the count of its pages refused this poll's (but of a poll that started again,
        # whose own backfill is not kept either). Any of it read ends a count.
        if failed:
            back_from, back_left = _backfill_left(request)
            back_failures = request.back_failures if progress.rebased else progress.back_failures
        else:
            back_from, back_left = progress.back_from, progress.back_left
            back_failures = 0 if read_back else progress.back_failures
        if back_from is None:
            back_failures = 0
        newest = None if failed else progress.newest
        # A late post read behind the cursor never moves it back; a cursor started again
        # (``_Progress.rebase``) is of a new numbering, not compared with the old. The
        # time goes with the cursor: when the poll that moved it there read it.
        if newest is not None and (
            cursor_after is None or progress.rebased or id_key(newest) > id_key(cursor_after)
        ):
            cursor_after, cursor_after_at = newest, progress.newest_at
        try:
            return TimelinePolled(
                **base,
                outcome=outcome,
                status_code=status if status is not None and 100 <= status <= 999 else None,
                error_message=message,
                completed_at=utcnow(),
                api=progress.api,
                software=progress.software,
                software_version=progress.version,
                cursor_after=cursor_after,
                cursor_after_at=cursor_after_at,
                recent_after=request.recent
                if failed
                else self._recent(request, progress, cursor_after),
                back_from=back_from,
                back_left=back_left,
                back_failures=back_failures,
                more=(progress.more or back_from is not None) and not failed,
                posts=() if failed else tuple(progress.posts),
                skipped=0 if failed else progress.skipped + progress.malformed,
                withdrawn=() if failed else tuple(progress.withdrawn),
                # What cut a poll short after it read on still tells of the host: its
                # posts are kept, and the host is judged by the answer as after a failure.
                stopped_by=None if failed or stop is None else stop.outcome,
                challenged=stop is not None and stop.challenge,
            )
        except Exception as exc:
            log.exception("could not build the poll's event for %s", request.instance)
            return TimelinePolled(
                **base,
                outcome=CrawlOutcome.REJECTED,
                error_message=f"could not record the poll: {exc}"[:_MAX_MESSAGE],
                completed_at=utcnow(),
                cursor_after=request.cursor,
                cursor_after_at=request.cursor_at,
                recent_after=request.recent,
                back_from=_backfill_left(request)[0],
                back_left=_backfill_left(request)[1],
                back_failures=request.back_failures,
            )

    def _looks_back(self, timeline: str) -> bool:
        return timeline != "local" and self._lookback > 0

    def _recent(
        self, request: TimelinePollRequested, progress: _Progress, cursor: str | None
    ) -> tuple[str, ...]:
        """The ids handled in the lookback behind ``cursor``: the next poll's ``recent``."""
        floor = lookback_floor(request.timeline, cursor, self._lookback)
        if floor is None or cursor is None:
            return ()
        top = int(cursor)
        handled = {
            int(post_id)
            for post_id in (*progress.recent, *progress.seen)
            if post_id.isascii() and post_id.isdigit() and floor < int(post_id) <= top
        }
        return tuple(str(post_id) for post_id in sorted(handled)[-MAX_RECENT_POSTS:])
