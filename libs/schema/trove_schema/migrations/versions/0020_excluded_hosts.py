"""excluded_hosts: the operator's excluded hosts whose pages were marked rejected

`trove exclude` stops the crawl of a host within seconds, but the pages already read
kept ``fetched`` in ``pages`` until their next visit (up to the longest re-crawl
interval): an index kept from the tables went on serving a site whose owner asked to be
removed. The recorder marks them ``rejected`` when a rule comes into force (a change
an index reads, migration 0019), once a rule: this table holds the rules it marked,
and how far in 0019's ``changed_xact`` it looked for their pages written again since.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-01 03:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "excluded_hosts",
        sa.Column("rule", sa.String(253), nullable=False),
        sa.Column(
            "marked_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("checked_xact", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("rule", name=op.f("pk_excluded_hosts")),
    )


def downgrade() -> None:
    op.drop_table("excluded_hosts")
