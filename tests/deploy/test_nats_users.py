"""deploy/nats on a real nats-server: TLS and a user required, each user held to its subjects.

The server runs the repository's nats.conf and users.conf as they are, but for the
certificate paths, the store and the ports (a trustme CA, a temporary folder, free
ports on 127.0.0.1). k8s/nats/values.yaml grants the same (test_kubernetes checks it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from operator import eq, lt
from pathlib import Path
from typing import Any

import nats
import pytest
import trustme
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from tests.conftest import eventually
from tests.deploy._support import REPO, nats_users
from tests.ports import free_port
from trove_cli.status import read_slots
from trove_discovery.follows import Follows, FollowStore, parse_command
from trove_fetcher.app import _may_purge, _work_max_age
from trove_schema.bus import Bus
from trove_schema.nats_tls import client_tls
from trove_schema.settings import CommonSettings, DiscoverySettings
from trove_schema.topology import (
    CRAWL_COMPLETED,
    CRAWL_REQUESTED,
    DAY,
    FETCH_DEFERRED,
    FOLLOW_SUBJECT,
    FOLLOWS_BUCKET,
    INSTANCE_FOLLOWED,
    INSTANCE_UNFOLLOWED,
    OWNERS,
    PAGE_DISCOVERED,
    SEED_REJECTED,
    SEEDS_STREAM,
    SEEDS_SUBJECT,
    TIMELINE_POLLED,
    TIMELINE_REQUESTED,
    UNFOLLOW_SUBJECT,
    WORK_STREAM,
    TopologyOptions,
    declare,
    ensure_topology,
)
from trove_stack.nats import listening, nats_server_binary

DEPLOY = REPO / "deploy" / "nats"
EVENTS = (
    PAGE_DISCOVERED,
    SEED_REJECTED,
    CRAWL_REQUESTED,
    CRAWL_COMPLETED,
    INSTANCE_FOLLOWED,
    INSTANCE_UNFOLLOWED,
    TIMELINE_REQUESTED,
    TIMELINE_POLLED,
)
#: The events each service produces, and so may publish (PLATFORM.md, Services).
PRODUCES = {
    "discovery": {
        PAGE_DISCOVERED,
        SEED_REJECTED,
        CRAWL_REQUESTED,
        INSTANCE_FOLLOWED,
        INSTANCE_UNFOLLOWED,
        TIMELINE_REQUESTED,
    },
    "fetcher": {CRAWL_COMPLETED, TIMELINE_POLLED},
    "recorder": {CRAWL_REQUESTED},
}
#: Operator input: seeds and (un)follow commands.
COMMANDS = (SEEDS_SUBJECT, FOLLOW_SUBJECT, UNFOLLOW_SUBJECT)
#: How long a refused JetStream request is given before it counts as unanswered.
REFUSED_AFTER = 0.5


@dataclass(frozen=True)
class Secured:
    port: int
    ca: Path
    passwords: dict[str, str]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    folder = tmp_path_factory.mktemp("nats-users")
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    server.private_key_pem.write_to_path(str(folder / "server-key.pem"))
    server.cert_chain_pems[0].write_to_path(str(folder / "server-cert.pem"))
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    port = free_port("127.0.0.1")
    config = (DEPLOY / "nats.conf").read_text("utf-8")
    config = config.replace("/tls/", f"{folder}/").replace("/data/jetstream", f"{folder}/js")
    config = re.sub(r"^port: 4222$", f"host: 127.0.0.1\nport: {port}", config, flags=re.M)
    config = re.sub(r"^http_port: 8222$", "", config, flags=re.M)
    assert f"port: {port}" in config
    assert "/tls/" not in config
    (folder / "nats.conf").write_text(config, "utf-8")
    shutil.copy(DEPLOY / "users.conf", folder / "users.conf")
    passwords = {user: secrets.token_hex(16) for user in nats_users()}
    env = {**os.environ, **{f"NATS_{u.upper()}_PASSWORD": p for u, p in passwords.items()}}
    log = (folder / "nats.log").open("wb")
    process = subprocess.Popen(
        [str(nats_server_binary()), "-c", str(folder / "nats.conf")],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while not listening("127.0.0.1", port):
            assert process.poll() is None, (folder / "nats.log").read_text()
            assert time.monotonic() < deadline, "nats-server did not start"
            time.sleep(0.05)
        yield Secured(port=port, ca=folder / "ca.pem", passwords=passwords)
    finally:
        process.terminate()
        process.wait(timeout=20)
        log.close()


async def connect(
    secured: Secured,
    user: str | None,
    *,
    password: str | None = None,
    error_cb: Callable[[Exception], Awaitable[None]] | None = None,
) -> Client:
    """A client with the deployment's CA, as ``user`` (None: no user at all)."""
    tls = client_tls(CommonSettings(nats_tls_ca=secured.ca))
    credentials = "" if user is None else f"{user}:{password or secured.passwords[user]}@"
    options = {} if error_cb is None else {"error_cb": error_cb}
    return await nats.connect(
        f"tls://{credentials}localhost:{secured.port}",
        tls=tls,
        allow_reconnect=False,
        max_reconnect_attempts=0,
        connect_timeout=3,
        **options,
    )


