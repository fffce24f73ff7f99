"""What the fetcher keeps of a page: title, links, language, keywords, robots directives.

Pure functions over the response body, no I/O, safe to run in a thread pool: in
``ParseThreads``, whose threads are renewed, as lxml keeps the names a thread parsed
until it ends. Hostile input (empty, binary, malformed, absurdly nested) gives a
thinner ``Extraction``, never an exception. The body itself is never kept: only its
sha256 and the signals above.

HTML, XHTML, RSS, Atom and PDF documents are read here; ActivityStreams JSON, asked
for by another fetch strategy, in ``trove_fetcher.activitystreams``.
"""

from __future__ import annotations

import hashlib
import html
import html.entities
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urljoin, urlsplit

from lxml import etree

from trove_fetcher.charset import bom_charset, decode_body, header_charset
from trove_fetcher.errors import PdfError
from trove_fetcher.keywords import keywords as make_keywords
from trove_fetcher.language import detect_language as detect
from trove_fetcher.pdf import looks_like_pdf, read_pdf
from trove_schema.events import (
    MARKUP_HASH_PREFIX,
    MAX_LINKS_PER_PAGE,
    MAX_URL_LENGTH,
    SIGNALS_HASH_PREFIX,
    LinkKind,
)
from trove_schema.heuristics import SHELL_MAX_TEXT_CHARS
from trove_schema.media import GZIP_TYPES, is_gzipped_xml, media_type
from trove_schema.urls import backslashes_as_slashes

HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
FEED_TYPES = frozenset({"application/rss+xml", "application/atom+xml"})
XML_TYPES = frozenset({"application/xml", "text/xml"})
PARSEABLE_TYPES = HTML_TYPES | FEED_TYPES | XML_TYPES
PDF_TYPES = frozenset({"application/pdf", "application/x-pdf"})

MAX_TITLE_LENGTH = 1000
#: Distinct links remembered while parsing; past this a page's further links are ignored.
MAX_LINKS_SEEN = 10 * MAX_LINKS_PER_PAGE

# Elements whose text is not visible page text (head holds the title, read separately).
_INVISIBLE = ("head", "script", "style", "noscript", "template", "nav", "svg")
#: Elements that stand on lines of their own (the HTML standard's block-level and
#: table elements, list items, line breaks, controls): their words never run into the
#: words around them, where an inline element's do ("<b>Java</b>Script", a drop cap's
#: "<span>G</span>ardening", "super<wbr>market").
_BLOCKS = (
    "address", "article", "aside", "blockquote", "br", "button", "caption", "dd", "details",
    "dialog", "div", "dl", "dt", "fieldset", "figcaption", "figure", "footer", "form", "h1",
    "h2", "h3", "h4", "h5", "h6", "header", "hgroup", "hr", "li", "main", "menu", "ol",
    "option", "p", "pre", "section", "summary", "table", "tbody", "td", "textarea",
    "tfoot", "th", "thead", "tr", "ul", "legend", "optgroup", "label", "title", "body",
    "center", "search",
)  # fmt: skip
_LINK_TAGS = ("a", "area", "img", "script", "link", "frame", "iframe", "meta")
# Embedded media: not links, but what a gallery's or a video's pages differ by, so part
# of the page's hash (``signals_digest``).
_MEDIA_TAGS = ("video", "audio", "source", "track", "embed", "object")
_MEDIA_ATTRIBUTES = ("src", "data", "poster")
# A <noscript> that asks for JavaScript ("You need to enable JavaScript to run this app"),
# looked for in the source of pages with next to no text only, and in its first
# SCRIPT_NOTICE_CHARS: an app's shell is small, and each "<noscript>" of a hostile page
# of them scans up to 2,000 characters (seconds of the GIL for a megabyte). The tag's
# attributes stop at the next "<": scanning to the next ">" from each of thousands of
# unclosed "<noscript" would be quadratic.
_ASKS_FOR_SCRIPT = re.compile(
    r"<noscript\b[^<>]*>(?:(?!</noscript).){0,2000}?\bjavascript\b", re.IGNORECASE | re.DOTALL
)
SCRIPT_NOTICE_CHARS = 64 * 1024
#: Attributes of one tag handed to lxml: libxml2's HTML parser compares each new one
#: with those before it (quadratic: 16 minutes for one tag of a 2 MiB page, a parse
#: worker of two held). A tag of more has the rest dropped; a page's own have a handful.
MAX_TAG_ATTRIBUTES = 256
# What libxml2 (2.14) reads as a tag, so that the guard sees the tags the parser does:
# a quoted value runs to its closing quote (or the end), "<" and ">" in it included; "<"
# is an ordinary character of a name or an unquoted value; what looks like a tag in a
# comment, or in the text of a script, style, title and their kin, is not one. A tag
# delimited any other way would let a crowded one hide behind it.
_SPACE = r"[\t\n\f\r ]"
_SEPARATORS = r"[\t\n\f\r /]*+"
_NAME_END = r"(?![^\t\n\f\r />])"
_ATTRIBUTE = (
    rf"""{_SEPARATORS}[^\t\n\f\r />][^\t\n\f\r />=]*+"""
    rf"""(?>{_SPACE}*+={_SPACE}*+(?>"[^"]*+"?|'[^']*+'?|[^\t\n\f\r >]*+))?"""
)
_FEW_ATTRIBUTES = rf"(?:{_ATTRIBUTE}){{0,{MAX_TAG_ATTRIBUTES}}}+"
# The ">" of a start tag after which its element's text is read as text ("/>" has none).
_OPENS = r"(?:[\t\n\f\r /]*[\t\n\f\r ])?>"
_TEXT_ELEMENTS = ("title", "textarea", "style", "xmp", "iframe", "noembed", "noframes")
_SCRIPT = "(?ai:script)"
_PLAINTEXT = "(?ai:plaintext)"
# A text element's text ends at its end tag ("{0}": its name).
_TEXT_OF = r"(?:[^<]++|<(?!/{0}[\t\n\f\r />]))*+"
# A script's ends at "</script" too, unless an "<!--" (up to "-->") holds a "<script"
# (up to its "</script"); libxml2 keeps this much of the HTML tokenizer's script states.
_ESCAPED = r"(?:[^<-]++|-(?!->)|<(?!{0}{1}[\t\n\f\r />]))*+"
_SCRIPT_TEXT = (
    rf"(?:[^<]++|<(?!!--|/{_SCRIPT}[\t\n\f\r />])|<!(?=--){_ESCAPED.format('/?', _SCRIPT)}"
    rf"(?:<{_SCRIPT}(?=[\t\n\f\r />]){_ESCAPED.format('/', _SCRIPT)}"
    rf"(?:</{_SCRIPT}(?=[\t\n\f\r />]){_ESCAPED.format('/?', _SCRIPT)})?)*+(?:-->)?)*+"
)


