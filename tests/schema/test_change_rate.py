"""The change-rate estimator and the re-crawl interval, on a simulated clock.

Each simulated page changes as a Poisson process of a known rate; it is visited at the
intervals the policy chooses, and each visit sees only whether the page differs from
the visit before (a content hash), as the crawler does. The random draws come from a
fixed seed, and statistical claims are made on the median over 50 pages per rate.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from datetime import UTC, datetime, timedelta

import pytest

from trove_schema.change_rate import (
    DAY,
    HOUR,
    RecrawlPolicy,
    estimate_rate,
    next_interval,
    plan_recrawl,
    record_visit,
)
from trove_schema.events import MAX_VISITS, SIGNALS_HASH_PREFIX, ChangeHistory

START = datetime(2026, 1, 1, tzinfo=UTC)
WEEK = 7 * DAY
PAGES = 50
SEED = 13


class SimulatedPage:
    """A page whose content changes at Poisson times of ``rate`` (changes per second)."""

    def __init__(self, rate: float, rng: random.Random) -> None:
        self.rate, self.rng = rate, rng
        self.version = 0
        self.clock = 0.0
        self.next_change = rng.expovariate(rate) if rate > 0 else math.inf

    def visit_after(self, seconds: float) -> str:
        """Advance the clock and return the content hash a visit sees then."""
        self.clock += seconds
        while self.next_change <= self.clock:
            self.version += 1
            self.next_change += self.rng.expovariate(self.rate)
        return f"hash-{self.version}"


def crawl(page: SimulatedPage, policy: RecrawlPolicy, visits: int) -> list[ChangeHistory]:
    """The page's history after each visit, visits spaced as the policy says."""
    history = plan_recrawl(
        None, visited_at=START, content_hash=page.visit_after(0), not_modified=False, policy=policy
    )
    histories = [history]
    for _ in range(visits):
        assert history.interval is not None
        content = page.visit_after(history.interval)
        history = plan_recrawl(
            history,
            visited_at=START + timedelta(seconds=page.clock),
            content_hash=content,
            not_modified=False,
            policy=policy,
        )
        histories.append(history)
    return histories


def population(rate: float, policy: RecrawlPolicy, visits: int) -> list[list[ChangeHistory]]:
    rng = random.Random(f"{SEED}:{rate}")
    return [crawl(SimulatedPage(rate, rng), policy, visits) for _ in range(PAGES)]


RATES = {"hourly": 1 / HOUR, "daily": 1 / DAY, "weekly": 1 / WEEK}


@pytest.mark.parametrize("name", list(RATES))
def test_after_ten_observations_the_estimated_rate_is_within_30_percent(name: str) -> None:
    # Starting one day apart; from the 7-day default an hourly page needs a couple of
    # visits more to come down (see the next test).
    rate = RATES[name]
    policy = RecrawlPolicy(first=DAY)
    estimates = []
    for histories in population(rate, policy, visits=10):
        history = histories[-1]
        assert len(history.visits) == 10
        estimate = estimate_rate(history.visits)
        assert estimate is not None
        estimates.append(estimate)
    assert statistics.median(estimates) == pytest.approx(rate, rel=0.3)


def test_from_the_default_first_interval_an_hourly_page_is_learned_in_12_observations() -> None:
    estimates = [
        estimate_rate(histories[-1].visits) or 0.0
        for histories in population(1 / HOUR, RecrawlPolicy(), visits=12)
    ]
    assert statistics.median(estimates) == pytest.approx(1 / HOUR, rel=0.3)


def test_hourly_daily_weekly_and_never_changing_pages_end_with_intervals_in_that_order() -> None:
    policy = RecrawlPolicy()  # the defaults: first 7 days, between 1 hour and 30 days
    final = {
        name: statistics.median(
            histories[-1].interval or 0.0 for histories in population(rate, policy, visits=30)
        )
        for name, rate in {**RATES, "never": 0.0}.items()
    }
    assert final["hourly"] < final["daily"] < final["weekly"] < final["never"], final
    assert final["hourly"] == pytest.approx(HOUR, rel=0.3)
    assert final["daily"] == pytest.approx(DAY, rel=0.3)
    assert final["weekly"] == pytest.approx(WEEK, rel=0.3)
    assert final["never"] == policy.maximum


