"""The per-host policy fold: simulated hosts, a simulated clock, a seeded RNG.

Each simulated attempt is a real ``CrawlCompleted`` read through ``Observation.of``
(the audit's verdict), as the fetcher and the recorder read theirs.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from trove_schema.errors import InvalidPriors
from trove_schema.events import ChangeHistory, CrawlCompleted, CrawlOutcome, Scope
from trove_schema.heuristics import audit
from trove_schema.policy import (
    MAX_LEVEL,
    HostPolicy,
    LearningConfig,
    Observation,
    another_way,
    choose,
    estimate,
    host_gap,
    load_priors,
    moved,
    moved_url,
    observe,
    send_validators,
    success_rate,
)
from trove_schema.settings import CommonSettings, FetcherSettings, RecorderSettings

BOTH = ("http", "activitypub")
CONFIG = LearningConfig()
T0 = 1_800_000_000.0


def attempt(
    url: str,
    strategy: str,
    outcome: CrawlOutcome,
    *,
    at: float,
    duration: float = 0.05,
    **fields: Any,
) -> CrawlCompleted:
    host = url.split("/")[2]
    return CrawlCompleted(
        url=url,
        domain=host,
        scope=Scope(value=host),
        request_id="00000000-0000-0000-0000-000000000001",
        outcome=outcome,
        started_at=datetime.fromtimestamp(at - duration, UTC),
        completed_at=datetime.fromtimestamp(at, UTC),
        duration_ms=int(duration * 1000),
        fetcher=strategy,
        **fields,
    )


def content(url: str, strategy: str, at: float) -> CrawlCompleted:
    kind = "application/activity+json" if strategy == "activitypub" else "text/html"
    return attempt(
        url,
        strategy,
        CrawlOutcome.SUCCESS,
        at=at,
        status_code=200,
        title="A post",
        content_type=kind,
        text_chars=2400,
    )


def wrong_tool(url: str, strategy: str, at: float) -> CrawlCompleted:
    return attempt(
        url,
        strategy,
        CrawlOutcome.REJECTED,
        at=at,
        status_code=200,
        content_type="text/html",
        error_message="content type text/html is not what activitypub reads",
    )


def shell(url: str, strategy: str, at: float) -> CrawlCompleted:
    # An application shell: a title and a script, no text; the fetcher marks it.
    fields: dict[str, Any] = {"title": "App", "shell": True, "text_chars": 12}
    return attempt(url, strategy, CrawlOutcome.SUCCESS, at=at, status_code=200, **fields)


def challenge(url: str, strategy: str, at: float) -> CrawlCompleted:
    return attempt(
        url,
        strategy,
        CrawlOutcome.BLOCKED_4XX,
        at=at,
        status_code=403,
        response_headers={"server": "cloudflare", "cf-mitigated": "challenge"},
    )


Site = Callable[[str, str, float], CrawlCompleted]


def html_site(url: str, strategy: str, at: float) -> CrawlCompleted:
    return content(url, strategy, at) if strategy == "http" else wrong_tool(url, strategy, at)


def spa_site(url: str, strategy: str, at: float) -> CrawlCompleted:
    return content(url, strategy, at) if strategy == "activitypub" else shell(url, strategy, at)


def challenge_site(url: str, strategy: str, at: float) -> CrawlCompleted:
    return challenge(url, strategy, at)


class Crawl:
    """One host crawled one URL at a time; waits out the host's pauses like a fetcher."""

    def __init__(self, site: Site, urls: Callable[[int], str], seed: int = 7) -> None:
        self.site, self.urls = site, urls
        self.policy = HostPolicy()
        self.now = T0
        self.rng = random.Random(seed)
        self.choices: list[str] = []
        self.reasons: list[str] = []

    def fetch(self, n: int = 1, config: LearningConfig = CONFIG) -> None:
        for _ in range(n):
            self.now = max(self.now + 10.0, self.policy.paused_until + 1.0)
            url = self.urls(self.rng.randrange(1000))
            choice = choose(self.policy, url, BOTH, config)
            self.choices.append(choice.strategy)
            self.reasons.append(choice.reason)
            event = self.site(url, choice.strategy, self.now)
            self.policy = observe(self.policy, Observation.of(event), config)


def page(n: int) -> str:
    return f"https://site.example/p/{n}"


def pdf(n: int) -> str:
    return f"https://site.example/files/{n}.pdf"


def post(n: int) -> str:
    return f"https://social.example/@alice/{n}"


@pytest.mark.parametrize(
    ("site", "urls", "right"),
    [
        (html_site, page, "http"),
        (spa_site, page, "activitypub"),
        (html_site, pdf, "http"),
        (spa_site, post, "activitypub"),
        (html_site, post, "http"),
    ],
    ids=["html", "spa-shell", "pdf", "fediverse", "html-with-post-shaped-urls"],
)
def test_a_host_converges_on_the_strategy_that_yields_content(
    site: Site, urls: Callable[[int], str], right: str
) -> None:
    crawl = Crawl(site, urls)
    crawl.fetch(20)
    crawl.fetch(100)
    assert crawl.choices[20:].count(right) >= 95, crawl.choices


def crawl_asking_another_way(site: Site, pages: int) -> tuple[int, int]:
    """``pages`` pages of one host fetched as the fetcher does, a wrong answer asked
    again another way when ``another_way`` lets it: (pages with content, requests)."""
    policy, now, read, requests = HostPolicy(), T0, 0, 0
    for n in range(pages):
        url = page(n)
        found = policy  # as the lease found it
        tried = choose(found, url, BOTH, CONFIG).strategy
        ways = [tried, *(w for w in BOTH if w != tried)]
        for way in ways:
            now += 10.0
            requests += 1
            observation = Observation.of(site(url, way, now))
            policy = observe(policy, observation, CONFIG)
            if observation.success:
                read += 1
            if observation.error_type != "wrong_tool" or way != tried:
                break
            if not another_way(found, url, tried, BOTH, CONFIG):
                break
    return read, requests


def test_a_host_no_way_reads_is_asked_another_way_for_few_of_its_pages() -> None:
    def scripts_site(url: str, strategy: str, at: float) -> CrawlCompleted:
        return shell(url, strategy, at) if strategy == "http" else wrong_tool(url, strategy, at)

    read, requests = crawl_asking_another_way(scripts_site, 200)
    assert read == 0
    assert requests <= 220  # two requests a page before


