"""Learning which spellings of a URL name the same page, and rewriting links with it."""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trove_schema.aliases import (
    EMPTY,
    PAIR_HEAD_START,
    AliasLimits,
    Candidate,
    HostAliases,
    Rules,
    observe,
    rewrite,
    undecided,
    untaught,
)
from trove_schema.events import SIGNALS_HASH_PREFIX, comparable_hashes, pages_told_apart

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
    # Two values whose pages say the same, the page without them once shown equal, are
    # learned as before, samples or none.
    record = fetched(EMPTY, "/a", content="a", links=("/a?ref=x",))
    record = fetched(record, "/a?ref=x", canonical="/a", content="a")
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


def test_the_signals_of_the_releases_whose_text_ran_words_apart_tell_no_page_apart() -> None:
    """``s:`` hashed a page's text with an inline element's words run apart: the same
    page is another ``s:`` than its hash now, and a page of little text's ``m:`` may be
    the same page as one of those."""
    now, before, markup = SIGNALS_HASH_PREFIX + "ab", "s:cd", "m:ef"
    assert not comparable_hashes(before, now)
    assert pages_told_apart(before, now) is None
    assert pages_told_apart(before, markup) is None
    assert pages_told_apart(now, markup) is True
    assert pages_told_apart(now, SIGNALS_HASH_PREFIX + "ab") is False


def hashed(record: HostAliases, path: str, kind: str, content: str, **seen: object) -> HostAliases:
    """``path`` fetched, its page hashed by what it says (``SIGNALS_HASH_PREFIX``) or,
    saying too little, by its markup (``m:``)."""
    seen.setdefault("canonical", None)
    return observe(
        record,
        url=SITE + path,
        content_hash=kind + digest(content)[:62],
        **seen,  # type: ignore[arg-type]
    )


def test_two_values_hashed_by_text_and_by_markup_are_two_pages() -> None:
    # A template whose canonical drops the query: a long post and a photo with a caption.
    # Either hash kind decides nothing alone; one of each is two pages all the same.
    record = hashed(
        EMPTY, "/post?id=5", SIGNALS_HASH_PREFIX, "a long post", canonical=SITE + "/post"
    )
    record = hashed(record, "/post?id=6", "m:", "a photo", canonical=SITE + "/post")
    assert not record.rules()
    assert rewrite(record.rules(), SITE + "/post?id=7") == SITE + "/post?id=7"


def test_a_rule_learned_on_short_pages_is_unlearned_by_a_long_one() -> None:
    # The page without ?id= and two dead ids are one short "not found" page: ?id= is
    # learned. Real posts are long and have no canonical: the first one probed takes
    # the rule back, though its hash is of the other kind.
    record = hashed(EMPTY, "/post", "m:", "not found", links=(SITE + "/post?id=999",))
    record = hashed(record, "/post?id=999", "m:", "not found", event_id="d1")
    record = hashed(record, "/post?id=998", "m:", "not found", event_id="d2")
    assert record.rules().names == {"id"}
    for n in range(2000):
        if not record.rules():
            break
        probe = next(iter(record.rules().probes), None)
        if probe is not None:
            path = probe.removeprefix(SITE)
            record = hashed(
                record, path, SIGNALS_HASH_PREFIX, f"post {path}", event_id=f"probe-{n}"
            )
        else:
            record = hashed(
                record,
                f"/page/{n}",
                SIGNALS_HASH_PREFIX,
                f"page {n}",
                links=(SITE + f"/post?id={n}",),
                event_id=f"page-{n}",
            )
    assert not record.rules()


