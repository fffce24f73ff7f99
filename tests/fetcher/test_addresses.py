"""The SSRF guard's address policy: what is refused, what is allowed, and why; and
discovery's check of a URL's host, which must drop exactly what the guard refuses."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trove_fetcher.addresses import AddressPolicy
from trove_fetcher.errors import BlockedAddress, FetcherError
from trove_fetcher.transport import GuardedNetworkBackend, literal_address
from trove_schema.addresses import IPAddress, parse_address
from trove_schema.urls import is_private_host

STRICT = AddressPolicy()

BLOCKED = {
    "10.0.0.1": "private",
    "172.16.0.1": "private",
    "172.31.255.255": "private",
    "192.168.1.1": "private",
    "127.0.0.1": "loopback",
    "127.255.255.254": "loopback",
    "::1": "loopback",
    "169.254.1.1": "link-local",
    "fe80::1": "link-local",
    "fe80::1%eth0": "link-local",
    "100.64.0.1": "shared address space (CGNAT)",
    "100.127.255.254": "shared address space (CGNAT)",
    "fc00::1": "unique-local",
    "fd12:3456::1": "unique-local",
    "224.0.0.1": "multicast",
    "239.255.255.250": "multicast",
    "ff02::1": "multicast",
    "240.0.0.1": "reserved",
    "0.0.0.0": "unspecified",
    "0.1.2.3": "this network",
    "::": "unspecified",
    "255.255.255.255": "broadcast",
    "169.254.169.254": "cloud metadata",
    "fd00:ec2::254": "cloud metadata",
    "100.100.100.200": "cloud metadata",
    "168.63.129.16": "cloud metadata",
    "169.254.170.23": "cloud metadata",
    "::ffff:10.0.0.1": "IPv4-mapped 10.0.0.1",
    "::ffff:8.8.8.8": "IPv4-mapped 8.8.8.8",
    "::10.0.0.1": "IPv4-compatible 10.0.0.1",
    "64:ff9b::10.0.0.1": "NAT64 of 10.0.0.1: private",
    "64:ff9b::169.254.169.254": "NAT64 of 169.254.169.254: cloud metadata",
    "64:ff9b:1::1": "local-use NAT64",
    "2002:a00:1::1": "6to4 of 10.0.0.1: private",
    "2002:808:808::1": "6to4 of 8.8.8.8",
    "2001::1": "Teredo",
    "192.0.2.1": "documentation",
    "198.51.100.7": "documentation",
    "203.0.113.9": "documentation",
    "2001:db8::1": "documentation",
    "3fff::1": "documentation",
    "198.18.0.1": "benchmarking",
    "5f00::1": "SRv6 SIDs",
    "fec0::1": "site-local",
    "4000::1": "reserved",
}

PUBLIC = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.216.34",
    "172.32.0.1",
    "100.128.0.1",
    "2606:4700:4700::1111",
    "2001:4860:4860::8888",
    "64:ff9b::8.8.8.8",
]


@pytest.mark.parametrize(("ip", "reason"), BLOCKED.items())
def test_special_purpose_address_is_refused_with_its_reason(ip: str, reason: str) -> None:
    with pytest.raises(BlockedAddress) as caught:
        STRICT.check(ip, host="site.example")
    assert caught.value.reason == reason
    assert caught.value.host == "site.example"
    assert caught.value.address == str(parse_address(ip))
    assert isinstance(caught.value, FetcherError)


@pytest.mark.parametrize("ip", PUBLIC)
def test_globally_reachable_address_is_allowed(ip: str) -> None:
    STRICT.check(ip)
    assert STRICT.allows(ip)


def test_text_that_is_not_an_address_is_refused() -> None:
    with pytest.raises(BlockedAddress, match="not an IP address"):
        STRICT.check("localhost")


def test_allowed_network_admits_only_its_own_addresses() -> None:
    policy = AddressPolicy.from_cidrs(["127.0.0.0/24"])
    assert policy.allows("127.0.0.5")
    assert policy.allows("127.0.0.254")
    assert not policy.allows("127.0.1.1")
    assert not policy.allows("10.0.0.1")
    assert not policy.allows("::1")


def test_allowed_ipv4_network_does_not_open_its_ipv4_mapped_form() -> None:
    policy = AddressPolicy.from_cidrs(["127.0.0.0/24"])
    assert not policy.allows("::ffff:127.0.0.5")


@pytest.mark.parametrize("cidr", ["169.254.0.0/16", "0.0.0.0/0", "100.64.0.0/10", "fd00::/8"])
def test_no_allowed_network_opens_a_metadata_address(cidr: str) -> None:
    policy = AddressPolicy.from_cidrs([cidr])
    for address in ("169.254.169.254", "100.100.100.200", "fd00:ec2::254"):
        if ipaddress.ip_address(address) in ipaddress.ip_network(cidr):
            with pytest.raises(BlockedAddress, match="cloud metadata"):
                policy.check(address)


@pytest.mark.parametrize(
    ("cidr", "address"),
    [
        ("64:ff9b::/96", "64:ff9b::169.254.169.254"),
        ("::ffff:0:0/96", "::ffff:169.254.169.254"),
        ("::/96", "::169.254.169.254"),
        ("2002::/16", "2002:a9fe:a9fe::1"),
        ("::ffff:0:0:0/96", "::ffff:0:a9fe:a9fe"),
    ],
)
def test_no_allowed_network_opens_a_metadata_address_written_as_ipv6(
    cidr: str, address: str
) -> None:
    policy = AddressPolicy.from_cidrs([cidr])
    assert policy.allows(
        address.replace("169.254.169.254", "8.8.8.8").replace("a9fe:a9fe", "808:808")
    )
    with pytest.raises(BlockedAddress):
        policy.check(address)


def test_allowed_ipv6_network_admits_its_addresses() -> None:
    policy = AddressPolicy.from_cidrs(["::1/128", "fd00:1::/64"])
    assert policy.allows("::1")
    assert policy.allows("fd00:1::7")
    assert not policy.allows("fd00:2::7")


def test_policy_is_frozen() -> None:
    policy = AddressPolicy.from_cidrs(["127.0.0.0/8"])
    with pytest.raises(AttributeError):
        policy.allowed = ()  # type: ignore[misc]


# Discovery (links, seeds, follows, shares) and the timeline reader drop a URL whose
# host the fetcher would refuse: a page queued there is a failed attempt, retried and
# rechecked for weeks. Dropping less queues such pages; dropping more loses sites.

#: The guard's own cases, the addresses on which discovery's check once disagreed with
#: it, and IPv6 forms the guard judges by the IPv4 address they carry.
NAMED = [
    *BLOCKED,
    *PUBLIC,
    "168.63.129.16",
    "2002:808:808::",
    "3fff::1",
    "192.31.196.1",
    "192.52.193.1",
    "192.175.48.1",
    "::ffff:127.0.0.1",
    "::ffff:10.1.2.3",
    "::ffff:169.254.169.254",
    "64:ff9b::a9fe:a9fe",
    "2002:a9fe:a9fe::1",
    "2002:7f00:1::",
    "127.0.0.1",
    "10.1.2.3",
    "169.254.1.1",
    "fd12::1",
    "fd00:ec2::23",
]

ALLOWED_SETS: list[tuple[str, ...]] = [
    (),
    ("127.0.0.0/8",),
    ("10.0.0.0/8",),
    ("::1/128",),
    ("169.254.0.0/16",),
    ("fd00::/8",),
    ("2002::/16",),
    ("127.0.0.0/8", "::1/128"),
    ("::ffff:0:0/96", "64:ff9b::/96"),
    ("0.0.0.0/0", "::/0"),
]


def _spellings(address: IPAddress) -> list[str]:
    """How a URL's host may write ``address``: as domain_of gives it, bracketed, and
    (IPv4) in the legacy forms browsers and inet_aton read."""
    if isinstance(address, ipaddress.IPv6Address):
        return [str(address), f"[{address}]", address.exploded]
    number = int(address)
    # With a trailing dot too, as a redirect's Location may write it.
    return [
        str(address),
        str(number),
        hex(number),
        f"{number >> 24}.{number & 0xFFFFFF}",
        f"{address}.",
        f"{number}.",
    ]


#: Networks' own NAT64 prefixes (``TROVE_NAT64_PREFIXES``), one of each RFC 6052 length.
NAT64_SETS: list[tuple[str, ...]] = [
    (),
    ("2a00:64::/32",),
    ("2a00:64:100::/40",),
    ("64:ff9b:1::/48",),
    ("fd00:64:1:100::/56",),
    ("2a00:64:1:2::/64",),
    ("2a00:64:1:2:3:4::/96",),
]


def _assert_discovery_drops_what_the_fetcher_refuses(
    address: IPAddress, allowed: tuple[str, ...], nat64: tuple[str, ...] = ()
) -> None:
    policy = AddressPolicy.from_cidrs(allowed, nat64)
    for spelling in _spellings(address):
        # The address the fetcher's transport reads from the host, as it would connect.
        literal = literal_address(spelling)
        assert literal is not None, spelling
        refused = not policy.allows(literal)
        assert is_private_host(spelling, allowed, nat64) is refused, (spelling, allowed, nat64)


@st.composite
def _cases(draw: st.DrawFn) -> tuple[IPAddress, tuple[str, ...], tuple[str, ...]]:
    nat64 = draw(st.sampled_from(NAT64_SETS))
    addresses = [st.sampled_from([parse_address(a) for a in NAMED]), st.ip_addresses()]
    if nat64:
        # Anywhere in the prefix: the IPv4 address it carries, whatever it is.
        prefix = ipaddress.IPv6Network(nat64[0])
        addresses.append(
            st.integers(0, prefix.num_addresses - 1).map(
                lambda n: ipaddress.IPv6Address(int(prefix.network_address) + n)
            )
        )
    address = draw(st.one_of(*addresses))
    allowed = list(draw(st.sampled_from(ALLOWED_SETS)))
    if draw(st.booleans()):
        # A network that holds the address (or not, as its prefix falls), to open it.
        prefix_length = draw(st.integers(0, address.max_prefixlen))
        allowed.append(str(ipaddress.ip_network(f"{address}/{prefix_length}", strict=False)))
    return address, tuple(allowed), nat64


@settings(max_examples=1000, deadline=None)
@given(_cases())
@example((parse_address("::ffff:127.0.0.1"), ("127.0.0.0/8",), ()))
@example((parse_address("2002:808:808::"), (), ()))
@example((parse_address("2a00:64:1:2:3:4:a00:1"), (), ("2a00:64:1:2:3:4::/96",)))
def test_discovery_drops_exactly_the_addresses_the_fetcher_refuses(
    case: tuple[IPAddress, tuple[str, ...], tuple[str, ...]],
) -> None:
    _assert_discovery_drops_what_the_fetcher_refuses(*case)


@pytest.mark.parametrize("allowed", ALLOWED_SETS, ids=lambda a: ",".join(a) or "none")
def test_discovery_drops_exactly_the_named_addresses_the_fetcher_refuses(
    allowed: tuple[str, ...],
) -> None:
    for text in NAMED:
        _assert_discovery_drops_what_the_fetcher_refuses(parse_address(text), allowed)


@pytest.mark.parametrize(
    "allowed",
    [*ALLOWED_SETS, ("127.0.0.1/32", "::1/128"), ("127.0.0.1/32",)],
    ids=lambda a: ",".join(a) or "none",
)
async def test_discovery_drops_localhost_exactly_when_the_fetcher_refuses_it(
    allowed: tuple[str, ...],
) -> None:
    # The fetcher's own path for a name: its resolver answers localhost without a
    # query, and the guard refuses the name if any of the answers is refused.
    backend = GuardedNetworkBackend(AddressPolicy.from_cidrs(allowed))
    for host in ("localhost", "app.localhost"):
        try:
            await backend.resolve(host, 80)
        except BlockedAddress:
            refused = True
        else:
            refused = False
        assert is_private_host(host, allowed) is refused, (host, allowed)
