"""HTML extraction: title, links and their kinds, robots directives, canonical, the cap."""

from __future__ import annotations

import dataclasses
import random
import secrets
from collections.abc import Callable
from urllib.parse import urljoin, urlsplit

import pytest

from trove_fetcher.completion import with_canonical_links
from trove_fetcher.extract import (
    Extraction,
    extract,
    is_parseable,
    resolve_url,
    x_robots_directives,
)
from trove_schema.events import (
    MARKUP_HASH_PREFIX,
    MAX_LINKS_PER_PAGE,
    MAX_URL_LENGTH,
    SIGNALS_HASH_PREFIX,
    LinkKind,
)

PAGE = "https://example.org/blog/post.html"


def run(
    body: str | bytes,
    *,
    url: str = PAGE,
    content_type: str | None = "text/html; charset=utf-8",
    x_robots_tag: str | None = None,
    robots_token: str = "TroveBot",  # noqa: S107 - a robots.txt token
) -> Extraction:
    raw = body.encode() if isinstance(body, str) else body
    return extract(
        raw,
        url=url,
        content_type=content_type,
        x_robots_tag=x_robots_tag,
        robots_token=robots_token,
        detect_language=False,
    )


def kinds(result: Extraction) -> dict[str, LinkKind]:
    return {link.url: link.kind for link in result.links}


def urls(result: Extraction) -> list[str]:
    return [link.url for link in result.links]


# Title ----------------------------------------------------------------------------------


def test_title_whitespace_is_collapsed() -> None:
    result = run("<html><head><title>\n  Hello,\t\tsmall \n web  </title></head></html>")
    assert result.title == "Hello, small web"


def test_title_is_cut_to_1000_characters() -> None:
    result = run(f"<title>{'a' * 5000}</title>")
    assert result.title == "a" * 1000


def test_missing_or_blank_title_is_none() -> None:
    assert run("<p>no title</p>").title is None
    assert run("<title>  \n </title>").title is None


def test_head_title_wins_over_an_svg_title() -> None:
    result = run("<head><title>Page</title></head><body><svg><title>Icon</title></svg>")
    assert result.title == "Page"


@pytest.mark.parametrize(
    ("page", "title"),
    [
        ("<body><svg><title>Menu icon</title></svg><p>text</p>", None),
        ("<body><svg><g><title>Icon</title></g></svg><title>Real</title>", "Real"),
        ("<body><template><title>{{ t }}</title></template><title>Real</title>", "Real"),
    ],
)
def test_an_svg_icons_title_is_never_the_pages(page: str, title: str | None) -> None:
    assert run(page).title == title


def test_title_entities_are_decoded() -> None:
    assert run("<title>Fish &amp; Chips &mdash; caf&eacute;</title>").title == "Fish & Chips — café"


# Links ----------------------------------------------------------------------------------

KINDS_PAGE = """<html><head>
<link rel="stylesheet" href="/style.css">
<link rel="alternate stylesheet" href="/dark.css">
<link rel="alternate" type="application/rss+xml" href="/feed.rss">
<link rel="alternate" type="application/atom+xml; charset=utf-8" href="/feed.atom">
<link rel="alternate" hreflang="fr" href="/fr/post.html">
<link rel="alternate" type="application/json+oembed" href="/oembed?u=1">
<link rel="canonical" href="https://example.org/post">
<link rel="icon" href="/favicon.ico">
<script src="/app.js"></script>
</head><body>
<a href="other.html">a</a>
<map><area href="/area.html"></map>
<img src="/img/a.png" srcset="/img/a-1x.png 1x, /img/a-2x.png 2x">
<img srcset="/img/only-srcset.png, /img/b.png 2x">
<iframe src="/embedded.html"></iframe>
<meta http-equiv="refresh" content="30; URL='/moved.html'">
</body></html>"""