@pytest.mark.parametrize("home_sampled", [False, True], ids=["home forgotten", "home sampled"])
def test_a_rule_proven_on_a_page_that_changed_since_holds_through_its_probe(
    home_sampled: bool,
) -> None:
    # ?ref= learned on the home page, which then shows the next post. Its probe comes
    # back showing the home page as it is now: the same page, whether the sample holds
    # the home page as it is now or no longer holds it at all.
    record = hashed(EMPTY, "/", SIGNALS_HASH_PREFIX, "posts 1-10", links=(SITE + "/?ref=nav",))
    record = hashed(record, "/?ref=nav", SIGNALS_HASH_PREFIX, "posts 1-10", event_id="nav")
    record = hashed(record, "/?ref=footer", SIGNALS_HASH_PREFIX, "posts 1-10", event_id="footer")
    assert record.rules().names == {"ref"}
    probe = None
    for n in range(3000):
        links = (SITE + "/?ref=logo", SITE + f"/post/{n + 1}")
        if home_sampled and n % 8 == 0:
            record = hashed(
                record, "/", SIGNALS_HASH_PREFIX, "posts 2-11", links=links, event_id=f"home-{n}"
            )
        else:
            record = hashed(
                record,
                f"/post/{n}",
                SIGNALS_HASH_PREFIX,
                f"post {n}",
                links=links,
                event_id=f"post-{n}",
            )
        if record.rules().probes:
            probe = next(iter(record.rules().probes))
            break
    assert probe == SITE + "/?ref=logo"
    assert ("/" in dict(record.samples)) is home_sampled
    record = hashed(record, "/?ref=logo", SIGNALS_HASH_PREFIX, "posts 2-11", event_id="probe")
    assert record.rules().names == {"ref"}


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
    assert record.marks
    assert HostAliases.from_json(record.to_json()) == record
    # A release before reads the samples as pairs, and the marks not at all: the record
    # it reads is this one without them, and one it wrote reads here the same way.
    body = json.loads(record.to_json())
    assert all(len(sample) == 2 for sample in body["s"])
    del body["m"]
    assert HostAliases.from_json(json.dumps(body).encode()) == replace(record, marks={})
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


def test_the_page_fetched_again_without_the_value_leaves_its_name_undecided() -> None:
    # A probe, then the page under its own spelling, found on a list: one value still,
    # so the next page's `?ref=` waits for a second probe instead of going out unlearned.
    record = fetched(EMPTY, "/p/1/?ref=p0", canonical="/p/1/", content="post 1")
    record = fetched(record, "/p/1/", canonical="/p/1/", content="post 1")
    assert not record.rules().names
    assert undecided(record, SITE + "/p/2/?ref=p1") == ["q:ref"]
    record = fetched(record, "/p/2/?ref=p1", canonical="/p/2/", content="post 2")
    assert record.rules().names == {"ref"}


def test_a_page_fetched_before_its_page_without_the_value_counts_once() -> None:
    # Without a canonical the probe says nothing until its page without the value is
    # fetched: that fetch is the probe's word, not a second one.
    record = fetched(EMPTY, "/p/1/?ref=p0", content="post 1")
    record = fetched(record, "/p/1/", content="post 1")
    assert not record.rules().names
    assert undecided(record, SITE + "/p/2/?ref=p1") == ["q:ref"]
    record = fetched(record, "/p/2/?ref=p1", content="post 2")
    record = fetched(record, "/p/2/", content="post 2")
    assert record.rules().names == {"ref"}
    record = fetched(EMPTY, "/a/index.html", content="a")
    record = fetched(record, "/a/", content="a")
    assert not record.rules().index
    assert undecided(record, SITE + "/b/index.html") == ["i:index.html"]
    record = fetched(record, "/b/index.html", content="b")
    record = fetched(record, "/b/", content="b")
    assert record.rules().index == {"index.html/"}


def test_one_page_is_one_confirmation_whatever_else_says_the_same() -> None:
    # Its canonical, then its page without the value: one product page teaches no
    # `?tab=overview` for the whole host, nor one directory an index name.
    record = fetched(EMPTY, "/product/1?tab=overview", canonical="/product/1", content="lamp")
    record = fetched(record, "/product/1", canonical="/product/1", content="lamp")
    assert not record.rules()
    assert rewrite(record.rules(), SITE + "/account?tab=overview") == (
        SITE + "/account?tab=overview"
    )
    record = fetched(EMPTY, "/a/index.html", canonical="/a/", content="a")
    record = fetched(record, "/a/", content="a")
    assert not record.rules().index
    # Fetched again (a re-crawl, another event): still the one page.
    record = fetched(EMPTY, "/p/1/?ref=p0", canonical="/p/1/", event_id="e1")
    record = fetched(record, "/p/1/?ref=p0", canonical="/p/1/", event_id="e2")
    assert not record.rules()
    assert undecided(record, SITE + "/p/2/?ref=p1") == ["q:ref"]


def test_one_page_under_two_spellings_is_one_confirmation() -> None:
    record = fetched(EMPTY, "/product/1?tab=overview", canonical="/product/1", content="lamp")
    record = fetched(
        record, "/product/1?tab=overview&from=home", canonical="/product/1", content="lamp"
    )
    assert "tab=overview" not in record.rules().pairs
    assert "q:tab" in undecided(record, SITE + "/product/2?tab=specs")
    # Nor one directory, with its slash and without, an index name.
    record = fetched(EMPTY, "/a/index.html", content="a")
    record = fetched(record, "/a/", content="a")
    record = fetched(record, "/a", content="a")
    assert not record.rules().index


