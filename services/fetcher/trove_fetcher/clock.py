"""The one clock the fetcher pods keep politeness by: nats-server's, as each pod reads it.

A host's record in ``trove_domains`` holds instants (``free_at``, ``busy_until``,
``next``, ``backoff_until``) that one pod writes and another compares with its own
"now". On the pods' own wall clocks, a pod whose clock ran a second ahead of the others
would find every host free a second early and send inside the gap; one a second behind
would make the others do so. Nodes are meant to be kept in time by NTP, but politeness
should not rest on every node's being so. So no pod keeps politeness on its own clock:
each measures how far its clock is from nats-server's and reads every shared instant on
nats-server's time, which is also the time the scheduled messages that bring deferred
work back fire by.

The measure: a JetStream API answer carries the server's time (``ts``, nats-server
2.10+), stamped between the request leaving and the answer arriving; the middle of that
round trip is the estimate, and half of it the most it can be wrong by. It is kept
against the pod's own elapsed time (``elapsed``), not its wall clock, so a step of the
node's clock (NTP setting it right) changes nothing. As NTP's clock filter does, the pod
chooses among its latest readings the one least in doubt, a reading's doubt being half
its round trip plus what the two clocks may have drifted since: a round trip slowed by
load does not move the clock, and an old reading gives way to a fresh one. The drift is
measured, not assumed (``drift``): while NTP slews either node's clock right, the two
run apart many times faster than clocks left alone do (``DRIFT``), and a doubt that grew
slower than they part would let the estimate run past it between two reads.
And the pod keeps to the safe side of that doubt: ``now`` is the earliest the server's
time can be (a host is never found free too soon), ``at`` the latest a local instant
can be on it (a gap counts from an end no earlier than the real one). On one machine
the doubt is a fraction of a millisecond.

Whose time: the leader's of the work stream (``TROVE_WORK``), which answers its stream
info and whose clock fires the scheduled messages that bring deferred work back, so a
slot means the same to the pods and to the scheduler. In a cluster, the servers' clocks
may differ; readings are kept by the server that answered, and when the leadership
moves, the readings of the server before are dropped: every pod then keeps to the new
leader's time at its next read, not to a mix of two servers' for minutes. But the
instants the pods wrote on the time before stay in the hosts' records: were the new
leader's clock ahead, each host would be found free early by that much. So for as long
as such an instant can lie ahead (``outlasting``), ``now`` keeps to the earlier of the
two servers' times and ``at`` to the later, and to the new leader's alone after that.
So too when one server's time comes forward further than the estimate allowed (its
clock set by a step too small to be taken for a new time, a VM paused and its clock
set after it): the instants written on the estimate would come early by the step.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from nats.aio.client import Client

from trove_fetcher.politeness import HOLD_SLACK, PolitenessConfig
from trove_schema.metrics import CLOCK_OFFSET
from trove_schema.server_time import server_time

log = logging.getLogger("trove.fetcher.clock")

#: Seconds between two reads of the server's time. A slew that began since the last read
#: is not measured until readings after it disagree beyond their errors (two or three
#: reads): until then, at the fastest slew of the kernel's NTP discipline (500 ppm), the
#: estimate may run up to 2 ms past its doubt between two reads 5 s apart, where it ran
#: 12 ms at 30 s. A faster slew (chrony's, on a large offset) is measured as soon, and
#: runs it past by no more than the offset it corrects. A stream's info every 5 s is
#: little to ask of the server.
PROBE_INTERVAL = 5.0
#: Reads the estimate is chosen among and its drift measured over (the latest ones:
#: forty seconds at the interval).
KEPT = 8
#: Reads at the start, before the pod takes its first lease.
FIRST_READS = 3
#: An offset past which the pod's clock is worth a warning: its node is not in time.
WARN_OFFSET = 1.0
#: How fast two clocks drift apart, at the least the pod counts (seconds a second): a
#: clock that NTP does not discipline is good to 100 ppm. One it is slewing right runs
#: faster (to 500 ppm with ntpd or timesyncd, 83,333 with chrony's default limit): the
#: readings measure that (``drift``).
DRIFT = 1e-4
#: Faster than two clocks part while NTP slews them (chrony's fastest, 83,333 ppm, on
#: each node in opposite directions is 1/6): two readings that part faster show a clock
#: set, not slewed (ntpd sets an offset over 128 ms, chrony under ``makestep``, a VM
#: restored), which is taken as a new time (``stepped``), as a leader moved is. Counted
#: as drift, a step of 20 s would have doubted the estimate by as much for the forty
#: seconds its readings are kept: requests left no time at all. A step too small to
#: tell from a slew (under 1.25 s between reads 5 s apart) is counted as one, doubting
#: the estimate by at most as much until its readings go; a step forward keeps the
#: estimate before it too (``ServerClock._came_forward``).
MAX_SLEW = 0.25
#: How finely a reading is stamped: ``server_time`` keeps microseconds.
STAMP = 1e-6
#: ``CLOCK_BOOTTIME``, where there is one (Linux): see ``elapsed``.
BOOTTIME: int | None = getattr(time, "CLOCK_BOOTTIME", None)

#: One request to nats-server's JetStream API, answered with its JSON body.
Ask = Callable[[], Awaitable[bytes]]


def elapsed() -> float:
    """The pod's clock for its readings: one no step of the wall clock moves, which goes
    on while the machine is suspended. The monotonic clock stops then: a VM paused for a
    minute would resume a minute behind the server, until a fresh reading won."""
    return time.clock_gettime(BOOTTIME) if BOOTTIME is not None else time.monotonic()


def outlasting(config: PolitenessConfig) -> float:
    """The longest an instant a pod writes in a host's record can lie ahead of the time
    it was written on: a request's hold (its timeout and ``HOLD_SLACK``), and the
    longest gap after it (``busy_until`` plus a gap, for a hold nobody released); a
    lease taken up to a second after "now" (the fetcher's ``LOCAL_WAIT``), and the
    other pods' writes on the time before until their next reads. A pace a host's 429s
    taught may be longer than the longest gap; its quarter's margin is far more than
    the clocks' difference this covers."""
    reach = config.request_timeout + HOLD_SLACK + max(config.max_delay, config.min_delay)
    return reach + 1.0 + 2 * PROBE_INTERVAL


class Clock(Protocol):
    """The time the pods share: ``now``, and a local ``time.time()`` read on it."""

    def now(self) -> float: ...
    def at(self, local: float) -> float: ...


@dataclass(frozen=True, slots=True)
class Reading:
    """The server's time less the pod's clock (``elapsed``), within ``error`` seconds
    either way, read at ``taken`` (on the pod's clock)."""

    offset: float
    error: float
    taken: float
    #: The server that answered ("" when the answer does not say: a server alone).
    source: str = ""

    def doubt(self, at: float, drift: float = DRIFT) -> float:
        """How far off the reading may be at ``at``: its error, and the drift since."""
        return self.error + drift * max(0.0, at - self.taken)


def reading(sent: float, answered: float, server_time: float, source: str = "") -> Reading:
    """What one round trip says: the server stamped its answer between ``sent`` and
    ``answered`` (the pod's clock), so at their middle, give or take half."""
    half = max(0.0, answered - sent) / 2
    return Reading(offset=server_time - (sent + half), error=half, taken=answered, source=source)


def _parting(a: Reading, b: Reading) -> float:
    """How fast ``a`` and ``b`` show the two clocks ran apart, beyond their errors."""
    return (abs(b.offset - a.offset) - (a.error + b.error + 2 * STAMP)) / (b.taken - a.taken)


def drift(readings: Iterable[Reading]) -> float:
    """How fast the two clocks run apart, as one server's ``readings`` show it: two that
    disagree by more than their errors allow were parted by the drift between them.
    Every pair counts, not only neighbours: a pair's errors hide a drift below their sum
    over the time between them, so the readings furthest apart see a slow drift, the
    nearest a burst. Never less than ``DRIFT``, nor more than ``MAX_SLEW``: faster is a
    step (``stepped``), not a drift."""
    rates = (_parting(a, b) for a, b in itertools.combinations(readings, 2) if b.taken > a.taken)
    return min(MAX_SLEW, max([DRIFT, *rates]))


def stepped(readings: Iterable[Reading], fresh: Reading) -> bool:
    """Whether ``fresh`` shows the server's clock set, not slewed, since ``readings``:
    the two clocks parted faster than any NTP discipline slews."""
    return any(
        fresh.taken > r.taken and _parting(r, fresh) > MAX_SLEW
        for r in readings
        if r.source == fresh.source
    )


@dataclass(frozen=True, slots=True)
class Estimate:
    """A server's time as the pod keeps it: its reading least in doubt, and the drift
    that doubt grows by."""

    best: Reading
    drift: float = DRIFT

    def doubt(self, at: float) -> float:
        return self.best.doubt(at, self.drift)

    def earliest(self, at: float) -> float:
        """The earliest the server's time can be at ``at`` (the pod's clock)."""
        return at + self.best.offset - self.doubt(at)

    def latest(self, at: float) -> float:
        """The latest the server's time can be at ``at`` (the pod's clock)."""
        return at + self.best.offset + self.doubt(at)


def leader(answer: bytes) -> str:
    """The server that answered a stream's info: its leader (``cluster.leader``)."""
    try:
        cluster = json.loads(answer).get("cluster")
        name = cluster.get("leader") if isinstance(cluster, dict) else None
    except (ValueError, AttributeError):
        return ""
    return name if isinstance(name, str) else ""


def stream_info(nc: Client, stream: str, timeout: float = 5.0) -> Ask:
    """Asks for ``stream``'s info, which the server that leads the stream answers."""

    async def ask() -> bytes:
        return (await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=timeout)).data

    return ask


