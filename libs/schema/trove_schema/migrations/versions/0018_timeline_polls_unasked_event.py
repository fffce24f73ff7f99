"""timeline_polls: whether a poll asked the instance anything

A poll deferred for its host's slot (after a 403 or an outage the host stays paused up
to a day, past the chain's own back-off) ends as a success that made no request. It
tells nothing of the instance: it neither ends the timeline's run of failures nor is its
last answer. Kept with its outcome a success, as the event says, and its event id in
``unasked_event``: the row asked nothing while that is its ``event_id``. The release
before reads such a row as the success it took it for (an outcome of its own would
break that release's check on ``instances.last_outcome``), and where it writes the
row again, for another copy of the poll, the event id it writes says "asked" (a flag
would have stayed behind, saying it of that copy's answer).

Nullable, no backfill: a row from before counts as asked (a replay tells them apart).

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-30 21:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: How long the ALTER waits for its lock (``env.py`` tries it again a while).
LOCK_TIMEOUT = "5s"


def upgrade() -> None:
    # The ADD needs the table to itself for a moment: queued behind a long reader, it
    # would hold up every writer meanwhile. It gives way instead, and is tried again.
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.add_column(
        "timeline_polls", sa.Column("unasked_event", postgresql.UUID(as_uuid=True), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("timeline_polls", "unasked_event")
