"""host_policies: each host's learned policy, folded from its attempts, for the operator

A projection of ``CrawlCompleted`` like the rest (``trove_schema.policy``): the policy
as JSON, with the pause, the risk level and the attempt count beside it as columns an
operator can filter hosts by (the paused ones: ``paused_until > now()``). The fetchers
never read it; they keep their own copy in KV.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23 17:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "host_policies",
        sa.Column("host", sa.String(length=253), nullable=False),
        sa.Column(
            "policy",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("paused_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("pause_reason", sa.Text(), nullable=True),
        sa.Column("risk_level", sa.Integer(), server_default="0", nullable=False),
        sa.Column("attempt_count", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_event_id", sa.UUID(), nullable=True),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("host", name=op.f("pk_host_policies")),
    )
    op.create_index("ix_host_policies_paused_until", "host_policies", ["paused_until"])


def downgrade() -> None:
    op.drop_table("host_policies")