def test_link_kinds() -> None:
    assert kinds(run(KINDS_PAGE)) == {
        "https://example.org/style.css": LinkKind.STYLESHEET,
        "https://example.org/dark.css": LinkKind.STYLESHEET,
        "https://example.org/feed.rss": LinkKind.FEED,
        "https://example.org/feed.atom": LinkKind.FEED,
        "https://example.org/fr/post.html": LinkKind.ALTERNATE,
        "https://example.org/post": LinkKind.CANONICAL,
        "https://example.org/app.js": LinkKind.SCRIPT,
        "https://example.org/blog/other.html": LinkKind.A,
        "https://example.org/area.html": LinkKind.A,
        "https://example.org/img/a.png": LinkKind.IMG,
        "https://example.org/img/a-1x.png": LinkKind.IMG,
        "https://example.org/img/only-srcset.png": LinkKind.IMG,
        "https://example.org/embedded.html": LinkKind.OTHER,
        "https://example.org/moved.html": LinkKind.REDIRECT,
    }


@pytest.mark.parametrize(
    ("content", "target"),
    [
        ("0; url=/next", "https://example.org/next"),
        ("0;URL=next.html", "https://example.org/blog/next.html"),
        ("3, 'https://other.example/'", "https://other.example/"),
        ("0; /bare", "https://example.org/bare"),
        ("5", None),
        ("", None),
        ("0; url=javascript:alert(1)", None),
    ],
)
def test_meta_refresh_is_a_redirect_link(content: str, target: str | None) -> None:
    result = run(f'<meta http-equiv="Refresh" content="{content}">')
    assert urls(result) == ([target] if target else [])
    assert all(link.kind is LinkKind.REDIRECT for link in result.links)


def test_links_keep_document_order() -> None:
    result = run('<a href="/c">c</a><a href="/a">a</a><a href="/b">b</a>')
    assert urls(result) == [
        "https://example.org/c",
        "https://example.org/a",
        "https://example.org/b",
    ]


def test_absolute_base_href_resolves_links() -> None:
    result = run('<head><base href="https://cdn.example.net/x/"></head><a href="y.html">y</a>')
    assert urls(result) == ["https://cdn.example.net/x/y.html"]


def test_relative_base_href_is_resolved_against_the_page() -> None:
    result = run('<head><base href="../docs/"></head><a href="y.html">y</a><a href="/z">z</a>')
    assert urls(result) == ["https://example.org/docs/y.html", "https://example.org/z"]


def test_only_the_first_base_href_counts() -> None:
    result = run('<base href="/one/"><base href="/two/"><a href="y">y</a>')
    assert urls(result) == ["https://example.org/one/y"]


def test_base_href_that_is_not_http_is_ignored() -> None:
    result = run('<base href="javascript:alert(1)"><a href="y.html">y</a>')
    assert urls(result) == ["https://example.org/blog/y.html"]


@pytest.mark.parametrize(
    "href",
    [
        "javascript:alert(1)",
        " JavaScript:void(0)",
        "mailto:someone@example.org",
        "data:text/html,<p>hi",
        "tel:+331234",
        "ftp://example.org/file",
        "http://",
        "http://[::1/broken-ipv6",
        "http://example.org:99999999/",
        "http://example.org:port/",
        "",
        "   ",
    ],
)
def test_non_http_and_broken_links_are_dropped(href: str) -> None:
    assert run(f'<a href="{href}">x</a>').links == ()


def test_fragments_are_dropped() -> None:
    result = run('<a href="other.html#section-2">x</a><a href="https://example.org/p#">y</a>')
    assert urls(result) == ["https://example.org/blog/other.html", "https://example.org/p"]


def test_a_fragment_only_link_is_the_page_itself() -> None:
    assert urls(run('<a href="#top">top</a>')) == [PAGE]


def test_whitespace_and_newlines_in_hrefs_are_removed() -> None:
    result = run('<a href="  /a\n/b\t.html  ">x</a>')
    assert urls(result) == ["https://example.org/a/b.html"]


def test_control_characters_around_an_href_are_removed_as_a_browser_does() -> None:
    """urljoin reads the scheme past a leading control, then hands the URL back with it:
    a link that was no http(s) URL left the page."""
    result = run('<a href="\x1fhttp://other.example/x\x1b">x</a><a href="\x01/a">y</a>')
    assert urls(result) == ["http://other.example/x", "https://example.org/a"]


