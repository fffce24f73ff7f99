"""The fetcher's DNS: an asynchronous stub resolver with a bounded cache that keeps TTLs.

The system resolver (``getaddrinfo``) is the wrong tool for a crawl that runs for
months. It blocks, so asyncio runs it in the default thread pool, where a lookup that
never gets an answer holds a thread for the libc timeout times its attempts; it keeps
no cache inside a container (no nscd); and since a host's keep-alive connection
(2 s) ends long before the politeness gap (10 s) does, every request to a host would
resolve its name again.

``DnsResolver`` asks the nameservers itself, on the event loop, through dnspython
(UDP with a TCP retry on truncation, ``/etc/resolv.conf``, SOA negative TTLs), and:

* caches each answer for its TTL, clamped to ``[min_ttl, max_ttl]``: a TTL of 0 would
  send a query per request, and a week-long one would keep a moved site's old
  address;
* caches "no such name" (NXDOMAIN) and "no address" (NODATA) for the zone's negative
  TTL (RFC 2308: the SOA's TTL or minimum, whichever is lower), clamped to
  ``[min_ttl, max_negative_ttl]``; a failure to get any answer (timeout, SERVFAIL)
  is not cached: it says nothing about the name;
* keeps at most ``cache_entries`` names, least recently used first out;
* lets ``max_concurrent`` queries out at once and ends each lookup after ``timeout``;
* asks once for a name that several jobs want at the same moment.

Names are absolute: the ``search`` list of resolv.conf is not applied (Kubernetes's
``ndots:5`` would otherwise send five queries for ``example.org`` before the real one),
and ``/etc/hosts`` is not read, except that ``localhost`` is loopback (RFC 6761).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import dns.asyncresolver
import dns.exception
import dns.message
import dns.nameserver
import dns.rdatatype
import dns.resolver

from trove_fetcher.errors import DnsFailure, DnsTimeout, NameNotFound
from trove_schema.settings import FetcherSettings

_LOCALHOST = ("127.0.0.1", "::1")


@dataclass(frozen=True, kw_only=True, slots=True)
class DnsConfig:
    """How the fetcher resolves names (``TROVE_DNS_*``)."""

    #: ``ip`` or ``ip:port`` (``[v6]:port``); empty: the system's, from resolv.conf.
    nameservers: tuple[str, ...] = ()
    #: Longest one lookup (both address families, every nameserver) may take.
    timeout: float = 5.0
    max_concurrent: int = 64
    #: A cached name costs ~0.5 KB (name, a few addresses, expiry, LRU links): 10,000
    #: names are ~5 MB. A pod needs only the hosts it is crawling within a TTL; past
    #: that a miss costs one query, so the bound trades a little traffic for memory
    #: that cannot grow with the crawl.
    cache_entries: int = 10_000
    min_ttl: float = 30.0
    max_ttl: float = 3600.0
    max_negative_ttl: float = 300.0

    @classmethod
    def for_settings(cls, settings: FetcherSettings) -> DnsConfig:
        return cls(
            nameservers=settings.dns_nameservers,
            timeout=settings.dns_timeout_seconds,
            max_concurrent=settings.dns_concurrency,
            cache_entries=settings.dns_cache_entries,
            min_ttl=settings.dns_min_ttl_seconds,
            max_ttl=settings.dns_max_ttl_seconds,
            max_negative_ttl=settings.dns_max_negative_ttl_seconds,
        )


def parse_nameserver(text: str) -> tuple[str, int]:
    """``ip``, ``ip:port`` or ``[ipv6]:port`` -> (ip, port); raises ValueError."""
    text = text.strip()
    host, port = text, 53
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"nameserver {text!r} is not ip, ip:port or [ipv6]:port")
            port = int(rest[1:])
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
        port = int(port_text)
    ipaddress.ip_address(host)
    if not 0 < port < 65536:
        raise ValueError(f"nameserver {text!r}: port out of range")
    return host, port


@dataclass(frozen=True, slots=True)
class _Entry:
    addresses: tuple[str, ...]
    expires: float
    #: Why there are no addresses ("" for a positive answer).
    missing: str = ""

    def result(self, host: str) -> tuple[str, ...]:
        if self.missing:
            raise NameNotFound(f"cannot resolve {host}: {self.missing}")
        return self.addresses


@dataclass(frozen=True, slots=True)
class _Part:
    """One record type's answer: addresses (maybe none) and how long it holds."""

    addresses: tuple[str, ...]
    ttl: float
    nxdomain: bool = False


def _negative_ttl(response: object) -> float:
    if isinstance(response, dns.message.QueryMessage):
        with contextlib.suppress(dns.exception.DNSException):
            return float(response.resolve_chaining().minimum_ttl)
    return float(dns.message.NEGATIVE_TTL_WITHOUT_SOA)


