"""projected_events: an index on projected_at, for the retention of applied ids

When the record has a retention (``TROVE_EVENTS_MAX_AGE_SECONDS``), the recorder deletes
the ids of events the record can no longer deliver again; the index finds them without a
scan of every id ever applied. Built concurrently, outside the migration's transaction:
it reads and sorts the table's timestamps once (1.2 s for 4 million ids here, hours on a
crawl of months), and a plain build would hold up every insert of the recorder as long.
A build cut short (the process killed, a deadlock) leaves an invalid index of the name,
which is dropped and built again.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27 17:00:00
"""

from collections.abc import Sequence

from alembic import op

from trove_schema.migrate import create_index_online

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_projected_events_projected_at"


def upgrade() -> None:
    create_index_online(INDEX, "projected_events", "projected_at")


def downgrade() -> None:
    op.drop_index(INDEX, table_name="projected_events")
