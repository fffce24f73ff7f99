"""What a crawl did, read from the projections: the report at the end of ``trove crawl``.

A state folder kept from earlier crawls (no ``--fresh``), or a stack joined, holds more
than this crawl: the report counts the pages, attempts, shares and refused seeds since
the crawl began (through the indexes on their times), and says of the rest, the citation
graph and the followed timelines' totals, that it is every crawl's. The graph and the
pages only linked to are counted from a sample of their table once it is larger than
``trove status`` counts whole (``EXACT_ROWS``): a crawl of months has a billion links.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from trove_cli.outside import outside
from trove_cli.status import EXACT_ROWS, sample_source

#: ``build_report``'s start when it is given none: every attempt and share.
ALL_TIME = datetime.min.replace(tzinfo=UTC)

# A crawl's pages by status: those crawled since it began, and those discovered since
# and not crawled yet (a crawl stopped by its page limit or its timeout left them
# queued). Each found through its time's index, where an OR of the two read every page:
# the crawl's progress counts them twice a second.
PAGES_BY_STATUS = text(
    "SELECT status, count(*) FROM pages WHERE id IN (SELECT page_id FROM page_crawls "
    "WHERE completed_at >= :since UNION SELECT id FROM pages WHERE discovered_at >= :since) "
    "GROUP BY status ORDER BY status"
)

# Read from ``sample_source``'s source, a table's name or a sample of it (``{}``).
_LINKED_ONLY = "SELECT count(*), count(*) FILTER (WHERE discovered_at IS NULL) FROM {}"
_LINKS = "SELECT count(*), coalesce(sum(cardinality(to_page_ids)), 0) FROM {}"
# The most linked are kept before their pages are joined: a sample of a crawl of months
# links to millions of pages.
_TOP_LINKED = (
    "SELECT p.url, p.title, l.n FROM (SELECT e.id, count(DISTINCT o.from_page_id) AS n "
    "FROM (SELECT from_page_id, to_page_ids, kinds FROM {}) o "
    "CROSS JOIN LATERAL unnest(o.to_page_ids, o.kinds) AS e(id, kind) "
    "WHERE e.kind = 'a' GROUP BY e.id ORDER BY n DESC, e.id LIMIT :top) l "
    "JOIN pages p ON p.id = l.id ORDER BY l.n DESC, p.url"
)


@dataclass(slots=True)
class Report:
    #: The crawl's start: what the sections above the graph count from (None: all time).
    since: datetime | None = None
    #: The pages attempted or discovered since then, by their status now.
    pages_by_status: dict[str, int] = field(default_factory=dict)
    linked_only: int = 0
    crawls_by_outcome: dict[str, int] = field(default_factory=dict)
    domains: list[tuple[str, int, int]] = field(default_factory=list)
    languages: list[tuple[str, int]] = field(default_factory=list)
    top_linked: list[tuple[str, str | None, int]] = field(default_factory=list)
    #: (url, title, distinct posts that shared it, instances they were seen on).
    top_shared: list[tuple[str, str | None, int, int]] = field(default_factory=list)
    #: Followed fediverse timelines, and what their polls read: (timelines, posts kept,
    #: links they shared, posts skipped).
    followed: tuple[int, int, int, int] = (0, 0, 0, 0)
    links: int = 0
    rejected_seeds: list[tuple[str, str]] = field(default_factory=list)
    #: ``linked_only`` and the graph's counts (links, in-links) are estimates from a
    #: sample of their table (``EXACT_ROWS``).
    pages_estimated: bool = False
    graph_estimated: bool = False

    @property
    def fetched(self) -> int:
        return self.pages_by_status.get("fetched", 0)


async def progress_counts(engine: AsyncEngine, since: datetime | None = None) -> tuple[int, int]:
    """(pages finished, pages): the pages discovery sent to the fetcher or the fetcher
    crawled since ``since`` (None: ever), and those of them no longer waiting for it."""
    async with engine.connect() as conn:
        rows = (await conn.execute(PAGES_BY_STATUS, {"since": since or ALL_TIME})).all()
    queued = sum(int(n) for _, n in rows)
    return queued - sum(int(n) for status, n in rows if status == "discovered"), queued


def _scaled(n: int, estimate: float | None, sampled: int) -> int:
    """A count from a sample of ``sampled`` rows, as a count of the table's."""
    return n if estimate is None else round(n * estimate / max(sampled, 1))


