"""Operator messages on a real server: whatever size the server takes is stored and read,
and every request gets an answer the server can carry."""

from __future__ import annotations

import json
from dataclasses import replace

import nats
import pytest
from nats.js.errors import NotFoundError

from tests.conftest import StackUrls, eventually
from tests.discovery.follow_support import recorded
from tests.support import send
from trove_discovery.discovery import Discovery
from trove_discovery.follows import Follows, FollowStore
from trove_schema.bus import Bus
from trove_schema.events import PageDiscovered
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import (
    DISCOVERY_SEEDS,
    FOLLOW_SUBJECT,
    FOLLOWS_BUCKET,
    SEEDS_STREAM,
    SEEDS_SUBJECT,
    SEEN_BUCKET,
    TopologyOptions,
    declare,
    ensure_topology,
)

pytestmark = pytest.mark.usefixtures("clean")

SETTINGS = DiscoverySettings(max_url_length=2048, allowed_networks=())


async def test_the_largest_seed_message_the_server_takes_is_stored_and_read(
    bus: Bus, stack: StackUrls
) -> None:
    # The stream as a release that limited it to an event's size made it: discovery
    # lifts the limit when it starts.
    info = await bus.js.stream_info(SEEDS_STREAM)
    await bus.js.update_stream(replace(info.config, max_msg_size=1 << 20))
    await ensure_topology(bus.js, declare(), owner="discovery")
    # A list of seeds with its notes, as large as the server takes (4 MiB embedded),
    # past TROVE_MAX_MESSAGE_BYTES, which bounds the events.
    urls = [f"https://big{n}.example/" for n in range(3)]
    head = "\n".join(urls) + "\n"
    note = "# " + "x" * 1000 + "\n"
    notes = (bus.nc.max_payload - len(head) - 1024) // len(note)
    payload = (head + note * notes).encode()
    assert len(payload) > TopologyOptions().max_message_bytes
    await send(stack, SEEDS_SUBJECT, payload)

    async def stored() -> bytes | None:
        try:
            return (await bus.js.get_last_msg(SEEDS_STREAM, SEEDS_SUBJECT)).data
        except NotFoundError:
            return None

    data = await eventually(stored, until=lambda d: d is not None, timeout=10, what="stored")
    assert data == payload
    discovery = Discovery(bus=bus, seen=await bus.js.key_value(SEEN_BUCKET), settings=SETTINGS)
    sub = await bus.js.pull_subscribe(SEEDS_SUBJECT, durable=DISCOVERY_SEEDS, stream=SEEDS_STREAM)
    try:
        (msg,) = await sub.fetch(1, timeout=5)
        await discovery.handle_seed(msg)
    finally:
        await sub.unsubscribe()
    assert sorted(e.url for e in await recorded(bus, PageDiscovered)) == urls


def hostile_hosts(max_payload: int) -> list[str]:
    """URLs enough for their refusals to outgrow a reply the server can carry: each quotes
    its host escaped (``'\\u0378...'``), seven bytes of JSON for each two sent."""
    host = "\u0378" * 8000
    return [f"http://{host}{n}/" for n in range(max_payload * 13 // 10 // (7 * len(host)) + 1)]


async def test_a_seed_request_whose_refusals_quote_huge_hosts_is_answered(
    bus: Bus, stack: StackUrls
) -> None:
    discovery = Discovery(bus=bus, seen=await bus.js.key_value(SEEN_BUCKET), settings=SETTINGS)
    sub = await bus.nc.subscribe(SEEDS_SUBJECT, cb=discovery.reply_to_seed_request)
    urls = hostile_hosts(bus.nc.max_payload)
    asker = await nats.connect(stack.nats_url)
    try:
        reply = await asker.request(
            SEEDS_SUBJECT, json.dumps(urls, ensure_ascii=False).encode(), timeout=30
        )
    finally:
        await asker.close()
        await sub.unsubscribe()
    body = json.loads(reply.data)
    assert body["rejected_count"] == len(urls)
    assert body["rejected"]
    assert body["rejected"][0]["reason"].startswith("host '\\u0378")
    assert len(reply.data) < bus.nc.max_payload


async def test_a_follow_request_whose_refusals_quote_huge_hosts_is_answered(
    bus: Bus, stack: StackUrls
) -> None:
    store = FollowStore(await bus.js.key_value(FOLLOWS_BUCKET))
    follows = Follows(bus=bus, store=store, settings=SETTINGS)
    sub = await bus.nc.subscribe(FOLLOW_SUBJECT, cb=follows.reply_to_request)
    instances = hostile_hosts(bus.nc.max_payload)
    asker = await nats.connect(stack.nats_url)
    try:
        payload = json.dumps({"instances": instances}, ensure_ascii=False).encode()
        reply = await asker.request(FOLLOW_SUBJECT, payload, timeout=30)
    finally:
        await asker.close()
        await sub.unsubscribe()
    body = json.loads(reply.data)
    assert (body["accepted_count"], body["rejected"][0]["reason"][:12]) == (0, "host '\\u0378")
    assert len(reply.data) < bus.nc.max_payload
