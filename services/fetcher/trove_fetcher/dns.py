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
* lets ``max_concurrent`` lookups out at once and ends each after ``timeout``, counted
  from when it has its query slot: a name queued behind slow ones (a blogroll of lame
  delegations) is not timed out for their slowness. A lookup that waits longer than
  ``queue_timeout`` for a slot is the pod's trouble (``PodExhausted``), not the host's;
* asks for A and AAAA side by side, and takes what answered: a host whose nameserver
  mishandles AAAA (a timeout, SERVFAIL) keeps its IPv4 addresses. Once A has answered
  with addresses, AAAA has ``RESOLUTION_DELAY`` (50 ms, RFC 8305) more, not the whole
  ``timeout``: a dropped AAAA query does not hold up every lookup of the name. Only
  when neither family answered does the lookup fail. An answer with a family missing
  is cached no longer than a negative answer, so the missing family is asked again soon;
* asks once for a name that several jobs want at the same moment;
* tells the pod's trouble from the host's. A lookup that gets no answer (a timeout,
  SERVFAIL) is the host's (a lame delegation, a dead nameserver of its own) when the
  nameservers answered anything since it was sent; else they are asked for the root
  zone, which every recursive resolver knows. No answer to that either, or SERVFAIL,
  and it is ``ResolverAway``: the cluster's DNS is restarting, or the pod lost its
  network, and nothing is recorded against the host. For ``recheck`` seconds, names
  not in the cache then fail at once, without a query; the next lookup after that asks
  again. The fetcher hands such work back, before it takes a lease;
* tells the pod's own shortage of descriptors or buffers (EMFILE, ENOBUFS, ...) when
  it opens a query's socket: ``PodExhausted``, handed back too, nothing cached.

Names are absolute: the ``search`` list of resolv.conf is not applied (Kubernetes's
``ndots:5`` would otherwise send five queries for ``example.org`` before the real one),
and ``/etc/hosts`` is not read, except that ``localhost`` is loopback (RFC 6761).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import dns.asyncquery
import dns.asyncresolver
import dns.exception
import dns.message
import dns.nameserver
import dns.rcode
import dns.rdatatype
import dns.resolver

from trove_fetcher.errors import (
    DnsError,
    DnsFailure,
    DnsTimeout,
    NameNotFound,
    NetworkAway,
    PodExhausted,
    ResolverAway,
)
from trove_schema.addresses import parse_nameserver
from trove_schema.metrics import NAMESERVERS_AWAY
from trove_schema.settings import FetcherSettings

log = logging.getLogger(__name__)

#: Addresses kept of one record type's answer. A name of thousands (a 64 KB answer over
#: TCP: ~450 KiB cached, each checked at every connection) is no site's: two of a
#: family are tried (``transport._tried``), and every one kept is checked.
MAX_ADDRESSES = 16

#: How long AAAA is waited for once A has answered with addresses (RFC 8305's
#: "resolution delay"): a nameserver that drops AAAA queries, as some middleboxes and
#: lame servers do, would otherwise make every lookup of its names wait the whole
#: ``timeout`` for an IPv4 answer already in hand.
RESOLUTION_DELAY = 0.05

_LOCALHOST = ("127.0.0.1", "::1")


