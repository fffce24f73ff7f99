"""Deferred work is kept until a fetcher has handled it, however long none runs, and
what the fetchers handled leaves TROVE_WORK (``deferral.purge_handled``).

Against a real nats-server: the ``fetcher-deferred`` durable as the topology declares
it, and for the whole path the fetcher as a real process and a real HTTP server whose
request log is the witness.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from tests.conftest import StackUrls, eventually
from tests.fetcher._completions import Completions
from tests.fetcher._servers import Route, serving
from tests.fetcher.test_polite_chains import IP, A, assert_polite, env, page, text, url
from tests.support import publish_work, services
from trove_fetcher.app import _may_purge
from trove_fetcher.deferral import purge_handled
from trove_schema.bus import Bus
from trove_schema.topology import (
    FETCH_DEFERRED,
    FETCHER_DEFERRED,
    WORK_SCHEDULES_PREFIX,
    WORK_STREAM,
)

pytestmark = pytest.mark.usefixtures("clean")


async def _count(bus: Bus, subject: str) -> int:
    info = await bus.js.stream_info(WORK_STREAM, subjects_filter=subject)
    return sum((info.state.subjects or {}).values())


async def _pulls_waiting(bus: Bus) -> int:
    return int((await bus.js.consumer_info(WORK_STREAM, FETCHER_DEFERRED)).num_waiting or 0)


async def test_only_acked_work_is_purged_and_the_rest_is_still_delivered(bus: Bus) -> None:
    for n in range(5):
        await bus.js.publish(FETCH_DEFERRED, f"work {n}".encode())
    waiting = f"{WORK_SCHEDULES_PREFIX}.later"
    await bus.js.publish(
        waiting,
        b"work later",
        headers={
            "Nats-Schedule": "@at 2099-01-01T00:00:00Z",
            "Nats-Schedule-Target": FETCH_DEFERRED,
        },
    )
    pod = await bus.js.pull_subscribe_bind(durable=FETCHER_DEFERRED, stream=WORK_STREAM)
    got: list[Msg] = await pod.fetch(5, timeout=5)
    assert [m.data for m in got] == [f"work {n}".encode() for n in range(5)]
    for msg in got[:3]:
        await msg.ack_sync()

    # Three handled, but no pull waits (the pods' hands are full): a redelivery may be
    # queued, which a purge would make nats-server forget. Not before four times three.
    assert await purge_handled(bus.js, purge_after=3) == 0
    # Another pod asks for work, and waits: nothing is queued.
    other = await bus.js.pull_subscribe_bind(durable=FETCHER_DEFERRED, stream=WORK_STREAM)
    asking = asyncio.create_task(other.fetch(1, timeout=15))
    await eventually(lambda: _pulls_waiting(bus), until=bool, timeout=10, what="a pull waiting")
    assert await purge_handled(bus.js, purge_after=4) == 0  # not yet as many as that
    assert await _count(bus, FETCH_DEFERRED) == 5
    floor = got[2].metadata.sequence.stream
    assert await purge_handled(bus.js, purge_after=3) == floor + 1
    # A second pod looking next finds none handled left to purge.
    assert await purge_handled(bus.js, purge_after=1) == 0

    assert await _count(bus, FETCH_DEFERRED) == 2  # the two in hand
    assert await _count(bus, waiting) == 1  # a schedule waiting to fire is no handled work
    # Those in hand are still the consumer's: handed back, each comes again at once.
    await got[3].nak()
    assert [m.data for m in await asking] == [b"work 3"]
    await got[4].nak()
    assert [m.data for m in await other.fetch(1, timeout=5)] == [b"work 4"]


async def test_handled_work_is_purged_while_no_pull_waits_at_four_times_as_many(
    bus: Bus,
) -> None:
    """Work coming due faster than the pods start it keeps their hands full: no pull
    waits, and the stream would keep every handled message for as long as that lasts."""
    for n in range(5):
        await bus.js.publish(FETCH_DEFERRED, f"work {n}".encode())
    pod = await bus.js.pull_subscribe_bind(durable=FETCHER_DEFERRED, stream=WORK_STREAM)
    got: list[Msg] = await pod.fetch(5, timeout=5)
    for msg in got[:4]:
        await msg.ack_sync()
    assert await _pulls_waiting(bus) == 0
    assert await purge_handled(bus.js, purge_after=2) == 0
    floor = got[3].metadata.sequence.stream
    assert await purge_handled(bus.js, purge_after=1) == floor + 1
    assert await _count(bus, FETCH_DEFERRED) == 1  # the one in hand


async def test_nothing_is_purged_while_the_oldest_work_is_still_in_hand(bus: Bus) -> None:
    """Acked past one still in hand: counted handled, but none at or below the floor.
    A purge would remove nothing and make the server forget the redeliveries queued."""
    pod = await bus.js.pull_subscribe_bind(durable=FETCHER_DEFERRED, stream=WORK_STREAM)
    # Work handled and gone before: the ack floor stands past it.
    await bus.js.publish(FETCH_DEFERRED, b"done")
    (done,) = await pod.fetch(1, timeout=5)
    await done.ack_sync()
    await bus.js.purge_stream(WORK_STREAM, subject=FETCH_DEFERRED)
    for n in range(6):
        await bus.js.publish(FETCH_DEFERRED, f"work {n}".encode())
    got: list[Msg] = await pod.fetch(6, timeout=5)
    for msg in got[1:]:
        await msg.ack_sync()
    # Five handled: enough, even with no pull waiting, at one a purge.
    assert await purge_handled(bus.js, purge_after=1) == 0
    assert await _count(bus, FETCH_DEFERRED) == 6


async def test_no_purge_of_a_few_below_the_floor_while_more_are_handled_past_it(
    bus: Bus,
) -> None:
    """One handled below the floor, six past two still in hand: counted seven, but a
    purge would remove the one and make the server forget the redeliveries queued."""
    for n in range(9):
        await bus.js.publish(FETCH_DEFERRED, f"work {n}".encode())
    pod = await bus.js.pull_subscribe_bind(durable=FETCHER_DEFERRED, stream=WORK_STREAM)
    got: list[Msg] = await pod.fetch(9, timeout=5)
    for msg in got[:1] + got[3:]:
        await msg.ack_sync()
    assert await _pulls_waiting(bus) == 0
    assert await purge_handled(bus.js, purge_after=1) == 0  # four sequences asked
    assert await _count(bus, FETCH_DEFERRED) == 9
    for msg in got[1:3]:
        await msg.ack_sync()
    assert await purge_handled(bus.js, purge_after=1) == got[-1].metadata.sequence.stream + 1
    assert await _count(bus, FETCH_DEFERRED) == 0


async def test_the_starts_check_of_the_purge_leaves_the_consumers_redeliveries_alone(
    bus: Bus,
) -> None:
    await bus.js.publish(FETCH_DEFERRED, b"work")
    pod = await bus.js.pull_subscribe_bind(durable=FETCHER_DEFERRED, stream=WORK_STREAM)
    (msg,) = await pod.fetch(1, timeout=5)
    await msg.nak()  # handed back with no pull waiting: queued for redelivery
    await bus.nc.flush()
    assert (await bus.js.consumer_info(WORK_STREAM, FETCHER_DEFERRED)).num_ack_pending == 1
    assert await _may_purge(bus)
    assert [m.data for m in await pod.fetch(1, timeout=5)] == [b"work"]


async def test_work_due_while_no_fetcher_runs_waits_for_one_then_leaves_once_done(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    """A fetcher stops with four pages deferred; their slots come and go while none runs.
    The next fetcher fetches all four, politely, and purges them once handled."""
    gap = 2.0  # past the in-task wait: each page after the first is deferred
    routes: dict[str, Route] = {f"{A}/robots.txt": text("User-agent: *\nAllow: /\n")}
    for n in range(5):
        routes[f"{A}/p/{n}"] = page(f"p{n}")
    kept = (await bus.js.stream_info(WORK_STREAM)).config.max_age
    assert not kept  # by default, no age: kept until handled

    async def fired() -> int:
        return await _count(bus, FETCH_DEFERRED)

    async def purged() -> int:
        return await _count(bus, FETCH_DEFERRED)

    with serving(routes, IP) as server:
        pages = [url(server, A, f"/p/{n}") for n in range(5)]
        async with services(stack, state_dir, env(gap), only=("fetcher",)) as local:
            await publish_work(bus, pages)
            # Four deferred to their slots, one a gap after the other.
            await eventually(
                lambda: _count(bus, f"{WORK_SCHEDULES_PREFIX}.>"),
                until=lambda n: n == 4,
                timeout=20,
                what="four pages deferred",
            )
            local.check_alive()
        # No fetcher runs while every slot comes due.
        await eventually(fired, until=lambda n: n == 4, timeout=20, what="every slot fired")
        assert len(server.requests_for(A)) <= 2  # robots.txt and /p/0 at most

        completions = Completions(bus.js)
        purging = env(
            gap, TROVE_WORK_PURGE_INTERVAL_SECONDS="0.2", TROVE_WORK_PURGE_AFTER_MESSAGES="1"
        )
        async with services(stack, state_dir, purging, only=("fetcher",)) as local:
            events = await completions.wait_for(5, timeout=40)
            await eventually(purged, until=lambda n: n == 0, timeout=20, what="handled work purged")
            local.check_alive()
        assert_polite(server, A, gap)
    assert {url for url, e in events.items() if e.outcome.value == "success"} == set(pages)
