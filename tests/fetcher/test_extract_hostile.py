"""Hostile and broken bodies: extraction degrades, it never raises."""

from __future__ import annotations

import json
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trove_fetcher.activitystreams import extract_activity
from trove_fetcher.extract import (
    MAX_CONTROL_BYTES,
    MAX_LINKS_SEEN,
    MAX_TAG_ATTRIBUTES,
    Extraction,
    _Resolver,
    extract,
)
from trove_fetcher.timeline import content_links
from trove_schema.events import CrawlCompleted, LinkKind

CONTENT_TYPES = [
    "text/html",
    "text/html; charset=utf-8",
    "text/html; charset=bogus",
    "application/xhtml+xml",
    "application/rss+xml",
    "application/atom+xml",
    "application/xml",
    None,
]

HOSTILE = {
    "empty": b"",
    "whitespace": b" \r\n\t ",
    "binary garbage": random.Random(7).randbytes(200_000),
    "nul bytes": b"\x00" * 4096,
    "gzip magic": b"\x1f\x8b\x08\x00" + random.Random(8).randbytes(5000),
    "10,000-deep nesting": b"<html><body><a href='/before'>b</a>"
    + b"<div>" * 10_000
    + b"<a href='/deep'>deep</a>"
    + b"</div>" * 10_000,
    "huge attribute": b'<a href="/ok" data-x="' + b"x" * 3_000_000 + b'">y</a>',
    "unterminated attribute": b'<a href="/ok>' + b"x" * 100_000,
    "unclosed everything": b"<html><head><title>t<body><table><tr><td><a href='/a'>",
    "only angle brackets": b"<" * 200_000,
    "only ampersands": b"&#" * 100_000,
    "surrogate references": b"<title>&#xD800;&#55296;&#x110000;</title>",
    "lone utf-8 continuation bytes": b"<title>\x80\x80\xbf</title>",
    "broken xml declaration": b'<?xml version="1.0" encoding="\xff\xfe"?><rss><channel>',
    "truncated feed": b"<?xml version='1.0'?><rss><channel><item><link>https://e.org/",
    "deep feed": b"<?xml version='1.0'?><feed>" + b"<entry>" * 10_000,
    "utf-16 without bom": "<title>hi</title>".encode("utf-16-le"),
    # Each of these took a regular expression quadratic time (hours at this size, with
    # the GIL held): the suite's timeout is what fails them.
    "a refresh of a million spaces": b'<html><head><meta http-equiv="refresh" content="'
    + b" " * 1_000_000
    + b'x"></head><body>hi</body></html>',
    "a feed text of a million angle brackets": b"<?xml version='1.0'?><rss><channel><item>"
    + b"<title>t</title><description><![CDATA["
    + b"<" * 1_000_000
    + b"]]></description></item></channel></rss>",
    "unclosed noscript tags": b"<html><body>" + b"<noscript " * 200_000,
    "forty comments before the page": b"<!DOCTYPE html>"
    + b"<!-- c -->\n" * 40
    + b"<html><body>hi</body></html>",
    "forty processing instructions and no root": b"<?a?>" * 40 + b"x",
    "a run of combining marks": ("<p>a" + "\u0300\u0316" * 500_000 + "</p>").encode(),
    "a megabyte of noscript tags": b"<html><body>" + b"<noscript>" * 100_000,
    # libxml2 compares each attribute of a tag with those before it.
    "a tag of 300,000 attributes": b"<a href=/x "
    + b" ".join(b"a%d" % i for i in range(300_000))
    + b">x</a>",
}


def run(body: bytes, content_type: str | None) -> Extraction:
    return extract(body, url="https://example.org/p", content_type=content_type)


@pytest.mark.parametrize("content_type", CONTENT_TYPES)
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_body_never_raises(name: str, content_type: str | None) -> None:
    body = HOSTILE[name]
    result = run(body, content_type)
    assert re.fullmatch(r"[0-9a-f]{64}|[tm]:[0-9a-f]{62}", result.content_hash)
    # Whatever came out must fit the event it goes into.
    CrawlCompleted.model_validate(
        {
            "url": "https://example.org/p",
            "domain": "example.org",
            "scope": {},
            "request_id": "r",
            "outcome": "success",
            "started_at": "2024-01-01T00:00:00Z",
            "completed_at": "2024-01-01T00:00:01Z",
            "title": result.title,
            "language": result.language,
            "keywords": result.keywords,
            "links": [link._asdict() for link in result.links],
        }
    )


def test_binary_body_gives_no_signals() -> None:
    result = run(HOSTILE["binary garbage"], "text/html")
    assert result == Extraction(content_hash=result.content_hash)


