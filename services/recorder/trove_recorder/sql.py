"""The projection's statements, run on its transaction's own asyncpg connection.

A batch of events costs the same dozen statements whatever its size. Through
SQLAlchemy's ``AsyncSession.execute`` a ``text()`` statement took ~0.4 ms of the
recorder's CPU (a greenlet switch each way, the statement's cache key, the result's
wrapping); the same statement on asyncpg's connection takes ~0.1 ms. At a polite crawl's
pace a batch holds a page or two, so that fixed cost was most of the recorder's CPU a
page.

The session keeps everything else: the pool and its pre-ping, the transaction's commit
and rollback. What asyncpg raises reaches ``database.as_retry`` unwrapped, which reads
its SQLSTATE as it reads SQLAlchemy's. Statements are written with SQLAlchemy's
``:name`` parameters, numbered once into asyncpg's ``$n``; asyncpg prepares each once a
connection (its statement cache).
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from typing import Any

from asyncpg import Connection, Record
from sqlalchemy.ext.asyncio import AsyncSession

#: ``:name``, but not a ``::type`` cast.
_PARAMETER = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_NO_PARAMETERS: Mapping[str, Any] = {}


class Statement:
    """A statement with ``:name`` parameters, in asyncpg's numbered form."""

    __slots__ = ("names", "sql")

    def __init__(self, sql: str) -> None:
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in names:
                names.append(name)
            return f"${names.index(name) + 1}"

        self.sql = _PARAMETER.sub(number, sql)
        self.names = tuple(names)

    def args(self, params: Mapping[str, Any]) -> list[Any]:
        """The values in ``$n`` order; a missing one is a ``KeyError``, as it should be."""
        return [params[name] for name in self.names]


class Transaction:
    """A session's transaction, as its asyncpg connection runs it."""

    __slots__ = ("_driver",)

    def __init__(self, driver: Connection) -> None:
        self._driver = driver

    @classmethod
    async def of(cls, session: AsyncSession) -> Transaction:
        connection = await session.connection()
        driver = (await connection.get_raw_connection()).driver_connection
        assert driver is not None, "the session's connection is closed"
        if not driver.is_in_transaction():
            # SQLAlchemy's asyncpg adapter sends BEGIN with its first statement, not when
            # the session begins: without one, each statement here would commit alone.
            await connection.exec_driver_sql("SELECT 1")
        assert driver.is_in_transaction(), "the session did not begin a transaction"
        return cls(driver)

    async def fetch(
        self, statement: Statement, params: Mapping[str, Any] = _NO_PARAMETERS
    ) -> list[Record]:
        rows: list[Record] = await self._driver.fetch(statement.sql, *statement.args(params))
        return rows

    async def value(self, statement: Statement, params: Mapping[str, Any] = _NO_PARAMETERS) -> Any:
        """The first column of the first row, or None when there is no row."""
        return await self._driver.fetchval(statement.sql, *statement.args(params))

    async def execute(
        self, statement: Statement, params: Mapping[str, Any] = _NO_PARAMETERS
    ) -> None:
        await self._driver.execute(statement.sql, *statement.args(params))

    async def copy(self, table: str, rows: str, columns: Sequence[str]) -> None:
        """``rows`` in COPY's text format (``copy_text`` for each field) into ``table``."""
        await self._driver.copy_to_table(
            table, source=io.BytesIO(rows.encode()), columns=list(columns), format="text"
        )


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def copy_text(value: str) -> str:
    """``value`` as a field of COPY's text format (storable text holds no NUL)."""
    return value.translate(_COPY_ESCAPES)