def _element_text() -> str:
    """The elements whose text is text, as alternatives: each start tag (after its "<"),
    of at most MAX_TAG_ATTRIBUTES, with the text after it."""
    texts = [(f"(?ai:{name})", _TEXT_OF.format(f"(?ai:{name})")) for name in _TEXT_ELEMENTS]
    texts += [(_SCRIPT, _SCRIPT_TEXT), (_PLAINTEXT, "(?s:.*+)")]
    return "|".join(f"{name}{_NAME_END}{_FEW_ATTRIBUTES}{_OPENS}{text}" for name, text in texts)


# The text up to a tag of more than MAX_TAG_ATTRIBUTES, that tag's first ones ("kept")
# and the rest ("dropped"), and the text of its element if it is one of the above.
# Possessive throughout: every construct before it is read once, whole, so no "<" in
# one starts another scan (linear). (No group is captured in the repetition: Python
# 3.11 miscounts the span of one captured there.)
_CROWDED_TAG = re.compile(
    rf"""(?:[^<]++|<(?:(?![A-Za-z/!?])"""
    rf"""|!--(?:-?>|(?:[^-]++|-(?!-!?>))*+(?:--!?>)?)|[!?][^>]*+|/(?![A-Za-z])[^>]*+"""
    rf"""|{_element_text()}"""
    rf"""|/?[A-Za-z][^\t\n\f\r />]*+{_FEW_ATTRIBUTES}{_SEPARATORS}(?![^>])))*+"""
    rf"""(?P<kept><(?:(?P<script>{_SCRIPT})|(?P<plaintext>{_PLAINTEXT})"""
    rf"""|(?P<element>(?ai:{"|".join(_TEXT_ELEMENTS)}))){_NAME_END}"""
    rf"""(?:{_ATTRIBUTE}){{{MAX_TAG_ATTRIBUTES}}}"""
    rf"""|</?[A-Za-z][^\t\n\f\r />]*+(?:{_ATTRIBUTE}){{{MAX_TAG_ATTRIBUTES}}})"""
    rf"""(?P<dropped>(?:{_ATTRIBUTE})*+)"""
    rf"""(?:(?(script){_OPENS}{_SCRIPT_TEXT}|(?(plaintext){_OPENS}(?s:.*+)"""
    rf"""|(?(element){_OPENS}{_TEXT_OF.format("(?ai:(?P=element))")}))))?"""
)
# Elements that are empty by nature, never an application's mount point.
_VOID = frozenset({"br", "hr", "img", "input", "wbr", "area", "col", "embed", "source", "track"})
#: Elements of a page's body looked at for a mount point (a shell has a handful).
_MOUNT_SEARCH = 200
_NOFOLLOW_RELS = frozenset({"nofollow", "ugc", "sponsored"})
# IndieWeb rel values (rel is a set of space-separated, case-insensitive tokens): the
# Webmention spec lets senders honour the legacy URL-valued rel of its first drafts.
_ME_RELS = frozenset({"me"})
_WEBMENTION_RELS = frozenset({"webmention", "http://webmention.org/", "http://webmention.org"})
_INDIEWEB_RELS = _ME_RELS | _WEBMENTION_RELS
# Which links survive when a page has more than MAX_LINKS_PER_PAGE: the ones that lead
# to pages first, then the ones that lead to resources (lower is kept first).
_KEEP_ORDER = {
    LinkKind.CANONICAL: 0,
    LinkKind.REDIRECT: 0,
    LinkKind.FEED: 1,
    LinkKind.ALTERNATE: 2,
    # One or a few per page, and what says who the page's author is.
    LinkKind.ME: 2,
    LinkKind.WEBMENTION: 2,
    LinkKind.A: 3,
    LinkKind.FEED_ITEM: 3,
    LinkKind.OTHER: 4,
    LinkKind.IMG: 5,
    LinkKind.SCRIPT: 6,
    LinkKind.STYLESHEET: 6,
}

_XML_NS = "{http://www.w3.org/XML/1998/namespace}"
_RDF_NS = "{http://www.w3.org/1999/02/22-rdf-syntax-ns#}"
# Each item of the prolog is matched once, not re-split when no root follows (atomic,
# possessive): forty comments before an HTML page took the backtracking days.
_FEED_ROOT = re.compile(
    rb"""\A(?:\xef\xbb\xbf)?(?>\s|<\?.*?\?>|<!--.*?-->|<!DOCTYPE[^\[>]*(?:\[.*?\])?\s*>)*+"""
    rb"""<(?:rss|feed|(?:[A-Za-z_][\w.-]*:)?(?:RDF|urlset|sitemapindex))[\s>/]""",
    re.DOTALL,
)
_BINARY_BYTES = re.compile(rb"[\x00-\x08\x0b\x0e-\x1a\x1c-\x1f]")
#: Control bytes in the first KB past which a body declared as markup is binary after
#: all. One is a slip (a \x0b, Word's manual line break, pasted into a CMS title);
#: random bytes have a hundred.
MAX_CONTROL_BYTES = 8
# What a binary body sent as markup starts with: images, archives, compressed data, PDF.
_BINARY_SIGNATURES = (
    b"\x89PNG\r\n\x1a\n",
    b"GIF87a",
    b"GIF89a",
    b"\xff\xd8\xff",
    b"PK\x03\x04",
    b"\x1f\x8b\x08",
    b"%PDF-",
)
# A tag ends at its ">", and at the next "<" (linear: a text of a million "<" would
# have each scan to the end for a ">").
_MARKUP = re.compile(r"<[^<>]*>")
_HTTP = ("http", "https")
_ABSOLUTE = ("http://", "https://")
# A path (absolute or relative) with no scheme, authority, query-only or dot start.
_PLAIN_PATH = re.compile(r"\A(?:/(?!/)|[^:/?#.\\][^:/?#\\]*(?:[/?#]|\Z))")
# An absolute http(s) URL whose authority is a plain host and at most a port (checked to
# be at most 65535): urlsplit would accept it with a host, so it needs no parsing (a test
# holds the two).
_PLAIN_ABSOLUTE = re.compile(
    r"\Ahttps?://[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.?(?::([0-9]{1,5}))?(?=[/?#]|\Z)"
)
_URL_NOISE = str.maketrans("", "", "\t\n\r")
_C0_OR_SPACE = "".join(map(chr, range(0x21)))
_WHITESPACE = (" ", "\n", "\t", "\r")
_SPLIT_DIRECTIVES = re.compile(r"[\s,]+")
_UA_PREFIX = re.compile(r"\A\s*([A-Za-z0-9_.*-]+)\s*:(.*)\Z", re.DOTALL)
# X-Robots-Tag directives that carry a value after a colon (not a user agent prefix).
_VALUED_DIRECTIVES = frozenset(
    {"unavailable_after", "max-snippet", "max-image-preview", "max-video-preview"}
)
# Possessive: the two runs of spaces around an empty delay must not try every split of
# a content of a million spaces (quadratic, with the GIL held).
_REFRESH_URL = re.compile(
    r"""\A\s*+[\d.]*+\s*+[;,]\s*+(?:url\s*+=\s*+)?(["']?)(?P<url>[^"']+)\1""", re.IGNORECASE
)


