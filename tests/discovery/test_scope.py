"""Scope decisions: host, domain, pattern, open, and depth."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from trove_discovery.scope import follow_link, in_scope
from trove_schema.events import Scope, ScopeKind

HOST = Scope(kind=ScopeKind.HOST, value="example.org")
WWW_HOST = Scope(kind=ScopeKind.HOST, value="www.example.org")
DOMAIN = Scope(kind=ScopeKind.DOMAIN, value="example.co.uk")


@pytest.mark.parametrize(
    ("url", "scope", "inside"),
    [
        ("https://example.org/a", HOST, True),
        ("http://example.org:8080/a", HOST, True),  # the port does not matter
        ("https://www.example.org/a", HOST, True),  # the www twin
        ("https://example.org/a", WWW_HOST, True),
        ("https://www.example.org/a", WWW_HOST, True),
        ("https://blog.example.org/", HOST, False),
        ("https://www.blog.example.org/", HOST, False),
        ("https://example.com/", HOST, False),
        ("https://notexample.org/", HOST, False),
        ("https://example.org.evil.example/", HOST, False),
        ("https://blog.example.co.uk/", DOMAIN, True),
        ("https://example.co.uk/", DOMAIN, True),
        ("https://a.b.example.co.uk/", DOMAIN, True),
        ("https://other.co.uk/", DOMAIN, False),
        ("https://badexample.co.uk/", DOMAIN, False),
        ("https://example.co.uk.evil.example/", DOMAIN, False),
        ("http:///no-host", HOST, False),
    ],
)
def test_host_and_domain_scopes(url: str, scope: Scope, inside: bool) -> None:
    assert in_scope(url, scope) is inside


def test_a_domain_scope_on_a_subdomain_seed_covers_its_siblings() -> None:
    scope = Scope(kind=ScopeKind.DOMAIN, value="example.co.uk")
    assert in_scope("https://shop.example.co.uk/", scope)
    assert not in_scope("https://shop.example.com/", scope)


def test_a_domain_scope_does_not_spread_over_a_private_suffix() -> None:
    scope = Scope(kind=ScopeKind.DOMAIN, value="alice.github.io")
    assert in_scope("https://docs.alice.github.io/", scope)
    assert not in_scope("https://bob.github.io/", scope)


def test_a_pattern_scope_searches_the_canonical_url() -> None:
    scope = Scope(kind=ScopeKind.PATTERN, value=r"/docs/")
    assert in_scope("https://example.org/docs/intro", scope)
    assert in_scope("https://anything.example/v2/docs/", scope)
    assert not in_scope("https://example.org/blog/", scope)


def test_an_anchored_pattern_keeps_to_its_prefix() -> None:
    scope = Scope(kind=ScopeKind.PATTERN, value=r"^https://example\.org/blog/\d{4}/")
    assert in_scope("https://example.org/blog/2024/post", scope)
    assert not in_scope("https://example.org/blog/about", scope)
    assert not in_scope("https://mirror.example/https://example.org/blog/2024/", scope)


def test_a_pattern_that_does_not_compile_lets_nothing_in() -> None:
    assert not in_scope("https://example.org/", Scope(kind=ScopeKind.PATTERN, value="(["))


def test_catastrophic_patterns_on_long_adversarial_links_are_decided() -> None:
    # Each of these takes a backtracking engine (Python's re) exponential time in the
    # run of "a"s: at 5,000 it would not finish this century. The check runs in a child
    # process with a generous deadline, because a match in C never lets go of the
    # interpreter: a thread could not be abandoned.
    script = textwrap.dedent(
        r"""
        from trove_discovery.scope import in_scope
        from trove_schema.events import Scope, ScopeKind

        url = "https://example.org/" + "a" * 5000
        cases = [
            (r"^https://example\.org/(a+)+$", url + "!"),
            (r"(a|aa)+$", url + "!"),
            (r"^https://example\.org/(a*)*b", url),
            (r"^https://example\.org/(a+)+$", url),
        ]
        print([in_scope(u, Scope(kind=ScopeKind.PATTERN, value=p)) for p, u in cases])
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[False, False, False, True]"


def test_an_open_scope_takes_everything() -> None:
    scope = Scope(kind=ScopeKind.OPEN)
    assert in_scope("https://anywhere.example/", scope)
    assert in_scope("http://192.0.2.1:81/x", scope)


@pytest.mark.parametrize(
    ("depth", "max_depth", "followed"),
    [(0, 1, True), (0, 5, True), (4, 5, True), (5, 5, False), (9, 5, False), (0, 0, False)],
)
def test_a_link_is_followed_only_within_the_depth(
    depth: int, max_depth: int, followed: bool
) -> None:
    scope = Scope(kind=ScopeKind.OPEN, max_depth=max_depth)
    assert follow_link("https://example.org/next", depth=depth, scope=scope) is followed


def test_a_link_out_of_scope_is_not_followed_whatever_the_depth() -> None:
    scope = Scope(kind=ScopeKind.HOST, value="example.org", max_depth=10)
    assert follow_link("https://www.example.org/in", depth=0, scope=scope)
    assert not follow_link("https://other.example/out", depth=0, scope=scope)