async def refusals_so_far(engine: AsyncEngine) -> int:
    """The newest refused seed's row: a crawl's report lists those recorded after the
    crawl began, not the refusals of earlier crawls in a state folder kept from them."""
    async with engine.connect() as conn:
        found = await conn.execute(text("SELECT coalesce(max(id), 0) FROM seed_rejections"))
        return int(found.scalar_one())


#: Rows of each of the report's lists (domains, languages, refused seeds...).
TOP_ROWS = 10


async def build_report(
    engine: AsyncEngine,
    *,
    top: int = TOP_ROWS,
    refusals_after: int = 0,
    since: datetime | None = None,
    exact_rows: int = EXACT_ROWS,
) -> Report:
    report = Report(since=since)
    # The pages, attempts and shares since then, found through the indexes on
    # pages.discovered_at, page_crawls.completed_at and page_shares.first_seen_at.
    window = {"since": since or ALL_TIME, "top": top}
    async with engine.connect() as conn:
        rows = await conn.execute(PAGES_BY_STATUS, window)
        report.pages_by_status = {s: int(n) for s, n in rows.all()}
        pages, estimate = await sample_source(conn, "pages", exact_rows)
        report.pages_estimated = estimate is not None
        sampled, linked_only = (await conn.execute(text(_LINKED_ONLY.format(pages)))).one()
        report.linked_only = _scaled(int(linked_only), estimate, int(sampled))
        rows = await conn.execute(
            text(
                "SELECT outcome, count(*) FROM page_crawls WHERE completed_at >= :since "
                "GROUP BY outcome ORDER BY 2 DESC"
            ),
            window,
        )
        report.crawls_by_outcome = {o: int(n) for o, n in rows.all()}
        rows = await conn.execute(
            text(
                "SELECT domain, count(*) FILTER (WHERE status = 'fetched'), count(*) FROM pages "
                "WHERE id IN (SELECT page_id FROM page_crawls WHERE completed_at >= :since) "
                "GROUP BY domain ORDER BY 3 DESC, 1 LIMIT :top"
            ),
            window,
        )
        report.domains = [(d, int(f), int(n)) for d, f, n in rows.all()]
        rows = await conn.execute(
            text(
                "SELECT coalesce(language, '?'), count(*) FROM pages WHERE status = 'fetched' "
                "AND id IN (SELECT page_id FROM page_crawls WHERE completed_at >= :since) "
                "GROUP BY 1 ORDER BY 2 DESC, 1"
            ),
            window,
        )
        report.languages = [(lang, int(n)) for lang, n in rows.all()]
        # The graph, every crawl's: from a sample of its linking pages once it is large.
        outlinks, estimate = await sample_source(conn, "page_outlinks", exact_rows)
        report.graph_estimated = estimate is not None
        sampled, links = (await conn.execute(text(_LINKS.format(outlinks)))).one()
        report.links = _scaled(int(links), estimate, int(sampled))
        rows = await conn.execute(text(_TOP_LINKED.format(outlinks)), {"top": top})
        report.top_linked = [
            (u, t, _scaled(int(n), estimate, int(sampled))) for u, t, n in rows.all()
        ]
        rows = await conn.execute(
            text(
                "SELECT s.url, p.title, count(DISTINCT s.post_uri) AS n, "
                "count(DISTINCT s.instance) FROM page_shares s "
                "LEFT JOIN pages p ON p.url = s.url WHERE s.first_seen_at >= :since "
                "GROUP BY s.url, p.title ORDER BY n DESC, s.url LIMIT :top"
            ),
            window,
        )
        report.top_shared = [(u, t, int(n), int(i)) for u, t, n, i in rows.all()]
        row = (
            await conn.execute(
                text(
                    "SELECT count(*) FILTER (WHERE unfollowed_at IS NULL), "
                    "coalesce(sum(posts_seen), 0), coalesce(sum(links_found), 0), "
                    "coalesce(sum(skipped), 0) FROM instances"
                )
            )
        ).one()
        report.followed = (int(row[0]), int(row[1]), int(row[2]), int(row[3]))
        rows = await conn.execute(
            text(
                "SELECT raw, reason FROM seed_rejections WHERE id > :after "
                "ORDER BY occurred_at DESC, id DESC LIMIT :top"
            ),
            {"after": refusals_after, "top": top},
        )
        # The newest, listed in the order they came.
        report.rejected_seeds = [(r, why) for r, why in reversed(rows.all())]
    return report


