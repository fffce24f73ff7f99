"""What a robots.txt may cost the fetcher's event loop is bounded, however it is written.

protego parses a file and matches a URL in Python, rule by rule: a file of wildcard
rules, user agents sharing a group (each gets a copy of its rules), or a URL of many
query parameters (each order a match of its own) would cost the fetcher more than a
page. Past ``MAX_ROBOTS_WORK`` the URL is refused unmatched, never allowed unread, and
the refusal says why; every file of 500 KiB of plain rules is still read and judged.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from protego import Protego
from protego._urlpattern import _URLPattern

from trove_fetcher import robots as robots_module
from trove_fetcher.completion import robots_refusal
from trove_fetcher.robots import (
    MAX_ROBOTS_WORK,
    RobotsPolicy,
    RobotsRule,
    _named_by_token,
    _rules_only,
)
from trove_schema.events import CrawlOutcome, PageDiscovered, Provenance, Scope

SITE = "https://site.example"
MANY_PARAMETERS = f"{SITE}/search?" + "&".join(f"p{n:02d}=v" for n in range(20))


def policy_of(body: bytes) -> RobotsPolicy:
    return RobotsPolicy(origin=SITE, rule=RobotsRule.PARSED, fetched_at=0.0, body=_rules_only(body))


@pytest.fixture(autouse=True)
def fresh_parses() -> Iterator[None]:
    robots_module._parsed.clear()
    robots_module._parsed_bytes = 0
    yield
    robots_module._parsed.clear()
    robots_module._parsed_bytes = 0


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the texts protego is asked to parse."""
    calls: list[int] = []
    parse: Callable[[str], Protego] = Protego.parse

    def counted(cls: type[Protego], content: str) -> Protego:
        calls.append(len(content))
        return parse(content)

    monkeypatch.setattr(Protego, "parse", classmethod(counted))
    return calls


