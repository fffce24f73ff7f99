from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from trove_schema.errors import MalformedEvent
from trove_schema.events import (
    EVENT_TYPES,
    UPCASTERS,
    CrawlCompleted,
    CrawlOutcome,
    Link,
    LinkKind,
    PageDiscovered,
    Provenance,
    Scope,
    Share,
    decode_event,
    derived_event_id,
)


def _completed(**overrides: object) -> CrawlCompleted:
    now = datetime.now(UTC)
    fields: dict[str, object] = {
        "url": "https://example.org/",
        "domain": "example.org",
        "scope": Scope(value="example.org"),
        "request_id": "r-1",
        "outcome": CrawlOutcome.SUCCESS,
        "started_at": now,
        "completed_at": now,
        "links": (Link(url="https://example.org/a", kind=LinkKind.A),),
    }
    fields.update(overrides)
    return CrawlCompleted(**fields)


def test_event_round_trips_through_the_wire() -> None:
    event = _completed(title="Hello", keywords=("hello", "world"))
    assert decode_event(event.to_wire()) == event


def test_wire_type_is_the_stable_name_not_the_class_path() -> None:
    wire = json.loads(_completed().to_wire())
    assert wire["type"] == "CrawlCompleted"
    assert wire["version"] == 1
    assert set(EVENT_TYPES) == {
        "SeedRejected",
        "PageDiscovered",
        "CrawlRequested",
        "CrawlCompleted",
        "InstanceFollowed",
        "InstanceUnfollowed",
        "TimelinePollRequested",
        "TimelinePolled",
    }


def test_event_id_is_sent_as_nats_msg_id() -> None:
    event = _completed()
    assert event.headers()["Nats-Msg-Id"] == event.id


def test_crawl_completed_cannot_carry_a_body() -> None:
    with pytest.raises(ValidationError):
        _completed(body="<html>the whole page</html>")


def test_events_are_frozen() -> None:
    event = _completed()
    with pytest.raises(ValidationError):
        event.url = "https://other.example/"  # type: ignore[misc]


def test_naive_times_are_taken_as_utc() -> None:
    event = _completed(
        started_at=datetime(2026, 1, 1, 12, 0), completed_at=datetime(2026, 1, 1, 12, 0)
    )
    assert event.occurred_at.tzinfo is not None


def test_a_time_of_trove_s_own_past_year_9000_is_refused_where_it_is_read() -> None:
    # Its re-crawl (a week on) or retry overflowed datetime, and the handler failed until
    # the message was parked: such a time comes only from a clock that is wrong.
    far = datetime(9999, 12, 31, tzinfo=UTC)
    near = datetime(8999, 12, 31, tzinfo=UTC)
    assert _completed(started_at=near, completed_at=near).completed_at == near
    with pytest.raises(MalformedEvent, match="year 9000 or later"):
        decode_event(_completed(completed_at=near).to_wire().replace(b"8999-", b"9999-"))
    with pytest.raises(ValidationError, match="year 9000 or later"):
        _completed(started_at=far, completed_at=far)
    # A time a remote server gave (a post's) is its say, not a clock of Trove's.
    share = Share(
        instance="https://social.example",
        post_uri="https://social.example/users/a/statuses/1",
        account="a@social.example",
        shared_at=far,
    )
    assert Provenance(kind="share", share=share).share == share


def test_a_time_of_trove_s_own_before_1970_is_refused_where_it_is_read() -> None:
    # A retry due then went into its schedule as a year of three digits, which the
    # broker refused, and the outbox stopped at it: no clock reads such a time.
    near = datetime(1970, 1, 1, tzinfo=UTC)
    assert _completed(started_at=near, completed_at=near).completed_at == near
    wire = _completed(started_at=near, completed_at=near).to_wire()
    with pytest.raises(MalformedEvent, match="before the year 1970"):
        decode_event(wire.replace(b"1970-", b"0500-"))
    with pytest.raises(ValidationError, match="before the year 1970"):
        _completed(completed_at=datetime(1969, 12, 31, 23, 59, tzinfo=UTC))


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"type": "Nope"}', "unknown event type"),
        (b'{"type": "PageDiscovered", "version": 0}', "unsupported version"),
        (b'{"type": "PageDiscovered", "version": 99}', "invalid PageDiscovered"),
        (b'{"type": "PageDiscovered", "version": 1, "url": 5}', "invalid PageDiscovered"),
        (b"[" * 100_000, "nested too deeply"),
        (
            b'{"type": "PageDiscovered", "version": 1, "url": "https://a.example/", '
            b'"domain": "a.example", "scope": {"value": "a.example"}, '
            b'"provenance": {"kind": "seed"}, "occurred_at": "0001-01-01T00:00:00+14:00"}',
            "invalid PageDiscovered",
        ),
    ],
)
def test_malformed_wire_is_refused_with_a_reason(wire: bytes, message: str) -> None:
    with pytest.raises(MalformedEvent, match=message):
        decode_event(wire)


def test_old_versions_are_upcast_before_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PageDiscovered, "VERSION", 2)

    def v1_to_v2(raw: dict[str, object]) -> dict[str, object]:
        raw["url"] = raw.pop("address")
        return raw

    monkeypatch.setitem(UPCASTERS, ("PageDiscovered", 1), v1_to_v2)
    old = {
        "type": "PageDiscovered",
        "version": 1,
        "address": "https://example.org/",
        "domain": "example.org",
        "scope": {"kind": "host", "value": "example.org", "max_depth": 3},
        "provenance": {"kind": "seed"},
    }
    event = decode_event(json.dumps(old).encode())
    assert isinstance(event, PageDiscovered)
    assert event.url == "https://example.org/"


def test_derived_ids_are_stable_per_cause_and_purpose() -> None:
    assert derived_event_id("a", "retry") == derived_event_id("a", "retry")
    assert derived_event_id("a", "retry") != derived_event_id("a", "recrawl")
    assert derived_event_id("a", "retry") != derived_event_id("b", "retry")


@given(cause=st.text(), purpose=st.sampled_from(["discovered", "retry", "recrawl", "x"]))
def test_derived_ids_are_the_uuid5_every_release_derived(cause: str, purpose: str) -> None:
    # An id derived again by a later release must be the one an earlier release
    # published, or the duplicate window and the consumers would let a copy through.
    try:
        expected = str(uuid.uuid5(uuid.NAMESPACE_URL, f"trove:{purpose}:{cause}"))
    except UnicodeEncodeError:  # a lone surrogate: no id either way
        with pytest.raises(UnicodeEncodeError):
            derived_event_id(cause, purpose)
        return
    assert derived_event_id(cause, purpose) == expected


def test_provenance_records_where_a_seed_came_from() -> None:
    event = PageDiscovered(
        url="https://example.org/",
        domain="example.org",
        scope=Scope(),
        provenance=Provenance(kind="seed", origin="trove.seeds"),
    )
    assert decode_event(event.to_wire()).provenance.origin == "trove.seeds"  # type: ignore[attr-defined]