def test_a_page_the_other_way_reads_is_asked_that_way_on_a_host_where_it_reads_few() -> None:
    # Plain pages one in five, scripts the rest; ActivityPub reads none: every plain page
    # is read, whichever way was tried first.
    def partly_plain(url: str, strategy: str, at: float) -> CrawlCompleted:
        plain = int(url.rsplit("/", 1)[1]) % 5 == 0
        if strategy == "activitypub":
            return wrong_tool(url, strategy, at)
        return content(url, strategy, at) if plain else shell(url, strategy, at)

    read, _ = crawl_asking_another_way(partly_plain, 500)
    assert read == 100


def test_a_challenge_host_never_gets_another_strategy_and_ends_paused() -> None:
    crawl = Crawl(challenge_site, page)
    crawl.fetch(120)
    assert set(crawl.choices) == {"http"}
    assert "explore" not in crawl.reasons
    assert crawl.policy.paused_until >= crawl.now + CONFIG.ban_pause
    assert crawl.policy.pause_reason == "blocked_captcha"
    assert crawl.policy.estimates == {}  # a challenge teaches the choice nothing


def test_a_challenge_served_with_200_is_never_a_success() -> None:
    event = attempt(
        page(1),
        "http",
        CrawlOutcome.SUCCESS,
        at=T0,
        status_code=200,
        title="Just a moment...",
        response_headers={"cf-mitigated": "challenge"},
    )
    observation = Observation.of(event)
    assert (observation.success, observation.is_banned, observation.error_type) == (
        False,
        True,
        "blocked_captcha",
    )
    policy = observe(HostPolicy(), observation, CONFIG)
    assert policy.estimates == {}
    assert policy.paused_until == T0 + CONFIG.ban_pause


@pytest.mark.parametrize(
    ("urls", "prior", "site"),
    [(post, "activitypub", html_site), (pdf, "http", spa_site)],
    ids=["fediverse-post-prior", "pdf-prior"],
)
def test_a_prior_is_overturned_by_at_most_ten_contrary_outcomes(
    urls: Callable[[int], str], prior: str, site: Site
) -> None:
    config = LearningConfig(explore_every=0)  # overturned by learning, not by a turn
    policy, now = HostPolicy(), T0
    first = choose(policy, urls(0), BOTH, config)
    assert (first.strategy, first.reason) == (prior, "prior")
    contrary = 0
    while (choice := choose(policy, urls(contrary), BOTH, config)).strategy == prior:
        now += 10.0
        event = site(urls(contrary), prior, now)
        assert not Observation.of(event).success
        policy = observe(policy, Observation.of(event), config)
        contrary += 1
        assert contrary <= 10
    assert choice.reason == "learned"
    assert contrary >= 2  # one bad answer does not undo a prior


def test_a_host_that_turns_into_a_shell_is_relearned_within_ten_fetches() -> None:
    drifted = False

    def drift_site(url: str, strategy: str, at: float) -> CrawlCompleted:
        return (spa_site if drifted else html_site)(url, strategy, at)

    crawl = Crawl(drift_site, page)
    crawl.fetch(200)
    assert crawl.choices[-50:].count("http") >= 48
    drifted = True
    crawl.fetch(10)
    after = crawl.choices[200:]
    assert "activitypub" in after
    switch = after.index("activitypub")
    assert set(after[switch:]) == {"activitypub"}, after
    crawl.fetch(100)
    assert crawl.choices[-100:].count("activitypub") >= 95


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_timeouts_and_resets_never_teach_a_healthy_host_that_its_strategy_fails(
    seed: int,
) -> None:
    noise = random.Random(seed)

    def flaky_site(url: str, strategy: str, at: float) -> CrawlCompleted:
        roll = noise.random()
        if roll < 0.15:
            return attempt(url, strategy, CrawlOutcome.TIMEOUT, at=at, duration=10.0)
        if roll < 0.3:
            return attempt(
                url, strategy, CrawlOutcome.FAILED, at=at, error_message="ConnectionResetError"
            )
        return html_site(url, strategy, at)

    crawl = Crawl(flaky_site, page, seed=seed)
    for _ in range(20):
        crawl.fetch(10)
        rate = success_rate(estimate(crawl.policy, "page", "http", CONFIG))
        assert rate >= 0.9, crawl.policy
    assert crawl.choices[-100:].count("http") >= 95


def mixed_site(url: str, strategy: str, at: float) -> CrawlCompleted:
    """Every third page an application shell that only ActivityPub reads."""
    if int(url.rsplit("/", 1)[1]) % 3 == 0:
        return spa_site(url, strategy, at)
    return html_site(url, strategy, at)


def test_exploration_is_at_most_one_choice_in_fifty_on_a_host_served_badly() -> None:
    crawl = Crawl(mixed_site, page)
    crawl.fetch(500)
    explored = crawl.reasons.count("explore")
    assert 1 <= explored <= 500 // CONFIG.explore_every
    assert all(
        crawl.choices[i] == "activitypub" for i, r in enumerate(crawl.reasons) if r == "explore"
    )
    quiet = Crawl(mixed_site, page)
    quiet.fetch(500, LearningConfig(explore_every=0))
    assert "explore" not in quiet.reasons


def test_a_host_served_well_is_never_explored() -> None:
    crawl = Crawl(html_site, page)
    crawl.fetch(500)
    assert "explore" not in crawl.reasons
    assert set(crawl.choices) == {"http"}


def test_one_applicable_strategy_is_the_only_choice() -> None:
    assert choose(HostPolicy(), page(1), ["http"], CONFIG) == choose(
        HostPolicy(), page(1), ["http", "http"], CONFIG
    )
    assert choose(HostPolicy(), page(1), ["http"], CONFIG).reason == "only"
    with pytest.raises(ValueError, match="no applicable strategy"):
        choose(HostPolicy(), page(1), [], CONFIG)


def rate_limited(at: float, started: float | None = None, **fields: Any) -> Observation:
    event = attempt(
        page(1),
        "http",
        CrawlOutcome.BLOCKED_4XX,
        at=at,
        duration=at - started if started is not None else 0.05,
        status_code=fields.pop("status_code", 429),
        **fields,
    )
    return Observation.of(event)


