"""What changed in ``pages`` since an index last read it, in commit order.

An index kept from Trove's tables reads, at each pass, the pages whose
``changed_xact`` (the transaction that last changed what an index reads of a page:
migration 0019's trigger) lies in a window: from the bound its last pass ended at, to
the oldest transaction still running now. Every transaction below that bound has
ended, so a batch that began before the last pass and committed after it is read at
the next, and each change is read once; a row changed again meanwhile is read with its
newest state. The first pass (no bound yet) reads every row. Rows are read in pages of
ids within the window, each page its own short statement.

A window is a pair of transaction ids: kept by the index with what it read, they mean
nothing to another database (a restored backup, a new cluster, a standby promoted
before it had every commit of the primary it replaced), where it starts again with a
first pass; ``changed_pages`` refuses a window that starts past the database's own
transactions (``WindowLost``), which is how such a move usually shows. Only the columns
that move the window are read: a visit that changes none of them (its time, its
validators) brings no page into it. A replay with ``--truncate`` writes every row
again, so every page is in the next window: the index reads the crawl whole, keyed by
URL (ids are numbered anew).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from trove_schema.errors import WindowLost

#: The end of the window a pass reads: every transaction below it has ended.
_BOUND = text("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")

#: What an index reads of each page.
_CHANGED = text(
    """
    SELECT p.id, p.url, p.status, p.title, p.language, p.noindex, p.content_hash,
           p.canonical_url, p.final_url,
           array_to_string(tsvector_to_array(p.keywords_tsv), ' ') AS terms
    FROM pages p
    WHERE p.id > :after
      AND (p.changed_xact >= :since OR CAST(:since AS bigint) IS NULL)
      AND (p.changed_xact < :until OR p.changed_xact IS NULL AND CAST(:since AS bigint) IS NULL)
    ORDER BY p.id
    LIMIT :limit
    """
)


@dataclass(frozen=True, slots=True)
class ChangedPage:
    id: int
    url: str
    status: str
    title: str | None
    language: str | None
    noindex: bool
    content_hash: str | None
    canonical_url: str | None
    final_url: str | None
    #: The page's terms (its ``keywords_tsv``'s lexemes), space-separated.
    terms: str

    @property
    def indexable(self) -> bool:
        """Whether an index holds it: fetched, not noindex, and read at its own URL (a
        row with a ``final_url`` is an old name, whose redirect led to a page of its
        own row). Everything else a window brings (failed, gone, refused, noindex now,
        redirected now) is what an index drops."""
        return self.status == "fetched" and not self.noindex and self.final_url is None


async def window_end(conn: AsyncConnection) -> int:
    """Where the window a pass reads ends (and the next pass's starts)."""
    bound = (await conn.execute(_BOUND)).scalar_one()
    return int(bound)


async def changed_pages(
    conn: AsyncConnection, since: int | None, until: int, *, after: int = 0, limit: int = 1000
) -> list[ChangedPage]:
    """Up to ``limit`` pages changed in [``since``, ``until``), by id past ``after``
    (the last id of the page before). ``since`` None: every page, the first pass.

    Raises ``WindowLost`` when ``since`` lies past ``until``: transaction ids counted
    again below the ones the index read (a restored backup, a standby promoted before
    it had every commit), where what changed since cannot be told from what did not."""
    if since is not None and since > until:
        raise WindowLost(
            f"the window read last ended at transaction {since}, past this database's "
            f"{until}: not the database it was read from (a restored backup, a promoted "
            "standby); read every page again, a first pass"
        )
    rows = await conn.execute(
        _CHANGED, {"since": since, "until": until, "after": after, "limit": limit}
    )
    return [ChangedPage(**row._mapping) for row in rows]