class FoundLink(NamedTuple):
    """A link as the page wrote it: absolute, http(s), without fragment, not canonical
    until ``Extraction.links_canonical``.

    A plain tuple: the fetcher canonicalizes every link before it becomes an event's
    ``Link``, so building (and validating) a model here would be paid twice.
    """

    url: str
    kind: LinkKind = LinkKind.A
    nofollow: bool = False


@dataclass(frozen=True, slots=True)
class Extraction:
    """The signals of one response body."""

    #: What the page says, hashed (``signals_digest``: its title, visible text, links,
    #: embedded media, canonical URL and noindex; ``SIGNALS_HASH_PREFIX`` and 62 hex
    #: digits); its markup's (``markup_digest``) when it says too little to tell pages
    #: apart by (under ``SHELL_MAX_TEXT_CHARS`` of text); or the sha256 (64 hex digits)
    #: of the body's bytes (a PDF, binary, unparsable). Markup, comments, scripts and
    #: the head's meta (a "generated at", a nonce, a CSRF token) do not change it: a
    #: page is changed when what Trove reads of it is, or every visit of a WordPress
    #: blog would be a change and its re-crawls come down to the hourly minimum.
    content_hash: str
    title: str | None = None
    links: tuple[FoundLink, ...] = ()
    #: The page had more distinct links than ``MAX_LINKS_PER_PAGE``.
    links_truncated: bool = False
    #: ``links`` and ``canonical_url`` are canonical, one link a URL and kind
    #: (``completion.with_canonical_links``).
    links_canonical: bool = False
    canonical_url: str | None = None
    #: BCP-47 tag, or None when unsure.
    language: str | None = None
    #: Sorted distinct terms (empty for noindex pages: they are only for the index).
    keywords: tuple[str, ...] = ()
    noindex: bool = False
    nofollow: bool = False
    is_feed: bool = False
    #: Characters of readable text (whitespace not counted; scripts, styles, navigation
    #: and the head left out); None when nothing could be parsed.
    text_chars: int | None = None
    #: An application shell: scripts and a mount point (or a <noscript> asking for
    #: JavaScript) around next to no text. The content is elsewhere (an API, JSON).
    shell: bool = False


def is_parseable(content_type: str | None) -> bool:
    """Whether this Content-Type is a markup ``extract`` parses: HTML, XHTML, feeds, XML.

    The ``http`` strategy reads PDF documents too (``strategies.HTTP.is_parseable``).
    """
    return media_type(content_type) in PARSEABLE_TYPES


def looks_like_feed(body: bytes) -> bool:
    """The body is XML whose root element is ``rss``, ``feed`` or ``rdf:RDF``, or a
    sitemap's ``urlset`` or ``sitemapindex`` (lists of links, read as feeds are)."""
    return _FEED_ROOT.match(body, 0, 4096) is not None


def looks_binary(body: bytes, content_type: str | None = None) -> bool:
    """Control bytes no text uses in the first 1 KB (the WHATWG sniffing rule, for a body
    of no markup type); for one declared HTML, XHTML, a feed or XML, a binary signature
    at the start or more than ``MAX_CONTROL_BYTES`` of them. Never UTF-16."""
    declared = header_charset(content_type) or ""
    bom = bom_charset(body)
    if declared.startswith("utf-16") or (bom is not None and bom[0].startswith("utf-16")):
        return False
    if media_type(content_type) not in PARSEABLE_TYPES:
        return _BINARY_BYTES.search(body, 0, 1024) is not None
    if body.startswith(_BINARY_SIGNATURES):
        return True
    return len(_BINARY_BYTES.findall(body, 0, 1024)) > MAX_CONTROL_BYTES


def extract(
    body: bytes,
    *,
    url: str,
    content_type: str | None,
    x_robots_tag: str | None = None,
    robots_token: str = "TroveBot",  # noqa: S107 - a robots.txt token, not a secret
    detect_language: bool = True,
) -> Extraction:
    """Extract the signals of ``body``, fetched from ``url``. Never raises on bad input.

    ``detect_language=False`` skips the language detector (and the stop words it picks).
    """
    noindex, nofollow = x_robots_directives(x_robots_tag, robots_token)
    page = _Page(url, body, noindex, nofollow, robots_token, detect_language)
    kind = media_type(content_type)
    if kind in GZIP_TYPES and is_gzipped_xml(kind, url):
        # Unpacked by the fetch (``http.BodyReader.packed``): the XML it held, whose
        # charset its own declaration gives. Still packed, it reads as binary. One
        # served as XML is read by the type it was given.
        kind = content_type = "application/xml"
    if kind in PDF_TYPES or (kind is None and looks_like_pdf(body)):
        return page.pdf(body)
    if looks_binary(body, content_type):
        return page.empty()
    if kind in FEED_TYPES or looks_like_feed(body):
        # Not RSS or Atom after all (an HTML error page sent as a feed): read it as HTML.
        return page.feed(body, content_type) or page.html(body, content_type)
    if kind is None or kind in HTML_TYPES or kind in XML_TYPES:
        return page.html(body, content_type)
    return page.empty()