def test_consecutive_429s_without_retry_after_double_the_pause() -> None:
    policy, now, pauses = HostPolicy(), T0, []
    for _ in range(5):
        policy = observe(policy, rate_limited(now), CONFIG)
        pauses.append(policy.paused_until - now)
        now = policy.paused_until + 1.0  # the next request goes when the pause ends
    for level, pause in enumerate(pauses, start=1):
        nominal = CONFIG.rate_base * 2 ** (level - 1)
        assert 0.9 * nominal <= pause <= 1.1 * nominal, pauses
    assert policy.rate_level == 5
    assert policy.pause_reason == "rate_limited"
    assert len(set(pauses)) == 5
    assert pauses == sorted(pauses)
    # Jitter is a function of the host and the level: every pod computes the same pause.
    again = observe(HostPolicy(), rate_limited(T0), CONFIG)
    assert again.paused_until - T0 == pauses[0]
    capped = HostPolicy(rate_level=20)
    assert observe(capped, rate_limited(T0), CONFIG).paused_until == T0 + CONFIG.rate_max


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_honoured_exactly_and_capped(status: int) -> None:
    outcome = CrawlOutcome.BLOCKED_4XX if status == 429 else CrawlOutcome.BLOCKED_5XX
    observation = Observation.of(
        attempt(page(1), "http", outcome, at=T0, status_code=status, retry_after=123.0)
    )
    policy = observe(HostPolicy(), observation, CONFIG)
    assert policy.paused_until == T0 + 123.0
    assert "Retry-After" in (policy.pause_reason or "")
    huge = Observation.of(
        attempt(page(1), "http", outcome, at=T0, status_code=status, retry_after=10**7)
    )
    assert observe(HostPolicy(), huge, CONFIG).paused_until == T0 + CONFIG.rate_max


def refusals(
    status: int, retry_after: float, count: int, *, spacing: float | None = None
) -> tuple[HostPolicy, float, list[float]]:
    """A host's policy after ``count`` refusals in a row, each asked a second after the
    last pause ended (or ``spacing`` seconds after the last), when the next would be
    asked, and the pause each left."""
    outcome = CrawlOutcome.BLOCKED_4XX if status == 429 else CrawlOutcome.BLOCKED_5XX
    policy, now, pauses = HostPolicy(), T0, []
    for _ in range(count):
        observation = Observation.of(
            attempt(page(1), "http", outcome, at=now, status_code=status, retry_after=retry_after)
        )
        policy = observe(policy, observation, CONFIG)
        pauses.append(policy.paused_until - now)
        now = policy.paused_until + 1.0 if spacing is None else now + spacing
    return policy, now, pauses


@pytest.mark.parametrize("status", [429, 503])
def test_a_retry_after_waited_out_and_refused_again_doubles(status: int) -> None:
    # A limiter answering every request "Retry-After: 1" is left alone longer each
    # time, as one that gives no Retry-After is, not asked once a gap for ever.
    outcome = CrawlOutcome.BLOCKED_4XX if status == 429 else CrawlOutcome.BLOCKED_5XX
    policy, now, pauses = refusals(status, 1.0, 14)
    assert pauses[:4] == [1.0, 2.0, 4.0, 8.0]
    assert pauses[-1] == CONFIG.rate_max
    assert "Retry-After" in (policy.pause_reason or "")
    # Forgiven by an answer, the next refusal's Retry-After is honoured as asked again.
    answered = Observation.of(
        attempt(page(2), "http", CrawlOutcome.SUCCESS, at=now, status_code=200)
    )
    policy = observe(policy, answered, CONFIG)
    again = Observation.of(
        attempt(page(1), "http", outcome, at=now + 5, status_code=status, retry_after=1.0)
    )
    assert observe(policy, again, CONFIG).paused_until == now + 5 + 1.0


@pytest.mark.parametrize("status", [429, 503])
def test_a_refusal_long_after_the_last_pause_starts_a_new_run(status: int) -> None:
    # A followed instance is polled only: its healthy polls fold no answer that would
    # forgive its refusals. One asked a day after the last pause ended is the first of
    # its run, its Retry-After honoured as asked, its pause without one the first.
    outcome = CrawlOutcome.BLOCKED_4XX if status == 429 else CrawlOutcome.BLOCKED_5XX
    policy = HostPolicy(rate_level=5, paused_until=T0, escalated_at=T0 - 60)
    later = T0 + 86_400

    def refused(retry_after: float | None) -> HostPolicy:
        observation = Observation.of(
            attempt(page(1), "http", outcome, at=later, status_code=status, retry_after=retry_after)
        )
        return observe(policy, observation, CONFIG)

    asked = refused(120.0)
    assert (asked.paused_until - later, asked.rate_level) == (120.0, 1)
    nominal = refused(None).paused_until - later
    assert 0.9 * CONFIG.rate_base <= nominal <= 1.1 * CONFIG.rate_base
    # Asked right at the pause's end, it is one more in a row.
    soon = Observation.of(
        attempt(page(1), "http", outcome, at=T0 + 5, status_code=status, retry_after=60.0)
    )
    assert observe(policy, soon, CONFIG).paused_until == T0 + 5 + 60.0 * 2**5


def test_refusals_a_long_gap_apart_are_still_in_a_row() -> None:
    # A Crawl-delay of two minutes, or a schedule running late: the next refusal comes
    # long after a short pause ended, and is one more in a row all the same.
    _, _, pauses = refusals(429, 1.0, 5, spacing=120.0)
    assert pauses == [1.0, 2.0, 4.0, 8.0, 16.0]


@pytest.mark.parametrize("status", [429, 503])
def test_a_retry_after_of_nothing_pauses_as_without_one(status: int) -> None:
    # "Retry-After: 0", or a date already past: the host still said no.
    _, _, pauses = refusals(status, 0.0, 3)
    for level, pause in enumerate(pauses, start=1):
        nominal = CONFIG.rate_base * 2 ** (level - 1)
        assert 0.9 * nominal <= pause <= 1.1 * nominal, pauses


def test_answers_already_in_flight_escalate_once() -> None:
    # Five requests left together; the first answer escalates, the other four arrive
    # after it from requests that had already started.
    policy = observe(HostPolicy(), rate_limited(T0, started=T0 - 1), CONFIG)
    first = policy.paused_until
    for k in range(1, 5):
        policy = observe(policy, rate_limited(T0 + k, started=T0 - 1), CONFIG)
    assert (policy.rate_level, policy.paused_until) == (1, first)
    # A request that started after the escalation does escalate.
    later = first + 1.0
    policy = observe(policy, rate_limited(later + 0.1, started=later), CONFIG)
    assert policy.rate_level == 2


