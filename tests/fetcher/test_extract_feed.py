"""Feed extraction: RSS 2.0, RSS 1.0 (RDF), Atom and sitemaps, sniffing, and no entity
expansion."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from trove_fetcher.extract import Extraction, extract, looks_like_feed
from trove_schema.events import LinkKind

FEED_URL = "https://example.org/blog/feed.xml"
ATOM_NS = "http://www.w3.org/2005/Atom"

RSS2 = """<?xml version="1.0" encoding="UTF-8"?>
<rss version="2.0" xmlns:atom="http://www.w3.org/2005/Atom">
<channel>
  <title>  Notes from
    the Garden </title>
  <link>https://example.org/blog/</link>
  <description>Tomatoes and weather</description>
  <language>en-gb</language>
  <atom:link rel="self" href="https://example.org/blog/feed.xml" type="application/rss+xml"/>
  <item><title>First</title><link>https://example.org/blog/first.html</link></item>
  <item><title>Second</title><link> posts/second.html#comments </link></item>
  <item><title>Third</title><guid>https://example.org/blog/third.html</guid></item>
  <item><title>Opaque</title><guid isPermaLink="false">https://example.org/not-a-page</guid></item>
  <item><title>Relative guid</title><guid>1234</guid></item>
  <item><title>Bad</title><link>javascript:alert(1)</link></item>
</channel>
</rss>"""

RSS1 = """<?xml version="1.0"?>
<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"
         xmlns="http://purl.org/rss/1.0/" xmlns:dc="http://purl.org/dc/elements/1.1/">
  <channel rdf:about="https://example.org/rdf">
    <title>An RDF Site</title>
    <link>https://example.org/</link>
    <dc:language>de</dc:language>
  </channel>
  <item rdf:about="https://example.org/one"><title>One</title><link>https://example.org/one</link></item>
  <item rdf:about="https://example.org/two"><title>Two</title></item>
</rdf:RDF>"""

ATOM = """<?xml version="1.0" encoding="utf-8"?>
<feed xmlns="http://www.w3.org/2005/Atom" xml:lang="en">
  <title type="html">Atom &amp;amp; Eve</title>
  <link rel="self" href="https://example.org/atom.xml"/>
  <link rel="alternate" href="https://example.org/"/>
  <entry>
    <title>Post one</title>
    <link href="/posts/one"/>
    <link rel="enclosure" href="/media/one.mp3"/>
    <link rel="replies" href="/posts/one/comments"/>
  </entry>
  <entry xml:base="https://mirror.example.net/archive/">
    <title>Post two</title>
    <link rel="alternate" type="text/html" href="two.html"/>
  </entry>
</feed>"""


def run(
    body: str | bytes,
    content_type: str | None = "application/rss+xml",
    x_robots_tag: str | None = None,
) -> Extraction:
    raw = body.encode() if isinstance(body, str) else body
    return extract(
        raw,
        url=FEED_URL,
        content_type=content_type,
        x_robots_tag=x_robots_tag,
        detect_language=False,
    )


def links(result: Extraction) -> list[tuple[str, LinkKind]]:
    return [(link.url, link.kind) for link in result.links]


def test_rss2_title_and_item_links() -> None:
    result = run(RSS2)
    assert result.is_feed is True
    assert result.title == "Notes from the Garden"
    assert links(result) == [
        ("https://example.org/blog/", LinkKind.A),
        ("https://example.org/blog/first.html", LinkKind.FEED_ITEM),
        ("https://example.org/blog/posts/second.html", LinkKind.FEED_ITEM),
        ("https://example.org/blog/third.html", LinkKind.FEED_ITEM),
    ]


def test_rss1_rdf_items_outside_the_channel() -> None:
    result = run(RSS1, content_type="application/rdf+xml")
    assert result.is_feed is True
    assert result.title == "An RDF Site"
    assert links(result) == [
        ("https://example.org/", LinkKind.A),
        ("https://example.org/one", LinkKind.FEED_ITEM),
        ("https://example.org/two", LinkKind.FEED_ITEM),
    ]


def test_atom_entry_links_with_xml_base() -> None:
    result = run(ATOM, content_type="application/atom+xml")
    assert result.is_feed is True
    assert result.title == "Atom & Eve"
    assert links(result) == [
        ("https://example.org/", LinkKind.A),
        ("https://example.org/posts/one", LinkKind.FEED_ITEM),
        ("https://mirror.example.net/archive/two.html", LinkKind.FEED_ITEM),
    ]


@pytest.mark.parametrize("content_type", ["application/xml", "text/xml", "text/html", None])
def test_feed_is_sniffed_whatever_the_content_type(content_type: str | None) -> None:
    assert run(RSS2, content_type=content_type).is_feed is True
    assert run(ATOM, content_type=content_type).is_feed is True


@pytest.mark.parametrize(
    ("body", "is_feed"),
    [
        (b'<?xml version="1.0"?><rss version="2.0">', True),
        (b"\xef\xbb\xbf<?xml version='1.0'?>\n<!-- c --><feed xmlns='x'>", True),
        (b'<?xml version="1.0"?><!DOCTYPE rss [<!ENTITY a "b">]><rss>', True),
        (b'<?xml version="1.0"?><?xml-stylesheet href="s.xsl"?><rdf:RDF x="y">', True),
        (b"<rss version='2.0'><channel>", True),
        (b'<?xml version="1.0"?><html><p>&lt;rss</p>', False),
        # Sitemaps: lists of links, read as feeds are.
        (b'<?xml version="1.0"?><urlset xmlns="...">', True),
        (b"<sitemapindex xmlns='...'>", True),
        (b"<sm:urlset xmlns:sm='...'>", True),
        (b"<urlsets>", False),
        (b"<html><body><rss>", False),
        (b"<feedback>", False),
        (b"", False),
    ],
)
def test_feed_sniffing_looks_at_the_root_element(body: bytes, is_feed: bool) -> None:
    assert looks_like_feed(body) is is_feed


SITEMAP = """<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"
        xmlns:xhtml="http://www.w3.org/1999/xhtml">
  <url><loc>https://example.org/blog/first.html</loc><lastmod>2026-01-02</lastmod></url>
  <url>
    <loc>
      https://example.org/blog/second.html?utm_source=sitemap&amp;id=2
    </loc>
    <priority>0.8</priority>
    <xhtml:link rel="alternate" hreflang="de" href="https://example.org/de/second.html"/>
  </url>
  <url><lastmod>2026-01-03</lastmod></url>
  <url><loc>javascript:alert(1)</loc></url>
  <url><loc>/blog/relative.html</loc></url>