def meta_robots_directives(content: str | None) -> tuple[bool, bool]:
    """(noindex, nofollow) of a robots ``<meta>`` content such as "noindex, follow"."""
    words = set(_SPLIT_DIRECTIVES.split((content or "").lower()))
    none = "none" in words
    return none or "noindex" in words, none or "nofollow" in words


def x_robots_directives(
    value: str | None,
    robots_token: str = "TroveBot",  # noqa: S107 - a robots.txt token, not a secret
) -> tuple[bool, bool]:
    """(noindex, nofollow) from an X-Robots-Tag header value meant for ``robots_token``.

    The value is a comma list; a ``name:`` prefix aims the directives after it (up to the
    next prefix) at one crawler, as in "googlebot: noindex, TroveBot: nofollow". Several
    headers come one a line (``http.fetch``): a prefix aims no further than its own.
    """
    noindex = nofollow = False
    if not value:
        return noindex, nofollow
    token = robots_token.lower()
    for header in value.split("\n"):
        applies = True
        for part in header.split(","):
            match = _UA_PREFIX.match(part)
            if match is not None and match.group(1).lower() not in _VALUED_DIRECTIVES:
                applies = match.group(1).lower() == token
                part = match.group(2)
            if applies:
                part_noindex, part_nofollow = meta_robots_directives(part)
                noindex |= part_noindex
                nofollow |= part_nofollow
    return noindex, nofollow


def resolve_url(base: str, href: str | None) -> str | None:
    """``href`` made absolute against ``base``, without fragment; None unless http(s)."""
    return _Resolver(base)(href)


class _Resolver:
    """``resolve_url`` for many links against one base, with a fast path for plain paths.

    urljoin is most of the cost of a page's extraction; a plain path ("/a/b", "b.html")
    against an http(s) base needs only a concatenation.
    """

    def __init__(self, base: str) -> None:
        self.base = base
        self.origin: str | None = None
        self.directory = ""
        try:
            parts = urlsplit(base)
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError:
            return
        if parts.scheme in _HTTP and parts.hostname and ";" not in parts.path:
            self.origin = f"{parts.scheme}://{parts.netloc}"
            path = parts.path or "/"
            self.directory = self.origin + path[: path.rfind("/") + 1]

    def __call__(self, href: str | None) -> str | None:
        if not href:
            return None
        # Browsers strip surrounding whitespace and drop tabs and newlines from a URL.
        # (translate() looks up every character: only when there is something to drop.)
        if "\t" in href or "\n" in href or "\r" in href:
            href = href.translate(_URL_NOISE)
        # As the URL standard does, any C0 control or space around it: urljoin strips
        # them to read the scheme, then hands back the URL as it came, a control first.
        href = href.strip(_C0_OR_SPACE)
        if not href:
            return None
        href = backslashes_as_slashes(href)
        if self.origin is not None and _PLAIN_PATH.match(href) and "/." not in href:
            absolute = (self.origin if href[0] == "/" else self.directory) + href
        elif (plain := _PLAIN_ABSOLUTE.match(href)) is not None and int(plain[1] or 0) < 65536:
            absolute = href
        else:
            try:
                if not href.startswith(_ABSOLUTE):  # upper case too: urljoin lowers it
                    href = urljoin(self.base, href)
                parts = urlsplit(href)
                if parts.scheme not in _HTTP or not parts.hostname:
                    return None
                parts.port  # noqa: B018 - raises ValueError for a port that is not a number
            except ValueError:
                return None
            absolute = href
        absolute = absolute.split("#", 1)[0]
        if len(absolute) > MAX_URL_LENGTH:
            return None
        return absolute


def signals_digest(
    title: str | None,
    text: str,
    links: tuple[FoundLink, ...],
    canonical_url: str | None,
    noindex: bool,
    media: str = "",
) -> str:
    """``Extraction.content_hash`` of a page read: its signals' sha256, cut to fit with
    its prefix in the 64 characters of a body's. The text is hashed as extracted, not
    with its whitespace collapsed (ten times the cost)."""
    digest = hashlib.sha256()
    for part in (title or "", canonical_url or "", "noindex" if noindex else "", media, text):
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    listed = "\n".join(f"{link.kind}\t{int(link.nofollow)}\t{link.url}" for link in links)
    digest.update(listed.encode("utf-8", "surrogatepass"))
    return SIGNALS_HASH_PREFIX + digest.hexdigest()[: 64 - len(SIGNALS_HASH_PREFIX)]


#: Names of the values a server makes anew for each answer: a form's CSRF token (Rails'
#: authenticity_token, Django's csrfmiddlewaretoken, Laravel's _token, WordPress's
#: _wpnonce, Drupal's form_build_id and form_token, ASP.NET's __RequestVerificationToken
#: and view state, Symfony's form[_token], CakePHP's _Token[fields], MediaWiki's
#: wpLoginToken and wpEditToken), a CSP nonce. Named, not any "token": a gallery's
#: page_token is what tells its pages apart.
_PER_ANSWER = re.compile(
    r"csrf|nonce|authenticity_token|(?:^|\[)_token(?:\]|\[|$)|requestverificationtoken"
    r"|form_build_id|^form_token$|viewstate|eventvalidation|logintoken|edittoken",
    re.IGNORECASE,
)


def markup_digest(markup: str) -> str | None:
    """The hash of a page that says too little to be told apart by its signals: its
    markup, scripts included (an app's pages differ by the data in them), without what a
    server makes anew for each answer (comments, a "generated in 0.02 s"; CSP nonces;
    CSRF tokens in a form's hidden fields and in the head's meta). Hashed as its bytes,
    each visit of a login page or a gallery's was a change, and its re-crawls came down
    to the hourly minimum for good. None when the markup cannot be read."""
    root = parse_html(markup)  # comments are left out as the page's are
    if root is None:
        return None
    for element in root.iter():
        attributes = element.attrib
        if "nonce" in attributes:
            del attributes["nonce"]
        tag = element.tag
        if tag == "input":
            hidden = (attributes.get("type") or "").lower() == "hidden"
            if hidden and _PER_ANSWER.search(attributes.get("name") or ""):
                attributes.pop("value", "")
        elif tag == "meta":
            names = (attributes.get("name") or "", attributes.get("property") or "")
            if any(_PER_ANSWER.search(name) for name in names):
                attributes.pop("content", "")
    digest = hashlib.sha256(etree.tostring(root, encoding="utf-8", method="html"))
    return MARKUP_HASH_PREFIX + digest.hexdigest()[: 64 - len(MARKUP_HASH_PREFIX)]


