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

#: A URL's userinfo (``user:password@``, a token, ``:password@``): to the last ``@``
#: before the path, where the URL's host begins.
_USERINFO = re.compile(r"//[^/?#]*@")
_DATABASE_USERINFO = re.compile(r"//.*@", re.S)
#: A password given as a query parameter (libpq's ``password=``, ``sslpassword=``).
_QUERY_PASSWORD = re.compile(r"([?&](?:ssl)?password=)[^&#]*", re.IGNORECASE)


class BrokerUnreachable(TroveError):
    """nats-server could not be reached, or turned this client away."""


def shown(url: str) -> str:
    """``url`` as it may be printed: without its credentials.

    A NATS URL's userinfo runs to the last ``@`` before its path. A database URL's runs
    to its last ``@`` whatever comes before (SQLAlchemy reads a password with a ``/``, a
    ``?`` or a ``#`` of a generated one raw): hidden so, a later ``@`` (in a query) hides
    more than it must, never less."""
    pattern = _DATABASE_USERINFO if url.startswith("postgres") else _USERINFO
    return _QUERY_PASSWORD.sub(r"\1***", pattern.sub("//***@", url))


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
