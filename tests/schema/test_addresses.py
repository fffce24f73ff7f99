"""The rule of which IP addresses Trove must not crawl: reasons, allowed networks."""

from __future__ import annotations

import ipaddress

import pytest

from trove_schema.addresses import blocked_reason, parse_address, parse_networks, refusal


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
