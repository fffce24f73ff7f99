"""A pod's reading of nats-server's time, against the real server.

The pod's own clock is set off by a known amount (``wall``), as a node out of time
would be; the server's is the machine's, so the offset the pod finds must be that
amount, within the round trip.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from nats.js.errors import ServiceUnavailableError

from tests.conftest import eventually
from trove_fetcher.app import consume_on_the_servers_clock
from trove_fetcher.clock import KEPT, Ask, ServerClock, reading, stream_info
from trove_schema.bus import Bus
from trove_schema.server_time import server_time
from trove_schema.topology import WORK_STREAM

pytestmark = pytest.mark.usefixtures("clean")


def server(bus: Bus) -> Ask:
    """The question the fetcher asks: the work stream's info."""
    return stream_info(bus.nc, WORK_STREAM)


def test_a_reading_is_the_middle_of_the_round_trip_within_half_of_it() -> None:
    measured = reading(sent=100.0, answered=100.4, server_time=103.0)
    assert measured.offset == pytest.approx(2.8)
    assert measured.error == pytest.approx(0.2)


def test_the_servers_nanoseconds_are_read_to_the_microsecond() -> None:
    assert server_time(b'{"ts": "2026-11-27T22:05:53.039293459Z"}') == pytest.approx(
        1795817153.039293, abs=1e-6
    )
    assert server_time(b'{"ts": "2026-11-27T22:05:53Z"}') == 1795817153.0


def test_an_answer_that_is_an_error_raises_it() -> None:
    answer = b'{"error": {"code": 503, "err_code": 10008, "description": "no leader"}}'
    with pytest.raises(ServiceUnavailableError):
        server_time(answer)


@pytest.mark.parametrize("skew", [-7.5, 0.0, 3.0])
async def test_a_pod_finds_how_far_its_clock_is_from_the_servers(bus: Bus, skew: float) -> None:
    clock = ServerClock(server(bus), wall=lambda: time.time() + skew)
    await clock.start()

    assert clock.offset == pytest.approx(-skew, abs=0.05)
    assert 0.0 <= clock.error < 0.05
    # On the server's time whatever the pod's clock says, and on the safe side of it.
    assert clock.now() <= time.time() <= clock.now() + 0.1
    local = time.time() + skew
    assert clock.at(local) >= local - skew


async def test_a_step_of_the_pods_wall_clock_does_not_move_the_time_it_keeps(bus: Bus) -> None:
    step = 0.0
    clock = ServerClock(server(bus), wall=lambda: time.time() + step)
    await clock.start()
    before = clock.now()
    step = 5.0  # NTP sets the node's clock right, at once

    assert clock.now() == pytest.approx(before, abs=0.05)
    assert clock.offset == pytest.approx(-5.0, abs=0.05)
    # A moment the pod's clock stamped after the step is placed by it.
    assert clock.at(time.time() + step) == pytest.approx(time.time(), abs=0.05)


async def test_a_slow_round_trip_does_not_move_the_clock(bus: Bus) -> None:
    ask = server(bus)
    slow = False

    async def maybe_slow() -> bytes:
        answer = await ask()
        if slow:  # the answer held up on its way back, as under load
            await asyncio.sleep(0.4)
        return answer

    clock = ServerClock(maybe_slow)
    await clock.start()
    offset = clock.offset
    slow = True
    late = await clock.read()

    assert late.error > 0.15
    assert clock.offset == pytest.approx(offset, abs=1e-3)
    assert clock.error < 0.01
    # Once the good readings are older than the ones kept, the best of the rest counts.
    for _ in range(KEPT):
        await clock.read()
    assert clock.error > 0.15


async def test_when_the_leadership_moves_the_pod_keeps_the_new_leader_s_time(bus: Bus) -> None:
    # A cluster whose second server's clock is 3 s ahead. The real server answers; its
    # answer is told as the leader's, then as the second server's, a little slower.
    ask = server(bus)
    leader, ahead = "n1", 0.0

    async def as_led() -> bytes:
        answer = json.loads(await ask())
        stamped = server_time(json.dumps({"ts": answer["ts"]}).encode()) + ahead
        answer["ts"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamped)) + (
            f"{stamped % 1:.6f}"[1:] + "Z"
        )
        answer["cluster"] = {"name": "trove", "leader": leader}
        if leader == "n2":
            await asyncio.sleep(0.02)  # a round trip a little slower than the best before
        return json.dumps(answer).encode()

    clock = ServerClock(as_led)
    await clock.start()
    before = clock.offset
    leader, ahead = "n2", 3.0
    await clock.read()

    assert clock.offset == pytest.approx(before + 3.0, abs=0.05)
    assert clock.error > 0.005  # the new server's reading, though its doubt is larger
    # Hosts written free on the time before are not found free 3 s early, and an end
    # stamped now is not before the new leader's time.
    assert clock.now() <= time.time()
    local = time.time()
    assert clock.at(local) >= local + 3.0


async def test_the_pod_keeps_reading_and_a_failed_read_changes_nothing(bus: Bus) -> None:
    ask = server(bus)
    asked = 0
    failing = False

    async def counted() -> bytes:
        nonlocal asked
        asked += 1
        if failing:
            raise TimeoutError("the broker away")
        return await ask()

    async def reads() -> int:
        return asked

    clock = ServerClock(counted)
    await clock.start()
    started, offset = asked, clock.offset
    stop = asyncio.Event()
    keeping = asyncio.create_task(clock.keep(stop, interval=0.05))
    await eventually(reads, until=lambda n: n >= started + 3, timeout=5, interval=0.01)
    failing = True
    failed_from = asked
    await eventually(reads, until=lambda n: n >= failed_from + 3, timeout=5, interval=0.01)
    stop.set()
    await asyncio.wait_for(keeping, 1)

    assert clock.offset == pytest.approx(offset, abs=0.05)


async def test_a_stopping_pod_reads_the_servers_time_until_its_work_in_hand_is_done(
    bus: Bus,
) -> None:
    """Work in hand finishes after the stop (robots.txt then its page, redirect hops),
    each step under a lease taken on the server's time, which is read until it ends."""
    ask = server(bus)
    asked = 0

    async def counted() -> bytes:
        nonlocal asked
        asked += 1
        return await ask()

    async def reads() -> int:
        return asked

    finish = asyncio.Event()

    class Draining:
        async def run(self, stop: asyncio.Event) -> None:
            await stop.wait()
            await finish.wait()  # the work in hand, done when the test says

    clock = ServerClock(counted)
    await clock.start()
    stop = asyncio.Event()
    running = asyncio.create_task(
        consume_on_the_servers_clock(stop, clock, [Draining(), Draining()], interval=0.05)
    )
    stop.set()
    at_stop = asked
    await eventually(reads, until=lambda n: n >= at_stop + 3, timeout=5, interval=0.01)
    assert not running.done()
    finish.set()
    await asyncio.wait_for(running, 5)