def test_a_template_is_inert_its_links_not_followed() -> None:
    """A client-side renderer's template: its "{{ user.id }}" URLs are no pages."""
    result = run(
        '<template><a href="/user/{{ user.id }}/profile"><img src="${avatar}"></a></template>'
        '<a href="/about">about</a>'
    )
    assert urls(result) == ["https://example.org/about"]


@pytest.mark.parametrize(
    ("href", "url"),
    [
        ("\\images\\foo.html", "https://example.org/images/foo.html"),
        ("sub\\a.html?q=a\\b#x\\y", "https://example.org/blog/sub/a.html?q=a\\b"),
        ("\\\\other.example\\x", "https://other.example/x"),
        ("https:\\\\other.example\\y", "https://other.example/y"),
    ],
)
def test_a_backslash_in_a_links_path_is_a_slash_as_browsers_read_it(href: str, url: str) -> None:
    assert urls(run(f'<a href="{href}">x</a>')) == [url]


def test_duplicate_links_are_collapsed() -> None:
    result = run(
        '<a href="/a">1</a><a href="/a#x">2</a><a href="https://example.org/a">3</a>'
        '<a href="../a">4</a>'
    )
    assert urls(result) == ["https://example.org/a"]


def test_the_same_url_with_two_kinds_is_two_links() -> None:
    result = run('<link rel="canonical" href="/p"><a href="/p">self</a>')
    assert [(link.url, link.kind) for link in result.links] == [
        ("https://example.org/p", LinkKind.CANONICAL),
        ("https://example.org/p", LinkKind.A),
    ]


def test_links_longer_than_the_schema_allows_are_dropped() -> None:
    long_href = "/" + "x" * MAX_URL_LENGTH
    assert run(f'<a href="{long_href}">x</a><a href="/ok">ok</a>').links[0].url.endswith("/ok")
    assert len(run(f'<a href="{long_href}">x</a>').links) == 0


def test_link_cap_truncates_and_says_so() -> None:
    anchors = "".join(f'<a href="/p/{i}">{i}</a>' for i in range(MAX_LINKS_PER_PAGE + 500))
    result = run(anchors)
    assert len(result.links) == MAX_LINKS_PER_PAGE
    assert result.links_truncated is True
    assert result.links[0].url == "https://example.org/p/0"
    assert result.links[-1].url == f"https://example.org/p/{MAX_LINKS_PER_PAGE - 1}"


def test_exactly_the_cap_is_not_truncated() -> None:
    anchors = "".join(f'<a href="/p/{i}">{i}</a>' for i in range(MAX_LINKS_PER_PAGE))
    anchors += "".join(f'<a href="/p/{i}">again</a>' for i in range(100))
    result = run(anchors)
    assert len(result.links) == MAX_LINKS_PER_PAGE
    assert result.links_truncated is False


def test_link_cap_keeps_page_links_before_images() -> None:
    images = "".join(f'<img src="/i/{i}.png">' for i in range(MAX_LINKS_PER_PAGE))
    result = run(f'{images}<a href="/next">next</a><link rel="canonical" href="/c">')
    assert result.links_truncated is True
    kept = kinds(result)
    assert kept["https://example.org/next"] is LinkKind.A
    assert kept["https://example.org/c"] is LinkKind.CANONICAL
    assert sum(kind is LinkKind.IMG for kind in kept.values()) == MAX_LINKS_PER_PAGE - 2


# Nofollow and noindex ---------------------------------------------------------------------


@pytest.mark.parametrize("rel", ["nofollow", "NoFollow", "ugc", "sponsored", "external nofollow"])
def test_rel_nofollow_ugc_and_sponsored_mark_the_link_nofollow(rel: str) -> None:
    result = run(f'<a rel="{rel}" href="/paid">x</a><a href="/free">y</a>')
    assert [(link.url, link.nofollow) for link in result.links] == [
        ("https://example.org/paid", True),
        ("https://example.org/free", False),
    ]
    assert result.nofollow is False


def test_a_link_followed_anywhere_on_the_page_is_followed() -> None:
    result = run('<a rel="nofollow" href="/x">1</a><a href="/x">2</a>')
    assert [(link.url, link.nofollow) for link in result.links] == [
        ("https://example.org/x", False)
    ]