def test_a_page_that_changed_is_still_the_one_page() -> None:
    # Re-crawled with another price while its spelling is still sampled: no second page.
    record = fetched(EMPTY, "/product/1?tab=overview", canonical="/product/1", content="20 EUR")
    for n in range(5):
        record = fetched(record, f"/p/{n}", content=f"post {n}")
    record = fetched(record, "/product/1?tab=overview", canonical="/product/1", content="18 EUR")
    assert "tab=overview" not in record.rules().pairs
    assert "q:tab" in undecided(record, SITE + "/product/2?tab=specs")


def test_a_page_counted_once_says_nothing_more_by_saying_nothing_again() -> None:
    # ?ref=p0 shown to be /p/1/, then fetched again once /p/1/ left the sample: nothing
    # to compare, but no silent fetch of the name on top of its confirmation.
    record = fetched(EMPTY, "/p/1/", content="post 1", links=("/p/2/?ref=p1",))
    record = fetched(record, "/p/1/?ref=p0", content="post 1")
    for n in range(AliasLimits().max_samples - 1):
        record = fetched(record, f"/q/{n}?from=list", canonical=f"/q/{n}?from=list")
    assert [s for s, _ in record.samples if s.startswith("/p/1/")] == ["/p/1/?ref=p0"]
    record = fetched(record, "/p/1/?ref=p0", content="post 1", event_id="again")
    assert undecided(record, SITE + "/p/2/?ref=p1") == ["q:ref"]


def test_a_page_keeps_a_few_marks_whatever_spellings_it_is_fetched_under() -> None:
    # An events calendar: every day's page says "no events", under its own date.
    record = EMPTY
    for day in range(500):
        record = fetched(record, f"/events?date={day}", content="no events")
    assert max(len(keys) for keys in record.marks.values()) <= 8
    assert len(record.to_json()) < 8_000


def test_a_probe_of_a_page_counted_already_is_owed_back() -> None:
    # Its name was counted by the page under another spelling: the probe taught nothing.
    before = fetched(EMPTY, "/product/1?tab=overview", canonical="/product/1", content="lamp")
    url = "/product/1?tab=overview&from=home"
    after = fetched(before, url, canonical="/product/1", content="lamp")
    assert "q:tab" in untaught(before, after, SITE + url)


def test_two_directories_answering_with_the_slash_and_without_teach_both() -> None:
    record = EMPTY
    for directory in ("a", "b"):
        for path in (f"/{directory}/", f"/{directory}", f"/{directory}/index.html"):
            record = fetched(record, path, content=directory, links=("/x/index.html",))
    assert record.rules().index == {"index.html/", "index.html"}


def test_values_that_all_show_one_page_with_nothing_to_compare_decide_their_name() -> None:
    # A shop's withdrawn items, each "Product not found", no canonical, the page without
    # the parameter never fetched: each value is a fetch that said nothing, and the name
    # is decided, unlearned, instead of holding every page's links for ever.
    record = EMPTY
    for n in range(101, 105):
        record = fetched(record, f"/item?id={n}", content="Product not found")
    assert undecided(record, SITE + "/item?id=7") == []
    assert not record.rules()


def test_a_long_value_marks_its_page_as_its_name_tracks_it() -> None:
    token = "x" * 140
    record = fetched(EMPTY, f"/p/1?next={token}", canonical="/p/1", content="one")
    record = fetched(record, "/p/2", content="two", links=("/p/2?next=a",))
    record = fetched(record, f"/p/1?next={token}", canonical="/p/1", content="one")
    assert undecided(record, SITE + "/p/2?next=a") == ["q:next"]


def test_an_index_name_whose_slash_style_is_contradicted_is_decided_in_time() -> None:
    # /docs/ lists the manuals, /docs/index.html is one: the slash style is wrong here,
    # and later directories' fetches of index.html count on the other, so the name is
    # decided rather than holding every page's index.html links for ever.
    record = fetched(EMPTY, "/docs/", content="listing", links=("/docs/index.html",))
    record = fetched(record, "/docs/index.html", content="manual")
    assert record.candidates["i:index.html/"].contradicted
    for n in range(3):
        record = fetched(record, f"/s{n}/index.html", content=f"s{n}")
        record = fetched(record, f"/s{n}/", content=f"s{n}")
    assert undecided(record, SITE + "/z/index.html") == []
    assert rewrite(record.rules(), SITE + "/z/index.html") == SITE + "/z/index.html"
    # One directory's page fetched again says no more of it than once.
    record = fetched(EMPTY, "/docs/", content="listing", links=("/docs/index.html",))
    record = fetched(record, "/docs/index.html", content="manual")
    for _ in range(2):
        record = fetched(record, "/a/index.html", canonical="/a/", content="a")
    assert undecided(record, SITE + "/z/index.html") == ["i:index.html"]


