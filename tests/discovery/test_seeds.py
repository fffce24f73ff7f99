"""Seed messages: every accepted form parses, every bad seed gets a reason."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trove_discovery.seeds import (
    MAX_SEEDS_PER_MESSAGE,
    RejectedSeed,
    SeedBatch,
    parse_seeds,
    reply_json,
    reply_text,
)
from trove_schema.events import Provenance, Scope, ScopeKind
from trove_schema.exclusions import Exclusions
from trove_schema.settings import DiscoverySettings

ORIGIN = "trove.seeds"


def make_settings(**overrides: Any) -> DiscoverySettings:
    # Every field the parser reads is given, so TROVE_* in the environment cannot leak in.
    values: dict[str, Any] = {
        "default_scope": "host",
        "max_depth": 5,
        "max_url_length": 2048,
        "allowed_networks": (),
    }
    return DiscoverySettings(**(values | overrides))


def parse(data: bytes | str, **overrides: Any) -> SeedBatch:
    payload = data.encode() if isinstance(data, str) else data
    return parse_seeds(payload, origin=ORIGIN, settings=make_settings(**overrides))


def only_reason(batch: SeedBatch) -> str:
    assert batch.accepted == ()
    assert len(batch.rejected) == 1
    return batch.rejected[0].reason


def test_a_plain_url_is_a_seed_with_the_default_host_scope() -> None:
    batch = parse("HTTPS://Example.org:443/start#top")
    assert batch.rejected == ()
    (seed,) = batch.accepted
    assert seed.url == "https://example.org/start"
    assert seed.original == "HTTPS://Example.org:443/start#top"
    assert seed.scope == Scope(kind=ScopeKind.HOST, value="example.org", max_depth=5)
    assert seed.priority == 0
    assert seed.force is False
    assert seed.provenance == Provenance(kind="seed", origin=ORIGIN)


def test_a_plain_url_with_a_trailing_newline_is_one_seed() -> None:
    batch = parse(b"https://example.org/\n")
    assert [seed.url for seed in batch.accepted] == ["https://example.org/"]


def test_lines_with_crlf_blank_lines_and_comments_parse() -> None:
    payload = (
        "# my reading list\r\n"
        "https://one.example/\r\n"
        "\r\n"
        "   # indented comment\r\n"
        "  http://two.example/a  \r\n"
        "https://three.example/b#frag\r\n"
    )
    batch = parse(payload)
    assert batch.rejected == ()
    assert [seed.url for seed in batch.accepted] == [
        "https://one.example/",
        "http://two.example/a",
        "https://three.example/b",
    ]
    assert [seed.scope.value for seed in batch.accepted] == [
        "one.example",
        "two.example",
        "three.example",
    ]


@pytest.mark.parametrize("separator", ["\u2028", "\u0085", "\v", "\f", "\x1c"])
def test_no_url_is_cut_at_a_separator_that_is_no_line_end_nor_a_blank(
    separator: str,
) -> None:
    # Python's str.splitlines splits at these too: the URL sent is judged whole.
    batch = parse(f"https://one.example/a{separator}b\nhttps://two.example/")
    assert "https://one.example/a" not in [seed.url for seed in batch.accepted]
    assert [seed.url for seed in batch.accepted][-1] == "https://two.example/"
    assert "b" not in [seed.raw for seed in batch.rejected]


def test_urls_apart_on_a_line_or_after_a_lone_cr_are_each_judged() -> None:
    # A tab pasted from a sheet was dropped by the URL parser: "a.example\tb.example"
    # was a host of its own, and the URL after a space or a lone CR was lost in a path.
    batch = parse(
        "https://a.example/\tmy notes\r"
        "https://b.example/ https://c.example/\r\n"
        "https://d.example\te.example  # the rest is a comment https://f.example/"
    )
    assert [seed.url for seed in batch.accepted] == [
        "https://a.example/",
        "https://b.example/",
        "https://c.example/",
        "https://d.example/",
    ]
    assert [seed.raw for seed in batch.rejected] == ["my", "notes", "e.example"]


def test_a_line_that_is_not_utf8_is_rejected_and_the_others_kept() -> None:
    batch = parse(b"https://a.example/\r\ncaf\xe9 cr\xe8me\nhttps://b.example/\n")
    assert [seed.url for seed in batch.accepted] == ["https://a.example/", "https://b.example/"]
    (garbled,) = batch.rejected
    assert garbled.reason.startswith("not UTF-8 text")
    assert garbled.raw == "caf\ufffd cr\ufffdme"


def test_a_leading_byte_order_mark_is_ignored() -> None:
    batch = parse("\ufeffhttps://example.org/".encode())
    assert [seed.url for seed in batch.accepted] == ["https://example.org/"]


def test_bad_lines_are_rejected_one_by_one_and_good_ones_kept() -> None:
    batch = parse("https://good.example/\nftp://bad.example/\nhttp://10.0.0.1/\n")
    assert [seed.url for seed in batch.accepted] == ["https://good.example/"]
    assert [(seed.raw, seed.reason) for seed in batch.rejected] == [
        ("ftp://bad.example/", "scheme 'ftp' is not http or https"),
        ("http://10.0.0.1/", "host 10.0.0.1 is a private address"),
    ]


def test_a_json_object_with_one_url_and_options() -> None:
    message = {
        "url": "https://Blog.Example.co.uk/",
        "priority": 50,
        "scope": "domain",
        "force": True,
        "max_depth": 2,
    }
    (seed,) = parse(json.dumps(message)).accepted
    assert seed.url == "https://blog.example.co.uk/"
    assert seed.scope == Scope(kind=ScopeKind.DOMAIN, value="example.co.uk", max_depth=2)
    assert seed.priority == 50
    assert seed.force is True


def test_a_json_object_with_several_urls_shares_its_options() -> None:
    message = {"urls": ["https://a.example/", "https://b.example/x"], "priority": -3}
    batch = parse(json.dumps(message))
    assert [(seed.url, seed.priority) for seed in batch.accepted] == [
        ("https://a.example/", -3),
        ("https://b.example/x", -3),
    ]


def test_a_json_array_of_urls_uses_the_defaults() -> None:
    batch = parse('["https://a.example/", "https://b.example/"]', default_scope="open")
    assert [seed.url for seed in batch.accepted] == ["https://a.example/", "https://b.example/"]
    assert {seed.scope for seed in batch.accepted} == {Scope(kind=ScopeKind.OPEN, value="")}


def test_a_json_array_rejects_items_that_are_not_strings() -> None:
    batch = parse('["https://a.example/", 42, {"url": "x"}]')
    assert [seed.url for seed in batch.accepted] == ["https://a.example/"]
    assert [(seed.raw, seed.reason) for seed in batch.rejected] == [
        ("42", "not a URL string"),
        ('{"url": "x"}', "not a URL string"),
    ]


@pytest.mark.parametrize(
    ("message", "scope"),
    [
        ({"scope": "host"}, Scope(kind=ScopeKind.HOST, value="blog.example.co.uk")),
        ({"scope": "domain"}, Scope(kind=ScopeKind.DOMAIN, value="example.co.uk")),
        ({"scope": "open"}, Scope(kind=ScopeKind.OPEN, value="")),
        (
            {"scope": "pattern", "pattern": r"^https://blog\.example\.co\.uk/2024/"},
            Scope(kind=ScopeKind.PATTERN, value=r"^https://blog\.example\.co\.uk/2024/"),
        ),
        ({"pattern": "/docs/"}, Scope(kind=ScopeKind.PATTERN, value="/docs/")),
    ],
    ids=["host", "domain", "open", "pattern", "pattern implied"],
)
def test_scope_values_follow_the_scope_kind(message: dict[str, Any], scope: Scope) -> None:
    (seed,) = parse(json.dumps({"url": "https://blog.example.co.uk/", **message})).accepted
    assert seed.scope == scope


def test_the_default_scope_comes_from_the_settings() -> None:
    (seed,) = parse("https://www.example.com/", default_scope="domain", max_depth=9).accepted
    assert seed.scope == Scope(kind=ScopeKind.DOMAIN, value="example.com", max_depth=9)


BAD_SEEDS = {
    "not http or https": ("ftp://example.org/", "scheme 'ftp' is not http or https"),
    "no scheme": ("example.org", "no scheme"),
    "unparsable": ("http://[::1/", "unparsable URL"),
    "no host": ("https:///path", "no host"),
    "too long": ("https://example.org/" + "a" * 2048, "URL longer than 2048 characters"),
    "private address": ("http://192.168.1.10/", "host 192.168.1.10 is a private address"),
    "loopback in disguise": ("http://0x7f.1/", "host 127.0.0.1 is a private address"),
    "localhost": ("http://localhost:8080/", "host localhost is a private address"),
    "metadata": ("http://169.254.169.254/latest/", "host 169.254.169.254 is a private"),
    # Refused by the fetcher although Python's flags call them global: not seeded either.
    "Azure WireServer": ("http://168.63.129.16/", "host 168.63.129.16 is a private address"),
    "6to4": ("http://[2002:808:808::]/", "host 2002:808:808:: is a private address"),
    "empty": ("", "empty seed message"),
    "only whitespace": (" \r\n\t", "empty seed message"),
    "only comments": ("# nothing\n# here\n", "no URLs in seed message"),
    "malformed JSON object": ('{"url": "https://example.org/"', "malformed JSON: "),
    "malformed JSON array": ("[https://example.org/]", "malformed JSON: "),
    "empty urls": ('{"urls": []}', "no URLs in seed message"),
    "pattern scope without pattern": (
        '{"url": "https://example.org/", "scope": "pattern"}',
        'scope "pattern" needs a "pattern"',
    ),
    "bad regex": (
        '{"url": "https://example.org/", "pattern": "([a-z"}',
        '"pattern" is not a valid regular expression: ',
    ),
    "pattern with a backreference": (
        json.dumps({"url": "https://example.org/", "pattern": r"/(\w+)/\1/"}),
        "invalid escape sequence: \\1 (patterns are matched in linear time by RE2: "
        "no backreferences",
    ),
    "pattern with a lookahead": (
        json.dumps({"url": "https://example.org/", "pattern": r"^https://(?!www\.)"}),
        "invalid perl operator: (?!",
    ),
    "pattern too long": (
        json.dumps({"url": "https://example.org/", "pattern": "a" * 501}),
        '"pattern" is longer than 500 characters',
    ),
    "pattern not a string": ('{"url": "https://example.org/", "pattern": 3}', "must be a string"),
    "pattern with another scope": (
        '{"url": "https://example.org/", "scope": "host", "pattern": "x"}',
        '"pattern" is only for scope "pattern"',
    ),
    "unknown scope": ('{"url": "https://example.org/", "scope": "site"}', '"scope" must be'),
    "priority out of range": (
        '{"url": "https://example.org/", "priority": 101}',
        '"priority" must be an integer from -100 to 100, not 101',
    ),
    "priority not an integer": ('{"url": "https://example.org/", "priority": 1.5}', "priority"),
    "priority a boolean": ('{"url": "https://example.org/", "priority": true}', "priority"),
    "max_depth out of range": (
        '{"url": "https://example.org/", "max_depth": -1}',
        '"max_depth" must be an integer from 0 to 100',
    ),
    "force not a boolean": ('{"url": "https://example.org/", "force": "yes"}', '"force"'),
    "unknown key": ('{"url": "https://example.org/", "prioirty": 5}', "unknown key(s) 'prioirty'"),
    "url and urls": ('{"url": "https://a.example/", "urls": []}', 'exactly one of "url"'),
    "neither url nor urls": ('{"priority": 5}', 'exactly one of "url" and "urls"'),
    "url not a string": ('{"url": ["https://a.example/"]}', '"url" must be a string'),
    "urls not an array": ('{"urls": "https://a.example/"}', '"urls" must be an array'),
    "a lone surrogate in a pattern": (
        '{"url": "https://a.example/", "scope": "pattern", "pattern": "\\ud800"}',
        "lone surrogate",
    ),
    "a lone surrogate in a URL": ('{"urls": ["https://a.example/\\udfff"]}', "lone surrogate"),
}


@pytest.mark.parametrize(("payload", "reason"), BAD_SEEDS.values(), ids=list(BAD_SEEDS))
def test_each_bad_seed_is_rejected_with_a_reason(payload: str, reason: str) -> None:
    assert reason in only_reason(parse(payload))


def test_a_seed_with_a_lone_surrogate_gets_a_reply_a_terminal_and_a_program_can_read() -> None:
    batch = parse('{"urls": ["\\ud800", "https://a.example/"]}')
    assert not batch.accepted
    assert "lone surrogate" in reply_text(batch).encode("utf-8").decode()
    assert "lone surrogate" in json.loads(reply_json(batch))["rejected"][0]["reason"]


def test_a_backreference_pattern_is_refused_in_the_reply_with_its_reason() -> None:
    batch = parse(json.dumps({"url": "https://example.org/", "pattern": r"^(a+)\1$"}))
    assert not batch.accepted
    reply = reply_text(batch)
    assert reply.startswith("accepted 0\nrejected 1:")
    assert "invalid escape sequence: \\1" in reply
    assert "no backreferences, lookahead or lookbehind" in reply
    assert "invalid escape sequence" in json.loads(reply_json(batch))["rejected"][0]["reason"]


def test_a_catastrophic_pattern_is_accepted_because_it_is_matched_linearly() -> None:
    batch = parse(json.dumps({"url": "https://example.org/", "pattern": "^(a+)+$"}))
    assert batch.accepted[0].scope == Scope(kind=ScopeKind.PATTERN, value="^(a+)+$", max_depth=5)


def test_non_utf8_bytes_are_rejected() -> None:
    batch = parse(b"https://example.org/\xff\xfe")
    assert only_reason(batch).startswith("not UTF-8 text")
    assert batch.rejected[0].raw.startswith("https://example.org/")


def test_a_whole_message_error_rejects_it_once_with_the_message_as_raw() -> None:
    payload = '{"urls": ["https://a.example/", "https://b.example/"], "scope": "nope"}'
    batch = parse(payload)
    assert len(batch.rejected) == 1
    assert batch.rejected[0].raw == payload


def test_a_plain_url_cannot_use_a_default_pattern_scope() -> None:
    reason = only_reason(parse("https://example.org/", default_scope="pattern"))
    assert '"pattern"' in reason


def test_allowed_networks_let_private_seeds_in() -> None:
    batch = parse("http://127.0.0.1:8000/\nhttp://10.0.0.1/", allowed_networks=("127.0.0.0/8",))
    assert [seed.url for seed in batch.accepted] == ["http://127.0.0.1:8000/"]
    assert [seed.raw for seed in batch.rejected] == ["http://10.0.0.1/"]


def test_allowed_networks_let_in_only_what_the_fetcher_would_connect_to() -> None:
    # The fetcher resolves localhost to 127.0.0.1 and ::1 and refuses it unless both are
    # open; an IPv4 network does not open the IPv4-mapped form; nor any, a metadata address.
    seeds = "http://localhost:8000/\nhttp://[::ffff:127.0.0.1]/\nhttp://169.254.169.254/"
    batch = parse(seeds, allowed_networks=("127.0.0.0/8", "169.254.0.0/16"))
    assert not batch.accepted
    assert len(batch.rejected) == 3
    both = parse("http://localhost:8000/", allowed_networks=("127.0.0.0/8", "::1/128"))
    assert [seed.url for seed in both.accepted] == ["http://localhost:8000/"]


def test_a_seed_on_an_excluded_host_is_refused_with_the_rule() -> None:
    seeds = b"https://blog.example.org/\nhttps://example.net/"
    rules = Exclusions.of(["example.org"])
    batch = parse_seeds(seeds, origin=ORIGIN, settings=make_settings(), exclusions=rules)
    assert [seed.url for seed in batch.accepted] == ["https://example.net/"]
    (refused,) = batch.rejected
    assert refused.reason == "host blog.example.org is excluded by the operator (example.org)"


def test_the_url_length_setting_applies() -> None:
    reason = only_reason(parse("https://example.org/" + "a" * 100, max_url_length=64))
    assert reason == "URL longer than 64 characters"


def test_a_url_repeated_in_one_message_is_accepted_once() -> None:
    batch = parse("https://example.org/\nHTTPS://EXAMPLE.ORG\nhttps://example.org/#x")
    assert [seed.url for seed in batch.accepted] == ["https://example.org/"]
    assert batch.rejected == ()


def test_urls_beyond_the_per_message_limit_are_rejected_together() -> None:
    lines = [f"https://example.org/{index}" for index in range(MAX_SEEDS_PER_MESSAGE + 2)]
    batch = parse("\n".join(lines))
    assert len(batch.accepted) == MAX_SEEDS_PER_MESSAGE
    assert [(seed.raw, seed.reason) for seed in batch.rejected] == [
        (lines[-2], "more than 10000 URLs in one message: 2 from this one on not read")
    ]


def test_a_megabyte_of_junk_is_a_bounded_number_of_rejections() -> None:
    # Each rejection is an event kept in the record: one message cannot make 500,000.
    for junk in ("x\n" * 500_000, json.dumps([0] * 300_000)):
        batch = parse(junk)
        assert batch.accepted == ()
        assert len(batch.rejected) == MAX_SEEDS_PER_MESSAGE + 1
        assert batch.rejected[-1].reason.endswith("from this one on not read")


def test_rejected_raw_text_is_cut_to_512_characters() -> None:
    batch = parse("ftp://example.org/" + "x" * 1000)
    assert len(batch.rejected[0].raw) == 512
    assert len(RejectedSeed("y" * 600, "because").raw) == 512


def test_reply_text_summarises_accepted_and_rejected() -> None:
    batch = parse("https://example.org/\nftp://x.example/")
    assert reply_text(batch) == (
        "accepted 1: https://example.org/\n"
        "rejected 1:\n"
        "  ftp://x.example/ — scheme 'ftp' is not http or https"
    )
    assert reply_text(parse("")) == "accepted 0\nrejected 1:\n  (empty) — empty seed message"


def test_reply_text_stays_short_for_big_batches() -> None:
    batch = parse("\n".join(f"https://example.org/{index}" for index in range(50)))
    text = reply_text(batch)
    assert text.startswith("accepted 50: https://example.org/0, ")
    assert text.endswith(" and 30 more")
    assert len(text) < 1000


def test_reply_json_lists_urls_and_reasons() -> None:
    batch = parse('{"urls": ["https://example.org/", "gopher://x/"], "priority": 7}')
    body = json.loads(reply_json(batch))
    assert body == {
        "accepted_count": 1,
        "rejected_count": 1,
        "accepted": [
            {
                "url": "https://example.org/",
                "original": "https://example.org/",
                "scope": {"kind": "host", "value": "example.org", "max_depth": 5},
                "priority": 7,
                "force": False,
            }
        ],
        "rejected": [{"raw": "gopher://x/", "reason": "scheme 'gopher' is not http or https"}],
        "truncated": False,
    }


def test_a_port_too_long_to_read_refuses_its_seed_and_keeps_the_others() -> None:
    # int() refuses more than 4,300 digits with a ValueError: the whole message failed.
    bad = "http://example.com:" + "0" * 4400 + "80/"
    batch = parse(f"https://good.example/\n{bad}\n")
    assert [seed.url for seed in batch.accepted] == ["https://good.example/"]
    (refused,) = batch.rejected
    assert refused.raw.startswith("http://example.com:000")
    assert "is longer than 5 digits" in refused.reason


def test_lines_that_are_not_utf8_are_a_bounded_number_of_rejections() -> None:
    batch = parse(b"caf\xe9\n" * (MAX_SEEDS_PER_MESSAGE + 5) + b"https://a.example/\n")
    assert [seed.url for seed in batch.accepted] == ["https://a.example/"]
    assert len(batch.rejected) == MAX_SEEDS_PER_MESSAGE + 1
    assert batch.rejected[-1].reason.endswith("5 more not listed")
