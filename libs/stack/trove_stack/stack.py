"""The stack Trove runs on: NATS JetStream and Postgres, embedded or external.

With ``TROVE_NATS_URL`` / ``TROVE_DATABASE_URL`` set, those servers are used as they
are; otherwise Trove starts its own nats-server and Postgres with their data under one
state folder, and stops them when the stack closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from trove_schema.errors import StackError
from trove_stack.nats import EmbeddedNats, NatsConfig, server_in
from trove_stack.postgres import EmbeddedPostgres, PostgresConfig, postmaster_in

#: What a state folder holds: the servers' data, the services' logs, and ``trove up``'s
#: records of where its stack and processes are. ``fresh`` empties only a folder that
#: holds nothing else: ``TROVE_STATE_DIR`` set to ``.``, a home folder or a checkout
#: (an empty value reads as ``.``) would otherwise be deleted whole.
STATE_ENTRIES = frozenset({"nats", "postgres", "logs", "stack.json", "services.json", "stack.lock"})
#: Held (``flock``) by the process whose stack runs on the folder, for as long as it
#: does: the kernel lets go when that process ends, however it ends.
LOCK_FILE = "stack.lock"
#: How long a start waits for the servers of a ``trove`` that was killed outright to be
#: stopped by its lifeline's watcher (``trove_stack.lifeline``: the services first, then
#: the servers, each asked politely and killed after its grace), and how often it looks.
LEFT_BEHIND_WAIT = 45.0
LEFT_BEHIND_POLL = 0.5
#: Tries at the folder's lock before it is taken as another stack's, and their gap.
LOCK_TRIES = 5
LOCK_TRY_GAP = 0.02


@dataclass(kw_only=True)
class Stack:
    """Where the servers are; ``embedded`` says which of them this process started."""

    state_dir: Path
    nats_url: str = ""
    database_url: str = ""
    fresh: bool = False
    fast_and_unsafe: bool = False
    #: Its nats-server serves Go's profiles (``NatsConfig.profile``): benchmarks only.
    profile_nats: bool = False
    postgres_bin: str | None = None
    #: Seconds to wait for servers a killed ``trove`` left on the folder to be stopped.
    left_behind_wait: float = LEFT_BEHIND_WAIT
    nats: EmbeddedNats | None = field(default=None, init=False)
    postgres: EmbeddedPostgres | None = field(default=None, init=False)
    _lock: int | None = field(default=None, init=False, repr=False)

    @property
    def embedded(self) -> list[str]:
        return [name for name, part in (("nats", self.nats), ("postgres", self.postgres)) if part]

    def start(self) -> Stack:
        # Servers change directory (Postgres into its data folder): paths must be absolute.
        self.state_dir = self.state_dir.resolve()
        if self.fresh and self.state_dir.exists():
            held = self.state_dir.iterdir()
            foreign = sorted(p.name for p in held if p.name not in STATE_ENTRIES)
            if foreign:
                shown = ", ".join(foreign[:5]) + (" …" if len(foreign) > 5 else "")
                raise StackError(
                    f"{self.state_dir} holds more than Trove's state ({shown}): a fresh start "
                    "empties only a folder of Trove's own; remove them, or set "
                    "TROVE_STATE_DIR to another folder"
                )
        # Only this user may look in: the folder holds the servers' passwords (stack.json,
        # the configurations) and the crawl. A folder that was there is left as it is.
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._hold_folder()
        try:
            # Servers of a stack whose process was killed outright, still running (its
            # lifeline's watcher stopping them, or they outlived it).
            running = running_in(self.state_dir)
            # Its lifeline's watcher stops them, each within its grace: a `make run` just
            # after a killed one waits for that rather than send its operator to kill.
            waited_until = time.monotonic() + self.left_behind_wait
            while running is not None and time.monotonic() < waited_until:
                time.sleep(LEFT_BEHIND_POLL)
                running = running_in(self.state_dir)
            if running is not None:
                raise left_behind(running, self.state_dir, self.left_behind_wait)
            if self.fresh:
                self._stop_servers()
                for name in STATE_ENTRIES - {LOCK_FILE}:
                    path = self.state_dir / name
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path)
                    else:
                        path.unlink(missing_ok=True)
        except BaseException:
            self._let_go()
            raise
        try:
            # Each server asks for a password: another user of the machine reaches
            # 127.0.0.1 too (and Postgres's superuser runs programs). Only this user
            # may read them, in the state folder and in stack.json.
            if not self.nats_url:
                self.nats = EmbeddedNats(
                    NatsConfig(
                        store_dir=self.state_dir / "nats",
                        password=_secret(),
                        profile=self.profile_nats,
                    )
                ).start()
                self.nats_url = self.nats.url
            if not self.database_url:
                (self.state_dir / "postgres").mkdir(mode=0o700, exist_ok=True)
                (self.state_dir / "postgres").chmod(0o700)  # Trove's own: its password
                self.postgres = EmbeddedPostgres(
                    PostgresConfig(
                        data_dir=self.state_dir / "postgres" / "data",
                        fast_and_unsafe=self.fast_and_unsafe,
                        bin_dir=self.postgres_bin,
                        password=_kept_secret(self.state_dir / "postgres" / "password"),
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

    def _hold_folder(self) -> None:
        """Take the folder's lock, or say which process holds it: two stacks on one
        folder would share (or, fresh, delete) each other's data."""
        fd = os.open(self.state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            # A few tries: another start's look (``_held``) holds it for a moment.
            for _ in range(LOCK_TRIES - 1):
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    time.sleep(LOCK_TRY_GAP)
            else:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise StackError(
                f"another Trove stack runs on {self.state_dir} (pid {holder}): stop it first "
                "(Ctrl-C in its `trove up` or `trove crawl`), or give this one another "
                "TROVE_STATE_DIR"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock = fd

    def _let_go(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # the flock goes with the descriptor
            self._lock = None

    def _stop_servers(self) -> None:
        if self.postgres is not None:
            self.postgres.stop()
            self.postgres = None
        if self.nats is not None:
            self.nats.stop()
            self.nats = None

    def stop(self) -> None:
        self._stop_servers()
        self._let_go()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _secret() -> str:
    return secrets.token_urlsafe(24)


def _kept_secret(path: Path) -> str:
    """The password in ``path``, or a new one written there (0600): Postgres's is set
    when its data folder is made, and asked for at every start after."""
    with contextlib.suppress(FileNotFoundError):
        kept = path.read_text().strip()
        if kept:
            return kept
    path.parent.mkdir(parents=True, exist_ok=True)
    made = _secret()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(made + "\n")
        # On disk before the cluster it is given to: a power loss right after initdb
        # (which syncs its cluster) would else leave the file empty, a new password
        # made at the next start, and the cluster refusing it at every start after.
        file.flush()
        os.fsync(file.fileno())
    return made


def left_behind(running: str, state_dir: Path, waited: float) -> StackError:
    """The refusal of a folder whose servers still run, ``waited`` seconds on."""
    return StackError(
        f"{running} still runs on {state_dir}, the `trove` that started it gone "
        f"({waited:.0f} s waited for it to stop): stop it, or give this stack another "
        "TROVE_STATE_DIR"
    )


async def left_behind_stopped(
    state_dir: Path, say: Callable[[str], object], wait: float = LEFT_BEHIND_WAIT
) -> None:
    """Wait for the servers a ``trove`` killed outright left on ``state_dir`` to be
    stopped by its lifeline's watcher, saying so, or raise ``left_behind``. On the event
    loop, before the stack's start in a thread: Ctrl-C ends the wait there, where a
    thread's would hold the command until it ran out."""
    running = running_in(state_dir)
    if running is None or _held(state_dir):
        return  # a stack that runs there: the start says so, at once
    say(f"waiting for {running}, left by a `trove` that was killed, to stop ...")
    waited_until = time.monotonic() + wait
    while running is not None and time.monotonic() < waited_until:
        await asyncio.sleep(LEFT_BEHIND_POLL)
        running = running_in(state_dir)
    if running is not None:
        raise left_behind(running, state_dir, wait)


def _held(state_dir: Path) -> bool:
    """Whether a live process holds ``state_dir``'s lock (``Stack._hold_folder``)."""
    try:
        fd = os.open(state_dir / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # and its lock, if it took one
    return False


def running_in(state_dir: Path) -> str | None:
    """The server of an embedded stack that still runs on ``state_dir``, if one does
    (another ``trove up``, or ``trove crawl``, in the same folder)."""
    state_dir = state_dir.resolve()
    for name, pid in (
        # Resolved as the start resolves it: a data folder linked elsewhere is named
        # by its real path on the postmaster's command line and as its working folder.
        ("Postgres", postmaster_in((state_dir / "postgres" / "data").resolve())),
        ("nats-server", server_in(state_dir / "nats")),
    ):
        if pid is not None:
            return f"{name} (pid {pid})"
    return None
