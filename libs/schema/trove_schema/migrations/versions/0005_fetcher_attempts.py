"""fetcher_attempts and attempt_heuristics: the audit of every request, with its tags

Projections of ``CrawlCompleted`` like the rest; kept for a retention window and
deleted in batches by the recorder. ``page_id`` has no foreign key, so the audit
outlives its pages. ``attempt_id`` has none either: the projection writes the tags in
their attempt's transaction, retention deletes them together, and a foreign key
checked on each of the ~20 tags of an attempt doubled the time of writing them (a
batch of 500 attempts: 100 ms with it, 48 ms without).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 16:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "fetcher_attempts",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("event_id", sa.UUID(), nullable=False),
        sa.Column("page_id", sa.BigInteger(), nullable=True),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("host", sa.String(length=253), nullable=False),
        sa.Column("fetcher", sa.Text(), nullable=False),
        sa.Column("success", sa.Boolean(), nullable=False),
        sa.Column("is_banned", sa.Boolean(), nullable=False),
        sa.Column("error_type", sa.Text(), nullable=True),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column(
            "response_headers",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.Column("attempted_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fetcher_attempts")),
        sa.UniqueConstraint("event_id", name=op.f("uq_fetcher_attempts_event_id")),
    )
    op.create_index("ix_fetcher_attempts_page_id", "fetcher_attempts", ["page_id"])
    op.create_index("ix_fetcher_attempts_url", "fetcher_attempts", ["url"])
    op.create_index("ix_fetcher_attempts_attempted_at", "fetcher_attempts", ["attempted_at"])
    op.create_index(
        "ix_fetcher_attempts_host_attempted_at", "fetcher_attempts", ["host", "attempted_at"]
    )
    op.create_table(
        "attempt_heuristics",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("attempt_id", sa.BigInteger(), nullable=False),
        sa.Column("heuristic_type", sa.Text(), nullable=False),
        sa.Column("heuristic_value", sa.Text(), nullable=False),
        sa.Column("importance_score", sa.Float(), server_default="0.5", nullable=False),
        sa.CheckConstraint(
            "importance_score BETWEEN 0 AND 1", name=op.f("ck_attempt_heuristics_importance")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempt_heuristics")),
    )
    op.create_index("ix_attempt_heuristics_attempt_id", "attempt_heuristics", ["attempt_id"])
    op.create_index(
        "ix_attempt_heuristics_type_value",
        "attempt_heuristics",
        ["heuristic_type", "heuristic_value"],
    )


def downgrade() -> None:
    op.drop_table("attempt_heuristics")
    op.drop_table("fetcher_attempts")
