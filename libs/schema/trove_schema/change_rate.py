"""How often a page changes, from its visits, and when to visit it next.

A page is assumed to change as a Poisson process of rate ``λ`` (changes per second).
A visit cannot count the changes since the one before; it only sees whether the page
*differs* (a new content hash) or not (the same hash, or a 304). Counting changed
visits and dividing by the time is therefore biased low: a visit that finds the page
changed says "at least one change", and the faster the page changes, the more changes
each visit misses. The estimator here is the maximum-likelihood rate for binary
observations at irregular intervals (Cho and Garcia-Molina, "Estimating frequency of
change", ACM TOIT 2003): the chance that a visit ``t`` seconds after the last one finds
the page unchanged is ``exp(-λ t)``, so the likelihood's derivative vanishes where

    Σ_changed t_i / (exp(λ t_i) - 1)  =  Σ_unchanged t_j

The left side falls from infinity to zero as ``λ`` grows, so there is exactly one root
whenever both kinds of visit were seen; it is found by bisection on ``log λ``.

When every visit found a change the maximum-likelihood rate is infinite. Cho and
Garcia-Molina's correction for regular visits, ``λ = -log((n - X + 0.5) / (n + 0.5)) / I``,
is the same equation with half an unchanged visit of length ``I`` added to the right
side; for irregular visits the half visit is as long as the shortest visit interval,
which reduces to their estimator when the intervals are equal, keeps the rate finite,
and errs toward the evidence that says the most about a fast page. A page never seen
changed estimates zero.

The rate is assumed steady, but a page's habits change: a page quiet for months
starts a blog. Its quiet visits, a month apart, would outweigh a year of changed
ones, so the estimate starts at the newest change point (``since_change_point``): a
run of changed visits that the rate before it makes too unlikely to be chance.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from trove_schema.events import MAX_VISITS, ChangeHistory, comparable_hashes

HOUR = 3600.0
DAY = 86_400.0

#: Bisection steps on log λ: the bracket spans a dozen or so orders of magnitude, and 64
#: halvings leave it ~1e-17 wide in log space, far below anything an interval could show.
_STEPS = 64
#: Beyond this, exp(λ t) overflows and the visit's term is zero for all purposes.
_MAX_EXPONENT = 700.0
#: A page's habits change at this many changed visits in a row at the least: fewer are
#: what a page that changes once in a while shows now and then.
CHANGE_POINT_RUN = 3
#: ...and only when the rate before the run gave them less than this chance of all
#: changing. A page visited at its mean time between changes finds each visit changed
#: 63% of the time: by chance it takes some fifteen in a row (0.63^15 ≈ 0.1%), so a
#: page whose habits hold seldom loses visits from its estimate (simulated, the median
#: rate stays within 10% of the true one), while three changes in a row after a few
#: quiet visits are a page woken up.
CHANGE_POINT_CHANCE = 0.001


@dataclass(frozen=True, slots=True, kw_only=True)
class RecrawlPolicy:
    """The bounds within which a page's re-crawl interval follows its changes."""

    #: The interval after a page's first visit, before anything is known about it.
    first: float = 7 * DAY
    minimum: float = HOUR
    maximum: float = 30 * DAY
    #: The interval grows at most by this factor a visit: a few quiet visits are weak
    #: evidence that a page is dead, so a quiet page drifts to the maximum (7 days, 14,
    #: 28, 30) instead of jumping there after one. A page seen changing may be visited
    #: sooner at once: that only costs a fetch.
    growth: float = 2.0


def record_visit(
    history: ChangeHistory | None,
    *,
    visited_at: datetime,
    content_hash: str | None,
    not_modified: bool,
) -> ChangeHistory:
    """``history`` with this visit added (its ``interval`` left as it was).

    A 304 is unchanged. The first visit, or one whose content cannot be compared (no
    hash on either side, or hashes of two kinds: ``comparable_hashes``), adds no
    observation: it only becomes the reference for the next visit when it has a hash
    to compare with.
    """
    history = history or ChangeHistory()
    if history.visited_at is None or history.content_hash is None:
        if not_modified or content_hash is None:
            return history
        return history.model_copy(update={"content_hash": content_hash, "visited_at": visited_at})
    if content_hash is not None and not comparable_hashes(content_hash, history.content_hash):
        # Hashed the other way (the release before hashed bytes): no evidence, a new
        # reference.
        return history.model_copy(update={"content_hash": content_hash, "visited_at": visited_at})
    if not not_modified and content_hash is None:
        # Nothing to compare: the next visit is compared with the older reference, over
        # the whole time since it, which is still a true observation.
        return history
    elapsed = (visited_at - history.visited_at).total_seconds()
    if elapsed <= 0:
        return history  # a redelivery, or clocks out of order: no time, no evidence
    changed = not not_modified and content_hash != history.content_hash
    visits = (*history.visits, (elapsed, changed))[-MAX_VISITS:]
    return history.model_copy(
        update={
            "visits": visits,
            "visited_at": visited_at,
            "content_hash": history.content_hash if not_modified else content_hash,
        }
    )


