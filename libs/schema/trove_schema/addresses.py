"""Which IP addresses Trove must not crawl: the one rule, shared.

The fetcher applies it to every address a name resolves to before it connects (its SSRF
guard, ``trove_fetcher.addresses``); discovery and the timeline reader apply it to the
hosts of URLs written as addresses (``trove_schema.urls.is_private_host``), so that no
page is queued that the fetcher would refuse: each would be a failed attempt, retried
and rechecked for weeks. Any difference between two copies of the rule is such a page,
or a site lost; hence one copy, here in the schema package, which both depend on.

Only globally reachable unicast addresses are allowed, plus the networks an operator
lists in ``TROVE_ALLOWED_NETWORKS`` (tests, the local sandbox). The special-purpose
ranges are spelled out here from the IANA registries rather than taken from
``ipaddress``'s ``is_global``/``is_private`` flags: those changed between Python
releases and, on 3.11, still call ``64:ff9b::10.0.0.1``, ``::10.0.0.1`` and
``2002:a00:1::`` global although each one reaches 10.0.0.1.

Cloud metadata endpoints are refused even inside an allowed network: no crawl needs
them and they hand out credentials.

An IPv6 address that a translator turns into an IPv4 one reaches that IPv4 host, and
is judged as it: the IPv4-mapped, -translated and -compatible forms, 6to4, the
well-known NAT64 prefix ``64:ff9b::/96``, and the prefixes an operator's network
translates with (``TROVE_NAT64_PREFIXES``, RFC 6052: a network-specific prefix may
carry private IPv4 addresses, which the well-known one may not). The local-use range
``64:ff9b:1::/48`` (RFC 8215) is refused unless one of those prefixes names it.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

#: Instance metadata services (AWS, GCP, Azure, OpenStack, ECS, EKS Pod Identity,
#: Alibaba, Oracle), and Azure's WireServer: an ordinary public address, reachable from
#: every Azure VM and AKS pod, that hands a VM its settings and keys.
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",
        "169.254.170.2",
        "169.254.170.23",
        "169.254.169.123",
        "168.63.129.16",
        "100.100.100.200",
        "192.0.0.192",
        "fd00:ec2::254",
        "fd00:ec2::23",
    )
)

# Most specific first: the first match names the reason.
_BLOCKED_V4: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_V4("255.255.255.255/32"), "broadcast"),
    (_V4("0.0.0.0/32"), "unspecified"),
    (_V4("0.0.0.0/8"), "this network"),
    (_V4("10.0.0.0/8"), "private"),
    (_V4("100.64.0.0/10"), "shared address space (CGNAT)"),
    (_V4("127.0.0.0/8"), "loopback"),
    (_V4("169.254.0.0/16"), "link-local"),
    (_V4("172.16.0.0/12"), "private"),
    (_V4("192.0.0.0/24"), "IETF protocol assignments"),
    (_V4("192.0.2.0/24"), "documentation"),
    (_V4("192.31.196.0/24"), "AS112"),
    (_V4("192.52.193.0/24"), "AMT"),
    (_V4("192.88.99.0/24"), "6to4 relay anycast"),
    (_V4("192.168.0.0/16"), "private"),
    (_V4("192.175.48.0/24"), "AS112"),
    (_V4("198.18.0.0/15"), "benchmarking"),
    (_V4("198.51.100.0/24"), "documentation"),
    (_V4("203.0.113.0/24"), "documentation"),
    (_V4("224.0.0.0/4"), "multicast"),
    (_V4("240.0.0.0/4"), "reserved"),
)

_IPV4_MAPPED = _V6("::ffff:0:0/96")
_IPV4_TRANSLATED = _V6("::ffff:0:0:0/96")
_IPV4_COMPATIBLE = _V6("::/96")
_NAT64 = _V6("64:ff9b::/96")
_SIX_TO_FOUR = _V6("2002::/16")
_GLOBAL_UNICAST = _V6("2000::/3")
_CARRIERS = (_IPV4_MAPPED, _IPV4_TRANSLATED, _IPV4_COMPATIBLE, _NAT64)
_LOCAL_NAT64 = _V6("64:ff9b:1::/48")
#: Where a NAT64 prefix of each length carries its IPv4 address (RFC 6052 2.2): octets
#: of the IPv6 address, around octet 8 (bits 64 to 71), which is left zero.
_NAT64_OCTETS: dict[int, tuple[int, int, int, int]] = {
    32: (4, 5, 6, 7),
    40: (5, 6, 7, 9),
    48: (6, 7, 9, 10),
    56: (7, 9, 10, 11),
    64: (9, 10, 11, 12),
    96: (12, 13, 14, 15),
}

_BLOCKED_V6: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_V6("::/128"), "unspecified"),
    (_V6("::1/128"), "loopback"),
    (_IPV4_MAPPED, "IPv4-mapped"),
    (_IPV4_TRANSLATED, "IPv4-translated"),
    (_IPV4_COMPATIBLE, "IPv4-compatible"),
    (_LOCAL_NAT64, "local-use NAT64"),
    (_V6("100::/64"), "discard-only"),
    (_V6("2001::/32"), "Teredo"),
    (_V6("2001::/23"), "IETF protocol assignments"),
    (_V6("2001:db8::/32"), "documentation"),
    (_V6("3fff::/20"), "documentation"),
    (_V6("5f00::/16"), "SRv6 SIDs"),
    (_V6("fc00::/7"), "unique-local"),
    (_V6("fe80::/10"), "link-local"),
    (_V6("fec0::/10"), "site-local"),
    (_V6("ff00::/8"), "multicast"),
)


def parse_address(text: str) -> IPAddress:
    """Parse an IP literal, dropping an IPv6 zone (``fe80::1%eth0``) and brackets.

    Raises ValueError for anything else (a name, a legacy IPv4 spelling such as
    ``127.1``: those are read by whoever accepts them, the URL parser or the fetcher's
    transport, before they are judged here).
    """
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return ipaddress.ip_address(text.split("%", 1)[0])


def parse_nameserver(text: str) -> tuple[str, int]:
    """A ``TROVE_DNS_NAMESERVERS`` entry: ``ip``, ``ip:port`` or ``[ipv6]:port`` -> (ip,
    port); raises ValueError."""
    text = text.strip()
    host, port = text, 53
    try:
        if text.startswith("["):
            host, _, rest = text[1:].partition("]")
            if rest:
                if not rest.startswith(":"):
                    raise ValueError("no port after the brackets")
                port = int(rest[1:])
        elif text.count(":") == 1:
            host, _, port_text = text.partition(":")
            port = int(port_text)
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"nameserver {text!r} is not ip, ip:port or [ipv6]:port") from None
    if not 0 < port < 65536:
        raise ValueError(f"nameserver {text!r}: port out of range")
    return host, port


def resolve_entry(entry: str) -> tuple[str, str]:
    """A ``TROVE_RESOLVE`` entry: ``host=ip`` -> (host, the address as written
    canonically); raises ValueError."""
    name, sep, ip = entry.partition("=")
    if not sep or not name.strip() or not ip.strip():
        raise ValueError(f"resolve entry {entry!r} is not host=ip")
    try:
        return name.strip(), str(parse_address(ip))
    except ValueError:
        raise ValueError(f"resolve entry {entry!r}: {ip.strip()!r} is no IP address") from None


@functools.lru_cache(maxsize=64)
def parse_networks(cidrs: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    """The networks ``TROVE_ALLOWED_NETWORKS`` lists (ValueError if one is no CIDR).

    Cached: discovery asks about every link's host, always with the same few CIDRs.
    """
    return tuple(ipaddress.ip_network(cidr.strip(), strict=False) for cidr in cidrs)


def nat64_prefix(cidr: str) -> ipaddress.IPv6Network:
    """A NAT64 prefix of ``TROVE_NAT64_PREFIXES``: an IPv6 network of one of RFC 6052's
    lengths (32, 40, 48, 56, 64 or 96). ValueError otherwise."""
    network = ipaddress.ip_network(cidr.strip(), strict=False)
    if not isinstance(network, ipaddress.IPv6Network) or network.prefixlen not in _NAT64_OCTETS:
        raise ValueError(
            f"{cidr.strip()!r} is not a NAT64 prefix: an IPv6 network of /32, /40, /48, "
            "/56, /64 or /96 (RFC 6052)"
        )
    if network != _NAT64 and network.overlaps(_NAT64):
        # Read at another length, the well-known prefix's addresses would carry other
        # IPv4 addresses than the ones every translator gives them.
        raise ValueError(f"{cidr.strip()!r} overlaps the well-known NAT64 prefix 64:ff9b::/96")
    return network


@functools.lru_cache(maxsize=16)
def parse_nat64_prefixes(cidrs: tuple[str, ...]) -> tuple[ipaddress.IPv6Network, ...]:
    """The prefixes ``TROVE_NAT64_PREFIXES`` lists (``nat64_prefix``), cached."""
    return tuple(nat64_prefix(cidr) for cidr in cidrs)


def _embedded(address: ipaddress.IPv6Address, length: int) -> ipaddress.IPv4Address:
    packed = address.packed
    return ipaddress.IPv4Address(bytes(packed[i] for i in _NAT64_OCTETS[length]))


def _translated(
    address: ipaddress.IPv6Address, nat64: Iterable[ipaddress.IPv6Network]
) -> ipaddress.IPv4Address | None:
    """The IPv4 address ``address`` reaches through one of the operator's NAT64
    prefixes, if it is in one."""
    for prefix in nat64:
        if address in prefix:
            return _embedded(address, prefix.prefixlen)
    return None


def _carried_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one reaches through (mapped, translated, compatible,
    NAT64, 6to4), if it carries one."""
    if address in _SIX_TO_FOUR:
        return address.sixtofour
    if any(address in network for network in _CARRIERS):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def is_metadata(address: IPAddress, nat64: Iterable[ipaddress.IPv6Network] = ()) -> bool:
    """A metadata address, or an IPv6 form that reaches one: through the carriers above,
    the operator's NAT64 prefixes, or the local-use NAT64 range at any place a prefix
    within it could carry one."""
    if address in METADATA_ADDRESSES:
        return True
    if not isinstance(address, ipaddress.IPv6Address):
        return False
    carried = [_carried_ipv4(address), _translated(address, nat64)]
    if address in _LOCAL_NAT64:
        carried += [_embedded(address, length) for length in _NAT64_OCTETS if length >= 48]
    return any(ipv4 in METADATA_ADDRESSES for ipv4 in carried if ipv4 is not None)


