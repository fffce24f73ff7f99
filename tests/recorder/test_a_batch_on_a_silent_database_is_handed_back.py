"""A batch whose Postgres goes silent after its statements reached it (a node lost, a
partition, a failover whose old address drops everything: no RST, no FIN) is handed
back at its deadline, and its events are applied once the database answers again."""

from __future__ import annotations

import asyncio
import logging

import pytest
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.recorder.test_recorder_service import completed
from trove_recorder.recorder import serve
from trove_schema.bus import Bus
from trove_schema.settings import RecorderSettings

pytestmark = pytest.mark.usefixtures("clean")


class SilentForwarder:
    """A loopback TCP forwarder to Postgres that can go silent: its sockets stay open,
    and what the recorder sends is read and dropped, as a black-holed peer's kernel
    would leave it (a forwarder's kernel still acknowledges, so TCP sees nothing)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.silent = False
        #: The connections opened while it answered whose requests it dropped since.
        self.swallowed: set[int] = set()
        self._before: set[int] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def go_silent(self) -> None:
        self._before = {id(writer) for writer in self._writers}
        self.silent = True

    async def swallowing(self) -> int:
        return len(self.swallowed)

    async def _accept(self, client: asyncio.StreamReader, back: asyncio.StreamWriter) -> None:
        server, out = await asyncio.open_connection(self.host, self.port)
        self._writers += [back, out]
        await asyncio.gather(
            self._pipe(client, out, id(back)),
            self._pipe(server, back, None),
            return_exceptions=True,
        )

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client: int | None
    ) -> None:
        while data := await reader.read(65536):
            if self.silent:
                if client in self._before:
                    self.swallowed.add(client)
                continue
            writer.write(data)
            await writer.drain()
        if not self.silent:  # a peer gone silent says nothing of a close either
            writer.close()

    def close(self) -> None:
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            self._server.close()


async def projected(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text("SELECT count(*) FROM page_crawls"))).scalar_one())


async def test_a_batch_on_a_database_gone_silent_is_handed_back_and_applied_once_it_answers(
    stack: StackUrls, bus: Bus, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    url = make_url(stack.database_url)
    forwarder = SilentForwarder(url.host or "127.0.0.1", url.port or 5432)
    port = await forwarder.start()
    settings = RecorderSettings(
        nats_url=stack.nats_url,
        database_url=url.set(host="127.0.0.1", port=port).render_as_string(hide_password=False),
        batch_timeout_seconds=2.0,
        batch_linger_seconds=0.0,
        # The outbox publisher looks every second: the first to meet the silence, and
        # held by it, so what the forwarder drops next is the batch's.
        outbox_poll_max_seconds=1.0,
    )
    stop, ready = asyncio.Event(), asyncio.Event()
    caplog.set_level(logging.WARNING, logger="trove.recorder")
    recorder = asyncio.create_task(serve(settings, stop, ready))
    try:
        await asyncio.wait_for(ready.wait(), 60)
        await bus.publish(completed(1))
        await eventually(lambda: projected(engine), until=lambda n: n == 1, timeout=30, what="1")

        forwarder.go_silent()
        await eventually(forwarder.swallowing, until=lambda n: n >= 1, timeout=30, what="outbox")
        await bus.publish(completed(2))
        # The batch's first statement went out on a pooled connection, and got no answer.
        await eventually(forwarder.swallowing, until=lambda n: n >= 2, timeout=30, what="batch")
        forwarder.silent = False  # the database answers again, on new connections

        await eventually(lambda: projected(engine), until=lambda n: n == 2, timeout=30, what="2")
        assert any("ran past" in r.getMessage() for r in caplog.records), caplog.text
        assert not recorder.done()
    finally:
        forwarder.close()  # ends the outbox publisher's wait on its connection
        stop.set()
        await asyncio.wait_for(recorder, 60)
