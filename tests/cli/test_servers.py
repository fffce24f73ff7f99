"""Which servers a command talks to: the TROVE_* URLs, or the stack `trove up` started."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from tests.conftest import StackUrls
from tests.ports import free_port
from tests.support import run_trove
from trove_cli.local import STACK_FILE, LocalTrove
from trove_cli.main import _urls
from trove_schema.settings import CommonSettings
from trove_stack import lifeline

LOCAL_NATS = "nats://127.0.0.1:4222"
LOCAL_DB = "postgresql+asyncpg://trove@127.0.0.1:5432/trove"
PROD_DB = "postgresql+asyncpg://trove@db.example.internal:5432/trove"


def settings(state: Path, nats_url: str = "", database_url: str = "") -> CommonSettings:
    (state / STACK_FILE).write_text(
        json.dumps({"TROVE_NATS_URL": LOCAL_NATS, "TROVE_DATABASE_URL": LOCAL_DB})
    )
    return CommonSettings.model_validate(
        {"state_dir": state, "nats_url": nats_url, "database_url": database_url}
    )


def test_a_running_stack_fills_in_only_what_belongs_with_the_urls_given(tmp_path: Path) -> None:
    assert _urls(settings(tmp_path)) == (LOCAL_NATS, LOCAL_DB)
    assert _urls(settings(tmp_path, database_url=LOCAL_DB)) == (LOCAL_NATS, LOCAL_DB)
    # A production database is never paired with this machine's event record (a
    # replay would fill it with the laptop's crawl): the broker must be named too.
    assert _urls(settings(tmp_path, database_url=PROD_DB)) == ("", PROD_DB)
    assert _urls(settings(tmp_path, nats_url="nats://nats.example:4222")) == (
        "nats://nats.example:4222",
        "",
    )


def test_the_stack_file_is_readable_by_its_user_alone(tmp_path: Path, stack: StackUrls) -> None:
    # It names the servers with their passwords; one left readable by others before
    # (an older release wrote it 0644) is made private too.
    # A new file, not the old one rewritten: a handle opened on it while it was
    # readable would read every later write.
    (tmp_path / STACK_FILE).write_text("{}")
    (tmp_path / STACK_FILE).chmod(0o644)
    before = (tmp_path / STACK_FILE).stat().st_ino
    with (
        (tmp_path / STACK_FILE).open() as opened_before,
        LocalTrove(
            state_dir=tmp_path,
            nats_url=stack.nats_url,
            database_url=stack.database_url,
            services=(),
        ),
    ):
        path = tmp_path / STACK_FILE
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert json.loads(path.read_text())["TROVE_NATS_URL"] == stack.nats_url
        assert path.stat().st_ino != before
        assert opened_before.read() == "{}"


@pytest.mark.parametrize(
    "given",
    [{"TROVE_DATABASE_URL": PROD_DB}, {"TROVE_NATS_URL": "nats://nats.example:4222"}],
    ids=["a database alone", "a broker alone"],
)
@pytest.mark.parametrize("command", [("up",), ("crawl", "https://a.example/")])
async def test_a_stack_of_this_machines_is_not_started_beside_one_server_given(
    tmp_path: Path, given: dict[str, str], command: tuple[str, ...]
) -> None:
    # Its empty event record would feed a production database projections, or its empty
    # database take a production broker's events: both are named, or neither.
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TROVE_")},
        "TROVE_STATE_DIR": str(tmp_path),
        **given,
    }

    code, out = await run_trove(*command, env=env)

    assert code == 2, out
    assert "a crawl's broker and database go together" in " ".join(out.split())
    assert not (tmp_path / "nats").exists()
    assert not (tmp_path / "postgres").exists()


@pytest.mark.parametrize("command", [("up",), ("crawl", "https://a.example/")])
async def test_no_service_of_this_machines_runs_on_servers_given_without_join(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    # The servers of a production cluster, reached through a port-forward to run
    # `trove seed|status|dead`: the services would reconcile its streams to this shell's
    # settings (TROVE_REPLICAS 1) and a sandbox's fetcher join its fetchers.
    closed = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TROVE_")},
        "TROVE_STATE_DIR": str(tmp_path),
        "TROVE_NATS_URL": f"nats://127.0.0.1:{closed}",
        "TROVE_DATABASE_URL": f"postgresql+asyncpg://trove@127.0.0.1:{closed}/trove",
    }

    code, out = await run_trove(*command, env=env)

    assert code == 2, out
    assert "Add --join if that stack is yours" in " ".join(out.split())

    # Said to be the operator's own, it is used: here, servers that do not answer.
    code, out = await run_trove(*command, "--join", env=env)

    assert code == 1, out
    assert "--join" not in out


async def test_a_replay_into_another_database_is_not_fed_this_machines_events(
    tmp_path: Path,
) -> None:
    settings(tmp_path)  # `trove up`'s stack.json, naming the local servers
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TROVE_")},
        "TROVE_STATE_DIR": str(tmp_path),
    }

    code, out = await run_trove("replay", "--database-url", PROD_DB, "--truncate", env=env)

    assert code == 2, out
    assert "set TROVE_NATS_URL" in " ".join(out.split())


def test_a_stack_refused_beside_a_running_one_leaves_that_ones_stack_file(
    tmp_path: Path,
) -> None:
    # The running stack's commands (`trove seed`, `trove status`) find it by this file.
    settings(tmp_path)
    closed = free_port()
    local = LocalTrove(
        state_dir=tmp_path,
        nats_url=f"nats://127.0.0.1:{closed}",
        database_url=f"postgresql+asyncpg://trove@127.0.0.1:{closed}/trove",
        services=(),
    )
    with pytest.raises(Exception, match=r"(?i)connect|refused"):
        local.start()

    assert json.loads((tmp_path / STACK_FILE).read_text())["TROVE_NATS_URL"] == LOCAL_NATS


def test_a_local_stack_leaves_the_lifeline_it_did_not_start(
    tmp_path: Path, stack: StackUrls
) -> None:
    # The process's lifeline (the tests' session stack's) watches servers it was told of
    # before: released by a stack that only borrowed it, they would be orphaned by a
    # kill of the process after.
    before = lifeline.current
    borrowed = lifeline.current = lifeline.Lifeline.start()
    try:
        with LocalTrove(
            state_dir=tmp_path,
            nats_url=stack.nats_url,
            database_url=stack.database_url,
            services=(),
        ):
            assert lifeline.current is borrowed
        assert lifeline.current is borrowed
        watcher = borrowed._proc
        assert watcher.poll() is None, "the watcher was let go"
    finally:
        borrowed.release()
        lifeline.current = before


def _without_trove_settings() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TROVE_")}


@pytest.mark.parametrize(
    "given",
    [("https://blog.example/",), ("--follow", "https://social.example"), ("--join",)],
    ids=["a real seed", "an instance", "a stack of yours"],
)
async def test_a_sandbox_crawl_crawls_nothing_but_the_sandbox(
    tmp_path: Path, given: tuple[str, ...]
) -> None:
    # Its fetcher runs at a 1 s gap with the sandbox's loopback addresses open: a real
    # site, an instance or a production frontier would be fetched that way too.
    env = {**_without_trove_settings(), "TROVE_STATE_DIR": str(tmp_path / "state")}
    if "--join" in given:
        # A production cluster's servers, through a port-forward (here: closed ports).
        closed = free_port()
        env["TROVE_NATS_URL"] = f"nats://127.0.0.1:{closed}"
        env["TROVE_DATABASE_URL"] = f"postgresql+asyncpg://trove@127.0.0.1:{closed}/trove"

    code, out = await run_trove(
        "crawl", "--sandbox", "--timeout", "1", *given, env=env, timeout=120
    )

    assert code == 2, out
    assert "--sandbox crawls the sandbox web alone" in " ".join(out.split())
    assert not (tmp_path / "state").exists()


async def test_a_sandbox_crawl_keeps_its_state_apart_from_a_real_crawls(tmp_path: Path) -> None:
    # `make run` (a fresh sandbox crawl) in a checkout where `trove up` has crawled for
    # months, in the default .trove: that crawl and its event record are left alone.
    kept = tmp_path / ".trove" / "nats" / "record"
    kept.parent.mkdir(parents=True)
    kept.write_text("months of crawling")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "trove_cli", "crawl", "--sandbox", "--fresh", "--timeout", "1",
        cwd=tmp_path, env=_without_trove_settings(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=180)
    printed = out.decode()

    assert proc.returncode == 1, printed  # stopped by its timeout, not idle
    assert "state in .trove-sandbox" in printed
    assert kept.read_text() == "months of crawling"
    assert sorted(p.name for p in (tmp_path / ".trove").iterdir()) == ["nats"]
    assert (tmp_path / ".trove-sandbox" / "postgres").is_dir()


@pytest.mark.parametrize("away", ["nats-server", "Postgres"])
async def test_a_replay_whose_server_is_away_says_so_in_a_line(
    tmp_path: Path, stack: StackUrls, away: str
) -> None:
    # A replay by cron in an outage: the broker's connect waited for ever, and the
    # database's refusal came as a traceback of 159 lines.
    closed = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TROVE_")},
        "TROVE_STATE_DIR": str(tmp_path),
        "TROVE_NATS_URL": f"nats://127.0.0.1:{closed}" if away == "nats-server" else stack.nats_url,
        "TROVE_DATABASE_URL": (
            f"postgresql+asyncpg://trove@127.0.0.1:{closed}/trove"
            if away == "Postgres"
            else stack.database_url
        ),
    }

    code, out = await run_trove("replay", "--since", "1h", env=env, timeout=60)

    assert code == 1, out
    assert "Traceback" not in out
    said = " ".join(out.split())
    if away == "nats-server":
        assert "no connection to NATS in 10 s. Nothing was applied" in said
    else:
        assert "a server is away: ConnectionRefusedError" in said