def test_a_link_followed_in_any_spelling_is_followed_once_canonical() -> None:
    """Spellings that are one URL once canonical: nofollow only if every copy was."""
    result = run(
        '<a rel="nofollow" href="/x?utm_source=feed">1</a><a href="/x">2</a>'
        '<a rel="ugc" href="HTTPS://Example.org/y">3</a><a href="/y">4</a>'
        '<a rel="nofollow" href="/z?utm_medium=a">5</a><a rel="sponsored" href="/z">6</a>'
    )
    assert [(link.url, link.nofollow) for link in with_canonical_links(result).links] == [
        ("https://example.org/x", False),
        ("https://example.org/y", False),
        ("https://example.org/z", True),
    ]


@pytest.mark.parametrize(
    "meta",
    [
        '<meta name="robots" content="nofollow">',
        '<meta name="ROBOTS" content="index, NOFOLLOW">',
        '<meta name="robots" content="none">',
        '<meta name="trovebot" content="nofollow">',
    ],
)
def test_page_level_meta_nofollow_makes_every_link_nofollow(meta: str) -> None:
    result = run(f"<head>{meta}</head><a href='/a'>a</a><img src='/i.png'>")
    assert result.nofollow is True
    assert [link.nofollow for link in result.links] == [True, True]


def test_meta_robots_later_in_the_page_still_applies_to_earlier_links() -> None:
    result = run("<a href='/a'>a</a><meta name='robots' content='nofollow'>")
    assert [link.nofollow for link in result.links] == [True]


def test_meta_for_another_crawler_is_ignored() -> None:
    result = run('<meta name="googlebot" content="noindex, nofollow"><a href="/a">a</a>')
    assert (result.noindex, result.nofollow, result.links[0].nofollow) == (False, False, False)


def test_robots_token_names_our_meta() -> None:
    page = '<meta name="OtherBot" content="noindex"><p>text</p>'
    assert run(page, robots_token="OtherBot").noindex is True
    assert run(page).noindex is False


def test_meta_noindex_keeps_the_title_but_no_keywords() -> None:
    result = run(
        '<title>Private diary</title><meta name="robots" content="noindex">'
        "<p>gardening gardening gardening</p>"
    )
    assert result.noindex is True
    assert result.title == "Private diary"
    assert result.keywords == ()
    assert run("<title>Public</title><p>gardening</p>").keywords == ("gardening", "public")


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("noindex", (True, False)),
        ("nofollow", (False, True)),
        ("noindex, nofollow", (True, True)),
        ("NONE", (True, True)),
        ("all", (False, False)),
        ("TroveBot: noindex", (True, False)),
        ("trovebot:nofollow", (False, True)),
        ("TroveBot: noindex, nofollow", (True, True)),
        ("googlebot: noindex", (False, False)),
        ("googlebot: noindex, nofollow", (False, False)),
        ("googlebot: noindex, TroveBot: nofollow", (False, True)),
        ("TroveBot: nofollow, googlebot: noindex", (False, True)),
        ("unavailable_after: 25 Jun 2010 15:00:00 PST", (False, False)),
        ("unavailable_after: Friday, 25-Jun-10 15:00:00 PST, noindex", (True, False)),
        ("max-snippet: 20, nofollow", (False, True)),
        ("", (False, False)),
        (None, (False, False)),
    ],
)
def test_x_robots_tag_header(header: str | None, expected: tuple[bool, bool]) -> None:
    assert x_robots_directives(header, "TroveBot") == expected


def test_x_robots_tag_nofollow_makes_every_link_nofollow() -> None:
    result = run("<a href='/a'>a</a>", x_robots_tag="TroveBot: nofollow")
    assert result.nofollow is True
    assert result.links[0].nofollow is True


def test_x_robots_tag_for_another_crawler_changes_nothing() -> None:
    result = run("<a href='/a'>a</a>", x_robots_tag="otherbot: noindex, nofollow")
    assert (result.noindex, result.nofollow, result.links[0].nofollow) == (False, False, False)


# Canonical ------------------------------------------------------------------------------


