"""A pod's estimate of nats-server's time stays on the safe side while the clocks move.

The estimator is under test, not nats-server: the server's clock and the pod's are
scripted, so minutes of NTP slewing a node's clock, or of a new leader's clock, run in
a moment. True time advances only by hand; the server stamps its answer at the middle
of each round trip. On the safe side means: ``now`` is never later than the server's
time, and ``at`` of a moment just read never earlier.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

import pytest

from trove_fetcher.clock import PROBE_INTERVAL, Ask, ServerClock, outlasting
from trove_fetcher.politeness import HOLD_SLACK, PolitenessConfig

#: The servers' time at the script's start (an epoch's worth of seconds, as in life).
EPOCH = 1.8e9
#: A round trip to the server: the estimate is right to half of it.
ROUND_TRIP = 0.002
#: The fastest the kernel's NTP discipline slews a clock (seconds a second).
SLEW = 5e-4
#: The most a slew at ``SLEW`` may run the estimate past its doubt before the readings
#: show it: a host's gap a couple of milliseconds short, not tens.
UNMEASURED = 0.002
#: How often the tests look at the estimate, in true seconds.
STEP = 0.1
#: As often, where a step of the server's clock is smaller than ``STEP``'s.
FINE = 0.01


class Script:
    """True time, the pod's clock (which may run fast or slow of it) and the servers'
    clocks (each a fixed amount from true time), all advanced by hand."""

    def __init__(self) -> None:
        self.true = 0.0
        self.pod = 1000.0  # the pod's clock counts from its boot, not the epoch
        #: How much faster than true time the pod's clock runs (NTP slewing it).
        self.rate = 0.0
        #: Each server's clock less true time.
        self.servers = {"n1": 0.0}
        self.leader = "n1"

    def advance(self, seconds: float) -> None:
        self.true += seconds
        self.pod += seconds * (1 + self.rate)

    def server(self, name: str | None = None) -> float:
        return EPOCH + self.true + self.servers[name or self.leader]

    def wall(self) -> float:
        return self.pod + 5.0  # any wall clock: the estimate is not kept on it

    def monotonic(self) -> float:
        return self.pod

    def asking(self, name: str | None = None) -> Ask:
        """The work stream's info as ``name`` (or whichever server leads) answers it."""

        async def ask() -> bytes:
            self.advance(ROUND_TRIP / 2)
            answering = name or self.leader
            stamped = datetime.fromtimestamp(self.server(answering), UTC)
            self.advance(ROUND_TRIP / 2)
            ts = stamped.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            return json.dumps({"ts": ts, "cluster": {"leader": answering}}).encode()

        return ask

    def clock(self, name: str | None = None) -> ServerClock:
        return ServerClock(self.asking(name), wall=self.wall, monotonic=self.monotonic)


def past_its_doubt(script: Script, clock: ServerClock) -> float:
    """How far the estimate is on the wrong side of the server's time (0 if not)."""
    server = script.server()
    return max(0.0, clock.now() - server, server - clock.at(script.wall()))


@pytest.mark.parametrize("pods_clock", [+1, -1], ids=["pod-fast", "server-fast"])
async def test_a_clock_slewed_by_ntp_runs_the_estimate_past_its_doubt_only_until_measured(
    pods_clock: int,
) -> None:
    # NTP corrects 100 ms on the pod's node (its clock runs fast: "now" would run ahead)
    # or on the server's (the pod's runs slow by it: "at" would run behind), at 500 ppm.
    script = Script()
    clock = script.clock()
    await clock.start()
    slewing = 0.1 / SLEW
    script.rate = pods_clock * SLEW
    worst: list[float] = []  # the farthest past, between each read and the next
    while script.true < slewing + 60:
        if script.true >= slewing:
            script.rate = 0.0
        past = 0.0
        for _ in range(round(PROBE_INTERVAL / STEP)):
            script.advance(STEP)
            past = max(past, past_its_doubt(script, clock))
        worst.append(past)
        await clock.read()

    # Until the readings show the slew, the estimate runs past its doubt by what it
    # drifts in a read's interval beyond what it counts on: the reads are often enough.
    assert max(worst[:3]) <= UNMEASURED
    # From the third read on, the slew is measured, and the estimate keeps to its doubt.
    assert max(worst[3:]) == 0.0, [round(w * 1000, 3) for w in worst]


