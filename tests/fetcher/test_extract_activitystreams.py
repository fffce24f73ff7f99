"""ActivityStreams objects give the signals of a page; anything else is a ValueError."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trove_fetcher.activitystreams import (
    MAX_BODY_BYTES,
    extract_activity,
    is_parseable,
    opted_out,
)
from trove_fetcher.errors import NotActivityStreams
from trove_fetcher.extract import Extraction
from trove_schema.events import LinkKind

URL = "https://social.example/@ana/1102"
CONTEXT = "https://www.w3.org/ns/activitystreams"

CONTENT = (
    '<p>Bonjour <span class="h-card"><a href="https://social.example/@bob" '
    'class="u-url mention">@<span>bob</span></a></span>, voici un article sur les jardins '
    'partagés de notre quartier : <a href="https://blog.example/jardins" target="_blank" '
    'rel="nofollow noopener noreferrer">blog.example/jardins</a></p><p>'
    '<a href="https://social.example/tags/jardin" class="mention hashtag" rel="tag">'
    "#<span>jardin</span></a></p>"
)


def note(**fields: Any) -> dict[str, Any]:
    """A post as Mastodon serves it (trimmed)."""
    value: dict[str, Any] = {
        "@context": [CONTEXT, {"sensitive": "as:sensitive"}],
        "id": "https://social.example/users/ana/statuses/1102",
        "type": "Note",
        "summary": None,
        "inReplyTo": "https://other.example/notes/77",
        "published": "2026-11-20T09:30:00Z",
        "url": URL,
        "attributedTo": "https://social.example/users/ana",
        "to": [f"{CONTEXT}#Public"],
        "content": CONTENT,
        "contentMap": {"fr": CONTENT},
        "attachment": [
            {
                "type": "Document",
                "mediaType": "image/jpeg",
                "url": "https://files.social.example/media/1.jpg",
                "name": "Des tomates",
            }
        ],
        "tag": [
            {"type": "Mention", "href": "https://social.example/users/bob", "name": "@bob"},
            {"type": "Hashtag", "href": "https://social.example/tags/jardin", "name": "#jardin"},
        ],
    }
    value.update(fields)
    return value


def read(document: object, **kwargs: Any) -> Extraction:
    body = document if isinstance(document, bytes) else json.dumps(document).encode()
    return extract_activity(body, url=URL, content_type="application/activity+json", **kwargs)


def test_a_post_gives_its_text_language_keywords_and_citations() -> None:
    found = read(note())
    assert found.title is not None
    assert found.title.startswith("Bonjour @bob, voici un article sur les jardins")
    assert found.language == "fr"
    assert {"jardins", "partagés", "quartier"} <= set(found.keywords)
    links = {(link.url, link.kind, link.nofollow) for link in found.links}
    assert links == {
        ("https://blog.example/jardins", LinkKind.A, True),
        (URL, LinkKind.ALTERNATE, False),
        ("https://other.example/notes/77", LinkKind.A, False),
        ("https://files.social.example/media/1.jpg", LinkKind.IMG, False),
    }
    assert found.text_chars is not None
    assert found.text_chars > 50
    assert not found.shell


def test_mentions_and_hashtags_are_not_links() -> None:
    urls = {link.url for link in read(note()).links}
    assert "https://social.example/@bob" not in urls
    assert "https://social.example/tags/jardin" not in urls


def test_a_create_activity_is_read_for_the_object_it_wraps() -> None:
    wrapped = {
        "@context": CONTEXT,
        "type": "Create",
        "actor": "https://social.example/users/ana",
        "object": note(),
    }
    inner = read(note())
    assert replace(read(wrapped), content_hash=inner.content_hash) == inner


FOLLOWERS = "https://social.example/users/ana/followers"


@pytest.mark.parametrize(
    "addressed",
    [
        {"to": [FOLLOWERS], "cc": [f"{CONTEXT}#Public"]},  # unlisted
        {"to": [FOLLOWERS]},  # followers only
        {"to": ["https://social.example/users/bob"], "cc": []},  # a direct message
        {"to": "https://social.example/users/bob"},
        # ActivityStreams lets an addressee be an object or a link, not only its id.
        {"to": [{"type": "Link", "href": FOLLOWERS}], "cc": []},
        {"to": [{"type": "Collection", "id": FOLLOWERS}]},
        {"to": [{"type": "Collection"}]},
    ],
    ids=["unlisted", "followers", "direct", "one-string", "a-link", "an-object", "unnamed"],
)
def test_a_post_its_author_did_not_make_public_says_nothing(addressed: dict[str, Any]) -> None:
    """Kept out of timelines and search by its author (or served by a server that
    should not have): noindex, nofollow, no title from its text, no links."""
    for document in (
        note(**addressed),
        {"@context": CONTEXT, "type": "Create", **addressed, "object": note(to=None, cc=None)},
    ):
        result = read(document)
        assert (result.noindex, result.nofollow) == (True, True)
        assert (result.title, result.keywords, result.links) == (None, (), ())
    public = read(note(to="as:Public", cc=[FOLLOWERS]))
    assert (public.noindex, public.title is not None) == (False, True)
    linked = read(note(to=[{"type": "Link", "href": "as:Public"}], cc=[{"id": FOLLOWERS}]))
    assert (linked.noindex, linked.title is not None) == (False, True)


def test_the_title_is_the_name_then_the_summary_then_the_start_of_the_text() -> None:
    article = note(type="Article", name="Les jardins de Belleville", summary="<p>Un résumé</p>")
    assert read(article).title == "Les jardins de Belleville"
    warned = note(summary="Politique locale")
    assert read(warned).title == "Politique locale"
    long = "mot " * 200
    found = read(note(content=f"<p>{long}</p>", contentMap=None))
    assert found.title is not None
    assert found.title.endswith("…")
    assert len(found.title) <= 121


def test_a_lone_surrogate_in_a_name_or_the_content_is_marked_not_a_failed_read() -> None:
    # json.dumps writes the surrogate as the escape "\\ud800", as a hostile server would.
    found = read(note(name="Les jardins \ud800 de Belleville", content="<p>Un \udfff jardin</p>"))
    assert found.title is not None
    assert found.title.startswith("Les jardins ")
    assert "\ud800" not in found.title
    assert found.language is not None


def test_the_language_comes_from_the_context_when_there_is_no_content_map() -> None:
    article = note(contentMap=None, **{"@context": [CONTEXT, {"@language": "de-AT"}]})
    assert read(article).language == "de"  # the primary subtag, as for pages


def test_the_language_is_detected_when_the_object_does_not_say() -> None:
    text = (
        "<p>The community garden on our street opened this spring, and every weekend "
        "neighbours bring seedlings, tools and stories to share.</p>"
    )
    found = read(note(content=text, contentMap=None))
    assert found.language == "en"


def test_a_content_map_alone_gives_the_content() -> None:
    found = read(note(content=None, contentMap={"it": "<p>Il giardino comune</p>"}))
    assert found.title == "Il giardino comune"
    assert found.language == "it"


PERSON = {
    "@context": CONTEXT,
    "type": "Person",
    "id": "https://social.example/users/ana",
    "name": "Ana",
    "summary": '<p>Gardener. <a href="https://ana.example/">ana.example</a></p>',
}


def test_a_question_and_a_profile_are_content_too() -> None:
    poll = note(type="Question", content="<p>Tomatoes or beans?</p>", contentMap=None)
    assert read(poll).title == "Tomatoes or beans?"
    found = read(PERSON | {"url": "https://social.example/@ana"})
    assert found.title == "Ana"
    unnamed = PERSON | {"name": " ", "preferredUsername": "ana"}
    assert read(unnamed).title == "ana"  # not the bio
    assert {link.url for link in found.links} == {
        "https://ana.example/",
        "https://social.example/@ana",
    }


def test_relative_links_resolve_against_the_objects_id_only_on_its_own_origin() -> None:
    content = '<p><a href="/about">about</a></p>'
    own = read(note(content=content, contentMap=None))
    assert "https://social.example/about" in {link.url for link in own.links}
    elsewhere = read(note(id="https://victim.example/notes/1", content=content, contentMap=None))
    urls = {link.url for link in elsewhere.links}
    assert "https://social.example/about" in urls
    assert not any(u.startswith("https://victim.example") for u in urls), urls


BIO_NOBOT = (
    '<p>Gardener. <a href="https://social.example/tags/nobot" class="mention hashtag" '
    'rel="tag">#<span>nobot</span></a></p>'
)


@pytest.mark.parametrize(
    "opt_out",
    [{"indexable": False}, {"discoverable": False}, {"summary": BIO_NOBOT}],
    ids=["indexable false", "discoverable false", "#nobot in the bio"],
)
def test_a_profile_whose_person_opted_out_is_noindex_and_nofollow(opt_out: dict[str, Any]) -> None:
    person = PERSON | {"indexable": True, "discoverable": True}
    assert not read(person).noindex
    found = read(person | opt_out)
    assert found.noindex
    assert found.nofollow
    assert found.keywords == ()
    # A post of theirs is read as a post: the timeline's poll is what skips it.
    assert not read(note(indexable=False)).noindex


def test_a_pleroma_or_akkoma_account_opts_out_under_its_source() -> None:
    # Their client API has no top-level flags: `source.pleroma`, for every account.
    def account(**pleroma: object) -> dict[str, object]:
        return {"acct": "ana", "note": "", "source": {"note": "", "pleroma": pleroma}}

    assert opted_out(account(discoverable=False, indexable=True))
    assert opted_out(account(discoverable=True, indexable=False))
    assert not opted_out(account(discoverable=True, indexable=True))
    assert not opted_out(account(discoverable=True))  # an older Pleroma: no indexable
    assert not opted_out({"acct": "ana", "source": "junk"})
    assert not opted_out({"acct": "ana", "source": {"pleroma": ["junk"]}})


def test_only_the_bios_own_no_bot_tags_opt_out() -> None:
    assert opted_out({"note": BIO_NOBOT})
    # On a line or in a paragraph of its own, as people write it.
    tag = BIO_NOBOT.removeprefix("<p>Gardener. ")
    assert opted_out({"note": f"<p>Birdwatcher in Oslo<br />{tag}"})
    assert opted_out({"note": f"<p>Birdwatcher in Oslo</p><p>{tag}"})
    assert opted_out({"note": "<p>#NoIndex please</p>"})
    assert not opted_out({"note": "<p>I study #nobotany and #noindexing</p>"})
    assert not opted_out({"note": "<p>mail me: ana#nobot@example.org</p>"})
    assert not opted_out({"note": None, "summary": 7})


def test_a_link_object_url_and_a_list_of_attachments_are_read() -> None:
    found = read(
        note(
            url=[
                {
                    "type": "Link",
                    "href": "https://social.example/@ana/1102",
                    "mediaType": "text/html",
                }
            ],
            attachment={
                "type": "Document",
                "mediaType": "video/mp4",
                "url": "https://f.example/v.mp4",
            },
            inReplyTo=None,
        )
    )
    kinds = {link.url: link.kind for link in found.links}
    assert kinds["https://f.example/v.mp4"] is LinkKind.OTHER
    assert kinds[URL] is LinkKind.ALTERNATE


def test_noindex_keeps_no_keywords_and_nofollow_marks_every_link() -> None:
    found = read(note(), x_robots_tag="noindex, nofollow")
    assert found.keywords == ()
    assert found.noindex
    assert found.nofollow
    assert all(link.nofollow for link in found.links)


def test_only_json_types_are_parseable() -> None:
    assert is_parseable("application/activity+json; charset=utf-8")
    assert is_parseable('application/ld+json; profile="https://www.w3.org/ns/activitystreams"')
    assert is_parseable("application/json")
    assert not is_parseable("text/html")
    assert not is_parseable(None)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"<html><body>not json</body></html>",
        b"{]",
        b"\xff\xfe\x00garbage",
        b"[1, 2, 3]",
        b'"a string"',
        b"{}",
        json.dumps({"type": "OrderedCollection", "totalItems": 3}).encode(),
        json.dumps({"type": "Create", "object": "https://social.example/notes/1"}).encode(),
        json.dumps({"type": 5}).encode(),
        json.dumps({"type": []}).encode(),
        json.dumps(note(content=5)).encode(),
        json.dumps(note(content=None, contentMap=["fr", "x"])).encode(),
        json.dumps(note(contentMap={"fr": 3})).encode(),
        json.dumps(note(url=7)).encode(),
        json.dumps(note(url={"href": ["a"]})).encode(),
        json.dumps(note(attachment=[3])).encode(),
        json.dumps(note(name={"a": 1})).encode(),
        json.dumps(note(content="x" * (600 * 1024))).encode(),
        b"[" * 200_000 + b"]" * 200_000,
        b'{"type": "Note", "content": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b"1" * 10_000,
        b" " * (MAX_BODY_BYTES + 1),
    ],
)
def test_hostile_or_malformed_json_is_a_value_error(body: bytes) -> None:
    with pytest.raises(NotActivityStreams) as raised:
        read(body, detect_language=False)
    assert isinstance(raised.value, ValueError)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
_FIELDS = st.sampled_from(
    ["type", "content", "contentMap", "name", "summary", "url", "inReplyTo", "attachment",
     "object", "@context", "id", "nameMap", "summaryMap"]
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=st.sampled_from(["Note", "Create", "Person", "Article"]),
    fields=st.dictionaries(_FIELDS, _JSON, max_size=6),
)
def test_any_json_gives_an_extraction_or_a_value_error(base: str, fields: dict[str, Any]) -> None:
    document: dict[str, Any] = {"type": base, "content": "<p>x</p>"}
    if base == "Create":
        document["object"] = {"type": "Note", "content": "<p>y</p>"}
    document.update(fields)
    try:
        found = read(document, detect_language=False)
    except ValueError:
        return
    assert isinstance(found, Extraction)