def test_the_estimate_is_not_biased_by_the_changes_a_visit_misses() -> None:
    # Visits every two mean change times: most visits miss a change. Counting changed
    # visits over time says less than half the true rate; the estimator does not.
    rate, every = 1 / DAY, 2 * DAY
    rng = random.Random(SEED)
    naive, estimated = [], []
    for _ in range(PAGES):
        page = SimulatedPage(rate, rng)
        history = record_visit(
            None, visited_at=START, content_hash=page.visit_after(0), not_modified=False
        )
        for _ in range(MAX_VISITS):
            content = page.visit_after(every)
            history = record_visit(
                history,
                visited_at=START + timedelta(seconds=page.clock),
                content_hash=content,
                not_modified=False,
            )
        naive.append(sum(changed for _, changed in history.visits) / (MAX_VISITS * every))
        estimated.append(estimate_rate(history.visits) or 0.0)
    assert statistics.median(naive) < 0.5 * rate
    assert statistics.median(estimated) == pytest.approx(rate, rel=0.15)


@pytest.mark.parametrize(("changed", "visits"), [(0, 4), (3, 10), (7, 10), (10, 10), (1, 1)])
def test_regular_visits_give_cho_and_garcia_molinas_corrected_estimate(
    changed: int, visits: int
) -> None:
    every = 3 * HOUR
    observations = [(every, n < changed) for n in range(visits)]
    expected = -math.log((visits - changed + 0.5) / (visits + 0.5)) / every
    assert estimate_rate(observations) == pytest.approx(expected, rel=1e-9)


def test_irregular_visits_solve_the_likelihood_equation() -> None:
    observations = [(HOUR, False), (5 * HOUR, True), (2 * HOUR, False), (9 * HOUR, True)]
    rate = estimate_rate(observations)
    assert rate is not None
    changed = sum(t / math.expm1(rate * t) for t, c in observations if c)
    quiet = sum(t for t, c in observations if not c) + 0.5 * HOUR
    assert changed == pytest.approx(quiet, rel=1e-9)


def test_without_an_observation_the_interval_is_the_first_one() -> None:
    policy = RecrawlPolicy(first=5 * DAY)
    assert estimate_rate(()) is None
    assert next_interval(ChangeHistory(), policy) == 5 * DAY


def test_the_first_visit_adds_no_observation() -> None:
    history = record_visit(None, visited_at=START, content_hash="a", not_modified=False)
    assert history.visits == ()
    assert history.content_hash == "a"
    assert history.visited_at == START


def test_a_304_and_the_same_hash_are_unchanged_and_a_new_hash_is_changed() -> None:
    first = record_visit(None, visited_at=START, content_hash="a", not_modified=False)
    later = START + timedelta(hours=2)
    same = record_visit(first, visited_at=later, content_hash="a", not_modified=False)
    not_modified = record_visit(first, visited_at=later, content_hash=None, not_modified=True)
    new = record_visit(first, visited_at=later, content_hash="b", not_modified=False)
    assert same.visits == ((2 * HOUR, False),)
    assert not_modified.visits == ((2 * HOUR, False),)
    assert not_modified.content_hash == "a"
    assert new.visits == ((2 * HOUR, True),)
    assert new.content_hash == "b"
    assert new.visited_at == later


@pytest.mark.parametrize("kind", [SIGNALS_HASH_PREFIX, "m:"], ids=["signals", "markup"])
def test_a_hash_of_the_other_kind_is_a_new_reference_not_a_change(kind: str) -> None:
    # The release before hashed a page's bytes; this one hashes what it says, or the
    # markup of a page that says too little.
    first = record_visit(None, visited_at=START, content_hash="ab12", not_modified=False)
    later = START + timedelta(hours=2)
    signals = kind + "cd34"
    switched = record_visit(first, visited_at=later, content_hash=signals, not_modified=False)
    assert switched.visits == ()
    assert (switched.content_hash, switched.visited_at) == (signals, later)
    again = record_visit(
        switched, visited_at=later + timedelta(hours=2), content_hash=signals, not_modified=False
    )
    assert again.visits == ((2 * HOUR, False),)


def test_a_visit_without_a_hash_leaves_the_history_to_the_next_comparable_one() -> None:
    first = record_visit(None, visited_at=START, content_hash="a", not_modified=False)
    later = START + timedelta(hours=1)
    blind = record_visit(first, visited_at=later, content_hash=None, not_modified=False)
    assert blind == first


