"""Per-host policy learned from evidence and priors: a pure fold over attempts.

SKELETON: the signatures below are the contract between the fetcher (which folds each
attempt into the host's record in KV and acts on it) and the recorder (which folds the
same events into ``host_policies`` for the operator). Implementation in progress.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trove_schema.events import CrawlCompleted


@dataclass(frozen=True, slots=True, kw_only=True)
class LearningConfig:
    #: The configured gap between two requests to a host, and its ceiling.
    min_gap: float = 10.0
    max_gap: float = 120.0
    #: A host's gap is at least this many times its (smoothed) response time.
    response_factor: float = 10.0
    #: First pause of a host that fails (refuses, times out, 5xx), doubled per failure in a row.
    pause_base: float = 60.0
    pause_max: float = 86_400.0
    #: First pause after a 429/503 without Retry-After, doubled per answer in a row.
    rate_base: float = 60.0
    rate_max: float = 3_600.0
    #: Pause after a ban or a challenge page.
    ban_pause: float = 86_400.0


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

    @classmethod
    def of(cls, event: CrawlCompleted) -> Observation:
        raise NotImplementedError


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
    response_ms: float | None = None
    attempts: int = 0
    last_attempt_at: float = 0.0
    #: Conditional requests answered 304 / answered 200 with the same content.
    validators_honoured: int = 0
    validators_ignored: int = 0

    def to_json(self) -> dict[str, object]:
        raise NotImplementedError

    @classmethod
    def from_json(cls, raw: object) -> HostPolicy:
        raise NotImplementedError


def observe(policy: HostPolicy, observation: Observation, config: LearningConfig) -> HostPolicy:
    raise NotImplementedError


def choose(
    policy: HostPolicy, url: str, applicable: Sequence[str], config: LearningConfig
) -> Choice:
    raise NotImplementedError


def host_gap(policy: HostPolicy, base_gap: float, config: LearningConfig) -> float:
    raise NotImplementedError


def send_validators(policy: HostPolicy) -> bool:
    raise NotImplementedError
