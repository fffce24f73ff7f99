"""IndieWeb signals on any page: rel=me and Webmention endpoints become their own link kinds."""

from __future__ import annotations

import pytest

from trove_fetcher.extract import Extraction, FoundLink, extract
from trove_schema.events import MAX_LINKS_PER_PAGE, LinkKind

PAGE = "https://example.org/blog/post.html"


def run(body: str) -> Extraction:
    return extract(
        body.encode(),
        url=PAGE,
        content_type="text/html; charset=utf-8",
        detect_language=False,
    )


def links(body: str) -> set[FoundLink]:
    return set(run(body).links)


@pytest.mark.parametrize("tag", ["a", "link"])
def test_rel_me_is_a_me_link(tag: str) -> None:
    found = links(f'<{tag} rel="me" href="https://social.example/@ann">Ann</{tag}>')
    assert found == {FoundLink("https://social.example/@ann", LinkKind.ME)}


@pytest.mark.parametrize("tag", ["a", "link"])
@pytest.mark.parametrize("rel", ["webmention", "http://webmention.org/"])
def test_rel_webmention_is_a_webmention_link(tag: str, rel: str) -> None:
    found = links(f'<{tag} rel="{rel}" href="https://hooks.example/wm">x</{tag}>')
    assert found == {FoundLink("https://hooks.example/wm", LinkKind.WEBMENTION)}


def test_rel_values_are_case_insensitive() -> None:
    found = links(
        '<link REL="WebMention" href="/wm"><a rel="ME" href="https://code.example/ann">c</a>'
        '<link rel="HTTP://WEBMENTION.ORG/" href="/legacy">'
    )
    assert found == {
        FoundLink("https://example.org/wm", LinkKind.WEBMENTION),
        FoundLink("https://code.example/ann", LinkKind.ME),
        FoundLink("https://example.org/legacy", LinkKind.WEBMENTION),
    }


def test_rel_me_among_other_tokens_keeps_its_nofollow() -> None:
    found = links(
        '<a rel="nofollow  me" href="https://social.example/@ann">a</a>'
        '<a rel="me noopener" href="https://code.example/ann">b</a>'
        '<link rel="ugc webmention" href="https://hooks.example/wm">'
    )
    assert found == {
        FoundLink("https://social.example/@ann", LinkKind.ME, nofollow=True),
        FoundLink("https://code.example/ann", LinkKind.ME),
        FoundLink("https://hooks.example/wm", LinkKind.WEBMENTION, nofollow=True),
    }


def test_relative_indieweb_links_are_resolved_against_the_base() -> None:
    found = links(
        '<base href="https://example.org/people/">'
        '<link rel="me" href="ann.html"><a rel="me" href="../about#me">about</a>'
        '<link rel="webmention" href="//hooks.example/wm?site=1">'
    )
    assert found == {
        FoundLink("https://example.org/people/ann.html", LinkKind.ME),
        FoundLink("https://example.org/about", LinkKind.ME),
        FoundLink("https://hooks.example/wm?site=1", LinkKind.WEBMENTION),
    }


def test_an_endpoint_that_is_also_me_is_both_kinds() -> None:
    found = links('<a rel="me webmention" href="https://ann.example/">me</a>')
    assert found == {
        FoundLink("https://ann.example/", LinkKind.ME),
        FoundLink("https://ann.example/", LinkKind.WEBMENTION),
    }


def test_indieweb_links_are_not_also_plain_links() -> None:
    # A Webmention endpoint would otherwise be crawled as a page.
    kinds = {link.kind for link in run('<a rel="webmention" href="/wm">wm</a>').links}
    assert kinds == {LinkKind.WEBMENTION}


def test_a_link_element_keeps_its_other_kind_beside_me() -> None:
    found = links('<link rel="me alternate" type="application/atom+xml" href="/feed">')
    assert found == {
        FoundLink("https://example.org/feed", LinkKind.ME),
        FoundLink("https://example.org/feed", LinkKind.FEED),
    }


def test_other_rel_values_are_not_indieweb() -> None:
    found = links(
        '<a rel="author" href="/ann">a</a><a rel="meta" href="/m">m</a>'
        '<link rel="pingback" href="/xmlrpc.php"><link rel="webmentions" href="/x">'
    )
    assert found == {
        FoundLink("https://example.org/ann", LinkKind.A),
        FoundLink("https://example.org/m", LinkKind.A),
    }


def test_page_nofollow_makes_indieweb_links_nofollow() -> None:
    found = links(
        '<meta name="robots" content="nofollow"><link rel="me" href="https://social.example/@a">'
    )
    assert found == {FoundLink("https://social.example/@a", LinkKind.ME, nofollow=True)}


def test_the_link_cap_keeps_indieweb_links_before_plain_ones() -> None:
    plain = "".join(f'<a href="/p{i}">p</a>' for i in range(MAX_LINKS_PER_PAGE))
    result = run(
        f'{plain}<a rel="me" href="https://social.example/@ann">me</a>'
        '<link rel="webmention" href="/wm">'
    )
    assert result.links_truncated
    assert len(result.links) == MAX_LINKS_PER_PAGE
    assert FoundLink("https://social.example/@ann", LinkKind.ME) in result.links
    assert FoundLink("https://example.org/wm", LinkKind.WEBMENTION) in result.links
