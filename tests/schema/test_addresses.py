"""The rule of which IP addresses Trove must not crawl: reasons, allowed networks."""

from __future__ import annotations

import ipaddress

import pytest

from trove_schema.addresses import (
    blocked_reason,
    nat64_prefix,
    parse_address,
    parse_nat64_prefixes,
    parse_networks,
    refusal,
)


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


@pytest.mark.parametrize(
    ("address", "allowed", "reason"),
    [
        ("8.8.8.8", (), None),
        ("127.0.0.1", (), "loopback"),
        ("127.0.0.1", ("127.0.0.0/8",), None),
        # A network opens addresses of its own IP version only: whoever allowed an IPv4
        # range did not name the IPv6 forms that carry it.
        ("::ffff:127.0.0.1", ("127.0.0.0/8",), "IPv4-mapped 127.0.0.1"),
        ("::ffff:127.0.0.1", ("::ffff:0:0/96",), None),
        ("2002:808:808::", (), "6to4 of 8.8.8.8"),
        ("2002:808:808::", ("2002::/16",), None),
        # No network opens a metadata address, however it is written.
        ("168.63.129.16", ("0.0.0.0/0",), "cloud metadata"),
        ("64:ff9b::a9fe:a9fe", ("::/0",), "NAT64 of 169.254.169.254: cloud metadata"),
        ("fd00:ec2::254", ("fd00::/8",), "cloud metadata"),
    ],
)
def test_refusal_is_the_reason_unless_an_allowed_network_opens_the_address(
    address: str, allowed: tuple[str, ...], reason: str | None
) -> None:
    assert refusal(parse_address(address), parse_networks(allowed)) == reason


def test_allowed_networks_are_read_once() -> None:
    assert parse_networks((" 10.0.0.0/8", "fd00::/8 ")) is parse_networks(
        (" 10.0.0.0/8", "fd00::/8 ")
    )
    assert parse_networks(("10.1.2.3/8",)) == (ipaddress.ip_network("10.0.0.0/8"),)
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 network"):
        parse_networks(("not-a-cidr",))


#: RFC 6052 2.4's own examples: 192.0.2.33 under a prefix of each length.
RFC_6052_EXAMPLES = {
    "2001:db8::/32": "2001:db8:c000:221::",
    "2001:db8:100::/40": "2001:db8:1c0:2:21::",
    "2001:db8:122::/48": "2001:db8:122:c000:2:2100::",
    "2001:db8:122:300::/56": "2001:db8:122:3c0:0:221::",
    "2001:db8:122:344::/64": "2001:db8:122:344:c0:2:2100:0",
    "2001:db8:122:344::/96": "2001:db8:122:344::c000:221",
}


@pytest.mark.parametrize(("prefix", "address"), RFC_6052_EXAMPLES.items())
def test_an_address_in_the_networks_own_nat64_prefix_is_judged_by_the_ipv4_it_carries(
    prefix: str, address: str
) -> None:
    # 2001:db8::/32 is for documentation, refused whatever it carries: told its prefix,
    # the rule reads the IPv4 address at the place RFC 6052 puts it for that length.
    nat64 = parse_nat64_prefixes((prefix,))
    assert refusal(parse_address(address), (), nat64) == "NAT64 of 192.0.2.33: documentation"


@pytest.mark.parametrize("length", [32, 40, 48, 56, 64, 96])
def test_a_networks_own_nat64_prefix_closes_private_ipv4_and_opens_public(length: int) -> None:
    # Unlike 64:ff9b::/96, a network's own prefix may carry private addresses (RFC
    # 6052 3.1): without the setting such an address looks like any global IPv6 one.
    prefix = ipaddress.IPv6Network(f"2a00:64::/{length}", strict=False)
    octets = {32: (4, 5, 6, 7), 40: (5, 6, 7, 9), 48: (6, 7, 9, 10), 56: (7, 9, 10, 11)}
    places = octets.get(length, (9, 10, 11, 12) if length == 64 else (12, 13, 14, 15))

    def carrying(ipv4: str) -> ipaddress.IPv6Address:
        packed = bytearray(prefix.network_address.packed)
        for place, octet in zip(places, ipaddress.IPv4Address(ipv4).packed, strict=True):
            packed[place] = octet
        return ipaddress.IPv6Address(bytes(packed))

    nat64 = parse_nat64_prefixes((str(prefix),))
    assert refusal(carrying("10.0.0.1"), ()) is None  # the hole the setting closes
    assert refusal(carrying("10.0.0.1"), (), nat64) == "NAT64 of 10.0.0.1: private"
    assert refusal(carrying("169.254.169.254"), parse_networks(("::/0",)), nat64) == (
        "NAT64 of 169.254.169.254: cloud metadata"
    )
    assert refusal(carrying("8.8.8.8"), (), nat64) is None


@pytest.mark.parametrize(
    "address",
    ["64:ff9b:1::a9fe:a9fe", "64:ff9b:1:a9fe:a9:fe00::", "64:ff9b:1:0:a9:fea9:fe00:0"],
)
def test_the_local_use_nat64_range_never_opens_a_metadata_address(address: str) -> None:
    # Whichever prefix within 64:ff9b:1::/48 a network uses (/96, /48, /64 here), an
    # operator who opened the range does not open the metadata address it carries.
    assert refusal(parse_address(address), ()) == "local-use NAT64"
    assert refusal(parse_address(address), parse_networks(("::/0",))) == "local-use NAT64"


@pytest.mark.parametrize(
    "cidr", ["10.0.0.0/8", "2001:db8::/33", "2001:db8::/128", "nat64", "64:ff9b::/32"]
)
def test_a_nat64_prefix_is_an_ipv6_network_of_an_rfc_6052_length(cidr: str) -> None:
    with pytest.raises(ValueError, match=r"NAT64 prefix|does not appear to be"):
        nat64_prefix(cidr)
    assert nat64_prefix("64:ff9b::/96") == ipaddress.IPv6Network("64:ff9b::/96")
