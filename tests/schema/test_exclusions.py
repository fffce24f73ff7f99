"""The operator's excluded hosts: how a rule is read, and which hosts it covers."""

from __future__ import annotations

from pathlib import Path

import pytest

from trove_schema.errors import InvalidExclusion
from trove_schema.exclusions import Exclusions, read_rules, rule_of
from trove_schema.settings import FetcherSettings


@pytest.mark.parametrize(
    ("raw", "rule"),
    [
        ("example.org", "example.org"),
        ("Example.ORG.", "example.org"),
        ("*.example.org", "example.org"),
        ("https://Blog.Example.org:8443/about?x=1", "blog.example.org"),
        ("Bücher.Example", "xn--bcher-kva.example"),
        ("127.0.0.5", "127.0.0.5"),
    ],
)
def test_a_rule_is_spelt_as_trove_spells_hosts(raw: str, rule: str) -> None:
    assert rule_of(raw) == rule


@pytest.mark.parametrize(
    ("raw", "why"),
    [("org", "top-level domain"), ("exa mple.org", "not a host name"), ("ftp://x.org/", "ftp")],
)
def test_a_rule_that_names_no_host_is_refused_with_the_reason(raw: str, why: str) -> None:
    with pytest.raises(InvalidExclusion, match=why):
        rule_of(raw)


def test_a_rule_covers_its_host_and_every_name_below_it_and_nothing_else() -> None:
    rules = Exclusions.of(["example.org", "spam.example.net", "127.0.0.5"])
    assert rules.covering("example.org") == "example.org"
    assert rules.covering("www.example.org") == "example.org"
    assert rules.covering("a.b.spam.example.net") == "spam.example.net"
    for host in ("notexample.org", "example.net", "org", "127.0.0.6", "0.0.5", "ham.example.net"):
        assert rules.covering(host) is None, host
    assert Exclusions().covering("example.org") is None


def test_rules_are_read_from_lines_with_commas_blanks_and_comments() -> None:
    lines = ["# spam farms", "a.example, b.example  c.example", "", "A.example # twice"]
    assert read_rules(lines) == ("a.example", "b.example", "c.example")


def test_the_settings_refuse_a_bad_rule_or_an_unreadable_file_at_start(tmp_path: Path) -> None:
    listed = tmp_path / "excluded.txt"
    listed.write_text("# removal requests\nblog.example\nshop.example\n")
    settings = FetcherSettings(excluded_hosts="spam.example", excluded_hosts_file=listed)
    rules = Exclusions.from_settings(settings)
    assert rules.rules == {"spam.example", "blog.example", "shop.example"}
    with pytest.raises(ValueError, match="top-level domain"):
        FetcherSettings(excluded_hosts="example, com")
    listed.write_text("fine.example\nexample.org/path, exa%mple.org\n")
    with pytest.raises(ValueError, match=r"excluded\.txt, line 2: 'exa%mple\.org' is not a host"):
        FetcherSettings(excluded_hosts_file=listed)
    with pytest.raises(ValueError, match="cannot read"):
        FetcherSettings(excluded_hosts_file=tmp_path / "missing.txt")
