"""Fetch strategies against real servers: what each asks for, what it reads, and the
audit's verdict on what it got (usable content, or the wrong tool for that host)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import httpx
import pytest

from tests.fetcher._pdfs import pdf
from tests.fetcher._servers import Exchange, LocalServer, serving
from trove_fetcher.activitystreams import ACCEPT as ACTIVITY_ACCEPT
from trove_fetcher.completion import completed, rejected, robots_refusal, unreadable
from trove_fetcher.extract import Extraction
from trove_fetcher.http import ACCEPT as HTTP_ACCEPT
from trove_fetcher.http import FetchLimits, FetchResult, fetch
from trove_fetcher.robots import RobotsPolicy, RobotsRule
from trove_fetcher.strategies import MEDIA_EXTENSIONS, STRATEGIES, applicable
from trove_fetcher.transport import build_client
from trove_sandbox.learning import LearningWeb, serve_learning_web
from trove_schema.events import CrawlCompleted, CrawlOutcome, PageDiscovered, Provenance, Scope
from trove_schema.heuristics import Audit, audit
from trove_schema.settings import FetcherSettings

ACTIVITY_JSON = "application/activity+json; charset=utf-8"
SHELL = (
    b"<!DOCTYPE html><html><head><title>social.example</title>"
    b"<script src='/packs/app.js' defer></script></head><body>"
    b"<div id='mastodon' data-props='{}'></div><noscript>To use this web application, "
    b"please enable JavaScript.</noscript></body></html>"
)
ARTICLE = (
    b"<!DOCTYPE html><html lang='en'><head><title>On gardens</title></head><body><article>"
    + b"<p>Shared gardens grow food and neighbours; they need water and patience.</p>" * 5
    + b"<a href='/next'>next</a></article></body></html>"
)
FEED = (
    b"<?xml version='1.0'?><rss version='2.0'><channel><title>Notes</title>"
    b"<item><title>First</title><link>http://site.test/first</link>"
    b"<description>Some words about gardens</description></item></channel></rss>"
)
POST = {
    "@context": "https://www.w3.org/ns/activitystreams",
    "id": "http://site.test/post/1",
    "type": "Note",
    "url": "http://site.test/post/1",
    "content": "<p>The garden opened this spring: <a href='http://blog.test/g'>photos</a></p>",
    "contentMap": {"en": "<p>The garden opened this spring</p>"},
}
PAPER = pdf(
    ["The small web is made of personal sites written by people for people."],
    title="A Study of the Small Web",
)


def _negotiated(exchange: Exchange) -> None:
    """A fediverse post page: the object to ActivityStreams clients, a shell to browsers."""
    accept = exchange.headers.get("Accept", "")
    if "application/activity+json" in accept or "application/ld+json" in accept:
        exchange.send(200, json.dumps(POST).encode(), {"Vary": "Accept"}, ACTIVITY_JSON)
    else:
        exchange.send(200, SHELL, {"Vary": "Accept"})


CHALLENGE = (
    b"<html><head><title>Just a moment...</title></head>"
    b"<body>Checking <a href='/cdn-cgi/challenge'>more</a></body></html>"
)


def _challenge(exchange: Exchange) -> None:
    exchange.send(200, CHALLENGE, {"Server": "cloudflare", "cf-mitigated": "challenge"})


def _waf_challenge(exchange: Exchange) -> None:
    exchange.send(202, CHALLENGE, {"Server": "awselb/2.0", "x-amzn-waf-action": "challenge"})


ROUTES = {
    "/post/1": _negotiated,
    "/article": lambda ex: ex.send(200, ARTICLE),
    "/feed": lambda ex: ex.send(200, FEED, content_type="application/rss+xml"),
    "/paper.pdf": lambda ex: ex.send(200, PAPER, content_type="application/pdf"),
    "/download": lambda ex: ex.send(200, PAPER, content_type="application/pdf"),
    "/challenge": _challenge,
    "/waf-challenge": _waf_challenge,
    "/empty": lambda ex: ex.send(200, b""),
    "/broken-json": lambda ex: ex.send(200, b'{"type": "Note", "content": [', {}, ACTIVITY_JSON),
}
WORK_URL = "http://site.test/post/1"
WORK = PageDiscovered(
    url=WORK_URL,
    domain="site.test",
    scope=Scope(value="site.test"),
    provenance=Provenance(kind="seed"),
)
LIMITS = FetchLimits(max_body_bytes=2 * 1024 * 1024, max_redirects=2, total_timeout=5.0)


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    with serving(ROUTES) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    settings = FetcherSettings(allowed_networks=("127.0.0.1/32",))
    async with build_client(settings) as built:
        yield built


async def attempt(
    client: httpx.AsyncClient, server: LocalServer, path: str, name: str
) -> tuple[FetchResult, CrawlCompleted, Audit]:
    return await attempt_url(client, server.url(path), name)


async def attempt_url(
    client: httpx.AsyncClient, url: str, name: str
) -> tuple[FetchResult, CrawlCompleted, Audit]:
    """One attempt with the named strategy, recorded as the fetcher records it."""
    strategy = STRATEGIES[name]
    started = datetime.now(UTC)
    result = await fetch(
        client,
        url,
        etag=None,
        last_modified=None,
        limits=LIMITS,
        is_parseable=strategy.is_parseable,
        accept=strategy.accept,
    )
    extraction: Extraction | None = None
    if result.body is not None:
        try:
            extraction = strategy.extract(
                result.body,
                url=result.final_url,
                content_type=result.content_type,
                x_robots_tag=result.x_robots_tag,
                robots_token="TroveBot",
            )
        except ValueError as exc:
            event = unreadable(WORK, exc, started, result, strategy=name, strategy_reason="explore")
            return result, event, audit(event)
    event = completed(WORK, result, extraction, started, strategy=name, strategy_reason="explore")
    return result, event, audit(event)


async def test_each_strategy_sends_its_own_accept_header(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    for name in ("http", "activitypub"):
        await attempt(client, server, "/article", name)
    sent = [seen.headers["accept"] for seen in server.requests_to("/article")[-2:]]
    assert sent == [HTTP_ACCEPT, ACTIVITY_ACCEPT]


async def test_a_post_behind_a_shell_is_the_wrong_tool_for_http_and_content_for_activitypub(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    _, by_http, http_verdict = await attempt(client, server, "/post/1", "http")
    assert by_http.outcome is CrawlOutcome.SUCCESS
    assert (by_http.shell, by_http.text_chars) == (True, 0)
    assert (http_verdict.success, http_verdict.error_type) == (False, "wrong_tool")

    _, by_ap, ap_verdict = await attempt(client, server, "/post/1", "activitypub")
    assert (ap_verdict.success, ap_verdict.error_type) == (True, None)
    assert (by_ap.fetcher, by_ap.strategy_reason, by_ap.shell) == ("activitypub", "explore", False)
    assert by_ap.title == "The garden opened this spring: photos"
    assert by_ap.language == "en"
    assert "garden" in by_ap.keywords
    assert "http://blog.test/g" in {link.url for link in by_ap.links}
    tags = {tag.type: tag.value for tag in ap_verdict.tags}
    assert (tags["strategy"], tags["strategy_reason"], tags["has_spa"]) == (
        "activitypub",
        "explore",
        "false",
    )


async def test_an_html_page_answered_to_an_activitypub_request_is_not_read(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    result, event, verdict = await attempt(client, server, "/article", "activitypub")
    assert result.outcome is CrawlOutcome.REJECTED
    assert result.body is None  # refused on its Content-Type, the body never read
    assert (verdict.success, verdict.error_type) == (False, "wrong_tool")
    assert event.fetcher == "activitypub"

    _, _, by_http = await attempt(client, server, "/article", "http")
    assert by_http.success


async def test_a_broken_activity_json_is_the_wrong_tool(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    _, event, verdict = await attempt(client, server, "/broken-json", "activitypub")
    assert event.outcome is CrawlOutcome.REJECTED
    assert (verdict.success, verdict.error_type) == (False, "wrong_tool")


async def test_a_feed_and_a_pdf_are_content_for_http(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    _, feed, feed_verdict = await attempt(client, server, "/feed", "http")
    assert feed_verdict.success
    assert feed.title == "Notes"

    _, paper, paper_verdict = await attempt(client, server, "/paper.pdf", "http")
    assert paper_verdict.success
    assert (paper.title, paper.language) == ("A Study of the Small Web", "en")
    assert {"personal", "sites"} <= set(paper.keywords)
    assert paper.text_chars is not None
    assert paper.text_chars > 40


async def test_a_pdf_answered_to_an_activitypub_request_is_the_wrong_tool(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    assert "activitypub" in applicable(server.url("/download"))  # nothing says it is a PDF
    _, _, verdict = await attempt(client, server, "/download", "activitypub")
    assert (verdict.success, verdict.error_type) == (False, "wrong_tool")


@pytest.mark.parametrize("path", ["/challenge", "/waf-challenge"])
@pytest.mark.parametrize("name", ["http", "activitypub"])
async def test_a_challenge_page_with_a_2xx_is_never_a_success_nor_the_pages_content(
    client: httpx.AsyncClient, server: LocalServer, name: str, path: str
) -> None:
    _, event, verdict = await attempt(client, server, path, name)
    assert (verdict.success, verdict.error_type, verdict.is_banned) == (
        False,
        "blocked_captcha",
        True,
    )
    # Nothing of the challenge goes into the record as the page's (asked as ActivityPub,
    # its HTML is refused on its Content-Type before it is read).
    expected = CrawlOutcome.BLOCKED_4XX if name == "http" else CrawlOutcome.REJECTED
    assert event.outcome is expected
    assert (event.title, event.content_hash, event.links, event.keywords) == (None, None, (), ())


async def test_an_empty_body_is_empty_content(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    _, event, verdict = await attempt(client, server, "/empty", "http")
    assert event.outcome is CrawlOutcome.SUCCESS
    assert (verdict.success, verdict.error_type) == (False, "empty_content")


async def test_on_the_learning_web_only_the_host_s_own_strategy_yields_content() -> None:
    web = LearningWeb(pages=3)
    async with serve_learning_web(web):
        settings = FetcherSettings(
            allowed_networks=("127.0.0.0/8",), resolve=tuple(web.resolve_setting().split(","))
        )
        async with build_client(settings) as client:
            for kind in ("html", "spa", "pdf", "challenge"):
                url = web.urls(kind)[1]
                verdicts = {
                    name: (await attempt_url(client, url, name))[2] for name in applicable(url)
                }
                working = {name for name, verdict in verdicts.items() if verdict.success}
                expected = web.content_strategy(kind)
                assert working == ({expected} if expected else set()), kind
                if kind == "challenge":
                    assert all(v.error_type == "blocked_captcha" for v in verdicts.values())
                else:
                    failing = {v.error_type for v in verdicts.values() if not v.success}
                    assert failing <= {"wrong_tool"}, kind


def test_activitypub_does_not_apply_to_documents_and_media() -> None:
    for url in (
        "https://site.example/files/report.PDF",
        "https://site.example/img/cat.jpg",
        "https://site.example/v/clip.mp4?autoplay=1",
        "https://site.example/static/app.js",
        "https://site.example/feed.xml",
    ):
        assert applicable(url) == ["http"], url
    for url in (
        "https://social.example/@ana/1102",
        "https://social.example/users/ana/statuses/1102",
        "https://blog.example/2026/11/on-gardens/",
        "https://blog.example/post.html",
        "https://blog.example/.well-known/x",
    ):
        assert applicable(url) == ["http", "activitypub"], url
    assert {"pdf", "png", "mp4"} <= MEDIA_EXTENSIONS


def test_each_strategy_parses_its_own_types() -> None:
    http, activitypub = STRATEGIES["http"], STRATEGIES["activitypub"]
    assert list(STRATEGIES) == ["http", "activitypub"]
    for kind in ("text/html", "application/xhtml+xml", "application/rss+xml", "application/pdf"):
        assert http.is_parseable(kind)
        assert not activitypub.is_parseable(kind)
    assert activitypub.is_parseable(ACTIVITY_JSON)
    assert activitypub.is_parseable('application/ld+json; profile="x"')
    assert not http.is_parseable("application/activity+json")
    assert not http.is_parseable(None)
    assert http.accept == HTTP_ACCEPT
    assert activitypub.accept.startswith("application/activity+json")


def test_every_kind_of_attempt_records_its_strategy() -> None:
    started = datetime.now(UTC)
    now = time.monotonic()
    result = FetchResult(
        url=WORK_URL,
        outcome=CrawlOutcome.NOT_MODIFIED,
        final_url=WORK_URL,
        status_code=304,
        started=now,
        completed=now,
    )
    done = completed(
        WORK,
        result,
        None,
        started,
        strategy="activitypub",
        strategy_reason="learned",
        conditional=True,
    )
    assert (done.fetcher, done.strategy_reason, done.conditional) == (
        "activitypub",
        "learned",
        True,
    )
    assert (done.text_chars, done.shell) == (None, False)
    refused = rejected(WORK, "no", started, strategy="activitypub", strategy_reason="prior")
    assert (refused.fetcher, refused.strategy_reason) == ("activitypub", "prior")
    policy = RobotsPolicy(
        origin="http://site.test", rule=RobotsRule.PARSED, fetched_at=0.0, body=b"Disallow: /"
    )
    blocked = robots_refusal(WORK, policy, strategy="activitypub", strategy_reason="only")
    assert (blocked.fetcher, blocked.strategy_reason) == ("activitypub", "only")
    plain = completed(WORK, result, None, started)
    assert (plain.fetcher, plain.strategy_reason, plain.conditional) == ("http", None, False)


def test_an_event_that_cannot_be_built_keeps_its_strategy() -> None:
    started = datetime.now(UTC)
    now = time.monotonic()
    result = FetchResult(
        url=WORK_URL,
        outcome=CrawlOutcome.SUCCESS,
        final_url=WORK_URL,
        status_code=200,
        body=b"{}",
        started=now,
        completed=now,
    )
    broken = Extraction(content_hash="x", keywords=("k",) * 10_000)  # over the keyword cap
    event = completed(WORK, result, broken, started, strategy="activitypub", strategy_reason="p")
    assert event.outcome is CrawlOutcome.REJECTED
    assert (event.fetcher, event.strategy_reason) == ("activitypub", "p")
