"""A service started while its servers are away waits for them instead of crash-looping."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import ssl
import subprocess
import sys
from pathlib import Path

import asyncpg.exceptions as pg
import httpx
import pytest
from asyncpg.exceptions import InvalidCachedStatementError
from asyncpg.exceptions._base import OutdatedSchemaCacheError
from nats.js.api import StreamConfig
from nats.js.errors import APIError, ServiceUnavailableError

from tests.conftest import eventually
from tests.ports import free_port
from tests.recorder.test_database_errors import AWAY, UNWRITABLE, wrapped
from tests.support import readiness
from trove_schema.bus import Bus
from trove_schema.errors import InvalidPriors, InvalidTLS, TopologyError
from trove_schema.nats_tls import client_tls
from trove_schema.policy import load_priors
from trove_schema.service import (
    _health_server,
    _start_patiently,
    collect_garbage,
    infrastructure_away,
    together,
)
from trove_schema.settings import CommonSettings
from trove_schema.topology import TopologyOptions, declare, ensure_topology
from trove_stack.nats import EmbeddedNats, NatsConfig, nats_server_binary
from trove_stack.processes import Child


def test_a_broker_timeout_behind_a_topology_error_is_infrastructure_away() -> None:
    error = TopologyError("could not reconcile the JetStream topology")
    error.__cause__ = TimeoutError("nats: timeout")
    assert infrastructure_away(error)


def test_jetstream_not_there_yet_is_infrastructure_away() -> None:
    unavailable = ServiceUnavailableError(
        code=503, err_code=10008, description="JetStream system temporarily unavailable"
    )
    assert infrastructure_away(unavailable)
    assert not infrastructure_away(APIError(code=400, description="bad request"))


def test_a_cluster_still_coming_together_is_infrastructure_away() -> None:
    # Refused now, settled at the next try: no peers to place replicas on yet, a stream
    # another pod is creating at the same moment with other settings.
    for err_code, description in (
        (10005, "no suitable peers for placement"),
        (10058, "stream name already in use with a different configuration"),
    ):
        error = TopologyError("could not create or reconcile stream TROVE_EVENTS")
        error.__cause__ = APIError(code=400, err_code=err_code, description=description)
        assert infrastructure_away(error), description


def test_a_file_missing_or_unreadable_is_a_mistake_said_at_once(tmp_path: Path) -> None:
    # TROVE_NATS_TLS_CA or TROVE_PRIORS_FILE where no file is: not a server away.
    missing = tmp_path / "ca.pem"
    settings = CommonSettings.model_validate({"nats_tls_ca": missing})
    with pytest.raises(InvalidTLS, match=r"ca\.pem") as tls:
        client_tls(settings)
    assert not infrastructure_away(tls.value)
    with pytest.raises(InvalidPriors) as priors:
        load_priors(missing)
    assert not infrastructure_away(priors.value)
    assert not infrastructure_away(ssl.SSLCertVerificationError("certificate verify failed"))
    # A socket's errors: a server away, a unix socket not there yet.
    assert infrastructure_away(ConnectionRefusedError(111, "Connection refused"))
    assert infrastructure_away(FileNotFoundError(2, "No such file or directory"))


async def refused_start(
    tmp_path: Path, options: TopologyOptions, foreign: StreamConfig | None = None
) -> TopologyError:
    """What ends a service's start whose topology (``options``) JetStream refuses at
    every try, on a nats-server holding ``foreign``; the start never ready."""
    server = EmbeddedNats(NatsConfig(store_dir=tmp_path / "nats")).start()
    try:
        if foreign is not None:
            theirs = await Bus.connect(server.url, name="trove-tests")
            try:
                await theirs.js.add_stream(foreign)
            finally:
                await theirs.close()
        stop, ready = asyncio.Event(), asyncio.Event()

        async def main(stop: asyncio.Event, ready: asyncio.Event) -> None:
            bus = await Bus.connect(server.url, name="trove-discovery")
            try:
                await ensure_topology(bus.js, declare(options), owner="discovery")
            finally:
                await bus.close()
            ready.set()

        starting = _start_patiently(main, stop, ready, logging.getLogger("test"))
        with pytest.raises(TopologyError) as refused:
            await asyncio.wait_for(starting, timeout=20)
    finally:
        server.stop()
    assert not infrastructure_away(refused.value)
    assert not ready.is_set()
    return refused.value


async def test_a_topology_jetstream_refuses_ends_the_start_with_the_servers_words(
    tmp_path: Path,
) -> None:
    # A stream of someone else's on the same subjects: every try is refused alike, and
    # the start waited for it every 30 s for ever, "cannot start yet", never failing.
    foreign = StreamConfig(name="FOREIGN", subjects=["trove.>"])
    refused = await refused_start(tmp_path, TopologyOptions(), foreign)
    assert re.search(r"stream TROVE_\w+: .*err_code=10065", str(refused)), refused
    assert "overlap" in str(refused)


async def test_replicas_a_single_server_cannot_place_end_the_start_with_its_words(
    tmp_path: Path,
) -> None:
    # TROVE_REPLICAS=3 against a nats-server that is no cluster: JetStream answers 500
    # (10074), which was waited on as the broker away, not ready for ever.
    refused = await refused_start(tmp_path, TopologyOptions(replicas=3))
    assert "err_code=10074" in str(refused)
    assert "non-clustered" in str(refused)


async def test_a_stop_before_ready_ends_a_start_that_waits_for_ever() -> None:
    # nats-py retries a first connection to a wrong address for ever; a SIGTERM then
    # waited for the orchestrator's SIGKILL.
    stop, ready, started = asyncio.Event(), asyncio.Event(), asyncio.Event()
    cancelled: list[bool] = []

    async def main(stop: asyncio.Event, ready: asyncio.Event) -> None:
        started.set()
        try:
            await asyncio.Event().wait()  # what never comes
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    starting = asyncio.create_task(_start_patiently(main, stop, ready, logging.getLogger("test")))
    await asyncio.wait_for(started.wait(), timeout=5)
    stop.set()
    await asyncio.wait_for(starting, timeout=5)
    assert cancelled == [True]


async def test_a_stop_once_ready_is_left_to_the_service_to_finish() -> None:
    stop, ready = asyncio.Event(), asyncio.Event()
    finished: list[str] = []

    async def main(stop: asyncio.Event, ready: asyncio.Event) -> None:
        ready.set()
        await stop.wait()
        finished.append("drained")

    starting = asyncio.create_task(_start_patiently(main, stop, ready, logging.getLogger("test")))
    await asyncio.wait_for(ready.wait(), timeout=5)
    stop.set()
    await asyncio.wait_for(starting, timeout=5)
    assert finished == ["drained"]


#: What the recorder's batches wait on, but for a statement cached before a migration:
#: a start has none yet.
DATABASE_TROUBLE = [
    e
    for e in AWAY + UNWRITABLE
    if not isinstance(e, InvalidCachedStatementError | OutdatedSchemaCacheError)
]


@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]"], ids=["IPv4", "IPv6"])
async def test_the_health_port_answers_on_either_family(host: str) -> None:
    # The kubelet probes the pod's primary IP: an IPv6 one on an IPv6-first cluster.
    port = free_port("127.0.0.1")
    ready = asyncio.Event()
    ready.set()
    server = await _health_server(port, ready)
    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            answer = await client.get(f"http://{host}:{port}/readyz")
        assert answer.status_code == 200
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("error", DATABASE_TROUBLE, ids=lambda e: type(e).__name__)
def test_a_database_away_or_unable_to_write_is_infrastructure_away(error: Exception) -> None:
    """Also behind a migration's SQLAlchemy error: a start whose migration meets a
    read-only or full database waits for it, as the recorder's batches do."""
    assert infrastructure_away(error)
    assert infrastructure_away(wrapped(error))


