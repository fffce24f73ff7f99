"""``--fresh`` (``make run``) empties the state folder, never under a stack that runs there."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import threading
from pathlib import Path

import pytest

from trove_schema.errors import StackError
from trove_stack.nats import EmbeddedNats, NatsConfig
from trove_stack.stack import Stack, left_behind_stopped, running_in


def test_a_fresh_stack_refuses_a_folder_whose_servers_run_and_empties_it_once_they_stop(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    first = Stack(state_dir=state, fast_and_unsafe=True).start()
    try:
        marker = state / "logs" / "kept.log"
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("the running stack's")
        with pytest.raises(
            StackError, match=rf"another Trove stack runs on .* \(pid {os.getpid()}\)"
        ):
            Stack(state_dir=state, fresh=True, fast_and_unsafe=True).start()
        assert marker.exists()  # nothing deleted under it
        # Its process killed outright: the folder's lock is gone, its servers are not.
        first._let_go()
        for fresh in (True, False):
            with pytest.raises(StackError, match=r"(Postgres|nats-server) \(pid \d+\) still runs"):
                Stack(
                    state_dir=state, fresh=fresh, fast_and_unsafe=True, left_behind_wait=1.0
                ).start()
        assert marker.exists()
        assert running_in(state) is not None
    finally:
        first.stop()
    assert running_in(state) is None
    second = Stack(state_dir=state, fresh=True, fast_and_unsafe=True).start()
    try:
        assert not marker.exists()  # a fresh folder
    finally:
        second.stop()


def test_a_start_waits_for_the_servers_a_killed_trove_left_to_be_stopped(
    tmp_path: Path,
) -> None:
    """A `make run` just after one killed outright (its lifeline's watcher stopping its
    servers, within seconds): it waits for them, rather than send its operator to kill
    servers that are stopping."""
    state = tmp_path / "state"
    first = Stack(state_dir=state, fast_and_unsafe=True).start()
    first._let_go()  # its process gone: the lock is, its servers are not
    stopping = threading.Timer(1.0, first.stop)  # as the watcher does, a moment later
    stopping.start()
    try:
        second = Stack(state_dir=state, fresh=True, fast_and_unsafe=True).start()
        try:
            assert second.nats is not None
            assert second.nats.exited() is None
        finally:
            second.stop()
    finally:
        stopping.join()
        first.stop()


async def test_a_start_beside_a_stack_that_runs_is_refused_at_once_not_made_to_wait(
    tmp_path: Path,
) -> None:
    """`trove crawl` on the folder of a `trove up` that runs: its servers are that
    stack's, not a killed one's to wait for (45 s, then "the trove that started it
    gone", both untrue); the start refuses at once, naming the stack's process."""
    state = tmp_path / "state"
    first = Stack(state_dir=state, fast_and_unsafe=True).start()
    try:
        said: list[str] = []
        await asyncio.wait_for(left_behind_stopped(state, say=said.append), timeout=5)
        assert said == []
        with pytest.raises(StackError, match="another Trove stack runs"):
            Stack(state_dir=state, fast_and_unsafe=True).start()
    finally:
        first.stop()


def test_a_start_is_not_refused_for_another_starts_look_at_the_folders_lock(
    tmp_path: Path,
) -> None:
    """A start that looks whether a live stack holds the folder takes the lock shared
    for a moment: one starting then must not take that look for a stack."""
    state = tmp_path / "state"
    state.mkdir()
    fd = os.open(state / "stack.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # the look, let go 30 ms on
    looking = threading.Timer(0.03, os.close, (fd,))
    looking.start()
    try:
        stack = Stack(state_dir=state, fast_and_unsafe=True).start()
        stack.stop()
    finally:
        looking.join()


def test_a_fresh_start_refuses_a_folder_that_holds_more_than_trove_state(tmp_path: Path) -> None:
    # TROVE_STATE_DIR set to a checkout, a home folder or "." (an empty value).
    folder = tmp_path / "checkout"
    (folder / "src").mkdir(parents=True)
    (folder / "README.md").write_text("someone's work")
    (folder / "logs").mkdir()
    with pytest.raises(StackError, match=r"holds more than Trove's state \(README\.md, src\)"):
        Stack(state_dir=folder, fresh=True, fast_and_unsafe=True).start()
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "logs", "src"]


def _running_with(argument: str) -> list[int]:
    """Pids of this machine's processes with ``argument`` on their command line."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if argument.encode() in argv:
            found.append(int(proc.name))
    return found


def test_a_server_whose_start_fails_is_not_left_running(tmp_path: Path) -> None:
    # A start given no time to get ready fails as one that outlasts its deadline does
    # (a store in recovery, Ctrl-C in `trove up`): the child it spawned is stopped.
    server = EmbeddedNats(NatsConfig(store_dir=tmp_path / "nats"))
    conf = str(tmp_path / "nats" / "nats-server.conf")
    try:
        with pytest.raises(StackError, match="was not listening"):
            server.start(timeout=0.0)
        assert _running_with(conf) == []
    finally:
        for pid in _running_with(conf):
            os.kill(pid, signal.SIGKILL)
