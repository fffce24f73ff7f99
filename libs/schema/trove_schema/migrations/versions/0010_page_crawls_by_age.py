"""page_crawls: an index on completed_at, for the crawl history's retention

With ``TROVE_CRAWL_HISTORY_RETENTION_SECONDS`` set, the recorder deletes the old
attempts a later success of their page superseded, oldest first; the index finds them
without a scan of the whole history at every pass. Building it reads and sorts the
table's completion times once; the recorder's inserts wait for it, retried, and nothing
is lost.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27 18:30:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_page_crawls_completed_at",
        "page_crawls",
        ["completed_at"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_page_crawls_completed_at", table_name="page_crawls")
