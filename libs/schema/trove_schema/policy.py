"""Per-host policy learned from evidence and priors: a pure fold over attempts.

The fetcher folds each attempt into the host's record (KV) right after it and acts on
the result; the recorder folds the same ``CrawlCompleted`` events into
``host_policies`` for the operator. Both build the ``Observation`` from the event
(``Observation.of``, through ``heuristics.audit``) and run the same ``observe``, so they
agree on pages' attempts. The fetcher also folds what no ``CrawlCompleted`` tells: a
robots.txt's answer (a 429, a challenge, a timeout) and a timeline poll's last one; the
record in ``trove_domains`` has them, ``host_policies`` does not. What a host's record
learns:

* **Which strategy works**, per URL class (``priors.toml``): discounted counts of
  usable content (success) and of the wrong kind of answer (``wrong_tool``,
  ``empty_content``), seeded with the class's priors as pseudo-attempts. Only those
  outcomes teach the choice: a timeout, a reset, a 5xx, a 429, a ban or a challenge
  says how the host is, not which strategy fits it, and counting them would teach a
  healthy host's strategy that it fails (and answer a site's defences with another
  strategy, which Trove never does).
* **When to leave it alone**: failures in a row (refused, timed out, 5xx) pause the
  whole host, doubling; a 429/503 backs off, doubling, unless it says for how long
  (Retry-After, honoured exactly at the first refusal, doubled with each refusal in a
  row after it: within ``_rate_run`` of the last escalation); answers to requests that were
  already in flight when the host was last escalated do not escalate it again; a ban or
  a challenge pauses it for ``ban_pause``. A healthy answer forgives the levels.
* **How gently to go**: the gap grows with the host's recent response time (a median).
  A host that refuses pages with 429s at the gap (a rate limiter admitting one request
  every few minutes) sets a **pace**: when a run of refusals ends, the spacing that was
  let through (from the start of the last answered request to this one's), or twice
  the longest spacing refused when that is less, with a margin. It is a floor of the
  gap that eases by ``PACE_EASE`` with each answer after, so a limiter that loosens is
  found again; one that does not refuses once in a few dozen requests instead of most
  of them. One run sets it up to ``max_gap``; a run refused at a pace takes it up to
  ``rate_max``. Only 429s to requests asked at about the gap teach it: a 503 is a host
  overloaded or down, a refusal after the host was left alone is no spacing refused,
  refusals at spacings past ``rate_max`` are a quota, which the pauses wait out, and a
  timeline poll's answers are its API's.
* **Whether validators help**: conditional requests answered 304 versus 200 with the
  same body.
* **Whether it moved**: a host that answers ``MOVE_CONFIRMATIONS`` requests in a row,
  of different parts of the site (first path segments), its home page among them,
  with a permanent redirect (301, 308) to the same path on one other origin (``www.``
  to the bare name, an old domain to a new one) has moved there. Redirects of one part
  (``/files/`` sent to a download host), or of several while the home page stays, are
  not the host moving: its other pages are still its own. Its
  pages are asked for at their new address without a request to the old one
  (``moved_to``), until ``move_recheck`` has passed and the next request finds out
  whether it still redirects. Any answer of its own, or a redirect that does not keep
  the path, forgets it.

The record is small and bounded (one estimate per URL class and strategy), and it
travels as compact JSON that older and newer pods both read (``to_json``/``from_json``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import statistics
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from trove_schema.errors import InvalidPriors
from trove_schema.events import CrawlCompleted, CrawlOutcome, LinkKind
from trove_schema.heuristics import Audit, audit

if TYPE_CHECKING:
    from trove_schema.settings import CommonSettings
from trove_schema.urls import canonicalize_or_none

DEFAULT_PRIORS_FILE = Path(__file__).with_name("priors.toml")
STRATEGIES = ("http", "activitypub")

#: Outcomes that say the strategy was the wrong one for the URL.
STRATEGY_FAILURES = frozenset({"wrong_tool", "empty_content"})
#: Outcomes that say the host is unwell, whatever the strategy.
HOST_FAILURES = frozenset({"network_error", "timeout", "server_error"})
#: Estimates a record keeps (URL classes x strategies); a stranger's event naming new
#: strategies cannot grow it past this.
MAX_ESTIMATES = 32
#: Levels past this would only hit the caps: keeps 2**level small.
MAX_LEVEL = 32
#: The counts a record's levels are read within: a level written past ``MAX_LEVEL`` (a
#: hand-made or damaged record) made the next 429's pause 2.0**5000, an OverflowError
#: that lost the pause and stopped the recorder's batch.
_LEVELS = frozenset({"risk_level", "rate_level", "move_votes"})
#: The largest number a record's times, durations and counts are read as: a time in
#: the year 5138, past any a fold writes. A finite 1e300 overflowed the recorder's
#: timestamps, and two answer times near a float's largest had an infinite median.
_LARGEST = 1e11
#: Characters of an estimate's key (``class:strategy``) a record is read with; a URL
#: class's name is at most ``MAX_CLASS_NAME``, so no key a fold writes is cut.
ESTIMATE_KEY_LENGTH = 80
MAX_CLASS_NAME = 40

#: Validator counts are halved past this, so a host that changes its ways is re-learned.
MAX_VALIDATOR_COUNT = 1000
#: A host's response time is the median of its last answers: one slow answer (the
#: host's hiccup, or a stall of the pod that timed it, which lands in the measurement
#: too) does not lengthen the gap, and a host that turns slow is seen after three.
RECENT_ANSWERS = 5
JITTER = 0.1
#: Decimals the fold keeps: counts to 1e-4 of an attempt, times to the millisecond.
COUNT_DIGITS = 4
#: Redirects in a row, each keeping its path, to one other origin, from as many parts of
#: the site, the home page one of them, before a host is taken to have moved there: two,
#: so that one page (or one section) moved elsewhere is not the whole host. Sections
#: moved to a subdomain (``/docs/``, ``/api/``) while the home page stays would make
#: every other page "moved" to addresses that do not exist, and end its re-crawls.
MOVE_CONFIRMATIONS = 2
#: A pace is set this much above the spacing a run of refusals let through: a limiter
#: that says exactly when to come back (Retry-After) lets through a request at the very
#: end of its window, and a pace at that spacing is refused again at its first ease.
PACE_MARGIN = 1.25
#: Each answer after a pace was set eases it by this: the margin is spent in about 45
#: answers, so a limiter that keeps its window refuses about once in fifty requests,
#: where without a pace it refused the request after each answer; one that loosens
#: tenfold from a ten-minute window is asked near its new pace within two days.
PACE_EASE = 0.995
#: Redirects that say a page moved for good; a 302 or 307 is for now.
PERMANENT_REDIRECTS = frozenset({301, 308})
TIME_DIGITS = 3


@dataclass(frozen=True, slots=True)
class UrlClass:
    """A kind of URL (``priors.toml``) and the strategies believed to work for it."""

    name: str
    extensions: frozenset[str] = frozenset()
    #: The class's path expressions as one alternation (None: no path rule).
    paths: re.Pattern[str] | None = None
    #: strategy -> importance (0..1) of the prior that it works.
    priors: Mapping[str, float] = field(default_factory=dict)

    def matches(self, path: str, extension: str) -> bool:
        if not self.extensions and self.paths is None:
            return True
        if extension in self.extensions:
            return True
        return self.paths is not None and self.paths.search(path) is not None


@dataclass(frozen=True, slots=True)
class Priors:
    #: Pseudo-attempts a prior of importance 1 is worth.
    weight: float
    classes: tuple[UrlClass, ...]

    def url_class(self, url: str) -> str:
        parts = urlsplit(url)
        path = parts.path or "/"
        last = path.rsplit("/", 1)[-1]
        extension = last.rsplit(".", 1)[1].lower() if "." in last[1:] else ""
        for cls in self.classes:
            if cls.matches(path, extension):
                return cls.name
        return "page"

    def seed(self, url_class: str, strategy: str) -> tuple[float, float]:
        """The pseudo-counts (successes, failures) a host starts from."""
        for cls in self.classes:
            if cls.name == url_class:
                return (cls.priors.get(strategy, 0.0) * self.weight, 0.0)
        return (0.0, 0.0)

    def strategies(self, url_class: str) -> tuple[str, ...]:
        for cls in self.classes:
            if cls.name == url_class:
                return tuple(cls.priors)
        return ()


def load_priors(path: Path | None = None) -> Priors:
    """The priors of ``path`` (the shipped ``priors.toml`` when None)."""
    return _load_priors(path or DEFAULT_PRIORS_FILE)


@functools.lru_cache(maxsize=8)
def _load_priors(path: Path) -> Priors:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidPriors(f"{path}: {exc}") from exc
    try:
        return _parse_priors(raw)
    except (TypeError, ValueError, re.error) as exc:
        raise InvalidPriors(f"{path}: {exc}") from exc


def _parse_priors(raw: dict[str, Any]) -> Priors:
    weight = float(raw.get("weight", 8.0))
    if not 0.0 <= weight <= 1000.0:
        raise ValueError(f"weight {weight:g} is not within 0..1000")
    classes = []
    for entry in raw.get("class", []):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ValueError("each [[class]] needs a name")
        name: str = entry["name"]
        if not 0 < len(name) <= MAX_CLASS_NAME or ":" in name:
            # A longer one's estimates were cut when read back, and never learned.
            raise ValueError(
                f"class {name[:60]!r}: a name of 1 to {MAX_CLASS_NAME} characters, no ':'"
            )
        priors = entry.get("priors", {})
        if not isinstance(priors, dict):
            raise TypeError(f"class {name}: priors must be a table")
        for strategy, importance in priors.items():
            if not isinstance(importance, int | float) or not 0.0 <= importance <= 1.0:
                raise ValueError(f"class {name}: importance of {strategy} is not within 0..1")
        classes.append(
            UrlClass(
                name=name,
                extensions=frozenset(
                    str(e).lower().lstrip(".") for e in entry.get("extensions", [])
                ),
                paths=_alternation([str(p) for p in entry.get("paths", [])]),
                priors={str(s): float(i) for s, i in priors.items()},
            )
        )
    if not classes:
        raise ValueError("no [[class]]")
    return Priors(weight=weight, classes=tuple(classes))


def _alternation(patterns: list[str]) -> re.Pattern[str] | None:
    for pattern in patterns:
        re.compile(pattern)  # each on its own, so an error names the one at fault
    return re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None


def _default_priors() -> Priors:
    return load_priors()


@dataclass(frozen=True, slots=True, kw_only=True)
class LearningConfig:
    #: The configured gap between two requests to a host, and its ceiling.
    min_gap: float = 10.0
    max_gap: float = 120.0
    #: A host's gap is at least this many times its recent response time.
    response_factor: float = 10.0
    #: First pause of a host that fails (refuses, times out, 5xx), doubled per failure in a row.
    pause_base: float = 60.0
    pause_max: float = 86_400.0
    #: First pause after a 429/503 without Retry-After, doubled per answer in a row.
    rate_base: float = 60.0
    #: Longest pause a 429/503 (with or without Retry-After) may cause.
    rate_max: float = 3_600.0
    #: Pause after a ban or a challenge page.
    ban_pause: float = 86_400.0
    #: How long a ban keeps the host from any exploration.
    ban_memory: float = 30 * 86_400.0
    #: Each strategy-relevant outcome of a URL class weighs its older ones by this: the
    #: last ~7 outcomes carry most of the estimate, so a site that changes is re-learned
    #: within a few fetches.
    discount: float = 0.85
    #: How long a host learned to have moved is not asked: then its next request finds
    #: out whether it still redirects.
    move_recheck: float = 7 * 86_400.0
    #: At most one choice in this many (per host) tries a strategy that is not the best.
    explore_every: int = 50
    #: ... and only while the best strategy yields usable content less often than this:
    #: a host served well (~0.93 at the discount's ceiling) is never asked another way,
    #: which would cost it a request (and the page a second one) for nothing.
    explore_below: float = 0.9
    priors: Priors = field(default_factory=_default_priors)

    @classmethod
    def from_settings(cls, settings: CommonSettings) -> LearningConfig:
        """From a service's settings: the gap, back-off and learning bounds every service
        reads alike (the recorder folds the same events for the operator)."""
        return cls(
            min_gap=settings.min_domain_delay_seconds,
            max_gap=settings.max_domain_delay_seconds,
            response_factor=settings.gap_response_factor,
            pause_base=settings.host_pause_seconds,
            pause_max=settings.host_pause_max_seconds,
            rate_base=settings.rate_pause_seconds,
            rate_max=settings.max_backoff_seconds,
            ban_pause=settings.ban_pause_seconds,
            explore_every=settings.explore_every,
            move_recheck=settings.host_move_recheck_seconds,
            priors=load_priors(settings.priors_file),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """What one attempt says about its host (from the attempt's event)."""

    started: float
    at: float
    url: str
    strategy: str
    success: bool
    is_banned: bool
    error_type: str | None
    status: int | None
    retry_after: float | None
    duration_ms: int | None
    conditional: bool = False
    #: The body is the one the page's previous visit saw (same content hash).
    unchanged: bool = False
    #: A redirect to another host: the origin it went to when it kept the path and
    #: query (``https://example.org``), "" when it did not; None for any other answer.
    moved_to: str | None = None

    @classmethod
    def of(cls, event: CrawlCompleted, verdict: Audit | None = None) -> Observation:
        """``verdict`` is ``audit(event)`` when the caller has it already."""
        verdict = verdict if verdict is not None else audit(event)
        success, error_type = verdict.success, verdict.error_type
        if verdict.is_banned and success:
            # A challenge served with a 200 is still a challenge, never content.
            success, error_type = False, "blocked_captcha"
        elif success and event.shell:
            success, error_type = False, "wrong_tool"
        previous = event.history.content_hash if event.history is not None else None
        return cls(
            started=event.started_at.timestamp(),
            at=event.completed_at.timestamp(),
            url=event.url,
            strategy=event.fetcher,
            success=success,
            is_banned=verdict.is_banned,
            error_type=error_type,
            status=event.status_code,
            retry_after=event.retry_after,
            duration_ms=event.duration_ms,
            conditional=event.conditional,
            unchanged=event.content_hash is not None and event.content_hash == previous,
            moved_to=_redirected_to(event),
        )


@dataclass(frozen=True, slots=True)
class Choice:
    strategy: str
    #: only, prior, learned, explore
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class HostPolicy:
    #: "<url class>:<strategy>" -> (successes, failures), discounted counts.
    estimates: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    paused_until: float = 0.0
    pause_reason: str | None = None
    risk_level: int = 0
    rate_level: int = 0
    escalated_at: float = 0.0
    #: The median of ``recent_ms``; what the gap follows.
    response_ms: float | None = None
    #: The last ``RECENT_ANSWERS`` answer times (ms), oldest first.
    recent_ms: tuple[float, ...] = ()
    attempts: int = 0
    last_attempt_at: float = 0.0
    #: Conditional requests answered 304 / answered 200 with the same content.
    validators_honoured: int = 0
    validators_ignored: int = 0
    #: When the host last banned Trove or served it a challenge (0: never).
    banned_at: float = 0.0
    #: The origin the host moved to, and when that was last seen (``MOVE_CONFIRMATIONS``).
    moved_to: str | None = None
    moved_at: float = 0.0
    #: The origin its last redirects kept the path to, and how many in a row.
    move_origin: str | None = None
    move_votes: int = 0
    #: The part of the site (first path segment) the last of them came from.
    move_section: str | None = None
    #: 1 when the home page (the root section) was among them.
    move_root: int = 0
    #: The spacing (s) the host's rate limit was learned to ask between two requests'
    #: starts (0: none): a floor of its gap.
    pace: float = 0.0
    #: When the last request the host answered started (its 429s measured from it).
    answered_at: float = 0.0
    #: The longest spacing since then at which it refused with a 429, its Retry-After
    #: added (0: none, and no run of refusals under way).
    refused_after: float = 0.0

    def to_json(self) -> dict[str, object]:
        """Compact: fields at their default are left out. Lossless: ``observe`` rounds its
        numbers as this does, so a pod that reads the record back folds on exactly what
        the recorder holds in memory, and a batch's cut changes nothing."""
        out: dict[str, object] = {}
        if self.estimates:
            out["estimates"] = {
                key: [round(s, COUNT_DIGITS), round(f, COUNT_DIGITS)]
                for key, (s, f) in sorted(self.estimates.items())
            }
        if self.recent_ms:
            out["recent_ms"] = [round(ms, TIME_DIGITS) for ms in self.recent_ms]
        for name, default in _SCALARS.items():
            value = getattr(self, name)
            if value != default:
                out[name] = round(value, TIME_DIGITS) if isinstance(value, float) else value
        return out

    @classmethod
    def from_json(cls, raw: object) -> HostPolicy:
        """Whatever a pod of any version wrote: unknown fields ignored, bad ones defaulted."""
        if isinstance(raw, bytes | bytearray | str):
            try:
                raw = json.loads(raw)
            except ValueError:
                return cls()
        if not isinstance(raw, dict):
            return cls()
        values: dict[str, Any] = {}
        for name, default in _SCALARS.items():
            value = _coerce(raw.get(name), default, text=_TEXT_FIELDS.get(name, 0))
            if name in _LEVELS and value is not None:
                value = min(value, MAX_LEVEL)
            if value is not None or default is None:
                values[name] = value
        return cls(
            estimates=_read_estimates(raw.get("estimates")),
            recent_ms=_read_recent(raw.get("recent_ms")),
            **values,
        )


_SCALARS: dict[str, Any] = {
    "paused_until": 0.0,
    "pause_reason": None,
    "risk_level": 0,
    "rate_level": 0,
    "escalated_at": 0.0,
    "response_ms": None,
    "attempts": 0,
    "last_attempt_at": 0.0,
    "validators_honoured": 0,
    "validators_ignored": 0,
    "banned_at": 0.0,
    "moved_to": None,
    "moved_at": 0.0,
    "move_origin": None,
    "move_votes": 0,
    "move_section": None,
    "move_root": 0,
    "pace": 0.0,
    "answered_at": 0.0,
    "refused_after": 0.0,
}
#: Text fields and their longest value (an origin holds a host name of up to 253).
_TEXT_FIELDS = {"pause_reason": 64, "moved_to": 300, "move_origin": 300, "move_section": 300}


def _coerce(value: object, default: Any, *, text: int = 0) -> Any:
    """``value`` as the type of ``default`` (text of at most ``text`` characters when
    ``text``); None when it cannot be."""
    if value is None or isinstance(value, bool):
        return None
    if text:
        return value[:text] if isinstance(value, str) else None
    if not isinstance(value, int | float):
        return None
    try:
        if not math.isfinite(value):
            return None
    except OverflowError:  # an integer past a float's range
        return None
    if isinstance(default, int):
        return max(0, min(int(value), 2**31 - 1))
    return max(0.0, min(float(value), _LARGEST))


def _read_recent(raw: object) -> tuple[float, ...]:
    if not isinstance(raw, list):
        return ()
    times = (_coerce(value, 0.0) for value in raw[-RECENT_ANSWERS:])
    return tuple(ms for ms in times if ms is not None)


def _read_estimates(raw: object) -> dict[str, tuple[float, float]]:
    if not isinstance(raw, dict):
        return {}
    estimates: dict[str, tuple[float, float]] = {}
    for key, pair in raw.items():
        if len(estimates) >= MAX_ESTIMATES:
            break
        if not isinstance(key, str) or ":" not in key or not isinstance(pair, list | tuple):
            continue
        counts = [_coerce(v, 0.0) for v in pair[:2]]
        if len(counts) == 2 and counts[0] is not None and counts[1] is not None:
            estimates[key[:ESTIMATE_KEY_LENGTH]] = (counts[0], counts[1])
    return estimates


def _rate_run(config: LearningConfig) -> float:
    """How long after the last escalation a 429/503 is still one more in a row: twice the
    longest rate pause or the longest gap, so that neither a host's gap (a Crawl-delay
    of minutes) nor a late schedule can end a run, which would let a limiter answering
    every request "Retry-After: 1" be asked once a gap for ever."""
    return 2 * max(config.rate_max, config.max_gap)


def observe(policy: HostPolicy, observation: Observation, config: LearningConfig) -> HostPolicy:
    """The host's policy once ``observation`` is known."""
    obs = observation
    estimates = dict(policy.estimates)
    teaches = obs.success or obs.error_type in STRATEGY_FAILURES
    if teaches and not obs.is_banned:
        _learn(estimates, config.priors.url_class(obs.url), obs.strategy, obs.success, config)

    paused_until, reason = policy.paused_until, policy.pause_reason
    risk, rate, escalated_at, banned_at = (
        policy.risk_level,
        policy.rate_level,
        policy.escalated_at,
        policy.banned_at,
    )

    def pause(wait: float, why: str) -> None:
        # The reason shown is the one of the pause that ends last: a timeout after a
        # ban does not make the ban's day-long pause look like a timeout's.
        nonlocal paused_until, reason
        if obs.at + wait > paused_until:
            paused_until, reason = obs.at + wait, why

    # Answers to requests that left before the last escalation say nothing new: the
    # host was already being left alone when they went out.
    in_flight = obs.started < policy.escalated_at
    if obs.is_banned and obs.error_type not in ("rate_limited", "blocked_403"):
        pause(config.ban_pause, obs.error_type or "banned")
        banned_at, escalated_at = obs.at, max(escalated_at, obs.at)
    elif obs.error_type == "blocked_403":
        # A 403 without a challenge's signature may be one private page as well as the
        # host refusing Trove: the host is left alone as if it failed (pauses doubling
        # from pause_base, forgiven on its next success), not for a ban's day.
        if not in_flight:
            risk = min(risk + 1, MAX_LEVEL)
            nominal = config.pause_base * 2.0 ** (risk - 1)
            pause(
                min(config.pause_max, nominal * _jitter(_host(obs.url), "risk", risk)), "forbidden"
            )
            escalated_at = max(escalated_at, obs.at)
    elif obs.status in (429, 503) and obs.error_type in ("rate_limited", "server_error"):
        kind = "rate_limited" if obs.status == 429 else "unavailable"
        if not in_flight:
            if policy.escalated_at and obs.started - policy.escalated_at > _rate_run(config):
                # Asked long after the last escalation (its pages done, or a followed
                # instance, whose healthy polls fold no answer to forgive it): a new run
                # of refusals, not one more of the last, however long ago that was.
                rate = 0
            rate = min(rate + 1, MAX_LEVEL)
            escalated_at = max(escalated_at, obs.at)
        # A Retry-After of 0 (or a date already past) asks for no wait while refusing
        # the request: it says nothing, and the pauses double as without one, or a
        # host answering so would get a request every gap for ever. A Retry-After is
        # honoured as asked at the first refusal; one waited out and refused again did
        # not end the refusals, so it doubles with each in a row (a limiter answering
        # every request with "Retry-After: 1" would otherwise be asked every gap too).
        if obs.retry_after is not None and obs.retry_after > 0:
            asked = obs.retry_after * 2.0 ** (max(rate, 1) - 1)
            pause(min(asked, config.rate_max), f"{kind} (Retry-After)")
        elif not in_flight:
            nominal = config.rate_base * 2.0 ** (rate - 1)
            pause(min(config.rate_max, nominal * _jitter(_host(obs.url), "rate", rate)), kind)
    elif obs.error_type == "rate_spent":
        # Answered, the limit nearly spent (a followed instance's rate-limit headers):
        # left alone until the reset it names, as asked; nothing was refused, and what
        # its API answers says nothing of how it takes its pages.
        if obs.retry_after is not None and obs.retry_after > 0:
            pause(min(obs.retry_after, config.rate_max), "rate_limited (reset)")
    elif obs.error_type in HOST_FAILURES:
        if not in_flight:
            risk = min(risk + 1, MAX_LEVEL)
            nominal = config.pause_base * 2.0 ** (risk - 1)
            wait = min(config.pause_max, nominal * _jitter(_host(obs.url), "risk", risk))
            if obs.retry_after is not None:
                wait = max(wait, min(obs.retry_after, config.rate_max))
            pause(wait, obs.error_type or "unreachable")
            escalated_at = max(escalated_at, obs.at)
    elif _answered(obs) and not in_flight:
        risk, rate = 0, 0  # forgiven: the host answers again

    pace, answered_at, refused_after = _paced(policy, obs, in_flight, config)

    response_ms, recent = policy.response_ms, policy.recent_ms
    # Only answers tell how long the host takes to answer: a timeout's duration is the
    # client's limit, and a failure is left to the pauses above.
    answered = obs.error_type not in HOST_FAILURES
    if obs.status is not None and obs.duration_ms is not None and answered:
        recent = (*recent, round(float(obs.duration_ms), TIME_DIGITS))[-RECENT_ANSWERS:]
        response_ms = statistics.median(recent)

    moved_to, moved_at = policy.moved_to, policy.moved_at
    move_origin, move_votes = policy.move_origin, policy.move_votes
    move_section, move_root = policy.move_section, policy.move_root
    if obs.moved_to:
        section = _section(obs.url)
        # A vote of a record written before sections were kept may have been a 302, or
        # of this same section: it starts again rather than confirm.
        unknown = move_section is None and move_votes < MOVE_CONFIRMATIONS
        if obs.moved_to != move_origin or unknown:
            move_origin, move_votes, move_section = obs.moved_to, 1, section
            move_root = int(section == "")
        elif section != move_section or move_votes >= MOVE_CONFIRMATIONS:
            # Another part of the site (or a move known already, renewed).
            move_votes, move_section = min(move_votes + 1, MAX_LEVEL), section
            move_root = max(move_root, int(section == ""))
        # A move learned before the home page had to be among the votes is renewed
        # only once it is.
        if move_votes >= MOVE_CONFIRMATIONS and move_root:
            moved_to, moved_at = move_origin, obs.at
        elif moved_to != move_origin:
            moved_to, moved_at = None, 0.0
    elif obs.moved_to is not None or _answered(obs):
        # Its own answer, or a redirect that does not keep the path: not a move.
        moved_to, moved_at, move_origin, move_votes = None, 0.0, None, 0
        move_section, move_root = None, 0

    honoured, ignored = policy.validators_honoured, policy.validators_ignored
    if obs.conditional:
        if obs.status == 304:
            honoured += 1
        elif obs.status == 200 and obs.unchanged:
            ignored += 1
        if max(honoured, ignored) > MAX_VALIDATOR_COUNT:
            honoured, ignored = honoured // 2, ignored // 2

    return HostPolicy(
        estimates=estimates,
        paused_until=round(paused_until, TIME_DIGITS),
        pause_reason=reason,
        risk_level=risk,
        rate_level=rate,
        escalated_at=round(escalated_at, TIME_DIGITS),
        response_ms=None if response_ms is None else round(response_ms, TIME_DIGITS),
        recent_ms=recent,
        attempts=min(policy.attempts + 1, 2**31 - 1),
        last_attempt_at=round(max(policy.last_attempt_at, obs.at), TIME_DIGITS),
        validators_honoured=honoured,
        validators_ignored=ignored,
        banned_at=banned_at,
        moved_to=moved_to,
        moved_at=round(moved_at, TIME_DIGITS),
        move_origin=move_origin,
        move_votes=move_votes,
        move_section=move_section,
        move_root=move_root,
        pace=round(pace, TIME_DIGITS),
        answered_at=round(answered_at, TIME_DIGITS),
        refused_after=round(refused_after, TIME_DIGITS),
    )


def _paced(
    policy: HostPolicy, obs: Observation, in_flight: bool, config: LearningConfig
) -> tuple[float, float, float]:
    """(pace, answered_at, refused_after) once ``obs`` is known."""
    pace, answered_at, refused_after = policy.pace, policy.answered_at, policy.refused_after
    if obs.strategy not in STRATEGIES:
        # A timeline poll's answer: an API's limits are not its pages', and its healthy
        # answers are not folded, so none would end a run, nor measure a spacing.
        return pace, answered_at, refused_after
    if answered_at > obs.at:
        answered_at = 0.0  # ahead of any answer (a damaged record): known from the next
    if obs.status == 429 and obs.error_type == "rate_limited":
        spacing = obs.started - answered_at
        stale = obs.started - policy.escalated_at > _rate_run(config)
        if not policy.rate_level or stale:
            # A run starts. It teaches only when it was asked at about the host's gap: a
            # host refused after being left alone an hour is not refusing a spacing.
            usual = max(2 * host_gap(policy, config.min_gap, config), config.max_gap)
            refused_after = 0.0
            teaches = answered_at > 0 and 0 < spacing <= usual
        else:
            teaches = refused_after > 0  # a run that teaches, refused again
        if obs.retry_after is not None and obs.retry_after > 0:
            # Told to wait this much longer: the limiter's window is at least as long.
            spacing += min(obs.retry_after, config.rate_max)
        if teaches and 0 < spacing <= config.rate_max:
            refused_after = max(refused_after, spacing)
    elif _answered(obs) and not obs.is_banned and obs.error_type != "blocked_403":
        if not in_flight:
            let_through = obs.started - answered_at
            if refused_after and answered_at and let_through <= config.rate_max:
                # A run of refusals ends: the spacing let through bounds the limiter's
                # window from above, the longest refused from below. The pauses that
                # doubled within the run overshoot it by up to their last; twice the
                # longest refused does not, and is still past it. A run that ends
                # later than the longest back-off (the host left alone a day) says
                # nothing of a window. Past the longest gap only when the host was
                # paced already and refused at its pace: one run alone (a quota's
                # reset, a maintenance's Retry-After) would hold it for days.
                ceiling = config.rate_max if pace else min(config.max_gap, config.rate_max)
                pace = min(PACE_MARGIN * min(let_through, 2 * refused_after), ceiling)
            elif pace:
                pace *= PACE_EASE
            if pace < config.min_gap:
                pace = 0.0
            refused_after = 0.0
        answered_at = max(answered_at, obs.started)
    return pace, answered_at, refused_after


def moved(policy: HostPolicy, now: float, config: LearningConfig) -> str | None:
    """The origin the host moved to, while its pages are asked for there without a
    request to it; None when it has not, or when it is time to find out again. A move
    its home page was not among the redirects of (a record an older release wrote, or
    rewrote) is not obeyed: its next request finds out."""
    if policy.moved_to and policy.move_root and now - policy.moved_at < config.move_recheck:
        return policy.moved_to
    return None


def moved_url(url: str, origin: str) -> str:
    """``url`` at ``origin``: its path and query kept."""
    parts = urlsplit(url)
    return origin + (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _redirected_to(event: CrawlCompleted) -> str | None:
    """``Observation.moved_to`` of ``event``: a redirect answered, not followed."""
    status = event.status_code
    if event.outcome is not CrawlOutcome.REJECTED or status is None or not 300 <= status < 400:
        return None
    if status not in PERMANENT_REDIRECTS:
        return None  # moved for now: says nothing of where the host lives
    links = reversed(event.links)
    target = next((link.url for link in links if link.kind is LinkKind.REDIRECT), None)
    # The last hop as the fetcher sent it; the target canonical, as every link is.
    answered = canonicalize_or_none(event.final_url or event.url)
    if target is None or answered is None:
        return None
    source, to = urlsplit(answered), urlsplit(target)
    if (source.hostname or "").lower() == (to.hostname or "").lower():
        return None
    if (source.path or "/", source.query) != (to.path or "/", to.query):
        return ""
    return f"{to.scheme}://{to.netloc}".lower()


def _section(url: str) -> str:
    """The part of a site ``url`` is in: its path's first segment ("" for the root), as
    long as a stored record keeps it, so that a section compares alike folded in memory
    and read back."""
    section = (urlsplit(url).path or "/").lstrip("/").split("/", 1)[0]
    return section[: _TEXT_FIELDS["move_section"]]


def _learn(
    estimates: dict[str, tuple[float, float]],
    url_class: str,
    strategy: str,
    success: bool,
    config: LearningConfig,
) -> None:
    """Discount the class's estimates (seeding those not held yet) and add the outcome."""
    prefix = url_class + ":"
    strategies = dict.fromkeys(
        [
            *config.priors.strategies(url_class),
            *(key[len(prefix) :] for key in estimates if key.startswith(prefix)),
            strategy,
        ]
    )
    gamma = config.discount
    for name in strategies:
        key = prefix + name
        if key not in estimates and len(estimates) >= MAX_ESTIMATES:
            continue
        s, f = estimates.get(key) or config.priors.seed(url_class, name)
        s, f = s * gamma, f * gamma
        if name == strategy:
            s, f = (s + 1.0, f) if success else (s, f + 1.0)
        estimates[key] = (round(s, COUNT_DIGITS), round(f, COUNT_DIGITS))


def _answered(obs: Observation) -> bool:
    """The host answered as a healthy host does (content, a 304, a 404...)."""
    if obs.success:
        return True
    return obs.status is not None and obs.status < 500 and obs.status != 429


def estimate(
    policy: HostPolicy, url_class: str, strategy: str, config: LearningConfig
) -> tuple[float, float]:
    """(successes, failures) for ``strategy`` on the host's URLs of ``url_class``."""
    held = policy.estimates.get(f"{url_class}:{strategy}")
    return held if held is not None else config.priors.seed(url_class, strategy)


#: Pseudo-counts under every estimate (Jeffreys' prior): an untried strategy is an even
#: bet, and a strategy that always works reaches 0.93 at the discount's evidence ceiling
#: (1 / (1 - discount) outcomes) where a uniform prior would stop at 0.88.
BASE = 0.5


def success_rate(counts: tuple[float, float]) -> float:
    """The expected share of usable answers."""
    s, f = counts
    return (s + BASE) / (s + f + 2 * BASE)


def _upper(counts: tuple[float, float]) -> float:
    """Two standard deviations above the expected rate: what it plausibly is at best."""
    a, b = counts[0] + BASE, counts[1] + BASE
    return a / (a + b) + 2.0 * math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1.0)))