def test_a_value_shown_to_be_another_pages_keeps_that_pages_proof() -> None:
    # `?lang=` changes the page though the canonical drops it: /p/7/ in English, then
    # in German, with /p/1/ shown equal to its English spelling in between. The proof
    # that /p/7/'s English is /p/7/'s own stays, and German contradicts the name.
    record = fetched(EMPTY, "/p/7/?lang=en", canonical="/p/7/", content="seven en")
    record = fetched(record, "/p/1/?lang=en", canonical="/p/1/", content="one en")
    record = fetched(record, "/p/1/", content="one en")
    for n in range(AliasLimits().max_samples + 1):
        record = fetched(record, f"/q/{n}?from=list", canonical=f"/q/{n}?from=list")
    record = fetched(record, "/p/7/?lang=de", canonical="/p/7/", content="seven de")
    assert record.candidates["q:lang"].contradicted
    assert rewrite(record.rules(), SITE + "/p/3/?lang=fr") == SITE + "/p/3/?lang=fr"


def test_a_value_that_echoed_is_one_of_its_own_once_shown_to_be_the_page_without_it() -> None:
    # Whichever order `?ref=a`, `?ref=latest` and the page itself come back in.
    spellings = ("/post/9?ref=a", "/post/9?ref=latest", "/post/9")
    learned = []
    for order in itertools.permutations(spellings):
        record = EMPTY
        for path in order:
            links = ("/post/9?ref=a",)  # the post's own share link
            record = fetched(record, path, canonical="/post/9", content="nine", links=links)
        learned.append(record.rules().names)
    assert learned == [{"ref"}] * 6


def test_a_page_fetched_again_owes_no_probe() -> None:
    # `?ref=latest` showed `?ref=a`'s page (an echo, whose probe was owed back): its
    # re-crawl is the same page, and no other probe is owed for it.
    record = fetched(EMPTY, "/post/9?ref=a", canonical="/post/9", content="nine")
    record = fetched(record, "/post/9?ref=latest", canonical="/post/9", content="nine")
    again = fetched(record, "/post/9?ref=latest", canonical="/post/9", content="nine")
    assert untaught(record, again, SITE + "/post/9?ref=latest") == []
    assert undecided(again, SITE + "/post/3?ref=b") == undecided(record, SITE + "/post/3?ref=b")


def test_a_soft_404_shown_equal_to_the_page_without_its_value_teaches_no_other_value() -> None:
    # /item and a withdrawn /item?id=101 are one "not found" page; long after, so is
    # /item?id=102: still the one page, not a second value of a parameter to drop.
    record = fetched(EMPTY, "/item?id=101", canonical="/item", content="Product not found")
    record = fetched(record, "/item", canonical="/item", content="Product not found")
    for n in range(AliasLimits().max_samples + 1):
        record = fetched(record, f"/q/{n}?from=list", canonical=f"/q/{n}?from=list")
    record = fetched(record, "/item?id=102", canonical="/item", content="Product not found")
    assert not record.rules().names
    # Nor does a directory that is one page with its slash and without close the index
    # name once the slash style was contradicted elsewhere.
    record = fetched(EMPTY, "/docs/", content="listing", links=("/docs/index.html",))
    record = fetched(record, "/docs/index.html", content="manual")
    for path in ("/a/", "/a", "/a/index.html"):
        record = fetched(record, path, content="a")
    assert undecided(record, SITE + "/z/index.html") == ["i:index.html"]


#: A blog's probes (a tracking ``?ref=``, a one-valued ``?from=sidebar``, an index file
#: name), each on a post of its own, and every post under its own spelling.
_ORDERED_FETCHES = (
    "/p/0/?ref=home",
    "/p/1/?ref=p0",
    "/p/2/?from=sidebar",
    "/p/3/?from=sidebar",
    "/p/4/index.html",
    "/p/5/index.html",
    *(f"/p/{n}/" for n in range(6)),
)