async def assert_refused(js: JetStreamContext, subjects: list[str]) -> None:
    """Each publish to ``subjects`` refused, waited for together: each is a timeout."""
    answers = await asyncio.gather(
        *(js.publish(s, b"{}", timeout=REFUSED_AFTER) for s in subjects),
        return_exceptions=True,
    )
    assert [type(a) for a in answers] == [nats.errors.TimeoutError] * len(subjects)


async def test_each_service_sets_up_the_topology_and_updates_only_what_it_owns(
    secured: Secured,
) -> None:
    for service in ("fetcher", "discovery", "recorder"):
        nc = await connect(secured, service)
        try:
            await ensure_topology(nc.jetstream(timeout=5), declare(), owner=service)
        finally:
            await nc.close()
    # Discovery owns the seeds stream: its settings reshape it.
    longer = declare(TopologyOptions(seeds_max_age=45 * DAY))
    discovery = await connect(secured, "discovery")
    try:
        await ensure_topology(discovery.jetstream(timeout=5), longer, owner="discovery")
        info = await discovery.jetstream().stream_info(SEEDS_STREAM)
        assert info.config.max_age == 45 * DAY
    finally:
        await discovery.close()
    # `trove status` runs in the recorder's pod: it reads the domains bucket with an
    # ephemeral consumer and deletes that consumer afterwards.
    recorder = await connect(secured, "recorder")
    try:
        assert await read_slots(recorder.jetstream(timeout=5)) == {}
    finally:
        await recorder.close()
    # The fetcher may not reshape the seeds stream, nor delete it.
    fetcher = await connect(secured, "fetcher")
    try:
        js = fetcher.jetstream(timeout=REFUSED_AFTER)
        with pytest.raises(TimeoutError):
            await js.update_stream(replace(info.config, max_age=60.0))
        with pytest.raises(TimeoutError):
            await js.delete_stream(SEEDS_STREAM)
    finally:
        await fetcher.close()


