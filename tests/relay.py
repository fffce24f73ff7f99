"""A connection relayed to a server, byte for byte: a test's stand-in for what sits
between a client and its server (a proxy, a socket in another place)."""

from __future__ import annotations

import asyncio
import contextlib


async def relay(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, port: int
) -> None:
    """Relay the connection of ``reader`` and ``writer`` to ``host:port`` until either
    side closes."""
    upstream_reader, upstream_writer = await asyncio.open_connection(host, port)

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        dst.close()

    await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