@pytest.mark.parametrize("ahead", [+2.0, -2.0], ids=["new-leader-ahead", "new-leader-behind"])
async def test_when_the_leader_moves_no_host_is_found_free_early(
    ahead: float, caplog: pytest.LogCaptureFixture
) -> None:
    # Two pods on n1's time; the work stream's leadership moves to n2, whose clock is
    # ``ahead`` of n1's. Pod ``a`` reads n2 at once; pod ``b`` has not read since.
    gap = PolitenessConfig().max_delay
    script = Script()
    script.servers["n2"] = ahead
    a, b = script.clock(), script.clock("n1")
    await a.start()
    await b.start()
    # Each pod ends a request on a host just as the leadership moves, and writes the
    # host free a gap later: ``b`` on n1's time, ``a`` on its time after the move.
    written = {"b's": (b.at(script.wall()) + gap, script.true + gap)}
    script.leader = "n2"
    with caplog.at_level(logging.INFO, logger="trove.fetcher.clock"):
        await a.read()
    written["a's"] = (a.at(script.wall()) + gap, script.true + gap)
    moved = script.true

    early: list[tuple[str, str, float]] = []
    while script.true < moved + outlasting(PolitenessConfig()) + 2 * PROBE_INTERVAL:
        for _ in range(round(PROBE_INTERVAL / STEP)):
            script.advance(STEP)
            for pod, clock in (("a", a), ("b", b)):
                for host, (free_at, ends) in written.items():
                    if clock.now() >= free_at and script.true < ends:
                        early.append((pod, host, round(ends - script.true, 3)))
        await a.read()

    assert not early, f"hosts found free before their gap ended: {early[:3]}"
    # The move was told, with how far the new leader's clock is from the one before.
    assert f"{ahead:+.3f} s from the one before's" in caplog.text
    # Once every instant written on n1's time has passed, ``a`` keeps to n2's alone.
    assert script.server("n2") - 0.01 <= a.now() <= script.server("n2")
    assert script.server("n2") <= a.at(script.wall()) <= script.server("n2") + 0.01


@pytest.mark.parametrize("step", [+20.0, -20.0], ids=["set-ahead", "set-back"])
async def test_a_servers_clock_set_is_a_new_time_not_a_drift_that_doubts_every_request(
    step: float, caplog: pytest.LogCaptureFixture
) -> None:
    # NTP sets nats-server's clock 20 s (an offset past what it slews; a VM restored).
    # Read as a drift, the pair of readings across the step doubted the estimate by as
    # much for the forty seconds they are kept: a request's hold had no time left.
    script = Script()
    clock = script.clock()
    await clock.start()
    script.servers["n1"] += step
    with caplog.at_level(logging.INFO, logger="trove.fetcher.clock"):
        await clock.read()
    stepped = script.true
    doubts: list[float] = []
    wrong_side: list[float] = []
    while script.true < stepped + 60:
        for _ in range(round(PROBE_INTERVAL / STEP)):
            script.advance(STEP)
            doubts.append(clock.error)
            wrong_side.append(past_its_doubt(script, clock))
        await clock.read()

    assert "was set" in caplog.text
    # The estimate of the new time is as sure as before the step ...
    assert max(doubts) <= 0.01, max(doubts)
    # ... and the pod keeps to the safe side of both times while instants written on
    # the one before may lie ahead.
    assert max(wrong_side) == 0.0
    assert clock.at(script.wall()) - clock.now() == pytest.approx(abs(step), abs=0.05)


class Descheduled(Script):
    """A script whose pod is descheduled for ``lag`` after each read of either clock:
    another thread holding the interpreter, or a node too busy to run it."""

    def __init__(self, lag: float) -> None:
        super().__init__()
        self.lag = 0.0
        self.later = lag

    def wall(self) -> float:
        read = super().wall()
        self.advance(self.lag)
        return read

    def monotonic(self) -> float:
        read = super().monotonic()
        self.advance(self.lag)
        return read


async def test_a_pod_descheduled_between_its_clock_reads_never_places_a_moment_early() -> None:
    script = Descheduled(lag=0.02)
    clock = script.clock()
    await clock.start()
    script.lag = script.later  # from here, each read of a clock costs 20 ms
    for _ in range(5):
        arrived = script.server()  # an answer arrives, and the pod reads its wall clock
        local = script.wall()
        assert clock.at(local) >= arrived
        script.advance(1.0)