def text_length(text: str) -> int:
    """Readable characters of ``text``: its length less its whitespace.

    Counting the usual whitespace characters costs a fifth of splitting the text
    (30 us against 150 for 24 KB); rarer spaces (no-break, ideographic) count as text.
    """
    return len(text) - sum(map(text.count, _WHITESPACE))


def collapse_whitespace(text: str | None, limit: int = MAX_TITLE_LENGTH) -> str | None:
    if not text:
        return None
    collapsed = " ".join(text.split())[:limit].rstrip()
    return collapsed or None


class _Links:
    """Links in document order, one per (url, kind); nofollow only if every copy was."""

    def __init__(self) -> None:
        self._nofollow: dict[tuple[str, LinkKind], bool] = {}
        self._resolvers: dict[str, _Resolver] = {}
        #: Each (base, href) resolved, while there are few: a page of one href written
        #: 190,000 times ("?q") resolves it once.
        self._resolved: dict[tuple[str, str | None], str | None] = {}
        self.overflow = False

    def add(self, base: str, href: str | None, kind: LinkKind, nofollow: bool = False) -> None:
        if self.overflow:
            # Past the distinct links looked at, the rest are not even resolved: a page
            # of 2 MiB holds 190,000 links of "../N", each an urljoin.
            return
        written = (base, href)
        if written in self._resolved:
            url = self._resolved[written]
        else:
            resolver = self._resolvers.get(base)
            if resolver is None:
                resolver = self._resolvers[base] = _Resolver(base)
            url = resolver(href)
            if len(self._resolved) < MAX_LINKS_SEEN:
                self._resolved[written] = url
        if url is None:
            return
        key = (url, kind)
        seen = self._nofollow.get(key)
        if seen is None:
            if len(self._nofollow) >= MAX_LINKS_SEEN:
                self.overflow = True
                return
            self._nofollow[key] = nofollow
        elif seen and not nofollow:
            self._nofollow[key] = False

    def result(self, page_nofollow: bool) -> tuple[tuple[FoundLink, ...], bool]:
        found = list(self._nofollow.items())
        truncated = self.overflow or len(found) > MAX_LINKS_PER_PAGE
        if len(found) > MAX_LINKS_PER_PAGE:
            ranked = sorted(range(len(found)), key=lambda i: (_KEEP_ORDER[found[i][0][1]], i))
            found = [found[i] for i in sorted(ranked[:MAX_LINKS_PER_PAGE])]
        links = tuple(
            FoundLink(url, kind, nofollow or page_nofollow) for (url, kind), nofollow in found
        )
        return links, truncated


#: Bytes of bodies one set of parse threads reads before new ones take over
#: (``ParseThreads``). What lxml keeps of them is at most about three bytes a byte read
#: (pages of names no other page has: ~6 MB for 2 MiB), so ~50 MB; new threads cost
#: ~2 ms once (their first page is slower), every 500 pages of 30 KB or so.
PARSE_THREAD_BYTES = 16 << 20


class ParseThreads:
    """The threads bodies are read in, replaced by new ones after ``renew_after`` bytes.

    libxml2 interns every element and attribute name it parses in a dictionary of the
    thread's (lxml's, shared by all the thread's parsers: a new parser starts with it
    too), freed only when the thread ends. A pod's threads would live for months, and a
    page can bring megabytes of names no other page has (``<b x1a=1 y1a=1>`` and on,
    new at each visit), a framework's per-deploy ones (``data-v-<hash>``) a few a page.
    The pool replaced finishes the parses it was given; then its threads end, and their
    dictionaries and parsers (``_local``) go with them.

    Used from one thread, the event loop's.
    """

    def __init__(self, workers: int, *, renew_after: int = PARSE_THREAD_BYTES) -> None:
        self.workers = workers
        self.renew_after = renew_after
        self._read = 0
        self._pool = self._new_pool()

    def _new_pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="parse")

    def pool(self, size: int) -> ThreadPoolExecutor:
        """The pool to read a body of ``size`` bytes in."""
        if self._read >= self.renew_after:
            self._pool.shutdown(wait=False)
            self._pool = self._new_pool()
            self._read = 0
        self._read += size
        return self._pool

    def shutdown(self) -> None:
        """No more reading: what has not started is cancelled, what has finishes."""
        self._pool.shutdown(wait=False, cancel_futures=True)


_local = threading.local()


def _few_attributes(text: str) -> str:
    """``text`` with no tag of more than ``MAX_TAG_ATTRIBUTES`` attributes (linear)."""
    parts: list[str] = []
    start = 0
    # Anchored: a search would start again at each "<" of the text after the last tag.
    while (crowded := _CROWDED_TAG.match(text, start)) is not None:
        # The space ends the last attribute kept as the first one dropped began: an
        # unquoted value must not run on into a "/>".
        kept, rest = crowded.end("kept"), crowded.end("dropped")
        parts += (text[start:kept], " ", text[rest : crowded.end()])
        start = crowded.end()
    return "".join(parts) + text[start:] if parts else text


def parse_html(text: str) -> etree._Element | None:
    """``text`` (a page, or a post's HTML fragment) as lxml reads it, its tags first cut
    to ``MAX_TAG_ATTRIBUTES`` attributes: libxml2 checks each attribute's name against
    the tag's others, and one tag of 100,000 took it seconds. None when nothing is read."""
    try:
        return etree.fromstring(_few_attributes(text).encode("utf-8", "replace"), _html_parser())
    except (etree.LxmlError, ValueError):
        return None


def parse_fragment(fragment: str) -> etree._Element | None:
    """An HTML fragment (a post's content) as ``parse_html`` reads it, in a body."""
    return parse_html(f"<html><body>{fragment}</body></html>")


def _html_parser() -> etree.HTMLParser:
    # lxml parsers must not be shared between threads: one per thread.
    parser: etree.HTMLParser | None = getattr(_local, "html", None)
    if parser is None:
        parser = _local.html = etree.HTMLParser(
            encoding="utf-8",
            remove_comments=True,
            remove_pis=True,
            no_network=True,
            # Keeps libxml2's limits: a document nested deeper than 256 is cut there.
            huge_tree=False,
        )
    return parser


