"""The recorder's memory of page ids: bounded, and only of one generation of the table."""

from __future__ import annotations

from trove_recorder.page_ids import PageIds


def test_a_full_memory_forgets_its_oldest_entries_first() -> None:
    known = PageIds(capacity=100)
    known.learn("16401@2026-11-28 07:00:00+00", {f"u{i}": i for i in range(100)})
    known.learn("16401@2026-11-28 07:00:00+00", {"newest": 1000})
    assert len(known) <= 100
    assert known.get("newest") == 1000
    assert known.get("u0") is None
    assert known.get("u99") == 99


def test_ids_of_another_generation_or_server_start_replace_everything_remembered() -> None:
    known = PageIds(capacity=10)
    known.learn("16401@2026-11-28 07:00:00+00", {"a": 1, "b": 2})
    known.learn("16401@2026-11-28 09:00:00+00", {"c": 3})
    assert (known.get("a"), known.get("b"), known.get("c")) == (None, None, 3)


def test_capacity_zero_remembers_nothing() -> None:
    known = PageIds(capacity=0)
    known.learn("16401@2026-11-28 07:00:00+00", {"a": 1})
    assert known.get("a") is None


def test_a_url_longer_than_ordinary_ones_is_not_remembered() -> None:
    # A trap whose links grow to 2,048 characters would fill the map with ~420 MB at
    # its default 200,000 entries; such a URL is looked up in the batch instead.
    ids = PageIds(capacity=10)
    long = "https://trap.example/" + "a/" * 1_000
    ids.learn("g", {"https://example.org/": 1, long: 2})
    assert ids.get("https://example.org/") == 1
    assert ids.get(long) is None
    assert len(ids) == 1