def estimate_rate(visits: Sequence[tuple[float, bool]]) -> float | None:
    """Changes per second from ``(seconds since the visit before, changed)`` observations.

    None without observations; 0.0 when no visit found a change.
    """
    observed = [(t, changed) for t, changed in visits if t > 0]
    if not observed:
        return None
    changed_times = [t for t, changed in observed if changed]
    if not changed_times:
        return 0.0
    times = [t for t, _ in observed]
    shortest, longest = min(times), max(times)
    quiet = sum(t for t, changed in observed if not changed) + 0.5 * shortest

    def excess(rate: float) -> float:
        return (
            sum(t / math.expm1(rate * t) for t in changed_times if rate * t < _MAX_EXPONENT) - quiet
        )

    # At the low end each changed term is ~1/rate, larger than any sum of observed
    # times; at the high end every term is ~0, below ``quiet`` (which is positive).
    low, high = math.log(1e-6 / longest), math.log(_MAX_EXPONENT / shortest)
    for _ in range(_STEPS):
        middle = (low + high) / 2
        if excess(math.exp(middle)) > 0:
            low = middle
        else:
            high = middle
    return math.exp((low + high) / 2)


def since_change_point(visits: Sequence[tuple[float, bool]]) -> Sequence[tuple[float, bool]]:
    """The visits since the page last changed its habits (all of them when it has not):
    from the newest run of ``CHANGE_POINT_RUN`` or more changed visits to which the
    visits before it, back to the change point before, gave less than
    ``CHANGE_POINT_CHANCE``. Visits that never saw a change give such a run no chance;
    a change now and then, or two in a row, is never a change point.
    """
    start = position = 0
    for changed, group in itertools.groupby(visits, key=lambda visit: visit[1]):
        run = list(group)
        if changed and len(run) >= CHANGE_POINT_RUN and position > start:
            rate = estimate_rate(visits[start:position])
            if rate is not None and _all_changed_chance(rate, run) < CHANGE_POINT_CHANCE:
                start = position
        position += len(run)
    return visits[start:]


def _all_changed_chance(rate: float, visits: Sequence[tuple[float, bool]]) -> float:
    return math.prod(-math.expm1(-rate * t) for t, _ in visits)


def next_interval(history: ChangeHistory, policy: RecrawlPolicy) -> float:
    """Seconds until the page's next visit, within the policy's bounds.

    The interval is the page's mean time between changes, ``1 / λ``. At that interval a
    visit finds a change about 63% of the time, which is where a yes/no visit tells the
    most about the rate (the information in one visit peaks at ``λ t ≈ 1.6`` and is
    90% of that peak at 1): the estimate stays sharp as the page's habits drift, and
    the copy is fresh most of the time without fetching a page more often than it
    changes. A page changing faster than the minimum is visited at the minimum; one
    never seen changing drifts to the maximum, by ``growth`` a visit.
    """
    rate = estimate_rate(since_change_point(history.visits))
    if rate is None:
        wanted = policy.first
    else:
        wanted = 1.0 / rate if rate > 0 else math.inf
        previous = history.interval or policy.first
        wanted = min(wanted, previous * policy.growth)
    return min(max(wanted, policy.minimum), policy.maximum)


def plan_recrawl(
    history: ChangeHistory | None,
    *,
    visited_at: datetime,
    content_hash: str | None,
    not_modified: bool,
    policy: RecrawlPolicy,
) -> ChangeHistory:
    """The history after this visit, with the interval until the next one."""
    updated = record_visit(
        history, visited_at=visited_at, content_hash=content_hash, not_modified=not_modified
    )
    return updated.model_copy(update={"interval": next_interval(updated, policy)})


def plan_refused(history: ChangeHistory | None, policy: RecrawlPolicy) -> ChangeHistory:
    """The history after a visit refused before the page was asked for (the operator's
    exclusions, robots.txt): nothing learned about the page, its interval grown by
    ``growth`` up to the maximum, so that a refusal that lasts costs fewer and fewer
    visits while the page still comes back within an interval of its lifting."""
    history = history or ChangeHistory()
    grown = (history.interval or policy.first) * policy.growth
    return history.model_copy(update={"interval": min(max(grown, policy.minimum), policy.maximum)})