def test_a_control_byte_in_a_page_declared_html_does_not_make_it_binary() -> None:
    # A \x0b (Word's manual line break) pasted into a CMS title.
    body = b"<head><meta charset=utf-8><title>Annual report\x0b2024</title></head>"
    body += b"<body><p>Figures.</p><a href=/next>next</a></body>"
    result = run(body, "text/html")
    assert result.title == "Annual report 2024"
    assert [link.url for link in result.links] == ["https://example.org/next"]
    # Without a declared type, the sniffing rule holds: one such byte is binary.
    undeclared = run(body, None)
    assert undeclared == Extraction(content_hash=undeclared.content_hash)


@pytest.mark.parametrize("content_type", ["text/html", "application/xhtml+xml"])
def test_a_page_declared_html_of_many_control_bytes_is_binary(content_type: str) -> None:
    page = b"<title>t</title><a href=/next>next</a>"
    assert run(page + b"\x01" * MAX_CONTROL_BYTES, content_type).title == "t"
    binary = run(page + b"\x01" * (MAX_CONTROL_BYTES + 1), content_type)
    assert binary == Extraction(content_hash=binary.content_hash)


@pytest.mark.parametrize(
    "signature",
    [
        b"\x89PNG\r\n\x1a\n",
        b"GIF89a",
        b"\xff\xd8\xff\xe0",
        b"PK\x03\x04",
        b"\x1f\x8b\x08",
        b"%PDF-1.7",
    ],
)
def test_a_binary_signature_sent_as_html_is_binary(signature: bytes) -> None:
    result = run(signature + b"<title>t</title><a href=/next>next</a>", "text/html")
    assert result == Extraction(content_hash=result.content_hash)


def test_deep_nesting_keeps_the_links_before_the_depth_limit() -> None:
    result = run(HOSTILE["10,000-deep nesting"], "text/html")
    assert ("https://example.org/before", LinkKind.A) in [(x.url, x.kind) for x in result.links]


def test_huge_attribute_does_not_hide_the_link() -> None:
    result = run(HOSTILE["huge attribute"], "text/html")
    assert [link.url for link in result.links] == ["https://example.org/ok"]


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=2000), content_type=st.sampled_from(CONTENT_TYPES))
def test_arbitrary_bytes_never_raise(body: bytes, content_type: str | None) -> None:
    assert re.fullmatch(r"[0-9a-f]{64}|[tm]:[0-9a-f]{62}", run(body, content_type).content_hash)


_FRAGMENTS = st.sampled_from(
    [
        "<a href='",
        "<a href=",
        "'>",
        "<base href='",
        "<link rel='canonical alternate stylesheet' href='",
        "<img srcset='",
        "<meta name=robots content='",
        "<meta http-equiv=refresh content='",
        "<title>",
        "</title>",
        "<script>",
        "<?xml version='1.0'?>",
        "<rss><channel><item><link>",
        "<feed xmlns='http://www.w3.org/2005/Atom'><entry><link href='",
        "<!DOCTYPE x [<!ENTITY e SYSTEM 'file:///etc/passwd'>]>",
        "&e;",
        "http://",
        "https://[::1",
        "javascript:",
        "//",
        "#",
        "?",
        "..",
        ":99999",
        "\x00",
        "\ufeff",
        "é",
        " ",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.one_of(_FRAGMENTS, st.text(max_size=8)), max_size=40),
    content_type=st.sampled_from(CONTENT_TYPES),
    x_robots_tag=st.one_of(st.none(), st.text(max_size=30)),
)
def test_arbitrary_markup_never_raises(
    parts: list[str], content_type: str | None, x_robots_tag: str | None
) -> None:
    body = "".join(parts).encode("utf-8", "surrogatepass")
    result = extract(
        body,
        url="https://example.org/dir/page",
        content_type=content_type,
        x_robots_tag=x_robots_tag,
    )
    assert all(link.url.startswith(("http://", "https://")) for link in result.links)
    assert all("#" not in link.url for link in result.links)


def test_a_tag_of_too_many_attributes_keeps_its_first_and_the_page_goes_on() -> None:
    crowded = b" ".join(b'a%d="1 2"' % i for i in range(5_000))
    body = b"<html><body><a href=/first " + crowded + b">x</a><a href=/next>y</a></body></html>"
    links = [link.url for link in run(body, "text/html").links]
    assert links == ["https://example.org/first", "https://example.org/next"]