@pytest.fixture
def matches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry for each rule protego tries against a URL."""
    calls: list[int] = []
    match = _URLPattern.match

    def counted(self: _URLPattern, url: str) -> Any:
        calls.append(1)
        return match(self, url)

    monkeypatch.setattr(_URLPattern, "match", counted)
    return calls


def test_a_file_of_wildcards_too_costly_to_parse_refuses_its_urls_unparsed(
    parses: list[int], matches: list[int]
) -> None:
    # 6,000 rules of two wildcards and an end anchor each: some 120 KiB, well under the
    # size cap, and protego would make 12,000 rules of them to try one by one.
    body = b"User-agent: *\n" + b"".join(b"Disallow: /*%d*x$\n" % n for n in range(6_000))
    policy = policy_of(body)
    assert not policy.allows(f"{SITE}/page")
    assert not policy.allows(f"{SITE}/other")
    assert parses == []
    assert matches == []
    reason = policy.unjudged(f"{SITE}/page")
    assert reason is not None
    assert reason.startswith("robots.txt too costly to judge")
    assert policy.crawl_delay() is None
    assert policy.sitemaps() == ()


def test_user_agents_sharing_a_group_cannot_multiply_its_rules_past_the_bound(
    parses: list[int],
) -> None:
    # 300 crawlers named over one group of 300 rules: 90,000 rules for protego to make,
    # from a file of 6 KiB.
    agents = ["".join(pair) for pair in itertools.product(string.ascii_lowercase, repeat=2)]
    body = b"".join(f"User-agent: {agent}\n".encode() for agent in agents[:300]) + b"".join(
        b"Disallow: /p%d\n" % n for n in range(300)
    )
    policy = policy_of(body)
    assert not policy.allows(f"{SITE}/elsewhere")
    assert parses == []
    assert policy.unjudged(f"{SITE}/elsewhere") is not None


def test_a_url_of_many_parameters_costs_the_matcher_no_more_than_the_bound(
    parses: list[int], matches: list[int]
) -> None:
    # Every URL under /s starts with a rule's prefix, so protego tries all 5,000 rules,
    # longest first, for each order of its query it is asked about.
    body = b"User-agent: *\nAllow: /s\n" + b"".join(
        b"Disallow: /s/%d?x\n" % n for n in range(5_000)
    )
    policy = policy_of(body)
    assert not policy.allows(MANY_PARAMETERS)
    assert len(matches) <= MAX_ROBOTS_WORK
    reason = policy.unjudged(MANY_PARAMETERS)
    assert reason is not None
    assert reason.startswith("robots.txt too costly to judge")
    # A URL of a few parameters is judged, every order of it.
    matches.clear()
    few = f"{SITE}/search?a=1&b=2&c=3"
    assert policy.allows(few)
    assert policy.unjudged(few) is None
    assert 3 * 5_000 < len(matches) <= MAX_ROBOTS_WORK
    assert not policy.allows(f"{SITE}/s/7?x&a=1")
    assert len(parses) == 1


def test_a_url_refused_as_too_costly_to_judge_is_recorded_as_such() -> None:
    body = b"User-agent: *\n" + b"".join(b"Disallow: /*%d*x$\n" % n for n in range(6_000))
    work = PageDiscovered(
        url=f"{SITE}/page",
        domain="site.example",
        scope=Scope(value="site.example"),
        provenance=Provenance(kind="seed"),
    )
    refused = robots_refusal(work, policy_of(body), url=work.url)
    assert refused.outcome is CrawlOutcome.BLOCKED_ROBOTS
    assert refused.error_message is not None
    assert refused.error_message.startswith("robots.txt too costly to judge")
    plain = robots_refusal(work, policy_of(b"User-agent: *\nDisallow: /\n"), url=work.url)
    assert plain.error_message == "disallowed by robots.txt"


def test_every_file_of_500_kib_of_plain_rules_is_still_judged(parses: list[int]) -> None:
    # The shortest rules there are, as many as 500 KiB holds: RFC 9309 asks that much
    # be read.
    body = b"User-agent: *\n" + b"Allow:/a\n" * (500 * 1024 // 9) + b"Disallow: /b\n"
    policy = policy_of(body)
    assert policy.allows(f"{SITE}/a")
    assert not policy.allows(f"{SITE}/b")
    assert policy.unjudged(f"{SITE}/b") is None
    assert len(parses) == 1


#: The crawlers large sites name, each given the same rules or one group in common.
ENGINES = [
    *("Googlebot", "Bingbot", "Slurp", "DuckDuckBot", "Baiduspider", "YandexBot"),
    *("Applebot", "facebookexternalhit", "Twitterbot", "LinkedInBot"),
]
#: A shop's faceted search: 250 rules, 100 of them wildcards.
SHOP_RULES = [f"Disallow: /*?*facet{n}=" for n in range(100)] + [
    f"Disallow: /private/section{n}/" for n in range(150)
]
#: A URL of six ordinary parameters, which no rule above refuses.
SHOP_URL = f"{SITE}/c/shoes?brand=acme&colour=red&page=2&size=42&sort=price&view=grid"


def test_a_file_repeating_its_rules_for_each_search_engine_judges_urls_of_six_parameters(
    matches: list[int],
) -> None:
    """A URL is matched against one group's rules (the one TroveBot falls in): the
    copies for other crawlers cost it nothing."""
    groups = [*ENGINES, "GPTBot", "CCBot", "*"]
    body = "".join(f"User-agent: {agent}\n" + "\n".join(SHOP_RULES) + "\n\n" for agent in groups)
    policy = policy_of(body.encode())
    assert policy.allows(SHOP_URL)
    assert policy.unjudged(SHOP_URL) is None
    assert len(matches) <= MAX_ROBOTS_WORK


def test_search_engines_sharing_one_large_group_still_have_it_parsed(
    parses: list[int],
) -> None:
    """protego makes a rule's pattern once for all the crawlers its group names."""
    rules = [f"Disallow: /*?*facet{n}=" for n in range(1_000)] + [
        f"Disallow: /private/section{n}/" for n in range(1_500)
    ]
    body = "".join(f"User-agent: {agent}\n" for agent in [*ENGINES, "*"]) + "\n".join(rules)
    policy = policy_of(body.encode())
    assert policy.allows(f"{SITE}/about")
    assert not policy.allows(f"{SITE}/private/section7/page")
    assert len(parses) == 1