def _feed_parser() -> etree.XMLParser:
    parser: etree.XMLParser | None = getattr(_local, "xml", None)
    if parser is None:
        parser = _local.xml = etree.XMLParser(
            # The text is already decoded (and re-encoded as UTF-8): ignore the declaration.
            encoding="utf-8",
            # No XXE, no billion laughs: entities stay unexpanded references.
            resolve_entities=False,
            no_network=True,
            huge_tree=False,
            load_dtd=False,
            dtd_validation=False,
            attribute_defaults=False,
            recover=True,
            remove_comments=True,
            remove_pis=True,
        )
    return parser


def _rel(element: etree._Element) -> set[str]:
    return set((element.get("rel") or "").lower().split())


def _indieweb_kinds(rel: set[str]) -> Iterator[LinkKind]:
    if not rel.isdisjoint(_ME_RELS):
        yield LinkKind.ME
    if not rel.isdisjoint(_WEBMENTION_RELS):
        yield LinkKind.WEBMENTION


def _local_name(element: etree._Element) -> str:
    tag = element.tag
    return tag.rpartition("}")[2] if isinstance(tag, str) else ""


def _children(element: etree._Element, name: str) -> list[etree._Element]:
    return [child for child in element if _local_name(child) == name]


def _child(element: etree._Element, name: str) -> etree._Element | None:
    for child in element:
        if _local_name(child) == name:
            return child
    return None


#: A character reference to a surrogate code point (U+D800..U+DFFF), hex or decimal.
_SURROGATE_REFERENCE = re.compile(
    r"&#(?:[xX]0*[dD][89a-fA-F][0-9a-fA-F]{2}"
    r"|0*(?:5529[6-9]|55[3-9][0-9]{2}|56[0-9]{3}|57[0-2][0-9]{2}|573[0-3][0-9]|5734[0-3]));"
)


def _html_title(root: etree._Element) -> etree._Element | None:
    """The first <title> not in an SVG image (an icon's names the icon), read in one pass
    (its ancestors looked at for each would cost a page of 100,000 titles seconds)."""
    in_svg = 0
    for event, element in etree.iterwalk(root, events=("start", "end"), tag=("svg", "title")):
        if element.tag == "svg":
            in_svg += 1 if event == "start" else -1
        elif event == "start" and not in_svg:
            title: etree._Element = element
            return title
    return None


def visible_text(root: etree._Element) -> str:
    """The text of ``root`` with its words as a reader sees them: a space where a block
    begins and ends, none around an inline element."""
    # An XSLT transform in libxslt: no Python for each element, and faster than joining
    # ``itertext()``; one a thread, as lxml's parsers are.
    transform: etree.XSLT | None = getattr(_local, "text", None)
    if transform is None:
        transform = _local.text = etree.XSLT(etree.XML(_VISIBLE_TEXT), access_control=_NO_ACCESS)
    return str(transform(root))


#: No file or network for the transform (lxml-stubs do not know the constant).
_NO_ACCESS = etree.XSLTAccessControl.DENY_ALL  # type: ignore[attr-defined]
#: Each block's content between spaces; the rest as XSLT's built-in rules copy it. A
#: select's options are no text of the page (a country picker's 250 names). What a page
#: hides (``hidden``, ``display:none``) stays: a wrapper a script reveals, an inactive
#: tab, a folded answer are its content, and a page without them would be taken for an
#: app's empty shell.
_VISIBLE_TEXT = f"""<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform">
<xsl:output method="text" encoding="UTF-8"/>
<xsl:template match="{"|".join(_BLOCKS)}"><xsl:text> </xsl:text><xsl:apply-templates/><xsl:text> </xsl:text></xsl:template>
<xsl:template match="select"><xsl:text> </xsl:text></xsl:template>
</xsl:stylesheet>"""  # noqa: E501


def _text(element: etree._Element | None) -> str:
    """The element's text, entity references left out (they stay unexpanded in feeds)."""
    if element is None:
        return ""
    value = element.xpath("string()")
    return value if isinstance(value, str) else ""


