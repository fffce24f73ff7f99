"""A response's media type from its Content-Type header."""

from __future__ import annotations

import pytest

from trove_schema.media import charset_label, is_gzipped_xml, media_type


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("text/html; charset=utf-8", "text/html"),
        ("Text/HTML; charset=UTF-8", "text/html"),
        (" Application/RSS+XML ", "application/rss+xml"),
        ("", None),
        (None, None),
        (";charset=utf-8", None),
    ],
)
def test_media_type_is_the_lower_cased_type_without_parameters(
    header: str | None, expected: str | None
) -> None:
    assert media_type(header) == expected


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        # The header sent twice, joined by the client: the last type counts.
        ("text/html, text/html; charset=utf-8", "text/html"),
        ("text/plain, text/html", "text/html"),
        ("text/html; charset=utf-8, foo", "text/html"),
        # A comma inside a quoted parameter is no second header.
        ('text/html; charset="utf-8,x"', "text/html"),
        ('text/html; charset="a,b/c"', "text/html"),
    ],
)
def test_a_content_type_sent_twice_is_read_as_browsers_read_it(header: str, expected: str) -> None:
    assert media_type(header) == expected


@pytest.mark.parametrize(
    ("header", "charset"),
    [
        ("text/html; charset=utf-8", "utf-8"),
        ('text/html; charset="UTF-8"', "UTF-8"),
        ("text/html", None),
        # A server's default, then the application's own: the last counts, its charset.
        ("text/html; charset=iso-8859-1, text/html; charset=utf-8", "utf-8"),
        # The same type again without one keeps the earlier value's.
        ("text/html; charset=utf-8, text/html", "utf-8"),
        # Another type: its charset, or none.
        ("text/plain; charset=koi8-r, text/html", None),
    ],
)
def test_the_charset_is_the_one_of_the_value_the_type_is_taken_from(
    header: str, charset: str | None
) -> None:
    assert charset_label(header) == charset


@pytest.mark.parametrize(
    ("kind", "url", "expected"),
    [
        ("application/gzip", "https://blog.example/sitemap.xml.gz", True),
        ("application/x-gzip", "https://blog.example/SITEMAP.XML.GZ", True),
        ("application/octet-stream", "https://blog.example/s/posts.xml.gz?v=2", True),
        # Named otherwise, a gzip file is a download: never read.
        ("application/gzip", "https://blog.example/release-1.0.tar.gz", False),
        ("application/gzip", "https://blog.example/sitemap.gz", False),
        ("application/gzip", "https://blog.example/feed?name=sitemap.xml.gz", False),
        ("binary/octet-stream", "https://bucket.example/sitemap.xml.gz", True),
        # Typed by the name inside: packed or not, the body's first bytes tell.
        ("application/xml", "https://blog.example/sitemap.xml.gz", True),
        ("text/xml", "https://blog.example/sitemap.xml.gz", True),
        ("text/html", "https://blog.example/sitemap.xml.gz", False),
        ("application/xml", "https://blog.example/sitemap.xml", False),
        (None, "https://blog.example/sitemap.xml.gz", False),
        ("application/gzip", "http://[::1/sitemap.xml.gz", False),
    ],
)
def test_a_gzip_file_is_xml_to_read_only_when_its_path_says_so(
    kind: str | None, url: str, expected: bool
) -> None:
    assert is_gzipped_xml(kind, url) is expected
