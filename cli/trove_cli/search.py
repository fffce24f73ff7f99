"""``trove search``: full-text search over what the crawl recorded, ranked by the citation graph.

Each fetched page has ``pages.keywords_tsv``, built by the recorder from the title and the
keyword bag with the text search configuration of the page's language (``english``
stems "crawlers" to ``crawler``, ``simple`` only lower-cases). A query matches a page
only when it is parsed with the same configuration, so:

* ``--lang xx``: the query is parsed with ``xx``'s configuration and only pages in that
  language are searched (``--lang en`` is every ``en-*`` page; ``--lang en-GB`` is
  exactly ``en-GB``).
* no ``--lang``: every page is matched in its own language: the query is parsed once
  per configuration and each page is tested against the parse of its own. Parsing it
  with ``simple`` alone would miss every stemmed page ("crawlers" never matches the
  English lexeme ``crawler``).

The query uses web search syntax (``websearch_to_tsquery``): words are ANDed, ``"a
phrase"``, ``or``, ``-word``; any other punctuation is ignored, never an error.

Ranking: ``ts_rank_cd`` (cover density) times ``1 + ln(1 + in-links)`` times
``1 + ln(1 + shares)``. In-links are the distinct other pages with a followed ``<a>``
link to the page (``nofollow`` links and links from a page to itself are not votes),
each itself ``fetched`` now and no old name of a page read under another (whose links
are that page's); shares are the distinct public fediverse posts that shared the page's
URL (``page_shares``). Each signal is log-scaled, so the first votes count most and a page
shared by hundreds cannot bury a better text match, and each multiplies the rank on its
own: a share raises a page by the same ratio whether it is linked or not. In-links are
counted up to ``MAX_INLINKS_COUNTED`` (shown as "10000+"). Only pages with status
``fetched`` and without ``noindex`` are searched.

A match whose ``canonical_url`` names another match, one that names no other page, is
that page's copy (its AMP or print version, a second path): it is left out, and its
in-links and shares count for the page it names (PLATFORM.md, "Reading the tables":
an index collapses on ``canonical_url``). Only the copies that match the query too are
folded so: a copy that does not is not among the matches read. No copy of a page is a
vote for it, found or not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table
from rich.text import Text
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from trove_cli.database import engine as database_engine
from trove_cli.outside import outside
from trove_schema.errors import TroveError
from trove_schema.textsearch import TS_CONFIGS, ts_config

DEFAULT_LIMIT = 20
#: Most hits one search shows: each asks for fifty matches ranked by their links and
#: shares (``POOL_PER_HIT``), and a pool of 20,000 took 13 s on 200,000 pages. An
#: index built from the tables (PLATFORM.md, "Reading the tables") serves more.
MAX_LIMIT = 200
LANG_OK = re.compile(r"^[A-Za-z]{2,8}(-[A-Za-z0-9]{1,8})*$")


class SearchError(TroveError):
    """The search cannot be run as asked (a malformed language tag, a limit out of range)."""


@dataclass(frozen=True, slots=True)
class Hit:
    url: str
    title: str | None
    language: str | None
    #: Distinct other held pages with a followed <a> link to this one or to a copy
    #: folded into it (at most ``MAX_INLINKS_COUNTED``).
    inlinks: int
    #: Text rank scaled by the in-links and shares; only the order means something.
    score: float
    #: Distinct public fediverse posts that shared this page's URL.
    shares: int = 0


#: The pages best by their text alone that are ranked by in-links and shares too: a
#: word common on a crawl of months matches millions, and counting each one's in-links
#: would take minutes to show twenty. A page past them would need its links and shares to
#: multiply its text's rank past theirs (ln(1 + n) grows slowly: 15 times for a million).
POOL_PER_HIT = 50
MIN_POOL = 1000
#: In-links counted of a page at most. A site's home page is linked from most of its
#: pages, a million on a crawl of months, and each in-link is a row to fetch: counted
#: whole, one such page among the matches cost a million fetches. Past the cap a page
#: ranks as if it had that many: 1 + ln(1 + n) is 10.2 at 10,000, 14.8 at a million.
MAX_INLINKS_COUNTED = 10_000

#: A row read through a redirect (an old name whose chain moved there) that is the same
#: page as the one there: while the page there has content of its own, read where it
#: answers itself or since this row was; stale once the page there failed or was
#: refused since (gone, say; not while its first attempts are retried). Neither found
#: nor a vote: its links are the page's there, which votes under its own name.
_SUPERSEDED = """EXISTS (
    SELECT 1 FROM pages t
    WHERE t.url = {row}.final_url
      AND (t.status = 'fetched' AND t.keywords_tsv IS NOT NULL
           AND (t.final_url IS NULL
                OR t.last_crawled_at > coalesce({row}.fetched_at, {row}.last_crawled_at))
           OR t.status IN ('failed', 'rejected')
           AND t.last_crawled_at > coalesce({row}.fetched_at, {row}.last_crawled_at))
)"""
_MATCH_SUPERSEDED = _SUPERSEDED.format(row="p")
_SOURCE_SUPERSEDED = _SUPERSEDED.format(row="src")

# One row per configuration to try; each page is tested against the parse of the query
# in its own configuration (a page matches at most one row, so no duplicates). The
# constants formatted in are the module's own SQL; every value is a bound parameter.
_SEARCH = text(
    f"""
    WITH tags AS (
        SELECT * FROM unnest(CAST(:tags AS text[]), CAST(:tag_configs AS text[])) AS t(tag, cfg)
    ),
    q AS (
        SELECT cfg, websearch_to_tsquery(CAST(cfg AS regconfig), :query) AS query
        FROM unnest(CAST(:configs AS text[])) AS c(cfg)
    ),
    matched AS (
        SELECT p.id, p.url, p.title, p.language, p.canonical_url,
               ts_rank_cd(p.keywords_tsv, q.query) AS text_rank
        FROM pages p
        LEFT JOIN tags ON tags.tag = lower(split_part(p.language, '-', 1))
        JOIN q ON q.cfg = coalesce(tags.cfg, 'simple') AND p.keywords_tsv @@ q.query
        WHERE p.status = 'fetched'
          AND NOT p.noindex
          AND NOT {_MATCH_SUPERSEDED}
          AND (CAST(:primary AS text) IS NULL
               OR lower(split_part(p.language, '-', 1)) = :primary)
          AND (CAST(:exact AS text) IS NULL OR lower(p.language) = :exact)
        ORDER BY text_rank DESC, p.id
        LIMIT :pool
    ),
    -- A match whose canonical names another match that names no other page is a copy of
    -- it (an AMP or print version, a second path): the page it names is shown, with the
    -- copies' in-links and shares. A page can only fold itself into another this way,
    -- and two that each name the other are both shown. Joined on the URLs (hashed), not
    -- looked up a match at a time: that was the pool's size squared.
    folds AS (
        SELECT d.id AS copy_id, d.url AS copy_url, c.id AS into_id
        FROM matched d
        JOIN matched c ON c.url = d.canonical_url AND c.id <> d.id
        WHERE coalesce(c.canonical_url, c.url) = c.url
    ),
    shown AS (
        SELECT m.*,
               ARRAY[m.id] || coalesce(f.ids, '{{}}') AS ids,
               ARRAY[m.url] || coalesce(f.urls, '{{}}') AS urls
        FROM matched m
        LEFT JOIN (
            SELECT into_id, array_agg(copy_id) AS ids, array_agg(copy_url) AS urls
            FROM folds GROUP BY into_id
        ) f ON f.into_id = m.id
        WHERE m.id NOT IN (SELECT copy_id FROM folds)
    )
    SELECT m.url, m.title, m.language, l.inlinks,
           m.text_rank * (1 + ln(1 + l.inlinks)) * (1 + ln(1 + s.shares)) AS score,
           s.shares
    FROM shown m
    CROSS JOIN LATERAL (
        -- A vote is a page that is itself held: one whose visit now fails (gone, refused,
        -- excluded) keeps its last links in the graph, and an old name's are its
        -- target's.
        SELECT count(*) AS inlinks FROM (
            SELECT 1
            FROM page_outlinks o
            JOIN pages src ON src.id = o.from_page_id
            WHERE o.to_page_ids && m.ids AND NOT o.from_page_id = ANY(m.ids)
              AND src.status = 'fetched'
              -- A copy of the page (its canonical names it), the page a shown copy
              -- names, and that page's other copies are the page, not votes.
              AND src.canonical_url IS DISTINCT FROM m.url
              AND src.url IS DISTINCT FROM m.canonical_url
              AND (m.canonical_url IS NULL OR src.canonical_url IS DISTINCT FROM m.canonical_url)
              AND NOT {_SOURCE_SUPERSEDED}
              AND EXISTS (
                  SELECT 1
                  FROM unnest(o.to_page_ids, o.kinds, o.nofollow) AS e(id, kind, nofollow)
                  WHERE e.id = ANY(m.ids) AND e.kind = 'a' AND NOT e.nofollow
              )
            LIMIT :max_inlinks
        ) counted
    ) l
    CROSS JOIN LATERAL (
        SELECT count(DISTINCT sh.post_uri) AS shares
        FROM page_shares sh WHERE sh.url = ANY(m.urls)
    ) s
    ORDER BY score DESC, l.inlinks DESC, s.shares DESC, m.url
    LIMIT :limit
    """  # noqa: S608
)


async def search(
    engine: AsyncEngine, query: str, lang: str | None = None, limit: int = DEFAULT_LIMIT
) -> list[Hit]:
    """Fetched, indexable pages matching ``query`` (web search syntax), best first."""
    if not 1 <= limit <= MAX_LIMIT:
        raise SearchError(f"--limit must be from 1 to {MAX_LIMIT}, not {limit}")
    primary = exact = None
    if lang:
        if not LANG_OK.match(lang):
            raise SearchError(f"{lang!r} is not a language tag (like en, fr or pt-BR)")
        if "-" in lang:
            exact = lang.lower()
        else:
            primary = lang.lower()
        configs = [ts_config(lang)]
    else:
        configs = sorted({"simple", *TS_CONFIGS.values()})
    params = {
        "tags": list(TS_CONFIGS),
        "tag_configs": list(TS_CONFIGS.values()),
        "configs": configs,
        "query": query,
        "primary": primary,
        "exact": exact,
        "limit": limit,
        "pool": max(limit * POOL_PER_HIT, MIN_POOL),
        "max_inlinks": MAX_INLINKS_COUNTED,
    }
    async with engine.connect() as conn:
        rows = (await conn.execute(_SEARCH, params)).all()
    return [
        Hit(
            url=url,
            title=title,
            language=language,
            inlinks=int(n),
            score=float(score),
            shares=int(shared),
        )
        for url, title, language, n, score, shared in rows
    ]


def render_hits(hits: list[Hit], console: Console, query: str) -> None:
    if not hits:
        console.print(Text(f"no fetched page matches {query!r}"))
        return
    table = Table(
        title=Text(f"{len(hits)} result(s) for {query!r}"),
        title_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    table.add_column("title", overflow="ellipsis", max_width=50)
    table.add_column("url", overflow="fold")
    table.add_column("language")
    table.add_column("in-links", justify="right")
    table.add_column("shares", justify="right")
    for hit in hits:
        # Text(), not markup: titles and URLs come from the web and may hold "[...]".
        table.add_row(
            outside(hit.title or "(untitled)"),
            outside(hit.url),
            outside(hit.language or "?"),
            f"{hit.inlinks}+" if hit.inlinks >= MAX_INLINKS_COUNTED else str(hit.inlinks),
            str(hit.shares),
        )
    console.print(table)


async def search_command(
    database_url: str, query: str, lang: str | None, limit: int, console: Console
) -> int:
    """``trove search``: run the search against ``database_url`` and print the hits."""
    engine = database_engine(database_url)
    try:
        hits = await search(engine, query, lang, limit)
    finally:
        await engine.dispose()
    render_hits(hits, console, query)
    return 0
