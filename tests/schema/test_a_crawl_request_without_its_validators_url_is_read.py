"""A ``CrawlRequested`` written before requests said where their validators came from
(``validators_url``) is read with it None, on both of ``decode_event``'s paths."""

from __future__ import annotations

import json

from trove_schema.events import (
    CrawlRequested,
    RequestReason,
    Scope,
    decode_event,
)

#: A re-crawl request as the release before wrote it (no ``validators_url``).
OLD_WIRE = {
    "type": "CrawlRequested",
    "version": 1,
    "id": "0b5f4c1e-9d7a-4a57-9a53-3c6f0b8f1a01",
    "occurred_at": "2025-01-02T00:00:00Z",
    "url": "https://example.org/",
    "domain": "example.org",
    "depth": 0,
    "priority": 0,
    "scope": {"kind": "host", "value": "example.org", "max_depth": 5},
    "reason": "recrawl",
    "attempt": 1,
    "not_before": "2025-01-09T00:00:00Z",
    "etag": None,
    "last_modified": "Wed, 01 Jan 2025 00:00:00 GMT",
    "caused_by": "completed-1",
    "history": None,
}


def test_an_old_crawl_request_without_a_validators_url_is_read_with_none() -> None:
    # Compact JSON in the current version takes the fast path; spaced JSON the other.
    for wire in (json.dumps(OLD_WIRE, separators=(",", ":")), json.dumps(OLD_WIRE)):
        event = decode_event(wire.encode())
        assert isinstance(event, CrawlRequested)
        assert event.validators_url is None
        assert event.last_modified == "Wed, 01 Jan 2025 00:00:00 GMT"


def test_a_crawl_requests_validators_url_goes_over_the_wire() -> None:
    request = CrawlRequested(
        url="https://example.org/",
        domain="example.org",
        scope=Scope(value="example.org"),
        reason=RequestReason.RECRAWL,
        last_modified="Wed, 01 Jan 2025 00:00:00 GMT",
        validators_url="https://example.org/en/",
    )
    assert decode_event(request.to_wire()) == request