class Limiter:
    """A host that lets one request through every ``window`` seconds, counted from the
    last it let through, and answers any sooner 429 (with the exact wait left as its
    Retry-After when ``tells``), asked by a crawler that keeps to ``host_gap`` from each
    answer's end and to each pause."""

    def __init__(self, window: float, *, tells: bool = False, gap: float = 10.0) -> None:
        self.window, self.tells, self.gap = window, tells, gap
        self.policy, self.now = HostPolicy(), T0
        self.let_through_at = -math.inf
        self.answered = self.refused = 0

    def run(self, seconds: float) -> Limiter:
        end = self.now + seconds
        while True:
            start = max(self.now, self.policy.paused_until)
            if start >= end:
                break
            waited = start - self.let_through_at
            if waited >= self.window:
                self.let_through_at = start
                self.answered += 1
                event = content(page(self.answered), "http", start + 0.1)
            else:
                self.refused += 1
                wait = self.window - waited if self.tells else None
                event = attempt(page(1), "http", CrawlOutcome.BLOCKED_4XX, at=start + 0.1,
                                duration=0.1, status_code=429, retry_after=wait)  # fmt: skip
            self.policy = observe(self.policy, Observation.of(event), CONFIG)
            self.now = start + 0.1 + host_gap(self.policy, self.gap, CONFIG)
        return self


@pytest.mark.parametrize("tells", [False, True], ids=["no-retry-after", "exact-retry-after"])
@pytest.mark.parametrize("window", [300.0, 900.0])
def test_a_strict_rate_limiter_is_asked_at_its_pace_and_refuses_few_requests_over_a_week(
    window: float, tells: bool
) -> None:
    # Without a pace, each answer forgave the refusals and the next request came a gap
    # later: three refusals in four without Retry-After, one in two with an exact one.
    host = Limiter(window, tells=tells).run(7 * 86_400)
    assert host.refused <= 0.03 * host.answered, (host.answered, host.refused)
    most = 7 * 86_400 / window
    assert host.answered >= 0.75 * most, (host.answered, most)
    assert window <= host.policy.pace <= 2 * window


def test_a_stray_429_slows_a_host_a_little_and_for_a_few_hours() -> None:
    host = Limiter(0.0)
    host.run(3_600)
    host.window = math.inf  # one refusal, then it lets every request through again
    host.run(5)
    host.let_through_at, host.window = -math.inf, 0.0
    host.run(200)
    assert host.refused == 1
    # Refused 10 s after an answer, let through after a minute's pause: the limit is
    # somewhere between, and the pace twice the refused spacing, a quarter more.
    assert 10.0 < host.policy.pace <= 2.5 * host.gap
    host.run(12 * 3_600)
    assert host.policy.pace == 0.0
    assert host_gap(host.policy, host.gap, CONFIG) == host.gap


def test_a_limiter_that_loosens_tenfold_is_asked_near_its_new_pace_within_two_days() -> None:
    host = Limiter(600.0).run(86_400)
    learned = host.policy.pace
    assert learned >= 600.0
    host.window = 60.0
    host.run(86_400)
    assert host.policy.pace < 0.5 * learned, host.policy.pace
    refused = host.refused
    host.run(86_400)
    # Let through a rate pause (a minute) after a refusal at its window, a quarter more.
    assert host.policy.pace <= 2.5 * host.window, host.policy.pace
    assert host.refused - refused <= 10


def test_a_pace_is_past_the_longest_gap_but_within_the_longest_backoff() -> None:
    config = LearningConfig(max_gap=120.0, rate_max=3_600.0)
    assert host_gap(HostPolicy(pace=900.0), 10.0, config) == 900.0
    assert host_gap(HostPolicy(pace=90_000.0), 10.0, config) == 3_600.0
    # Within a run of refusals the pauses decide: a refusal spent none of the window.
    assert host_gap(HostPolicy(pace=900.0, refused_after=30.0), 10.0, config) == 10.0


def test_one_run_of_refusals_paces_a_host_at_most_at_the_longest_gap() -> None:
    # Told to come back in ten minutes (a quota's reset, a maintenance), once: that
    # is no window yet, and an hour's pace would hold the host for days.
    answer = content(page(1), "http", T0)
    once = observe(HostPolicy(), Observation.of(answer), CONFIG)
    once = observe(once, rate_limited(T0 + 10, retry_after=600.0), CONFIG)
    once = observe(once, Observation.of(content(page(2), "http", T0 + 611)), CONFIG)
    assert once.pace == CONFIG.max_gap
    # Refused again at that pace: a window it is, and the pace goes past the gap.
    again = observe(once, rate_limited(T0 + 611 + CONFIG.max_gap, retry_after=600.0), CONFIG)
    again = observe(again, Observation.of(content(page(3), "http", T0 + 1_400)), CONFIG)
    assert CONFIG.max_gap < again.pace <= CONFIG.rate_max


def test_a_host_refused_after_being_left_alone_an_hour_is_not_refusing_a_spacing() -> None:
    answer = content(page(1), "http", T0)
    idle = observe(HostPolicy(), Observation.of(answer), CONFIG)
    idle = observe(idle, rate_limited(T0 + 3_000), CONFIG)
    assert idle.refused_after == 0.0
    idle = observe(idle, Observation.of(content(page(2), "http", T0 + 3_070)), CONFIG)
    assert idle.pace == 0.0


def polled(at: float, status: int, error: str, retry_after: float | None) -> Observation:
    """A timeline poll's last answer, as the fetcher folds it."""
    return Observation(
        started=at - 0.1, at=at, url="https://social.example", strategy="mastodon_api",
        success=False, is_banned=False, error_type=error, status=status,
        retry_after=retry_after, duration_ms=None,
    )  # fmt: skip


def test_a_timeline_polls_limits_teach_the_pages_no_pace() -> None:
    # An instance's API limits are not its pages', and its healthy polls fold nothing:
    # a poll's 429 neither starts a run the pages' pace learns from, nor does a poll's
    # nearly spent limit (answered with a 200) end one.
    answer = content("https://social.example/@a/1", "http", T0)
    host = observe(HostPolicy(), Observation.of(answer), CONFIG)
    host = observe(host, polled(T0 + 30, 429, "rate_limited", 300.0), CONFIG)
    assert host.refused_after == 0.0
    host = observe(host, polled(T0 + 400, 200, "rate_spent", 60.0), CONFIG)
    later = content("https://social.example/@a/2", "http", T0 + 500)
    host = observe(host, Observation.of(later), CONFIG)
    assert (host.pace, host.refused_after) == (0.0, 0.0)


