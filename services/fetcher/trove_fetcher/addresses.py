"""The fetcher's SSRF guard: which resolved addresses it may connect to.

The rule itself is Trove's, not the fetcher's (``trove_schema.addresses``): discovery
drops links to the addresses it refuses by the same one. What is the fetcher's own is
how a refusal is raised: ``BlockedAddress``, which the transport turns into a failed
connection and the fetcher records with its reason.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from trove_fetcher.errors import BlockedAddress
from trove_schema.addresses import (
    IPNetwork,
    parse_address,
    parse_nat64_prefixes,
    parse_networks,
    refusal,
)


@dataclass(frozen=True, slots=True)
class AddressPolicy:
    """Refuses every address that is not globally reachable, unless explicitly allowed.

    ``allowed`` networks (``TROVE_ALLOWED_NETWORKS``) open private ranges for tests
    and the sandbox: ``127.0.0.0/24`` allows 127.0.0.5 but not 127.0.1.1. They never
    open a cloud metadata address (``trove_schema.addresses.refusal``).
    """

    allowed: tuple[IPNetwork, ...] = ()
    #: The network's own NAT64 prefixes (``TROVE_NAT64_PREFIXES``).
    nat64: tuple[ipaddress.IPv6Network, ...] = ()

    @classmethod
    def from_cidrs(cls, cidrs: Iterable[str], nat64: Iterable[str] = ()) -> AddressPolicy:
        return cls(parse_networks(tuple(cidrs)), parse_nat64_prefixes(tuple(nat64)))

    def check(self, ip: str, *, host: str | None = None) -> None:
        """Raise BlockedAddress unless the fetcher may connect to ``ip``.

        ``host`` is the name that resolved to ``ip``, for the error message.
        """
        try:
            address = parse_address(ip)
        except ValueError:
            raise BlockedAddress(host or ip, ip, "not an IP address") from None
        reason = refusal(address, self.allowed, self.nat64)
        if reason is not None:
            raise BlockedAddress(host or ip, str(address), reason)

    def allows(self, ip: str) -> bool:
        try:
            self.check(ip)
        except BlockedAddress:
            return False
        return True
