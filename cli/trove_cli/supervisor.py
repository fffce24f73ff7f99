"""Keep the local service processes running: restart the ones that die, with backoff.

What a restart policy does under compose or Kubernetes, for ``trove up`` and
``trove crawl``: a service that exits (a crash, an OOM kill, a ``kill -9``) is started
again after a delay that doubles with each exit in a row, up to a cap, so a service that
cannot start (a bad setting, a database that is gone) does not loop hot. A process that
ran fine for ``reset_after`` seconds before it died starts the series again from the
first delay.

The supervisor writes what it knows of each process (pid, restarts, the last exit and
when, the recent restarts with their delays) to ``services.json`` in the state folder,
beside ``stack.json``: ``trove status`` reads it from there. Every exit and restart is
also a line in ``logs/supervisor.log`` and, when given, a call of ``notify``.

It also keeps each process's log within ``LOG_LIMIT``: past it, the log is kept as
``<process>.log.1`` and started again (``Child.trim_log``), so a local stack left
running for months holds two logs' worth a process, not all it ever said.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import threading
import time
from collections.abc import Callable, MutableSequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trove_stack.lifeline import pid_alive
from trove_stack.processes import Child

SERVICES_FILE = "services.json"
#: Restarts kept per process in ``services.json`` (the log has them all).
HISTORY = 10
#: Bytes of a process's log past which it is kept aside and started again.
LOG_LIMIT = 64 * 1024 * 1024
#: Seconds between looks at the logs' sizes.
LOG_CHECK_INTERVAL = 10.0
#: Doublings of the delay, at most: the cap is reached long before, and past 1,024 exits
#: in a row (a service that cannot start, for a day) the power would overflow the float.
MAX_DOUBLINGS = 32


@dataclass(frozen=True, kw_only=True, slots=True)
class RestartPolicy:
    """Exponential backoff between restarts: ``first_delay * factor**n``, up to ``max_delay``."""

    first_delay: float = 1.0
    factor: float = 2.0
    max_delay: float = 60.0
    #: A process that ran this long before it died was fine: its next delay is the first.
    reset_after: float = 30.0
    #: How often the processes are looked at.
    poll_interval: float = 0.2

    def delay(self, failures: int) -> float:
        """The wait before the restart that follows the ``failures``-th exit in a row."""
        doublings = min(max(failures - 1, 0), MAX_DOUBLINGS)
        return min(self.first_delay * self.factor**doublings, self.max_delay)


DEFAULT_RESTART_POLICY = RestartPolicy()


@dataclass(frozen=True, slots=True)
class Restart:
    #: Unix time of the exit, and of the new start.
    exited_at: float
    started_at: float
    #: The exit: a code, or minus the signal number (as ``Popen.returncode``).
    exit_code: int
    delay: float


@dataclass(slots=True)
class ProcessState:
    """What the supervisor knows of one service process (``services.json`` holds a list)."""

    name: str
    pid: int
    started_at: float
    restarts: int = 0
    last_exit_code: int | None = None
    last_exit_at: float | None = None
    last_restart_at: float | None = None
    #: While the process is down: when it will be started again, after what backoff.
    restart_due_at: float | None = None
    restart_delay: float | None = None
    recent: list[Restart] = field(default_factory=list)
    #: Exits in a row without a good run in between (drives the backoff).
    failures: int = 0

    @property
    def running(self) -> bool:
        return self.restart_due_at is None

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ProcessState:
        values = dict(raw)
        recent = values.pop("recent", [])
        state = cls(**values)
        state.recent = [Restart(**r) for r in recent]
        return state


def describe_exit(code: int | None) -> str:
    """``exit code 1``, ``signal SIGKILL``: a ``Popen.returncode`` for a person."""
    if code is None:
        return "running"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class Supervisor:
    """Watches ``children`` from a thread and replaces each one that exits.

    ``children`` is the caller's list: a dead child is replaced in place by its
    successor, and one the caller removes from the list is no longer watched.
    """

    def __init__(
        self,
        children: MutableSequence[Child],
        spawn: Callable[[str], Child],
        *,
        state_dir: Path,
        policy: RestartPolicy = DEFAULT_RESTART_POLICY,
        notify: Callable[[str], None] | None = None,
        log_limit: int = LOG_LIMIT,
        log_check_interval: float = LOG_CHECK_INTERVAL,
    ) -> None:
        self._children = children
        self._spawn = spawn
        self._policy = policy
        self._notify = notify
        self._log_limit = log_limit
        self._log_check_interval = log_check_interval
        self._logs_checked = time.monotonic()
        self._path = state_dir / SERVICES_FILE
        self._log_path = state_dir / "logs" / "supervisor.log"
        self._states: dict[str, ProcessState] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        # Monotonic start and restart time of each process: the backoff must not follow
        # the wall clock's jumps (the wall clock is for people, in services.json).
        self._began: dict[str, float] = {}
        self._due: dict[str, float] = {}

    def start(self) -> None:
        now = time.time()
        with self._lock:
            for child in self._children:
                self._states[child.name] = ProcessState(child.name, child.pid, started_at=now)
                self._began[child.name] = time.monotonic()
            self._write()
        self._thread = threading.Thread(target=self._run, name="trove-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (the children are left running, for the caller to stop)."""
        self._stopping.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        self._path.unlink(missing_ok=True)

    def states(self) -> dict[str, ProcessState]:
        with self._lock:
            return copy.deepcopy(self._states)

    def _run(self) -> None:
        while not self._stopping.wait(self._policy.poll_interval):
            with self._lock:
                if self._stopping.is_set():
                    return
                try:
                    self.check()
                except Exception as exc:  # the watch must outlive any one surprise
                    self._say(f"supervisor: {type(exc).__name__}: {exc}")

    def check(self) -> None:
        """One look at every child (called by the thread, under the lock)."""
        children = list(self._children)
        # A process taken out of the list is the caller's now: forget it.
        gone = self._states.keys() - {child.name for child in children}
        for name in gone:
            del self._states[name]
        changed = bool(gone)
        for child in children:
            state = self._states.get(child.name)
            if state is None or child.alive():
                continue
            if state.restart_due_at is None:
                self._exited(child, state)
                changed = True
            elif time.monotonic() >= self._due.get(child.name, 0.0):
                self._restart(child, state)
                changed = True
        if changed:
            self._write()
        if time.monotonic() - self._logs_checked >= self._log_check_interval:
            self._logs_checked = time.monotonic()
            for child in children:
                # Not one that ended: its last lines are what its exit is told with.
                if child.alive() and child.trim_log(self._log_limit):
                    self._say(
                        f"{child.name}'s log passed {self._log_limit:,} bytes: "
                        f"kept as {child.log_path.name}.1, and started again"
                    )

    def _exited(self, child: Child, state: ProcessState) -> None:
        ran = time.monotonic() - self._began.get(child.name, time.monotonic())
        if ran >= self._policy.reset_after:
            state.failures = 0
        state.failures += 1
        delay = self._policy.delay(state.failures)
        now = time.time()
        state.last_exit_code = child.proc.returncode
        state.last_exit_at = now
        state.restart_due_at = now + delay
        state.restart_delay = delay
        self._due[child.name] = time.monotonic() + delay
        self._say(
            f"{child.name} (pid {child.pid}) ended with {describe_exit(child.proc.returncode)} "
            f"after {ran:.1f}s; restarting in {delay:.1f}s (log: {child.log_path})"
        )

    def _restart(self, child: Child, state: ProcessState) -> None:
        try:
            successor = self._spawn(child.name)
        except OSError as exc:
            state.failures += 1
            retry = self._policy.delay(state.failures)
            state.restart_due_at = time.time() + retry
            state.restart_delay = retry
            self._due[child.name] = time.monotonic() + retry
            self._say(f"{child.name} could not be started ({exc}); next try in {retry:.1f}s")
            return
        try:
            self._children[self._children.index(child)] = successor
        except ValueError:
            # Taken out of the list meanwhile: no longer ours to run.
            successor.stop(timeout=5)
            del self._states[child.name]
            return
        now = time.time()
        self._began[child.name] = time.monotonic()
        state.pid = successor.pid
        state.started_at = now
        state.restarts += 1
        state.last_restart_at = now
        restart = Restart(
            exited_at=state.last_exit_at or now,
            started_at=now,
            exit_code=state.last_exit_code or 0,
            delay=state.restart_delay or 0.0,
        )
        state.recent = [*state.recent, restart][-HISTORY:]
        state.restart_due_at = state.restart_delay = None
        self._say(f"{child.name} restarted as pid {successor.pid} (restart {state.restarts})")

    def _say(self, message: str) -> None:
        stamp = datetime.now(UTC).isoformat(timespec="milliseconds")
        with contextlib.suppress(OSError):
            self._log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self._log_path, "a", encoding="utf-8") as log:
                log.write(f"{stamp} {message}\n")
        if self._notify is not None:
            self._notify(message)

    def _write(self) -> None:
        body = {
            "supervisor_pid": os.getpid(),
            "updated_at": time.time(),
            "processes": [asdict(state) for state in self._states.values()],
        }
        # Written whole and renamed, so `trove status` never reads half a file; the copy
        # in the logs' folder, so that one left by a crash is not a stranger in the
        # state folder (`--fresh` empties only a folder of Trove's own).
        tmp = self._log_path.parent / f".{SERVICES_FILE}.{os.getpid()}"
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(body, indent=2))
            os.replace(tmp, self._path)


@dataclass(frozen=True, slots=True)
class Supervised:
    """``services.json`` as ``trove status`` reads it."""

    processes: list[ProcessState]
    #: False when the file was left by a supervisor that is gone (killed without cleanup).
    supervisor_alive: bool
    updated_at: float


def read_supervised(state_dir: Path) -> Supervised | None:
    """The processes a ``trove up`` in this state folder supervises; None when there is none."""
    try:
        raw = json.loads((state_dir / SERVICES_FILE).read_text())
        processes = [ProcessState.from_json(p) for p in raw["processes"]]
        pid = int(raw["supervisor_pid"])
        updated_at = float(raw["updated_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Supervised(processes, pid_alive(pid), updated_at)
