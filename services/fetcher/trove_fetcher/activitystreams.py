"""What the fetcher keeps of an ActivityStreams object: the ``activitypub`` strategy's reading.

Mastodon, Pleroma/Akkoma, GoToSocial, WordPress's ActivityPub plugin and others answer
a post's URL asked for ``application/activity+json`` with the post itself (its content
as HTML, its language, what it replies to, its attachments), where the HTML they send
a browser is often an empty JavaScript shell. The same signals as a page come out: a
title (``name``, else ``summary``, else the start of the text), the language
(``contentMap``'s key or the context's ``@language``, else detected from the text),
keywords, and links: the content's ``<a href>`` (not mentions of accounts, not
hashtags: neither is something the post cites), the attachments, the object's ``url``
(its page for people) and the post it replies to.

A post is read only when it says it is public: addressed (``to``) to the public
collection. One addressed otherwise says nothing and is noindex and nofollow: an
unlisted post (the public only in ``cc``: its author kept it out of timelines and
search), and one for followers or a person, which a server should not have served.
An object that names no addressing at all (a profile, software that leaves it out) is
read as before.

A pure function like ``trove_fetcher.extract``, but a JSON that is not such an object,
or one with fields of the wrong type, raises ``NotActivityStreams`` (a ``ValueError``):
the strategy got something it cannot use, which the audit calls ``wrong_tool``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, cast

from lxml import etree

from trove_fetcher.errors import NotActivityStreams
from trove_fetcher.extract import (
    _NOFOLLOW_RELS,
    Extraction,
    _Links,
    _Page,
    collapse_whitespace,
    parse_fragment,
    visible_text,
    x_robots_directives,
)
from trove_fetcher.language import primary_tag
from trove_schema.events import LinkKind
from trove_schema.media import media_type
from trove_schema.text import storable
from trove_schema.urls import origin_of

#: Media types an ActivityStreams object comes as (``application/json`` from servers
#: that answer the profile-less type).
ACTIVITY_TYPES = frozenset({"application/activity+json", "application/ld+json", "application/json"})
#: The Accept header of the ``activitypub`` strategy (the one ActivityPub prescribes).
ACCEPT = 'application/activity+json, application/ld+json; profile="https://www.w3.org/ns/activitystreams"'
#: A post is a few KB; a JSON past this is not a post.
MAX_BODY_BYTES = 1024 * 1024
#: Characters of a content's HTML parsed (a long article is well under this).
MAX_CONTENT_CHARS = 512 * 1024
#: Attachments, and URLs of one ``url`` field, read (the rest are ignored).
MAX_ITEMS = 100


def _says_no(value: Any) -> bool:
    """An opt-out flag set to false, however an instance spells it."""
    if isinstance(value, bool):
        return value is False
    if isinstance(value, int):
        return value == 0
    return isinstance(value, str) and value.strip().lower() in ("false", "0", "no")


def _says_yes(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value == 1
    return isinstance(value, str) and value.strip().lower() in ("true", "1", "yes")


def opted_out(account: Mapping[str, Any]) -> bool:
    """The account asked not to be indexed or discovered: a Mastodon API account or an
    ActivityPub actor with ``indexable`` or ``discoverable`` false, ``noindex`` true, or
    ``#nobot`` or ``#noindex`` in its bio (``note`` in the API, ``summary`` in AP).
    Pleroma and Akkoma's API says it under ``source.pleroma`` only (their actors at the
    top, as Mastodon does)."""
    source = account.get("source")
    pleroma = source.get("pleroma") if isinstance(source, Mapping) else None
    flags = [account] + ([pleroma] if isinstance(pleroma, Mapping) else [])
    return (
        any(_says_no(f.get("indexable")) or _says_no(f.get("discoverable")) for f in flags)
        or _says_yes(account.get("noindex"))
        or any(_asks_no_bots(account.get(bio)) for bio in ("note", "summary"))
    )


#: The bio's tags that ask crawlers and search engines to stay away. A bio's hashtag is
#: marked up (``#<span>nobot</span>``): the tags are looked for in its text.
_NO_BOTS = re.compile(r"(?<![\w#])#(?:nobot|noindex)(?!\w)", re.IGNORECASE)
#: Not ``[^>]``: in a run of ``<`` without a ``>`` each would scan the next 2,000
#: characters, in one call that holds the GIL (a stranger's bio, a hundred a poll).
_TAG = re.compile(r"<[^<>]{0,2000}>")
#: Tags that end a line or a paragraph: a space where they were, or a tag on a line of its
#: own (Mastodon writes a line break ``<br />``, a blank line ``</p><p>``) would be
#: joined to the word before it ("Oslo#nobot") and not be read.
_BREAK = re.compile(
    r"</?(?:br|p|div|li|ul|ol|h[1-6]|blockquote|pre|hr|table|tr|td|th)\b[^<>]{0,2000}>",
    re.IGNORECASE,
)


def _asks_no_bots(bio: object) -> bool:
    if not isinstance(bio, str):
        return False
    text = _TAG.sub("", _BREAK.sub(" ", bio[:20_000]))
    return _NO_BOTS.search(text) is not None


#: Characters of the text's start used as a title when the object has neither a name
#: nor a summary.
TITLE_FROM_TEXT = 120

#: Objects with content a reader can use, and actors (their profile: a name, a bio).
CONTENT_TYPES = frozenset(
    {
        "Note",
        "Article",
        "Page",
        "Question",
        "Event",
        "Document",
        "Image",
        "Video",
        "Audio",
        "Person",
        "Service",
        "Group",
        "Organization",
        "Application",
    }
)
#: Actors: a profile, whose person may have opted out (``opted_out``).
ACTOR_TYPES = frozenset({"Person", "Service", "Group", "Organization", "Application"})
#: Activities that carry the object they create or share.
_WRAPPERS = frozenset({"Create", "Update", "Announce"})
_AS_PREFIXES = ("https://www.w3.org/ns/activitystreams#", "as:")
_LANGUAGE_TAG = re.compile(r"\A[A-Za-z]{1,8}(?:-[A-Za-z0-9]{1,8})*\Z")
# Mentions link to accounts, hashtags to the server's tag timeline: not citations.
_NOT_CITATIONS = frozenset({"mention", "hashtag"})


def is_parseable(content_type: str | None) -> bool:
    """Whether the response is JSON that may be an ActivityStreams object."""
    return media_type(content_type) in ACTIVITY_TYPES


def extract_activity(
    body: bytes,
    *,
    url: str,
    content_type: str | None = None,
    x_robots_tag: str | None = None,
    robots_token: str = "TroveBot",  # noqa: S107 - a robots.txt token, not a secret
    detect_language: bool = True,
) -> Extraction:
    """The signals of an ActivityStreams object fetched from ``url``.

    Raises ``NotActivityStreams`` when ``body`` is not one, or is malformed.
    """
    if len(body) > MAX_BODY_BYTES:
        raise NotActivityStreams(f"JSON of {len(body)} bytes is over {MAX_BODY_BYTES}")
    try:
        document = json.loads(body)
    except RecursionError as exc:
        raise NotActivityStreams("JSON nested too deeply") from exc
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError included
        raise NotActivityStreams(f"not JSON: {exc}"[:300]) from exc
    item = _content_object(document)
    noindex, nofollow = x_robots_directives(x_robots_tag, robots_token)
    if not _types(item).isdisjoint(ACTOR_TYPES) and opted_out(item):
        # A profile whose person opted out, as their timeline posts are skipped: its
        # name, bio and links stay out of the search.
        noindex = nofollow = True
    if not _public(item, document):
        # Not the author's to the world: nothing of it is kept, not even its start as
        # a title (the timelines skip such posts too).
        page = _Page(url, body, True, True, robots_token, detect_language)
        return page.finish(
            title=None, links=_Links(), canonical_url=None, text="", lang_hint=None, is_feed=False
        )
    page = _Page(url, body, noindex, nofollow, robots_token, detect_language)
    base = _own_id(item, url)

    name = _text_field(item, "name", "nameMap")
    if not collapse_whitespace(name) and not _types(item).isdisjoint(ACTOR_TYPES):
        # A person with no display name is named by their handle, not by their bio.
        name = _string(item, "preferredUsername")
    summary_html = _text_field(item, "summary", "summaryMap")
    content_html = _text_field(item, "content", "contentMap")
    links = _Links()
    summary = _html_text(summary_html, base, links) if summary_html else ""
    content = _html_text(content_html, base, links) if content_html else ""
    text = " ".join(part for part in (summary, content) if part)

    title = collapse_whitespace(name) or collapse_whitespace(summary)
    if title is None and content:
        title = _start_of(content)

    for target in _urls(item.get("url")):
        links.add(base, target, LinkKind.ALTERNATE)
    for target in _urls(item.get("inReplyTo")):
        links.add(base, target, LinkKind.A)
    for target, kind in _attachments(item.get("attachment")):
        links.add(base, target, kind)

    language = _declared_language(item, document)
    return page.finish(
        title=title,
        links=links,
        canonical_url=None,
        text=text,
        lang_hint=None,
        is_feed=False,
        language=language,
    )


def _own_id(item: Mapping[str, object], url: str) -> str:
    """What the object's relative links are resolved against: its ``id`` when that is on
    the origin it was fetched from, else that URL (an object can name any host its id)."""
    declared = _string(item, "id")
    if declared:
        try:
            if origin_of(declared).lower() == origin_of(url).lower():
                return declared
        except ValueError:
            pass
    return url


#: The public collection, as servers write it in ``to`` and ``cc``.
_PUBLIC = frozenset({"https://www.w3.org/ns/activitystreams#Public", "as:Public", "Public"})


def _public(item: Mapping[str, object], document: Mapping[str, object]) -> bool:
    """Whether the object (or the activity that carries it, when it names no audience
    of its own) is addressed to the public in ``to``; True when neither names any."""
    for addressed in (item, document):
        to, cc = _audience(addressed.get("to")), _audience(addressed.get("cc"))
        if to or cc:
            return not _PUBLIC.isdisjoint(to)
    return True


#: An addressee named neither by a string nor by an object's id: someone, not the public.
_UNNAMED = ""


def _audience(value: object) -> set[str]:
    """Who ``to`` or ``cc`` names: ids, as strings or as the ``id`` (or a Link's
    ``href``) of an object, as ActivityStreams allows either; anything else there is
    an addressee not known to be the public."""
    values = value if isinstance(value, list) else [value]
    named: set[str] = set()
    for entry in values[:MAX_ITEMS]:
        if isinstance(entry, dict):
            ids = [entry.get("id"), entry.get("href")]
            entry = next((i for i in ids if isinstance(i, str)), _UNNAMED)
        if isinstance(entry, str):
            named.add(entry)
        elif entry is not None:
            named.add(_UNNAMED)
    return named


def _content_object(document: object) -> Mapping[str, object]:
    if not isinstance(document, dict):
        raise NotActivityStreams("not a JSON object")
    types = _types(document)
    if not types.isdisjoint(_WRAPPERS):
        inner = document.get("object")
        if not isinstance(inner, dict):
            raise NotActivityStreams("an activity without an embedded object")
        document = inner
        types = _types(document)
    if types.isdisjoint(CONTENT_TYPES):
        shown = ", ".join(sorted(types))[:100] or "none"
        raise NotActivityStreams(f"not an ActivityStreams object with content (type {shown})")
    return cast("Mapping[str, object]", document)


def _types(item: Mapping[str, object]) -> set[str]:
    raw = item.get("type")
    values = raw if isinstance(raw, list) else [raw]
    if not values or not all(isinstance(value, str) for value in values[:MAX_ITEMS]):
        raise NotActivityStreams("the object's type is not a string or a list of strings")
    found = set()
    for value in cast("list[str]", values[:MAX_ITEMS]):
        for prefix in _AS_PREFIXES:
            value = value.removeprefix(prefix)
        found.add(value)
    return found


def _string(item: Mapping[str, object], key: str) -> str | None:
    value = item.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise NotActivityStreams(f"{key} is not a string")
    return value


def _text_field(item: Mapping[str, object], key: str, map_key: str) -> str | None:
    """A natural-language field: the plain value, else the first of its language map."""
    value = _string(item, key)
    if value:
        return _bounded(value, key)
    mapped = _language_map(item, map_key)
    for text in mapped.values():
        if text:
            return _bounded(text, map_key)
    return None


def _language_map(item: Mapping[str, object], key: str) -> dict[str, str]:
    value = item.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise NotActivityStreams(f"{key} is not a map of strings")
    return cast("dict[str, str]", value)


def _bounded(value: str, key: str) -> str:
    if len(value) > MAX_CONTENT_CHARS:
        raise NotActivityStreams(f"{key} of {len(value)} characters")
    # JSON's "\ud800" is a lone surrogate, which the language detector (and UTF-8)
    # refuses: marked, as every text an event carries is.
    return storable(value)


def _declared_language(item: Mapping[str, object], document: Mapping[str, object]) -> str | None:
    """The language the object states: its contentMap's key (the one whose text is the
    content, when there are several), else the context's ``@language``."""
    mapped = _language_map(item, "contentMap")
    if mapped:
        content = item.get("content")
        chosen = next((k for k, v in mapped.items() if v == content), next(iter(mapped)))
        tag = _language_tag(chosen)
        if tag is not None:
            return tag
    for holder in (item, document):
        context = holder.get("@context")
        entries = context if isinstance(context, list) else [context]
        for entry in entries[:MAX_ITEMS]:
            if isinstance(entry, dict):
                value = entry.get("@language")
                if isinstance(value, str) and (tag := _language_tag(value)) is not None:
                    return tag
    return None


