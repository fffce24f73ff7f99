"""Learning which spellings of a URL name the same page, and rewriting links with it."""

from __future__ import annotations

import hashlib

from trove_schema.aliases import (
    EMPTY,
    AliasLimits,
    Candidate,
    HostAliases,
    Rules,
    observe,
    rewrite,
    undecided,
)
from trove_schema.events import SIGNALS_HASH_PREFIX

SITE = "https://blog.example"


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def fetched(
    record: HostAliases,
    path: str,
    *,
    canonical: str | None = None,
    content: str | None = None,
    links: tuple[str, ...] = (),
    event_id: str = "",
) -> HostAliases:
    return observe(
        record,
        url=SITE + path,
        canonical=SITE + canonical if canonical else None,
        content_hash=digest(content if content is not None else path),
        links=[SITE + link for link in links],
        event_id=event_id,
    )


def test_a_parameter_the_canonical_drops_is_learned_after_two_values() -> None:
    record = fetched(EMPTY, "/p/1?ref=home", canonical="/p/1")
    assert not record.rules()
    record = fetched(record, "/p/2?ref=p1", canonical="/p/2")
    rules = record.rules()
    assert rules.names == {"ref"}
    assert rewrite(rules, SITE + "/p/9?ref=anything") == SITE + "/p/9"
    assert rewrite(rules, SITE + "/p/9?a=1&ref=x&z=2") == SITE + "/p/9?a=1&z=2"


def test_a_parameter_that_names_many_pages_leaves_room_to_learn_another() -> None:
    # A forum's topics: each `?t=` is a page of its own, which the name says once; a
    # record full of its values would learn nothing more about the host.
    record = EMPTY
    for n in range(200):
        record = fetched(record, f"/viewtopic.php?t={n}", canonical=f"/viewtopic.php?t={n}")
    assert len(record.candidates) < 8
    record = fetched(record, "/viewtopic.php?t=1&from=feed", canonical="/viewtopic.php?t=1")
    record = fetched(record, "/viewtopic.php?t=2&from=mail", canonical="/viewtopic.php?t=2")
    rules = record.rules()
    assert rules.names == {"from"}
    assert rewrite(rules, SITE + "/viewtopic.php?t=9&from=x") == SITE + "/viewtopic.php?t=9"


def test_a_parameter_the_canonical_keeps_is_never_dropped() -> None:
    record = fetched(EMPTY, "/list?page=2", canonical="/list?page=2")
    for n in range(3, 8):  # later pages that (wrongly) say they are the first one
        record = fetched(record, f"/list?page={n}", canonical="/list")
    rules = record.rules()
    assert "page" not in rules.names
    assert rewrite(rules, SITE + "/list?page=2") == SITE + "/list?page=2"


def test_page_2_is_never_dropped_when_the_pages_differ() -> None:
    # Every list page claims to be /list, but each lists other posts: the content wins.
    record = fetched(EMPTY, "/list", content="posts 1-5", links=("/list?page=2",))
    for n in range(2, 6):
        record = fetched(record, f"/list?page={n}", canonical="/list", content=f"posts {n}")
    rules = record.rules()
    assert not rules
    assert rewrite(rules, SITE + "/list?page=2") == SITE + "/list?page=2"


def test_two_values_of_a_parameter_that_differ_are_never_dropped_whatever_the_canonical() -> None:
    # A template whose canonical drops the query: ?id=5 and ?id=6 say they are /product,
    # and their content says they are two products.
    record = fetched(EMPTY, "/product?id=5", canonical="/product", content="the fifth")
    record = fetched(record, "/product?id=6", canonical="/product", content="the sixth")
    record = fetched(record, "/product?id=7", canonical="/product", content="the seventh")
    rules = record.rules()
    assert "id" not in rules.names
    assert rewrite(rules, SITE + "/product?id=777") == SITE + "/product?id=777"
    # Values met on different pages only are compared with nothing: ?ref= is learned.
    record = fetched(record, "/a?ref=x", canonical="/a", content="a")
    record = fetched(record, "/b?ref=y", canonical="/b", content="b")
    assert record.rules().names == {"ref"}


def test_two_values_that_differ_are_never_dropped_however_many_fetches_lie_between() -> None:
    # The list's pages all say they are /list; the host's other pages, fetched between
    # them, push the first out of the record's sample of content hashes.
    limits = AliasLimits()
    record = fetched(EMPTY, "/list?page=2", canonical="/list", content="posts 6-10")
    for n in range(limits.max_samples + 5):
        record = fetched(record, f"/posts/{n}?from=list", canonical=f"/posts/{n}?from=list")
    assert all("page=" not in spelling for spelling, _ in record.samples)
    record = fetched(record, "/list?page=3", canonical="/list", content="posts 11-15")
    rules = record.rules()
    assert "page" not in rules.names
    assert rewrite(rules, SITE + "/list?page=4") == SITE + "/list?page=4"
    assert HostAliases.from_json(record.to_json()) == record
    # Two values whose pages say the same are learned as before, samples or none.
    record = fetched(EMPTY, "/a?ref=x", canonical="/a", content="a")
    for n in range(limits.max_samples + 5):
        record = fetched(record, f"/posts/{n}?from=list", canonical=f"/posts/{n}?from=list")
    record = fetched(record, "/a?ref=y", canonical="/a", content="a")
    assert "ref" in record.rules().names


