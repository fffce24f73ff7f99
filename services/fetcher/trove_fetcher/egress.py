"""Whether the pod's way out to the Internet works, judged by its own connection attempts.

A NAT gateway down, a NetworkPolicy that lost its egress rule, a node whose uplink
failed: every connection attempt fails, to every host, while the cluster's DNS still
answers from its cache (``trove_fetcher.dns`` tells the nameservers' own outage). Taken
for the hosts' trouble, each attempt would be recorded as a failure, each host's
robots.txt read as "unavailable" (disallow all, shared by every pod) and each host's
policy would learn a pause it never earned, hours of crawling spoiled by minutes of
outage.

``EgressWatch`` sees every TCP connection the transport opens. When ``suspect_after``
different addresses have failed to connect (refused, unreachable or timed out) and
none has connected for ``quiet`` seconds, the pod's egress is taken to be away: a
connection that fails then raises ``EgressAway``, not the host's error, and the work
goes back to its stream, not counted, with nothing recorded. Meanwhile the work is
handed back before it takes a lease, except that one job every ``recheck`` seconds
goes ahead (with its lease, as any request) to find out: the first connection that
succeeds ends the outage.

A pod whose only work is for hosts that are really gone looks the same from inside.
So the outage is believed for ``patience`` seconds at most: after that, failures are
recorded against the hosts as before, until a connection succeeds again. The first
``suspect_after`` failures of an outage are recorded too: they are what shows it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trove_fetcher.errors import EgressAway
from trove_schema.metrics import EGRESS_AWAY

if TYPE_CHECKING:
    from trove_schema.settings import FetcherSettings

log = logging.getLogger("trove.fetcher.egress")


@dataclass(frozen=True, slots=True)
class EgressConfig:
    #: Different addresses that must fail to connect, none succeeding, to suspect egress.
    suspect_after: int = 8
    #: ... and for at least this long since the last connection that succeeded.
    quiet: float = 10.0
    #: While egress is away, one job this often goes ahead to find out.
    recheck: float = 10.0
    #: Longest an outage is believed before failures are the hosts' again.
    patience: float = 3600.0

    @classmethod
    def for_settings(cls, settings: FetcherSettings) -> EgressConfig:
        return cls(
            suspect_after=settings.egress_suspect_after,
            quiet=settings.egress_quiet_seconds,
            recheck=settings.egress_recheck_seconds,
            patience=settings.egress_patience_seconds,
        )


class EgressWatch:
    """The pod's connections, counted; ``clock`` is a seam for tests."""

    def __init__(
        self,
        config: EgressConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or EgressConfig()
        self._clock = clock
        #: When a connection last succeeded (the start counts: a pod that never
        #: connected has been quiet since then).
        self._connected_at = clock()
        #: Addresses that failed to connect since then (at most ``suspect_after``).
        self._failed: set[str] = set()
        #: Since when, and why, egress is taken to be away; None while it works.
        self._away: tuple[float, str] | None = None
        #: When the last job was let through to find out.
        self._checked_at = -float("inf")
        #: Whether this outage outlasted ``patience``: failures are the hosts' again.
        self._given_up = False

    @property
    def is_away(self) -> bool:
        return self._away is not None and not self._given_up

    def connected(self) -> None:
        """A TCP connection succeeded: the way out works."""
        self._connected_at = self._clock()
        self._failed.clear()
        if self._away is not None:
            lasted = self._connected_at - self._away[0]
            self._away = None
            self._given_up = False
            EGRESS_AWAY.set(0)
            log.info("connections succeed again after %.0f s: work goes on", lasted)

    def failed(self, address: str, error: BaseException) -> EgressAway | None:
        """A TCP connection to ``address`` failed with ``error``: ``EgressAway`` to raise
        instead when the pod's way out is taken to be away, else None (the host's)."""
        now = self._clock()
        if self._away is not None:
            if self._given_up:
                return None
            if now - self._away[0] >= self.config.patience:
                self._given_up = True
                EGRESS_AWAY.set(0)
                log.warning(
                    "no connection has succeeded for %.0f s: failures are recorded against"
                    " the hosts again",
                    now - self._connected_at,
                )
                return None
            return EgressAway(self._away[1])
        if len(self._failed) < self.config.suspect_after:
            self._failed.add(address)
        if (
            len(self._failed) < self.config.suspect_after
            or now - self._connected_at < self.config.quiet
        ):
            return None
        why = (
            f"{len(self._failed)} addresses failed to connect and none connected for"
            f" {now - self._connected_at:.0f} s (last: {address}: {error})"
        )
        self._away = (now, why)
        self._checked_at = now
        EGRESS_AWAY.set(1)
        log.warning("%s: the pod's egress is taken to be away; its work waits", why)
        return EgressAway(why)

    def away(self) -> EgressAway | None:
        """Before a job takes its lease: ``EgressAway`` to hand it back while egress is
        away, except one job every ``recheck`` seconds, let through to find out."""
        if not self.is_away:
            return None
        assert self._away is not None
        now = self._clock()
        if now - self._checked_at < self.config.recheck:
            return EgressAway(self._away[1])
        self._checked_at = now
        return None