async def test_only_the_fetcher_purges_and_only_the_work_it_handled(secured: Secured) -> None:
    operator = await connect(secured, "operator")
    await ensure_topology(operator.jetstream(), declare(), owner="cli")
    await operator.close()
    fetcher = await connect(secured, "fetcher")
    try:
        js = fetcher.jetstream(timeout=REFUSED_AFTER)
        # Up to sequence 1, exclusive: nothing, but asked as ``purge_handled`` asks.
        assert await js.purge_stream(WORK_STREAM, seq=1, subject=FETCH_DEFERRED)
        assert await _may_purge(Bus(fetcher, js))
        others = [c.name for c in declare().streams if c.name != WORK_STREAM]
        others += [f"KV_{b.bucket}" for b in declare().buckets]
        assert len(others) == 9
        answers = await asyncio.gather(
            *(js.purge_stream(str(stream), seq=1) for stream in others), return_exceptions=True
        )
        assert [type(a) for a in answers] == [nats.errors.TimeoutError] * len(others)
    finally:
        await fetcher.close()
    for service in ("discovery", "recorder"):
        nc = await connect(secured, service)
        try:
            refused = nc.jetstream(timeout=REFUSED_AFTER)
            with pytest.raises(TimeoutError):
                await refused.purge_stream(WORK_STREAM, seq=1)
            # As a fetcher whose user the release before granted.
            assert not await _may_purge(Bus(nc, refused))
        finally:
            await nc.close()


async def test_a_fetcher_that_may_not_purge_keeps_the_age_the_work_stream_has(
    secured: Secured,
) -> None:
    operator = await connect(secured, "operator")
    try:
        js = operator.jetstream()
        await ensure_topology(js, declare(TopologyOptions(work_max_age=7 * DAY)), owner=None)
        bus = Bus(operator, js)
        # A stream the release before made, with its week: kept, not lifted.
        assert await _work_max_age(bus, 0.0, may_purge=False) == 7 * DAY
        assert await _work_max_age(bus, 0.0, may_purge=True) == 0.0  # kept until handled
        assert await _work_max_age(bus, 3 * DAY, may_purge=False) == 3 * DAY  # the setting's
        # One without an age is not given one: that would delete waiting work older.
        await ensure_topology(js, declare(), owner=None)
        assert await _work_max_age(bus, 0.0, may_purge=False) == 0.0
    finally:
        await operator.close()


async def test_each_service_publishes_only_the_events_it_produces(secured: Secured) -> None:
    operator = await connect(secured, "operator")
    await ensure_topology(operator.jetstream(), declare(), owner="cli")
    await operator.close()
    for service, produced in PRODUCES.items():
        nc = await connect(secured, service)
        js = nc.jetstream(timeout=REFUSED_AFTER)
        try:
            for subject in sorted(produced):
                ack = await js.publish(subject, b"{}", timeout=5)
                assert ack.seq > 0
            await assert_refused(js, [s for s in EVENTS if s not in produced])
        finally:
            await nc.close()


async def test_each_bucket_is_written_by_the_service_that_owns_it_and_by_no_other(
    secured: Secured,
) -> None:
    # Every bucket the topology declares: one a service writes without the permission
    # would time out on each write, which the consumers take for the broker's trouble
    # and retry forever (the URL-rules bucket did, in the compose deployment).
    operator = await connect(secured, "operator")
    topology = await ensure_topology(operator.jetstream(), declare(), owner="cli")
    await operator.close()
    buckets = [config.bucket for config in topology.buckets]
    assert buckets
    assert [b for b in buckets if b not in OWNERS] == []
    for service in PRODUCES:
        nc = await connect(secured, service)
        js = nc.jetstream(timeout=REFUSED_AFTER)
        try:
            for bucket in (b for b in buckets if OWNERS[b] == service):
                kv = await nc.jetstream(timeout=5).key_value(bucket)
                try:
                    assert await kv.put(f"probe.{service}", b"1") > 0
                except nats.errors.TimeoutError:
                    pytest.fail(f"{service} may not write {bucket}, which it owns")
            others = [b for b in buckets if OWNERS[b] != service]
            await assert_refused(js, [f"$KV.{b}.probe.{service}" for b in others])
        finally:
            await nc.close()