@pytest.mark.parametrize("step", [0.05, 0.5, 1.2])
async def test_a_step_of_the_servers_clock_taken_for_a_slew_finds_no_host_free_early(
    step: float,
) -> None:
    # nats-server's clock is set forward by less than a pod takes for a new time (NTP
    # stepping an offset past 128 ms, a VM's clock set after a pause), just after pod
    # ``b`` released a host on the time before. Pod ``a`` reads the new time at once.
    gap = 2.0
    script = Script()
    a, b = script.clock(), script.clock()
    await a.start()
    await b.start()
    for _ in range(3):  # the pods read the time every few seconds
        script.advance(PROBE_INTERVAL)
        await a.read()
        await b.read()
    script.advance(PROBE_INTERVAL - 0.1)
    free_at, ends = b.at(script.wall()) + gap, script.true + gap
    script.servers["n1"] += step
    await a.read()
    stepped = script.true

    early: list[tuple[str, float]] = []
    while script.true < stepped + outlasting(PolitenessConfig()) + 2 * PROBE_INTERVAL:
        for _ in range(round(PROBE_INTERVAL / FINE)):
            script.advance(FINE)
            for pod, clock in (("a", a), ("b", b)):
                if clock.now() >= free_at and script.true < ends:
                    early.append((pod, round(ends - script.true, 3)))
        await a.read()
        await b.read()

    assert not early, f"the host found free before its gap ended: {early[:3]}"
    # Once every instant written on the time before has passed, the new time alone.
    for clock in (a, b):
        assert script.server() - 0.01 <= clock.now() <= script.server()
        assert script.server() <= clock.at(script.wall()) <= script.server() + 0.01


async def test_a_fast_slew_of_the_servers_clock_leaves_its_instants_safe_and_requests_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # chrony slews nats-server's clock 1.2 s forward at 20,000 ppm: a minute. The pod's
    # "now" and "at" stay on the safe side, and never so far apart that a request's hold
    # (its timeout and a second) is eaten by the doubt.
    slew, corrected = 0.02, 1.2
    script = Script()
    clock = script.clock()
    await clock.start()
    for _ in range(3):
        script.advance(PROBE_INTERVAL)
        await clock.read()
    started = script.true
    spread: list[float] = []
    worst: list[float] = []  # the farthest on the wrong side, between each read and the next
    with caplog.at_level(logging.INFO, logger="trove.fetcher.clock"):
        while script.true < started + corrected / slew + outlasting(PolitenessConfig()) + 20:
            past = 0.0
            for _ in range(round(PROBE_INTERVAL / STEP)):
                script.advance(STEP)
                slewing = script.true - started < corrected / slew
                script.servers["n1"] += slew * STEP if slewing else 0.0
                spread.append(clock.at(script.wall()) - clock.now())
                past = max(past, past_its_doubt(script, clock))
            worst.append(past)
            await clock.read()

    # Until the readings measure the slew, the estimate may run past its doubt by what
    # the slew adds between two reads; from the third on, never.
    assert max(worst[:3]) <= slew * PROBE_INTERVAL
    assert max(worst[3:]) == 0.0, [round(w * 1000, 3) for w in worst]
    config = PolitenessConfig()
    assert max(spread) < (config.request_timeout + HOLD_SLACK) / 2, max(spread)
    assert "came +" in caplog.text
    # Once the slew is over and what was written before has passed: one time again.
    assert spread[-1] <= 0.01


@pytest.mark.parametrize("event", ["came-forward", "leader-moved"])
async def test_a_host_released_while_the_pods_own_clock_is_slewed_is_not_found_free_early(
    event: str,
) -> None:
    # NTP slews the pod's node's clock fast (20,000 ppm) when, a host just released on
    # the time as it was, nats-server's time comes 1 s forward (a step, or a leader
    # whose clock is ahead). The estimate kept for the host's free time is read on the
    # pod's clock, the one being slewed.
    gap = 60.0
    script = Script()
    script.servers["n2"] = 1.0
    clock = script.clock()
    await clock.start()
    script.rate = 0.02
    for _ in range(8):
        script.advance(PROBE_INTERVAL)
        await clock.read()
    script.advance(PROBE_INTERVAL - 0.1)
    free_at, ends = clock.at(script.wall()) + gap, script.true + gap
    if event == "leader-moved":
        script.leader = "n2"
    else:
        script.servers["n1"] += 1.0
    early: list[float] = []
    while script.true < ends + PROBE_INTERVAL:
        await clock.read()
        for _ in range(round(PROBE_INTERVAL / STEP)):
            script.advance(STEP)
            if clock.now() >= free_at and script.true < ends:
                early.append(round(ends - script.true, 3))

    assert not early, f"the host found free {early[0]} s before its gap ended"
