"""What a crawl did, read from the projections: the report at the end of ``trove crawl``.

A state folder kept from earlier crawls (no ``--fresh``), or a stack joined, holds more
than this crawl: the report counts the attempts, shares and refused seeds since the crawl
began (through the indexes on their times), and says of the rest, the citation graph and
the followed timelines' totals, that it is every crawl's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

#: ``build_report``'s start when it is given none: every attempt and share.
ALL_TIME = datetime.min.replace(tzinfo=UTC)


@dataclass(slots=True)
class Report:
    #: The crawl's start: what the sections above the graph count from (None: all time).
    since: datetime | None = None
    #: The pages attempted since then, by their status now.
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

    @property
    def fetched(self) -> int:
        return self.pages_by_status.get("fetched", 0)


async def progress_counts(engine: AsyncEngine) -> tuple[int, int]:
    """(queued pages finished, queued pages): pages discovery sent to the fetcher."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT count(*) FILTER (WHERE status <> 'discovered'), count(*) "
                    "FROM pages WHERE discovered_at IS NOT NULL"
                )
            )
        ).one()
    return int(row[0]), int(row[1])


async def refusals_so_far(engine: AsyncEngine) -> int:
    """The newest refused seed's row: a crawl's report lists those recorded after the
    crawl began, not the refusals of earlier crawls in a state folder kept from them."""
    async with engine.connect() as conn:
        found = await conn.execute(text("SELECT coalesce(max(id), 0) FROM seed_rejections"))
        return int(found.scalar_one())


async def build_report(
    engine: AsyncEngine,
    *,
    top: int = 10,
    refusals_after: int = 0,
    since: datetime | None = None,
) -> Report:
    report = Report(since=since)
    # The pages, attempts and shares since then, found through the indexes on
    # page_crawls.completed_at and page_shares.first_seen_at.
    window = {"since": since or ALL_TIME, "top": top}
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                # Pages crawled since, and those discovered since and not crawled yet (a
                # crawl stopped by its page limit or its timeout left them queued).
                "SELECT status, count(*) FROM pages WHERE id IN (SELECT page_id FROM "
                "page_crawls WHERE completed_at >= :since) OR discovered_at >= :since "
                "GROUP BY status ORDER BY status"
            ),
            window,
        )
        report.pages_by_status = {s: int(n) for s, n in rows.all()}
        report.linked_only = int(
            (
                await conn.execute(text("SELECT count(*) FROM pages WHERE discovered_at IS NULL"))
            ).scalar_one()
        )
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
        rows = await conn.execute(
            text(
                "SELECT p.url, p.title, count(DISTINCT l.from_page_id) AS n FROM page_links l "
                "JOIN pages p ON p.id = l.to_page_id WHERE l.kind = 'a' "
                "GROUP BY p.id ORDER BY n DESC, p.url LIMIT :top"
            ),
            {"top": top},
        )
        report.top_linked = [(u, t, int(n)) for u, t, n in rows.all()]
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
        report.links = int(
            (
                await conn.execute(
                    text("SELECT coalesce(sum(cardinality(to_page_ids)), 0) FROM page_outlinks")
                )
            ).scalar_one()
        )
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
            shared.add_row(Text(url), Text((title or "")[:40]), str(n), str(instances))
        parts.append(shared)
    if report.rejected_seeds:
        rejected = table("Rejected seeds", "seed", "reason")
        for raw, why in report.rejected_seeds:
            rejected.add_row(Text(raw[:60]), Text(why))
        parts.append(rejected)
    if report.since is None:
        console.print(Text("All crawls", style="bold"))
    else:
        began = report.since.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
        console.print(Text(f"Since this crawl began ({began} UTC)", style="bold"))
    console.print(Group(*[p for t in parts for p in (t, "")]))
    linked = table("Most linked pages", "url", "title", "in-links")
    for url, title, n in report.top_linked:
        linked.add_row(Text(url), Text((title or "")[:40]), str(n))
    # The graph and the timelines' totals are the database's, earlier crawls' included.
    console.print(Text("All crawls in this database", style="bold"))
    console.print(Group(linked, ""))
    console.print(
        f"{report.links} links in the citation graph; {report.linked_only} pages linked "
        "only (not crawled)."
    )
    timelines, posts, links, skipped = report.followed
    if timelines or posts:
        console.print(
            f"{timelines} fediverse timeline(s) followed: {posts} posts read, {links} links "
            f"shared, {skipped} posts skipped (not public, or their authors opted out)."
        )