def test_canonical_is_resolved_and_reported() -> None:
    result = run('<head><link rel="canonical" href="../post?id=3#c"></head>')
    assert result.canonical_url == "https://example.org/post?id=3"
    assert kinds(result) == {"https://example.org/post?id=3": LinkKind.CANONICAL}


def test_first_canonical_wins() -> None:
    result = run('<link rel="canonical" href="/one"><link rel="canonical" href="/two">')
    assert result.canonical_url == "https://example.org/one"


def test_canonical_that_is_not_http_is_ignored() -> None:
    assert run('<link rel="canonical" href="javascript:x">').canonical_url is None
    assert run("<p>no canonical</p>").canonical_url is None


# Content type, hash, decoding ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "parseable"),
    [
        ("text/html", True),
        ("text/html; charset=utf-8", True),
        ("TEXT/HTML", True),
        ("application/xhtml+xml", True),
        ("application/rss+xml", True),
        ("application/atom+xml", True),
        ("application/xml", True),
        ("text/xml; charset=iso-8859-1", True),
        ("text/plain", False),
        ("application/json", False),
        ("image/png", False),
        ("application/pdf", False),
        ("application/feed+json", False),
        ("", False),
        (None, False),
    ],
)
def test_is_parseable(content_type: str | None, parseable: bool) -> None:
    assert is_parseable(content_type) is parseable


CAFE = "<title>café</title><p>" + "Un café au coin de la rue, le matin. " * 8 + "</p>"


def test_words_run_on_through_inline_markup_and_end_at_blocks() -> None:
    result = run(
        "<p><span class=dropcap>G</span>ardening with <b>Java</b>Script in the"
        " super<wbr>market</p><p>tomatoes</p><div>beans</div><ul><li>peas<li>corn</ul>"
        "<table><tr><td>leeks<td>onions</table>kale<br>chard<center>garlic</center>chives"
    )
    words = {"gardening", "javascript", "supermarket", "tomatoes", "beans", "peas", "corn"}
    words |= {"leeks", "onions", "kale", "chard", "garlic", "chives"}
    assert words <= set(result.keywords), result.keywords
    assert result.text_chars == len("".join(words)) + len("withinthe")


def test_a_selects_options_are_not_the_pages_text_and_what_it_hides_is() -> None:
    """A country picker's names are no page's words; a wrapper a script reveals, an
    inactive tab, a folded answer are (without them the page is an empty shell)."""
    wrapped = (
        "<div id='preloader'></div><div id='wrapper' style='display:none'>"
        + "<p>tomatoes growing, garden beds</p>" * 10
        + "<div hidden>folded answer</div></div><select><option>Afghanistan</option></select>"
        "<script src='/jquery.js'></script>"
    )
    result = run(wrapped)
    assert set(result.keywords) == {"tomatoes", "growing", "garden", "beds", "folded", "answer"}
    assert result.shell is False


def test_a_text_with_a_control_character_is_read_as_any_other() -> None:
    """libxml2 keeps a control character in a text, which lxml would refuse to set."""
    result = run("<div>shed\x1f</div><p>tools</p><b>gar</b>den")
    assert {"shed", "tools", "garden"} <= set(result.keywords), result.keywords


def test_content_hash_is_what_the_page_says_not_its_bytes() -> None:
    body = CAFE.encode("cp1252")
    result = run(body, content_type="text/html; charset=windows-1252")
    assert result.title == "café"
    assert result.content_hash.startswith(SIGNALS_HASH_PREFIX)
    # The same page in another encoding is the same page.
    utf8 = run(body.decode("cp1252").encode(), content_type="text/html; charset=utf-8")
    assert utf8.content_hash == result.content_hash


def test_a_page_that_says_too_little_is_hashed_by_its_markup() -> None:
    # A gallery's or an app's pages: a title and a picture, or the data in a script,
    # told apart by their markup.
    def thin(video: str, data: str = "{}") -> str:
        return run(
            f"<title>Clip</title><video src='/v/{video}.mp4'></video><p>Watch.</p>"
            f"<script id='__DATA__' type='application/json'>{data}</script>".encode()
        ).content_hash

    assert thin("1").startswith(MARKUP_HASH_PREFIX)
    assert len({thin("1"), thin("2"), thin("1", '{"id": 2}')}) == 3