def test_an_answer_time_ahead_of_every_answer_is_forgotten_not_kept_for_ever() -> None:
    damaged = HostPolicy(answered_at=1e11)
    healed = observe(damaged, Observation.of(content(page(1), "http", T0)), CONFIG)
    assert healed.answered_at == pytest.approx(T0 - 0.05)
    healed = observe(healed, rate_limited(T0 + 10), CONFIG)
    assert healed.refused_after > 0


def test_503s_a_quota_spent_for_hours_and_a_run_ended_a_day_later_teach_no_pace() -> None:
    answer = content(page(1), "http", T0)
    overloaded = observe(HostPolicy(), Observation.of(answer), CONFIG)
    for k in range(1, 4):
        unavailable = attempt(page(1), "http", CrawlOutcome.BLOCKED_5XX, at=T0 + 60.0 * k,
                              status_code=503)  # fmt: skip
        overloaded = observe(overloaded, Observation.of(unavailable), CONFIG)
    overloaded = observe(overloaded, Observation.of(content(page(2), "http", T0 + 600)), CONFIG)
    assert overloaded.pace == 0.0
    # A daily quota: refused from two hours after the last answer until the next day.
    quota = observe(HostPolicy(), Observation.of(answer), CONFIG)
    for hours in (2, 4, 8):
        quota = observe(quota, rate_limited(T0 + 3_600.0 * hours), CONFIG)
    quota = observe(quota, Observation.of(content(page(2), "http", T0 + 86_400)), CONFIG)
    assert quota.pace == 0.0
    assert quota.rate_level == 0
    # Refused a minute after an answer and told to wait another, then left alone a day:
    # the window is somewhere past two minutes, and nothing says where.
    once = observe(HostPolicy(), Observation.of(answer), CONFIG)
    once = observe(once, rate_limited(T0 + 60, retry_after=60.0), CONFIG)
    assert once.refused_after == pytest.approx(120.0, abs=0.1)
    once = observe(once, Observation.of(content(page(2), "http", T0 + 86_400)), CONFIG)
    assert (once.pace, once.refused_after) == (0.0, 0.0)


def down(at: float) -> Observation:
    return Observation.of(
        attempt(
            page(1),
            "http",
            CrawlOutcome.FAILED,
            at=at,
            duration=0.001,
            error_message="ConnectError: connection refused",
        )
    )


def test_a_down_host_pauses_for_longer_each_time_and_is_forgiven_after_success() -> None:
    policy, now, pauses = HostPolicy(), T0, []
    for _ in range(6):
        policy = observe(policy, down(now), CONFIG)
        pauses.append(policy.paused_until - now)
        now = policy.paused_until + 1.0
    for level, pause in enumerate(pauses, start=1):
        nominal = CONFIG.pause_base * 2 ** (level - 1)
        assert 0.9 * nominal <= pause <= 1.1 * nominal
    assert (policy.risk_level, policy.pause_reason) == (6, "network_error")
    assert policy.estimates == {}  # the host's health, not the strategy's fault
    capped = observe(HostPolicy(risk_level=30), down(T0), CONFIG)
    assert capped.paused_until == T0 + CONFIG.pause_max
    well = observe(policy, Observation.of(content(page(2), "http", now)), CONFIG)
    assert (well.risk_level, well.rate_level) == (0, 0)
    # A success from a request sent before the host failed forgives nothing.
    stale = attempt(page(3), "http", CrawlOutcome.SUCCESS, at=now, duration=now - T0 + 1)
    assert observe(policy, Observation.of(stale), CONFIG).risk_level == 6


def test_redirect_loops_and_archives_neither_pause_the_host_nor_teach_a_strategy() -> None:
    """A site whose pages loop through a cookie check, or that links its downloads,
    answers promptly every time: it is crawled at its gap, not paused as down."""
    policy, now = HostPolicy(), T0
    for n in range(10):
        loop = attempt(
            page(n),
            "http",
            CrawlOutcome.FAILED,
            at=now,
            status_code=301,
            error_message=f"redirect loop back to {page(n)}",
        )
        archive = attempt(
            f"https://blog.example/download/{n}",
            "http",
            CrawlOutcome.REJECTED,
            at=now + 1,
            status_code=200,
            content_type="application/zip",
            error_message="content type application/zip is not parsed",
        )
        policy = observe(policy, Observation.of(loop), CONFIG)
        policy = observe(policy, Observation.of(archive), CONFIG)
        now += 10
    assert (policy.risk_level, policy.paused_until) == (0, 0.0)
    assert policy.estimates == {}


def test_a_5xx_with_retry_after_pauses_at_least_that_long() -> None:
    observation = Observation.of(
        attempt(page(1), "http", CrawlOutcome.BLOCKED_5XX, at=T0, status_code=500, retry_after=900)
    )
    policy = observe(HostPolicy(), observation, CONFIG)
    assert policy.paused_until >= T0 + 900
    assert (policy.risk_level, policy.pause_reason) == (1, "server_error")


def test_a_slow_host_gets_a_longer_gap_never_below_the_minimum() -> None:
    config = LearningConfig(min_gap=1.0, max_gap=60.0)
    slow, fast = HostPolicy(), HostPolicy()
    for k in range(10):
        at = T0 + 10 * k
        slow_event = attempt(page(k), "http", CrawlOutcome.SUCCESS, at=at, duration=2.0,
                             status_code=200, title="t")  # fmt: skip
        slow = observe(slow, Observation.of(slow_event), config)
        fast = observe(fast, Observation.of(content(page(k), "http", at)), config)
    assert host_gap(slow, 1.0, config) > host_gap(fast, 1.0, config)
    assert host_gap(slow, 1.0, config) == 20.0  # ten times 2 s
    assert host_gap(fast, 1.0, config) == 1.0
    assert host_gap(fast, 0.2, config) == 1.0  # never below the minimum
    assert host_gap(fast, 5.0, config) == 5.0  # nor below the host's Crawl-delay
    assert host_gap(HostPolicy(response_ms=10**7), 1.0, config) == 60.0


