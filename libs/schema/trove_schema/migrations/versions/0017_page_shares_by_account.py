"""page_shares by account: an account that opts out later has its shares withdrawn

A poll that skips a public post because its account opted out says so by the account's
key (the md5 of ``user@instance``, ``TimelinePolled.withdrawn``), and the recorder
deletes the shares of that account first seen before the poll: looked up by this
index, where a poll's few keys would otherwise read the whole table.

Built concurrently, outside the migration's transaction, as 0013's and 0015's: the
recorder's writes go on meanwhile; a build cut short leaves an invalid index of the
name, which is dropped and built again.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-30 14:00:00
"""

from collections.abc import Sequence

from alembic import op

from trove_schema.migrate import create_index_online

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ACCOUNT_INDEX = "ix_page_shares_account_md5"


def upgrade() -> None:
    create_index_online(ACCOUNT_INDEX, "page_shares", "md5(account)")


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {ACCOUNT_INDEX}")