def render(report: Report, console: Console) -> None:
    def table(title: str, *columns: str) -> Table:
        t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
        for column in columns:
            numeric = column in {"pages", "crawls", "fetched", "in-links", "shares", "instances"}
            t.add_column(
                column,
                justify="right" if numeric else "left",
                overflow="fold" if column == "url" else "ellipsis",
            )
        return t

    status = table("Pages by status", "status", "pages")
    for name, n in report.pages_by_status.items():
        status.add_row(name, str(n))
    outcomes = table("Crawls by outcome", "outcome", "crawls")
    for name, n in report.crawls_by_outcome.items():
        outcomes.add_row(name, str(n))
    domains = table("Domains", "domain", "fetched", "pages")
    for name, fetched, n in report.domains:
        domains.add_row(name, str(fetched), str(n))
    languages = table("Languages", "language", "pages")
    for name, n in report.languages:
        languages.add_row(name, str(n))
    parts: list[Table] = [status, outcomes, domains, languages]
    # Text(), not markup, for what comes from the web or a seed: a title "[/r/python]"
    # would end the report in a MarkupError, "[pdf] Report" lose its "[pdf]".
    if report.top_shared:
        shared = table("Most shared pages (fediverse)", "url", "title", "shares", "instances")
        for url, title, n, instances in report.top_shared:
            shared.add_row(outside(url), outside(title or "", cut=40), str(n), str(instances))
        parts.append(shared)
    if report.rejected_seeds:
        rejected = table("Rejected seeds", "seed", "reason")
        for raw, why in report.rejected_seeds:
            rejected.add_row(outside(raw, cut=60), outside(why))
        parts.append(rejected)
    if report.since is None:
        console.print(Text("All crawls", style="bold"))
    else:
        began = report.since.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
        console.print(Text(f"Since this crawl began ({began} UTC)", style="bold"))
    console.print(Group(*[p for t in parts for p in (t, "")]))
    graph = "≈" if report.graph_estimated else ""
    linked = table(
        "Most linked pages" + (" (estimated from a sample)" if graph else ""),
        "url",
        "title",
        "in-links",
    )
    for url, title, n in report.top_linked:
        linked.add_row(outside(url), outside(title or "", cut=40), f"{graph}{n}")
    # The graph and the timelines' totals are the database's, earlier crawls' included.
    console.print(Text("All crawls in this database", style="bold"))
    console.print(Group(linked, ""))
    pages = "≈" if report.pages_estimated else ""
    console.print(
        f"{graph}{report.links} links in the citation graph; {pages}{report.linked_only} "
        "pages linked only (not crawled)."
    )
    timelines, posts, links, skipped = report.followed
    if timelines or posts:
        console.print(
            f"{timelines} fediverse timeline(s) followed: {posts} posts read, {links} links "
            f"shared, {skipped} posts skipped (not public, or their authors opted out)."
        )
