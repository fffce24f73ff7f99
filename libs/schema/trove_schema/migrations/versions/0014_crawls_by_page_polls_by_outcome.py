"""page_crawls by page and completion, timeline_polls by follow and outcome: lookups

The retry policy counts a page's attempts since its last success (its chain) under the
page's lock, at every retryable attempt; without an index on the page's completion times
that read the page's whole history twice, and the history is kept for ever by default.
A timeline's row, at every poll, and the polls' retention, every ten minutes for every
old poll, look for its follow's newest success; without an index on the outcome that
read the follow's polls, all of them for a follow that never succeeds (a dead instance
nobody unfollowed): the retention's pass grew with the square of its polls. Built
concurrently, outside the migration's transaction, as 0013's; a build cut short leaves
an invalid index of the name, which is dropped and built again.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29 14:30:00
"""

from collections.abc import Sequence

from alembic import op

from trove_schema.migrate import create_index_online

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CRAWLS_INDEX = "ix_page_crawls_page_id_completed_at"
POLLS_INDEX = "ix_timeline_polls_follow_id_outcome_poll"


def upgrade() -> None:
    create_index_online(CRAWLS_INDEX, "page_crawls", "page_id, completed_at")
    create_index_online(POLLS_INDEX, "timeline_polls", "follow_id, outcome, poll")


def downgrade() -> None:
    op.drop_index(POLLS_INDEX, table_name="timeline_polls")
    op.drop_index(CRAWLS_INDEX, table_name="page_crawls")