class DnsResolver:
    """``await resolver(host, port)`` -> addresses (A first, then AAAA), cached.

    Raises ``NameNotFound`` (cached), ``DnsTimeout`` or ``DnsFailure`` (not cached).
    ``clock`` is a seam for tests: TTLs are measured on it.
    """

    def __init__(
        self,
        config: DnsConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config = config or DnsConfig()
        self._clock = clock
        if config.nameservers:
            self._resolver = dns.asyncresolver.Resolver(configure=False)
            self._resolver.nameservers = [
                dns.nameserver.Do53Nameserver(*parse_nameserver(ns)) for ns in config.nameservers
            ]
        else:
            self._resolver = dns.asyncresolver.Resolver(configure=True)
        # dnspython keeps its own cache only when given one: none here, ours is bounded.
        self._resolver.cache = None
        self._slots = asyncio.Semaphore(config.max_concurrent)
        self._cache: OrderedDict[str, _Entry] = OrderedDict()
        self._pending: dict[str, asyncio.Task[_Entry]] = {}
        #: Queries sent (one per record type), for the metrics and the tests.
        self.queries = 0

    @property
    def cached(self) -> int:
        """Names in the cache (a property, not ``__len__``: an empty cache is not false)."""
        return len(self._cache)

    async def __call__(self, host: str, port: int) -> list[str]:
        return list(await self.lookup(host))

    async def lookup(self, host: str) -> tuple[str, ...]:
        name = host.strip().rstrip(".").lower()
        if name == "localhost" or name.endswith(".localhost"):
            return _LOCALHOST
        entry = self._cache.get(name)
        if entry is not None:
            if entry.expires > self._clock():
                self._cache.move_to_end(name)
                return entry.result(host)
            del self._cache[name]
        task = self._pending.get(name)
        if task is None:
            task = asyncio.create_task(self._resolve(name), name=f"dns {name}")
            self._pending[name] = task
            task.add_done_callback(lambda done: self._settle(name, done))
        # Shielded: one job giving up (its own timeout) does not cancel the lookup
        # that other jobs wait on; the lookup still ends at ``config.timeout``.
        entry = await asyncio.shield(task)
        return entry.result(host)

    def _settle(self, name: str, task: asyncio.Task[_Entry]) -> None:
        self._pending.pop(name, None)
        if task.cancelled() or task.exception() is not None:
            return
        self._cache[name] = task.result()
        self._cache.move_to_end(name)
        while len(self._cache) > self.config.cache_entries:
            self._cache.popitem(last=False)

    async def _resolve(self, name: str) -> _Entry:
        config = self.config
        try:
            async with asyncio.timeout(config.timeout):
                async with self._slots:
                    v4, v6 = await asyncio.gather(
                        self._ask(name, dns.rdatatype.A), self._ask(name, dns.rdatatype.AAAA)
                    )
        except TimeoutError:
            raise DnsTimeout(f"resolving {name} timed out after {config.timeout:g} s") from None
        now = self._clock()
        addresses = v4.addresses + v6.addresses
        if addresses:
            ttl = min(part.ttl for part in (v4, v6) if part.addresses)
            ttl = min(max(ttl, config.min_ttl), config.max_ttl)
            return _Entry(addresses, now + ttl)
        missing = "no such name" if v4.nxdomain or v6.nxdomain else "no address"
        ttl = min(v4.ttl, v6.ttl)
        ttl = min(max(ttl, config.min_ttl), config.max_negative_ttl)
        return _Entry((), now + ttl, missing)

    async def _ask(self, name: str, rdtype: dns.rdatatype.RdataType) -> _Part:
        self.queries += 1
        try:
            answer = await self._resolver.resolve(
                name,
                rdtype,
                search=False,
                raise_on_no_answer=False,
                lifetime=self.config.timeout,
            )
        except dns.resolver.NXDOMAIN as exc:
            responses = exc.kwargs.get("responses") or {}
            return _Part((), _negative_ttl(next(iter(responses.values()), None)), nxdomain=True)
        except dns.exception.Timeout as exc:
            raise DnsTimeout(f"resolving {name} timed out: {exc}") from None
        except dns.exception.DNSException as exc:
            raise DnsFailure(f"cannot resolve {name}: {exc}") from None
        if answer.rrset is None:
            return _Part((), float(answer.chaining_result.minimum_ttl))
        addresses = tuple(str(getattr(record, "address", "")) for record in answer.rrset)
        return _Part(addresses, float(answer.chaining_result.minimum_ttl))
