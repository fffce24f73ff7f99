"""page_crawls: an index on completed_at, for the crawl history's retention

With ``TROVE_CRAWL_HISTORY_RETENTION_SECONDS`` set, the recorder deletes the old
attempts a later success of their page superseded, oldest first; the index finds them
without a scan of the whole history at every pass. Built concurrently, outside the
migration's transaction: it reads and sorts the table's completion times once (hours on
a crawl of months), and a plain build would hold up every insert of the recorder as
long. A build cut short (the process killed, a deadlock) leaves an invalid index of the
name, which is dropped and built again.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27 18:30:00
"""

from collections.abc import Sequence

from alembic import op

from trove_schema.migrate import create_index_online

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_page_crawls_completed_at"


def upgrade() -> None:
    create_index_online(INDEX, "page_crawls", "completed_at")


def downgrade() -> None:
    op.drop_index(INDEX, table_name="page_crawls")
