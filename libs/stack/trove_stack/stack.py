"""The stack Trove runs on: NATS JetStream and Postgres, embedded or external.

With ``TROVE_NATS_URL`` / ``TROVE_DATABASE_URL`` set, those servers are used as they
are; otherwise Trove starts its own nats-server and Postgres with their data under one
state folder, and stops them when the stack closes.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from trove_schema.errors import StackError
from trove_stack.nats import PID_FILE, EmbeddedNats, NatsConfig
from trove_stack.postgres import EmbeddedPostgres, PostgresConfig

#: What a state folder holds: the servers' data, the services' logs, and ``trove up``'s
#: records of where its stack and processes are. ``fresh`` empties only a folder that
#: holds nothing else: ``TROVE_STATE_DIR`` set to ``.``, a home folder or a checkout
#: (an empty value reads as ``.``) would otherwise be deleted whole.
STATE_ENTRIES = frozenset({"nats", "postgres", "logs", "stack.json", "services.json"})


@dataclass(kw_only=True)
class Stack:
    """Where the servers are; ``embedded`` says which of them this process started."""

    state_dir: Path
    nats_url: str = ""
    database_url: str = ""
    fresh: bool = False
    fast_and_unsafe: bool = False
    postgres_bin: str | None = None
    nats: EmbeddedNats | None = field(default=None, init=False)
    postgres: EmbeddedPostgres | None = field(default=None, init=False)

    @property
    def embedded(self) -> list[str]:
        return [name for name, part in (("nats", self.nats), ("postgres", self.postgres)) if part]

    def start(self) -> Stack:
        # Servers change directory (Postgres into its data folder): paths must be absolute.
        self.state_dir = self.state_dir.resolve()
        if self.fresh and self.state_dir.exists():
            running = running_in(self.state_dir)
            if running is not None:
                raise StackError(
                    f"{running} runs on {self.state_dir}: stop that stack first (Ctrl-C in "
                    "its `trove up`), or give this one another TROVE_STATE_DIR"
                )
            held = self.state_dir.iterdir()
            foreign = sorted(p.name for p in held if p.name not in STATE_ENTRIES)
            if foreign:
                shown = ", ".join(foreign[:5]) + (" …" if len(foreign) > 5 else "")
                raise StackError(
                    f"{self.state_dir} holds more than Trove's state ({shown}): a fresh start "
                    "empties only a folder of Trove's own; set TROVE_STATE_DIR to one"
                )
            self.stop()
            for name in STATE_ENTRIES:
                path = self.state_dir / name
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            if not self.nats_url:
                self.nats = EmbeddedNats(NatsConfig(store_dir=self.state_dir / "nats")).start()
                self.nats_url = self.nats.url
            if not self.database_url:
                self.postgres = EmbeddedPostgres(
                    PostgresConfig(
                        data_dir=self.state_dir / "postgres" / "data",
                        fast_and_unsafe=self.fast_and_unsafe,
                        bin_dir=self.postgres_bin,
                    )
                ).start()
                self.database_url = self.postgres.url
        except BaseException:
            self.stop()
            raise
        return self

    def check_servers(self) -> None:
        """Raise ``StackError`` when a server this stack started has exited (the OOM
        killer, a full disk): the services would wait for it for ever, and nothing
        would say so."""
        for name, server in (("nats-server", self.nats), ("Postgres", self.postgres)):
            ended = None if server is None else server.exited()
            if ended is not None:
                raise StackError(f"{name} exited ({ended}): the stack is stopped")

    def stop(self) -> None:
        if self.postgres is not None:
            self.postgres.stop()
            self.postgres = None
        if self.nats is not None:
            self.nats.stop()
            self.nats = None

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def running_in(state_dir: Path) -> str | None:
    """The server of an embedded stack that still runs on ``state_dir``, if one does
    (another ``trove up``, or ``trove crawl``, in the same folder)."""
    for name, pid_file in (
        ("Postgres", state_dir / "postgres" / "data" / "postmaster.pid"),
        ("nats-server", state_dir / "nats" / PID_FILE),
    ):
        try:
            pid = int(pid_file.read_text().split()[0])
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue  # no file, or no such process: nothing runs there
        if name.lower().split("-")[0].encode() in command.lower():
            return f"{name} (pid {pid})"
    return None
