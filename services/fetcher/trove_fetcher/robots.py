"""robots.txt (RFC 9309): fetch it, decide what it means, cache it across pods.

What the fetch status means for the whole origin, and for how long:

- 2xx: the file's rules, for ``ttl`` (a day);
- 4xx, 401 and 403 included: allow all (RFC 9309 §2.3.1.3), for ``ttl``;
- more than 5 redirects: unavailable, so allow all (§2.3.1.2), for ``ttl``; a redirect
  to a Location no request can go to (another scheme, no host, a URL longer than
  ``MAX_URL_LENGTH``) likewise: no file is there;
- a redirect to a host the operator excluded: no request to it, and rules that
  disallow everything (``EXCLUDED_RULES``), for ``ttl``: the site's rules cannot be
  read, and the redirect is its lasting choice, so a refusal, not a failure to retry;
- 429, 5xx, a timeout, no connection, a blocked address, a bot challenge (whatever its
  status): disallow all (§2.3.1.4), for ``retry_ttl`` only (10 minutes), so that
  robots.txt is asked for again soon.

429 is a 4xx that RFC 9309 would read as "allow all"; Trove reads it as the site
asking to slow down, like a 5xx, as Google does. What such an answer says about the
host (``failure``, with its ``retry_after``) is the fetcher's to learn from as it
learns from a page's: a 429 or a 503 pauses the host as long as it asks, a timeout
or a 5xx for a while that doubles, so robots.txt is not asked again every
``retry_ttl`` from a host that said to wait.

Redirects are followed up to 5 hops, to other hosts too (robots.txt of ``www.`` often
lives on the bare domain), each hop through the SSRF-guarded client and, when the
caller gives a ``before_hop`` gate, only once the gate lets it go: the fetcher takes
the hop's host's own lease there (another host's gap is that host's), and may pause
the chain (``RedirectPaused``) to continue it later with ``resume``. The body is cut
at ``max_bytes`` (500 KiB at least, §2.5) at the last complete line, so a rule cut in
half (``Allow: /p`` of ``Allow: /private-ok``) never widens what is allowed.

A ``RobotsPolicy`` is stored in the shared NATS KV bucket as bytes: a JSON header line
and the lines of robots.txt its parser reads (``_rules_only``): a robots.txt request may
be answered with any page (a soft 404, a redirect to the home page), and no page's text
is stored. Each process re-parses it on load, and keeps the parsed objects in a small LRU
so a cached policy is parsed once, not once per URL.

protego parses a file and matches a URL in Python, rule by rule and wildcard by wildcard,
on the fetcher's event loop, so what a file costs grows with its rules, not its bytes: a
wildcard is dearer than a plain rule, user agents sharing a group each get their own copy
of its rules, and each query order is a match of its own against the group TroveBot falls
in. A file that would cost more than ``MAX_ROBOTS_WORK`` to parse, or a URL to match (its
query orders included), is not parsed or matched: what it covers is refused (``unjudged``
says why), never allowed unread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import sys
import time
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any
from urllib.parse import urljoin

import httpx
import idna
from protego import Protego
from protego._protego import (
    _ALL_DIRECTIVES,
    _ALLOW_DIRECTIVE,
    _CRAWL_DELAY_DIRECTIVE,
    _DISALLOW_DIRECTIVE,
    _SITE_WIDE_DIRECTIVES,
    _USER_AGENT_DIRECTIVE,
    _extract_directive,
)

from trove_fetcher.errors import (
    BlockedAddress,
    FetcherError,
    HopGateFailed,
    NetworkAway,
    RedirectPaused,
)
from trove_fetcher.http import (
    ACCEPT_ENCODING,
    REDIRECT_STATUSES,
    BodyReader,
    HopGate,
    error_text,
    overlong_target,
    pass_gate,
    redirect_url,
    retry_after,
    unusable_location,
)
from trove_fetcher.politeness import finite
from trove_schema.errors import InvalidURL
from trove_schema.events import MAX_SITEMAPS, MAX_URL_LENGTH
from trove_schema.heuristics import is_challenge
from trove_schema.urls import canonicalize_or_none, domain_of

log = logging.getLogger(__name__)

#: The product token robots.txt groups are matched against (``TROVE_ROBOTS_TOKEN``).
BOT_NAME = "TroveBot"
#: How long a fetched robots.txt (or a 4xx) holds; RFC 9309 says at most 24 hours.
DEFAULT_TTL = 86_400.0
#: How long a temporary "disallow all" (5xx, unreachable) holds before a new try.
RETRY_TTL = 600.0
#: The rules of a site whose robots.txt redirects to an excluded host.
EXCLUDED_RULES = b"User-agent: *\nDisallow: /\n"
#: Redirect hops followed (RFC 9309 §2.3.1.2: at least five).
MAX_ROBOTS_REDIRECTS = 5
#: Parsed robots.txt objects kept per process, and the most bytes they may come from: a
#: parsed file weighs some 30 to 45 times its text, and a file of 500 KiB is allowed.
PARSED_CACHE_SIZE = 512
PARSED_CACHE_BYTES = 4 * 1024 * 1024
#: The most parameters of one URL each checked first (``_query_orders``): each order is
#: matched against the whole file, and a link of 2,000 characters may have 500 of them.
MAX_QUERY_ORDERS = 32
#: The most work, in lines of a file (``_WILDCARD_WORK`` for each ``*`` or ``$``), that
#: parsing a file or judging one URL may take. A line is a rule protego makes and may try
#: against a URL; a wildcard is a piece it finds in the URL in Python, and a ``$`` doubles
#: its rule. The bound takes every file of 500 KiB of plain rules (RFC 9309 asks that much
#: be read), one URL at a time. Parsing counts each further user agent a group names (a
#: copy of its rules for each); a URL is matched against the rules of the group TroveBot
#: falls in alone, once for each order of its query it is judged in.
MAX_ROBOTS_WORK = 65_536
_WILDCARD_WORK = 4
#: Steps of protego's look for an agent named before among its group's (an identity
#: comparison in C, ~10 ns) to a unit of work (a rule parsed, ~4 us). A group naming
#: again 14,000 agents named before is 100 million of them: a second and a half.
_SCAN_STEPS = 256
#: Characters of a rule's value one unit of work copies (``_named_by_token``).
_COPY_BYTES = 256
#: The most of a Crawl-delay, Request-rate or Visit-time value read.
_MAX_VALUE_CHARS = 64
#: A Crawl-delay with its unit, or a decimal comma: its number, and its minutes.
_SPELLED_DELAY = re.compile(
    r"(\d+(?:[.,]\d+)?)\s*(?:s|secs?|seconds?|(m|mins?|minutes?))?", re.IGNORECASE | re.ASCII
)
_FORMAT_VERSION = 1


class RobotsRule(StrEnum):
    PARSED = "parsed"
    ALLOW_ALL = "allow_all"
    DISALLOW_ALL = "disallow_all"


@dataclass(frozen=True, slots=True)
class _Rules:
    #: None for a file too costly to parse (``MAX_ROBOTS_WORK``).
    parser: Protego | None
    #: Whether a rule of the file could read a query's order (``_QUERY_RULE``).
    reads_queries: bool
    #: The product tokens the file's groups are named after (``_product_token``).
    tokens: frozenset[str]
    #: What matching one URL may take, by the name ``agent`` gives: the rules of the
    #: groups so named (protego matches a URL against one group's alone).
    work: Mapping[str, int]
    #: The bytes of robots.txt ``parser`` was made of: what it counts in ``_parsed``.
    size: int

    def agent(self, token: str) -> str:
        """The name to ask ``parser`` about ``token`` with.

        protego applies the group with the longest name found in the one asked about, so
        ``Trove`` would be TroveBot's. Every group is named after its product token
        (``_named_by_token``): asked for a token a group is named after, it takes that
        group, which holds the rules of all the groups so named (protego merges groups of
        one name); asked for ``*``, in which no product token can be found, it takes the
        ``*`` group or none, as RFC 9309 2.2.1 has a crawler no group names do. (A token
        of one letter would tie with ``*``, which scores one, and lose to it if first.)
        """
        own = _product_token(token)
        return own if own in self.tokens else "*"

    def match_work(self, token: str) -> int:
        """What matching one URL for ``token`` may take (``_named_by_token``)."""
        return self.work.get(self.agent(token), 0)


_parsed: OrderedDict[tuple[str, float, int, int], _Rules] = OrderedDict()
#: The bytes of robots.txt the parsers in ``_parsed`` were made of (their ``size``).
_parsed_bytes = 0


#: The start of a user-agent value that is its product token (RFC 9309 2.2.1).
_PRODUCT_TOKEN = re.compile(r"[A-Za-z_-]*")

#: A line that could hold a rule reaching into a query: a "?" (or its escape), or a "*"
#: with more of the pattern after it. Any line, as protego reads misspelled directives
#: too; a Sitemap's "?" costs only the extra checks.
_QUERY_RULE = re.compile(r"(?m)^[^#\r\n]*?(?:\?|%3[fF]|\*[^*\s#])")


def _parse(key: tuple[str, float, int, int], body: bytes) -> _Rules:
    global _parsed_bytes
    rules = _parsed.get(key)
    if rules is not None:
        _parsed.move_to_end(key)
        return rules
    # Line ends as protego reads them (``str.splitlines``: a bare CR ends a line too, as
    # RFC 9309 allows), so the rewrites below see the lines protego parses.
    text = "\n".join(_text(body).splitlines())
    # Counted in C first: a file of too many lines is not walked in Python at all. One
    # too costly is kept too, holding no parser, so it is not weighed again for each URL.
    rules = _Rules(None, False, frozenset(), {}, 0)
    if _parse_work(text) <= MAX_ROBOTS_WORK:
        named, tokens, parse_work, work = _named_by_token(text)
        if parse_work <= MAX_ROBOTS_WORK:
            reads_queries = _QUERY_RULE.search(text) is not None
            rules = _Rules(Protego.parse(named), reads_queries, tokens, work, key[2])
    _parsed[key] = rules
    _parsed_bytes += rules.size
    while len(_parsed) > 1 and (
        len(_parsed) > PARSED_CACHE_SIZE or _parsed_bytes > PARSED_CACHE_BYTES
    ):
        _, gone = _parsed.popitem(last=False)
        _parsed_bytes -= gone.size
    return rules


def _parse_work(text: str) -> int:
    """The least parsing ``text`` (lines as protego reads them) takes, as ``_rule_work``
    counts it: its lines, and ``_WILDCARD_WORK`` for each ``*`` and ``$``. Counted in C,
    so a hostile file costs little to weigh."""
    lines = text.split("\n")
    wildcards = text.count("*") + text.count("$")
    return len(lines) - lines.count("") + _WILDCARD_WORK * wildcards


def _shortened(field: str, value: str) -> str | None:
    """``value`` as long as it can mean anything, if it is longer: an Allow or Disallow
    of more characters (wildcards aside) than any URL Trove asks for never matches one,
    and is kept empty (it still ends the group before it, and protego skips it); a
    Crawl-delay, Request-rate or Visit-time is cut. A rule of 400 KB named by 6,000
    agents made protego hold 4.6 GB. A Crawl-delay written with its unit or a decimal
    comma ("30s", "2 minutes", "2,5") is its seconds: protego reads only a number, and
    the site's wait was the default gap."""
    if field in _CRAWL_DELAY_DIRECTIVE:
        spelled = _SPELLED_DELAY.fullmatch(value[:_MAX_VALUE_CHARS])
        if spelled is not None:
            number = float(spelled.group(1).replace(",", "."))
            return repr(number * 60 if spelled.group(2) else number)
        with contextlib.suppress(ValueError):
            if float(value[:_MAX_VALUE_CHARS]) == math.inf:
                # "1e400", "inf": past a float's range, which protego drops as malformed,
                # and the longest wait asked for became the default gap.
                return repr(sys.float_info.max)
    if field in _ALLOW_DIRECTIVE or field in _DISALLOW_DIRECTIVE:
        # A "%61" may match one "a": protego decodes the escapes of plain characters.
        literal = len(value) - value.count("*") - value.count("$") - 2 * value.count("%")
        return "" if literal > MAX_URL_LENGTH else None
    if field in _SITE_WIDE_DIRECTIVES:
        return None
    return value[:_MAX_VALUE_CHARS] if len(value) > _MAX_VALUE_CHARS else None


