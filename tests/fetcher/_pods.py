"""Fetcher pods a server can tell apart, and work one of them is known to hold.

Each pod sends its own User-Agent, so a server's request log says which pod asked.
``hold_work`` makes one pod hold work it has not finished, for certain: with one slot,
it asks for a page the server does not answer until released, and pulls pages it
cannot start meanwhile. No other fetcher runs then, so every unacked message of the
fetcher's consumer is that pod's; what becomes of them when it is killed or stopped is
what the tests look at.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from tests.conftest import StackUrls, eventually
from tests.fetcher._servers import Exchange, LocalServer, Route, serving
from tests.ports import free_port
from tests.support import publish_work, ready, services
from trove_cli.local import LocalTrove
from trove_schema.bus import Bus
from trove_schema.topology import EVENTS_STREAM, FETCHER
from trove_schema.urls import canonicalize

POD_A = "pod-a"
POD_B = "pod-b"
HOSTS = ("a.pods.test", "b.pods.test", "c.pods.test")
#: Pages the holding pod pulls behind its busy slot: all of them, being fewer than the
#: eight a pod with one slot holds beyond it (``trove_fetcher.app.HELD_PER_SLOT``).
WAITING = 6


def _waiting_host(n: int) -> str:
    # Not the stalled page's host: a page of a host with a request in flight waits for
    # it in the task, looking again every gap, and would hold the other pod's one slot.
    return HOSTS[1 + n % (len(HOSTS) - 1)]


def agent(pod: str) -> str:
    return f"TroveBot/test (+{pod})"


@asynccontextmanager
async def fetcher_pod(
    stack: StackUrls, state_dir: Path, env: dict[str, str], pod: str
) -> AsyncIterator[LocalTrove]:
    """One fetcher process, as ``services`` runs it, sending ``agent(pod)``; entered once
    it is ready. Its state folder (and its log) is its own, beside ``state_dir``."""
    port = free_port("127.0.0.1")
    own = {**env, "TROVE_USER_AGENT": agent(pod), "TROVE_HTTP_PORT": str(port)}
    async with services(
        stack, state_dir.with_name(f"{state_dir.name}-{pod}"), own, only=("fetcher",)
    ) as local:
        await ready(port)
        yield local


def _page(title: str) -> Route:
    return lambda ex: ex.send(200, f"<title>{title}</title><p>{title}</p>".encode())


@dataclass(frozen=True)
class StalledSite:
    """Three hosts on one server: ``stalled`` (on the first) is answered once ``release``
    is set, the ``waiting`` pages (on the other two) at once."""

    server: LocalServer
    release: threading.Event
    stalled: str
    waiting: tuple[str, ...]

    def senders(self, url: str) -> list[str]:
        """The User-Agent of each request for ``url``, in arrival order."""
        parts = urlsplit(url)
        seen = self.server.requests_to(parts.path, parts.hostname)
        return [s.headers.get("user-agent", "") for s in sorted(seen, key=lambda s: s.at)]


@contextmanager
def stalled_site(ip: str) -> Iterator[StalledSite]:
    """``StalledSite`` served on ``ip``; released on the way out."""
    release = threading.Event()

    def stalled(ex: Exchange) -> None:
        release.wait(60)
        _page("stalled")(ex)

    routes: dict[str, Route] = {f"{HOSTS[0]}/stalled": stalled}
    routes |= {f"{_waiting_host(n)}/p/{n}": _page(f"p{n}") for n in range(WAITING)}
    with serving(routes, ip) as server:
        try:
            yield StalledSite(
                server,
                release,
                canonicalize(server.url("/stalled", HOSTS[0])),
                tuple(
                    canonicalize(server.url(f"/p/{n}", _waiting_host(n))) for n in range(WAITING)
                ),
            )
        finally:
            release.set()  # no server thread left waiting


def stalled_env(ip: str, gap: float, **extra: str) -> dict[str, str]:
    return {
        "TROVE_RESOLVE": ",".join(f"{host}={ip}" for host in HOSTS),
        "TROVE_ALLOWED_NETWORKS": f"{ip}/32",
        "TROVE_MIN_DOMAIN_DELAY_SECONDS": str(gap),
        "TROVE_GAP_RESPONSE_FACTOR": "0",
        # One page at a time: while the stalled page is asked for, the rest wait in hand.
        "TROVE_CONCURRENCY": "1",
        # The stalled page sends nothing until released: a read timeout (10 s by default)
        # would end its attempt while the other pod starts.
        "TROVE_READ_TIMEOUT": "30",
        **extra,
    }


async def _unacked(bus: Bus) -> tuple[int, int]:
    """The fetcher's work messages delivered and unacked, and those not yet delivered."""
    info = await bus.js.consumer_info(EVENTS_STREAM, FETCHER)
    return info.num_ack_pending, info.num_pending or 0


async def hold_work(bus: Bus, site: StalledSite, holder: str) -> None:
    """Give all the work to ``holder``, the one fetcher pod running: it asks for the
    stalled page and holds every waiting page unstarted."""
    await publish_work(bus, [site.stalled])

    async def asked() -> list[str]:
        return site.senders(site.stalled)

    await eventually(asked, until=bool, timeout=30, what="the stalled page asked for")
    await publish_work(bus, site.waiting)
    await eventually(
        lambda: _unacked(bus),
        until=lambda seen: seen == (1 + WAITING, 0),
        timeout=30,
        what=f"{1 + WAITING} work messages held",
    )
    await still_held(bus, site, holder)


async def still_held(bus: Bus, site: StalledSite, holder: str) -> None:
    """``holder`` is still asking for the stalled page and holds the rest unstarted."""
    assert await _unacked(bus) == (1 + WAITING, 0)
    assert site.senders(site.stalled) == [agent(holder)]
    assert not any(site.senders(url) for url in site.waiting)
