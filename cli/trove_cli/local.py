"""Run Trove on one machine: the stack (embedded or external) and the three services.

Each service runs as its own process (``python -m trove_<service>``), exactly as in a
pod, with its settings passed through the environment, and is restarted with backoff
when it dies (``supervisor.Supervisor``), as a restart policy would in a pod.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from trove_cli.supervisor import (
    DEFAULT_RESTART_POLICY,
    ProcessState,
    RestartPolicy,
    Supervisor,
    describe_exit,
)
from trove_schema.errors import StackError
from trove_schema.migrate import upgrade
from trove_schema.settings import ALL_SETTINGS
from trove_stack import lifeline
from trove_stack.processes import Child, write_private
from trove_stack.stack import Stack

SERVICES = ("recorder", "discovery", "fetcher")
#: The services that keep a database. The others are not given its URL, as in k8s/ and
#: compose.yaml: checking it at start loads SQLAlchemy (11 MiB a process).
DATABASE_SERVICES = frozenset({"recorder"})
STACK_FILE = "stack.json"
MAX_PORT = 65535
#: Seconds a stopping service has before it is killed (its ``TROVE_STOP_GRACE_SECONDS``).
STOP_TIMEOUT = 20


@dataclass(kw_only=True)
class LocalTrove:
    """The stack plus service processes; a context manager that stops all of it."""

    state_dir: Path
    nats_url: str = ""
    database_url: str = ""
    fresh: bool = False
    fetchers: int = 1
    #: Which services to run, and how many processes of each (default: one, fetchers aside).
    services: tuple[str, ...] = SERVICES
    replicas: Mapping[str, int] = field(default_factory=dict)
    service_env: Mapping[str, str] = field(default_factory=dict)
    fast_and_unsafe: bool = False
    restart_policy: RestartPolicy = DEFAULT_RESTART_POLICY
    #: Told of every exit and restart of a service (they are logged in any case).
    notify: Callable[[str], None] | None = None
    stack: Stack = field(init=False)
    #: The running service processes; a restart replaces its predecessor in place, and
    #: a process taken out of this list is no longer restarted.
    children: list[Child] = field(default_factory=list, init=False)
    supervisor: Supervisor | None = field(default=None, init=False)
    #: Whether ``stack.json`` is this stack's, to be removed when it stops.
    wrote_stack_file: bool = field(default=False, init=False)
    #: Whether this stack started the process's lifeline, to be released when it stops.
    own_lifeline: bool = field(default=False, init=False)
    #: Each process's TROVE_HTTP_PORT, when one is set (``http_ports``).
    ports: dict[str, int] = field(default_factory=dict, init=False)
    #: A start or a stop at a time: signals that cut the process short while the stack
    #: starts or stops in a thread (``trove crawl``'s) have ``atexit`` stop it beside that
    #: thread, which stopped nothing yet started (its servers then ran on, unwatched) or
    #: the same children twice at once. Re-entrant: a start that fails stops.
    turn: threading.RLock = field(default_factory=threading.RLock, init=False)

    def start(self) -> LocalTrove:
        with self.turn:
            return self._start()

    def _start(self) -> LocalTrove:
        self.check_settings()
        self.ports = http_ports(
            self.process_names(), {**os.environ, **self.service_env}.get("TROVE_HTTP_PORT", "")
        )
        # Stopped on any exit of this process too, so no server or service is orphaned:
        # by ``stop`` at an exit Python sees, by the lifeline's watcher at one it does not
        # (SIGKILL, the OOM killer).
        atexit.register(self.stop)
        if lifeline.current is None:
            lifeline.current = lifeline.Lifeline.start()
            self.own_lifeline = True
        self.stack = Stack(
            state_dir=self.state_dir,
            nats_url=self.nats_url,
            database_url=self.database_url,
            fresh=self.fresh,
            fast_and_unsafe=self.fast_and_unsafe,
            postgres_bin=os.environ.get("TROVE_POSTGRES_BIN"),
        ).start()
        try:
            upgrade(self.stack.database_url)
            self._write_stack_file()
            for process in self.process_names():
                self.children.append(self._spawn(process))
            self.supervisor = Supervisor(
                self.children,
                self._spawn,
                state_dir=self.state_dir,
                policy=self.restart_policy,
                notify=self.notify,
            )
            self.supervisor.start()
        except BaseException:
            self.stop()
            raise
        return self

    def check_settings(self) -> None:
        """Every service's settings as its processes will read them (the operator's, and
        what this stack sets over them: the sandbox's), before a server starts; raises
        the ``ValidationError``. Read by the service alone, a value it refuses made it
        exit 2 at each restart, and a crawl waited on it until its timeout."""
        # Only the keys set over, put back one by one: the environment is never empty
        # for another thread of this process (the sandbox's servers) to read.
        saved = {key: os.environ.get(key) for key in self.service_env}
        try:
            os.environ.update(self.service_env)
            for settings in ALL_SETTINGS:
                settings()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def process_names(self) -> list[str]:
        """The service processes, in the order they start: ``recorder-0``, ``discovery-0``,
        ``fetcher-0`` ... (a service's count from ``replicas``, else one, fetchers aside)."""
        names = []
        for name in self.services:
            default = self.fetchers if name == "fetcher" else 1
            names += [f"{name}-{n}" for n in range(self.replicas.get(name, default))]
        return names

    @property
    def env(self) -> dict[str, str]:
        return {
            "TROVE_NATS_URL": self.stack.nats_url,
            "TROVE_DATABASE_URL": self.stack.database_url,
        }

    def _spawn(self, process: str) -> Child:
        """Start process ``<service>-<n>`` (again: its log is appended to)."""
        service = process.rpartition("-")[0]
        env = {**os.environ, **self.service_env, **self.env}
        if service not in DATABASE_SERVICES:
            env.pop("TROVE_DATABASE_URL", None)
        if process in self.ports:
            env["TROVE_HTTP_PORT"] = str(self.ports[process])
        env.setdefault("TROVE_LOG_FORMAT", "json")
        # What ``stop`` gives a child before it kills it.
        env.setdefault("TROVE_STOP_GRACE_SECONDS", str(STOP_TIMEOUT))
        env.setdefault("PYTHONUNBUFFERED", "1")
        logs = self.state_dir / "logs"
        return Child(
            process,
            [sys.executable, "-m", f"trove_{service}"],
            log_path=logs / f"{process}.log",
            env=env,
        )

    def process_states(self) -> dict[str, ProcessState]:
        """What the supervisor knows of each service process, by name (``fetcher-0``)."""
        return {} if self.supervisor is None else self.supervisor.states()

    def check_alive(self) -> None:
        """Raise if a service process has exited since the start, even if it was restarted."""
        states = self.process_states()
        for child in self.children:
            state = states.get(child.name)
            exited = None if state is None else state.last_exit_code
            if exited is not None or not child.alive():
                code = child.proc.returncode if exited is None else exited
                raise StackError(
                    f"service {child.name} exited ({describe_exit(code)}): {child.tail()}"
                )

    def _write_stack_file(self) -> None:
        # Only this user may read it: the servers' URLs carry their passwords.
        self.wrote_stack_file = True
        write_private(self.state_dir / STACK_FILE, json.dumps(self.env, indent=2))

    def stop(self) -> None:
        # Not to be cut short: a second Ctrl-C while the services finish their requests
        # would leave nats-server, Postgres and the rest running, with nothing to stop
        # them (they run in sessions of their own).
        with _signals_held(), self.turn:
            # First the watch, so that nothing stopped below is started again.
            if self.supervisor is not None:
                self.supervisor.stop()
                self.supervisor = None
            for child in reversed(self.children):
                child.stop(timeout=STOP_TIMEOUT)
            self.children.clear()
            if self.wrote_stack_file:
                # Only its own: a second `trove up` refused beside a running one (its
                # Postgres's lock, a --fresh) must not leave that one's commands blind.
                (self.state_dir / STACK_FILE).unlink(missing_ok=True)
                self.wrote_stack_file = False
            if hasattr(self, "stack"):
                self.stack.stop()
            # Only its own: one this process had before (the tests' session stack's)
            # still watches what it was told of.
            if self.own_lifeline and lifeline.current is not None:
                lifeline.current.release()
                lifeline.current = None
                self.own_lifeline = False
        atexit.unregister(self.stop)

    def __enter__(self) -> LocalTrove:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def http_ports(processes: list[str], base: str) -> dict[str, int]:
    """Each process's port for ``/healthz``, ``/readyz`` and ``/metrics`` when
    TROVE_HTTP_PORT is set: the port given and the ones after it, in start order. On one
    port the processes but the first would all exit at once, and be restarted for ever;
    a port each keeps what the setting asked for, every process's metrics."""
    try:
        first = int(base)
    except ValueError:
        return {}  # unset, or not a port: the services refuse it themselves
    if first <= 0:
        return {}  # off, or not a port
    if first + len(processes) - 1 > MAX_PORT:
        raise StackError(
            f"TROVE_HTTP_PORT={first}: the {len(processes)} service processes take a port "
            f"each from it on, past {MAX_PORT}; give a lower one"
        )
    return {process: first + n for n, process in enumerate(processes)}


def running_stack(state_dir: Path) -> dict[str, str]:
    """URLs of a stack started by ``trove up`` in this state folder, if any."""
    try:
        data = json.loads((state_dir / STACK_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str)}


def _held(signum: int, frame: object) -> None:
    """A signal while the stack stops: the stop goes on."""


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP without effect meanwhile (in the main thread, where
    they land). Handled by doing nothing, not ignored: an ignored signal stays ignored
    across ``exec``, and a service a start in another thread spawned meanwhile (while
    this stop waits for it) could not be stopped but by SIGKILL, 20 s later."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {signum: signal.signal(signum, _held) for signum in held}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