SIGN_IN = (
    "<html><head><title>Sign in</title>"
    "<meta name='csrf-token' content='{token}'>"
    "<meta name='csrf-param' content='authenticity_token'>"
    "<script nonce='{nonce}'>window.start()</script></head><body><!-- {nonce} -->"
    "<form method='post'><input type='hidden' name='authenticity_token' value='{token}'>"
    "<input type='hidden' name='__RequestVerificationToken' value='{token}'>"
    "<input name='user'><input type='password' name='password'></form></body></html>"
)


@pytest.mark.parametrize(
    "field",
    [
        "<input type='hidden' name='login[_token]' value='{token}'>",  # Symfony
        "<input type='hidden' name='_Token[fields]' value='{token}'>",  # CakePHP
        "<input type='hidden' name='wpLoginToken' value='{token}'>",  # MediaWiki
        "<input type='hidden' name='_token' value='{token}'>",  # Laravel
        "<input type='hidden' name='csrfmiddlewaretoken' value='{token}'>",  # Django
        "<input type='hidden' name='form_build_id' value='{token}'>",  # Drupal
        "<meta name='_token' content='{token}'>",
        "<meta property='csrf-token' content='{token}'>",
    ],
)
def test_each_frameworks_per_answer_token_is_left_out_of_a_short_pages_hash(field: str) -> None:
    def answer(visible: str = "user") -> str:
        body = f"<title>Log in</title><form>{field}<input name='{visible}'></form>"
        return run(body.format(token=secrets.token_hex(16)).encode()).content_hash

    assert answer() == answer()
    assert answer("email") != answer()


def test_a_short_page_is_not_changed_by_what_its_server_makes_anew_for_each_answer() -> None:
    """A sign-in page: its CSRF token and its scripts' nonce are new at each answer.
    Hashed by its bytes, each visit was a change, and its re-crawls came down to the
    hourly minimum for good."""

    def visit() -> str:
        body = SIGN_IN.format(token=secrets.token_urlsafe(32), nonce=secrets.token_hex(16))
        return run(body.encode()).content_hash

    assert visit() == visit()
    other = SIGN_IN.replace("name='user'", "name='email'").format(token="t", nonce="n")
    assert run(other.encode()).content_hash != visit()


def test_a_short_pages_values_that_tell_pages_apart_stay_in_its_hash() -> None:
    """A gallery's pages told apart by a pager's token, a form's by a visible field's
    value: the same hash would let the URL-alias learner merge them."""

    def pager(token: str) -> str:
        body = (
            f"<title>Photos</title><form><input type='hidden' name='page_token' value='{token}'>"
            f"<input type='hidden' name='next_token' value='{token}x'></form>"
        )
        return run(body.encode()).content_hash

    assert pager("p1") != pager("p2")
    visible = "<title>Sign in</title><form><input name='csrf' value='{}'></form>"
    assert (
        run(visible.format("a").encode()).content_hash
        != run(visible.format("b").encode()).content_hash
    )


GARDEN = (
    "<!DOCTYPE html><html><head><title>On gardens</title>{head}</head>"
    "<body><p>"
    + "The garden opened this spring, and the neighbours came with seeds and tools. " * 4
    + "</p>{body}<a href='/about'>about</a></body></html>"
)


@pytest.mark.parametrize(
    ("head", "body"),
    [
        ("<meta name='csrf-token' content='{n}'>", ""),  # Rails, per request
        ("<script>var wpApiSettings = {{nonce: '{n}'}};</script>", ""),  # WordPress
        ("", "<!-- Dynamic page generated in 0.{n} seconds. -->"),  # a cache plugin
        ("", "<input type='hidden' name='_wpnonce' value='{n}'>"),  # a comment form
        ("<style>.x{{--build:{n}}}</style>", "<script src='/app.js?v={n}' async></script>"),
    ],
    ids=["csrf-meta", "inline-nonce", "generated-at", "form-token", "build-assets"],
)
def test_a_page_that_differs_only_in_what_is_not_read_hashes_the_same(head: str, body: str) -> None:
    first = run(GARDEN.format(head=head.format(n=1234), body=body.format(n=1234)).encode())
    again = run(GARDEN.format(head=head.format(n=98765), body=body.format(n=98765)).encode())
    if "app.js" in body:  # a script's URL is a link: asked as a new one, it changed
        assert first.content_hash != again.content_hash
    else:
        assert first.content_hash == again.content_hash