</urlset>"""

SITEMAP_INDEX = """<?xml version="1.0" encoding="UTF-8"?>
<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
  <sitemap><loc>https://example.org/sitemap-posts.xml</loc></sitemap>
  <sitemap><loc>https://example.org/sitemap-pages.xml</loc><lastmod>2026-01-01</lastmod></sitemap>
</sitemapindex>"""


@pytest.mark.parametrize("content_type", ["application/xml", "text/xml", None])
def test_a_sitemaps_urls_are_its_links_as_a_feeds_items(content_type: str | None) -> None:
    # Nothing else of it is a page's signal: no title, no words, its hints unread.
    result = extract(
        SITEMAP.encode(), url="https://example.org/sitemap.xml", content_type=content_type
    )

    assert result.is_feed is True
    assert links(result) == [
        ("https://example.org/blog/first.html", LinkKind.FEED_ITEM),
        ("https://example.org/blog/second.html?utm_source=sitemap&id=2", LinkKind.FEED_ITEM),
        ("https://example.org/blog/relative.html", LinkKind.FEED_ITEM),
    ]
    assert (result.title, result.keywords) == (None, ())


def test_a_sitemap_indexs_sitemaps_are_followed_as_feeds() -> None:
    result = extract(
        SITEMAP_INDEX.encode(), url="https://example.org/sitemap.xml", content_type="text/xml"
    )

    assert links(result) == [
        ("https://example.org/sitemap-posts.xml", LinkKind.FEED),
        ("https://example.org/sitemap-pages.xml", LinkKind.FEED),
    ]


def test_feed_content_type_with_an_html_body_is_read_as_html() -> None:
    result = run("<html><title>Oops</title><a href='/home'>home</a></html>")
    assert result.is_feed is False
    assert result.title == "Oops"
    assert links(result) == [("https://example.org/home", LinkKind.A)]


def test_xml_that_is_not_a_feed_is_not_a_feed() -> None:
    page = '<?xml version="1.0"?><html><head><title>XHTML</title></head></html>'
    result = run(page, content_type="application/xml")
    assert result.is_feed is False
    assert result.title == "XHTML"


def test_feed_language_hint_and_keywords() -> None:
    result = extract(RSS2.encode(), url=FEED_URL, content_type="application/rss+xml")
    assert result.language == "en"  # the text is too short to detect: <language> decides
    assert {"garden", "notes", "tomatoes", "weather"} <= set(result.keywords)


def test_x_robots_tag_nofollow_applies_to_feed_links() -> None:
    result = run(RSS2, x_robots_tag="TroveBot: nofollow")
    assert result.nofollow is True
    assert all(link.nofollow for link in result.links)


def test_malformed_feed_keeps_what_it_can() -> None:
    broken = "<rss><channel><title>Broken & unescaped</title><item><link>/a</link></item>"
    result = run(broken)
    assert result.is_feed is True
    assert ("https://example.org/a", LinkKind.FEED_ITEM) in links(result)


def test_feed_in_a_legacy_charset() -> None:
    body = b'<?xml version="1.0" encoding="ISO-8859-1"?><rss><channel><title>Caf\xe9</title>'
    body += b"</channel></rss>"
    assert run(body).title == "Café"


@pytest.mark.parametrize(
    ("title", "read"),
    [
        ("Caf&eacute; au lait", "Café au lait"),
        ("Tom&nbsp;Jerry", "Tom Jerry"),  # a title's whitespace collapsed
        ("R&amp;D costs", "R&D costs"),
        ("Tom &amp;amp; Jerry", "Tom & Jerry"),  # escaped twice, as feeds do
        ("&lt;b&gt;Java&lt;/b&gt;Script &amp;lt;3", "JavaScript <3"),
        ("&Eacute;t&eacute; &hellip; &unknown; &#233;", "Été … é"),
    ],
)
def test_an_rss_titles_html_references_are_read(title: str, read: str) -> None:
    assert run(f"<rss><channel><title>{title}</title></channel></rss>").title == read


@pytest.mark.parametrize(
    ("kind", "read"),
    [
        ("", "Use <b> for bold"),
        (' type="text"', "Use <b> for bold"),
        (' type="html"', "Use for bold"),
    ],
)
def test_an_atom_text_is_text_unless_it_says_html(kind: str, read: str) -> None:
    body = f'<feed xmlns="{ATOM_NS}"><title{kind}>Use &lt;b&gt; for bold</title></feed>'
    assert run(body, "application/atom+xml").title == read


def test_a_cdata_sections_text_is_left_as_it_is() -> None:
    """An Atom text in CDATA says "&eacute;" as it is; RSS's CDATA is HTML, read so."""
    atom = f'<feed xmlns="{ATOM_NS}"><title><![CDATA[Caf&eacute; &amp; co]]></title></feed>'
    assert run(atom, "application/atom+xml").title == "Caf&eacute; &amp; co"
    rss = "<rss><channel><title><![CDATA[Caf&eacute; &amp; co]]></title></channel></rss>"
    assert run(rss).title == "Café & co"


