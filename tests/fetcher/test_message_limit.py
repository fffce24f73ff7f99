"""A fetcher keeps its events under what the server and the record take, and its
scheduled work within what the work stream keeps."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math

import pytest

from tests.conftest import eventually
from trove_fetcher.app import _keep_horizon, _message_limit, _work_age
from trove_fetcher.deferral import horizon
from trove_schema.bus import Bus
from trove_schema.topology import EVENTS_STREAM, WORK_STREAM

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


async def test_work_is_scheduled_within_what_the_stream_keeps_not_a_longer_setting(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    # TROVE_WORK_MAX_AGE_SECONDS raised to 14 days in a rollout, and a pod of a release
    # that knew only ages, started by a scale-up meanwhile, reconciled the stream back to
    # its 7 days (or an operator's `nats stream edit` gave it one): work scheduled 7 days
    # ahead would age out as it came due.
    kept = (await bus.js.stream_info(WORK_STREAM)).config
    assert not kept.max_age  # kept until handled, by default
    age = 7 * 86_400.0
    await bus.js.update_stream(dataclasses.replace(kept, max_age=age))
    applied: list[float] = []
    stop = asyncio.Event()

    async def horizons() -> list[float]:
        return applied

    try:
        with caplog.at_level(logging.WARNING, logger="trove.fetcher"):
            keeping = asyncio.create_task(
                _keep_horizon(bus, 2 * age, applied.append, stop, interval=0.05)
            )
            try:
                await eventually(horizons, until=bool, timeout=10, what="a horizon applied")
                assert applied[0] == horizon(age)
                assert "work is scheduled within what the stream keeps" in caplog.text

                # Reconciled once more, shorter: read again without a restart.
                await bus.js.update_stream(dataclasses.replace(kept, max_age=age / 4))
                await eventually(
                    horizons,
                    until=lambda a: a[-1] == horizon(age / 4),
                    timeout=10,
                    what="the shorter age read again",
                )
            finally:
                stop.set()
                await keeping
        assert await _work_age(bus, age / 8) == age / 8  # a shorter setting holds
        # The default keeps work until handled, but within an age the stream was given.
        assert await _work_age(bus, 0.0) == age / 4
    finally:
        await bus.js.update_stream(kept)
    assert await _work_age(bus, 0.0) == 0.0
    assert horizon(0.0) == math.inf  # scheduled at its slot, however far
