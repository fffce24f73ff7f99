"""pages by discovery, the audit by host with its verdicts; the indexes nothing reads go

``trove crawl`` counts the pages it queued twice a second and reports those it found:
without an index on ``pages.discovered_at`` each count read the whole table, a crawl of
months' tens of millions of rows, for a crawl of a few hundred. ``trove domain HOST``
counts a host's attempts by result and error type: the host's index holds the verdict
now (``INCLUDE``), so a busy host's audit is read once from the index, where each of two
queries fetched every row of it from the table; the index on (host, time) alone serves
nothing the new one does not.

Dropped: ``page_crawls (page_id, created_at DESC)``, which 0014's ``(page_id,
completed_at)`` replaced (no query reads the attempts by ``created_at``; a page's
attempts, the foreign key's look-ups too, are found through 0014's), and the audit's
indexes on ``url`` and ``page_id``, which no query reads and every attempt wrote to
(the URL's the larger: up to 2,048 characters an entry).

Built and dropped concurrently, outside the migration's transaction, as 0013's: the
recorder's writes go on meanwhile. A build reads its table twice (here 3.2 s for 2
million pages, 5.1 s for 2 million attempts; the pages and the audit are the largest
tables, so hours on a crawl of months); a drop waits for the transactions that use its
table to end, and holds up no reader nor writer. A build cut short leaves an invalid
index of the name, which is dropped and built again.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29 19:30:00
"""

from collections.abc import Sequence

from alembic import op

from trove_schema.migrate import create_index_online

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DISCOVERED_INDEX = "ix_pages_discovered_at"
VERDICT_INDEX = "ix_fetcher_attempts_host_attempted_at_verdict"
VERDICT_COLUMNS = "host, attempted_at"
VERDICT_CARRIED = "success, is_banned, error_type"
#: Each dropped index: its table and its columns, to build it again on a downgrade.
DROPPED = {
    "ix_page_crawls_page_id_created_at": ("page_crawls", "page_id, created_at DESC"),
    "ix_fetcher_attempts_host_attempted_at": ("fetcher_attempts", "host, attempted_at"),
    "ix_fetcher_attempts_url": ("fetcher_attempts", "url"),
    "ix_fetcher_attempts_page_id": ("fetcher_attempts", "page_id"),
}


def _drop_index_online(name: str) -> None:
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


def upgrade() -> None:
    # Built before the one it replaces is dropped: the host's reads always have one.
    create_index_online(DISCOVERED_INDEX, "pages", "discovered_at")
    create_index_online(VERDICT_INDEX, "fetcher_attempts", VERDICT_COLUMNS, VERDICT_CARRIED)
    for name in DROPPED:
        _drop_index_online(name)


def downgrade() -> None:
    for name, (table, columns) in DROPPED.items():
        create_index_online(name, table, columns)
    _drop_index_online(VERDICT_INDEX)
    _drop_index_online(DISCOVERED_INDEX)
