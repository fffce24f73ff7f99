"""pages: where a page was last read, when a redirect on its host led there

A page asked as ``http://blog.example/post`` that answers at ``https://blog.example/post``
is kept under both names: the URL it was asked by, with what its redirect led to, and
the target, a page of its own. Search showed it twice. ``final_url`` says where the
page's newest success or 304 read it; search leaves out a row whose ``final_url`` is a
page fetched where it answers itself, or one looked at since the row was read.

Nullable, no backfill: a row from before is shown as it was until its next success or
304 (or a replay) says where it was read.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-30 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: How long the ALTER waits for its lock (``env.py`` tries it again a while).
LOCK_TIMEOUT = "5s"


def upgrade() -> None:
    # The ADD needs the table to itself for a moment: queued behind a long reader, it
    # would hold up every writer meanwhile. It gives way instead, and is tried again.
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.add_column("pages", sa.Column("final_url", sa.String(2048), nullable=True))


def downgrade() -> None:
    op.drop_column("pages", "final_url")