class _Page:
    def __init__(
        self,
        url: str,
        body: bytes,
        noindex: bool,
        nofollow: bool,
        robots_token: str,
        detect_language: bool,
    ) -> None:
        self.url = url
        self.body = body
        self.noindex = noindex
        self.nofollow = nofollow
        self.robots_names = {"robots", robots_token.lower()}
        self.detect_language = detect_language

    def body_digest(self) -> str:
        return hashlib.sha256(self.body).hexdigest()

    def empty(self, *, is_feed: bool = False) -> Extraction:
        return Extraction(
            content_hash=self.body_digest(),
            noindex=self.noindex,
            nofollow=self.nofollow,
            is_feed=is_feed,
        )

    def finish(
        self,
        *,
        title: str | None,
        links: _Links,
        canonical_url: str | None,
        text: str,
        lang_hint: str | None,
        is_feed: bool,
        text_chars: int | None = None,
        shell: bool = False,
        language: str | None = None,
        media: str = "",
        by_bytes: bool = False,
        markup: str | None = None,
    ) -> Extraction:
        """The extraction; ``language``, when given, is the document's own statement.
        ``by_bytes``: its hash is the body's (``Extraction.content_hash``); ``markup``:
        the page's HTML, hashed when it says too little (``markup_digest``)."""
        if language is None and self.detect_language:
            language = detect(text or title or "", hint=lang_hint)
        terms: tuple[str, ...] = ()
        if not self.noindex:
            terms = make_keywords(text, title=title, language=language)
        found, truncated = links.result(self.nofollow)
        chars = text_length(text) if text_chars is None else text_chars
        if by_bytes or chars < SHELL_MAX_TEXT_CHARS:
            # Too little said to tell pages apart by: a gallery's or an app's pages
            # would all hash the same, and URL aliases merge them.
            digest = None if by_bytes or markup is None else markup_digest(markup)
            content_hash = self.body_digest() if digest is None else digest
        else:
            content_hash = signals_digest(title, text, found, canonical_url, self.noindex, media)
        return Extraction(
            content_hash=content_hash,
            title=title,
            links=found,
            links_truncated=truncated,
            canonical_url=canonical_url,
            language=language,
            keywords=terms,
            noindex=self.noindex,
            nofollow=self.nofollow,
            is_feed=is_feed,
            text_chars=chars,
            shell=shell,
        )

    # HTML ---------------------------------------------------------------------------

    def html(self, body: bytes, content_type: str | None) -> Extraction:
        text, _ = decode_body(body, content_type)
        root = parse_html(text)
        if root is None:
            return self.empty()

        base = self.url
        for element in root.iter("base"):
            href = element.get("href")
            if href is not None:
                base = resolve_url(self.url, href) or self.url
                break

        # A <template>'s content is inert (a client-side renderer's "/user/{{ id }}"):
        # neither title, links nor text.
        etree.strip_elements(root, "template", with_tail=False)
        title_element = root.find("head/title")
        if title_element is None:
            title_element = _html_title(root)
        title = collapse_whitespace(title_element.text if title_element is not None else None)
        links = _Links()
        canonical_url = None
        scripts = 0
        media: list[str] = []
        for element in root.iter(*_LINK_TAGS, *_MEDIA_TAGS):
            tag = element.tag
            rel = _rel(element)
            nofollow = not rel.isdisjoint(_NOFOLLOW_RELS)
            if tag == "a" or tag == "area":
                if rel and not rel.isdisjoint(_INDIEWEB_RELS):
                    # Instead of an ``a`` link: an identity claim is not a citation, and
                    # a Webmention endpoint is an API, never a page to crawl.
                    for indieweb in _indieweb_kinds(rel):
                        links.add(base, element.get("href"), indieweb, nofollow)
                else:
                    links.add(base, element.get("href"), LinkKind.A, nofollow)
            elif tag == "img":
                links.add(base, element.get("src"), LinkKind.IMG)
                srcset = (element.get("srcset") or "").split()
                if srcset:
                    links.add(base, srcset[0].rstrip(","), LinkKind.IMG)
            elif tag == "script":
                scripts += 1
                links.add(base, element.get("src"), LinkKind.SCRIPT)
            elif tag == "frame" or tag == "iframe":
                links.add(base, element.get("src"), LinkKind.OTHER)
            elif tag == "link":
                href = element.get("href")
                if rel and not rel.isdisjoint(_INDIEWEB_RELS):
                    for indieweb in _indieweb_kinds(rel):
                        links.add(base, href, indieweb, nofollow)
                kind = self._link_kind(element, rel)
                if kind is None:
                    continue
                if kind is LinkKind.CANONICAL and canonical_url is None:
                    canonical_url = resolve_url(base, href)
                links.add(base, href, kind, nofollow)
            elif tag == "meta":
                self._meta(element, base, links)
            else:  # _MEDIA_TAGS
                media.extend(element.get(name) or "" for name in _MEDIA_ATTRIBUTES)

        lang_hint = root.get("lang") or root.get(_XML_NS + "lang")
        etree.strip_elements(root, *_INVISIBLE, with_tail=False)
        visible = visible_text(root)
        text_chars = text_length(visible)
        # Only a page with next to no text is looked at further: the check costs a
        # real page nothing.
        shell = text_chars < SHELL_MAX_TEXT_CHARS and (
            (scripts > 0 and _has_mount_point(root))
            or _ASKS_FOR_SCRIPT.search(text, 0, SCRIPT_NOTICE_CHARS) is not None
        )
        return self.finish(
            title=title,
            links=links,
            canonical_url=canonical_url,
            text=visible,
            lang_hint=lang_hint,
            is_feed=False,
            text_chars=text_chars,
            shell=shell,
            media="\n".join(media),
            markup=text,
        )

    @staticmethod
    def _link_kind(element: etree._Element, rel: set[str]) -> LinkKind | None:
        if "canonical" in rel:
            return LinkKind.CANONICAL
        if "stylesheet" in rel:
            return LinkKind.STYLESHEET
        if "alternate" not in rel:
            return None
        mime = media_type(element.get("type"))
        if mime in FEED_TYPES:
            return LinkKind.FEED
        # Another language or a mobile version of this page; not oEmbed, JSON and such.
        if mime in (None, "text/html", "application/xhtml+xml") or element.get("hreflang"):
            return LinkKind.ALTERNATE
        return None

    def _meta(self, element: etree._Element, base: str, links: _Links) -> None:
        name = (element.get("name") or "").strip().lower()
        if name in self.robots_names:
            noindex, nofollow = meta_robots_directives(element.get("content"))
            self.noindex |= noindex
            self.nofollow |= nofollow
        elif (element.get("http-equiv") or "").strip().lower() == "refresh":
            match = _REFRESH_URL.match(element.get("content") or "")
            if match is not None:
                links.add(base, match.group("url"), LinkKind.REDIRECT)

    # PDF ----------------------------------------------------------------------------

    def pdf(self, body: bytes) -> Extraction:
        """Title (the Info dictionary's, else the first line), text and link URIs."""
        try:
            document = read_pdf(body)
        except PdfError:
            return self.empty()
        title = document.title
        if title is None:
            first = next((line for line in document.text.splitlines() if line.strip()), None)
            title = collapse_whitespace(first, 200)
        links = _Links()
        for uri in document.links:
            links.add(self.url, uri, LinkKind.A)
        return self.finish(
            title=title,
            links=links,
            canonical_url=None,
            text=document.text,
            lang_hint=document.language,
            is_feed=False,
            by_bytes=True,  # a PDF carries no nonce; its title alone may be "Untitled"
        )

    # Feeds --------------------------------------------------------------------------

    def feed(self, body: bytes, content_type: str | None) -> Extraction | None:
        """A feed's signals; None if the body is XML but not RSS or Atom (try HTML)."""
        text, _ = decode_body(body, content_type)
        if "&#" in text:
            # libxml2 in recovery keeps a reference to a surrogate as bytes lxml cannot
            # decode later (UnicodeDecodeError on .text): refer to U+FFFD instead.
            text = _SURROGATE_REFERENCE.sub("&#xFFFD;", text)
        if "&" in text:
            text = _NAMED_REFERENCE.sub(_numbered, text, count=MAX_NAMED_REFERENCES)
        try:
            root = etree.fromstring(
                text.encode("utf-8", "replace"), _feed_parser(), base_url=self.url
            )
        except (etree.LxmlError, ValueError):
            root = None
        if root is None:
            return self.empty(is_feed=True)

        name = _local_name(root)
        if name == "rss":
            channel = _child(root, "channel")
            items = _children(root, "item")
            if channel is not None:
                items = _children(channel, "item") + items
        elif name == "RDF":
            channel = _child(root, "channel")
            items = _children(root, "item")
            if channel is not None:
                items += _children(channel, "item")
        elif name == "feed":
            channel = root
            items = _children(root, "entry")
        elif name in ("urlset", "sitemapindex"):
            return self._sitemap(root, name)
        else:
            return None

        links = _Links()
        words: list[str] = []
        title = None
        lang_hint = root.get(_XML_NS + "lang")
        if channel is not None:
            title = collapse_whitespace(_feed_text(_child(channel, "title")))
            lang_hint = lang_hint or _text(_child(channel, "language")) or None
            for summary in ("description", "subtitle"):
                words.append(_feed_text(_child(channel, summary)))
            self._feed_item_links(channel, links, LinkKind.A)
        for item in items:
            self._feed_item_links(item, links, LinkKind.FEED_ITEM)
            for part in ("title", "description", "summary", "content"):
                words.append(_feed_text(_child(item, part)))

        return self.finish(
            title=title,
            links=links,
            canonical_url=None,
            text=" ".join(words),
            lang_hint=lang_hint,
            is_feed=True,
        )

    def _sitemap(self, root: etree._Element, name: str) -> Extraction:
        """A sitemap's pages, as a feed's items, or a sitemap index's sitemaps, as feeds
        (sitemaps.org 0.9: each ``<loc>`` of a ``<url>`` or a ``<sitemap>``). Nothing
        else of it is read: no title or text, and its ``lastmod`` and ``priority`` are the
        site's hints, which a visit's own answers replace. A sitemap's own URLs may name
        other hosts than the protocol allows; discovery scopes them as any page's links."""
        links = _Links()
        entry, kind = (
            ("url", LinkKind.FEED_ITEM) if name == "urlset" else ("sitemap", LinkKind.FEED)
        )
        for item in _children(root, entry):
            loc = _child(item, "loc")
            if loc is not None:
                links.add(item.base or self.url, _text(loc).strip(), kind)
        return self.finish(
            title=None, links=links, canonical_url=None, text="", lang_hint=None, is_feed=True
        )

    def _feed_item_links(self, item: etree._Element, links: _Links, kind: LinkKind) -> None:
        base = item.base or self.url
        found = False
        for link in _children(item, "link"):
            href = link.get("href")
            if href is not None:  # Atom: only the alternate (the page), not self/enclosure
                if link.get("rel") in (None, "", "alternate"):
                    links.add(link.base or base, href, kind)
                    found = True
            elif link.text:  # RSS
                links.add(base, _text(link).strip(), kind)
                found = True
        if found:
            return
        # Else a permalink guid (RSS) or rdf:about (RSS 1.0), if it is an absolute URL:
        # a relative guid is an opaque id more often than a path.
        guid = _child(item, "guid")
        if guid is not None and (guid.get("isPermaLink") or "true").lower() != "false":
            candidate = _text(guid).strip()
        else:
            candidate = item.get(_RDF_NS + "about") or ""
        if candidate.lower().startswith(("http://", "https://")):
            links.add(base, candidate, kind)


