"""A step of a pod's wall clock while it reads a page does not shorten the host's gap.

The fetcher runs as a real process against real NATS and a real HTTP server, whose own
request log is the witness. Its wall clock is set forward by ``STEP`` each time it has
read a page and before it releases the host, as NTP setting a node's clock right, or a
VM resumed, would do at any moment: the moment the answer arrived was read before the
step, and the host's next slot must still be one gap after it.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import StackUrls
from tests.fetcher._completions import Completions
from tests.fetcher._servers import Route, serving
from tests.support import publish_work
from trove_schema.bus import Bus
from trove_schema.urls import canonicalize
from trove_stack.processes import Child

pytestmark = pytest.mark.usefixtures("clean")

IP = "127.0.0.187"
HOST = "steps.test"
GAP = 2.0
#: Most of a gap: placed after the step, the answer's arrival would be this much early.
STEP = 1.5
PAGES = 5

#: The fetcher, as ``python -m trove_fetcher`` runs it, its wall clock set forward by
#: ``STEP`` after each page's extraction (before the lease is released).
STEPPING = (
    "import runpy, time\n"
    "wall = time.time\n"
    "step = [0.0]\n"
    "time.time = lambda: wall() + step[0]\n"
    "import trove_fetcher.fetcher as fetcher\n"
    "extracted = fetcher.Fetcher._event\n"
    "async def stepped(self, *args, **kwargs):\n"
    "    event = await extracted(self, *args, **kwargs)\n"
    f"    step[0] += {STEP}\n"
    "    return event\n"
    "fetcher.Fetcher._event = stepped\n"
    "runpy.run_module('trove_fetcher', run_name='__main__', alter_sys=True)\n"
)


def page(n: int) -> Route:
    return lambda ex: ex.send(200, f"<title>p{n}</title><p>page {n}</p>".encode())


async def test_a_step_of_the_wall_clock_while_a_page_is_read_keeps_the_gap(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    routes: dict[str, Route] = {f"{HOST}/robots.txt": lambda ex: ex.send(404, b"")}
    routes |= {f"{HOST}/p/{n}": page(n) for n in range(PAGES)}
    env = {
        **os.environ,
        "TROVE_NATS_URL": stack.nats_url,
        "TROVE_DATABASE_URL": stack.database_url,
        "TROVE_RESOLVE": f"{HOST}={IP}",
        "TROVE_ALLOWED_NETWORKS": f"{IP}/32",
        "TROVE_MIN_DOMAIN_DELAY_SECONDS": str(GAP),
        "TROVE_GAP_RESPONSE_FACTOR": "0",
        "TROVE_LOG_FORMAT": "json",
    }
    with serving(routes, IP) as server:
        urls = [canonicalize(server.url(f"/p/{n}", HOST)) for n in range(PAGES)]
        pod = Child(
            "fetcher-stepping",
            [sys.executable, "-c", STEPPING],
            log_path=state_dir / "logs" / "fetcher-stepping.log",
            env=env,
        )
        try:
            await publish_work(bus, urls)
            events = await Completions(bus.js).wait_for(PAGES, timeout=90)
            assert pod.alive(), pod.tail()
        finally:
            pod.stop(timeout=20)
        seen = sorted(server.requests_for(HOST), key=lambda s: s.at)

    assert {e.outcome.value for e in events.values()} == {"success"}
    pages = [s for s in seen if s.path.startswith("/p/")]
    assert len(pages) == PAGES
    gaps = [round(b.at - a.at, 3) for a, b in itertools.pairwise(seen)]
    assert min(gaps) >= GAP, f"requests closer than {GAP}s: {gaps}"
