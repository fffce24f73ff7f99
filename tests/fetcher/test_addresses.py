"""The SSRF guard's address policy: what is refused, what is allowed, and why."""

from __future__ import annotations

import ipaddress

import pytest

from trove_fetcher.addresses import AddressPolicy, blocked_reason, parse_address
from trove_fetcher.errors import BlockedAddress, FetcherError

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


def test_every_ipv4_address_python_calls_non_global_is_refused() -> None:
    # A sweep across the whole space (the first address of every /16 and the ends of
    # each /8): whatever the standard library knows to be special, the policy refuses.
    candidates = {ipaddress.IPv4Address(n) for n in range(0, 2**32, 2**16)}
    for octet in range(256):
        candidates.add(ipaddress.IPv4Address(octet << 24))
        candidates.add(ipaddress.IPv4Address((octet << 24) | 0xFFFFFF))
    special = [a for a in candidates if not a.is_global or a.is_multicast or a.is_reserved]
    assert len(special) > 500
    missed = [str(a) for a in special if blocked_reason(a) is None]
    assert missed == []


def test_every_embedded_private_ipv4_in_ipv6_is_refused() -> None:
    for v4 in ("10.1.2.3", "127.0.0.1", "192.168.0.1", "169.254.169.254", "100.64.0.1"):
        inner = int(ipaddress.IPv4Address(v4))
        forms = [
            ipaddress.IPv6Address((0xFFFF << 32) | inner),  # ::ffff:a.b.c.d
            ipaddress.IPv6Address(inner),  # ::a.b.c.d
            ipaddress.IPv6Address((0x64FF9B << 96) | inner),  # 64:ff9b::a.b.c.d
            ipaddress.IPv6Address((0x2002 << 112) | (inner << 80)),  # 2002:aabb:ccdd::
        ]
        for form in forms:
            assert blocked_reason(form) is not None, form
