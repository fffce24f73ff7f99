"""What this machine's clocks did during a test run, said at its end.

The politeness tests measure a host's gaps on the test servers' monotonic clock; the
fetcher keeps them on nats-server's wall clock, read against the boot clock. Where the
wall clock is set during the run (NTP, a VM paused and its clock set after it) or the
boot clock leaves the monotonic one (a suspend), a gap may read differently on the two
by as much: the run's summary says whether it saw any such step, so that a failure
they explain is told apart from a fault.
"""

from __future__ import annotations

import threading
import time

#: How often the clocks are compared.
INTERVAL = 0.1
#: A change of two clocks' difference past this, between two looks, is a step.
STEP = 0.002
#: Looks whose two monotonic reads are further apart than this are not taken: the
#: thread was descheduled between the reads, which moves the difference by as much.
TIGHT = 0.0005
_BOOT = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def _look() -> tuple[float, float] | None:
    """The wall clock less the boot clock (what the fetcher reads nats-server's time
    against), and the boot clock less the monotonic one (a suspend), now; None if the
    look was not tight."""
    before = time.monotonic()
    boot = time.clock_gettime(_BOOT)
    wall = time.time()
    boot_after = time.clock_gettime(_BOOT)
    after = time.monotonic()
    if after - before > TIGHT:
        return None
    return wall - (boot + boot_after) / 2, (boot + boot_after) / 2 - (before + after) / 2


class ClockWatch:
    """Compares the clocks every ``INTERVAL`` in a thread, and keeps the steps seen."""

    def __init__(self) -> None:
        self.wall_steps: list[float] = []
        self.boot_steps: list[float] = []
        self._first: tuple[float, float] | None = None
        self._last: tuple[float, float] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clock-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL):
            seen = _look()
            if seen is None:
                continue
            if self._last is not None:
                wall, boot = (now - then for now, then in zip(seen, self._last, strict=True))
                if abs(wall) > STEP:
                    self.wall_steps.append(wall)
                if abs(boot) > STEP:
                    self.boot_steps.append(boot)
            self._first = self._first or seen
            self._last = seen

    def summary(self) -> str:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=1)
        if self._first is None or self._last is None:
            return "clocks during the run: not compared"
        moved = self._last[0] - self._first[0]

        def steps(found: list[float]) -> str:
            if not found:
                return "none"
            largest = max(found, key=abs)
            return f"{len(found)}, the largest {largest * 1000:+.1f} ms"

        return (
            f"clocks during the run: wall clock set against the boot clock: "
            f"{steps(self.wall_steps)} ({moved * 1000:+.1f} ms in all); boot clock "
            f"parted from the monotonic one (a suspend): {steps(self.boot_steps)}"
        )
