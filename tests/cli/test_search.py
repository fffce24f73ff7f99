"""``trove search`` against a real Postgres, with rows written directly (no service involved)."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from trove_cli import search as search_module
from trove_cli.search import Hit, SearchError, render_hits, search

pytestmark = pytest.mark.usefixtures("clean")


async def add_page(
    conn: AsyncConnection,
    url: str,
    words: str = "",
    *,
    config: str = "english",
    language: str | None = "en",
    status: str = "fetched",
    noindex: bool = False,
    title: str | None = None,
    final_url: str | None = None,
    ago: int = 120,
    content: bool = True,
    crawled: bool | None = None,
    canonical: str | None = None,
) -> int:
    """A page row as the recorder leaves it: tsvector built with the language's config
    (none without ``content``); fetched ``ago`` seconds ago if it is, last crawled then
    if ``crawled`` (by default: unless only discovered)."""
    read_at = datetime.now(UTC) - timedelta(seconds=ago)
    page_id = await conn.scalar(
        text(
            "INSERT INTO pages (url, domain, status, title, language, keywords_tsv, noindex, "
            "final_url, canonical_url, discovered_at, fetched_at, last_crawled_at) "
            "VALUES (:url, :domain, :status, :title, :language, "
            "CASE WHEN :content THEN to_tsvector(CAST(:config AS regconfig), :words) END, "
            ":noindex, :final_url, :canonical, now(), "
            ":fetched_at, :crawled_at) "
            "RETURNING id"
        ),
        {
            "url": url,
            "domain": url.split("/")[2],
            "status": status,
            "title": title if title is not None else words,
            "language": language,
            "config": config,
            "words": words,
            "noindex": noindex,
            "final_url": final_url,
            "canonical": canonical,
            "content": content,
            "fetched_at": read_at if status == "fetched" else None,
            "crawled_at": read_at
            if (status != "discovered" if crawled is None else crawled)
            else None,
        },
    )
    assert isinstance(page_id, int)
    return page_id


async def link(
    conn: AsyncConnection, from_id: int, to_id: int, kind: str = "a", *, nofollow: bool = False
) -> None:
    await conn.execute(
        text(
            "INSERT INTO page_outlinks (from_page_id, to_page_ids, kinds, nofollow) "
            "VALUES (:f, ARRAY[CAST(:t AS bigint)], ARRAY[CAST(:kind AS text)], "
            "ARRAY[CAST(:nofollow AS boolean)]) ON CONFLICT (from_page_id) DO UPDATE SET "
            "to_page_ids = page_outlinks.to_page_ids || excluded.to_page_ids, "
            "kinds = page_outlinks.kinds || excluded.kinds, "
            "nofollow = page_outlinks.nofollow || excluded.nofollow"
        ),
        {"f": from_id, "t": to_id, "kind": kind, "nofollow": nofollow},
    )


async def share(conn: AsyncConnection, url: str, *posts: int) -> None:
    """``page_shares`` rows as the recorder writes them from timeline polls."""
    for post in posts:
        await conn.execute(
            text(
                "INSERT INTO page_shares (url, post_uri, instance, account, first_seen_at) "
                "VALUES (:url, :uri, 'https://social.example', 'ada@social.example', now())"
            ),
            {"url": url, "uri": f"https://social.example/users/ada/statuses/{post}"},
        )


async def linkers(conn: AsyncConnection, n: int, prefix: str) -> list[int]:
    """Fetched pages with nothing to match, only there to link."""
    return [
        await add_page(conn, f"https://{prefix}{i}.example/", "unrelated filler") for i in range(n)
    ]


def urls(hits: list[Hit]) -> list[str]:
    return [h.url for h in hits]


async def test_more_inlinks_rank_higher_among_equal_text_matches(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        # Alphabetical URL order is the reverse of the expected rank: the tie-break on
        # the URL cannot produce the expected order by itself.
        none = await add_page(conn, "https://a.example/", "small web gardens")
        one = await add_page(conn, "https://b.example/", "small web gardens")
        three = await add_page(conn, "https://c.example/", "small web gardens")
        sources = await linkers(conn, 3, "linker")
        for source in sources:
            await link(conn, source, three)
        await link(conn, sources[0], one)
        assert none  # linked by nobody

    hits = await search(engine, "gardens")

    assert urls(hits) == ["https://c.example/", "https://b.example/", "https://a.example/"]
    assert [h.inlinks for h in hits] == [3, 1, 0]
    assert hits[0].score > hits[1].score > hits[2].score > 0


async def test_a_page_shared_by_more_posts_ranks_higher_among_equal_matches(
    engine: AsyncEngine,
) -> None:
    async with engine.begin() as conn:
        # Alphabetical URL order is the reverse of the expected rank.
        await add_page(conn, "https://a.example/", "small web gardens")
        await add_page(conn, "https://b.example/", "small web gardens")
        await add_page(conn, "https://c.example/", "small web gardens")
        await share(conn, "https://c.example/", 1, 2, 3)
        await share(conn, "https://b.example/", 1)
        await share(conn, "https://unfetched.example/", 1, 2, 3, 4)  # no page: nothing found

    hits = await search(engine, "gardens")

    assert urls(hits) == ["https://c.example/", "https://b.example/", "https://a.example/"]
    assert [h.shares for h in hits] == [3, 1, 0]
    assert hits[0].score > hits[1].score > hits[2].score > 0


async def test_shares_and_inlinks_each_raise_the_rank(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        linked = await add_page(conn, "https://a.example/", "gardens")
        both = await add_page(conn, "https://b.example/", "gardens")
        await share(conn, "https://b.example/", 1)
        await add_page(conn, "https://c.example/", "gardens")  # neither linked nor shared
        (source,) = await linkers(conn, 1, "src")
        await link(conn, source, linked)
        await link(conn, source, both)

    hits = await search(engine, "gardens")

    assert urls(hits) == ["https://b.example/", "https://a.example/", "https://c.example/"]
    assert [(h.inlinks, h.shares) for h in hits] == [(1, 1), (1, 0), (0, 0)]
    # Log-scaled and multiplied: one share counts as much as one in-link.
    assert hits[0].score / hits[1].score == pytest.approx(hits[1].score / hits[2].score)


async def test_text_relevance_still_counts_next_to_inlinks(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await add_page(conn, "https://dense.example/", "gardens gardens gardens small web")
        await add_page(conn, "https://thin.example/", "gardens and many other unrelated words")

    hits = await search(engine, "small gardens")

    assert urls(hits) == ["https://dense.example/"]  # both words are required


async def test_links_and_shares_rank_the_best_text_matches_not_every_match(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A common word matches millions of pages on a crawl of months: the in-links and
    # shares of the best by their text are counted, not of every match.
    monkeypatch.setattr(search_module, "MIN_POOL", 2)
    monkeypatch.setattr(search_module, "POOL_PER_HIT", 2)
    async with engine.begin() as conn:
        await add_page(conn, "https://dense.example/", "gardens gardens gardens")
        await add_page(conn, "https://middle.example/", "gardens gardens and more")
        # As good a match as the middle one, found after it: out of a pool of two.
        famous = await add_page(conn, "https://famous.example/", "gardens gardens and more")
        for source in await linkers(conn, 20, "linker"):
            await link(conn, source, famous)

    hits = await search(engine, "gardens", limit=1)

    assert urls(hits) == ["https://dense.example/"]
    assert urls(await search(engine, "gardens", limit=3))[0] == "https://famous.example/"


async def test_only_followed_anchor_links_from_other_pages_count_as_inlinks(
    engine: AsyncEngine,
) -> None:
    async with engine.begin() as conn:
        target = await add_page(conn, "https://target.example/", "gardens")
        a, b, c = await linkers(conn, 3, "src")
        await link(conn, a, target, "a")
        await link(conn, a, target, "img")  # same page again, another kind: still one
        await link(conn, b, target, "a", nofollow=True)  # not a vote
        await link(conn, c, target, "stylesheet")  # not an anchor
        await link(conn, target, target, "a")  # a page citing itself

    (hit,) = await search(engine, "gardens")

    assert hit.inlinks == 1


async def test_a_vote_is_a_page_held_now_under_its_own_name(engine: AsyncEngine) -> None:
    """A page gone since, refused or excluded keeps its last links in the graph, and an
    old name read through a redirect holds the links of the page it led to: neither is
    a vote. A noindex page is not found but still cites (noindex is not nofollow)."""
    async with engine.begin() as conn:
        target = await add_page(conn, "https://target.example/", "gardens")
        held = await add_page(conn, "https://held.example/", "filler")
        quiet = await add_page(conn, "https://quiet.example/", "filler", noindex=True)
        gone = await add_page(conn, "https://gone.example/", "filler", status="failed")
        excluded = await add_page(conn, "https://excluded.example/", "filler", status="rejected")
        moved = await add_page(conn, "https://moved.example/", "filler", ago=60)
        old = await add_page(
            conn, "http://moved.example/", "filler", final_url="https://moved.example/", ago=120
        )
        for source in (held, quiet, gone, excluded, moved, old):
            await link(conn, source, target)

    (hit,) = await search(engine, "gardens")

    assert hit.inlinks == 3  # held, quiet, and the moved page once


async def test_a_copy_naming_a_matched_page_as_canonical_is_folded_into_it(
    engine: AsyncEngine,
) -> None:
    """An AMP copy and a print copy whose canonical is the post: the post is found once,
    with the in-links and shares of its copies, each linking page counted once."""
    post = "https://blog.example/post"
    async with engine.begin() as conn:
        main = await add_page(conn, post, "tomato notes")
        amp = await add_page(conn, "https://blog.example/amp/post", "tomato notes", canonical=post)
        printed = await add_page(
            conn, "https://blog.example/post/print", "tomato notes", canonical=post
        )
        a, b, c = await linkers(conn, 3, "src")
        await link(conn, a, main)
        await link(conn, a, amp)  # one page linking two spellings: one vote
        await link(conn, b, amp)
        await link(conn, c, printed)
        await link(conn, amp, main)  # a copy citing the page it copies: no vote
        # Nor one the query does not find (a noindex print copy, other words).
        hidden = await add_page(
            conn, "https://blog.example/post/p2", "other words", canonical=post, noindex=True
        )
        await link(conn, hidden, main)
        await share(conn, "https://blog.example/amp/post", 1, 2)
        await share(conn, post, 2, 3)
        # Itself its own canonical: the row names no other page.
        await add_page(
            conn, "https://other.example/", "tomato notes", canonical="https://other.example/"
        )

    hits = await search(engine, "tomato")

    assert [(h.url, h.inlinks, h.shares) for h in hits] == [
        (post, 3, 3),
        ("https://other.example/", 0, 0),
    ]


async def test_a_copy_found_in_place_of_its_page_gets_no_vote_from_the_page_or_its_copies(
    engine: AsyncEngine,
) -> None:
    """The page does not match (its AMP copy says more): the copy is shown, and neither
    the page it copies nor another copy of that page votes for it."""
    post = "https://blog.example/post"
    async with engine.begin() as conn:
        main = await add_page(conn, post, "other words")
        amp = await add_page(conn, "https://blog.example/amp/post", "tomato notes", canonical=post)
        printed = await add_page(conn, "https://blog.example/post/print", "words", canonical=post)
        (outside,) = await linkers(conn, 1, "src")
        for source in (main, printed, outside):
            await link(conn, source, amp)

    (hit,) = await search(engine, "tomato")

    assert (hit.url, hit.inlinks) == ("https://blog.example/amp/post", 1)


async def test_a_canonical_folds_a_page_only_into_a_match_that_names_no_other(
    engine: AsyncEngine,
) -> None:
    """A page is left out only for a page that is found and agrees it is the one: not
    for a canonical that was never fetched, or that does not match, and not when two
    pages each name the other. A page naming another site's page hides only itself."""
    async with engine.begin() as conn:
        await add_page(conn, "https://a.example/1", "tomato", canonical="https://a.example/unread")
        await add_page(conn, "https://a.example/unread", "", status="discovered")
        await add_page(conn, "https://b.example/1", "tomato", canonical="https://b.example/other")
        await add_page(conn, "https://b.example/other", "cucumber")
        await add_page(conn, "https://c.example/x", "tomato", canonical="https://c.example/y")
        await add_page(conn, "https://c.example/y", "tomato", canonical="https://c.example/x")
        await add_page(conn, "https://spam.example/", "tomato", canonical="https://d.example/")
        await add_page(conn, "https://d.example/", "tomato")

    hits = await search(engine, "tomato")

    assert sorted(urls(hits)) == [
        "https://a.example/1",
        "https://b.example/1",
        "https://c.example/x",
        "https://c.example/y",
        "https://d.example/",
    ]


