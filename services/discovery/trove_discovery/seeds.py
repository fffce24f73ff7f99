"""Seed messages: what an operator sends to ``trove.seeds``, turned into crawl requests.

Accepted forms (the payload is UTF-8; a leading BOM is ignored):

* a plain URL, as ``nats pub trove.seeds https://example.org/`` sends it;
* several URLs, one a line (LF, CRLF or CR) or apart on a line (spaces, tabs: no URL
  holds one, and the URL parser drops tabs, so "https://a.example\tb.example" was
  another host); blank lines and lines starting with ``#`` are skipped, and a word
  starting with ``#`` ends its line (a ``#`` inside a URL is part of it, as in any
  URL). A line that is not UTF-8 is rejected alone;
* a JSON array of URL strings;
* a JSON object: ``{"url": "..."}`` or ``{"urls": [...]}`` with the options
  ``priority`` (integer -100..100, default 0), ``scope`` ("host", "domain", "pattern"
  or "open"; default ``TROVE_DEFAULT_SCOPE``), ``pattern`` (a regular expression of at
  most 500 characters, required by scope "pattern", which it implies when ``scope`` is
  absent; matched by RE2, so no backreferences or lookaround), ``force`` (boolean) and
  ``max_depth`` (integer 0..100, default ``TROVE_MAX_DEPTH``). Unknown keys are
  refused, so that a typo is not silently a default.

``parse_seeds`` never raises: every problem becomes a ``RejectedSeed`` with a reason
for the operator. A message with more than ``MAX_SEEDS_PER_MESSAGE`` items has the rest
rejected in one ``RejectedSeed`` (not one each: a megabyte of short lines would be half
a million events); a URL repeated in one message is accepted once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from trove_discovery.errors import InvalidSeed, InvalidURL
from trove_discovery.replies import (
    MAX_RAW_LENGTH,
    Refused,
    listed,
    read_json,
    refused_item,
    reply_lines,
)
from trove_discovery.scope import pattern_error
from trove_schema.events import Provenance, Scope, ScopeKind
from trove_schema.exclusions import NO_EXCLUSIONS, Exclusions
from trove_schema.seed_text import BYTE_LINE_ENDS, seed_words
from trove_schema.settings import DiscoverySettings
from trove_schema.urls import (
    canonicalize,
    domain_of,
    is_private_host,
    masked,
    registrable_domain,
)

MAX_SEEDS_PER_MESSAGE = 10_000
MAX_PATTERN_LENGTH = 500

_JSON_KEYS = frozenset({"url", "urls", "priority", "scope", "pattern", "force", "max_depth"})


@dataclass(frozen=True, slots=True)
class SeedRequest:
    """One accepted seed: its canonical URL and where the crawl from it may go."""

    url: str
    #: The URL as it was sent (whitespace around it removed).
    original: str
    scope: Scope
    priority: int
    force: bool
    provenance: Provenance


#: Something sent as a seed that was not accepted, and why.
RejectedSeed = Refused


@dataclass(frozen=True, slots=True)
class SeedBatch:
    accepted: tuple[SeedRequest, ...] = ()
    rejected: tuple[RejectedSeed, ...] = ()


@dataclass(frozen=True, slots=True)
class _Options:
    kind: ScopeKind
    pattern: str
    max_depth: int
    priority: int = 0
    force: bool = False


def parse_seeds(
    data: bytes,
    *,
    origin: str,
    settings: DiscoverySettings,
    exclusions: Exclusions = NO_EXCLUSIONS,
) -> SeedBatch:
    """Parse one seed message into accepted requests and rejections (never raises)."""
    garbled: list[RejectedSeed] = []
    try:
        text = data.decode("utf-8").removeprefix("\ufeff").strip()
    except UnicodeDecodeError as exc:
        if data.removeprefix(b"\xef\xbb\xbf").lstrip()[:1] in (b"{", b"["):
            raw = data[:MAX_RAW_LENGTH].decode("utf-8", "replace")
            return _rejected(raw, f"not UTF-8 text ({exc.reason} at byte {exc.start})")
        text, garbled = _utf8_lines(data)
    if not text:
        return (
            SeedBatch(rejected=tuple(garbled)) if garbled else _rejected("", "empty seed message")
        )
    candidates: list[object]
    if text[0] in "{[" and not garbled:
        document, refusal = read_json(text)
        if refusal is not None:
            return _rejected(text, refusal)
        try:
            candidates, options = _from_json(document, settings)
        except InvalidSeed as exc:
            return _rejected(text, exc.reason)
    else:
        candidates = list(seed_words(text))
        try:
            options = _default_options(settings)
        except InvalidSeed as exc:
            return _rejected(text, exc.reason)
    if not candidates:
        return (
            SeedBatch(rejected=tuple(garbled))
            if garbled
            else _rejected(text, "no URLs in seed message")
        )
    batch = _build(candidates, options, origin=origin, settings=settings, exclusions=exclusions)
    return replace(batch, rejected=(*garbled, *batch.rejected)) if garbled else batch


def _utf8_lines(data: bytes) -> tuple[str, list[RejectedSeed]]:
    """A text message that is not UTF-8 throughout: its UTF-8 lines, and each other
    line rejected (a pasted list with one Latin-1 line loses that line, not the list)."""
    kept: list[str] = []
    garbled: list[RejectedSeed] = []
    # Those past the limit counted, not kept: tens of MB of bad lines are one refusal.
    unlisted = 0
    for line in BYTE_LINE_ENDS.split(data.removeprefix(b"\xef\xbb\xbf")):
        try:
            kept.append(line.decode("utf-8"))
        except UnicodeDecodeError as exc:
            if len(garbled) < MAX_SEEDS_PER_MESSAGE:
                raw = line[:MAX_RAW_LENGTH].decode("utf-8", "replace").strip()
                reason = f"not UTF-8 text ({exc.reason} at byte {exc.start} of the line)"
                garbled.append(RejectedSeed(raw, reason))
            else:
                unlisted += 1
    if unlisted:
        reason = f"more than {MAX_SEEDS_PER_MESSAGE} lines not UTF-8: {unlisted} more not listed"
        garbled.append(RejectedSeed("", reason))
    return "\n".join(kept).strip(), garbled


def _build(
    candidates: list[object],
    options: _Options,
    *,
    origin: str,
    settings: DiscoverySettings,
    exclusions: Exclusions,
) -> SeedBatch:
    provenance = Provenance(kind="seed", origin=origin)
    max_length = settings.max_url_length
    accepted: list[SeedRequest] = []
    rejected: list[RejectedSeed] = []
    seen: set[str] = set()
    rest = candidates[MAX_SEEDS_PER_MESSAGE:]
    for candidate in candidates[:MAX_SEEDS_PER_MESSAGE]:
        if not isinstance(candidate, str):
            rejected.append(RejectedSeed(_raw(candidate), "not a URL string"))
            continue
        original = candidate.strip()
        try:
            url = canonicalize(original, max_length=max_length)
        except InvalidURL as exc:
            rejected.append(RejectedSeed(original, exc.reason))
            continue
        host = domain_of(url)
        if is_private_host(host, settings.allowed_networks, settings.nat64_prefixes):
            rejected.append(RejectedSeed(original, f"host {host} is a private address"))
            continue
        refusal = exclusions.refusal(host)
        if refusal is not None:
            rejected.append(RejectedSeed(original, refusal))
            continue
        if url in seen:
            continue
        seen.add(url)
        accepted.append(
            SeedRequest(
                url=url,
                original=original,
                scope=_scope(options, host),
                priority=options.priority,
                force=options.force,
                provenance=provenance,
            )
        )
    if rest:
        reason = (
            f"more than {MAX_SEEDS_PER_MESSAGE} URLs in one message: "
            f"{len(rest)} from this one on not read"
        )
        rejected.append(RejectedSeed(_raw(rest[0]), reason))
    return SeedBatch(accepted=tuple(accepted), rejected=tuple(rejected))


def _raw(candidate: object) -> str:
    return (
        candidate.strip()
        if isinstance(candidate, str)
        else json.dumps(candidate, ensure_ascii=False)
    )


def _scope(options: _Options, host: str) -> Scope:
    if options.kind is ScopeKind.HOST:
        value = host
    elif options.kind is ScopeKind.DOMAIN:
        value = registrable_domain(host)
    elif options.kind is ScopeKind.PATTERN:
        value = options.pattern
    else:
        value = ""
    return Scope(kind=options.kind, value=value, max_depth=options.max_depth)


def _default_options(settings: DiscoverySettings) -> _Options:
    kind = ScopeKind(settings.default_scope)
    if kind is ScopeKind.PATTERN:
        raise InvalidSeed(
            'the default scope is "pattern" and needs a "pattern": send a JSON object'
        )
    return _Options(kind=kind, pattern="", max_depth=settings.max_depth)


def _from_json(document: Any, settings: DiscoverySettings) -> tuple[list[object], _Options]:
    if isinstance(document, list):
        return list(document), _default_options(settings)
    if not isinstance(document, dict):  # pragma: no cover - json of "{"/"[" is one of both
        raise InvalidSeed("a JSON seed message is an object or an array")
    unknown = sorted(set(document) - _JSON_KEYS)
    if unknown:
        names = ", ".join(repr(key) for key in unknown)
        known = ", ".join(sorted(_JSON_KEYS))
        raise InvalidSeed(f"unknown key(s) {names}; known keys are {known}")
    if ("url" in document) == ("urls" in document):
        raise InvalidSeed('give exactly one of "url" and "urls"')
    if "url" in document:
        if not isinstance(document["url"], str):
            raise InvalidSeed('"url" must be a string')
        candidates: list[object] = [document["url"]]
    else:
        if not isinstance(document["urls"], list):
            raise InvalidSeed('"urls" must be an array of strings')
        candidates = list(document["urls"])
    return candidates, _options(document, settings)


def _options(document: dict[str, Any], settings: DiscoverySettings) -> _Options:
    priority = _integer(document, "priority", default=0, low=-100, high=100)
    max_depth = _integer(document, "max_depth", default=settings.max_depth, low=0, high=100)
    force = document.get("force", False)
    if not isinstance(force, bool):
        raise InvalidSeed('"force" must be true or false')
    pattern = document.get("pattern")
    scope = document.get("scope")
    if scope is None:
        scope = "pattern" if pattern is not None else settings.default_scope
    try:
        kind = ScopeKind(scope)
    except ValueError:
        choices = ", ".join(kind.value for kind in ScopeKind)
        raise InvalidSeed(f'"scope" must be one of {choices}, not {scope!r}') from None
    if kind is ScopeKind.PATTERN:
        pattern = _pattern(pattern)
    elif pattern is not None:
        raise InvalidSeed(f'"pattern" is only for scope "pattern", not {kind.value!r}')
    return _Options(
        kind=kind, pattern=pattern or "", max_depth=max_depth, priority=priority, force=force
    )


def _integer(document: dict[str, Any], key: str, *, default: int, low: int, high: int) -> int:
    value = document.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidSeed(f'"{key}" must be an integer from {low} to {high}, not {value!r}')
    return value


def _pattern(pattern: object) -> str:
    if pattern is None or pattern == "":
        raise InvalidSeed('scope "pattern" needs a "pattern" (a regular expression)')
    if not isinstance(pattern, str):
        raise InvalidSeed('"pattern" must be a string')
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise InvalidSeed(f'"pattern" is longer than {MAX_PATTERN_LENGTH} characters')
    error = pattern_error(pattern)
    if error is not None:
        raise InvalidSeed(
            f'"pattern" is not a valid regular expression: {error} (patterns are matched '
            "in linear time by RE2: no backreferences, lookahead or lookbehind)"
        )
    return pattern


def _rejected(raw: str, reason: str) -> SeedBatch:
    return SeedBatch(rejected=(RejectedSeed(raw, reason),))


def reply_text(batch: SeedBatch) -> str:
    """A short summary for the reply to ``nats req trove.seeds ...``."""
    return reply_lines(
        "accepted",
        [seed.url for seed in batch.accepted],
        [(seed.raw, seed.reason) for seed in batch.rejected],
    )


def reply(request: bytes, batch: SeedBatch) -> bytes:
    """The answer to a seed request, in kind: JSON to JSON, words to someone typing URLs."""
    as_json = request.lstrip()[:1] in (b"{", b"[")
    return reply_json(batch) if as_json else reply_text(batch).encode()


def reply_json(batch: SeedBatch) -> bytes:
    """The same summary as JSON, for programs; lists cut as ``replies.listed`` cuts them
    (``truncated`` says so; the counts are whole)."""
    accepted, more_accepted = listed(
        {
            "url": seed.url,
            "original": masked(seed.original),
            "scope": seed.scope.model_dump(mode="json"),
            "priority": seed.priority,
            "force": seed.force,
        }
        for seed in batch.accepted
    )
    rejected, more_rejected = listed(refused_item(seed) for seed in batch.rejected)
    body = {
        "accepted_count": len(batch.accepted),
        "rejected_count": len(batch.rejected),
        "accepted": accepted,
        "rejected": rejected,
        "truncated": more_accepted or more_rejected,
    }
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
