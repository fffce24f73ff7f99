"""Migration 0006: page_outlinks takes 'me' and 'webmention', and gives them up on the way down."""

from __future__ import annotations

import asyncio

import pytest
from alembic import command
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import create_async_engine

from trove_schema.migrate import alembic_config, upgrade

INSERT = (
    "INSERT INTO page_outlinks (from_page_id, to_page_ids, kinds, nofollow) VALUES "
    "(:source, CAST(:targets AS bigint[]), CAST(:kinds AS text[]), CAST(:nofollow AS boolean[]))"
)
OUTLINKS = "SELECT from_page_id, to_page_ids, kinds, nofollow FROM page_outlinks ORDER BY 1"


async def test_indieweb_kinds_are_refused_before_0006_and_dropped_by_its_downgrade(
    scratch_database: str,
) -> None:
    await asyncio.to_thread(upgrade, scratch_database, "0005")
    db = create_async_engine(scratch_database)
    try:
        with pytest.raises(IntegrityError, match="ck_page_outlinks_kinds"):
            async with db.begin() as conn:
                await conn.execute(
                    text(INSERT),
                    {"source": 1, "targets": [2], "kinds": ["me"], "nofollow": [False]},
                )
        await db.dispose()

        await asyncio.to_thread(upgrade, scratch_database, "0006")
        # Added without a scan of the rows, but still checked on every write.
        with pytest.raises(IntegrityError, match="ck_page_outlinks_kinds"):
            async with db.begin() as conn:
                await conn.execute(
                    text(INSERT),
                    {"source": 9, "targets": [2], "kinds": ["mee"], "nofollow": [False]},
                )
        async with db.begin() as conn:
            for source, targets, kinds, nofollow in [
                (1, [2, 3, 4, 5], ["a", "me", "img", "webmention"], [False, True, True, False]),
                (2, [3, 4], ["me", "webmention"], [False, False]),
                (3, [1], ["a"], [True]),
            ]:
                params = {"source": source, "targets": targets, "kinds": kinds}
                await conn.execute(text(INSERT), {**params, "nofollow": nofollow})
        await db.dispose()

        await asyncio.to_thread(command.downgrade, alembic_config(scratch_database), "0005")
        async with db.connect() as conn:
            assert [tuple(row) for row in (await conn.execute(text(OUTLINKS))).all()] == [
                (1, [2, 4], ["a", "img"], [False, True]),
                (3, [1], ["a"], [True]),
            ]
    finally:
        await db.dispose()