def sid_learned() -> HostAliases:
    """Two articles fetched with ``?sid=`` and without, the same content each."""
    record = EMPTY
    for n in (1, 2):
        record = fetched(record, f"/a/{n}?sid=s{n}", content=f"article {n}")
        record = fetched(record, f"/a/{n}", content=f"article {n}")
    return record


def test_the_same_content_teaches_without_a_canonical() -> None:
    assert sid_learned().rules().names == {"sid"}


def test_a_hash_of_the_other_kind_neither_confirms_nor_contradicts() -> None:
    # Learned from hashes of bytes (the release before); the pages are fetched again
    # and hashed by what they say: a difference of kind is no difference of content.
    record = sid_learned()
    assert record.rules().names == {"sid"}
    for n in (1, 2):
        record = observe(
            record,
            url=f"{SITE}/a/{n}",
            canonical=None,
            content_hash=SIGNALS_HASH_PREFIX + digest(f"article {n}")[:62],
            links=[],
            event_id=f"after-{n}",
        )
    assert record.rules().names == {"sid"}


def test_different_content_contradicts_a_learned_parameter_for_good() -> None:
    record = fetched(EMPTY, "/p/1?v=a", canonical="/p/1")
    record = fetched(record, "/p/2?v=b", canonical="/p/2")
    assert record.rules().names == {"v"}
    record = fetched(record, "/p/3", content="version 1")
    record = fetched(record, "/p/3?v=2", content="version 2")
    assert not record.rules()
    for n in range(4, 10):
        record = fetched(record, f"/p/{n}?v=x{n}", canonical=f"/p/{n}")
    assert not record.rules()


def test_one_value_seen_twice_is_learned_for_that_value_only() -> None:
    record = fetched(EMPTY, "/p/1?from=sidebar", canonical="/p/1")
    record = fetched(record, "/p/2?from=sidebar", canonical="/p/2")
    rules = record.rules()
    assert rules.pairs == {"from=sidebar"}
    assert rewrite(rules, SITE + "/p/5?from=sidebar") == SITE + "/p/5"
    assert rewrite(rules, SITE + "/p/5?from=footer") == SITE + "/p/5?from=footer"


def test_index_file_aliases_are_learned_with_or_without_the_slash() -> None:
    slash = fetched(EMPTY, "/p/1/index.html", canonical="/p/1/")
    slash = fetched(slash, "/p/2/index.html", canonical="/p/2/")
    assert rewrite(slash.rules(), SITE + "/p/7/index.html") == SITE + "/p/7/"
    assert rewrite(slash.rules(), SITE + "/index.html") == SITE + "/"
    assert rewrite(slash.rules(), SITE + "/p/7/index.php") == SITE + "/p/7/index.php"
    bare = fetched(EMPTY, "/docs/index.php", canonical="/docs")
    bare = fetched(bare, "/blog/index.php", canonical="/blog")
    assert rewrite(bare.rules(), SITE + "/x/index.php?ref=1") == SITE + "/x?ref=1"
    assert rewrite(bare.rules(), SITE + "/index.php") == SITE + "/"
    # Nested, as a trap's links are: one rewrite is its own fixed point.
    nested = rewrite(bare.rules(), SITE + "/a/index.php/index.php")
    assert nested == SITE + "/a"
    assert rewrite(bare.rules(), nested) == nested


def test_an_index_file_the_canonical_keeps_is_not_an_alias() -> None:
    record = fetched(EMPTY, "/a/index.html", canonical="/a/index.html")
    record = fetched(record, "/b/index.html", canonical="/b/")
    record = fetched(record, "/c/index.html", canonical="/c/")
    assert not record.rules()


def test_parameters_and_index_names_are_learned_together() -> None:
    record = fetched(EMPTY, "/p/1/index.html?ref=a", canonical="/p/1/")
    record = fetched(record, "/p/2/index.html?ref=b", canonical="/p/2/")
    assert rewrite(record.rules(), SITE + "/p/3/index.html?ref=c") == SITE + "/p/3/"


def test_a_canonical_naming_another_page_or_host_teaches_nothing() -> None:
    record = EMPTY
    for n in range(5):
        record = fetched(record, f"/p/{n}?ref=x{n}", canonical="/")
        record = observe(
            record,
            url=f"{SITE}/q/{n}?tag=y{n}",
            canonical=f"https://other.example/q/{n}",
            content_hash=digest(str(n)),
        )
    assert not record.rules()


