"""Storable text: outside text in events is cleaned where the event is built or read."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from sqlalchemy import String

from trove_schema.events import (
    MAX_URL_LENGTH,
    CrawlCompleted,
    CrawlRequested,
    Provenance,
    RequestReason,
    Scope,
    SeedRejected,
    decode_event,
)
from trove_schema.tables import Page
from trove_schema.text import CUT_MARK, NUL_MARK, SURROGATE_MARK, is_storable, storable

HOSTILE = "a\x00b\ud800c\udfffd"
MARKED = f"a{NUL_MARK}b{SURROGATE_MARK}c{SURROGATE_MARK}d"


def test_nul_is_shown_and_surrogates_are_replaced() -> None:
    assert storable(HOSTILE) == MARKED
    assert storable("plain") == "plain"
    assert storable("é\U0001f600\t\x01") == "é\U0001f600\t\x01"  # storable as it is


def test_over_long_text_is_cut_with_a_marker() -> None:
    cut = storable("x" * 50, 10)
    assert cut == "x" * 9 + CUT_MARK
    assert len(cut) == 10
    assert storable("x" * 10, 10) == "x" * 10


@settings(max_examples=300, deadline=None)
@given(st.text(), st.integers(min_value=1, max_value=40))
def test_cleaned_text_is_always_storable_and_encodable(value: str, limit: int) -> None:
    cleaned = storable(value, limit)
    assert is_storable(cleaned)
    assert len(cleaned) <= limit
    cleaned.encode("utf-8")  # a surrogate would raise here
    assert storable(cleaned, limit) == cleaned


def _completed(**fields: Any) -> CrawlCompleted:
    now = datetime.now(UTC)
    base: dict[str, Any] = {
        "url": "https://example.org/",
        "domain": "example.org",
        "scope": Scope(),
        "request_id": "r",
        "outcome": "success",
        "started_at": now,
        "completed_at": now,
    }
    return CrawlCompleted(**{**base, **fields})


#: Every outside text field of CrawlCompleted, with what it may hold at most.
COMPLETED_TEXT = {
    "error_message": 2000,
    "content_type": 1000,
    "title": 1000,
    "language": 35,
    "etag": 1000,
    "last_modified": 1000,
    "final_url": MAX_URL_LENGTH,
}


@pytest.mark.parametrize(("name", "limit"), COMPLETED_TEXT.items())
def test_outside_text_of_a_crawl_is_marked_and_cut_when_built(name: str, limit: int) -> None:
    event = _completed(**{name: HOSTILE})
    assert getattr(event, name) == MARKED
    long = _completed(**{name: "y" * (limit + 100)})
    assert len(getattr(long, name)) == limit
    assert getattr(long, name).endswith(CUT_MARK)
    event.to_wire()  # serializable: a surrogate used to make publishing raise


def test_keywords_and_links_are_marked() -> None:
    event = _completed(
        keywords=("ok", HOSTILE, "z" * 500),
        links=[{"url": "https://example.org/a\x00b"}, {"url": "https://example.org/ok"}],
    )
    assert event.keywords == ("ok", MARKED, "z" * 99 + CUT_MARK)
    assert [link.url for link in event.links] == [
        f"https://example.org/a{NUL_MARK}b",
        "https://example.org/ok",
    ]


def test_urls_are_marked_but_never_cut() -> None:
    event = _completed(url="https://example.org/\x00", canonical_url="https://example.org/\x00")
    assert event.url == event.canonical_url == f"https://example.org/{NUL_MARK}"
    with pytest.raises(ValidationError):
        _completed(url="https://example.org/" + "a" * MAX_URL_LENGTH)


def test_a_rejected_seed_keeps_what_the_operator_needs_to_recognise_it() -> None:
    event = SeedRejected(
        raw="http://exa\x00mple.org/" + "p" * 1000,
        reason="host 'exa\x00mple.org' has characters not allowed",
        provenance=Provenance(kind="seed", origin="client\x00\ud800"),
    )
    assert event.raw.startswith(f"http://exa{NUL_MARK}mple.org/")
    assert len(event.raw) == 512
    assert event.raw.endswith(CUT_MARK)
    assert NUL_MARK in event.reason
    assert event.provenance.origin == f"client{NUL_MARK}{SURROGATE_MARK}"


def test_a_crawl_request_carries_storable_validators() -> None:
    event = CrawlRequested(
        url="https://example.org/",
        domain="example.org",
        scope=Scope(),
        reason=RequestReason.RETRY,
        etag='"\x00"',
        last_modified="\ud800",
    )
    assert event.etag == f'"{NUL_MARK}"'
    assert event.last_modified == SURROGATE_MARK


def test_a_content_hash_is_no_longer_than_the_column_that_keeps_it() -> None:
    # A hand-made event's: ``pages.content_hash`` is 64 characters, and a longer one was
    # refused there, the event parked.
    (column,) = [c for c in Page.__table__.columns if c.name == "content_hash"]
    assert isinstance(column.type, String)
    raw = json.loads(_completed().to_wire())
    raw["content_hash"] = "a" * 100
    event = decode_event(json.dumps(raw).encode())
    assert isinstance(event, CrawlCompleted)
    assert event.content_hash is not None
    assert len(event.content_hash) == column.type.length == 64


def test_events_already_in_the_stream_are_cleaned_when_read() -> None:
    """Old events were written before the text types: NUL escapes decode storable."""
    wire = _completed(title="x").to_wire().replace(b'"title":"x"', b'"title":"t\\u0000t"')
    assert decode_event(wire).title == f"t{NUL_MARK}t"  # type: ignore[attr-defined]
    hand_made = json.dumps(
        {
            "type": "SeedRejected",
            "version": 1,
            "raw": "\x00\ud800" + "r" * 600,
            "reason": "why\ud800",
            "provenance": {"kind": "seed", "origin": "\x00"},
        },
        separators=(",", ":"),
    ).encode()  # "\ud800" escapes: pydantic's own JSON parser refuses them
    event = decode_event(hand_made)
    assert isinstance(event, SeedRejected)
    assert event.raw.startswith(NUL_MARK + SURROGATE_MARK)
    assert len(event.raw) == 512
    assert event.reason == "why" + SURROGATE_MARK
    assert event.provenance.origin == NUL_MARK


def test_non_text_is_still_refused() -> None:
    with pytest.raises(ValidationError):
        _completed(title=5)
    with pytest.raises(ValidationError):
        _completed(keywords=("a", 5))