@settings(max_examples=250, deadline=None)
@given(
    st.permutations(range(len(_ORDERED_FETCHES))),
    st.lists(st.integers(0, len(_ORDERED_FETCHES) - 1), max_size=4),
    st.booleans(),
    st.booleans(),
)
def test_whatever_the_order_of_the_fetches_a_key_waits_until_it_is_learned(
    order: list[int], again: list[int], recrawled: bool, canonicals: bool
) -> None:
    """The probes and the pages under their own spellings come back in any order, some
    twice (redelivered, or fetched again under another event), with canonicals or
    without: each key is learned in the end. With canonicals, until a key is learned,
    another spelling that carries it stays undecided (its link waits for what the probes
    teach) instead of going out as it is; without, two probes that said nothing decide
    it until their pages without the value come (``_open``)."""
    waiting = {
        "q:ref": "/p/9/?ref=p8",
        "q:from": "/p/9/?from=sidebar",
        "i:index.html": "/p/9/index.html",
    }
    steps = [(index, f"e{index}") for index in order]
    for position, index in enumerate(again):
        event = f"e{index}.{position}" if recrawled else f"e{index}"
        steps.insert(steps.index((index, f"e{index}")) + 1 + position % 2, (index, event))
    record = EMPTY
    for index, event in steps:
        path = _ORDERED_FETCHES[index]
        post = path.split("/")[2]
        canonical = f"/p/{post}/" if canonicals else None
        links = (f"/p/{int(post) + 1}/?ref=p{post}",)  # as a post links to the next
        record = fetched(
            record, path, canonical=canonical, content=f"post {post}", links=links, event_id=event
        )
        rules = record.rules()
        for key, spelling in waiting.items() if canonicals else ():
            learned = rewrite(rules, SITE + spelling) == SITE + "/p/9/"
            assert learned or key in undecided(record, SITE + spelling), (key, steps, record)
    rules = record.rules()
    assert rules.names == {"ref"}
    assert "from=sidebar" in rules.pairs
    assert rules.index == {"index.html/"}


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


def test_two_values_that_show_one_soft_404_do_not_teach_the_parameter() -> None:
    # Withdrawn products answer 200 "Product not found" under the template's canonical:
    # the two probes a parameter gets are two values, one page, and nothing says it is
    # the page without the parameter. Every product would be merged into /product.php.
    not_found = "Product not found. " * 20
    record = fetched(EMPTY, "/product.php?id=101", canonical="/product.php", content=not_found)
    record = fetched(record, "/product.php?id=102", canonical="/product.php", content=not_found)
    rules = record.rules()
    assert "id" not in rules.names
    assert rewrite(rules, SITE + "/product.php?id=7") == SITE + "/product.php?id=7"
    # The second value taught nothing: another goes out as a probe.
    assert undecided(record, SITE + "/product.php?id=7") == ["q:id"]
    # A product still there says what ?id= is, whatever the canonical says.
    record = fetched(record, "/product.php?id=7", canonical="/product.php", content="A lamp")
    record = fetched(record, "/product.php?id=8", canonical="/product.php", content=not_found)
    assert not record.rules()


def test_one_page_under_two_values_leaves_the_name_to_another_page() -> None:
    # A home page lists one post as "featured" and as "latest", and others as "latest":
    # the two probes ?ref= gets are that post's two links, one page under one canonical.
    home = ("/post/9?ref=featured", "/post/9?ref=latest", "/post/8?ref=latest")
    record = fetched(EMPTY, "/", links=home)
    record = fetched(record, "/post/9?ref=featured", canonical="/post/9", content="post 9")
    assert undecided(record, SITE + "/post/8?ref=latest") == ["q:ref"]
    before = record
    record = fetched(record, "/post/9?ref=latest", canonical="/post/9", content="post 9")
    assert not record.rules()
    # Not a fetch towards a rule: the name is still open, and that probe taught nothing.
    assert undecided(record, SITE + "/post/8?ref=latest") == ["q:ref"]
    assert untaught(before, record, SITE + "/post/9?ref=latest") == ["q:ref"]
    assert untaught(EMPTY, before, SITE + "/post/9?ref=featured") == []
    assert untaught(record, record, SITE + "/post/9?ref=latest") == []
    # Another post under the same value is its second value.
    record = fetched(record, "/post/8?ref=latest", canonical="/post/8", content="post 8")
    rules = record.rules()
    assert rules.names == {"ref"}
    assert rewrite(rules, SITE + "/post/7?ref=latest") == SITE + "/post/7"
    assert HostAliases.from_json(record.to_json()) == record


