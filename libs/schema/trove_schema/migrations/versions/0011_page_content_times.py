"""pages: when its content and its links were last set

A page's columns come from different attempts: its status from the newest, its title,
keywords and validators from the newest success, its links from the newest that said
what it links to. Each group is kept from the newest attempt of its kind, whatever
order they arrive in: a success that arrives after a newer 304 (redriven from the
dead-letter stream, or in a batch that lost a race) still gives the page its content.
``last_crawled_at`` alone made it the floor for every group, and such a page stayed
without a title until it next changed.

Nullable, no backfill: a row from before (NULL, and content or links already there)
keeps ``last_crawled_at`` as its floor until its next success or links set them.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-29 07:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: How long the ALTER waits for its lock (``env.py`` tries it again a while).
LOCK_TIMEOUT = "5s"


def upgrade() -> None:
    # The ADD needs the table to itself for a moment: queued behind a long reader, it
    # would hold up every writer meanwhile. It gives way instead, and is tried again.
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.add_column("pages", sa.Column("content_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("pages", sa.Column("linked_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("pages", "linked_at")
    op.drop_column("pages", "content_at")
