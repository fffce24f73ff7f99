"""instances and page_shares: followed fediverse timelines and the posts that shared pages

Projections of ``InstanceFollowed``, ``InstanceUnfollowed`` and ``TimelinePolled`` like
the rest, rebuilt by replay. ``page_shares`` is keyed by the shared URL and the post's
md5: two URLs of up to 2,048 characters could pass the largest entry a btree takes
(2,704 bytes), and such a share would fail to insert for good. The same index serves
the join of shares to pages on ``url`` (no foreign key: a share is recorded before its
page is crawled).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 17:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: ``CrawlOutcome``'s values when this was written (a migration never imports the models).
OUTCOMES = (
    "success",
    "failed",
    "timeout",
    "blocked_robots",
    "blocked_4xx",
    "blocked_5xx",
    "rejected",
    "not_modified",
)


def upgrade() -> None:
    op.create_table(
        "instances",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("instance", sa.String(length=2048), nullable=False),
        sa.Column("domain", sa.String(length=253), nullable=False),
        sa.Column("timeline", sa.String(length=120), nullable=False),
        sa.Column("follow_id", sa.UUID(), nullable=False),
        sa.Column("followed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("unfollowed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("max_depth", sa.Integer(), server_default="0", nullable=False),
        sa.Column("software", sa.Text(), nullable=True),
        sa.Column("software_version", sa.Text(), nullable=True),
        sa.Column("last_poll", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_poll_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_outcome", sa.String(length=16), nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("polls", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("posts_seen", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("links_found", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("skipped", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("cursor", sa.Text(), nullable=True),
        sa.Column("next_poll_after", sa.DateTime(timezone=True), nullable=True),
        sa.Column("failing_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(
            "last_outcome IS NULL OR last_outcome IN ("
            + ", ".join(repr(o) for o in OUTCOMES)
            + ")",
            name=op.f("ck_instances_outcome"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instances")),
        sa.UniqueConstraint("instance", "timeline", name=op.f("uq_instances_instance_timeline")),
    )
    op.create_table(
        "page_shares",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("post_uri", sa.String(length=2048), nullable=False),
        sa.Column("post_url", sa.String(length=2048), nullable=True),
        sa.Column("instance", sa.String(length=2048), nullable=False),
        sa.Column("account", sa.Text(), nullable=False),
        sa.Column("shared_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("language", sa.String(length=35), nullable=True),
        sa.Column("first_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_page_shares")),
    )
    op.create_index(
        "uq_page_shares_url_post_uri",
        "page_shares",
        ["url", sa.text("md5(post_uri)")],
        unique=True,
    )


def downgrade() -> None:
    op.drop_table("page_shares")
    op.drop_table("instances")
