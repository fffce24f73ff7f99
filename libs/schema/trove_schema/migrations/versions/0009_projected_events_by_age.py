"""projected_events: an index on projected_at, for the retention of applied ids

When the record has a retention (``TROVE_EVENTS_MAX_AGE_SECONDS``), the recorder deletes
the ids of events the record can no longer deliver again; the index finds them without a
scan of every id ever applied. Building it reads and sorts the table's timestamps once
(1.2 s for 4 million ids here); the recorder's inserts wait for it, retried, and nothing
is lost.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27 17:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_projected_events_projected_at",
        "projected_events",
        ["projected_at"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_projected_events_projected_at", table_name="projected_events")
