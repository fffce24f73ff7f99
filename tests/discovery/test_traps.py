"""Crawler-trap shapes: repeated segments, deep paths, long URLs, piled-up parameters."""

from __future__ import annotations

import random
from collections import Counter
from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trove_discovery import traps
from trove_discovery.traps import url_trap_reason


def trap(url: str, *, max_length: int = 2048, repetitions: int = 3) -> str | None:
    return url_trap_reason(url, max_length=max_length, max_path_repetitions=repetitions)


@pytest.mark.parametrize(
    "url",
    [
        "https://example.org/",
        "https://example.org/calendar/2024/01/01/",
        "https://example.org/events/2024/02/?view=month&page=3",
        "https://example.org/archive/2023/12/31/page/2",
        "https://example.org/a/b/a/b/a/b",  # three times is still allowed with 3
        "https://example.org/x/x/x",
        "https://example.org/X/x/X/x/X/x",  # path case matters
        "https://example.org/" + "/".join(f"s{i}" for i in range(30)),
        "https://example.org/search?" + "&".join(f"f{i}=1" for i in range(20)),
    ],
)
def test_ordinary_urls_are_not_traps(url: str) -> None:
    assert trap(url) is None


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("https://example.org/a/b/a/b/a/b/a/b", "path segment 'a' repeated 4 times (more than 3)"),
        ("https://example.org/x/x/x/x", "path segment 'x' repeated 4 times (more than 3)"),
        (
            "https://example.org/p/foo/q/foo/r/foo/s/foo/",
            "path segment 'foo' repeated 4 times (more than 3)",
        ),
        (
            "https://example.org/" + "/".join(f"s{i}" for i in range(31)),
            "31 path segments (more than 30)",
        ),
        (
            "https://example.org/search?" + "&".join(f"f{i}=1" for i in range(21)),
            "21 query parameters (more than 20)",
        ),
    ],
)
def test_trap_shapes_are_named(url: str, reason: str) -> None:
    assert trap(url) == reason


def test_the_repetition_limit_is_a_setting() -> None:
    assert trap("https://example.org/x/y/x", repetitions=1) == (
        "path segment 'x' repeated 2 times (more than 1)"
    )
    assert trap("https://example.org/x/x/x/x/x", repetitions=5) is None


def test_a_url_over_the_length_limit_is_a_trap() -> None:
    url = "https://example.org/" + "a" * 80
    assert trap(url, max_length=100) is None
    assert trap(url + "b", max_length=100) == "URL longer than 100 characters"


@given(
    segments=st.lists(st.sampled_from(["a", "b", "c", "2024", "page"]), max_size=14),
    repetitions=st.integers(min_value=1, max_value=5),
)
def test_a_path_is_a_trap_exactly_when_one_segment_repeats_past_the_limit(
    segments: list[str], repetitions: int
) -> None:
    most = max(Counter(segments).values(), default=0)
    found = trap("https://example.org/" + "/".join(segments), repetitions=repetitions)
    assert (found is not None) == (most > repetitions)


def test_the_plain_url_shortcut_reads_what_urlsplit_reads() -> None:
    """Where the shortcut reads a URL's path and query, urlsplit reads the same ones."""
    rng = random.Random(20261130)
    pieces = [
        "http://", "https://", "HTTP://", "a", "b.example", ":80", "@", "[", "]", "/", "//",
        "?", "#", "&", "=", "\t", "\n", "\r", " ", "%2F", ";", "é", ".", "..", "\x00", "\\",
    ]  # fmt: skip
    plain = 0
    for _ in range(50000):
        url = rng.choice(["http://", "https://", ""]) + "".join(
            rng.choices(pieces, k=rng.randint(0, 10))
        )
        match = traps._PLAIN_URL.match(url) if url.isascii() else None
        if match is None:
            continue
        plain += 1
        parts = urlsplit(url)
        assert (match.group(1) or "", match.group(2) or "") == (parts.path, parts.query), url
    assert plain > 5000  # the generator does reach the shortcut
