"""A watcher that stops the embedded stack when the process that started it dies unasked.

The servers and services run in sessions of their own (a Ctrl-C in the terminal is the
CLI's to handle, in order), so nothing ties them to the CLI: killed with SIGKILL, by the
OOM killer or a crash, it left nats-server, Postgres and the services running, the
fetchers still crawling, and the next ``make run`` refused the folder they held.

``Lifeline.start()`` runs ``python -m trove_stack.lifeline`` in a session of its own, its
standard input a pipe only this process writes. Each ``Child`` started meanwhile is
told to it (``watch``), and forgotten when it is stopped. The pipe closes when this
process ends, however it ends: after ``release()`` (a stop that stopped everything) the
watcher just exits; else it stops what it was told of, the newest first (the services
before the servers they use), each with its own polite signal, then KILL after a
grace.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import IO

#: How long each watched process is given to stop before it is killed.
GRACE_SECONDS = 20.0


class Lifeline:
    """This process's end of the pipe to its watcher."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc

    @classmethod
    def start(cls) -> Lifeline:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trove_stack.lifeline"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        return cls(proc)

    def _say(self, line: str) -> None:
        stdin = self._proc.stdin
        if stdin is None or stdin.closed:
            return
        with contextlib.suppress(OSError):  # the watcher gone: nothing to tell
            stdin.write(f"{line}\n".encode())
            stdin.flush()

    def watch(self, pid: int, stop_signal: int) -> None:
        self._say(f"watch {pid} {stop_signal}")

    def forget(self, pid: int) -> None:
        self._say(f"forget {pid}")

    def release(self) -> None:
        """Everything is stopped: the watcher exits without touching anything."""
        self._say("release")
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(5)


#: The lifeline of this process, if it started one: every ``Child`` is told to it.
current: Lifeline | None = None


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop(pid: int, stop_signal: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, stop_signal)
    deadline = time.monotonic() + GRACE_SECONDS
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def watch(lines: IO[bytes]) -> None:
    """The watcher: read what to watch until the pipe closes; stop it unless released."""
    watched: dict[int, int] = {}
    for raw in lines:
        words = raw.decode(errors="replace").split()
        if words == ["release"]:
            return
        if len(words) == 3 and words[0] == "watch":
            watched[int(words[1])] = int(words[2])
        elif len(words) == 2 and words[0] == "forget":
            watched.pop(int(words[1]), None)
    for pid, stop_signal in reversed(list(watched.items())):
        _stop(pid, stop_signal)


if __name__ == "__main__":
    # Neither the terminal's Ctrl-C nor its hangup is ours: the CLI handles those.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    watch(sys.stdin.buffer)
