"""Readable text is counted, and an application shell (scripts around a mount point and
next to no text) is told apart from a short page, whatever framework made it."""

from __future__ import annotations

import pytest

from trove_fetcher.extract import extract
from trove_schema.heuristics import SHELL_MAX_TEXT_CHARS

URL = "https://site.example/post/1"

MASTODON = """<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">
<title>social.example</title><script src="/packs/js/common.js" nonce="x"></script>
<link rel="stylesheet" href="/packs/css/common.css"></head>
<body class="app-body"><div class="app-holder" data-props="{&quot;locale&quot;:&quot;en&quot;}"
id="mastodon"><noscript><img alt="Mastodon" src="/avatars/original/missing.png">
<div>To use the Mastodon web application, please enable JavaScript. Alternatively, try one
of the native apps for Mastodon for your platform.</div></noscript></div>
<script id="initial-state" type="application/json">{"meta":{"streaming_api_base_url":
"wss://social.example","title":"a long JSON state the app renders from"}}</script></body></html>"""

REACT = """<!doctype html><html><head><title>React App</title>
<script defer src="/static/js/main.1a2b.js"></script></head>
<body><noscript>You need to enable JavaScript to run this app.</noscript>
<div id="root"></div></body></html>"""

ANGULAR = """<html><head><title>Shop</title></head><body>
<app-root></app-root><script src="runtime.js" type="module"></script>
<script src="main.js" type="module"></script></body></html>"""

SCRIPTS_ONLY = """<html><head><title>App</title></head><body>
<script src="/app.js"></script><script>boot({"el": "body"})</script></body></html>"""

ARTICLE_WITH_ANALYTICS = (
    "<html><head><title>On gardens</title><script src='/analytics.js'></script></head><body>"
    "<div id='page'><article><h1>On gardens</h1>"
    + "<p>Shared gardens grow food and neighbours, and they need water every day.</p>" * 8
    + "</article></div><noscript><img src='/pixel.gif'></noscript></body></html>"
)

SHORT_PAGE = (
    "<html><head><title>Jane</title></head><body><h1>Jane</h1><p>I write.</p></body></html>"
)


def text_chars_and_shell(page: str) -> tuple[int | None, bool]:
    found = extract(page.encode(), url=URL, content_type="text/html", detect_language=False)
    return found.text_chars, found.shell


@pytest.mark.parametrize(
    "page",
    [MASTODON, REACT, ANGULAR, SCRIPTS_ONLY],
    ids=["mastodon", "react", "angular", "scripts-only"],
)
def test_an_application_shell_is_a_shell_whatever_made_it(page: str) -> None:
    chars, shell = text_chars_and_shell(page)
    assert shell
    assert chars is not None
    assert chars < SHELL_MAX_TEXT_CHARS


def test_a_noscript_asking_for_javascript_around_no_text_is_a_shell() -> None:
    page = "<html><body><noscript>Please enable JavaScript.</noscript></body></html>"
    assert text_chars_and_shell(page) == (0, True)


def test_an_article_with_an_analytics_script_is_not_a_shell() -> None:
    chars, shell = text_chars_and_shell(ARTICLE_WITH_ANALYTICS)
    assert not shell
    assert chars is not None
    assert chars > SHELL_MAX_TEXT_CHARS


def test_a_short_page_without_scripts_is_not_a_shell() -> None:
    assert text_chars_and_shell(SHORT_PAGE) == (len("Jane") + len("Iwrite."), False)


def test_an_empty_page_with_no_scripts_is_not_a_shell_but_has_no_text() -> None:
    assert text_chars_and_shell("<html><body><div id='x'></div></body></html>") == (0, False)


def test_text_chars_leave_out_scripts_styles_navigation_and_the_head() -> None:
    page = (
        "<html><head><title>Title words</title><style>p { color: red }</style></head><body>"
        "<nav>Home About</nav><script>var hidden = 'not text';</script>"
        "<p>one  two\n\tthree</p></body></html>"
    )
    assert text_chars_and_shell(page) == (len("onetwothree"), False)


def test_a_feed_counts_its_text() -> None:
    feed = (
        b"<?xml version='1.0'?><rss version='2.0'><channel><title>Notes</title>"
        b"<item><title>First post</title><description>Some words</description></item>"
        b"</channel></rss>"
    )
    found = extract(feed, url=URL, content_type="application/rss+xml", detect_language=False)
    assert found.is_feed
    assert found.text_chars == len("FirstpostSomewords")
    assert not found.shell


def test_a_binary_body_has_no_text_count() -> None:
    found = extract(b"\x00\x01\x02" * 100, url=URL, content_type="text/html")
    assert (found.text_chars, found.shell) == (None, False)
