"""Two fetcher pods whose clocks disagree still keep a host's gap between them.

Both run as real processes against real NATS and a real HTTP server, whose own request
log is the witness. One pod's wall clock runs ``SKEW`` seconds ahead (``time.time`` set
forward before the fetcher starts), as on a node that NTP does not keep in time; each
pod sends its own User-Agent, so the log says which pod sent each request.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import StackUrls
from tests.fetcher._completions import Completions
from tests.fetcher._servers import Route, serving
from tests.support import publish_work, services
from trove_schema.bus import Bus
from trove_schema.urls import canonicalize
from trove_stack.processes import Child

pytestmark = pytest.mark.usefixtures("clean")

IP = "127.0.0.183"
HOST = "clocks.test"
GAP = 1.0
#: Three gaps: on its own clock, the pod ahead would find the host free at once.
SKEW = 3.0
PAGES = 14

#: The fetcher, as ``python -m trove_fetcher`` runs it, on a clock ``SKEW`` s ahead.
AHEAD = (
    "import runpy, time\n"
    "wall = time.time\n"
    f"time.time = lambda: wall() + {SKEW}\n"
    "runpy.run_module('trove_fetcher', run_name='__main__', alter_sys=True)\n"
)


def page(n: int) -> Route:
    return lambda ex: ex.send(200, f"<title>p{n}</title><p>page {n}</p>".encode())


def pod_env(name: str) -> dict[str, str]:
    return {
        "TROVE_RESOLVE": f"{HOST}={IP}",
        "TROVE_ALLOWED_NETWORKS": f"{IP}/32",
        "TROVE_MIN_DOMAIN_DELAY_SECONDS": str(GAP),
        "TROVE_GAP_RESPONSE_FACTOR": "0",
        "TROVE_USER_AGENT": f"TroveBot/test (+{name})",
        # Two messages in hand per pod: the work is shared out, not taken by one pod.
        "TROVE_CONCURRENCY": "2",
        "TROVE_MAX_ACK_PENDING": "4",
    }


async def test_a_pod_whose_clock_runs_ahead_keeps_the_gap_of_the_others(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    routes: dict[str, Route] = {f"{HOST}/robots.txt": lambda ex: ex.send(404, b"")}
    routes |= {f"{HOST}/p/{n}": page(n) for n in range(PAGES)}
    with serving(routes, IP) as server:
        urls = [canonicalize(server.url(f"/p/{n}", HOST)) for n in range(PAGES)]
        async with services(stack, state_dir, pod_env("in-time"), only=("fetcher",)) as local:
            ahead = Child(
                "fetcher-ahead",
                [sys.executable, "-c", AHEAD],
                log_path=state_dir / "logs" / "fetcher-ahead.log",
                env={**os.environ, **pod_env("ahead"), **local.env, "TROVE_LOG_FORMAT": "json"},
            )
            try:
                await publish_work(bus, urls)
                events = await Completions(bus.js).wait_for(PAGES, timeout=90)
                assert ahead.alive(), ahead.tail()
                local.check_alive()
            finally:
                ahead.stop(timeout=20)
        seen = sorted(server.requests_for(HOST), key=lambda s: s.at)

    assert {e.outcome.value for e in events.values()} == {"success"}
    # The pod found its clock as far off as the test set it, and said so.
    said = re.findall(r"(\d+\.\d+) s ahead of nats-server's", ahead.log_path.read_text())
    assert said, "the pod ahead did not warn of its clock"
    assert float(said[0]) == pytest.approx(SKEW, abs=0.05)
    senders = [s.headers.get("user-agent", "") for s in seen]
    by_pod = {pod: sum(pod in ua for ua in senders) for pod in ("in-time", "ahead")}
    assert all(by_pod.values()), f"one pod sent every request: {by_pod}"
    gaps = [
        (b.at - a.at, ua_a, ua_b)
        for (a, ua_a), (b, ua_b) in itertools.pairwise(zip(seen, senders, strict=True))
    ]
    short = [(round(g, 3), a, b) for g, a, b in gaps if g < GAP]
    assert not short, f"requests closer than {GAP}s: {short}"
    handovers = sum(a != b for _, a, b in gaps)
    assert handovers, "the pods never followed each other on the host"