def choose(
    policy: HostPolicy, url: str, applicable: Sequence[str], config: LearningConfig
) -> Choice:
    """The strategy for ``url`` among ``applicable`` (in the fetcher's order of preference)."""
    strategies = list(dict.fromkeys(applicable))
    if not strategies:
        raise ValueError("no applicable strategy")
    if len(strategies) == 1:
        return Choice(strategies[0], "only")
    url_class = config.priors.url_class(url)
    counts = {s: estimate(policy, url_class, s, config) for s in strategies}
    best = max(strategies, key=lambda s: success_rate(counts[s]))  # first of equals
    learned = any(f"{url_class}:{s}" in policy.estimates for s in strategies)
    rate = success_rate(counts[best])
    if rate < config.explore_below and _explore_turn(policy, url, config):
        for other in strategies:
            if other != best and _upper(counts[other]) >= rate:
                return Choice(other, "explore")
    return Choice(best, "learned" if learned else "prior")


#: A page one strategy answered the wrong way is asked at once another way while that
#: way is still this good a bet on the host's URLs of the class (untried: 0.5)...
ANOTHER_WAY_AT_LEAST = 0.4
#: ... or has given usable answers there: discounted successes, real or its prior's.
ANOTHER_WAY_SUCCESSES = 0.5


def another_way(
    policy: HostPolicy, url: str, tried: str, applicable: Sequence[str], config: LearningConfig
) -> bool:
    """Whether ``url``, answered the wrong way by ``tried``, may be asked at once another
    way: one applies that the host's record does not show failing. On a host where every
    way fails (a site of scripts only, a challenge the audit does not know) every page
    cost two requests for nothing; on one where the other way works for some pages, it
    is still asked. Exploring tries a failed way again now and then."""
    url_class = config.priors.url_class(url)
    for other in applicable:
        if other == tried:
            continue
        counts = estimate(policy, url_class, other, config)
        if counts[0] >= ANOTHER_WAY_SUCCESSES or success_rate(counts) >= ANOTHER_WAY_AT_LEAST:
            return True
    return False