def _has_mount_point(root: etree._Element) -> bool:
    """Where a script would render the page: a body with nothing but scripts, or an empty
    element named by an id (``<div id="root">``, ``<div id="mastodon">``) or a custom
    element (``<app-root>``). Called after the invisible elements were stripped."""
    body = root.find("body")
    if body is None:
        return True  # nothing but a head: everything the page shows comes from scripts
    if len(body) == 0:
        return not (body.text or "").strip()
    for seen, element in enumerate(body.iter()):
        if seen >= _MOUNT_SEARCH:
            break
        tag = element.tag
        if element is body or not isinstance(tag, str) or tag in _VOID:
            continue
        empty = len(element) == 0 and not (element.text or "").strip()
        if empty and (element.get("id") or "-" in tag):
            return True
    return False


def _feed_text(element: etree._Element | None) -> str:
    """Text of a feed element; escaped HTML unmarked: Atom's when its type says html
    (Atom's text is text: "Use &lt;b&gt;" says "<b>"), RSS's when it holds any (RSS
    does not say which, and feeds escape their titles twice)."""
    value = _text(element)
    if element is None or not value:
        return value
    if element.tag.startswith(_ATOM):
        if element.get("type") not in ("html", "text/html"):
            return value
    elif "<" not in value and "&" not in value:
        return value
    # An inline element's words run on ("<b>Java</b>Script"), a block's stand apart.
    return html.unescape(_MARKUP.sub(" ", _INLINE_MARKUP.sub("", value)))


_ATOM = "{http://www.w3.org/2005/Atom}"
_INLINE_MARKUP = re.compile(
    r"</?(?:a|abbr|b|bdi|bdo|cite|code|data|del|dfn|em|font|i|ins|kbd|mark|q|s|samp|small"
    r"|span|strike|strong|sub|sup|time|tt|u|var|wbr)(?:\s[^<>]*)?/?>",
    re.IGNORECASE,
)
#: A named character reference outside CDATA (group 1): XML knows five, and a feed's
#: HTML ones ("&eacute;", "&nbsp;") are undefined entities to it, which libxml2 leaves
#: out of the text. A CDATA section is matched whole, and left as it is.
_NAMED_REFERENCE = re.compile(
    r"<!\[CDATA\[.*?(?:\]\]>|\Z)|&(?!(?:amp|lt|gt|quot|apos);)([A-Za-z][A-Za-z0-9]{1,31});",
    re.DOTALL,
)
#: References a feed has rewritten: each costs a call, and a feed of 2 MiB of them would
#: hold its parse thread half a second. Past it, they are left out of the text as before.
MAX_NAMED_REFERENCES = 20_000
#: Each HTML named reference as numbered ones: never expanded by the XML parser, so a
#: feed's own DTD cannot redefine them.
_NUMBERED = {
    name[:-1]: "".join(f"&#{ord(character)};" for character in characters)
    for name, characters in html.entities.html5.items()
    if name.endswith(";")
}


def _numbered(match: re.Match[str]) -> str:
    name = match.group(1)
    return match.group(0) if name is None else _NUMBERED.get(name, match.group(0))