def test_a_name_whose_every_value_shows_one_page_is_decided_after_a_few_tries() -> None:
    # A sign-in form that keeps where to go next: every ?next= shows the one form, which
    # the host's other pages have pushed out of the sample whenever a value comes back.
    # Each value is a try that adds none; after a few the name is decided, unlearned,
    # and no link that carries it is held back any longer, nor another probe owed.
    form = "Sign in to continue"
    pages = iter(range(1_000))

    def others(record: HostAliases) -> HostAliases:
        for _ in range(40):
            record = fetched(record, f"/p/{next(pages)}")
        return record

    record = fetched(EMPTY, "/login?next=/a", canonical="/login", content=form)
    record = fetched(record, "/login?next=/b", canonical="/login", content=form)
    assert undecided(record, SITE + "/login?next=/zz") == ["q:next"]  # another page's may
    record = others(record)
    record = fetched(record, "/login", content=form)
    record = others(record)
    still_open, owed = [], []
    for value in "cdefghij":
        before = record
        record = fetched(record, f"/login?next=/{value}", canonical="/login", content=form)
        still_open.append(undecided(record, SITE + "/login?next=/zz"))
        owed.append(untaught(before, record, SITE + f"/login?next=/{value}"))
        record = others(record)
    assert still_open == [["q:next"]] + [[]] * 7
    assert owed == [["q:next"]] + [[]] * 7
    assert not record.rules()
    assert HostAliases.from_json(record.to_json()) == record
    # Decided, not learned: a value shown to be the page without it still teaches it.
    record = fetched(record, "/login", content=form)
    record = fetched(record, "/login?next=/k", canonical="/login", content=form)
    assert record.rules().names == {"next"}


def test_two_values_equal_to_the_page_without_them_teach_the_parameter() -> None:
    # A tracking parameter: each value is the page without it, on one page or several.
    record = fetched(EMPTY, "/post/1", content="post 1", links=("/post/1?ref=a",))
    record = fetched(record, "/post/1?ref=a", canonical="/post/1", content="post 1")
    record = fetched(record, "/post/1?ref=b", canonical="/post/1", content="post 1")
    assert record.rules().names == {"ref"}
    # Shown by the page without them fetched after them, without a canonical too.
    record = fetched(EMPTY, "/post/1?ref=a", content="post 1")
    record = fetched(record, "/post/1?ref=b", content="post 1")
    assert not record.rules()
    record = fetched(record, "/post/1", content="post 1")
    assert record.rules().names == {"ref"}
    assert HostAliases.from_json(record.to_json()) == record


def test_a_canonical_says_nothing_of_one_value_once_content_showed_the_name_matters() -> None:
    # /item?id=N are items of their own whose template says canonical /item: ?id=2
    # showed that ?id= changes the page, and ?id=1, fetched again once the sample has
    # forgotten them, is no more /item for being fetched twice.
    limits = AliasLimits()
    record = fetched(EMPTY, "/item?id=1", canonical="/item", content="the first item")
    record = fetched(record, "/item?id=2", canonical="/item", content="the second item")
    assert not record.rules()
    for n in range(limits.max_samples + 8):
        record = fetched(record, f"/p/{n}?from=list", canonical=f"/p/{n}?from=list")
    assert all(not s.startswith("/item") for s, _ in record.samples)
    record = fetched(record, "/item?id=1", canonical="/item", content="the first item")
    rules = record.rules()
    assert not rules.pairs
    assert rewrite(rules, SITE + "/item?id=1") == SITE + "/item?id=1"
    assert HostAliases.from_json(record.to_json()) == record
    # The page without it, shown equal, still says ?id=1 is /item.
    record = fetched(record, "/item", content="the first item")
    assert record.rules().pairs == {"id=1"}
    # A name only a page's own canonical keeps (?page=2, its content never compared with
    # another value's) leaves the others' canonicals heard.
    record = fetched(EMPTY, "/list?page=2", canonical="/list?page=2")
    for n in range(limits.max_samples):
        record = fetched(record, f"/p/{n}?from=list", canonical=f"/p/{n}?from=list")
    record = fetched(record, "/list?page=1", canonical="/list")
    record = fetched(record, "/tags?page=1", canonical="/tags")
    assert record.rules().pairs == {"page=1"}


def sort_learned() -> HostAliases:
    """Two near-empty lists equal to themselves sorted: ``?sort=`` looks like noise."""
    record = fetched(EMPTY, "/c/tiny", content="no items", links=("/c/tiny?sort=top",))
    record = fetched(record, "/c/tiny?sort=top", content="no items")
    record = fetched(record, "/c/empty", content="nothing yet")
    record = fetched(record, "/c/empty?sort=new", content="nothing yet")
    assert record.rules().names == {"sort"}
    return record


