"""page_shares: an index on first_seen_at, for the shares' retention

With ``TROVE_SHARES_RETENTION_SECONDS`` set, the recorder deletes the shares first seen
before the window, oldest first; the index finds them without a scan of every share
ever seen. Built concurrently, outside the migration's transaction, as 0009's; a build
cut short leaves an invalid index of the name, which is dropped and built again.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29 12:00:00
"""

from collections.abc import Sequence

from alembic import op

from trove_schema.migrate import create_index_online

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_page_shares_first_seen_at"


def upgrade() -> None:
    create_index_online(INDEX, "page_shares", "first_seen_at")


def downgrade() -> None:
    op.drop_index(INDEX, table_name="page_shares")