def test_a_comment_that_looks_like_a_crowded_tag_still_ends() -> None:
    # "a<b" in a comment, then hundreds of words: thinned as a tag, its "--" stays.
    words = " ".join(f"word{n}" for n in range(600))
    body = f"<html><body><!-- if a<b then {words} --><a href=/kept>k</a></body></html>"
    assert [link.url for link in run(body.encode(), "text/html").links] == [
        "https://example.org/kept"
    ]


def _crowd(name: str = "a{}") -> str:
    return " ".join(name.format(n) for n in range(MAX_TAG_ATTRIBUTES + 50))


# libxml2 reads a ">" in a quoted value, and a "<" in a name or an unquoted value, as
# part of the tag; the guard must find such a tag whole, or lxml gets all of it.
@pytest.mark.parametrize(
    "tag",
    [
        f'<a t=">" {_crowd()} href=/dropped>',
        f"<a t='a>b<c' {_crowd()} href=/dropped>",
        f"<a {_crowd('a<{}')} href=/dropped>",
        f"<a {_crowd('a{}=<b')} href=/dropped>",
    ],
)
def test_a_crowded_tag_is_thinned_whatever_its_attributes_hold(tag: str) -> None:
    body = f"<html><body><a href=/first>f</a>{tag}x</a><a href=/next>n</a><title>After</title>"
    result = run(body.encode(), "text/html")
    # The attribute past the limit is dropped; what comes after the tag is read.
    assert [link.url for link in result.links] == [
        "https://example.org/first",
        "https://example.org/next",
    ]
    assert result.title == "After"


def test_a_posts_crowded_tag_is_thinned_as_a_pages() -> None:
    """A post's HTML, from a followed timeline or fetched as ActivityStreams, goes to
    libxml2 as a page does: a tag of many attributes made it check each one's name
    against the others, seconds of a parse thread for one post."""
    content = f"<p><a href=/first>f</a><a {_crowd()} href=/dropped>x</a></p>"
    assert content_links(content) == ["/first"]
    note = {"type": "Note", "id": "https://example.org/@a/1", "content": content}
    found = extract_activity(
        json.dumps(note).encode(),
        url="https://example.org/@a/1",
        content_type="application/activity+json",
    )
    assert [link.url for link in found.links] == ["https://example.org/first"]


def test_a_page_of_more_links_than_are_looked_at_resolves_no_more_of_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past the distinct links looked at, the rest are not resolved, and one href written
    many times is resolved once: each is an urljoin, seconds for a page of 2 MiB."""
    resolved: list[str | None] = []
    resolve = _Resolver.__call__

    def counted(self: _Resolver, href: str | None) -> str | None:
        resolved.append(href)
        return resolve(self, href)

    monkeypatch.setattr(_Resolver, "__call__", counted)
    same = "<a href=?q>q</a>" * 20_000
    many = "".join(f"<a href=../{n}>{n}</a>" for n in range(MAX_LINKS_SEEN + 20_000))
    result = run(f"<html><body>{same}{many}</body></html>".encode(), "text/html")
    assert result.links_truncated
    assert resolved.count("?q") == 1
    assert len(resolved) <= MAX_LINKS_SEEN + 1


# What looks like a tag in a comment or an element's text is none: read as one, its
# quoted value would run over the crowded tag after it.
@pytest.mark.parametrize(
    "before",
    [
        '<!-- <a x="-->',
        '<script>if (a<b) x = "</script>',
        '<script><!--<script></script> <a x="</script>',
        "<title>a <a x='</title>",
        '<textarea><a x="</TEXTAREA>',
        '<? <a x="?>',
    ],
)
def test_a_comment_or_an_element_text_does_not_hide_a_crowded_tag(before: str) -> None:
    body = f'<html><body>{before}<a t=">" {_crowd()} href=/dropped>x</a><a href=/next>n</a>'
    links = [link.url for link in run(body.encode(), "text/html").links]
    assert links == ["https://example.org/next"]


_PIECES = st.sampled_from(
    [
        *('"', "'", "<", ">", "=", " ", "/", "a", "<a x=", "<a<b"),
        *("<!--", "-->", "<!", "</", "<?", "<!--<script>"),
        *("<script>", "</script>", "<title>", "</title>", "<style>"),
    ]
)


@settings(max_examples=200, deadline=None)
@given(before=st.lists(_PIECES, max_size=20))
def test_no_crowded_a_tag_keeps_its_attributes_past_the_limit(before: list[str]) -> None:
    # Whatever comes before it, the "a" tag holding the crowd (this one or one whose
    # quoted value runs over it) loses the attributes past the limit: no /dropped.
    body = "".join(before) + f'<a t=">" {_crowd()} href=/dropped>x</a>'
    links = [link.url for link in run(body.encode(), "text/html").links]
    assert "https://example.org/dropped" not in links
