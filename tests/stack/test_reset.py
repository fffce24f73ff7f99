from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from trove_schema.bus import Bus
from trove_schema.topology import EVENTS_STREAM
from trove_stack.reset import reset

pytestmark = pytest.mark.usefixtures("clean")


async def test_a_reset_cut_between_its_deletes_and_its_creates_is_mended_by_the_next(
    bus: Bus, engine: AsyncEngine
) -> None:
    """A reset whose consumers were deleted and whose stream then took a message (a
    late publisher, a schedule firing) before they were made again: every reset after
    it refused at its first look, and a test worker's every test failed at setup."""
    await bus.js.delete_consumer(EVENTS_STREAM, "discovery-links")
    await bus.js.publish("trove.events.page.discovered", b"{}")

    await reset(bus.js, engine)

    info = await bus.js.consumer_info(EVENTS_STREAM, "discovery-links")
    assert info.num_pending == 0
    assert (await bus.js.stream_info(EVENTS_STREAM)).state.messages == 0
