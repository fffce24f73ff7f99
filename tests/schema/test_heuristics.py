"""The audit verdict and tags: one pure function of the CrawlCompleted event."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from trove_schema.events import CrawlCompleted, CrawlOutcome, Link, Scope, decode_event
from trove_schema.heuristics import MAX_TAG_VALUE, audit, url_tags


def completed(outcome: CrawlOutcome = CrawlOutcome.SUCCESS, **fields: Any) -> CrawlCompleted:
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    base: dict[str, Any] = {
        "url": "https://blog.example/notes/2026/post.html?x=1",
        "domain": "blog.example",
        "scope": Scope(value="blog.example"),
        "request_id": "00000000-0000-0000-0000-000000000001",
        "outcome": outcome,
        "started_at": now - timedelta(milliseconds=120),
        "completed_at": now,
    }
    base.update(fields)
    return CrawlCompleted(**base)


def tags(event: CrawlCompleted) -> dict[str, str]:
    return {t.type: t.value for t in audit(event).tags}


def test_url_tags_describe_the_address_before_the_fetch() -> None:
    found = {t.type: t.value for t in url_tags("https://cdn.static.example/a/b/app.JS?v=2")}
    assert found == {
        "domain": "cdn.static.example",
        "tld": "example",
        "scheme": "https",
        "extension": "js",
        "path_depth": "3",
        "has_query": "true",
        "contains_cdn": "true",
        "contains_static": "true",
    }
    plain = {t.type: t.value for t in url_tags("https://blog.example/")}
    assert (plain["extension"], plain["path_depth"], plain["has_query"]) == ("none", "0", "false")
    assert (plain["contains_cdn"], plain["contains_static"]) == ("false", "false")


def test_a_page_with_a_title_is_a_success() -> None:
    event = completed(
        status_code=200,
        title="Notes",
        content_type="text/html; charset=utf-8",
        content_length=512,
        response_headers={"server": "nginx/1.25.3"},
    )
    verdict = audit(event)
    assert (verdict.success, verdict.is_banned, verdict.error_type) == (True, False, None)
    found = tags(event)
    assert found["status"] == "200"
    assert found["status_class"] == "2xx"
    assert (found["content_type"], found["content_family"]) == ("text/html", "html")
    assert (found["server"], found["empty_body"], found["challenge"]) == ("nginx", "false", "false")
    assert "error_type" not in found


def test_a_200_with_nothing_usable_is_empty_content() -> None:
    event = completed(status_code=200, content_length=0)
    verdict = audit(event)
    assert (verdict.success, verdict.error_type) == (False, "empty_content")
    assert tags(event)["empty_body"] == "true"


def test_links_alone_are_usable_content() -> None:
    event = completed(status_code=200, links=(Link(url="https://blog.example/a"),))
    assert audit(event).success


def test_not_modified_is_a_success() -> None:
    assert audit(completed(CrawlOutcome.NOT_MODIFIED, status_code=304)).success


@pytest.mark.parametrize(
    ("outcome", "status", "headers", "message", "error_type", "banned"),
    [
        (
            CrawlOutcome.BLOCKED_4XX,
            403,
            {"cf-mitigated": "challenge"},
            None,
            "blocked_captcha",
            True,
        ),
        (CrawlOutcome.BLOCKED_5XX, 503, {"server": "cloudflare"}, None, "blocked_captcha", True),
        # The origin's maintenance, passed on by its CDN: it asks for time.
        (
            CrawlOutcome.BLOCKED_5XX,
            503,
            {"server": "cloudflare", "retry-after": "300"},
            None,
            "server_error",
            False,
        ),
        (
            CrawlOutcome.BLOCKED_4XX,
            202,
            {"x-amzn-waf-action": "challenge"},
            "a bot challenge, not the page",
            "blocked_captcha",
            True,
        ),
        (
            CrawlOutcome.BLOCKED_4XX,
            405,
            {"x-amzn-waf-action": "captcha"},
            None,
            "blocked_captcha",
            True,
        ),
        (CrawlOutcome.BLOCKED_4XX, 403, {"server": "nginx"}, None, "blocked_403", True),
        (CrawlOutcome.BLOCKED_4XX, 429, {"retry-after": "30"}, None, "rate_limited", True),
        (CrawlOutcome.BLOCKED_4XX, 404, {}, None, "not_found", False),
        (CrawlOutcome.BLOCKED_4XX, 410, {}, None, "not_found", False),
        (CrawlOutcome.BLOCKED_4XX, 401, {}, None, "client_error", False),
        (CrawlOutcome.BLOCKED_5XX, 502, {"server": "nginx"}, None, "server_error", False),
        (CrawlOutcome.TIMEOUT, None, {}, "ReadTimeout", "timeout", False),
        (CrawlOutcome.FAILED, None, {}, "ConnectError: refused", "network_error", False),
        (CrawlOutcome.BLOCKED_ROBOTS, None, {}, "disallowed by robots.txt", "robots", False),
        (CrawlOutcome.FAILED, None, {}, "robots.txt unavailable (500): x", "robots", False),
        (CrawlOutcome.REJECTED, 301, {}, "redirected to another host", "offsite_redirect", False),
        (CrawlOutcome.FAILED, 301, {}, "redirect loop back to http://h/a", "broken_answer", False),
        (CrawlOutcome.FAILED, 302, {}, "too many redirects (more than 5)", "broken_answer", False),
        (CrawlOutcome.FAILED, 302, {}, "HTTP 302 without a Location", "broken_answer", False),
        (CrawlOutcome.FAILED, 200, {}, "corrupt gzip body: bad header", "broken_answer", False),
        (CrawlOutcome.FAILED, 301, {}, "ConnectError: refused", "network_error", False),
        (CrawlOutcome.FAILED, None, {}, "blocked address: 10.0.0.1", "blocked_address", False),
    ],
)
def test_the_error_type_says_what_went_wrong(
    outcome: CrawlOutcome,
    status: int | None,
    headers: dict[str, str],
    message: str | None,
    error_type: str,
    banned: bool,
) -> None:
    event = completed(outcome, status_code=status, response_headers=headers, error_message=message)
    verdict = audit(event)
    assert (verdict.success, verdict.error_type, verdict.is_banned) == (False, error_type, banned)
    assert tags(event)["error_type"] == error_type


@pytest.mark.parametrize(
    ("fetcher", "status", "error_type"),
    [
        ("activitypub", 401, "wrong_tool"),
        ("activitypub", 406, "wrong_tool"),
        ("activitypub", 415, "wrong_tool"),
        ("activitypub", 404, "not_found"),
        ("activitypub", 400, "client_error"),
        ("http", 401, "client_error"),
        ("http", 406, "client_error"),
    ],
)
def test_a_refusal_of_what_a_strategy_asks_for_is_the_wrong_tool_not_the_pages_status(
    fetcher: str, status: int, error_type: str
) -> None:
    """Asked for ActivityStreams, a server may refuse the representation (406, 415) or
    an unsigned request (401) and still serve the page: another way may read it. Asked
    for the page, the same status is the page's."""
    event = completed(CrawlOutcome.BLOCKED_4XX, status_code=status, fetcher=fetcher)
    assert audit(event).error_type == error_type


