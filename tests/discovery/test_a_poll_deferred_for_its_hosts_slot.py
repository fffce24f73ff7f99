"""A poll deferred for its host's slot asked the instance nothing, and says nothing of it.

An instance that refuses Trove (403 on its public timeline) or is down for weeks has its
host paused, the pause doubling with each failure up to a day; the chain's own back-off
stops at six hours. From then on most polls come while the host is paused: the lease
defers them and they end as a success that made no request. Such a poll must neither
start the chain's back-off again nor end the run of failures ``trove instances`` shows.

Real NATS (the hosts' and the follows' buckets), the real fetcher and its politeness, the
real follows and shares, the recorder's projection in Postgres, a local HTTP server.
"""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.cli.test_instances import project
from tests.discovery.follow_support import SchedulingBus, poll_due_now, recorded
from tests.discovery.test_shares import SETTINGS
from tests.fetcher._servers import Exchange, serving
from tests.fetcher.test_poll_politeness import HOST, IP, client, fetcher_on, polled
from trove_cli.instances import list_instances
from trove_discovery.discovery import Discovery
from trove_discovery.follows import Follows, FollowStore, parse_command
from trove_discovery.shares import Shares
from trove_fetcher.politeness import Politeness, PolitenessConfig
from trove_schema.bus import Bus
from trove_schema.events import CrawlOutcome, InstanceFollowed
from trove_schema.policy import LearningConfig
from trove_schema.topology import DOMAINS_BUCKET, FOLLOW_SUBJECT, FOLLOWS_BUCKET, SEEN_BUCKET

pytestmark = pytest.mark.usefixtures("clean")

__all__ = ["client"]  # the fixture, used by name


def forbidden(exchange: Exchange) -> None:
    exchange.send(403, b'{"error":"forbidden"}', content_type="application/json")


async def test_a_poll_deferred_while_its_host_is_paused_keeps_the_run_of_failures(
    bus: Bus, engine: AsyncEngine, client: httpx.AsyncClient
) -> None:
    routes = {f"{HOST}/robots.txt": lambda ex: ex.send(200, b"User-agent: *\nAllow: /\n")}
    with serving(routes, IP) as server:
        origin = f"http://{HOST}:{server.port}"
        server.routes[f"{HOST}/api/v1/timelines/public?local=true&limit=40"] = forbidden
        store = FollowStore(await bus.js.key_value(FOLLOWS_BUCKET))
        follows = Follows(bus=bus, store=store, settings=SETTINGS)
        (command,) = parse_command(origin.encode(), verb="follow", settings=SETTINGS).accepted
        assert await follows.follow(command, place=str(9 * 10**9), origin=FOLLOW_SUBJECT)
        first = await poll_due_now(bus, origin, "local")
        first = first.model_copy(update={"api": origin})  # as after NodeInfo
        # A pause of an hour after a 403: what a host refusing for days has reached.
        politeness = Politeness(
            await bus.js.key_value(DOMAINS_BUCKET),
            PolitenessConfig(min_delay=0.05, max_delay=1.0),
            LearningConfig(pause_base=3600.0),
        )
        fetcher = await fetcher_on(bus, client, politeness)
        chain = SchedulingBus(bus.nc, bus.js)
        chain.scheduled = []
        discovery = Discovery(bus=bus, seen=await bus.js.key_value(SEEN_BUCKET), settings=SETTINGS)
        shares = Shares(bus=chain, store=store, discovery=discovery, settings=SETTINGS)
        try:
            await fetcher.poll(first)
            (refused,) = await polled(bus.js, 1)
            await shares.polled(refused)
            await fetcher.poll(chain.scheduled[-1])
            deferred = (await polled(bus.js, 2))[1]
            await shares.polled(deferred)
        finally:
            fetcher.close()
        asked = [r.path for r in server.requests_for(HOST) if r.path.startswith("/api/")]

    assert (refused.outcome, refused.status_code) == (CrawlOutcome.BLOCKED_4XX, 403)
    assert (deferred.outcome, deferred.requests) == (CrawlOutcome.SUCCESS, 0)
    assert len(asked) == 1  # the deferred poll asked nothing
    # The chain's back-off goes on from the failure before.
    assert chain.scheduled[-1].failures == 1
    kept = await store.timeline(origin, "local")
    assert kept is not None
    assert kept.failures == 1
    # And the operator is told since when it fails, and why.
    (followed,) = [f for f in await recorded(bus, InstanceFollowed) if f.instance == origin]
    await project(engine, [followed, refused, deferred])
    (row,) = [r for r in await list_instances(engine) if r.instance == origin]
    assert row.failing_since == refused.completed_at
    state = row.state(datetime.now(UTC))
    assert state.startswith("failing since"), state
    assert "403" in state
    assert "paused until" in state
