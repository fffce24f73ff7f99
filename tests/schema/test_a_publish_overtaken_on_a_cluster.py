"""A publish that expects its subject's last sequence, overtaken on a three-server
cluster: the production topology (``TROVE_REPLICAS=3``), where a clustered stream
refuses it in words of its own while the write that overtook it is replicated."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from functools import partial
from pathlib import Path

import pytest

from tests.conftest import eventually
from tests.ports import free_port
from trove_schema.bus import Bus, Overtaken
from trove_schema.events import CrawlRequested, RequestReason, Scope, ScopeKind, utcnow
from trove_schema.topology import TopologyOptions, declare, ensure_topology, page_schedule_subject
from trove_stack.nats import listening, nats_server_binary
from trove_stack.processes import Child

SERVERS = 3


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    ports = [free_port() for _ in range(SERVERS)]
    routes = [free_port() for _ in range(SERVERS)]
    peers = ", ".join(f"nats-route://127.0.0.1:{r}" for r in routes)
    children: list[Child] = []
    try:
        for n in range(SERVERS):
            conf = tmp_path / f"n{n}.conf"
            store = json.dumps(str(tmp_path / f"js{n}"))
            conf.write_text(
                f"server_name: n{n}\nlisten: 127.0.0.1:{ports[n]}\n"
                f"jetstream {{ store_dir: {store} }}\n"
                f"cluster {{ name: trove, listen: 127.0.0.1:{routes[n]}, routes: [{peers}] }}\n"
            )
            child = Child(
                f"nats-{n}",
                [str(nats_server_binary()), "-c", str(conf)],
                log_path=tmp_path / f"n{n}.log",
            )
            children.append(child)
        for child, port in zip(children, ports, strict=True):
            child.wait_until(partial(listening, "127.0.0.1", port), timeout=30, what="up")
        yield ",".join(f"nats://127.0.0.1:{p}" for p in ports)
    finally:
        for child in children:
            child.stop()


@pytest.fixture
async def clustered(cluster: str) -> AsyncIterator[Bus]:
    bus = await Bus.connect(cluster, name="trove-tests")

    async def declared() -> bool:
        try:
            await ensure_topology(bus.js, declare(TopologyOptions(replicas=SERVERS)))
        except Exception:
            return False  # no meta leader yet: it is elected a moment after they listen
        return True

    try:
        await eventually(declared, until=bool, timeout=60, what="the streams declared")
        yield bus
    finally:
        await bus.close()


def request(n: int) -> CrawlRequested:
    return CrawlRequested(
        url="https://site.example/post",
        domain="site.example",
        scope=Scope(kind=ScopeKind.HOST, value="site.example", max_depth=3),
        reason=RequestReason.RECRAWL,
        caused_by=f"attempt-{n}",
    )


async def test_a_publish_overtaken_while_the_other_write_replicates_is_told_so(
    clustered: Bus,
) -> None:
    # A moved page's request and the target's own, written at the same moment.
    schedule = page_schedule_subject("https://site.example/post")
    due = utcnow() + timedelta(days=3)
    outcomes: Counter[str] = Counter()
    for n in range(40):
        _, seq = await clustered.waiting(schedule)
        own = clustered.publish_at(request(1000 + n), due, schedule=schedule)
        move = clustered.publish_at(request(n), due, schedule=schedule, replacing=seq)
        _, moved = await asyncio.gather(own, move, return_exceptions=True)
        outcomes["overtaken" if isinstance(moved, Overtaken) else repr(moved)] += 1
    assert set(outcomes) <= {"overtaken", "None"}, outcomes
    assert outcomes["overtaken"] > 0, outcomes