def test_a_statement_the_database_rejects_is_not_infrastructure_away() -> None:
    assert not infrastructure_away(wrapped(pg.UndefinedColumnError("column does not exist")))
    assert not infrastructure_away(wrapped(pg.UniqueViolationError("duplicate key value")))


def test_a_programming_error_is_not_infrastructure_away() -> None:
    assert not infrastructure_away(KeyError("scope"))
    assert not infrastructure_away(ValueError("invalid literal"))


@pytest.mark.integration
async def test_discovery_started_before_jetstream_is_there_waits_and_becomes_ready(
    tmp_path: Path,
) -> None:
    """A nats-server without JetStream answers, but no stream can be made (a cluster
    electing its leaders looks the same): the service waits, then starts."""
    nats_port = free_port("127.0.0.1")
    http_port = free_port("127.0.0.1")
    env = {
        **os.environ,
        "TROVE_NATS_URL": f"nats://127.0.0.1:{nats_port}",
        "TROVE_HTTP_PORT": str(http_port),
        "TROVE_LOG_FORMAT": "json",
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "discovery.log"
    service = Child("discovery", [sys.executable, "-m", "trove_discovery"], log_path=log, env=env)
    server: EmbeddedNats | None = None
    plain = Child(
        "nats-without-jetstream",
        [str(nats_server_binary()), "-a", "127.0.0.1", "-p", str(nats_port)],
        log_path=tmp_path / "plain-nats.log",
    )
    try:
        await eventually(
            lambda: _read(log),
            until=lambda text: "cannot start yet" in text,
            timeout=30,
            what="the service to say it waits",
        )
        assert service.alive(), service.tail()
        plain.stop()
        server = EmbeddedNats(NatsConfig(store_dir=tmp_path / "nats", port=nats_port)).start()

        async def answer() -> int:
            assert service.alive(), service.tail()
            return await readiness(http_port)

        await eventually(answer, until=lambda code: code == 200, timeout=60, what="ready")
    finally:
        plain.stop()
        service.stop()
        if server is not None:
            server.stop()
    assert service.proc.returncode == 0, service.tail()


async def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


async def test_a_service_runs_a_full_collection_every_interval() -> None:
    full: list[int] = []

    def counted(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    stop = asyncio.Event()
    gc.callbacks.append(counted)
    try:
        task = asyncio.create_task(collect_garbage(stop, interval=0.01))
        await eventually(
            lambda: _count(full), until=lambda n: n >= 3, timeout=10, what="collections"
        )
        stop.set()
        await asyncio.wait_for(task, timeout=5)
    finally:
        gc.callbacks.remove(counted)


async def _count(items: list[int]) -> int:
    return len(items)


async def test_a_part_that_fails_stops_the_others_before_its_error_ends_the_service() -> None:
    # A consumer whose durable was deleted: the others finish what they hold (a page
    # fetched is published, its host released) before the service ends.
    stop = asyncio.Event()
    finished: list[str] = []

    async def failing() -> None:
        raise TopologyError("consumer fetcher-deferred on TROVE_WORK is gone")

    async def draining() -> None:
        await stop.wait()
        finished.append("published")

    with pytest.raises(TopologyError, match="is gone"):
        await asyncio.wait_for(together(stop, failing(), draining()), timeout=5)
    assert stop.is_set()
    assert finished == ["published"]


@pytest.mark.parametrize("service", ["trove_discovery", "trove_fetcher", "trove_recorder"])
@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("TROVE_RECRAWL_MAX_SECONDS", "100", "TROVE_RECRAWL_AFTER_SECONDS"),
        ("TROVE_MIN_DOMAIN_DELAY_SECOND", "3", "did you mean TROVE_MIN_DOMAIN_DELAY_SECONDS?"),
    ],
    ids=["refused", "unknown"],
)
def test_a_service_given_a_setting_it_refuses_says_which_in_one_line_and_exits_2(
    service: str, variable: str, value: str, said: str
) -> None:
    """As a traceback, a crash-looping pod's log hid the reason in its last line."""
    env = {
        key: item
        for key, item in os.environ.items()
        if not key.startswith("TROVE_") or key == "TROVE_TEST_STACK"
    }
    env[variable] = value
    ended = subprocess.run(
        [sys.executable, "-m", service],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = ended.stderr.strip().splitlines()
    assert ended.returncode == 2, ended.stderr
    assert len(lines) == 1, ended.stderr
    assert service.removeprefix("trove_") in lines[0]
    assert said in lines[0]
