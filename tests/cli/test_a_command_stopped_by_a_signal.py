"""SIGTERM and SIGHUP stop a command as Ctrl-C does: its task is cancelled, and each
part stops in turn. Raised wherever it landed, the signal's ``KeyboardInterrupt`` could
end a client's own task (nats-py's reader, say) whose work the stopping then waited for:
`trove crawl` stopped its stack and hung."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from trove_cli import local as local_module
from trove_cli.local import LocalTrove

# A command whose client has a task of its own, busy nearly all the time (a signal lands
# there), which its closing needs: as nats-py's close needs its reader and flusher.
COMMAND = """
import asyncio, signal, sys, time
from trove_cli.main import _stops, take_signals

async def command() -> int:
    stop, closed = asyncio.Event(), asyncio.Event()

    async def client() -> None:
        while not stop.is_set():
            began = time.monotonic()
            while time.monotonic() - began < 0.01:
                pass
            await asyncio.sleep(0)
        closed.set()

    running = asyncio.create_task(client())
    print("ready", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        stop.set()
        await closed.wait()
        await running
        print("closed", flush=True)
    return 0

take_signals()
sys.exit(asyncio.run(_stops.run(command())))
"""


async def python(script: str) -> asyncio.subprocess.Process:
    roots = [str(Path(__file__).resolve().parents[2] / "cli"), os.environ.get("PYTHONPATH", "")]
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, roots))},
    )


async def printed_once_stopped(proc: asyncio.subprocess.Process, stop: Callable[[], None]) -> bytes:
    """What ``proc`` printed after its "ready" line, once ``stop()`` ended it; killed if it
    did not end."""
    assert proc.stdout is not None
    try:
        while (line := await asyncio.wait_for(proc.stdout.readline(), timeout=30)) != b"ready\n":
            assert line, "it never got ready"
        stop()
        printed, _ = await asyncio.wait_for(proc.communicate(), timeout=30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return printed


# The recorder's replay, as `trove replay` runs it (``python -m trove_recorder replay``):
# a real process that takes its stop as a SIGINT and then cleans up, as the replay
# releases the retries it holds and its lock, for longer than a moment.
REPLAY = """
import signal, sys, time
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
print("ready", flush=True)
got = signal.sigwait({signal.SIGINT, signal.SIGTERM})
cleanup = time.monotonic() + 1.0
while time.monotonic() < cleanup:
    pass
again = signal.sigpending()
print(f"stopped by {signal.Signals(got).name}, again: {sorted(s.name for s in again)}", flush=True)
sys.exit(130)
"""


@pytest.mark.parametrize(
    ("signum", "group"),
    [(signal.SIGINT, True), (signal.SIGTERM, False), (signal.SIGHUP, False)],
    ids=["Ctrl-C", "SIGTERM", "SIGHUP"],
)
async def test_a_replay_stopped_by_a_signal_is_let_finish_its_cleanup(
    tmp_path: Path, signum: int, group: bool
) -> None:
    recorder = tmp_path / "trove_recorder"
    recorder.mkdir()
    (recorder / "__init__.py").write_text("")
    (recorder / "__main__.py").write_text(REPLAY)
    roots = [str(tmp_path), str(Path(__file__).resolve().parents[2] / "cli")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([*roots, os.environ.get("PYTHONPATH", "")]),
        "TROVE_NATS_URL": "nats://127.0.0.1:1",
        "TROVE_DATABASE_URL": "postgresql+asyncpg://trove@127.0.0.1:1/trove",
        "TROVE_STATE_DIR": str(tmp_path / "state"),
    }
    # In a session of its own, as a terminal runs a command: Ctrl-C is sent to the group.
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "trove_cli", "replay", "--since", "1h",
        stdout=asyncio.subprocess.PIPE, env=env, start_new_session=True,
    )  # fmt: skip
    printed = await printed_once_stopped(
        proc, (lambda: os.killpg(proc.pid, signum)) if group else (lambda: proc.send_signal(signum))
    )
    # Stopped once, by the one signal it takes, and let finish.
    assert "stopped by SIGINT, again: []" in printed.decode().splitlines()
    assert proc.returncode == 130


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
async def test_a_command_stopped_by_a_signal_lets_its_clients_close(signum: int) -> None:
    proc = await python(COMMAND)
    printed = await printed_once_stopped(proc, lambda: proc.send_signal(signum))
    assert printed == b"closed\n"
    assert proc.returncode == 130


async def test_a_hangup_the_command_was_started_ignoring_stays_ignored() -> None:
    # `nohup trove up &` over SSH, then the session ends: the stack goes on.
    script = (
        "import signal\n"
        "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        "from trove_cli.main import _stops, take_signals\n"
        "take_signals()\n"
        "print(signal.getsignal(signal.SIGHUP) is signal.SIG_IGN,"
        " signal.getsignal(signal.SIGTERM) is _stops)\n"
    )
    proc = await python(script)
    printed, _ = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert printed == b"True True\n"


class SlowToStop:
    """A service process that takes a moment to stop, counting who stops it at once."""

    name = "slow"

    def __init__(self) -> None:
        self.stopping = 0
        self.most = 0
        self.stops = 0

    def stop(self, timeout: float) -> None:
        self.stopping += 1
        self.most = max(self.most, self.stopping)
        time.sleep(0.2)  # the pause a stopping service plays
        self.stops += 1
        self.stopping -= 1


def test_two_stops_of_a_stack_at_once_stop_it_once(tmp_path: Path) -> None:
    # Signals that cut the process short while `trove crawl` stops its stack in a thread:
    # atexit's stop runs beside it.
    local = LocalTrove(state_dir=tmp_path)
    service = SlowToStop()
    local.children.append(service)  # type: ignore[arg-type]
    both = threading.Barrier(2)

    def stop() -> None:
        both.wait(timeout=10)
        local.stop()

    other = threading.Thread(target=stop)
    other.start()
    stop()
    other.join(timeout=10)
    assert (service.stops, service.most) == (1, 1)


def test_a_stack_stopped_while_it_starts_is_stopped_once_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Signals while `trove crawl` starts its stack in a thread: the stop atexit runs
    # stopped nothing, the stack not made yet, and its servers ran on, unwatched.
    starting, started = threading.Event(), threading.Event()
    stops: list[str] = []

    class SlowToStart:
        """A stack that takes a while to start (its servers coming up)."""

        def __init__(self, **settings: object) -> None:
            self.nats_url, self.database_url = "nats://127.0.0.1:1", "postgresql://127.0.0.1:1/x"

        def start(self) -> SlowToStart:
            starting.set()
            assert started.wait(timeout=10)
            return self

        def stop(self) -> None:
            stops.append("stack")

    monkeypatch.setattr(local_module, "Stack", SlowToStart)
    monkeypatch.setattr(local_module, "upgrade", lambda url: None)
    local = LocalTrove(state_dir=tmp_path, services=())
    starting_thread = threading.Thread(target=local.start)
    starting_thread.start()
    assert starting.wait(timeout=10)
    stopping = threading.Thread(target=local.stop)
    stopping.start()
    started.set()
    starting_thread.join(timeout=10)
    stopping.join(timeout=10)
    assert stops == ["stack"]


def test_a_process_started_while_a_stop_holds_the_signals_hears_them() -> None:
    # atexit's stop waits, signals held, for a start in another thread, which spawns the
    # services meanwhile: each must still stop on the SIGTERM that stop sends it.
    with local_module._signals_held():
        child = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
        )
    try:
        status = Path(f"/proc/{child.pid}/status").read_text()
        ignored = int(
            next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16
        )
        for signum in (signal.SIGTERM, signal.SIGHUP):
            assert not ignored & (1 << (signum - 1)), signal.Signals(signum).name
    finally:
        child.kill()
        child.wait(timeout=10)