def test_one_slow_answer_does_not_lengthen_the_gap_but_a_host_turning_slow_does() -> None:
    """The gap follows the median of the last answers: a single stall (the host's, or
    the measuring pod's own) is not the host's pace."""
    config = LearningConfig(min_gap=1.0, max_gap=60.0)
    policy = HostPolicy()

    def answered(k: int, seconds: float) -> HostPolicy:
        event = attempt(page(k), "http", CrawlOutcome.SUCCESS, at=T0 + 10 * k,
                        duration=seconds, status_code=200, title="t")  # fmt: skip
        return observe(policy, Observation.of(event), config)

    for k in range(5):
        policy = answered(k, 0.01)
    policy = answered(5, 3.0)  # one stall
    assert host_gap(policy, 1.0, config) == 1.0
    policy = answered(6, 0.01)
    policy = answered(7, 3.0)  # another, two in the last five
    assert host_gap(policy, 1.0, config) == 1.0
    for k in range(8, 10):
        policy = answered(k, 2.0)  # the host turns slow: most of the last five
    assert host_gap(policy, 1.0, config) == 20.0
    assert len(policy.recent_ms) == 5


def test_validators_are_dropped_only_where_the_host_clearly_ignores_them() -> None:
    history = ChangeHistory(content_hash="h1")

    def conditional(k: int, status: int) -> Observation:
        outcome = CrawlOutcome.NOT_MODIFIED if status == 304 else CrawlOutcome.SUCCESS
        event = attempt(
            page(k), "http", outcome, at=T0 + k, status_code=status, title="t",
            content_hash="h1", history=history, conditional=True,
        )  # fmt: skip
        return Observation.of(event)

    honours, ignores = HostPolicy(), HostPolicy()
    for k in range(1, 6):
        honours = observe(honours, conditional(k, 304), CONFIG)
        ignores = observe(ignores, conditional(k, 200), CONFIG)
    assert (honours.validators_honoured, honours.validators_ignored) == (5, 0)
    assert (ignores.validators_honoured, ignores.validators_ignored) == (0, 5)
    assert send_validators(honours)
    assert send_validators(HostPolicy())
    assert not send_validators(ignores)
    # A changed page answered 200 is no sign of ignoring them.
    changed = attempt(page(9), "http", CrawlOutcome.SUCCESS, at=T0, status_code=200, title="t",
                      content_hash="h2", history=history, conditional=True)  # fmt: skip
    assert observe(HostPolicy(), Observation.of(changed), CONFIG).validators_ignored == 0


def test_the_policy_round_trips_through_compact_json() -> None:
    crawl = Crawl(spa_site, page)
    crawl.fetch(30)
    policy = observe(crawl.policy, rate_limited(crawl.now + 1), CONFIG)
    raw = policy.to_json()
    assert HostPolicy.from_json(raw) == HostPolicy.from_json(json.dumps(raw))
    back = HostPolicy.from_json(json.dumps(raw).encode())
    # Lossless: a pod that reads its record back folds on what was folded.
    assert back == policy
    assert back.rate_level == 1
    assert HostPolicy().to_json() == {}
    assert len(json.dumps(raw)) < 400


def test_reading_a_policy_tolerates_unknown_missing_and_bad_fields() -> None:
    assert HostPolicy.from_json({"from_a_newer_pod": {"x": 1}, "risk_level": 2}) == HostPolicy(
        risk_level=2
    )
    assert HostPolicy.from_json(b"not json") == HostPolicy()
    assert HostPolicy.from_json([1, 2]) == HostPolicy()
    assert HostPolicy.from_json(None) == HostPolicy()
    odd = HostPolicy.from_json(
        {
            "risk_level": "high",
            "paused_until": float("nan"),
            "pause_reason": 5,
            "response_ms": "slow",
            "attempts": True,
            "estimates": {"page:http": [3, "x"], "nocolon": [1, 1], "page:activitypub": [2, 1]},
        }
    )
    assert odd == HostPolicy(estimates={"page:activitypub": (2.0, 1.0)})
    many = {f"class{k}:http": [1, 0] for k in range(100)}
    assert len(HostPolicy.from_json({"estimates": many}).estimates) == 32


def test_a_record_of_numbers_past_any_fold_is_read_within_bounds_and_folds_on() -> None:
    """A hand-made or damaged record: a 429's pause from a level of 5000 was 2.0**4999
    (an OverflowError that lost the pause and stopped the recorder's batch), a time of
    1e300 overflowed the recorder's timestamps, and two answer times near a float's
    largest had an infinite median, which JSON for Postgres cannot hold."""
    odd = HostPolicy.from_json(
        {
            "rate_level": 5000,
            "risk_level": 10**9,
            "escalated_at": T0 - 10,
            "paused_until": 1e300,
            "recent_ms": [1.7e308, 1.7e308],
            "estimates": {"page:http": [1e200, 1e200]},
        }
    )
    assert (odd.rate_level, odd.risk_level) == (MAX_LEVEL, MAX_LEVEL)
    assert datetime.fromtimestamp(odd.paused_until, UTC).year < 9000
    # A 429 asking 30 s, from a request in flight before the last escalation.
    later = observe(odd, rate_limited(T0, started=T0 - 20, retry_after=30.0), CONFIG)
    assert later.rate_level == MAX_LEVEL
    assert math.isfinite(later.paused_until)
    assert later.response_ms is not None
    assert math.isfinite(later.response_ms)
    json.dumps(later.to_json(), allow_nan=False)
    assert choose(later, "https://a.example/", BOTH, CONFIG).strategy in BOTH


def test_a_url_class_name_too_long_to_be_read_back_is_refused(tmp_path: Path) -> None:
    # Its estimates' keys were cut when a record was read, and nothing was learned.
    long = tmp_path / "long.toml"
    long.write_text(f'[[class]]\nname = "{"c" * 70}"\npriors = {{ http = 0.5 }}\n')
    with pytest.raises(InvalidPriors, match="characters"):
        load_priors(long)


def test_the_shipped_priors_classify_urls() -> None:
    priors = load_priors()
    assert priors.url_class("https://a.example/paper.PDF") == "document"
    assert priors.url_class("https://a.example/static/clip.mp4") == "media"
    assert priors.url_class("https://a.example/cdn/bundle.js") == "asset"
    assert priors.url_class("https://a.example/static/app.css") == "asset"
    assert priors.url_class("https://m.example/@alice/1093847") == "post"
    assert priors.url_class("https://m.example/users/alice/statuses/1093847") == "post"
    assert priors.url_class("https://p.example/notice/AbC123") == "post"
    assert (
        priors.url_class("https://p.example/objects/0b0c5f5e-8a0d-4c4e-9d8e-5b8f2c1d3e4f") == "post"
    )
    assert priors.url_class("https://a.example/@alice") == "page"
    assert priors.url_class("https://a.example/") == "page"
    assert priors.seed("document", "http")[0] == pytest.approx(0.95 * priors.weight)
    assert priors.seed("post", "activitypub")[0] == pytest.approx(0.8 * priors.weight)