def _language_tag(value: str) -> str | None:
    """The primary subtag, as HTML pages' languages are recorded ("de-AT" -> "de"); None
    for ``und`` and anything that is not a tag."""
    if len(value) > 35 or not _LANGUAGE_TAG.match(value):
        return None
    return primary_tag(value)


def _urls(value: object) -> Iterator[str]:
    """URLs of a field that holds a URL, a Link or object (``href`` or ``id``), or a list."""
    values = value if isinstance(value, list) else [value]
    for entry in values[:MAX_ITEMS]:
        if entry is None:
            continue
        if isinstance(entry, str):
            yield entry
        elif isinstance(entry, dict):
            target = entry.get("href", entry.get("id"))
            if target is None:
                continue
            if not isinstance(target, str):
                raise NotActivityStreams("a link's href is not a string")
            yield target
        else:
            raise NotActivityStreams("a URL field holds neither a string nor an object")


def _attachments(value: object) -> Iterator[tuple[str, LinkKind]]:
    values = value if isinstance(value, list) else [value]
    for entry in values[:MAX_ITEMS]:
        if entry is None:
            continue
        if isinstance(entry, str):
            yield entry, LinkKind.OTHER
            continue
        if not isinstance(entry, dict):
            raise NotActivityStreams("an attachment is neither a URL nor an object")
        declared = entry.get("mediaType")
        kind = media_type(declared) if isinstance(declared, str) else None
        image = kind is not None and kind.startswith("image/")
        link_kind = LinkKind.IMG if image else LinkKind.OTHER
        # A PropertyValue (a profile's field) holds its link in HTML, not as a URL.
        for target in _urls(entry.get("url", entry.get("href"))):
            yield target, link_kind


def _html_text(fragment: str, base: str, links: _Links) -> str:
    """The text of an HTML fragment, its citations added to ``links``."""
    root = parse_fragment(fragment)
    if root is None:
        return ""
    for anchor in root.iter("a"):
        rel = set((anchor.get("rel") or "").lower().split())
        classes = set((anchor.get("class") or "").lower().split())
        if "tag" in rel or not classes.isdisjoint(_NOT_CITATIONS):
            continue
        links.add(base, anchor.get("href"), LinkKind.A, not rel.isdisjoint(_NOFOLLOW_RELS))
    etree.strip_elements(root, "script", "style", "template", with_tail=False)
    # A mention's "@<span>bob</span>" is "@bob".
    return " ".join(visible_text(root).split())


def _start_of(text: str) -> str | None:
    if len(text) <= TITLE_FROM_TEXT:
        return collapse_whitespace(text)
    cut = text[:TITLE_FROM_TEXT]
    space = cut.rfind(" ")
    if space > TITLE_FROM_TEXT // 2:
        cut = cut[:space]
    return collapse_whitespace(cut.rstrip(",;:.-") + "…")
