"""nats-server's time, as a JetStream API answer stamps it.

The fetcher pods keep politeness on it (``trove_fetcher.clock``), so the instants they
share in ``trove_domains`` (a host's next slot, its back-off) are on the server's clock,
not on any node's. Whatever reads those instants against "now" (``trove status``,
``trove domain``) reads "now" the same way: an operator's laptop whose clock is a minute
off would otherwise show every back-off a minute too long or too short.
"""

from __future__ import annotations

import json
import time
from datetime import datetime

from nats.aio.client import Client
from nats.js.errors import APIError

from trove_schema.topology import WORK_STREAM


def server_time(answer: bytes) -> float:
    """The ``ts`` of a JetStream API answer, as epoch seconds (to the microsecond); an
    answer that is an error raises it (a 503: JetStream not there yet, or no leader)."""
    body = json.loads(answer)
    if "error" in body:
        APIError.from_error(body["error"])
    stamp = body["ts"]
    # RFC 3339 with nanoseconds; Python's parser takes six digits of a fraction at most.
    head, _, fraction = stamp.rstrip("Z").partition(".")
    micros = (fraction + "000000")[:6]
    return datetime.fromisoformat(f"{head}.{micros}+00:00").timestamp()


async def server_now(nc: Client) -> float:
    """nats-server's time now, give or take half a round trip, as the work stream's info
    stamps it (the fetchers read theirs there: ``trove_fetcher.clock``); this machine's
    clock when the server does not say (a server before 2.10, no work stream yet). The
    account's info (``$JS.API.INFO``) carries no ``ts``. No answer at all (JetStream off,
    a timeout) raises, as the command's other requests would."""
    sent = time.monotonic()
    try:
        answer = await nc.request(f"$JS.API.STREAM.INFO.{WORK_STREAM}", b"", timeout=5.0)
        stamped = server_time(answer.data)
    except (KeyError, ValueError, APIError):
        return time.time()
    return stamped + (time.monotonic() - sent) / 2
