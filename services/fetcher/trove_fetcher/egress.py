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
none has connected in between (nor for ``quiet`` seconds, when set), the pod's egress
is taken to be away: a
connection that fails then raises ``EgressAway``, not the host's error, and the work
goes back to its stream, not counted, with nothing recorded. Meanwhile the work is
handed back before it takes a lease, except that one job every ``recheck`` seconds
goes ahead (with its lease, as any request) to find out: the first connection that
succeeds ends the outage.

IPv4 and IPv6 are judged apart (a cluster without IPv6 fails every connection to a
host that has only an IPv6 address, which says nothing of IPv4); while IPv4 is away,
work is handed back before its lease.

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
    #: ... and for at least this long since the last connection that succeeded. 0 by
    #: default: each second of it leaves that second's failures to the hosts (a busy
    #: pod connects many times a second), where a false alarm costs a recheck's wait.
    quiet: float = 0.0
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
    """The pod's connections, counted per address family; ``clock`` is a seam for tests.

    IPv4 and IPv6 are two ways out: a cluster without IPv6 fails every connection to a
    host that has only an IPv6 address, and that says nothing about IPv4. IPv4 may be
    taken to be away from the pod's start (a pod started in an outage); IPv6 only once
    an IPv6 connection succeeded in this pod's life. Work is handed back before its
    lease while IPv4 is away, the way out of most hosts' first address.
    """

    def __init__(
        self,
        config: EgressConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config = config or EgressConfig()
        self._ways = {4: _Way("IPv4", config, clock, known=True), 6: _Way("IPv6", config, clock)}

    @property
    def is_away(self) -> bool:
        return any(way.is_away for way in self._ways.values())

    def connected(self, address: str) -> None:
        """A TCP connection to ``address`` succeeded: its way out works."""
        self._way(address).connected()

    def failed(self, address: str, error: BaseException) -> EgressAway | None:
        """A TCP connection to ``address`` failed with ``error``: ``EgressAway`` to raise
        instead when the pod's way out is taken to be away, else None (the host's)."""
        return self._way(address).failed(address, error)

    def away(self) -> EgressAway | None:
        """Before a job takes its lease: ``EgressAway`` to hand it back while IPv4 is
        away, except one job every ``recheck`` seconds, let through to find out."""
        return self._ways[4].away()

    def _way(self, address: str) -> _Way:
        return self._ways[6 if ":" in address else 4]


class _Way:
    """One address family's connections."""

    def __init__(
        self, name: str, config: EgressConfig, clock: Callable[[], float], *, known: bool = False
    ) -> None:
        self.name = name
        self.config = config
        self._clock = clock
        #: Whether this way out may be taken to be away: it worked once (IPv4: assumed).
        self._known = known
        #: When a connection last succeeded (the start counts: a pod that never
        #: connected has been quiet since then).
        self._connected_at = clock()
        #: Addresses that failed to connect since then (at most ``suspect_after``).
        self._failed: set[str] = set()
        #: Since when, and why, it is taken to be away; None while it works.
        self._away: tuple[float, str] | None = None
        #: When the last job was let through to find out.
        self._checked_at = -float("inf")
        #: Whether this outage outlasted ``patience``: failures are the hosts' again.
        self._given_up = False

    @property
    def is_away(self) -> bool:
        return self._away is not None and not self._given_up

    def connected(self) -> None:
        self._known = True
        self._connected_at = self._clock()
        self._failed.clear()
        if self._away is not None:
            lasted = self._connected_at - self._away[0]
            self._away = None
            self._given_up = False
            EGRESS_AWAY.labels(self.name).set(0)
            log.info("%s connections succeed again after %.0f s: work goes on", self.name, lasted)

    def failed(self, address: str, error: BaseException) -> EgressAway | None:
        now = self._clock()
        if self._away is not None:
            if self._given_up:
                return None
            if now - self._away[0] >= self.config.patience:
                # The gauge stays 1: nothing connects still, which is what an operator's
                # alert is for; only the blame changes.
                self._given_up = True
                log.warning(
                    "no %s connection has succeeded for %.0f s: failures are recorded against"
                    " the hosts again",
                    self.name,
                    now - self._connected_at,
                )
                return None
            return EgressAway(self._away[1], retry_after=self.config.recheck)
        if not self._known:
            return None
        if len(self._failed) < self.config.suspect_after:
            self._failed.add(address)
        if (
            len(self._failed) < self.config.suspect_after
            or now - self._connected_at < self.config.quiet
        ):
            return None
        why = (
            f"{len(self._failed)} {self.name} addresses failed to connect and none connected"
            f" for {now - self._connected_at:.0f} s (last: {address}: {error})"
        )
        self._away = (now, why)
        self._checked_at = now
        EGRESS_AWAY.labels(self.name).set(1)
        log.warning("%s: the pod's egress is taken to be away; its work waits", why)
        return EgressAway(why, retry_after=self.config.recheck)

    def away(self) -> EgressAway | None:
        if not self.is_away:
            return None
        assert self._away is not None
        now = self._clock()
        if now - self._checked_at < self.config.recheck:
            return EgressAway(self._away[1], retry_after=self.config.recheck)
        self._checked_at = now
        return None