def test_a_page_changed_at_every_visit_estimates_a_finite_rate_and_reaches_the_minimum() -> None:
    policy = RecrawlPolicy()
    history = plan_recrawl(
        None, visited_at=START, content_hash="v0", not_modified=False, policy=policy
    )
    for n in range(1, 40):
        assert history.visited_at is not None
        assert history.interval is not None
        history = plan_recrawl(
            history,
            visited_at=history.visited_at + timedelta(seconds=history.interval),
            content_hash=f"v{n}",
            not_modified=False,
            policy=policy,
        )
        assert all(changed for _, changed in history.visits)
        assert math.isfinite(estimate_rate(history.visits) or math.inf)
    assert history.interval == policy.minimum
    assert len(history.visits) == MAX_VISITS


def test_a_page_that_never_changes_drifts_to_the_maximum() -> None:
    policy = RecrawlPolicy()
    history = plan_recrawl(
        None, visited_at=START, content_hash="same", not_modified=False, policy=policy
    )
    intervals = [history.interval]
    for _ in range(4):
        assert history.visited_at is not None
        assert history.interval is not None
        history = plan_recrawl(
            history,
            visited_at=history.visited_at + timedelta(seconds=history.interval),
            content_hash=None,
            not_modified=True,
            policy=policy,
        )
        intervals.append(history.interval)
    assert intervals == [7 * DAY, 14 * DAY, 28 * DAY, 30 * DAY, 30 * DAY]


def test_the_interval_stays_within_the_bounds() -> None:
    policy = RecrawlPolicy(first=2.0, minimum=1.0, maximum=8.0)
    history = ChangeHistory(visits=((2.0, True),) * 5, interval=2.0)
    assert next_interval(history, policy) == 1.0
    history = ChangeHistory(visits=((8.0, False),) * 5, interval=8.0)
    assert next_interval(history, policy) == 8.0


def visited(history: ChangeHistory, *, changed: bool, policy: RecrawlPolicy) -> ChangeHistory:
    """``history`` after a visit when the policy said, finding the page ``changed``."""
    assert history.visited_at is not None
    assert history.interval is not None
    at = history.visited_at + timedelta(seconds=history.interval)
    return plan_recrawl(
        history,
        visited_at=at,
        content_hash=f"as of {at}" if changed else None,
        not_modified=not changed,
        policy=policy,
    )


def first_visit(policy: RecrawlPolicy) -> ChangeHistory:
    return plan_recrawl(
        None, visited_at=START, content_hash="v0", not_modified=False, policy=policy
    )


@pytest.mark.parametrize("quiet", [4, 12])
def test_a_page_that_wakes_up_after_quiet_visits_is_visited_daily_within_a_dozen_visits(
    quiet: int,
) -> None:
    # Quiet for months at the maximum interval, then changed at every visit.
    policy = RecrawlPolicy()
    history = first_visit(policy)
    for _ in range(quiet):
        history = visited(history, changed=False, policy=policy)
    assert history.interval == policy.maximum
    intervals = []
    for _ in range(12):
        history = visited(history, changed=True, policy=policy)
        assert history.interval is not None
        intervals.append(history.interval)
    assert min(intervals) <= DAY, [round(interval / DAY, 1) for interval in intervals]


@pytest.mark.parametrize("changes", [[True], [True, True], [True, True, False, False, True]])
def test_a_change_now_and_then_after_quiet_visits_keeps_the_interval_long(
    changes: list[bool],
) -> None:
    policy = RecrawlPolicy()
    history = first_visit(policy)
    for changed in [False] * 12 + changes:
        history = visited(history, changed=changed, policy=policy)
    assert history.interval == policy.maximum


def test_a_page_that_goes_quiet_after_changing_at_every_visit_backs_off_by_growth() -> None:
    policy = RecrawlPolicy()
    history = first_visit(policy)
    for _ in range(40):
        history = visited(history, changed=True, policy=policy)
    assert history.interval == policy.minimum
    intervals = [history.interval]
    while intervals[-1] < policy.maximum and len(intervals) < 100:
        history = visited(history, changed=False, policy=policy)
        assert history.interval is not None
        intervals.append(history.interval)
    # Never sooner for a quiet visit, never more than doubled, and the maximum in the
    # end: a few quiet visits are weak evidence after a long run of changes.
    assert all(a <= b <= a * policy.growth for a, b in itertools.pairwise(intervals))
    assert intervals[-1] == policy.maximum
    assert 20 < len(intervals) <= 40
