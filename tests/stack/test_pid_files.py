"""A pid file outlives its server (a clean stop of nats-server, kill -9 or a power loss
for Postgres): after a restart of the machine its pid may be any process's, and the
stack starts unless that process is this folder's server."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from trove_stack.postgres import SYSTEM_USER
from trove_stack.processes import as_user
from trove_stack.stack import Stack, running_in


@contextmanager
def _process(*argv: str, user: str | None = None) -> Iterator[int]:
    """A live process that is no server of the stack."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **as_user(user)
    )
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(10)


def _stopped_stack(state: Path) -> None:
    Stack(state_dir=state, fast_and_unsafe=True).start().stop()


@pytest.mark.parametrize("left", ["a live process of ours", "nothing readable"])
def test_a_postmaster_pid_left_behind_does_not_keep_postgres_from_starting(
    tmp_path: Path, left: str
) -> None:
    state = tmp_path / "state"
    _stopped_stack(state)
    data = state / "postgres" / "data"
    assert not (data / "postmaster.pid").exists()
    sleep = shutil.which("sleep")
    assert sleep is not None
    # Postgres's user's: another user's process it takes for no lock holder.
    user = SYSTEM_USER if os.geteuid() == 0 else None
    with _process(sleep, "300", user=user) as pid:
        # The lock file a postmaster killed outright leaves, its pid reused by the
        # time the machine is back (a power loss, then a reboot).
        (data / "postmaster.pid").write_text(
            f"{pid}\n{data}\n1700000000\n5432\n{data}\n127.0.0.1\n  1  2\nready   \n"
            if left == "a live process of ours"
            else ""
        )
        assert running_in(state) is None
        again = Stack(state_dir=state, fast_and_unsafe=True).start()
        try:
            assert again.postgres is not None
            assert again.postgres.exited() is None
        finally:
            again.stop()


def test_a_process_that_only_names_a_server_in_its_command_line_is_not_taken_for_it(
    tmp_path: Path,
) -> None:
    # `tail -f` of the servers' logs holding the pids their files name: "nats" and
    # "postgres" on its command line, and no server of this folder.
    state = tmp_path / "state"
    _stopped_stack(state)
    pid_file = state / "nats" / "nats-server.pid"
    tail = shutil.which("tail")
    assert tail is not None
    logs = [str(state / "nats" / "nats-server.log"), str(state / "postgres" / "postgres.log")]
    with _process(tail, "-f", *logs) as pid:
        pid_file.write_text(str(pid))
        (state / "postgres" / "data" / "postmaster.pid").write_text(f"{pid}\n")
        assert running_in(state) is None
        again = Stack(state_dir=state, fast_and_unsafe=True).start()
        try:
            assert again.nats is not None
            assert again.postgres is not None
            assert again.nats.exited() is None
            assert again.postgres.exited() is None
        finally:
            again.stop()
        assert not pid_file.exists()  # a stopped nats-server's pid is not left to be reused


def test_the_servers_of_a_stack_whose_process_was_killed_are_still_named(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    first = Stack(state_dir=state, fast_and_unsafe=True).start()
    try:
        assert first.postgres is not None
        assert first.nats is not None
        first._let_go()  # its CLI killed outright: the lock gone, its servers not
        assert running_in(state) == f"Postgres (pid {first.postgres._child.pid})"  # type: ignore[union-attr]
        first.postgres.stop()
        first.postgres = None
        assert running_in(state) == f"nats-server (pid {first.nats.pid})"
    finally:
        first.stop()
    assert running_in(state) is None
