"""The CrawlCompleted events a test's fetcher published, read from the real stream."""

from __future__ import annotations

from nats.js import JetStreamContext

from tests.conftest import eventually
from trove_schema.events import CrawlCompleted, decode_event
from trove_schema.topology import EVENTS_STREAM


class Completions:
    """The CrawlCompleted events on the stream, by URL (an ephemeral consumer)."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js
        self.events: dict[str, CrawlCompleted] = {}
        self.sizes: dict[str, int] = {}
        self._sub: JetStreamContext.PullSubscription | None = None

    async def poll(self) -> dict[str, CrawlCompleted]:
        if self._sub is None:
            self._sub = await self.js.pull_subscribe(
                CrawlCompleted.SUBJECT, durable=None, stream=EVENTS_STREAM
            )
        try:
            msgs = await self._sub.fetch(100, timeout=0.3)
        except TimeoutError:
            msgs = []
        for msg in msgs:
            event = decode_event(msg.data)
            assert isinstance(event, CrawlCompleted)
            self.events[event.url] = event
            self.sizes[event.url] = len(msg.data)
            await msg.ack()
        return self.events

    async def wait_for(self, count: int, timeout: float = 60.0) -> dict[str, CrawlCompleted]:
        try:
            return await eventually(
                self.poll, until=lambda e: len(e) >= count, timeout=timeout, what=f"{count} events"
            )
        finally:
            if self._sub is not None:
                await self._sub.unsubscribe()
                self._sub = None
