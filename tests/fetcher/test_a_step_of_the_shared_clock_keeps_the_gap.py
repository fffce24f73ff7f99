"""A step of the shared time forward between two requests to a host does not shorten the
gap the pod that made the first one counted.

The host's record says when it is free on nats-server's time. Here that time, as the
fetcher reads it, steps forward by ``STEP`` each time the pod has released a host: as
the server's clock set right by a step too small to tell from a slew would, or a VM
paused and its clock set after it. The free time written before the step comes that
much early on the shared time; the pod that wrote it keeps the rest on its own clock
as well (``politeness.LocalRests``). The fetcher runs as a real process against real
NATS and a real HTTP server, whose own request log is the witness.
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

IP = "127.0.0.188"
HOST = "shared-steps.test"
#: Under the fetcher's in-task wait (a second): the next page waits in its task, on the
#: shared time, rather than in a scheduled message.
GAP = 0.9
#: A third of the gap: below the step the pod's clock takes for a new time.
STEP = 0.3
PAGES = 4

#: The fetcher, as ``python -m trove_fetcher`` runs it, with the shared time it reads
#: stepped forward by ``STEP`` after each release of a host.
STEPPING = (
    "import runpy\n"
    "import trove_fetcher.clock as clock\n"
    "import trove_fetcher.politeness as politeness\n"
    "step = [0.0]\n"
    "now, at = clock.ServerClock.now, clock.ServerClock.at\n"
    "clock.ServerClock.now = lambda self: now(self) + step[0]\n"
    "clock.ServerClock.at = lambda self, local: at(self, local) + step[0]\n"
    "finish = politeness.Politeness.finish\n"
    "async def stepped(self, *args, **kwargs):\n"
    "    policy = await finish(self, *args, **kwargs)\n"
    f"    step[0] += {STEP}\n"
    "    return policy\n"
    "politeness.Politeness.finish = stepped\n"
    "runpy.run_module('trove_fetcher', run_name='__main__', alter_sys=True)\n"
)


def page(n: int) -> Route:
    return lambda ex: ex.send(200, f"<title>p{n}</title><p>page {n}</p>".encode())


async def test_a_step_of_the_shared_time_after_a_release_keeps_the_hosts_gap(
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
            "fetcher-shared-steps",
            [sys.executable, "-c", STEPPING],
            log_path=state_dir / "logs" / "fetcher-shared-steps.log",
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
    assert len([s for s in seen if s.path.startswith("/p/")]) == PAGES
    gaps = [round(b.at - a.at, 3) for a, b in itertools.pairwise(seen)]
    assert min(gaps) >= GAP, f"requests closer than {GAP}s: {gaps}"
