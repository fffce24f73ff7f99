"""Loopback ports for the tests' own servers: below the ephemeral range, one holder each.

A port the kernel picks (a bind to port 0) comes from the ephemeral range, which every
outgoing connection on the machine also takes its source port from. Between a test
releasing such a port and a child process binding it (nats-server, Postgres, a service's
health port, seconds later at times), another test's connection can take it, and the
child fails to start. Below the ephemeral range no connection takes a port on its own;
and each port handed out here is locked for as long as the test process lives (a lock
file), so no other worker, nor another test run on the machine, hands it out too.
Where the ephemeral range leaves too little room below it, ports come from above
``FLOOR`` anyway: the locks still keep the tests from each other.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

#: The lowest port handed out (above the well-known and most registered ones).
FLOOR = 10000
#: Ports between ``FLOOR`` and the ephemeral range below which the room is too small.
LEAST_ROOM = 2000
#: Where the lock files are, one a port.
LOCKS = Path(tempfile.gettempdir()) / "trove-test-ports"


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _candidates() -> range:
    low = _ephemeral_low()
    return range(FLOOR, low if low - FLOOR >= LEAST_ROOM else 61000)


_RANGE = _candidates()
#: Where the next look starts: at random, so that test runs begin apart.
_cursor = random.randrange(len(_RANGE))
#: The lock files held, open for the life of the process (their locks with them).
_held: list[int] = []


def _locks() -> Path:
    """The lock files' folder, which every user of the machine may add to (as /tmp)."""
    LOCKS.mkdir(exist_ok=True)
    if LOCKS.stat().st_mode & 0o1777 != 0o1777:
        with contextlib.suppress(OSError):  # another user's: theirs to open up
            LOCKS.chmod(0o1777)
    return LOCKS


def _take(port: int, host: str) -> bool:
    """Lock ``port`` for this process if nobody else holds it and it binds now."""
    try:
        # Read-only is enough to lock, and opens another user's lock file too.
        fd = os.open(_locks() / str(port), os.O_RDONLY | os.O_CREAT, 0o444)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with socket.socket() as sock:
            sock.bind((host, port))
    except OSError:  # locked by another holder, or in use, or closing (TIME_WAIT)
        os.close(fd)
        return False
    _held.append(fd)
    return True


def free_ports(count: int = 1, host: str = "127.0.0.1") -> int:
    """The first of ``count`` consecutive ports on ``host`` that nobody listens on or
    connects from now, and that no other test process hands out (bound, then released;
    locked until this process ends)."""
    global _cursor
    for _ in range(len(_RANGE)):
        first = _RANGE.start + _cursor
        _cursor = (_cursor + 1) % len(_RANGE)
        if first + count > _RANGE.stop:
            continue
        taken = 0
        while taken < count and _take(first + taken, host):
            taken += 1
        if taken == count:
            _cursor = (first + count - _RANGE.start) % len(_RANGE)
            return first
        # Those taken stay locked, unused: a few ports of thousands.
    raise OSError(f"no {count} free consecutive ports on {host} from {_RANGE.start}")


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` nobody listens on or connects from now, and no other test
    process hands out (bound, then released; locked until this process ends)."""
    return free_ports(1, host)