@dataclass(frozen=True, kw_only=True, slots=True)
class DnsConfig:
    """How the fetcher resolves names (``TROVE_DNS_*``)."""

    #: ``ip`` or ``ip:port`` (``[v6]:port``); empty: the system's, from resolv.conf.
    nameservers: tuple[str, ...] = ()
    #: Longest one lookup (both address families, every nameserver) may take, once it
    #: has one of the ``max_concurrent`` query slots.
    timeout: float = 5.0
    max_concurrent: int = 64
    #: Longest a lookup waits for a query slot. A slot is held one ``timeout`` at most,
    #: so past that wait the pod asks more than its slots can carry: its trouble, and
    #: the work is handed back rather than timed out against a healthy host.
    queue_timeout: float = 5.0
    #: A cached name costs ~0.5 KB (name, a few addresses, expiry, LRU links): 10,000
    #: names are ~5 MB. A pod needs only the hosts it is crawling within a TTL; past
    #: that a miss costs one query, so the bound trades a little traffic for memory
    #: that cannot grow with the crawl.
    cache_entries: int = 10_000
    min_ttl: float = 30.0
    max_ttl: float = 3600.0
    max_negative_ttl: float = 300.0
    #: How long nameservers found away are taken to be away (names not cached fail at
    #: once meanwhile) before a lookup asks them again.
    recheck: float = 5.0

    @classmethod
    def for_settings(cls, settings: FetcherSettings) -> DnsConfig:
        return cls(
            nameservers=settings.dns_nameservers,
            timeout=settings.dns_timeout_seconds,
            max_concurrent=settings.dns_concurrency,
            queue_timeout=settings.dns_timeout_seconds,
            cache_entries=settings.dns_cache_entries,
            min_ttl=settings.dns_min_ttl_seconds,
            max_ttl=settings.dns_max_ttl_seconds,
            max_negative_ttl=settings.dns_max_negative_ttl_seconds,
            recheck=settings.dns_recheck_seconds,
        )


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


def _name(host: str) -> str:
    return host.strip().rstrip(".").lower()


def _negative_ttl(response: object) -> float:
    if isinstance(response, dns.message.QueryMessage):
        with contextlib.suppress(dns.exception.DNSException):
            return float(response.resolve_chaining().minimum_ttl)
    return float(dns.message.NEGATIVE_TTL_WITHOUT_SOA)