async def test_a_publish_the_server_refuses_is_logged_as_the_deployments_error(
    secured: Secured, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TROVE_NATS_TLS_CA", str(secured.ca))
    password = secured.passwords["fetcher"]
    bus = await Bus.connect(f"tls://fetcher:{password}@localhost:{secured.port}", name="t")
    try:
        with caplog.at_level(logging.WARNING, logger="trove_schema.bus"):
            await bus.nc.publish(SEEDS_SUBJECT, b"https://example.org/")

            async def refusals() -> list[logging.LogRecord]:
                return [r for r in caplog.records if "permissions violation" in r.message]

            found = await eventually(refusals, until=bool, timeout=10, what="the refusal")
    finally:
        await bus.nc.close()
    assert [r.levelno for r in found] == [logging.ERROR]
    assert SEEDS_SUBJECT in found[0].message
    assert "deploy/nats/users.conf" in found[0].message


async def test_seeds_come_from_nats_box_or_the_operator_not_from_a_service(
    secured: Secured,
) -> None:
    operator = await connect(secured, "operator")
    await ensure_topology(operator.jetstream(), declare(), owner="cli")
    js = operator.jetstream()

    async def seeds() -> int:
        return (await js.stream_info(SEEDS_STREAM)).state.messages

    stored = await seeds()
    violations: list[str] = []

    async def on_error(exc: Exception) -> None:
        violations.append(str(exc))

    async def refused() -> int:
        return len(violations)

    for user in ("box", "fetcher", "operator", "recorder"):
        nc = await connect(secured, user, error_cb=on_error)
        for subject in COMMANDS:
            seen = len(violations)
            await nc.publish(subject, f"https://{user}.example/".encode())
            await nc.flush()
            if user in {"box", "operator"}:
                stored += 1
                await eventually(seeds, until=partial(eq, stored), timeout=5, what="stored")
            else:
                await eventually(refused, until=partial(lt, seen), timeout=5, what="a refusal")
                assert "permissions violation" in violations[-1].lower()
        await nc.close()
    assert await seeds() == stored
    # nats-box looks, but changes nothing.
    box = await connect(secured, "box")
    try:
        assert (await box.jetstream().stream_info(SEEDS_STREAM)).state.messages == stored
        with pytest.raises(TimeoutError):
            await box.jetstream(timeout=REFUSED_AFTER).purge_stream(SEEDS_STREAM)
    finally:
        await box.close()
        await operator.close()


async def test_discovery_follows_and_unfollows_under_its_own_user(secured: Secured) -> None:
    """Its follow state, its events, a timeline's schedule and the rollup that drops it,
    and the answer to a `nats req trove.follow` from nats-box."""
    operator = await connect(secured, "operator")
    await ensure_topology(operator.jetstream(), declare(), owner="cli")
    await operator.close()
    violations: list[str] = []

    async def on_error(exc: Exception) -> None:
        violations.append(str(exc))

    settings = DiscoverySettings(max_url_length=2048, allowed_networks=())
    nc = await connect(secured, "discovery", error_cb=on_error)
    try:
        js = nc.jetstream(timeout=5)
        store = FollowStore(await js.key_value(FOLLOWS_BUCKET))
        follows = Follows(bus=Bus(nc, js), store=store, settings=settings)
        await nc.subscribe(FOLLOW_SUBJECT, queue="discovery-replies", cb=follows.reply_to_request)
        instance = b"https://social.example"
        (command,) = parse_command(instance, verb="follow", settings=settings).accepted
        assert await follows.follow(command, place="1", origin="test")
        (command,) = parse_command(instance, verb="unfollow", settings=settings).accepted
        assert await follows.unfollow(command, place="2", origin="test") == ["local"]
        box = await connect(secured, "box")
        try:
            reply = await box.request(FOLLOW_SUBJECT, instance + b" public", timeout=5)
        finally:
            await box.close()
    finally:
        await nc.close()
    assert reply.data.decode() == "following 1: https://social.example public"
    assert violations == []


async def test_nats_turns_away_clients_without_a_user_or_the_ca(secured: Secured) -> None:
    with pytest.raises(Exception, match=r"(?i)authorization"):
        await connect(secured, None)
    with pytest.raises(Exception, match=r"(?i)authorization"):
        await connect(secured, "fetcher", password="not-the-password")
    # Without the deployment's CA the server's certificate is not trusted.
    with pytest.raises(Exception, match=r"(?i)certificate"):
        await nats.connect(
            f"tls://fetcher:{secured.passwords['fetcher']}@localhost:{secured.port}",
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=3,
        )


async def snapshot(nc: Client, stream: str, chunk: int) -> tuple[dict[str, Any], bytes]:
    """``nats stream backup``: the server sends the snapshot in chunks to an inbox, each
    acked on the reply subject it carries (``$JS.SNAPSHOT.ACK.…``), an empty one last."""
    inbox = nc.new_inbox()
    chunks: list[bytes] = []
    ended = asyncio.get_running_loop().create_future()

    async def on_chunk(msg: Msg) -> None:
        if not msg.data:
            ended.set_result(None)
            return
        chunks.append(msg.data)
        if msg.reply:  # the last chunk may come without one
            await msg.respond(b"")

    sub = await nc.subscribe(inbox, cb=on_chunk)
    request = {"deliver_subject": inbox, "chunk_size": chunk}
    answer = json.loads(
        (await nc.request(f"$JS.API.STREAM.SNAPSHOT.{stream}", json.dumps(request).encode())).data
    )
    assert "error" not in answer, answer
    await asyncio.wait_for(ended, 10)
    await sub.unsubscribe()
    return answer, b"".join(chunks)


async def restore(nc: Client, answer: dict[str, Any], data: bytes, chunk: int) -> dict[str, Any]:
    """``nats stream restore``: the chunks are sent to the subject the server names
    (``$JS.SNAPSHOT.RESTORE.…``), each answered, an empty one last."""
    request = {"config": answer["config"], "state": answer["state"]}
    stream = answer["config"]["name"]
    reply = await nc.request(f"$JS.API.STREAM.RESTORE.{stream}", json.dumps(request).encode())
    deliver = json.loads(reply.data)["deliver_subject"]
    for start in range(0, len(data), chunk):
        await nc.request(deliver, data[start : start + chunk], timeout=REFUSED_AFTER * 4)
    done: dict[str, Any] = json.loads((await nc.request(deliver, b"", timeout=10)).data)
    return done


async def test_the_operator_backs_up_a_stream_and_restores_it(secured: Secured) -> None:
    """docs/deploy.md, "Backups and restore": what ``nats stream backup`` and ``restore``
    send and answer, under the operator's user, on the seeds stream."""
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    operator = await connect(secured, "operator", error_cb=on_error)
    try:
        js = operator.jetstream(timeout=5)
        await ensure_topology(js, declare(), owner="cli")
        before = (await js.stream_info(SEEDS_STREAM)).state.messages
        # As `nats pub` sends them (the stream does not answer); names that do not
        # compress, so that the snapshot takes several chunks.
        seeds = [f"https://{secrets.token_hex(24)}.example/".encode() for _ in range(40)]
        for seed in seeds:
            await operator.publish(SEEDS_SUBJECT, seed)

        async def stored() -> int:
            return (await js.stream_info(SEEDS_STREAM)).state.messages

        await eventually(stored, until=partial(eq, before + 40), timeout=5, what="the seeds")
        kept = (await js.stream_info(SEEDS_STREAM)).state
        chunk = 1024  # several chunks, each acked
        answer, data = await snapshot(operator, SEEDS_STREAM, chunk)
        assert len(data) > 2 * chunk
        await js.delete_stream(SEEDS_STREAM)
        done = await restore(operator, answer, data, chunk)
        assert "error" not in done, done
        back = (await js.stream_info(SEEDS_STREAM)).state
        assert (back.messages, back.first_seq, back.last_seq) == (
            kept.messages,
            kept.first_seq,
            kept.last_seq,
        )
        last = await js.get_msg(SEEDS_STREAM, kept.last_seq)
        assert last.data == seeds[-1]
    finally:
        await operator.close()
    assert errors == []  # no ack nor chunk refused
