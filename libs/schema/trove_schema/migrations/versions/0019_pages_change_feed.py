"""pages: what changed, in commit order, for an index kept from the tables

An index built from ``pages`` had no safe way to ask what changed since it last read.
``updated_at`` is the writing transaction's start, not its commit: a batch that began
before the reader's cursor and committed after it was never seen (a page gone 410,
missing from the index for good), and it has no index (each poll read the table: 0.4 s
and 0.9 GB of buffers at 1.5 million pages).

``changed_xact`` is the id of the transaction that last changed what an index reads
of a page (its status, title, language, terms, hash, canonical, final URL, noindex),
set by a trigger on every path that writes the row, and by the column's default on a
row's insert. A reader takes every row whose ``changed_xact`` lies between the
oldest transaction still running at its last read and the one now
(``pg_snapshot_xmin(pg_current_snapshot())``): every transaction below that bound has
ended, so nothing it committed is missed, whenever it commits, and each change is read
once (PLATFORM.md, "Reading the tables"). A re-crawl that changes none of those columns
leaves it alone: the row's update stays a heap-only one, as before.

Nullable, no backfill: a row from before was changed before any reader's first read,
which reads every row. The index is built concurrently, as 0015's, after the column and
the trigger are committed: a build cut short leaves them in place with the revision
unrecorded, so each step is one that can be run again.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-01 03:00:00
"""

from collections.abc import Sequence

from alembic import op

from trove_schema.migrate import create_index_online

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: How long the ALTER waits for its lock (``env.py`` tries it again a while).
LOCK_TIMEOUT = "5s"
INDEX = "ix_pages_changed_xact"
#: What an index reads of a page: a change to any of them moves ``changed_xact``.
WATCHED = (
    "status",
    "title",
    "language",
    "keywords_tsv",
    "content_hash",
    "canonical_url",
    "final_url",
    "noindex",
)
CURRENT_XACT = "pg_current_xact_id()::text::bigint"


def upgrade() -> None:
    # The ADD needs the table to itself for a moment: queued behind a long reader, it
    # would hold up every writer meanwhile. It gives way instead, and is tried again.
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute("ALTER TABLE pages ADD COLUMN IF NOT EXISTS changed_xact bigint")
    # Set apart from the ADD: a volatile default there would rewrite every row.
    op.execute(f"ALTER TABLE pages ALTER COLUMN changed_xact SET DEFAULT {CURRENT_XACT}")
    op.execute(
        "CREATE OR REPLACE FUNCTION trove_page_changed() RETURNS trigger "
        "LANGUAGE plpgsql AS $$ BEGIN "
        f"NEW.changed_xact := {CURRENT_XACT}; RETURN NEW; END $$"
    )
    old = ", ".join(f"OLD.{column}" for column in WATCHED)
    new = ", ".join(f"NEW.{column}" for column in WATCHED)
    op.execute(
        "CREATE OR REPLACE TRIGGER pages_changed BEFORE UPDATE ON pages FOR EACH ROW "
        f"WHEN (({old}) IS DISTINCT FROM ({new})) EXECUTE FUNCTION trove_page_changed()"
    )
    create_index_online(INDEX, "pages", "changed_xact")


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute("DROP TRIGGER IF EXISTS pages_changed ON pages")
    op.execute("DROP FUNCTION IF EXISTS trove_page_changed()")
    op.drop_column("pages", "changed_xact")