def blocked_reason(address: IPAddress, nat64: Iterable[ipaddress.IPv6Network] = ()) -> str | None:
    """Why ``address`` is not globally reachable unicast, or None when it is.
    ``nat64``: the operator's NAT64 prefixes (``parse_nat64_prefixes``)."""
    if address in METADATA_ADDRESSES:
        return "cloud metadata"
    if isinstance(address, ipaddress.IPv4Address):
        for network4, reason4 in _BLOCKED_V4:
            if address in network4:
                return reason4
        return None
    # An IPv6 address that carries an IPv4 one reaches that IPv4 host: judge that too.
    translated = _translated(address, nat64)
    if translated is not None:
        inner = blocked_reason(translated)
        return None if inner is None else f"NAT64 of {translated}: {inner}"
    if address in _NAT64:
        embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        inner = blocked_reason(embedded)
        return None if inner is None else f"NAT64 of {embedded}: {inner}"
    if address in _SIX_TO_FOUR:
        relay = address.sixtofour
        assert relay is not None
        inner = blocked_reason(relay)
        # 6to4 is deprecated (RFC 7526): no site worth crawling is reachable only by it.
        return f"6to4 of {relay}" + (f": {inner}" if inner else "")
    for network6, reason6 in _BLOCKED_V6:
        if address in network6:
            if network6 in (_IPV4_MAPPED, _IPV4_COMPATIBLE):
                return f"{reason6} {ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)}"
            return reason6
    if address not in _GLOBAL_UNICAST:
        return "reserved"
    return None


def refusal(
    address: IPAddress,
    allowed: Iterable[IPNetwork] = (),
    nat64: Iterable[ipaddress.IPv6Network] = (),
) -> str | None:
    """Why Trove must not connect to ``address``, or None when it may.

    ``allowed`` networks (``TROVE_ALLOWED_NETWORKS``) open special-purpose ranges for
    tests and the sandbox: ``127.0.0.0/24`` opens 127.0.0.5 but not 127.0.1.1. A network
    opens only addresses of its own IP version: ``127.0.0.0/8`` does not open
    ``::ffff:127.0.0.1``, which an operator who wrote an IPv4 range did not name. None
    ever opens a metadata address, however it is written (NAT64 of it, IPv4-mapped).
    ``nat64``: the operator's NAT64 prefixes, whose addresses are judged by the IPv4
    address they carry.
    """
    nat64 = tuple(nat64)
    reason = blocked_reason(address, nat64)
    if reason is None:
        return None
    if not is_metadata(address, nat64) and any(
        address.version == network.version and address in network for network in allowed
    ):
        return None
    return reason