def test_a_learned_name_is_put_to_the_test_again_and_unlearned_by_its_probe() -> None:
    limits = AliasLimits()
    sorts = ("/c/big?sort=new", "/c/big?sort=top")
    record = fetched(sort_learned(), "/c/big", content="many items", links=sorts)
    assert not record.rules().probes  # not at once
    assert rewrite(record.rules(), SITE + "/c/big?sort=new") == SITE + "/c/big"
    for n in range(limits.max_samples - 2):
        record = fetched(record, f"/p/{n}")
    assert not record.rules().probes
    # A sample's worth of fetches on, the page fetched lets one spelling through.
    record = fetched(record, "/c/big", content="many items", links=sorts)
    rules = record.rules()
    assert rules.names == {"sort"}
    assert rules.probes == {SITE + "/c/big?sort=new"}
    assert rewrite(rules, SITE + "/c/big?sort=new") == SITE + "/c/big?sort=new"
    assert rewrite(rules, SITE + "/c/big?sort=top") == SITE + "/c/big"
    assert HostAliases.from_json(record.to_json()) == record
    # Its page is another: ?sort= is un-learned for good.
    record = fetched(record, "/c/big?sort=new", content="many items, newest first")
    rules = record.rules()
    assert not rules
    assert rewrite(rules, SITE + "/c/big?sort=top") == SITE + "/c/big?sort=top"


def test_a_learned_value_is_put_to_the_test_again_and_unlearned_by_its_probe() -> None:
    # Two lists' page 2 name their page 1 as canonical (a common misconfiguration), each
    # fetched once its page 1 had left the sample (a big host's queue): ?page=2 is
    # learned, and every list's page 2 would be its page 1 for good, never fetched.
    limits = AliasLimits()
    record = fetched(EMPTY, "/tag/a", links=("/tag/a?page=2",))
    record = fetched(record, "/tag/b", links=("/tag/b?page=2",))
    for n in range(limits.max_samples):
        record = fetched(record, f"/post/{n}")
    record = fetched(record, "/tag/a?page=2", canonical="/tag/a")
    record = fetched(record, "/tag/b?page=2", canonical="/tag/b")
    assert record.rules().pairs == {"page=2"}
    # A value folds one spelling: its first test waits longer than a name's.
    for n in range((limits.max_samples << PAIR_HEAD_START) - 1):
        record = fetched(record, f"/post/x{n}")
        assert not record.rules().probes
    # Then a list fetched lets its own page 2 through.
    record = fetched(record, "/tag/c", links=("/tag/c?page=2", "/tag/c?page=3"))
    rules = record.rules()
    assert rules.probes == {SITE + "/tag/c?page=2"}
    assert rewrite(rules, SITE + "/tag/c?page=2") == SITE + "/tag/c?page=2"
    assert rewrite(rules, SITE + "/tag/d?page=2") == SITE + "/tag/d"
    assert HostAliases.from_json(record.to_json()) == record
    # Fetched behind the host's queue, with its canonical still naming page 1: its
    # content is not page 1's, and ?page=2 is un-learned for good.
    for n in range(limits.max_samples + 4):
        record = fetched(record, f"/post/y{n}")
    record = fetched(record, "/tag/c?page=2", canonical="/tag/c")
    assert not record.rules()
    assert rewrite(record.rules(), SITE + "/tag/d?page=2") == SITE + "/tag/d?page=2"


def test_a_probe_is_compared_with_its_page_as_it_is_now() -> None:
    # The list gained an item between the probe's choice and its fetch: the probe shows
    # the list as it is now, which the sample holds, and the name stays learned.
    limits = AliasLimits()
    sorts = ("/c/big?sort=new",)
    record = fetched(sort_learned(), "/c/big", content="many items", links=sorts)
    for n in range(limits.max_samples - 2):
        record = fetched(record, f"/p/{n}")
    record = fetched(record, "/c/big", content="many items", links=sorts)
    assert record.rules().probes == {SITE + "/c/big?sort=new"}
    record = fetched(record, "/c/big", content="many items and one", links=sorts)
    record = fetched(record, "/c/big?sort=new", content="many items and one")
    assert record.rules().names == {"sort"}