class DnsResolver:
    """``await resolver(host, port)`` -> addresses (A first, then AAAA), cached.

    Raises ``NameNotFound`` (cached), ``DnsTimeout`` or ``DnsFailure`` (not cached),
    ``ResolverAway`` when the nameservers answer nothing at all, or ``PodExhausted``
    when the pod has no query slot or socket to ask with. ``clock`` is a seam for
    tests: TTLs are measured on it.
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
            self._servers = [parse_nameserver(ns) for ns in config.nameservers]
            self._resolver.nameservers = [
                dns.nameserver.Do53Nameserver(*server) for server in self._servers
            ]
        else:
            self._resolver = dns.asyncresolver.Resolver(configure=True)
            port = self._resolver.port
            self._servers = [(str(ns), port) for ns in self._resolver.nameservers]
        # dnspython keeps its own cache only when given one: none here, ours is bounded.
        self._resolver.cache = None
        self._slots = asyncio.Semaphore(config.max_concurrent)
        self._cache: OrderedDict[str, _Entry] = OrderedDict()
        self._pending: dict[str, asyncio.Task[_Entry]] = {}
        #: When the nameservers last answered (on ``clock``): a name or no such name.
        self._answered_at = -math.inf
        #: Since when, and why, they are taken to be away; None while they answer.
        self._away: tuple[float, str] | None = None
        self._probe: asyncio.Task[str | None] | None = None

    @property
    def longest(self) -> float:
        """The longest a lookup takes: its wait for a slot, its queries, and the question
        to the root zone that tells whose trouble a failure is."""
        return self.config.queue_timeout + 2 * self.config.timeout

    @property
    def cached(self) -> int:
        """Names in the cache (a property, not ``__len__``: an empty cache is not false)."""
        return len(self._cache)

    async def __call__(self, host: str, port: int) -> list[str]:
        return list(await self.lookup(host))

    def away(self, host: str) -> ResolverAway | None:
        """What a lookup of ``host`` would meet now without a query: ``ResolverAway``
        while the nameservers are taken to be away and the name is not cached."""
        if self._away is None or self._clock() - self._away[0] >= self.config.recheck:
            return None
        name = _name(host)
        if name == "localhost" or name.endswith(".localhost"):
            return None
        entry = self._cache.get(name)
        if entry is not None and entry.expires > self._clock():
            return None
        return ResolverAway(self._away[1], retry_after=self.config.recheck)

    async def lookup(self, host: str) -> tuple[str, ...]:
        name = _name(host)
        if name == "localhost" or name.endswith(".localhost"):
            return _LOCALHOST
        entry = self._cache.get(name)
        if entry is not None:
            if entry.expires > self._clock():
                self._cache.move_to_end(name)
                return entry.result(host)
            del self._cache[name]
        away = self.away(name)
        if away is not None:
            raise away
        task = self._pending.get(name)
        if task is None:
            task = asyncio.create_task(self._resolve(name), name=f"dns {name}")
            self._pending[name] = task
            task.add_done_callback(lambda done: self._settle(name, done))
        # Shielded: one job giving up (its own timeout) does not cancel the lookup
        # that other jobs wait on; the lookup still ends within ``longest``.
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
        async with self._slot(name):
            sent = self._clock()
            answers = await self._ask_both(name)
        try:
            return self._entry(answers)
        except (DnsTimeout, DnsFailure) as exc:
            if self._answered_at < sent:  # nothing else answered meanwhile: is it us?
                why = await self._nameservers_silent()
                if why is not None:
                    raise ResolverAway(
                        f"resolving {name}: {exc}; {why}", retry_after=self.config.recheck
                    ) from None
            raise

    async def _ask_both(self, name: str) -> list[_Part | BaseException]:
        """The A and AAAA answers (in that order), each an answer or its error, asked side
        by side. Once A has addresses, AAAA has ``RESOLUTION_DELAY`` more to answer; past
        that it counts as a family that failed, so the entry is cached no longer than a
        negative answer: a slow but working AAAA is asked again within minutes, not
        hidden for the A record's hour. Without A's addresses, AAAA is all there is and
        gets its whole ``timeout``."""
        a = asyncio.create_task(self._ask(name, dns.rdatatype.A), name=f"dns A {name}")
        aaaa = asyncio.create_task(self._ask(name, dns.rdatatype.AAAA), name=f"dns AAAA {name}")
        try:
            await asyncio.wait((a,))
            if a.exception() is None and a.result().addresses:
                await asyncio.wait((aaaa,), timeout=RESOLUTION_DELAY)
            else:
                await asyncio.wait((aaaa,))
        finally:
            # Awaited to its end, so the query's socket is closed before the slot is let go.
            for task in (a, aaaa):
                task.cancel()
            await asyncio.wait((a, aaaa))
        if aaaa.cancelled():
            late = f"no AAAA answer for {name} within {RESOLUTION_DELAY:g} s of its A answer"
            return [a.result(), DnsTimeout(late)]
        return [task.exception() or task.result() for task in (a, aaaa)]

    @contextlib.asynccontextmanager
    async def _slot(self, name: str) -> AsyncIterator[None]:
        """One of the query slots, waited for ``queue_timeout`` at most."""
        config = self.config
        try:
            async with asyncio.timeout(config.queue_timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise PodExhausted(
                f"resolving {name}: no DNS query slot free for {config.queue_timeout:g} s"
                f" ({config.max_concurrent} lookups in flight)",
                retry_after=config.timeout,
            ) from None
        try:
            yield
        finally:
            self._slots.release()

    def _entry(self, answers: Sequence[_Part | BaseException]) -> _Entry:
        """The cache entry for the A and AAAA answers (in that order), or the error."""
        config = self.config
        parts = [answer for answer in answers if isinstance(answer, _Part)]
        failures = [answer for answer in answers if not isinstance(answer, _Part)]
        for failure in failures:
            if not isinstance(failure, DnsError | NetworkAway):
                raise failure  # not an answer of DNS: as it came
        now = self._clock()
        if parts:
            self._answering(now)
        addresses = tuple(itertools.chain.from_iterable(part.addresses for part in parts))
        if addresses:
            ttl = min(part.ttl for part in parts if part.addresses)
            ttl = min(max(ttl, config.min_ttl), config.max_ttl)
            if failures:
                # The family that failed says nothing about the name: asked again as soon
                # as a "no such record" would be, not an hour later.
                ttl = min(ttl, config.max_negative_ttl)
            return _Entry(addresses, now + ttl)
        nxdomain = any(part.nxdomain for part in parts)
        if failures and not nxdomain:
            # The pod's shortage first: the host's failure is not known while it lasts.
            raise next((f for f in failures if isinstance(f, NetworkAway)), failures[0])
        ttl = min(part.ttl for part in parts)
        ttl = min(max(ttl, config.min_ttl), config.max_negative_ttl)
        return _Entry((), now + ttl, "no such name" if nxdomain else "no address")

    def _answering(self, now: float) -> None:
        self._answered_at = now
        if self._away is not None:
            self._away = None
            NAMESERVERS_AWAY.set(0)
            log.info("the nameservers answer again: work that needs a name goes on")

    async def _nameservers_silent(self) -> str | None:
        """Why the nameservers are taken to be away, asked once for every lookup that
        failed at the same moment; None when one of them answers."""
        if self._probe is None or self._probe.done():
            self._probe = asyncio.create_task(self._ask_root(), name="dns root")
        return await asyncio.shield(self._probe)

    async def _ask_root(self) -> str | None:
        query = dns.message.make_query(".", dns.rdatatype.NS)

        async def ask(address: str, port: int) -> str | None:
            try:
                response = await dns.asyncquery.udp(
                    query, address, timeout=self.config.timeout, port=port
                )
            except (dns.exception.DNSException, OSError) as exc:
                return f"{address}:{port} {type(exc).__name__}"
            rcode = response.rcode()
            # Any other answer (NOERROR, REFUSED, NXDOMAIN) is a server that works.
            return f"{address}:{port} SERVFAIL" if rcode == dns.rcode.SERVFAIL else None

        failures = await asyncio.gather(*(ask(*server) for server in self._servers))
        now = self._clock()
        if not self._servers or any(why is None for why in failures):
            self._answering(now)
            return None
        tried = ", ".join(why for why in failures if why)
        why = f"no nameserver answers for the root zone ({tried})"
        if self._away is None:
            NAMESERVERS_AWAY.set(1)
            log.warning("%s: work that needs a name not cached waits for them", why)
        self._away = (now, why)
        return why

    async def _ask(self, name: str, rdtype: dns.rdatatype.RdataType) -> _Part:
        timeout = self.config.timeout
        try:
            # Each family bounded on its own: one that hangs does not take the other's
            # answer with it.
            async with asyncio.timeout(timeout):
                answer = await self._resolver.resolve(
                    name,
                    rdtype,
                    search=False,
                    raise_on_no_answer=False,
                    lifetime=timeout,
                )
        except TimeoutError:
            raise DnsTimeout(f"resolving {name} timed out after {timeout:g} s") from None
        except dns.resolver.NXDOMAIN as exc:
            responses = exc.kwargs.get("responses") or {}
            return _Part((), _negative_ttl(next(iter(responses.values()), None)), nxdomain=True)
        except dns.exception.DNSException as exc:
            exhausted = _exhausted(exc)
            if exhausted is not None:
                raise exhausted from exc
            if isinstance(exc, dns.exception.Timeout):
                raise DnsTimeout(f"resolving {name} timed out: {exc}") from None
            raise DnsFailure(f"cannot resolve {name}: {exc}") from None
        if answer.rrset is None:
            return _Part((), float(answer.chaining_result.minimum_ttl))
        records = itertools.islice(answer.rrset, MAX_ADDRESSES)
        addresses = tuple(str(getattr(record, "address", "")) for record in records)
        return _Part(addresses, float(answer.chaining_result.minimum_ttl))


def _exhausted(exc: dns.exception.DNSException) -> PodExhausted | None:
    """The pod's shortage among the errors dnspython met asking each nameserver (it
    takes a nameserver whose socket could not be opened for a broken one)."""
    for error in exc.kwargs.get("errors") or ():
        for item in error if isinstance(error, tuple) else (error,):
            found = PodExhausted.of(item) if isinstance(item, BaseException) else None
            if found is not None:
                return found
    return None