class ServerClock:
    """nats-server's time as this pod keeps it (see the module's docstring)."""

    def __init__(
        self,
        ask: Ask,
        *,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = elapsed,
        outlast: float = outlasting(PolitenessConfig()),
    ) -> None:
        self._ask = ask
        self._wall = wall
        self._monotonic = monotonic
        self._outlast = outlast
        self._readings: deque[Reading] = deque(maxlen=KEPT)
        #: The estimate in use; before the first reading, the pod's own wall clock.
        self._estimate = Estimate(
            Reading(offset=wall() - monotonic(), error=0.0, taken=monotonic())
        )
        #: The estimates of the servers read before, each with the moment (on the pod's
        #: clock) every instant written on its time has passed.
        self._before: list[tuple[Estimate, float]] = []

    @property
    def offset(self) -> float:
        """The server's time less the pod's wall clock, as estimated."""
        return self._monotonic() + self._estimate.best.offset - self._wall()

    @property
    def error(self) -> float:
        """How far off ``offset`` may be now, either way."""
        return self._estimate.doubt(self._monotonic())

    def now(self) -> float:
        """The earliest the server's time can be now."""
        at = self._monotonic()
        return min(e.earliest(at) for e in self._held(at))

    def at(self, local: float) -> float:
        """The latest the server's time can have been at ``local`` (a ``time.time()``,
        of a moment just past: it is placed on the pod's clock by the wall clock's
        reading now).

        The wall clock is read before the pod's: a pod descheduled between the two reads
        (another thread holding the interpreter, a busy node) places ``local`` later by
        that time, never earlier. Read the other way round, a 20 ms wait between them
        made an answer's end 20 ms early, and the host's next request as much inside its
        gap."""
        wall = self._wall()
        at = self._monotonic()
        return local - wall + max(e.latest(at) for e in self._held(at))

    def _held(self, at: float) -> list[Estimate]:
        """The estimate in use, and those of the servers before while an instant written
        on their time may lie ahead."""
        return [self._estimate, *(e for e, until in self._before if at < until)]

    async def read(self) -> Reading:
        """Ask the server its time once, and choose among the latest readings."""
        sent = self._monotonic()
        answer = await self._ask()
        measured = reading(sent, self._monotonic(), server_time(answer), leader(answer))
        before = came = None
        moved = bool(self._readings) and self._readings[-1].source != measured.source
        if moved or stepped(self._readings, measured):
            before = self._estimate
            self._retire(measured.taken)
            self._readings.clear()
        elif self._readings and self._came_forward(measured):
            # The server's time came forward past what the estimate allowed (a step
            # too small to be taken for a new time, a slew not yet measured): the
            # instants written on the estimate would come early by as much. It is
            # kept beside the new one while they may lie ahead, as for a new time; the
            # readings stay, to measure a slew.
            came = self._estimate
            self._retire(measured.taken)
        self._readings.append(measured)
        rate = drift(self._readings)
        # A kept estimate is read on the pod's clock, which may be the one being slewed:
        # its doubt grows at least as fast as the two clocks have been seen to part
        # since it was kept, or a host it holds would be found free early by the slew.
        self._before = [
            (Estimate(e.best, max(e.drift, rate)), until)
            for e, until in self._before
            if until > measured.taken
        ]
        self._estimate = Estimate(
            min(self._readings, key=lambda r: r.doubt(measured.taken, rate)), rate
        )
        if before is not None:
            log.info(
                "nats-server's time %s: %+.3f s from the one before's; for %.0f s, while "
                "instants written on the one before may lie ahead, the pod keeps to the safe "
                "side of both",
                (
                    f"is read from {measured.source or 'the server alone'} now, not "
                    f"{before.best.source or 'the server alone'}: the work stream's leader moved"
                    if moved
                    else "was set"
                ),
                self._estimate.best.offset - before.best.offset,
                self._outlast,
            )
        elif came is not None:
            log.info(
                "nats-server's time came %+.3f s forward of what the pod kept (a step, or a "
                "slew not yet measured); for %.0f s, while instants written before may lie "
                "ahead, the pod keeps to the safe side of both",
                measured.offset - came.best.offset,
                self._outlast,
            )
        CLOCK_OFFSET.set(self.offset)
        return measured

    def _retire(self, at: float) -> None:
        """Keep the estimate in use beside the next while an instant written on its time
        may lie ahead: its doubt as it stands at ``at``, growing from there at the drift
        it measured, or faster if the readings after it show the clocks parting faster
        (``read``)."""
        estimate = self._estimate
        kept = Reading(estimate.best.offset, estimate.doubt(at), at, estimate.best.source)
        self._before.append((Estimate(kept, estimate.drift), at + self._outlast))

    def _came_forward(self, fresh: Reading) -> bool:
        """Whether ``fresh`` puts the server's time later, beyond its error, than the
        latest the estimate in use allowed when it was taken."""
        estimate = self._estimate
        return fresh.offset - fresh.error > estimate.best.offset + estimate.doubt(fresh.taken)

    async def start(self) -> None:
        """The first reads, before any lease: the start fails if the server cannot say."""
        for _ in range(FIRST_READS):
            await self.read()
        if abs(self.offset) >= WARN_OFFSET:
            log.warning(
                "this pod's clock is %.3f s %s nats-server's; leases keep to nats-server's",
                abs(self.offset),
                "behind" if self.offset > 0 else "ahead of",
            )

    async def keep(self, stop: asyncio.Event, interval: float = PROBE_INTERVAL) -> None:
        """Read the server's time every ``interval`` until ``stop``; a read that fails
        (the broker away) leaves the estimate as it was."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
            if stop.is_set():
                return
            try:
                await self.read()
            except Exception as exc:  # the broker away, or an answer without a time
                log.debug("server time not read: %s", exc)


class WallClock:
    """The pod's own clock, for a fetcher alone with its tests."""

    def now(self) -> float:
        return time.time()

    def at(self, local: float) -> float:
        return local