@pytest.mark.parametrize(
    ("content_type", "error_type"),
    [
        ("text/html; charset=utf-8", "wrong_tool"),
        ("application/activity+json", "wrong_tool"),
        ("application/pdf", "wrong_tool"),
        ("application/zip", "unparsed_type"),
        ("image/png", "unparsed_type"),
        (None, "unparsed_type"),
    ],
)
def test_a_type_another_strategy_reads_is_the_wrong_tool_and_an_archive_is_not(
    content_type: str | None, error_type: str
) -> None:
    """An archive asked for as a page is not a reason to ask it another way, nor to
    learn that the strategy fails on the host."""
    event = completed(
        CrawlOutcome.REJECTED,
        status_code=200,
        content_type=content_type,
        error_message=f"content type {content_type} is not parsed",
    )
    assert audit(event).error_type == error_type


def test_a_challenge_is_tagged_with_its_cdn() -> None:
    event = completed(
        CrawlOutcome.BLOCKED_4XX,
        status_code=403,
        response_headers={
            "server": "cloudflare",
            "cf-ray": "8f00-AMS",
            "cf-mitigated": "challenge",
        },
    )
    found = {t.type: t for t in audit(event).tags}
    assert (found["challenge"].value, found["cdn"].value, found["server"].value) == (
        "true",
        "cloudflare",
        "cloudflare",
    )
    assert found["challenge"].importance > found["domain"].importance


def test_the_same_event_always_gives_the_same_tags() -> None:
    event = completed(status_code=200, title="x", response_headers={"server": "Apache/2.4"})
    decoded = decode_event(event.to_wire())
    assert isinstance(decoded, CrawlCompleted)
    assert audit(event) == audit(decoded)


def test_tag_values_are_bounded_and_every_score_is_between_0_and_1() -> None:
    event = completed(
        CrawlOutcome.BLOCKED_4XX,
        status_code=400,
        response_headers={"x-robots-tag": "noindex " * 40},
        final_url="https://blog.example/other",
        retry_after=5.0,
    )
    found = audit(event).tags
    assert all(len(t.value) <= MAX_TAG_VALUE and 0 <= t.importance <= 1 for t in found)
    types = {t.type for t in found}
    assert {"x_robots_tag", "redirected", "retry_after"} <= types
