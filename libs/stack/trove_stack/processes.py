"""Child processes of the embedded stack: started in their own session, stopped for sure,
and told from other processes at the pids their files name."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trove_schema.errors import StackError
from trove_stack import lifeline

#: The end of a log its last lines are read from: a log of months is not read whole.
TAIL_BYTES = 64 * 1024


def pid_in(path: Path) -> int | None:
    """The pid a server's pid file names (its first word); None if there is none to read."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def runs_with(pid: int, argument: str) -> bool:
    """Whether process ``pid`` exists and ``argument`` is one of its command line's: a pid
    file outlives its server, and its pid may be any process's by the next start (a
    ``tail -f`` of the server's log, another stack's server)."""
    proc = Path("/proc")
    if proc.is_dir():
        try:
            argv = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return os.fsencode(argument) in argv
    # No /proc (macOS): ps says the command line, its arguments joined by spaces.
    try:
        found = subprocess.run(
            ["ps", "-p", str(pid), "-o", "command="], capture_output=True, check=False, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    command = found.stdout.decode(errors="replace").strip()
    return found.returncode == 0 and f" {argument} " in f" {command} "


def works_in(pid: int, folder: Path) -> bool:
    """Whether process ``pid``'s working folder is ``folder`` (Linux; elsewhere False)."""
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd")) == folder
    except OSError:
        return False


def write_private(path: Path, text: str) -> None:
    """Write ``path`` as a new file only this user may read, renamed over the old one: a
    file rewritten in place keeps its inode, and a handle opened on it while it was
    readable (or before its chmod) would read every later write."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # 0600
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def as_user(user: str | None) -> dict[str, Any]:
    """Popen arguments to run as ``user`` with that user's group only (not root's groups)."""
    if user is None:
        return {}
    return {"user": user, "group": user, "extra_groups": []}


class Child:
    """One server process with its log file; ``stop`` escalates from a polite signal to KILL."""

    __slots__ = ("log_path", "name", "proc", "stop_signal", "watched")

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: dict[str, str] | None = None,
        user: str | None = None,
        stop_signal: int = signal.SIGTERM,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self.stop_signal = stop_signal
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=cwd,
                **as_user(user),
                start_new_session=True,
            )
        # Stopped by the lifeline's watcher if this process dies without stopping it.
        self.watched = lifeline.current is not None
        if lifeline.current is not None:
            lifeline.current.watch(self.proc.pid, stop_signal)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        if self.proc.poll() is None:
            return True
        self._unwatched()  # its pid may be another process's one day
        return False

    def _unwatched(self) -> None:
        if self.watched and lifeline.current is not None:
            lifeline.current.forget(self.proc.pid)
        self.watched = False

    def wait_until(self, ready: Callable[[], bool], *, timeout: float, what: str) -> None:
        """Wait for ``ready()`` with a deadline; fail early, with the log, if the child dies."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            if not self.alive():
                raise StackError(f"{self.name} exited ({self.proc.returncode}): {self.tail()}")
            time.sleep(0.05)
        raise StackError(f"{self.name} was not {what} within {timeout:.0f}s: {self.tail()}")

    def ended(self) -> str | None:
        """How the process ended, with its log's last lines; None while it runs."""
        if self.alive():
            return None
        return f"code {self.proc.returncode}: {self.tail(5)}"

    def tail(self, lines: int = 20) -> str:
        """The log's last ``lines`` lines (of its last ``TAIL_BYTES``)."""
        try:
            with self.log_path.open("rb") as log:
                end = log.seek(0, os.SEEK_END)
                log.seek(max(end - TAIL_BYTES, 0))
                kept = log.read(TAIL_BYTES).splitlines()
        except OSError:
            return "(no log)"
        if end > TAIL_BYTES:
            kept = kept[1:]  # a line cut by the seek
        return "\n".join(line.decode(errors="replace") for line in kept[-lines:])

    def trim_log(self, limit: int) -> bool:
        """Once the log is past ``limit`` bytes, keep it as ``<log>.1`` (in place of the
        one kept before) and start it again, empty: whether it did. The process writes
        on: its log is open for appending, so its next line goes to the start, not past
        a hole. Copied, then truncated (logrotate's ``copytruncate``): a line written
        between the two is lost, which a process's own stdout cannot be asked to avoid."""
        try:
            if self.log_path.stat().st_size <= limit:
                return False
            shutil.copyfile(self.log_path, self.log_path.with_name(self.log_path.name + ".1"))
            os.truncate(self.log_path, 0)
        except OSError:
            return False
        return True

    def stop(self, timeout: float = 15.0) -> None:
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(self.stop_signal)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        self._unwatched()
