"""What a request learned about its host (a 429's pause), left for the broker to take,
is waited for until the stopping pod's grace is nearly spent, not for a moment.

The ``Fetcher`` runs against real NATS and a real HTTP server; the broker away is a
lease bucket that times out on the writes that pause a host, until it is back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.fetcher._servers import LocalServer, Route, serving
from tests.fetcher.test_fetcher_outcomes import HOST, IP, _a_pause_left_late
from trove_fetcher.app import STOP_MARGIN, settle_within_grace
from trove_fetcher.transport import build_client
from trove_schema.bus import Bus
from trove_schema.settings import FetcherSettings

pytestmark = pytest.mark.usefixtures("clean")


@pytest.fixture
def server() -> Iterator[LocalServer]:
    routes: dict[str, Route] = {
        f"{HOST}/limited": lambda ex: ex.send(429, b"slow down", {"Retry-After": "60"}),
        f"{HOST}/robots.txt": lambda ex: ex.send(200, b"User-agent: *\nAllow: /\n"),
        f"{HOST}/page": lambda ex: ex.send(200, b"<title>a page</title><p>text</p>"),
    }
    with serving(routes, IP) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    settings = FetcherSettings(allowed_networks=(f"{IP}/32",), resolve=(f"{HOST}={IP}",))
    async with build_client(settings) as built:
        yield built


async def test_a_late_pause_is_written_when_the_broker_is_back_seconds_into_the_stop(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer
) -> None:
    """The broker back 2.5 s after the stop began, within a grace scaled down from
    180 s to ``STOP_MARGIN`` + 8 s: the pause is written before the stop ends."""
    fetcher, polite, kv = await _a_pause_left_late(bus, client, server)
    loop = asyncio.get_running_loop()
    try:
        fetcher.stopping.set()
        stopped_at = loop.time()
        back = loop.call_later(2.5, kv.away.clear)  # the outage's length is under test
        await settle_within_grace(fetcher, stopped_at, grace=STOP_MARGIN + 8.0)
        settled = loop.time() - stopped_at
        slot = await polite.state(HOST)
    finally:
        back.cancel()
        fetcher.close()
    assert slot.backoff_until - fetcher.clock.now() > 50.0
    assert settled < 8.0  # written as the broker came back, not at the deadline


async def test_a_stopping_pod_gives_up_its_late_writes_before_its_grace_ends_and_names_hosts(
    bus: Bus, client: httpx.AsyncClient, server: LocalServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The grace runs from the stop, not from the end of the work in hand: a pod whose
    stop began all but 0.5 s of its grace (less the margin) ago waits 0.5 s, and says
    which host's pause is lost, though the broker would be back a second later."""
    fetcher, polite, kv = await _a_pause_left_late(bus, client, server)
    loop = asyncio.get_running_loop()
    grace = STOP_MARGIN + 8.0
    try:
        fetcher.stopping.set()
        stopped_at = loop.time() - (grace - STOP_MARGIN) + 0.5
        back = loop.call_later(1.5, kv.away.clear)
        with caplog.at_level(logging.WARNING, logger="trove.fetcher"):
            await settle_within_grace(fetcher, stopped_at, grace=grace)
        slot = await polite.state(HOST)
    finally:
        back.cancel()
        fetcher.close()
    (lost,) = [r for r in caplog.records if "is lost" in r.getMessage()]
    assert getattr(lost, "writes", None) == 1
    assert getattr(lost, "hosts", None) == [HOST]
    assert slot.backoff_until == 0.0
