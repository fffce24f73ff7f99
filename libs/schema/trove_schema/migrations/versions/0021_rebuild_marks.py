"""rebuild_marks: a whole replay that has not read the record to its end

A whole replay (``trove replay --truncate``) holds an advisory lock while it rebuilds
the tables, and the live recorders wait for it. One that stopped partway (the broker
away past its patience, its lock lost, Ctrl-C, a kill) let the lock go with its
connection, and the live recorders then applied their backlog to tables half rebuilt.
The mark, written with the truncation and removed when the replay reads the record to
its end, keeps them waiting until a replay finishes the rebuild.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-03 18:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rebuild_marks",
        sa.Column(
            "started_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("applied_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("applied_seq", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("started_at", name=op.f("pk_rebuild_marks")),
    )


def downgrade() -> None:
    op.drop_table("rebuild_marks")
