"""pages.last_crawled_at: order-independent projection of attempts

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21 07:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("pages", sa.Column("last_crawled_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("pages", "last_crawled_at")