def test_an_operator_priors_file_replaces_the_shipped_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = tmp_path / "priors.toml"
    mine.write_text(
        'weight = 4\n[[class]]\nname = "wiki"\npaths = ["^/wiki/"]\n'
        "priors = { activitypub = 1.0 }\n"
        '[[class]]\nname = "page"\npriors = { http = 0.5 }\n'
    )
    monkeypatch.setenv("TROVE_PRIORS_FILE", str(mine))
    monkeypatch.setenv("TROVE_HOST_PAUSE_SECONDS", "5")
    config = LearningConfig.from_settings(CommonSettings())
    assert config.priors.url_class("https://w.example/wiki/Tea") == "wiki"
    assert choose(HostPolicy(), "https://w.example/wiki/Tea", BOTH, config).strategy == (
        "activitypub"
    )
    assert config.pause_base == 5.0
    bad = tmp_path / "bad.toml"
    bad.write_text('[[class]]\nname = "page"\npriors = { http = 1.5 }\n')
    with pytest.raises(InvalidPriors, match="importance"):
        load_priors(bad)
    with pytest.raises(InvalidPriors):
        load_priors(tmp_path / "missing.toml")


def test_a_learning_config_by_default_is_the_one_the_settings_give_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bare ``LearningConfig()`` (the CLI's and the tests') says what a service
    configured by default does."""
    for name in [n for n in os.environ if n.startswith("TROVE_")]:
        monkeypatch.delenv(name)
    assert LearningConfig() == LearningConfig.from_settings(CommonSettings())


def test_the_fetcher_and_the_recorder_read_the_same_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TROVE_MIN_DOMAIN_DELAY_SECONDS", "2")
    monkeypatch.setenv("TROVE_MAX_DOMAIN_DELAY_SECONDS", "30")
    monkeypatch.setenv("TROVE_MAX_BACKOFF_SECONDS", "600")
    monkeypatch.setenv("TROVE_GAP_RESPONSE_FACTOR", "4")
    monkeypatch.setenv("TROVE_BAN_PAUSE_SECONDS", "7")
    monkeypatch.setenv("TROVE_RATE_PAUSE_SECONDS", "3")
    monkeypatch.setenv("TROVE_HOST_PAUSE_MAX_SECONDS", "99")
    config = LearningConfig.from_settings(FetcherSettings())
    assert (config.min_gap, config.max_gap, config.rate_max, config.response_factor) == (
        2.0,
        30.0,
        600.0,
        4.0,
    )
    assert (config.ban_pause, config.rate_base, config.pause_max) == (7.0, 3.0, 99.0)
    # The recorder folds the same events for the operator: it must see the same pauses.
    assert LearningConfig.from_settings(RecorderSettings()) == config


def test_an_observation_agrees_with_the_audit() -> None:
    for event in (
        content(page(1), "http", T0),
        wrong_tool(page(1), "activitypub", T0),
        challenge(page(1), "http", T0),
        attempt(page(1), "http", CrawlOutcome.TIMEOUT, at=T0),
    ):
        verdict, observation = audit(event), Observation.of(event)
        assert (observation.success, observation.is_banned, observation.error_type) == (
            verdict.success,
            verdict.is_banned,
            verdict.error_type,
        )
        assert observation.strategy == event.fetcher
        assert observation.started < observation.at
    assert Observation.of(shell(page(1), "http", T0)).error_type == "wrong_tool"


def test_a_plain_403_pauses_the_host_briefly_and_a_success_forgives_it() -> None:
    forbidden = attempt(page(1), "http", CrawlOutcome.BLOCKED_4XX, at=T0, status_code=403)
    policy = observe(HostPolicy(), Observation.of(forbidden), CONFIG)
    assert policy.pause_reason == "forbidden"
    assert T0 + CONFIG.pause_base * 0.9 <= policy.paused_until <= T0 + CONFIG.pause_base * 1.1
    assert policy.banned_at == 0.0  # not a ban: exploration is not barred for a month
    again = attempt(page(2), "http", CrawlOutcome.BLOCKED_4XX, at=T0 + 100, status_code=403)
    policy = observe(policy, Observation.of(again), CONFIG)
    assert policy.paused_until >= T0 + 100 + 2 * CONFIG.pause_base * 0.9
    policy = observe(policy, Observation.of(content(page(3), "http", T0 + 400)), CONFIG)
    assert policy.risk_level == 0
    assert policy.estimates  # the success taught the choice; the 403s did not


def test_a_timeout_does_not_teach_the_host_is_slow() -> None:
    fast = attempt(
        page(1), "http", CrawlOutcome.SUCCESS, at=T0, duration=0.04, status_code=200, title="t"
    )
    policy = observe(HostPolicy(), Observation.of(fast), CONFIG)
    stalled = attempt(
        page(2), "http", CrawlOutcome.TIMEOUT, at=T0 + 60, duration=30.0, status_code=200
    )
    policy = observe(policy, Observation.of(stalled), CONFIG)
    assert policy.response_ms == 40


# -- a host that moved ----------------------------------------------------------------


def redirect(url: str, target: str, at: float, *, status: int = 301) -> CrawlCompleted:
    """A redirect to another host, answered and not followed, as the fetcher records it."""
    return attempt(
        url,
        "http",
        CrawlOutcome.REJECTED,
        at=at,
        status_code=status,
        error_message="redirected to another host",
        links=[{"url": target, "kind": "redirect"}],
    )


def fold(policy: HostPolicy, *events: CrawlCompleted) -> HostPolicy:
    for event in events:
        policy = observe(policy, Observation.of(event), CONFIG)
    return policy


def test_a_host_whose_redirects_keep_the_path_to_one_origin_has_moved_there() -> None:
    policy = fold(
        HostPolicy(),
        redirect("http://www.moved.test/", "https://moved.test/", T0),
    )
    assert moved(policy, T0, CONFIG) is None  # one redirect may be one page moved
    policy = fold(
        policy, redirect("http://www.moved.test/b?x=1", "https://moved.test/b?x=1", T0 + 10)
    )
    assert moved(policy, T0 + 10, CONFIG) == "https://moved.test"
    assert moved_url("http://www.moved.test/c/d?e=f", "https://moved.test") == (
        "https://moved.test/c/d?e=f"
    )
    # Until the recheck: then its next request finds out, and a redirect renews it.
    later = T0 + 10 + CONFIG.move_recheck
    assert moved(policy, later, CONFIG) is None
    policy = fold(policy, redirect("http://www.moved.test/e", "https://moved.test/e", later))
    assert moved(policy, later, CONFIG) == "https://moved.test"
    assert HostPolicy.from_json(json.loads(json.dumps(policy.to_json()))) == policy


@pytest.mark.parametrize(
    "second",
    [
        # Its own answer: the host serves pages.
        lambda at: content("http://www.moved.test/b", "http", at),
        lambda at: attempt(
            "http://www.moved.test/b", "http", CrawlOutcome.BLOCKED_4XX, at=at, status_code=404
        ),
        # Every path to the other host's home page: not the same pages there.
        lambda at: redirect("http://www.moved.test/b", "https://moved.test/", at),
        # Another origin: the votes start again.
        lambda at: redirect("http://www.moved.test/b", "https://elsewhere.test/b", at),
    ],
    ids=["content", "not-found", "path-not-kept", "another-origin"],
)
def test_a_move_is_not_learned_or_is_forgotten_on_evidence_against_it(
    second: Callable[[float], CrawlCompleted],
) -> None:
    one = redirect("http://www.moved.test/", "https://moved.test/", T0)
    assert moved(fold(HostPolicy(), one, second(T0 + 1)), T0 + 1, CONFIG) != "https://moved.test"
    learned = fold(
        HostPolicy(), one, redirect("http://www.moved.test/c", "https://moved.test/c", T0 + 1)
    )
    assert moved(learned, T0 + 2, CONFIG) == "https://moved.test"
    assert moved(fold(learned, second(T0 + 2)), T0 + 2, CONFIG) is None


def test_redirects_of_one_part_of_a_site_or_for_now_are_not_the_host_moving() -> None:
    # /files/ sent to a download host, path kept: the rest of the site is still here.
    section = fold(
        HostPolicy(),
        redirect("http://files.test/files/a.pdf", "https://dl.files.test/files/a.pdf", T0),
        redirect("http://files.test/files/b.pdf", "https://dl.files.test/files/b.pdf", T0 + 1),
        redirect("http://files.test/files/c.pdf", "https://dl.files.test/files/c.pdf", T0 + 2),
    )
    assert moved(section, T0 + 3, CONFIG) is None
    # Another part of the site too, while the home page stays: /docs/ and /api/ moved
    # to a subdomain are not the host moving (its other pages would be asked for there).
    parts = fold(
        section, redirect("http://files.test/about", "https://dl.files.test/about", T0 + 3)
    )
    assert moved(parts, T0 + 4, CONFIG) is None
    # The home page as well makes it the host's move.
    home = redirect("http://files.test/", "https://dl.files.test/", T0 + 4)
    assert moved(fold(parts, home), T0 + 5, CONFIG) == "https://dl.files.test"
    assert moved(fold(section, home), T0 + 5, CONFIG) == "https://dl.files.test"
    # A 302 or 307 keeps no vote: moved for now is not moved.
    for status in (302, 307):
        passing = fold(
            HostPolicy(),
            redirect("http://www.moved.test/a", "https://moved.test/a", T0, status=status),
            redirect("http://www.moved.test/b", "https://moved.test/b", T0 + 1, status=status),
        )
        assert moved(passing, T0 + 2, CONFIG) is None, status
        assert passing.move_votes == 0


def test_a_long_section_votes_alike_whether_its_record_was_stored_between() -> None:
    # Two redirects of one part of a site whose first segment is longer than a stored
    # section: one vote, whether a pod folds both or reads the first back from the bucket.
    section = "s" * 400
    first = redirect(f"http://www.moved.test/{section}/a", f"https://moved.test/{section}/a", T0)
    second = redirect(
        f"http://www.moved.test/{section}/b", f"https://moved.test/{section}/b", T0 + 1
    )
    in_memory = fold(HostPolicy(), first, second)
    stored = HostPolicy.from_json(json.loads(json.dumps(fold(HostPolicy(), first).to_json())))
    read_back = fold(stored, second)
    assert moved(in_memory, T0 + 1, CONFIG) is None
    assert moved(read_back, T0 + 1, CONFIG) is None
    assert read_back.move_votes == in_memory.move_votes == 1


def test_a_vote_kept_before_sections_were_is_not_a_confirmation() -> None:
    # Written by the release before: one vote, no section (it may have been a 302).
    pending = HostPolicy(move_origin="https://moved.test", move_votes=1)
    once = fold(pending, redirect("http://www.moved.test/a", "https://moved.test/a", T0))
    assert moved(once, T0, CONFIG) is None
    twice = fold(once, redirect("http://www.moved.test/", "https://moved.test/", T0 + 1))
    assert moved(twice, T0 + 1, CONFIG) == "https://moved.test"
    # A move it had confirmed without the home page is not obeyed, and is renewed once
    # the home page says so.
    known = HostPolicy(
        moved_to="https://moved.test", moved_at=T0, move_origin="https://moved.test", move_votes=2
    )
    assert moved(known, T0 + 1, CONFIG) is None
    later = T0 + CONFIG.move_recheck
    part = fold(known, redirect("http://www.moved.test/c", "https://moved.test/c", later))
    assert moved(part, later, CONFIG) is None
    renewed = fold(part, redirect("http://www.moved.test/", "https://moved.test/", later + 1))
    assert moved(renewed, later + 1, CONFIG) == "https://moved.test"


def test_a_failure_or_an_error_page_says_nothing_about_a_move() -> None:
    learned = fold(
        HostPolicy(),
        redirect("http://www.moved.test/", "https://moved.test/", T0),
        redirect("http://www.moved.test/b", "https://moved.test/b", T0 + 1),
    )
    timeout = attempt("http://www.moved.test/c", "http", CrawlOutcome.TIMEOUT, at=T0 + 2)
    unavailable = attempt(
        "http://www.moved.test/d", "http", CrawlOutcome.FAILED, at=T0 + 3, status_code=503
    )
    assert moved(fold(learned, timeout, unavailable), T0 + 3, CONFIG) == "https://moved.test"