def test_a_probe_is_compared_with_the_page_without_it_however_late_it_comes_back() -> None:
    # A new page, the probe waits behind every page already queued for its host: it is
    # fetched long after it was chosen, and the sample has forgotten /c/big by then.
    limits = AliasLimits()
    record = sort_learned()
    for n in range(limits.max_samples - 1):
        record = fetched(record, f"/p/{n}")
    record = fetched(record, "/c/big", content="many items", links=("/c/big?sort=new",))
    assert record.rules().probes == {SITE + "/c/big?sort=new"}
    for n in range(limits.max_samples, 3 * limits.max_samples + 3):  # 67 fetches
        record = fetched(record, f"/p/{n}")
        assert record.rules().probes == {SITE + "/c/big?sort=new"}
    assert all(not s.startswith("/c/") for s, _ in record.samples)
    record = fetched(record, "/c/big?sort=new", content="many items, newest first")
    assert not record.rules()


def test_a_probe_is_compared_with_the_page_without_it_once_the_sample_forgot_it() -> None:
    # The page that links the probe is not the page without it: that one was sampled
    # before, and the host's other pages push it out while the probe is fetched.
    limits = AliasLimits()
    record = fetched(sort_learned(), "/c/big", content="many items")
    for n in range(limits.max_samples - 2):
        record = fetched(record, f"/p/{n}")
    record = fetched(record, "/c/", content="the categories", links=("/c/big?sort=new",))
    assert record.rules().probes == {SITE + "/c/big?sort=new"}
    for n in range(limits.max_samples, limits.max_samples + 4):
        record = fetched(record, f"/p/{n}")
    assert all(not s.startswith("/c/big") for s, _ in record.samples)
    assert record.rules().probes == {SITE + "/c/big?sort=new"}
    record = fetched(record, "/c/big?sort=new", content="many items, newest first")
    assert not record.rules()


def test_one_probe_at_a_time_and_a_name_that_holds_waits_twice_as_long() -> None:
    limits = AliasLimits()
    record = fetched(EMPTY, "/p/1?ref=a", canonical="/p/1")
    record = fetched(record, "/p/2?ref=b", canonical="/p/2")
    assert record.rules().names == {"ref"}
    probes: list[frozenset[str]] = []

    def fetch_list(n: int) -> HostAliases:
        links = tuple(f"/p/{k}?ref=list" for k in range(n, n + 5))
        new = fetched(record, f"/list/{n}", links=links)
        probes.append(new.rules().probes)
        return new

    for n in range(limits.max_samples):
        record = fetch_list(n)
    # One spelling, chosen once: the pages after it offer others, none goes out.
    assert [p for p in probes if p] == [frozenset({SITE + f"/p/{limits.max_samples - 1}?ref=list"})]
    (probe,) = probes[-1]
    for n in range(limits.max_samples, limits.max_samples + 10):
        record = fetch_list(n)
        assert record.rules().probes == {probe}
    # It comes back the page without it: the name holds, and the next waits twice as long.
    record = fetched(record, probe[len(SITE) :], canonical=probe[len(SITE) :].partition("?")[0])
    assert record.rules().names == {"ref"}
    probes.clear()
    for n in range(2 * limits.max_samples):
        record = fetch_list(100 + n)
    assert [bool(p) for p in probes] == [False] * (2 * limits.max_samples - 1) + [True]


def test_no_second_probe_is_chosen_while_one_is_out() -> None:
    # However many pages of the host offer other spellings: a probe fetched behind the
    # host's queue is still compared when it comes back, and two out at once would be
    # one request in thirty-two, not one in a thousand.
    limits = AliasLimits()
    record = fetched(EMPTY, "/p/1?ref=a", canonical="/p/1")
    record = fetched(record, "/p/2?ref=b", canonical="/p/2")
    probes: list[frozenset[str]] = []
    longest = limits.max_samples**2
    for n in range(limits.max_samples + longest + limits.max_samples):
        links = tuple(f"/p/{k}?ref=list" for k in range(n, n + 3))
        record = fetched(record, f"/list/{n}", links=links)
        probes.append(record.rules().probes)
    due = limits.max_samples - 1  # the page fetched then offers the probe
    assert [bool(p) for p in probes[:due]] == [False] * due
    assert probes[due : due + longest] == [{SITE + f"/p/{due}?ref=list"}] * longest
    # One never come back (known already) is given up after the longest wait, and the
    # next waits as after the last.
    again = due + longest + limits.max_samples
    assert not any(probes[due + longest : again])
    assert probes[again] == {SITE + f"/p/{again}?ref=list"}
    assert record.rules().names == {"ref"}
