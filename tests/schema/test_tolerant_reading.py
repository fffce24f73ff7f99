"""Events are read tolerantly (unknown fields, newer versions) and written strictly."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from trove_schema import events
from trove_schema.errors import MalformedEvent
from trove_schema.events import (
    CrawlCompleted,
    CrawlOutcome,
    Link,
    PageDiscovered,
    Provenance,
    Scope,
    decode_event,
)


def completed() -> CrawlCompleted:
    now = datetime.now(UTC)
    return CrawlCompleted(
        url="https://example.org/",
        domain="example.org",
        scope=Scope(value="example.org"),
        request_id="r-1",
        outcome=CrawlOutcome.SUCCESS,
        started_at=now,
        completed_at=now,
        links=(Link(url="https://example.org/a"), Link(url="https://example.org/b")),
    )


def wire_of(event: CrawlCompleted, **changes: Any) -> dict[str, Any]:
    wire: dict[str, Any] = json.loads(event.to_wire())
    wire.update(changes)
    return wire


@pytest.fixture(autouse=True)
def _fresh_log_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "_LOGGED", set())


def test_unknown_fields_are_ignored_on_read_at_any_depth() -> None:
    event = completed()
    wire = wire_of(event, reading_time=4.5)
    wire["scope"]["subdomains"] = True
    wire["links"][1]["rel"] = "me"

    # Compact JSON in the current version takes the fast path; spaced JSON the other.
    assert decode_event(json.dumps(wire, separators=(",", ":")).encode()) == event
    assert decode_event(json.dumps(wire).encode()) == event


def test_a_newer_version_is_read_with_the_current_model_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    event = completed()
    wire = wire_of(event, version=CrawlCompleted.VERSION + 1, reading_time=4.5)
    caplog.set_level(logging.INFO, logger="trove_schema.events")

    first = decode_event(json.dumps(wire).encode())
    second = decode_event(json.dumps(wire).encode())

    assert first == second == event
    newer = [r for r in caplog.records if "version 2" in r.getMessage()]
    assert len(newer) == 1
    assert newer[0].levelno == logging.WARNING


def test_a_newer_version_without_a_field_this_code_needs_is_malformed() -> None:
    wire = wire_of(completed(), version=CrawlCompleted.VERSION + 1)
    del wire["request_id"]

    with pytest.raises(MalformedEvent, match="request_id"):
        decode_event(json.dumps(wire).encode())


def test_a_known_field_with_a_wrong_value_is_still_malformed_beside_unknown_ones() -> None:
    wire = wire_of(completed(), reading_time=4.5, outcome="exploded")

    with pytest.raises(MalformedEvent, match="outcome"):
        decode_event(json.dumps(wire, separators=(",", ":")).encode())


def test_constructing_an_event_with_an_unknown_field_is_still_refused() -> None:
    with pytest.raises(ValidationError, match="extra"):
        PageDiscovered(
            url="https://example.org/",
            domain="example.org",
            scope=Scope(),
            provenance=Provenance(kind="seed"),
            mood="new",  # type: ignore[call-arg]
        )
    with pytest.raises(ValidationError, match="Unexpected keyword argument"):
        Link(url="https://example.org/", rel="me")  # type: ignore[call-arg]


def test_a_link_kind_this_code_does_not_know_is_read_as_other() -> None:
    event = completed()
    wire = wire_of(event)
    wire["links"][0]["kind"] = "syndication"  # a kind a newer producer added

    for encoded in (json.dumps(wire, separators=(",", ":")), json.dumps(wire)):
        read = decode_event(encoded.encode())
        assert isinstance(read, CrawlCompleted)
        assert [link.kind.value for link in read.links] == ["other", "a"]


def test_an_unknown_outcome_is_still_malformed() -> None:
    wire = wire_of(completed(), outcome="vanished")
    with pytest.raises(MalformedEvent):
        decode_event(json.dumps(wire).encode())
