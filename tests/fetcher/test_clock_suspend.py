"""A pod's clock counts the time its machine spent suspended.

While a machine (a VM paused, a laptop asleep) is suspended, the monotonic clock stops
and nats-server's time goes on: a pod whose readings were kept on the monotonic clock
would resume behind the server by the pause, and find hosts free early until a fresh
reading won. The pod is run in a Linux time namespace whose boot time is ``SUSPENDED``
seconds ahead of its monotonic clock, as on a machine suspended that long since boot.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Seconds the machine the pod runs on was suspended, as its time namespace says.
SUSPENDED = 1000

#: A pod reading the server's time once, and telling on which clock it took the reading.
POD = """
import asyncio, json, time
from trove_fetcher.clock import ServerClock

async def ask():
    return b'{"ts": "2026-11-27T22:05:53.039293459Z"}'

async def main():
    taken = (await ServerClock(ask).read()).taken
    print(json.dumps({
        "taken": taken,
        "boot": time.clock_gettime(time.CLOCK_BOOTTIME),
        "monotonic": time.monotonic(),
    }))

asyncio.run(main())
"""


def test_a_pod_s_clock_counts_the_time_its_machine_was_suspended() -> None:
    suspended = ["unshare", "--user", "--map-root-user", "--time", f"--boottime={SUSPENDED}"]
    ran = subprocess.run(
        [*suspended, sys.executable, "-c", POD], capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    clocks = json.loads(ran.stdout)

    # The namespace stands for the suspended machine: its monotonic clock lost the pause.
    assert clocks["boot"] - clocks["monotonic"] == pytest.approx(SUSPENDED, abs=1.0)
    # The reading was taken on the clock that kept counting through it.
    assert clocks["taken"] == pytest.approx(clocks["boot"], abs=1.0)
