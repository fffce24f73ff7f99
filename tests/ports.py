"""Loopback ports for the tests' own servers, from a range only this test worker uses.

A port the kernel picks (a bind to port 0) comes from the ephemeral range, which every
outgoing connection on the machine also takes its source port from. Between a test
releasing such a port and a child process binding it (nats-server, Postgres, a service's
health port, seconds later at times), another test's connection can take it, and the
child fails to start. Below the ephemeral range no connection takes a port on its own,
and each pytest-xdist worker hands out ports from a span of its own, so only this
worker's tests ever ask for them, one after another.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

#: Ports each worker hands out, in turn; a suite's worker uses a few hundred, and a port
#: it handed out before comes round again only after all the others.
SPAN = 1500
#: The lowest port handed out (above the well-known and registered ones most often used).
FLOOR = 10000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _worker() -> int:
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    number = name.removeprefix("gw")
    return int(number) if number.isdigit() else 0


def _span() -> range:
    top = max(_ephemeral_low(), FLOOR + SPAN)
    spans = max(1, (top - FLOOR) // SPAN)
    first = top - (_worker() % spans + 1) * SPAN
    return range(first, first + SPAN)


_RANGE = _span()
#: Where the next look for a free port starts, within ``_RANGE``.
_cursor = 0


def free_ports(count: int = 1, host: str = "127.0.0.1") -> int:
    """The first of ``count`` consecutive ports on ``host`` nobody listens on or connects
    from now (bound, then released); the next call looks past them."""
    global _cursor
    for _ in range(SPAN):
        first = _RANGE.start + _cursor
        _cursor = (_cursor + 1) % SPAN
        if first + count > _RANGE.stop:
            continue
        try:
            for port in range(first, first + count):
                with socket.socket() as sock:
                    sock.bind((host, port))
        except OSError:
            continue  # in use, or closing (TIME_WAIT): look further
        _cursor = (first + count - _RANGE.start) % SPAN
        return first
    raise OSError(f"no {count} free consecutive ports on {host} among this worker's {SPAN}")


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` nobody listens on or connects from now (bound, then released)."""
    return free_ports(1, host)
