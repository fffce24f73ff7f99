"""The CLI's engine for Postgres: each command's connect bounded, as the broker's is.

asyncpg waits 60 s by default for a server that takes the connection and never
answers (a wrong port that a proxy or a firewall holds open), and then raised a
``TimeoutError`` with no message. A command gives up after ``CONNECT_TIMEOUT``, and
says it had no answer in time (``trove_cli.main``).
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

#: Seconds a command waits for Postgres to answer its connect.
CONNECT_TIMEOUT = 10.0


def engine(database_url: str) -> AsyncEngine:
    """An engine for one command against ``database_url``."""
    return create_async_engine(database_url, connect_args={"timeout": CONNECT_TIMEOUT})
