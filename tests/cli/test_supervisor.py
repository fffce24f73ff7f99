"""The local supervisor: real service processes, killed for real, restarted with backoff."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from rich.console import Console
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.ports import free_ports
from tests.support import ready, run_trove, sandbox_env
from trove_cli.local import SERVICES, LocalTrove, http_ports
from trove_cli.main import restart_policy, watch_crawl
from trove_cli.status import Status, render_status
from trove_cli.supervisor import (
    ProcessState,
    Restart,
    RestartPolicy,
    Supervised,
    read_supervised,
)
from trove_sandbox.server import serve_sandbox
from trove_sandbox.web import SandboxWeb
from trove_schema.errors import StackError
from trove_schema.settings import CommonSettings

PROCESS = "discovery-0"


@asynccontextmanager
async def supervised(
    stack: StackUrls,
    state: Path,
    policy: RestartPolicy,
    env: Mapping[str, str] | None = None,
    *,
    only: tuple[str, ...] = ("discovery",),
    fetchers: int = 1,
) -> AsyncIterator[LocalTrove]:
    local = LocalTrove(
        state_dir=state,
        nats_url=stack.nats_url,
        database_url=stack.database_url,
        services=only,
        fetchers=fetchers,
        service_env=env or {},
        restart_policy=policy,
    )
    await asyncio.to_thread(local.start)
    try:
        yield local
    finally:
        await asyncio.to_thread(local.stop)


def kill(local: LocalTrove, process: str = PROCESS) -> int:
    (child,) = [c for c in local.children if c.name == process]
    os.killpg(child.pid, signal.SIGKILL)
    return child.pid


async def restarted(local: LocalTrove, times: int, process: str = PROCESS) -> ProcessState:
    async def state() -> ProcessState:
        return local.process_states()[process]

    return await eventually(
        state, until=lambda s: s.restarts >= times, timeout=30, interval=0.02, what="restarts"
    )


def test_the_delay_doubles_up_to_its_cap() -> None:
    policy = RestartPolicy(first_delay=0.5, factor=2.0, max_delay=3.0)
    assert [policy.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


def test_the_delay_stays_at_its_cap_after_thousands_of_exits_in_a_row() -> None:
    # A service that cannot start exits within a second: at 1,025 exits in a row the
    # power overflowed, and the supervisor stopped restarting it (and the ones after it).
    policy = RestartPolicy(first_delay=1.0, factor=2.0, max_delay=60.0)
    assert policy.delay(2000) == 60.0
    assert policy.delay(10**9) == 60.0


async def test_a_killed_service_is_restarted_and_trove_status_shows_it(
    stack: StackUrls, state_dir: Path
) -> None:
    policy = RestartPolicy(first_delay=0.2, reset_after=60.0, poll_interval=0.05)
    async with supervised(stack, state_dir, policy) as local:
        killed = kill(local)
        state = await restarted(local, 1)
        (child,) = local.children
        assert child.pid != killed
        assert child.alive()
        assert state.pid == child.pid
        assert state.last_exit_code == -signal.SIGKILL
        assert state.last_restart_at is not None
        ((restart),) = state.recent
        assert restart.delay == 0.2
        assert restart.started_at - restart.exited_at >= 0.2
        with pytest.raises(StackError, match="discovery-0 exited \\(signal SIGKILL\\)"):
            local.check_alive()  # running again, but it did die

        # What `trove up` left in the state folder is what `trove status` prints.
        on_disk = read_supervised(state_dir)
        assert on_disk is not None
        assert on_disk.supervisor_alive
        assert [(p.name, p.pid, p.restarts) for p in on_disk.processes] == [(PROCESS, child.pid, 1)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("TROVE_")}
        env |= {"TROVE_STATE_DIR": str(state_dir), "COLUMNS": "200"}
        code, printed = await run_trove("status", env=env)
        assert code == 0, printed
        row = next(line for line in printed.splitlines() if line.startswith(PROCESS))
        assert str(child.pid) in row
        assert "signal SIGKILL" in row
        assert row.replace("│", " ").split()[-1] == "1"
    assert read_supervised(state_dir) is None  # stopped: nothing supervised here any more


async def test_a_service_that_keeps_dying_backs_off_longer_each_time(
    stack: StackUrls, state_dir: Path
) -> None:
    # An unknown TROVE_* setting is refused at start: the service exits 2 every time.
    policy = RestartPolicy(first_delay=0.1, factor=2.0, max_delay=0.2, poll_interval=0.02)
    env = {"TROVE_NOT_A_SETTING": "1"}
    async with supervised(stack, state_dir, policy, env) as local:
        state = await restarted(local, 3)
    assert [r.delay for r in state.recent][:3] == [0.1, 0.2, 0.2]
    assert {r.exit_code for r in state.recent} == {2}
    for r in state.recent:
        assert r.started_at - r.exited_at >= r.delay
    assert "unknown Trove setting" in (state_dir / "logs" / f"{PROCESS}.log").read_text()
    supervisor_log = (state_dir / "logs" / "supervisor.log").read_text()
    assert f"{PROCESS} restarted as pid" in supervisor_log
    assert "ended with exit code 2" in supervisor_log


async def test_a_service_that_ran_fine_for_a_while_starts_its_backoff_over(
    stack: StackUrls, state_dir: Path
) -> None:
    policy = RestartPolicy(first_delay=0.2, factor=4.0, reset_after=2.0, poll_interval=0.02)
    async with supervised(stack, state_dir, policy) as local:
        kill(local)
        await restarted(local, 1)
        kill(local)  # at once: a second exit in a row waits longer
        state = await restarted(local, 2)
        assert [r.delay for r in state.recent] == [0.2, 0.8]

        async def current() -> ProcessState:
            return local.process_states()[PROCESS]

        # Let the third process run past reset_after before it is killed.
        await eventually(
            current,
            until=lambda s: time.time() - s.started_at >= policy.reset_after + 0.3,
            timeout=10,
            what="a good run",
        )
        kill(local)
        state = await restarted(local, 3)
    assert [r.delay for r in state.recent] == [0.2, 0.8, 0.2]


def test_status_lists_each_process_with_its_restarts_and_a_stale_file() -> None:
    up = ProcessState("fetcher-0", 4242, started_at=1000.0)
    down = ProcessState(
        "recorder-0",
        4343,
        started_at=900.0,
        restarts=3,
        last_exit_code=-9,
        last_exit_at=1190.0,
        last_restart_at=1100.0,
        restart_due_at=1208.0,
        recent=[Restart(exited_at=1090.0, started_at=1100.0, exit_code=1, delay=10.0)],
    )
    status = Status(now=1200.0, services=Supervised([up, down], False, 1190.0))
    out = io.StringIO()

    render_status(status, Console(file=out, width=160, color_system=None))

    printed = out.getvalue()
    assert "Service processes" in printed
    rows = {line.split()[0]: line for line in printed.splitlines() if "-0 " in line}
    assert rows["fetcher-0"].replace("│", " ").split() == [
        "fetcher-0",
        "4242",
        "up",
        "3m",
        "20s",
        "0",
    ]
    assert "down, restart in 8s" in rows["recorder-0"]
    assert "signal SIGKILL, 10s ago" in rows["recorder-0"]
    assert "no longer running" in printed


@pytest.mark.usefixtures("clean")
async def test_a_crawl_until_idle_goes_on_when_a_service_dies(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    web = SandboxWeb.generate(hosts=1, pages_per_host=5, base_ip="127.0.0.200")
    env = sandbox_env(web, gap=0.3, TROVE_ACK_WAIT_SECONDS="5", TROVE_REQUEST_TIMEOUT="3")
    policy = RestartPolicy(first_delay=0.2, poll_interval=0.05)
    async with (
        serve_sandbox(web) as running,
        supervised(stack, state_dir, policy, env, only=SERVICES) as local,
    ):
        crawl = asyncio.create_task(
            watch_crawl(
                nats_url=stack.nats_url,
                database_url=stack.database_url,
                seeds=running.seeds,
                until_idle=True,
                max_pages=None,
                timeout=120,
                local=local,
            )
        )

        # The site's own request log says when the fetcher is at work: kill it then.
        async def served() -> int:
            return len(running.witness.requests())

        await eventually(served, until=lambda n: n >= 2, timeout=60, interval=0.02)
        kill(local, "fetcher-0")
        at_kill = len(running.witness.requests())
        assert await asyncio.wait_for(crawl, timeout=150) == 0
        state = local.process_states()["fetcher-0"]
        fetched = len(running.witness.requests())
    outcomes = await count(engine, "page_crawls")
    assert at_kill < fetched, "the crawl was over before the kill: the test proves nothing"
    assert state.restarts == 1
    # Every page the crawl took in was attempted, once: a redelivered fetch keeps its id.
    async with engine.connect() as conn:
        queued, unattempted = (
            await conn.execute(
                text(
                    "SELECT count(*), count(*) FILTER (WHERE NOT EXISTS "
                    "(SELECT 1 FROM page_crawls c WHERE c.page_id = p.id)) "
                    "FROM pages p WHERE discovered_at IS NOT NULL"
                )
            )
        ).one()
    assert unattempted == 0
    assert outcomes == queued


async def count(engine: AsyncEngine, table: str) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text(f"SELECT count(*) FROM {table}"))).scalar_one())  # noqa: S608


def test_the_restart_policy_comes_from_trove_settings() -> None:
    settings = CommonSettings(
        restart_delay_seconds=0.5, restart_max_delay_seconds=8, restart_reset_after_seconds=10
    )
    policy = restart_policy(settings)
    assert (policy.first_delay, policy.max_delay, policy.reset_after) == (0.5, 8.0, 10.0)
    assert [policy.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]


async def test_each_service_process_serves_health_and_metrics_on_a_port_of_its_own(
    stack: StackUrls, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `TROVE_HTTP_PORT=8080 trove up --fetchers 2`, or compose's cli service (whose
    # environment sets it): every process bound the one port, and all but the first
    # exited at once, to be restarted for ever.
    first = free_ports(4)
    monkeypatch.setenv("TROVE_HTTP_PORT", str(first))
    policy = RestartPolicy(first_delay=0.2, poll_interval=0.05)
    async with supervised(stack, state_dir, policy, only=SERVICES, fetchers=2) as local:
        for port in range(first, first + 4):
            await ready(port)
        states = local.process_states()
    assert local.ports == {
        "recorder-0": first,
        "discovery-0": first + 1,
        "fetcher-0": first + 2,
        "fetcher-1": first + 3,
    }
    assert {name: state.restarts for name, state in states.items()} == dict.fromkeys(local.ports, 0)


async def test_only_the_recorder_is_given_the_database_and_loads_sqlalchemy(
    stack: StackUrls, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fetcher and discovery keep no database; SQLAlchemy, which checks its URL when
    # the settings are read, is 11 MiB a process. Set in the shell too, the URL is still
    # the recorder's alone.
    first = free_ports(3)
    monkeypatch.setenv("TROVE_HTTP_PORT", str(first))
    monkeypatch.setenv("TROVE_DATABASE_URL", stack.database_url)
    policy = RestartPolicy(first_delay=0.2, poll_interval=0.05)
    async with supervised(stack, state_dir, policy, only=SERVICES) as local:
        for port in range(first, first + 3):
            await ready(port)
        mapped = {
            child.name: Path(f"/proc/{child.pid}/maps").read_text() for child in local.children
        }
    # SQLAlchemy's compiled modules, mapped once it is imported.
    loaded = {name: "/sqlalchemy/" in maps for name, maps in mapped.items()}
    assert loaded == {"recorder-0": True, "discovery-0": False, "fetcher-0": False}


def test_a_port_range_past_the_last_port_is_refused_before_anything_starts() -> None:
    with pytest.raises(StackError, match="TROVE_HTTP_PORT=65534: the 3 service processes"):
        http_ports(["recorder-0", "discovery-0", "fetcher-0"], "65534")
    assert http_ports(["recorder-0", "fetcher-0"], "0") == {}
    assert http_ports(["recorder-0", "fetcher-0"], "") == {}
