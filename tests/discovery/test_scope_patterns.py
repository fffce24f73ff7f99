"""A seed pattern RE2 cannot match in linear time is refused by the running service."""

from __future__ import annotations

import json
from pathlib import Path

import nats
import pytest
from nats.js.errors import NotFoundError

from tests.conftest import StackUrls, eventually
from tests.support import services
from trove_schema.bus import Bus
from trove_schema.events import SeedRejected, decode_event
from trove_schema.topology import EVENTS_STREAM, SEED_REJECTED, SEEDS_SUBJECT


@pytest.mark.usefixtures("clean")
async def test_a_backreference_pattern_is_refused_in_the_reply_and_the_record(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    seed = json.dumps({"url": "https://example.org/", "pattern": r"^https://(\w+)\.\1/"})
    async with services(stack, state_dir, {}, only=("discovery",)):
        nc = await nats.connect(stack.nats_url)
        try:

            async def ask() -> str:
                try:
                    reply = await nc.request(SEEDS_SUBJECT, seed.encode(), timeout=2)
                except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                    return ""  # discovery is not subscribed yet
                return reply.data.decode()

            answer = await eventually(ask, until=bool, timeout=30, what="a reply")
        finally:
            await nc.close()

    (rejected,) = json.loads(answer)["rejected"]
    assert "invalid escape sequence: \\1" in rejected["reason"]
    assert "no backreferences" in rejected["reason"]

    async def last_rejection() -> SeedRejected | None:
        try:
            msg = await bus.js.get_last_msg(EVENTS_STREAM, SEED_REJECTED)
        except NotFoundError:
            return None
        event = decode_event(msg.data or b"")
        return event if isinstance(event, SeedRejected) and event.raw == seed else None

    recorded = await eventually(last_rejection, until=bool, timeout=30, what="SeedRejected")
    assert recorded is not None
    assert recorded.reason == rejected["reason"]
