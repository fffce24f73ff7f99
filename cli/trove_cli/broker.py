"""The CLI's connection to nats-server: one try, and a clear error when it fails.

nats-py's defaults suit a service, which must ride out a broker restarting: sixty
tries, two seconds apart, each logged with a traceback. An operator's command against
a wrong address, a wrong password or a broker that is down would sit there two minutes
printing them. A command connects once, within ``CONNECT_TIMEOUT``, and says why not.
"""

from __future__ import annotations

import re

import nats
import nats.errors
from nats.aio.client import Client

from trove_schema.bus import nats_servers
from trove_schema.errors import TroveError
from trove_schema.nats_tls import client_tls

#: Seconds for the connection (TLS and the server's INFO included) to be made.
CONNECT_TIMEOUT = 5.0

_DATABASE_USERINFO = re.compile(r"//.*@", re.S)
#: A password given as a query parameter (libpq's ``password=``, ``sslpassword=``).
_QUERY_PASSWORD = re.compile(r"([?&](?:ssl)?password=)[^&#]*", re.IGNORECASE)


class BrokerUnreachable(TroveError):
    """nats-server could not be reached, or turned this client away."""


def shown(url: str) -> str:
    """``url`` as it may be printed: without its credentials.

    A database URL's userinfo runs to its last ``@`` whatever comes before (SQLAlchemy
    reads a password with a ``/``, a ``?`` or a ``#`` of a generated one raw): hidden
    so, a later ``@`` (in a query) hides more than it must, never less. A NATS URL is a
    list of servers, each with its scheme or without (nats-py adds ``nats://``), and
    each server's userinfo runs to its last ``@``, a ``/`` or a ``?`` of a password
    included."""
    if url[:8].lower() == "postgres":
        return _QUERY_PASSWORD.sub(r"\1***", _DATABASE_USERINFO.sub("//***@", url))
    return ",".join(_server_shown(server) for server in url.split(","))


def _server_shown(server: str) -> str:
    at = server.rfind("@")
    if at < 0:
        return server
    scheme = server.find("://")
    start = scheme + 3 if 0 <= scheme < at else len(server) - len(server.lstrip())
    return server[:start] + "***" + server[at:]


async def connect(nats_url: str) -> Client:
    """A connection for one command (no reconnects), or ``BrokerUnreachable``."""
    seen: list[Exception] = []

    async def quiet(exc: Exception) -> None:
        """Kept for the error's reason; the command says it once."""
        seen.append(exc)

    try:
        return await nats.connect(
            nats_servers(nats_url),
            name="trove-cli",
            tls=client_tls(),
            connect_timeout=CONNECT_TIMEOUT,
            allow_reconnect=False,
            # Each server of the URL tried twice, half a second apart. (0 would be no
            # limit: nats-py goes round its servers until one answers.)
            max_reconnect_attempts=1,
            reconnect_time_wait=0.5,
            error_cb=quiet,
        )
    except (TimeoutError, OSError, nats.errors.Error) as exc:
        cause = seen[-1] if seen else exc
        reason = str(cause) or type(cause).__name__
        raise BrokerUnreachable(f"cannot reach NATS at {shown(nats_url)}: {reason}") from None
