"""page_outlinks: one row per linking page, its links as arrays; page_links becomes a view

A page's outgoing link set is written and replaced as a whole, never edge by edge, so
it is stored as one row with three parallel arrays (target page ids, kinds, nofollow)
and a GIN index over the targets for in-link look-ups. Writing 100 edges as one row
instead of 100 rows (each with two btree index entries) halved the COPY time of a
batch and removed most of the recorder's per-edge Python work (bench/bench_recorder.py).

``page_links`` keeps the citation graph's edge shape for readers, as a view.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KINDS = (
    "'a', 'img', 'script', 'stylesheet', 'feed', 'canonical', 'alternate', 'feed_item', "
    "'redirect', 'other'"
)

EDGES_VIEW = """
CREATE VIEW page_links AS
SELECT o.from_page_id, e.to_page_id, e.kind, e.nofollow, o.created_at
FROM page_outlinks o
CROSS JOIN LATERAL unnest(o.to_page_ids, o.kinds, o.nofollow)
    AS e(to_page_id, kind, nofollow)
"""


def upgrade() -> None:
    op.create_table(
        "page_outlinks",
        sa.Column("from_page_id", sa.BigInteger(), nullable=False),
        sa.Column("to_page_ids", postgresql.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("kinds", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("nofollow", postgresql.ARRAY(sa.Boolean()), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(
            "cardinality(to_page_ids) = cardinality(kinds) "
            "AND cardinality(kinds) = cardinality(nofollow)",
            name=op.f("ck_page_outlinks_parallel"),
        ),
        sa.CheckConstraint(f"kinds <@ ARRAY[{KINDS}]", name=op.f("ck_page_outlinks_kinds")),
        sa.PrimaryKeyConstraint("from_page_id", name=op.f("pk_page_outlinks")),
    )
    op.create_index(
        "ix_page_outlinks_to_page_ids",
        "page_outlinks",
        ["to_page_ids"],
        postgresql_using="gin",
    )
    op.execute(
        "INSERT INTO page_outlinks (from_page_id, to_page_ids, kinds, nofollow, created_at) "
        "SELECT from_page_id, array_agg(to_page_id ORDER BY to_page_id, kind), "
        "array_agg(kind::text ORDER BY to_page_id, kind), "
        "array_agg(nofollow ORDER BY to_page_id, kind), min(created_at) "
        "FROM page_links GROUP BY from_page_id"
    )
    op.drop_table("page_links")
    op.execute(EDGES_VIEW)


def downgrade() -> None:
    op.execute("DROP VIEW page_links")
    op.create_table(
        "page_links",
        sa.Column("from_page_id", sa.BigInteger(), nullable=False),
        sa.Column("to_page_id", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("nofollow", sa.Boolean(), server_default="false", nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(f"kind IN ({KINDS})", name=op.f("ck_page_links_kind")),
        sa.PrimaryKeyConstraint("from_page_id", "to_page_id", "kind", name=op.f("pk_page_links")),
    )
    op.create_index("ix_page_links_to_page_id", "page_links", ["to_page_id"])
    op.execute(
        "INSERT INTO page_links (from_page_id, to_page_id, kind, nofollow, created_at) "
        "SELECT o.from_page_id, e.t, e.k, e.nf, o.created_at FROM page_outlinks o "
        "CROSS JOIN LATERAL unnest(o.to_page_ids, o.kinds, o.nofollow) AS e(t, k, nf)"
    )
    op.drop_table("page_outlinks")