async def test_lang_filters_pages_and_parses_the_query_in_that_language(
    engine: AsyncEngine,
) -> None:
    async with engine.begin() as conn:
        await add_page(conn, "https://en.example/", "running crawlers")
        await add_page(conn, "https://gb.example/", "running crawlers", language="en-GB")
        await add_page(
            conn, "https://fr.example/", "les crawlers du web", config="french", language="fr"
        )

    assert set(urls(await search(engine, "crawlers", "en"))) == {
        "https://en.example/",
        "https://gb.example/",
    }
    assert urls(await search(engine, "crawlers", "en-GB")) == ["https://gb.example/"]
    assert urls(await search(engine, "crawlers", "fr")) == ["https://fr.example/"]
    # Stemmed in English: "run" finds "running" only when parsed as English.
    assert set(urls(await search(engine, "run", "en"))) == {
        "https://en.example/",
        "https://gb.example/",
    }
    assert await search(engine, "crawlers", "de") == []


async def test_without_lang_each_page_is_matched_in_its_own_language(
    engine: AsyncEngine,
) -> None:
    async with engine.begin() as conn:
        # English stems: the tsvector holds 'crawler' and 'run', never 'crawlers'.
        await add_page(conn, "https://en.example/", "running crawlers")
        await add_page(
            conn, "https://fr.example/", "les chevaux sauvages", config="french", language="fr"
        )
        # An unmapped language and an unknown one are indexed with 'simple'.
        await add_page(
            conn, "https://ja.example/", "crawlers kanji", config="simple", language="ja"
        )
        await add_page(conn, "https://xx.example/", "crawlers", config="simple", language=None)

    assert set(urls(await search(engine, "crawlers"))) == {
        "https://en.example/",
        "https://ja.example/",
        "https://xx.example/",
    }
    assert urls(await search(engine, "chevaux")) == ["https://fr.example/"]
    assert urls(await search(engine, "running")) == ["https://en.example/"]