def test_external_entity_is_not_expanded(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-CONTENT")
    body = f"""<?xml version="1.0"?>
<!DOCTYPE rss [<!ENTITY xxe SYSTEM "{secret.as_uri()}"><!ENTITY eacute SYSTEM "{secret.as_uri()}">]>
<rss version="2.0"><channel><title>Leak &xxe; here, caf&eacute;</title>
<item><title>&xxe;</title><link>https://example.org/&xxe;</link></item>
</channel></rss>"""
    result = run(body)
    # A feed's own entity cannot stand for an HTML one either.
    assert result.title == "Leak here, café"
    assert "secret" not in " ".join(result.keywords)
    assert all("SECRET" not in link.url for link in result.links)


def test_parameter_entity_and_external_dtd_are_not_fetched(tmp_path: Path) -> None:
    dtd = tmp_path / "evil.dtd"
    dtd.write_text('<!ENTITY leak "DTD-WAS-LOADED">')
    body = f"""<?xml version="1.0"?>
<!DOCTYPE rss SYSTEM "{dtd.as_uri()}" [<!ENTITY % ext SYSTEM "{dtd.as_uri()}"> %ext;]>
<rss><channel><title>T &leak;</title></channel></rss>"""
    result = run(body)
    assert result.title == "T"


def test_billion_laughs_is_not_expanded() -> None:
    entities = '<!ENTITY lol "lollollollollollollollollollol">'
    for level in range(1, 10):
        ref = f"&lol{level - 1 or ''};" * 10
        entities += f'<!ENTITY lol{level} "{ref}">'
    body = f"""<?xml version="1.0"?><!DOCTYPE rss [{entities}]>
<rss><channel><title>Laugh &lol9;</title></channel></rss>"""
    result = run(body)
    assert result.title == "Laugh"
    assert result.keywords == ("laugh",)


def test_a_gzipped_sitemap_left_packed_reads_as_nothing() -> None:
    """The fetch unpacks a gzipped sitemap; bytes that were not (a double gzip) are binary
    and give no link, rather than markup read out of compressed noise."""
    sitemap = (
        b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
        b"<url><loc>https://blog.example/post</loc></url></urlset>"
    )
    url = "https://blog.example/sitemap.xml.gz"
    unpacked = extract(sitemap, url=url, content_type="application/x-gzip")
    packed = extract(gzip.compress(sitemap), url=url, content_type="application/x-gzip")
    assert [link.url for link in unpacked.links] == ["https://blog.example/post"]
    assert packed.links == ()
    assert packed.title is None


@pytest.mark.parametrize(
    ("url", "read"),
    [
        ("https://blog.example/catalog.xml.gz", True),
        # Any other gzip file is a download: the fetch never unpacks it.
        ("https://blog.example/catalog.gz", False),
    ],
)
def test_an_unpacked_gzip_file_of_xml_is_read_as_xml(url: str, read: bool) -> None:
    """Not only sitemaps: what a ``.xml.gz`` held is read by the XML's own rules, not as
    the gzip type it was served as."""
    document = (
        b'<?xml version="1.0"?><catalog>'
        b"<entry>Gardening notes about tomatoes and roses</entry></catalog>"
    )
    result = extract(document, url=url, content_type="application/gzip")
    assert (result.keywords == ("gardening", "notes", "roses", "tomatoes")) is read
    assert (result.text_chars is not None) is read
