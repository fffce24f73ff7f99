"""timeline_polls and instance_unfollows: a followed timeline's row in any order

The recorder applies two batches at once, on each of its replicas, and a batch handed
back commits after later ones: an unfollow may be applied before its follow, a poll
before its follow, a poll before the one before it. ``instances`` is worked out from
what the events left, not from the order they came in: each poll (what it counted, what
it ended on) and each unfollow is kept, for a follow applied after them, and
``instances.software_at`` dates the software a row names, so that an older poll
applied later does not replace it.

The rows the tables start with are what ``instances`` holds: its unfollows, and each
follow's last poll (``failing_since`` as a failed poll 0 before it, so the failures
already counted keep their start). Counts were made already, so these rows count
nothing.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-30 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: How long the ALTER of ``instances`` waits for its lock (``env.py`` tries it again).
LOCK_TIMEOUT = "5s"


def upgrade() -> None:
    # The ADD COLUMN needs ``instances`` to itself for a moment: behind a long reader it
    # would hold up the recorder's writes meanwhile. It gives way instead.
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.create_table(
        "timeline_polls",
        sa.Column("follow_id", sa.UUID(), nullable=False),
        sa.Column("poll", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("event_id", sa.UUID(), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("posts", sa.Integer(), nullable=False),
        sa.Column("links", sa.Integer(), nullable=False),
        sa.Column("skipped", sa.Integer(), nullable=False),
        sa.Column("cursor", sa.Text(), nullable=True),
        sa.Column("next_poll_after", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("follow_id", "poll", name=op.f("pk_timeline_polls")),
    )
    op.create_table(
        "instance_unfollows",
        sa.Column("event_id", sa.UUID(), nullable=False),
        sa.Column("instance", sa.String(length=2048), nullable=False),
        sa.Column("timeline", sa.String(length=120), nullable=True),
        sa.Column("unfollowed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_instance_unfollows")),
    )
    op.create_index(
        op.f("ix_instance_unfollows_instance"), "instance_unfollows", ["instance"], unique=False
    )
    op.add_column("instances", sa.Column("software_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(
        "UPDATE instances SET software_at = coalesce(last_poll_at, updated_at) "
        "WHERE software IS NOT NULL"
    )
    op.execute(
        "INSERT INTO instance_unfollows (event_id, instance, timeline, unfollowed_at) "
        "SELECT CAST(md5('unfollowed ' || instance || ' ' || timeline) AS uuid), instance, "
        "timeline, unfollowed_at FROM instances WHERE unfollowed_at IS NOT NULL"
    )
    op.execute(
        "INSERT INTO timeline_polls (follow_id, poll, event_id, completed_at, outcome, "
        "status_code, error, posts, links, skipped, cursor, next_poll_after) "
        "SELECT follow_id, last_poll, "
        "CAST(md5('polled ' || CAST(follow_id AS text) || ' ' || last_poll) AS uuid), "
        "last_poll_at, last_outcome, last_status_code, last_error, 0, 0, 0, cursor, "
        "next_poll_after FROM instances "
        "WHERE last_poll > 0 AND last_poll_at IS NOT NULL AND last_outcome IS NOT NULL"
    )
    op.execute(
        "INSERT INTO timeline_polls (follow_id, poll, event_id, completed_at, outcome, "
        "posts, links, skipped) "
        "SELECT follow_id, 0, CAST(md5('failing ' || CAST(follow_id AS text)) AS uuid), "
        "failing_since, 'failed', 0, 0, 0 FROM instances "
        "WHERE last_poll > 0 AND failing_since < last_poll_at"
    )


def downgrade() -> None:
    op.drop_column("instances", "software_at")
    op.drop_index(op.f("ix_instance_unfollows_instance"), table_name="instance_unfollows")
    op.drop_table("instance_unfollows")
    op.drop_table("timeline_polls")
