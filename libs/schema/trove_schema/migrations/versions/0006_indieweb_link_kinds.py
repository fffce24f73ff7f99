"""page_outlinks.kinds takes the IndieWeb link kinds: 'me' and 'webmention'

The CHECK constraint lists every kind a link may have. It is widened, so every row
already satisfies it: the new one is added NOT VALID (no scan of the table under the
ACCESS EXCLUSIVE lock that adding takes), then validated, which scans under a lock that
lets reads and writes go on. Downgrading drops the edges of the two kinds
(the older code cannot read them); the events still hold them, for a replay after the
next upgrade.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 16:20:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_KINDS = (
    "'a', 'img', 'script', 'stylesheet', 'feed', 'canonical', 'alternate', 'feed_item', "
    "'redirect', 'other'"
)
NAME = "ck_page_outlinks_kinds"


def upgrade() -> None:
    op.drop_constraint(op.f(NAME), "page_outlinks", type_="check")
    op.execute(
        "ALTER TABLE page_outlinks ADD CONSTRAINT ck_page_outlinks_kinds CHECK (kinds <@ "
        "ARRAY['a', 'img', 'script', 'stylesheet', 'feed', 'canonical', 'alternate', "
        "'feed_item', 'redirect', 'other', 'me', 'webmention']) NOT VALID"
    )
    # Its own transaction: in the migration's, the ACCESS EXCLUSIVE lock the ADD took
    # would be held through the scan.
    with op.get_context().autocommit_block():
        op.execute("ALTER TABLE page_outlinks VALIDATE CONSTRAINT ck_page_outlinks_kinds")


def downgrade() -> None:
    op.execute("DELETE FROM page_outlinks WHERE kinds <@ ARRAY['me', 'webmention']")
    op.execute(
        "UPDATE page_outlinks o SET to_page_ids = e.targets, kinds = e.kinds, "
        "nofollow = e.nofollow FROM ("
        "SELECT from_page_id, array_agg(t ORDER BY n) AS targets, "
        "array_agg(k ORDER BY n) AS kinds, array_agg(f ORDER BY n) AS nofollow "
        "FROM page_outlinks, unnest(to_page_ids, kinds, nofollow) WITH ORDINALITY "
        "AS u(t, k, f, n) WHERE kinds && ARRAY['me', 'webmention'] "
        "AND k NOT IN ('me', 'webmention') "
        "GROUP BY from_page_id"
        ") e WHERE o.from_page_id = e.from_page_id"
    )
    op.drop_constraint(op.f(NAME), "page_outlinks", type_="check")
    op.create_check_constraint(op.f(NAME), "page_outlinks", f"kinds <@ ARRAY[{OLD_KINDS}]")
