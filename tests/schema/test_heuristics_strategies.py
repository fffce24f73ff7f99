"""The verdict on a strategy's attempt: usable content for that strategy, or wrong_tool."""

from __future__ import annotations

import pytest

from tests.schema.test_heuristics import completed, tags
from trove_schema.events import CrawlOutcome, Link, LinkKind
from trove_schema.heuristics import SHELL_MAX_TEXT_CHARS, audit, text_bucket

ACTIVITY = "application/activity+json; charset=utf-8"


def test_an_application_shell_is_the_wrong_tool_even_with_a_title_and_links() -> None:
    event = completed(  # noqa: S604 - an application shell, not a process
        status_code=200,
        title="social.example",
        links=(Link(url="https://blog.example/packs/app.js", kind=LinkKind.SCRIPT),),
        content_type="text/html",
        content_length=4096,
        text_chars=0,
        shell=True,
    )
    verdict = audit(event)
    assert (verdict.success, verdict.error_type, verdict.is_banned) == (False, "wrong_tool", False)
    found = tags(event)
    assert (found["has_spa"], found["text_chars"], found["strategy"]) == ("true", "0", "http")


def test_a_shell_flag_with_plenty_of_text_is_content() -> None:
    event = completed(  # noqa: S604 - an application shell, not a process
        status_code=200,
        title="Article",
        content_type="text/html",
        content_length=40_000,
        text_chars=SHELL_MAX_TEXT_CHARS * 10,
        shell=True,
    )
    assert audit(event).success


def test_an_activitypub_object_is_content_for_the_activitypub_strategy() -> None:
    event = completed(
        status_code=200,
        title="A post",
        content_type=ACTIVITY,
        content_length=2048,
        text_chars=300,
        fetcher="activitypub",
        strategy_reason="learned",
    )
    verdict = audit(event)
    assert (verdict.success, verdict.error_type) == (True, None)
    found = tags(event)
    assert (found["strategy"], found["strategy_reason"]) == ("activitypub", "learned")
    assert (found["content_family"], found["has_spa"], found["text_chars"]) == (
        "json",
        "false",
        "200-999",
    )


@pytest.mark.parametrize("content_type", ["text/html; charset=utf-8", "application/rss+xml"])
def test_a_page_answered_to_an_activitypub_request_is_the_wrong_tool(content_type: str) -> None:
    event = completed(
        status_code=200,
        title="A page",
        content_type=content_type,
        content_length=9000,
        text_chars=4000,
        fetcher="activitypub",
    )
    verdict = audit(event)
    assert (verdict.success, verdict.error_type) == (False, "wrong_tool")


def test_an_html_page_the_activitypub_strategy_did_not_parse_is_the_wrong_tool() -> None:
    event = completed(
        CrawlOutcome.REJECTED,
        status_code=200,
        content_type="text/html",
        error_message="content type text/html is not parsed",
        fetcher="activitypub",
    )
    assert audit(event).error_type == "wrong_tool"


def test_a_body_the_strategy_could_not_read_is_the_wrong_tool() -> None:
    event = completed(
        CrawlOutcome.REJECTED,
        status_code=200,
        content_type=ACTIVITY,
        error_message="extraction failed: NotActivityStreams: not JSON",
        fetcher="activitypub",
    )
    assert audit(event).error_type == "wrong_tool"


def test_a_feed_is_content_for_http() -> None:
    event = completed(
        status_code=200,
        title="Notes",
        content_type="application/atom+xml",
        content_length=3000,
        text_chars=900,
        links=(Link(url="https://blog.example/a", kind=LinkKind.FEED_ITEM),),
    )
    assert audit(event).success


def test_a_pdf_is_content_for_http() -> None:
    event = completed(
        status_code=200,
        title="A paper",
        content_type="application/pdf",
        content_length=30_000,
        text_chars=5000,
    )
    assert audit(event).success
    assert tags(event)["content_family"] == "pdf"


def test_text_alone_is_usable_content() -> None:
    event = completed(status_code=200, content_type="text/html", content_length=800, text_chars=600)
    assert audit(event).success


def test_an_empty_body_is_empty_content_whatever_else_the_event_says() -> None:
    event = completed(status_code=200, title="Ghost", content_type="text/html", content_length=0)
    assert audit(event).error_type == "empty_content"


@pytest.mark.parametrize("fetcher", ["http", "activitypub"])
def test_a_challenge_page_sent_with_a_200_is_never_a_success(fetcher: str) -> None:
    event = completed(
        status_code=200,
        title="Just a moment...",
        content_type="text/html",
        content_length=5000,
        text_chars=40,
        response_headers={"server": "cloudflare", "cf-mitigated": "challenge"},
        fetcher=fetcher,
    )
    verdict = audit(event)
    assert (verdict.success, verdict.error_type, verdict.is_banned) == (
        False,
        "blocked_captcha",
        True,
    )


@pytest.mark.parametrize("status", [403, 503])
def test_a_challenging_cdn_error_is_a_challenge_for_every_strategy(status: int) -> None:
    outcome = CrawlOutcome.BLOCKED_4XX if status == 403 else CrawlOutcome.BLOCKED_5XX
    event = completed(
        outcome,
        status_code=status,
        response_headers={"server": "cloudflare"},
        fetcher="activitypub",
    )
    verdict = audit(event)
    assert (verdict.error_type, verdict.is_banned) == ("blocked_captcha", True)


def test_an_attempt_that_parsed_nothing_has_no_text_tags() -> None:
    found = tags(completed(CrawlOutcome.TIMEOUT))
    assert "text_chars" not in found
    assert "has_spa" not in found
    assert "strategy_reason" not in found
    assert found["strategy"] == "http"


@pytest.mark.parametrize(
    ("chars", "bucket"),
    [(0, "0"), (1, "1-199"), (199, "1-199"), (200, "200-999"), (9_999, "1k-10k"), (10**6, "10k+")],
)
def test_text_chars_fall_in_coarse_buckets(chars: int, bucket: str) -> None:
    assert text_bucket(chars) == bucket
