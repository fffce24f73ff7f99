"""A collection longer than this code's bound (a release that raised it, then rolled
back) is cut to the bound where an event is read, and refused where one is built."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from trove_schema.events import (
    MAX_AUDIT_HEADERS,
    MAX_KEYWORDS,
    MAX_LINKS_PER_PAGE,
    MAX_RECENT_POSTS,
    MAX_VISITS,
    ChangeHistory,
    CrawlCompleted,
    CrawlOutcome,
    CrawlRequested,
    Event,
    Link,
    RequestReason,
    Scope,
    SharedPost,
    TimelinePolled,
    TimelinePollRequested,
    decode_event,
)

NOW = datetime(2026, 11, 28, 5, 0, tzinfo=UTC)


def completed() -> CrawlCompleted:
    return CrawlCompleted(
        url="https://example.org/",
        domain="example.org",
        scope=Scope(value="example.org"),
        request_id="r-1",
        outcome=CrawlOutcome.SUCCESS,
        started_at=NOW,
        completed_at=NOW,
        links=(Link(url="https://example.org/a"),),
    )


def recrawl() -> CrawlRequested:
    return CrawlRequested(
        url="https://example.org/",
        domain="example.org",
        scope=Scope(value="example.org"),
        reason=RequestReason.RECRAWL,
        history=ChangeHistory(visits=((3600.0, True),)),
    )


def poll() -> TimelinePollRequested:
    return TimelinePollRequested(
        instance="https://social.example",
        domain="social.example",
        timeline="public",
        follow_id="f-1",
        cursor="500",
    )


def polled() -> TimelinePolled:
    return TimelinePolled(
        request_id="p-1",
        instance="https://social.example",
        domain="social.example",
        timeline="public",
        follow_id="f-1",
        outcome=CrawlOutcome.SUCCESS,
        started_at=NOW,
        completed_at=NOW,
        posts=(SharedPost(uri="https://social.example/p/0", account="a@social.example"),),
    )


@dataclass(frozen=True)
class Bound:
    """A bounded collection of an event: how to write ``n`` items of it into the wire
    JSON (returning them as ``read`` gives them), and to read them from the event."""

    event: Callable[[], Event]
    bound: int
    #: Which end a cut keeps: the first items, or the last (the newest).
    keep: str
    write: Callable[[dict[str, Any], int], list[Any]]
    read: Callable[[Any], list[Any]]


def _links(wire: dict[str, Any], n: int) -> list[Any]:
    urls = [f"https://example.org/{i}" for i in range(n)]
    wire["links"] = [{"url": url} for url in urls]
    return urls


def _keywords(wire: dict[str, Any], n: int) -> list[Any]:
    terms = [f"term{i:04d}" for i in range(n)]
    wire["keywords"] = terms
    return terms


def _visits(wire: dict[str, Any], n: int) -> list[Any]:
    # Oldest first: seconds since the visit before, changed since it.
    visits: list[Any] = [[3600.0 + i, i % 2 == 0] for i in range(n)]
    wire["history"]["visits"] = visits
    return visits


def _recent(wire: dict[str, Any], n: int) -> list[Any]:
    ids = [str(1000 + i) for i in range(n)]  # in id order, the newest last
    wire["recent"] = ids
    return ids


def _recent_after(wire: dict[str, Any], n: int) -> list[Any]:
    ids = [str(1000 + i) for i in range(n)]
    wire["recent_after"] = ids
    return ids


def _posts(wire: dict[str, Any], n: int) -> list[Any]:
    uris = [f"https://social.example/p/{i}" for i in range(n)]
    wire["posts"] = [{**wire["posts"][0], "uri": uri} for uri in uris]
    return uris


def _post_links(wire: dict[str, Any], n: int) -> list[Any]:
    urls = [f"https://example.org/{i}" for i in range(n)]
    wire["posts"][0]["links"] = urls
    return urls


def _headers(wire: dict[str, Any], n: int) -> list[Any]:
    wire["response_headers"] = {f"x-header-{i:02d}": str(i) for i in range(n)}
    return list(wire["response_headers"])


BOUNDS = {
    "links": Bound(
        completed, MAX_LINKS_PER_PAGE, "first", _links, lambda e: [link.url for link in e.links]
    ),
    "keywords": Bound(completed, MAX_KEYWORDS, "first", _keywords, lambda e: list(e.keywords)),
    # A re-crawl chain's history: its newest visits are what the next interval is made of.
    "visits": Bound(
        recrawl, MAX_VISITS, "last", _visits, lambda e: [list(v) for v in e.history.visits]
    ),
    # The ids right behind the cursor are the ones a lookback meets again.
    "recent": Bound(poll, MAX_RECENT_POSTS, "last", _recent, lambda e: list(e.recent)),
    "recent_after": Bound(
        polled, MAX_RECENT_POSTS, "last", _recent_after, lambda e: list(e.recent_after)
    ),
    "posts": Bound(polled, 1000, "first", _posts, lambda e: [post.uri for post in e.posts]),
    "post links": Bound(polled, 100, "first", _post_links, lambda e: list(e.posts[0].links)),
    "response headers": Bound(
        completed, MAX_AUDIT_HEADERS, "first", _headers, lambda e: list(e.response_headers)
    ),
}


def over_the_bound(bound: Bound) -> tuple[dict[str, Any], list[Any]]:
    """The wire JSON of an event with one item too many, and what a cut of it keeps."""
    wire: dict[str, Any] = json.loads(bound.event().to_wire())
    written = bound.write(wire, bound.bound + 1)
    kept = written[: bound.bound] if bound.keep == "first" else written[-bound.bound :]
    return wire, kept


@pytest.mark.parametrize("bound", BOUNDS.values(), ids=BOUNDS.keys())
def test_a_collection_over_this_codes_bound_is_cut_to_it_on_read(bound: Bound) -> None:
    wire, kept = over_the_bound(bound)
    assert len(kept) == bound.bound

    # Compact JSON takes decode_event's fast path; spaced JSON the tolerant one.
    for encoded in (json.dumps(wire, separators=(",", ":")), json.dumps(wire)):
        read = decode_event(encoded.encode())
        assert bound.read(read) == kept


@pytest.mark.parametrize("bound", BOUNDS.values(), ids=BOUNDS.keys())
def test_an_event_built_over_the_bound_is_still_refused(bound: Bound) -> None:
    wire, _ = over_the_bound(bound)
    fields = {k: v for k, v in wire.items() if k not in ("type", "version")}

    with pytest.raises(ValidationError, match=f"at most {bound.bound} items"):
        type(bound.event())(**fields)