def _rule_work(value: str) -> int:
    """What one line costs to parse, and one rule to try against a URL: a wildcard is a
    piece protego finds in the URL in Python, and a ``$`` doubles its rule."""
    return 1 + _WILDCARD_WORK * (value.count("*") + value.count("$"))


def _product_token(value: str) -> str:
    """A user-agent value's product token, in lower case: the value up to the first
    character that is not a letter, "_" or "-" (RFC 9309 2.2.1), as Google's parser reads
    it, so that a site owner who copies "TroveBot/1.0" from their logs into a group means
    TroveBot; ``*`` for the group of every crawler, words after it or not (as Google reads
    it); empty for a value that names no crawler (``*Bot``).
    """
    if value.split(maxsplit=1)[:1] == ["*"]:
        return "*"
    match = _PRODUCT_TOKEN.match(value)
    return "" if match is None else match[0].lower()


def _named_by_token(text: str) -> tuple[str, frozenset[str], int, dict[str, int]]:
    """``text`` (lines as protego reads them) with each user-agent line, in any spelling
    protego reads, naming its product token alone; the tokens so named; what parsing it
    takes (``_rule_work`` a line; for each further distinct user agent its group names,
    a copy of the line counted by its length, as protego gives each agent a copy of the
    group's rules; and for an agent named before, a ``_SCAN_STEPS``th of the agents its
    group names so far, which protego looks through); and what matching a URL takes for
    each token, the rules of the groups it names.

    A line naming no crawler is kept as an empty user-agent line: it still ends the group
    before it, as the line did, and opens none.
    """
    lines = text.split("\n")
    tokens: set[str] = set()
    parse = 0
    scan = 0  # steps of protego's look for agents named before (``_SCAN_STEPS``)
    match: dict[str, int] = {}
    agents: dict[str, None] = {}  # the distinct agents of the group the lines are in
    rules = 0  # the work of that group's rules
    naming = True  # whether a user-agent line adds to that group rather than opening one

    def group_ends() -> None:
        # Counted a group at a time, not a rule at a time for each of its agents.
        for agent in agents:
            match[agent] = match.get(agent, 0) + rules

    for index, line in enumerate(lines):
        rule = line.partition("#")[0].strip()
        directive = _extract_directive(rule) if rule else None
        if directive is None:
            continue
        field, value = directive
        if field not in _USER_AGENT_DIRECTIVE:
            short = _shortened(field, value)
            if short is not None:
                lines[index], value = f"{field}: {short}", short
            cost = _rule_work(value)
            parse += cost
            if field not in _SITE_WIDE_DIRECTIVES:
                naming = False
                # Each further agent gets a copy, as long as the value (a pattern made
                # again for an "index.html" Allow, a Request-rate split again).
                parse += max(len(agents) - 1, 0) * (1 + len(value) // _COPY_BYTES)
                rules += cost
            continue
        if not naming:
            group_ends()
            agents, rules, naming = {}, 0, True
        token = _product_token(value)
        lines[index] = f"User-agent: {token}"
        parse += 1
        if token in tokens:
            # Named before: protego looks for its rules among the group's so far.
            scan += len(agents)
        if token:
            tokens.add(token)
            agents[token] = None
    group_ends()
    return "\n".join(lines), frozenset(tokens), parse + scan // _SCAN_STEPS, match


def _text(body: bytes, errors: str = "replace") -> str:
    """robots.txt as protego is given it: UTF-8 (RFC 9309), no byte order mark."""
    return body.decode("utf-8", errors).removeprefix("\ufeff")


#: Written for each line protego reads as a field it does not know (a run of them as
#: one): such a line still ends a group of user-agent lines, and this, the shortest of
#: them, keeps what is stored no longer than what was received.
_OTHER_FIELD = ":"


def _rules_only(body: bytes) -> bytes:
    """The lines of ``body`` protego reads, each as received without its comment.

    Lines are read by protego's own reader: a directive it knows is kept, one it does not
    is ``_OTHER_FIELD``, and anything else (a page's text) is dropped. A blank line, which
    means nothing to protego, is kept after a rule only, so a file of rules keeps its look.
    Undecodable bytes are kept as they came (``surrogateescape``) and read as protego
    reads them, so the rules are those of ``body``, and the result is never longer.
    """
    kept: list[str] = []
    previous = ""  # as after a blank line: none opens the result
    for piece in _text(body, "surrogateescape").splitlines(keepends=True):
        line = piece.splitlines()[0]
        text = line.partition("#")[0].rstrip()
        if text:
            directive = _extract_directive(text.strip())
            if directive is None:
                continue
            if directive[0] not in _ALL_DIRECTIVES:
                text = _OTHER_FIELD
        if text == previous == _OTHER_FIELD or (not text and previous in ("", _OTHER_FIELD)):
            continue
        kept.append(text + piece[len(line) :])
        previous = text
    return "".join(kept).encode("utf-8", "surrogateescape")


def _query_orders(url: str) -> list[str]:
    """``url`` with each query parameter after the first (up to ``MAX_QUERY_ORDERS``)
    moved to the front in turn.

    A canonical URL's parameters are sorted by name, and the site may link them in
    another order: ``Disallow: /search?q=`` names ``/search?q=cats&page=2``, which is
    canonically ``/search?page=2&q=cats``. The site's order is not known; each order with
    one parameter first is a cheap stand-in for it.
    """
    head, _, rest = url.partition("?")
    parameters = [p for p in rest.partition("#")[0].split("&") if p]
    return [
        f"{head}?{'&'.join([parameters[index], *parameters[:index], *parameters[index + 1 :]])}"
        for index in range(1, min(len(parameters), MAX_QUERY_ORDERS + 1))
    ]


#: ``Sitemap`` lines of a file read for its sitemaps (``RobotsPolicy.sitemap_urls``).
SITEMAP_LINES_READ = 10 * MAX_SITEMAPS


@dataclass(frozen=True, kw_only=True, slots=True)
class RobotsPolicy:
    """What robots.txt says for one origin (``scheme://host[:port]``)."""

    origin: str
    rule: RobotsRule
    #: When it was fetched, on the pods' shared clock (``fetch_robots``'s ``now``):
    #: every pod judges its age, so none may read it on a clock of its own.
    fetched_at: float
    #: Seconds after ``fetched_at`` this policy is valid.
    ttl: float = DEFAULT_TTL
    #: The last HTTP status seen; None when no response came.
    status_code: int | None = None
    #: The lines of robots.txt its parser reads (``_rules_only``; cut at the size cap),
    #: for ``PARSED``; a policy stored by an older pod holds the file as received.
    body: bytes = b""
    truncated: bool = False
    #: Why the policy is not the file's rules, in words.
    error: str | None = None
    #: What the answer says about the host when it was a failure of the host's (the
    #: ``error_type`` of ``trove_schema.policy.Observation``: ``rate_limited``,
    #: ``server_error``, ``timeout``, ``network_error``, ``blocked_captcha``); None
    #: otherwise.
    failure: str | None = None
    #: The answer's Retry-After, in seconds, if it had one.
    retry_after: float | None = None
    _key: tuple[str, float, int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        key = (self.origin, self.fetched_at, len(self.body), zlib.crc32(self.body))
        object.__setattr__(self, "_key", key)

    @property
    def temporary(self) -> bool:
        """A fallback to retry soon rather than the site's answer."""
        return self.rule is RobotsRule.DISALLOW_ALL

    def allows(self, url: str, token: str = BOT_NAME) -> bool:
        """Whether ``token`` may fetch ``url`` (a URL on this policy's origin).

        A URL with two or more query parameters, under a file with a rule that could
        read their order, is refused if any order with one parameter moved first is
        disallowed too (``_query_orders``): its canonical order may not be the one the
        site's rules were written for. A URL that would cost more than
        ``MAX_ROBOTS_WORK`` to judge so is refused unmatched (``unjudged``).
        """
        if self.rule is RobotsRule.ALLOW_ALL:
            return True
        if self.rule is RobotsRule.DISALLOW_ALL:
            return False
        rules, checks = self._checks(url)
        if rules.parser is None or rules.match_work(token) * len(checks) > MAX_ROBOTS_WORK:
            return False
        agent = rules.agent(token)
        return all(rules.parser.can_fetch(check, agent) for check in checks)

    def unjudged(self, url: str, token: str = BOT_NAME) -> str | None:
        """Why ``allows`` refuses ``url`` without matching it, if it does: judging it would
        cost more than ``MAX_ROBOTS_WORK``. Not the site's refusal, and the same until
        the file changes."""
        if self.rule is not RobotsRule.PARSED:
            return None
        rules, checks = self._checks(url)
        if rules.parser is None:
            return f"robots.txt too costly to judge: over {MAX_ROBOTS_WORK:,} rules to parse"
        work = rules.match_work(token)
        if work * len(checks) > MAX_ROBOTS_WORK:
            return (
                f"robots.txt too costly to judge: {work:,} rules to match"
                f" against {len(checks)} orders of the query"
            )
        return None

    def _checks(self, url: str) -> tuple[_Rules, list[str]]:
        """The file's rules, and ``url`` with the orders of its query each to be matched."""
        rules = _parse(self._key, self.body)
        if not rules.reads_queries or "&" not in url:
            return rules, [url]
        return rules, [url, *_query_orders(url)]

    def crawl_delay(self, token: str = BOT_NAME) -> float | None:
        """The Crawl-delay of the group ``token`` falls in, in seconds, if any."""
        if self.rule is not RobotsRule.PARSED:
            return None
        rules = _parse(self._key, self.body)
        if rules.parser is None:
            return None  # nothing of the origin is fetched
        delay = rules.parser.crawl_delay(rules.agent(token))
        return None if delay is None else float(delay)

    def sitemaps(self) -> tuple[str, ...]:
        if self.rule is not RobotsRule.PARSED:
            return ()
        parser = _parse(self._key, self.body).parser
        return () if parser is None else tuple(parser.sitemaps)

    def sitemap_urls(self, origin: str) -> tuple[str, ...]:
        """The file's ``Sitemap`` lines as canonical URLs (read against the file's own
        URL, as a relative one is), each once, the first ``MAX_SITEMAPS`` of its first
        ``SITEMAP_LINES_READ`` lines; a line that is no fetchable URL is passed over."""
        found: dict[str, None] = {}
        # The first lines only: each is read on the event loop, and a file of tens of
        # thousands that read as no URL (or the same one) took seconds at every visit.
        for line in self.sitemaps()[:SITEMAP_LINES_READ]:
            url = canonicalize_or_none(urljoin(f"{origin}/robots.txt", line.strip()))
            if url is not None and len(url) <= MAX_URL_LENGTH:
                found[url] = None
                if len(found) >= MAX_SITEMAPS:
                    break
        return tuple(found)

    @property
    def expires_at(self) -> float:
        return self.fetched_at + self.ttl

    def expires_in(self, now: float | None = None) -> float:
        """Seconds left before this policy must be fetched again (0 when expired)."""
        return max(0.0, self.expires_at - (time.time() if now is None else now))

    def expired(self, now: float | None = None) -> bool:
        return self.expires_in(now) <= 0.0

    def to_bytes(self) -> bytes:
        header = {
            "v": _FORMAT_VERSION,
            "origin": self.origin,
            "rule": self.rule.value,
            "fetched_at": self.fetched_at,
            "ttl": self.ttl,
            "status": self.status_code,
            "truncated": self.truncated,
            "error": self.error,
            "failure": self.failure,
            "retry_after": self.retry_after,
        }
        return json.dumps(header, separators=(",", ":")).encode() + b"\n" + self.body

    @classmethod
    def from_bytes(cls, data: bytes) -> RobotsPolicy:
        """Restore ``to_bytes()`` output. Raises ValueError for anything else."""
        head, sep, body = bytes(data).partition(b"\n")
        try:
            header: dict[str, Any] = json.loads(head)
            if not sep or header.get("v") != _FORMAT_VERSION:
                raise ValueError(f"not a version {_FORMAT_VERSION} robots policy")
            status = header["status"]
            error = header["error"]
            # Absent from the records of older pods.
            failure = header.get("failure")
            retry_after = header.get("retry_after")
            times = (header["fetched_at"], header["ttl"], retry_after or 0.0)
            if any(finite(t) is None for t in times):
                # A time that never comes (NaN, an infinity) would keep it for good.
                raise ValueError("not a robots policy: a time that is not a finite number")
            return cls(
                origin=str(header["origin"]),
                rule=RobotsRule(header["rule"]),
                fetched_at=float(header["fetched_at"]),
                ttl=float(header["ttl"]),
                status_code=None if status is None else int(status),
                body=body,
                truncated=bool(header["truncated"]),
                error=None if error is None else str(error),
                failure=None if failure is None else str(failure),
                retry_after=None if retry_after is None else float(retry_after),
            )
        except (KeyError, TypeError, AttributeError, OverflowError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a robots policy: {exc}") from exc


def _cut_at_line(body: bytes) -> bytes:
    # A line ends at LF, CRLF or a bare CR (RFC 9309's EOL).
    end = max(body.rfind(b"\n"), body.rfind(b"\r"))
    return body[: end + 1] if end >= 0 else b""


async def fetch_robots(
    client: httpx.AsyncClient,
    origin: str,
    *,
    max_bytes: int,
    ttl: float = DEFAULT_TTL,
    retry_ttl: float = RETRY_TTL,
    total_timeout: float = 30.0,
    before_hop: HopGate | None = None,
    resume: Sequence[str] = (),
    now: Callable[[], float] = time.time,
    excluded: Callable[[str], Awaitable[str | None]] | None = None,
) -> RobotsPolicy:
    """Fetch ``origin``/robots.txt and turn the answer into a policy. Never raises
    for what a site does; ``total_timeout`` bounds the requests, redirects included.

    ``before_hop`` is awaited before each redirect hop with the hops so far; what it
    raises (``RedirectPaused``, ``HopGateFailed``) goes to the caller. ``resume``
    continues a paused chain from its last hop. ``now`` is the clock ``fetched_at`` and
    a Retry-After date are read on (the fetcher's is the pods' shared one,
    ``trove_fetcher.clock``).
    ``excluded`` says why a hop's host gets no request (the operator's exclusions), if
    it does not; what it raises is carried to the caller as ``HopGateFailed``."""
    origin = origin.rstrip("/")
    fetched_at = now()
    last_status: list[int] = []
    hops = list(resume)

    def parsed(status: int, body: bytes, **more: Any) -> RobotsPolicy:
        return RobotsPolicy(
            origin=origin,
            rule=RobotsRule.PARSED,
            fetched_at=fetched_at,
            ttl=ttl,
            status_code=status,
            body=_rules_only(body),
            **more,
        )

    def fallback(
        rule: RobotsRule,
        error: str,
        failure: str | None = None,
        retry_after: float | None = None,
    ) -> RobotsPolicy:
        return RobotsPolicy(
            origin=origin,
            rule=rule,
            fetched_at=fetched_at,
            ttl=retry_ttl if rule is RobotsRule.DISALLOW_ALL else ttl,
            status_code=last_status[-1] if last_status else None,
            error=error,
            failure=failure,
            retry_after=retry_after,
        )

    try:
        async with asyncio.timeout(total_timeout) as deadline:
            url = httpx.URL(hops[-1] if hops else origin + "/robots.txt")
            for _ in range(MAX_ROBOTS_REDIRECTS + 1 - len(hops)):
                request = client.build_request(
                    "GET",
                    url,
                    headers={"Accept": "text/plain,*/*;q=0.5", "Accept-Encoding": ACCEPT_ENCODING},
                )
                try:
                    response = await client.send(request, stream=True)
                except (httpx.InvalidURL, idna.IDNAError, httpx.RemoteProtocolError) as exc:
                    if isinstance(exc, httpx.RemoteProtocolError) and not unusable_location(exc):
                        raise
                    # A redirect to a Location no request can go to (``mailto:``, a port
                    # given twice): as one to another scheme, no file is there.
                    error = f"redirected to an unusable Location: {exc}"[:500]
                    return fallback(RobotsRule.ALLOW_ALL, error)
                try:
                    status = response.status_code
                    last_status.append(status)
                    if status in REDIRECT_STATUSES and response.headers.get("location"):
                        url = redirect_url(url, response.headers["location"])
                        if url.scheme not in ("http", "https"):
                            return fallback(RobotsRule.ALLOW_ALL, f"redirected to {url.scheme}")
                        if not url.host:
                            # As a chain too long: no file can be read there.
                            error = f"redirected to {url}: no host"[:500]
                            return fallback(RobotsRule.ALLOW_ALL, error)
                        if len(hops) >= MAX_ROBOTS_REDIRECTS:
                            break
                        # The host as a rule names it, an address however it is
                        # written: ``1572395042`` is the excluded 93.184.216.34.
                        try:
                            host = domain_of(str(url))
                        except InvalidURL:
                            # A host httpx reads and no rule can name (``http://./``):
                            # as a chain with no host, no file can be read there.
                            error = f"redirected to {str(url)[:400]}: no host"
                            return fallback(RobotsRule.ALLOW_ALL, error)
                        refusal = await _refusal(excluded, host)
                        if refusal is not None:
                            error = f"redirected to {url}: {refusal}"[:500]
                            return parsed(status, EXCLUDED_RULES, error=error)
                        too_long = overlong_target(url)
                        if too_long is not None:
                            # As a Location no request can go to: no file is there.
                            return fallback(RobotsRule.ALLOW_ALL, too_long)
                        hops.append(str(url))
                        if before_hop is not None:
                            await response.aclose()  # the gap runs from the end of this one
                            await pass_gate(before_hop, hops, deadline)
                        continue
                    if is_challenge(status, response.headers):
                        # A bot challenge is no robots.txt, and the host's defence: back off.
                        error = f"HTTP {status}: a bot challenge"
                        return fallback(RobotsRule.DISALLOW_ALL, error, "blocked_captcha")
                    if 200 <= status < 300:
                        reader = BodyReader(max_bytes=max_bytes)
                        body = await reader.read(response)
                        if reader.truncated:
                            return parsed(status, _cut_at_line(body), truncated=True)
                        return parsed(status, body)
                    if status == 429 or 500 <= status < 600:
                        return fallback(
                            RobotsRule.DISALLOW_ALL,
                            f"HTTP {status}",
                            "rate_limited" if status == 429 else "server_error",
                            retry_after(response.headers, now=datetime.fromtimestamp(now(), UTC)),
                        )
                    return fallback(RobotsRule.ALLOW_ALL, f"HTTP {status}")
                finally:
                    await response.aclose()
            return fallback(RobotsRule.ALLOW_ALL, f"more than {MAX_ROBOTS_REDIRECTS} redirects")
    except (RedirectPaused, HopGateFailed, NetworkAway):
        raise  # the caller's to handle: not the site's answer
    except (TimeoutError, httpx.TimeoutException):
        error = f"timeout fetching {origin}/robots.txt"
        return fallback(RobotsRule.DISALLOW_ALL, error, "timeout")
    except BlockedAddress as exc:
        return fallback(RobotsRule.DISALLOW_ALL, f"blocked address: {exc}")
    except httpx.TransportError as exc:  # refused, reset, a bad TLS handshake: the host's
        return fallback(RobotsRule.DISALLOW_ALL, error_text(exc), "network_error")
    except (httpx.HTTPError, httpx.InvalidURL, FetcherError) as exc:
        return fallback(RobotsRule.DISALLOW_ALL, error_text(exc))
    except Exception as exc:
        log.exception("unexpected error fetching %s/robots.txt", origin)
        error = f"unexpected error: {error_text(exc)}"[:500]
        return fallback(RobotsRule.DISALLOW_ALL, error)


async def _refusal(
    excluded: Callable[[str], Awaitable[str | None]] | None, host: str
) -> str | None:
    if excluded is None:
        return None
    try:
        return await excluded(host)
    except Exception as exc:  # the broker's trouble, never the site's answer
        raise HopGateFailed(f"exclusions check: {exc}") from exc