async def test_noindex_and_pages_not_fetched_are_never_found(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await add_page(conn, "https://ok.example/", "gardens")
        await add_page(conn, "https://noindex.example/", "gardens", noindex=True)
        for status in ("discovered", "failed", "rejected"):
            await add_page(conn, f"https://{status}.example/", "gardens", status=status)

    assert urls(await search(engine, "gardens")) == ["https://ok.example/"]
    assert urls(await search(engine, "gardens", "en")) == ["https://ok.example/"]


async def test_a_page_read_through_a_redirect_is_found_once_where_it_answers(
    engine: AsyncEngine,
) -> None:
    """An http:// link to a page now at https:// is kept under both names, the first
    with what its redirect led to: one page, found once. The old name's row is shown
    while the page it led to was never looked at (refused, say), and not once that page
    was looked at since it was read (gone: its 404 is newer than the old row's text).
    Two names that each led to the other (a site that moved the page back): the newer."""
    async with engine.begin() as conn:
        await add_page(
            conn, "http://blog.example/post", "tomato notes", final_url="https://blog.example/post"
        )
        await add_page(conn, "https://blog.example/post", "tomato notes")
        await add_page(
            conn, "http://blog.example/gone", "tomato notes", final_url="https://blog.example/gone"
        )
        await add_page(conn, "https://blog.example/gone", "tomato notes", status="failed", ago=0)
        await add_page(
            conn,
            "http://blog.example/refused",
            "tomato notes",
            final_url="https://blog.example/refused",
        )
        await add_page(conn, "https://blog.example/refused", "", status="discovered")
        # Its first attempt retried, or fetched without content of its own yet.
        await add_page(
            conn, "http://blog.example/retried", "tomato notes", final_url="https://blog.example/r"
        )
        await add_page(conn, "https://blog.example/r", "", status="discovered", ago=0, crawled=True)
        await add_page(
            conn, "http://blog.example/bare", "tomato notes", final_url="https://blog.example/b"
        )
        await add_page(conn, "https://blog.example/b", "", ago=0, content=False)
        await add_page(
            conn,
            "https://blog.example/dir",
            "tomato notes",
            final_url="https://blog.example/dir/",
            ago=60,
        )
        await add_page(
            conn,
            "https://blog.example/dir/",
            "tomato notes",
            final_url="https://blog.example/dir",
            ago=30,
        )

    hits = await search(engine, "tomato")

    assert sorted(urls(hits)) == [
        "http://blog.example/bare",
        "http://blog.example/refused",
        "http://blog.example/retried",
        "https://blog.example/dir/",
        "https://blog.example/post",
    ]


@pytest.mark.parametrize(
    "query",
    [
        "'); DROP TABLE pages; --",
        "gardens & | ! :* ( ) <-> \\ %",
        '"unclosed phrase',
        "or or -",
        "",
        "   ",
        "$1 :query %(limit)s",
    ],
)
async def test_queries_with_punctuation_and_operators_never_error(
    engine: AsyncEngine, query: str
) -> None:
    async with engine.begin() as conn:
        await add_page(conn, "https://ok.example/", "small web gardens")

    await search(engine, query)
    await search(engine, query, "en")

    assert urls(await search(engine, "gardens")) == ["https://ok.example/"]  # table intact


async def test_websearch_syntax_phrases_and_exclusions_apply(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await add_page(conn, "https://phrase.example/", "small web gardens")
        await add_page(conn, "https://apart.example/", "web small gardens")
        await add_page(conn, "https://rust.example/", "small web rust")

    assert urls(await search(engine, '"small web" -rust')) == ["https://phrase.example/"]
    assert set(urls(await search(engine, "rust or gardens"))) == {
        "https://phrase.example/",
        "https://apart.example/",
        "https://rust.example/",
    }


async def test_limit_keeps_the_best_hits(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        pages = [await add_page(conn, f"https://p{i}.example/", "gardens") for i in range(5)]
        sources = await linkers(conn, 4, "src")
        for i, page in enumerate(pages):  # page i is linked i times
            for source in sources[:i]:
                await link(conn, source, page)

    hits = await search(engine, "gardens", limit=2)

    assert urls(hits) == ["https://p4.example/", "https://p3.example/"]
    assert len(await search(engine, "gardens", limit=50)) == 5


@pytest.mark.parametrize(
    ("lang", "limit"), [("en;drop", 10), ("e", 10), ("en", 0), ("en", search_module.MAX_LIMIT + 1)]
)
async def test_malformed_language_or_limit_is_refused(
    engine: AsyncEngine, lang: str, limit: int
) -> None:
    with pytest.raises(SearchError):
        await search(engine, "gardens", lang, limit)


def test_hits_render_full_urls_and_titles_as_plain_text() -> None:
    url = "https://deep.example/" + "/".join(f"section-{i}" for i in range(12))
    out = io.StringIO()
    console = Console(file=out, width=100, color_system=None)

    render_hits([Hit(url, "[bold]Gardens[/bold]", "en", 3, 1.0, shares=7)], console, "gardens")

    lines = out.getvalue().splitlines()
    assert "[bold]Gardens[/bold]" in lines[1 + 2]  # web text is never taken as markup
    # The URL is folded over several lines of its column, never cut short.
    header = lines[1]
    start = header.index("url")
    end = header.index("┃", start)
    column = [line[start:end].strip() for line in lines[3:]]
    assert len([part for part in column if part]) > 1
    assert "".join(column) == url
    assert header.split()[-3:] == ["in-links", "┃", "shares"]
    assert lines[3].split()[-3:] == ["3", "│", "7"]
    empty = io.StringIO()
    render_hits([], Console(file=empty), "nothing")
    assert "no fetched page matches 'nothing'" in empty.getvalue()


async def test_a_page_linked_from_more_pages_than_counted_has_its_inlinks_capped(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A site's home page is linked from a million pages on a crawl of months: its
    # in-links are counted up to the cap, not fetched a million rows each search.
    monkeypatch.setattr(search_module, "MAX_INLINKS_COUNTED", 3)
    async with engine.begin() as conn:
        home = await add_page(conn, "https://home.example/", "gardens")
        few = await add_page(conn, "https://few.example/", "gardens")
        sources = await linkers(conn, 5, "src")
        for source in sources:
            await link(conn, source, home)
        for source in sources[:2]:
            await link(conn, source, few)

    hits = await search(engine, "gardens")

    assert [(h.url, h.inlinks) for h in hits] == [
        ("https://home.example/", 3),
        ("https://few.example/", 2),
    ]
    out = io.StringIO()
    render_hits(hits, Console(file=out, width=200, color_system=None), "gardens")
    rows = [line.split() for line in out.getvalue().splitlines() if ".example/" in line]
    assert [row[-3] for row in rows] == ["3+", "2"]
