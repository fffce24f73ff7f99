"""A pod's clock counts the time its machine spent suspended.

While a machine (a VM paused, a laptop asleep) is suspended, the monotonic clock stops
and nats-server's time goes on: a pod whose readings were kept on the monotonic clock
would resume behind the server by the pause, and find hosts free early until a fresh
reading won. The boot clock goes on through a suspend. Here the machine's clocks say
it was suspended ``SUSPENDED`` seconds since boot: the boot clock that far ahead of the
monotonic one.
"""

from __future__ import annotations

import time

import pytest

from trove_fetcher import clock as clock_module
from trove_fetcher.clock import ServerClock

#: Seconds the machine the pod runs on was suspended since it booted.
SUSPENDED = 1000.0


async def ask() -> bytes:
    return b'{"ts": "2026-11-27T22:05:53.039293459Z"}'


async def test_a_pods_readings_are_kept_on_the_clock_that_counts_a_suspend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = time.clock_gettime

    def suspended(which: int) -> float:
        if which == clock_module.BOOTTIME:
            return real(time.CLOCK_MONOTONIC) + SUSPENDED
        return real(which)

    monkeypatch.setattr(time, "clock_gettime", suspended)
    taken = (await ServerClock(ask).read()).taken
    # Off Linux there is no boot clock: the monotonic one is all there is.
    counted = SUSPENDED if clock_module.BOOTTIME is not None else 0.0
    assert taken == pytest.approx(time.monotonic() + counted, abs=1.0)