def _explore_turn(policy: HostPolicy, url: str, config: LearningConfig) -> bool:
    """Whether this choice may explore: a fixed share, and only on a host at ease.

    Never on a host that paused at its last answer, is being backed off, or banned
    Trove recently: exploring there would look like getting around its refusal.
    """
    if config.explore_every <= 0 or policy.attempts == 0:
        return False
    if policy.paused_until > policy.last_attempt_at or policy.risk_level or policy.rate_level:
        return False
    if policy.banned_at and policy.last_attempt_at - policy.banned_at < config.ban_memory:
        return False
    offset = _unit(_host(url), "explore") * config.explore_every
    return (policy.attempts + int(offset)) % config.explore_every == 0


def host_gap(policy: HostPolicy, base_gap: float, config: LearningConfig) -> float:
    """Seconds between two requests to the host: longer when it answers slowly, and
    not shorter than the pace its rate limit asks.

    ``base_gap`` already holds the host's Crawl-delay; the result is never below it
    nor below ``min_gap``, and the part learned from answer times never above
    ``max_gap``. A pace may be longer (up to ``rate_max``): the host refused requests
    closer than it, and a gap capped below it would be refused again each time.
    """
    gap = base_gap
    if policy.response_ms is not None:
        learned = config.response_factor * policy.response_ms / 1000.0
        gap = max(gap, min(learned, config.max_gap))
    if policy.refused_after:
        # Within a run of refusals the pauses decide; a refused request spent none of
        # the limiter's window, so the next one is due when the pause ends, not a pace
        # after the refusal (which took the pace for twice the window).
        return max(gap, config.min_gap)
    return max(gap, config.min_gap, min(policy.pace, config.rate_max))


#: Once in this many conditional-free requests, a host that ignored validators is
#: asked again with them: it may have started to honour them.
VALIDATOR_PROBE_EVERY = 50


def send_validators(policy: HostPolicy) -> bool:
    """Send If-None-Match / If-Modified-Since unless the host clearly ignores them."""
    ignores = policy.validators_ignored >= 3 and policy.validators_honoured == 0
    return not ignores or policy.attempts % VALIDATOR_PROBE_EVERY == 0


def paused(policy: HostPolicy, now: float) -> bool:
    return policy.paused_until > now


def _host(url: str) -> str:
    return (urlsplit(url).hostname or "").lower()


@functools.lru_cache(maxsize=4096)
def _unit(host: str, *parts: object) -> float:
    """A number in [0, 1) fixed by its inputs: jitter every pod agrees on."""
    key = "|".join((host, *map(str, parts))).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2.0**64


def _jitter(host: str, kind: str, level: int) -> float:
    return 1.0 + JITTER * (2.0 * _unit(host, kind, level) - 1.0)