def test_a_redelivered_fetch_counts_once() -> None:
    record = fetched(EMPTY, "/p/1?from=a", canonical="/p/1", event_id="event-one-0000000")
    again = fetched(record, "/p/1?from=a", canonical="/p/1", event_id="event-one-0000000")
    assert again is record
    assert not again.rules()


def test_the_record_stays_small_whatever_the_host_sends() -> None:
    limits = AliasLimits()
    record = EMPTY
    for n in range(1000):
        record = observe(
            record,
            url=f"{SITE}/p/{n}?junk{n}=v{n}&" + "x" * 100 + f"=1&ref=r{n}",
            canonical=f"{SITE}/p/{n}",
            content_hash=digest(str(n)),
            event_id=f"event-{n:012d}",
        )
    assert len(record.candidates) <= limits.max_candidates
    assert len(record.samples) <= limits.max_samples
    assert len(record.events) <= limits.max_events
    assert len(record.to_json()) < 20_000
    assert "ref" in record.rules().names


def test_the_record_reads_back_as_written() -> None:
    record = fetched(EMPTY, "/p/1?ref=a", canonical="/p/1")
    record = fetched(record, "/list?page=2", canonical="/list?page=2")
    record = fetched(record, "/p/1/index.html", canonical="/p/1/")
    assert HostAliases.from_json(record.to_json()) == record
    assert HostAliases.from_json(b"not json") == EMPTY
    assert HostAliases.from_json(b'{"c": {"q:x": "bad"}}') == EMPTY


def test_rewrite_leaves_urls_alone_without_rules() -> None:
    url = SITE + "/p/1/index.html?ref=a"
    assert rewrite(Rules(), url) == url
    rules = Rules(names=frozenset({"ref"}))
    assert rewrite(rules, SITE + "/p/1?ref=a") == SITE + "/p/1"
    assert rewrite(rules, SITE + "/p/1?referer=a") == SITE + "/p/1?referer=a"
    assert rewrite(rules, SITE + "/p/1/index.html") == SITE + "/p/1/index.html"


def test_a_host_without_other_spellings_has_no_record() -> None:
    record = EMPTY
    for n in range(10):
        record = fetched(record, f"/p/{n}", canonical=f"/p/{n}", links=(f"/p/{n + 1}",))
    assert record is EMPTY
    assert fetched(EMPTY, "/p/0", links=("/p/1?ref=a",)).samples


def test_what_a_fetch_could_still_teach_is_undecided() -> None:
    record = fetched(EMPTY, "/list?page=2", canonical="/list?page=2")
    record = fetched(record, "/p/1?ref=a", canonical="/p/1")
    assert undecided(record, SITE + "/list?page=3&ref=b&ref=c") == ["q:ref"]
    assert undecided(record, SITE + "/a/index.html?tag=x") == ["q:tag", "i:index.html"]
    assert undecided(record, SITE + "/list?page=3") == []
    assert undecided(record, SITE + "/p/1") == []


def test_a_key_its_fetches_said_nothing_about_is_no_longer_undecided() -> None:
    record = fetched(EMPTY, "/a/1?id=1")
    assert undecided(record, SITE + "/a/3?id=3") == ["q:id"]
    record = fetched(record, "/a/2?id=2")  # no canonical, no other spelling to compare
    assert undecided(record, SITE + "/a/3?id=3") == []
    assert not record.rules()
    assert HostAliases.from_json(record.to_json()) == record


def test_a_full_record_holds_no_link_for_a_name_it_cannot_track() -> None:
    """Self-canonical pages of as many parameters as the record holds fill it with what
    it must keep (each name contradicted); a name it has no room for could never be
    learned, so links that carry it are not held for it (they were, on every page, for
    ever)."""
    limits = AliasLimits()
    record = EMPTY
    for n in range(2 * limits.max_candidates):
        record = fetched(record, f"/list?k{n}=1", canonical=f"/list?k{n}=1")
    assert len(record.candidates) == limits.max_candidates
    assert undecided(record, SITE + "/p/1?ref=a") == []
    assert undecided(record, SITE + "/a/index.html") == []
    record = fetched(record, "/p/1?ref=a", canonical="/p/1")
    record = fetched(record, "/p/2?ref=b", canonical="/p/2")
    assert "ref" not in record.rules().names
    # An index name whose one spelling the record holds, contradicted, and whose other
    # it has no room for: decided too.
    candidates = dict(record.candidates)
    candidates.pop(next(iter(candidates)))
    candidates["i:index.html/"] = Candidate(0, True)
    full = HostAliases(candidates, record.samples, record.events)
    assert undecided(full, SITE + "/a/index.html") == []