@pytest.mark.parametrize(
    "edit",
    [
        lambda page: page.replace("this spring", "this summer"),  # the text
        lambda page: page.replace("On gardens", "On orchards"),  # the title
        lambda page: page.replace("/about", "/contact"),  # a link
        lambda page: page.replace("</head>", "<meta name='robots' content='noindex'></head>"),
        lambda page: page.replace("</p>", "</p><video src='/v/2.mp4'></video>"),
    ],
    ids=["text", "title", "link", "noindex", "video"],
)
def test_a_page_whose_text_title_links_or_robots_change_hashes_differently(
    edit: Callable[[str], str],
) -> None:
    page = GARDEN.format(head="", body="")
    assert run(page.encode()).content_hash != run(edit(page).encode()).content_hash


def test_unparseable_content_type_gives_only_the_hash() -> None:
    result = run("<title>Looks like HTML</title><a href='/a'>a</a>", content_type="text/plain")
    assert result == Extraction(content_hash=result.content_hash)


def test_missing_content_type_is_read_as_html() -> None:
    assert run("<title>t</title>", content_type=None).title == "t"


def test_legacy_charset_from_meta_decodes_the_title() -> None:
    body = b'<meta charset="windows-1252"><title>\x93Quotes\x94 \x96 na\xefve</title>'
    assert run(body, content_type="text/html").title == "\u201cQuotes\u201d \u2013 naïve"


def test_extraction_is_immutable() -> None:
    result = run("<title>t</title>")
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.title = "changed"  # type: ignore[misc]


# URL resolution -----------------------------------------------------------------------------

BASES = [
    "https://example.org",
    "https://example.org/",
    "https://example.org/a/b",
    "https://example.org/a/b/",
    "http://example.org:8080/a/b?q=1#frag",
    "https://user@example.org/a/b.html",
    "https://example.org/a;params/b",
    "https://example.org/%7Euser/",
]
HREFS = [
    "/x",
    "x",
    "x/y?z=1#f",
    "/x/../y",
    "./x",
    "../x",
    "../../../../x",
    "?q=2",
    "//other.example/x",
    "/x;y",
    "x;y",
    "a b.html",
    "é.html",
    ".hidden",
    "a/./b",
    "x?y/../z",
    "a/b:c",
    "HTTPS://EXAMPLE.ORG/Up",
]


@pytest.mark.parametrize("base", BASES)
def test_resolution_agrees_with_urljoin(base: str) -> None:
    for href in HREFS:
        assert resolve_url(base, href) == urljoin(base, href).split("#")[0], href


def _resolved_by_urlsplit(href: str) -> str | None:
    """What an absolute href resolves to without any shortcut (a backslash before its
    query or fragment read as a slash, as the URL standard reads it)."""
    cut = next((i for i, char in enumerate(href) if char in "?#"), len(href))
    href = href[:cut].replace("\\", "/") + href[cut:]
    try:
        parts = urlsplit(href)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return None
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return None
    return href.split("#", 1)[0]


def test_absolute_links_resolve_as_urlsplit_says_on_random_hrefs() -> None:
    # Absolute links to plain hosts skip urlsplit; the shortcut must not change an answer.
    pieces = ["http://", "https://", "a", "Z", "0", "-", ".", ":", "8", "99999", "/"]
    pieces += ["?", "#", "@", "[", "]", "%", "\\", "é", "_", "::1", "x.example"]
    rng = random.Random(3)
    for _ in range(5000):
        href = rng.choice(["http://", "https://"]) + "".join(
            rng.choice(pieces) for _ in range(rng.randrange(0, 8))
        )
        assert resolve_url("https://example.org/a/", href) == _resolved_by_urlsplit(href), href