def test_a_group_naming_again_thousands_of_agents_named_before_is_not_parsed(
    parses: list[int],
) -> None:
    """protego looks for each agent named before in the list of those its group names so
    far: thousands of them named again are millions of comparisons, from 500 KiB."""
    agents = ["".join(pair) for pair in itertools.product(string.ascii_lowercase, repeat=3)]
    named = agents[:8_000]
    body = "".join(f"User-agent: {agent}\nAllow: /\n" for agent in named)
    body += "".join(f"User-agent: {agent}\n" for agent in named) + "Disallow: /x\n"
    policy = policy_of(body.encode())
    assert not policy.allows(f"{SITE}/elsewhere")
    assert parses == []


BOTS = ["".join(pair) + "bot" for pair in itertools.product(string.ascii_lowercase, repeat=2)]


@pytest.mark.parametrize(
    "groups",
    [
        # A block list given again with a Crawl-delay.
        "".join(f"User-agent: {bot}\n" for bot in BOTS[:400])
        + "Disallow: /\n\n"
        + "".join(f"User-agent: {bot}\n" for bot in BOTS[:400])
        + "Crawl-delay: 10\n\n",
        # Full user-agent strings pasted from logs: each one's product token is "mozilla".
        "".join(f"User-agent: Mozilla/5.0 (compatible; Scraper{n}/1.0)\n" for n in range(400))
        + "".join(f"Disallow: /p{n}\n" for n in range(300))
        + "\n",
    ],
    ids=["a block list twice", "pasted user-agent strings"],
)
def test_agents_named_again_in_ordinary_ways_leave_the_file_judged(groups: str) -> None:
    policy = policy_of((groups + "User-agent: *\nDisallow: /admin/\n").encode())
    assert policy.unjudged(f"{SITE}/page") is None
    assert policy.allows(f"{SITE}/page")
    assert not policy.allows(f"{SITE}/admin/x")


def _named_over(agents: int, rule: str) -> bytes:
    named = "".join(f"User-agent: {agent}\n" for agent in BOTS[:agents])
    return (named + rule + "\n\nUser-agent: *\nDisallow: /admin/\n").encode()


def test_a_long_rule_many_agents_share_is_not_made_again_for_each() -> None:
    """protego makes an "index.html" Allow's pattern again for each agent of its group:
    one of 100 KB over 600 agents was 60 MB of patterns from a file of 100 KB."""
    body = _named_over(600, "Allow: /" + "a" * 100_000 + "/index.html")
    policy = policy_of(body)
    assert policy.allows(f"{SITE}/page")
    parser = robots_module._parsed[policy._key].parser
    assert parser is not None
    held = sum(
        len(rule.value._pattern) for agent in parser._user_agents.values() for rule in agent._rules
    )
    assert held <= 4 * len(body)


@pytest.mark.parametrize("field", ["Request-rate", "Visit-time", "Crawl-delay"])
def test_a_long_value_many_agents_share_is_read_as_its_beginning(field: str) -> None:
    body = _named_over(600, f"{field}: 1/5 " + "x " * 50_000)
    named, _, work, _ = _named_by_token(body.decode())
    assert max(len(line) for line in named.split("\n")) < 100
    assert work < MAX_ROBOTS_WORK
    assert policy_of(body).allows(f"{SITE}/page")


def test_a_rule_of_escapes_as_long_as_a_url_when_decoded_is_kept() -> None:
    # 700 "%61" are 2,100 characters, and match 700 "a"s.
    body = ("User-agent: *\nDisallow: /" + "%61" * 700 + "\n").encode()
    assert not policy_of(body).allows(f"{SITE}/{'a' * 700}/page")


def test_a_rule_longer_than_any_url_is_left_out_and_its_group_still_ends() -> None:
    body = (
        "User-agent: trovebot\nDisallow: /" + "a" * 3_000 + "\n\nUser-agent: *\nDisallow: /\n"
    ).encode()
    policy = policy_of(body)
    assert policy.allows(f"{SITE}/page", token="TroveBot")
    assert not policy.allows(f"{SITE}/page", token="OtherBot")
