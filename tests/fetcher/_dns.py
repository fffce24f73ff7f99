"""A small authoritative DNS server on loopback UDP, for the resolver's tests and the soak.

It runs in a thread (independent of the event loop under test), answers from a dict
the test fills (``records``: name -> (addresses, ttl); ``missing``: names that get
NXDOMAIN with an SOA whose minimum is the negative TTL; ``silent``: names it never
answers), counts every query by (name, type), and answers A and AAAA as DNS does:
an address of the other family is NODATA, with the SOA. Any other name, the root
included, is REFUSED, as an authoritative server does. ``down`` makes it answer
nothing at all (a cluster DNS restarting); ``failing``, SERVFAIL to everything (a
resolver that lost its way out).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import dns.flags
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

ZONE = "trove.test."


@dataclass
class DnsServer:
    ip: str
    port: int = 0
    records: dict[str, tuple[tuple[str, ...], int]] = field(default_factory=dict)
    #: name -> negative TTL (the SOA's minimum) of its NXDOMAIN answer.
    missing: dict[str, int] = field(default_factory=dict)
    silent: set[str] = field(default_factory=set)
    down: bool = False
    failing: bool = False
    queries: Counter[tuple[str, str]] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    def asked(self, name: str) -> int:
        """Queries received for ``name``, all types."""
        key = name.rstrip(".").lower()
        with self._lock:
            return sum(n for (qname, _), n in self.queries.items() if qname == key)

    def total(self) -> int:
        """Queries received, all names and types."""
        with self._lock:
            return sum(self.queries.values())

    def answer(self, wire: bytes) -> bytes | None:
        query = dns.message.from_wire(wire)
        question = query.question[0]
        name = question.name.to_text().rstrip(".").lower()
        with self._lock:
            self.queries[(name, dns.rdatatype.to_text(question.rdtype))] += 1
        if self.down or name in self.silent:
            return None
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        if self.failing:
            response.flags &= ~dns.flags.AA
            response.set_rcode(dns.rcode.SERVFAIL)
        elif name in self.missing:
            response.set_rcode(dns.rcode.NXDOMAIN)
            self._soa(response, self.missing[name])
        elif name in self.records:
            addresses, ttl = self.records[name]
            family = 4 if question.rdtype == dns.rdatatype.A else 6
            matching = [a for a in addresses if ipaddress.ip_address(a).version == family]
            if matching:
                response.answer.append(
                    dns.rrset.from_text_list(
                        question.name,
                        ttl,
                        dns.rdataclass.IN,
                        question.rdtype,
                        matching,
                    )
                )
            else:
                self._soa(response, ttl)
        else:
            response.set_rcode(dns.rcode.REFUSED)
        return response.to_wire()

    @staticmethod
    def _soa(response: dns.message.Message, minimum: int) -> None:
        response.authority.append(
            dns.rrset.from_text(
                ZONE,
                3600,
                "IN",
                "SOA",
                f"ns.{ZONE} admin.{ZONE} 1 7200 900 1209600 {minimum}",
            )
        )


@contextlib.contextmanager
def dns_server(ip: str = "127.0.0.53") -> Iterator[DnsServer]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((ip, 0))
    server = DnsServer(ip=ip, port=int(sock.getsockname()[1]))
    stop = threading.Event()

    def serve() -> None:
        sock.settimeout(0.05)
        while not stop.is_set():
            try:
                wire, peer = sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            reply = server.answer(wire)
            if reply is not None:
                sock.sendto(reply, peer)

    thread = threading.Thread(target=serve, name=f"dns {ip}", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        thread.join(5)
        sock.close()
