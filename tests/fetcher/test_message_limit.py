"""A fetcher keeps its events under what the server and the record take."""

from __future__ import annotations

import logging

import pytest

from trove_fetcher.app import _message_limit
from trove_schema.bus import Bus
from trove_schema.topology import EVENTS_STREAM

pytestmark = pytest.mark.usefixtures("clean")


async def test_events_are_kept_under_the_records_limit_not_a_larger_setting(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    # TROVE_MAX_MESSAGE_BYTES raised on the fetchers alone ("to keep big pages"): the
    # record's owner keeps its own limit, and every larger event was refused.
    stored = (await bus.js.stream_info(EVENTS_STREAM)).config.max_msg_size
    assert stored is not None
    assert 0 < stored < 8 << 20
    with caplog.at_level(logging.WARNING, logger="trove.fetcher"):
        assert await _message_limit(bus, 8 << 20) == min(stored, bus.nc.max_payload)
    assert "not TROVE_MAX_MESSAGE_BYTES=8388608" in caplog.text
    assert await _message_limit(bus, 64 * 1024) == 64 * 1024
