"""The fetcher's HTTP client: every TCP connection goes to an address that was checked.

``GuardedNetworkBackend`` sits under httpcore's connection pool. For each new
connection it resolves the host once (``TROVE_RESOLVE`` static entries, like curl's
``--resolve``, else ``trove_fetcher.dns``: its own cached resolver), refuses the host
if *any* of its addresses is blocked by the ``AddressPolicy``, and then connects to
the checked IP itself (on ``trove_fetcher.streams``: asyncio's own streams, not
anyio's). Nothing resolves the name again between the check and the connect, so a DNS
answer cannot change in between (DNS rebinding). The Host header and the TLS server
name (SNI and certificate check) stay the URL's hostname, because httpcore takes them
from the request, not from the socket.

``GuardedTransport`` is an httpx transport over several httpcore pools, one chosen
per origin by hash. httpcore's pool scans all its connections on every request and
release, so one big pool costs CPU per request that grows with its size (httpx#3215);
``bench/bench_transport.py`` measures it. Its connections are ``_KeptConnection``s,
which the pool cannot close under a request that is using them (httpcore#1110: the
``ReadError`` on pages the server had answered, at high concurrency).

``build_client`` makes the one ``httpx.AsyncClient`` a fetcher pod uses: no proxies
from the environment, no redirects followed by httpx (``trove_fetcher.http`` checks
each hop), no cookies kept, timeouts and the User-Agent from ``FetcherSettings``.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.cookiejar
import logging
import math
import re
import resource
import socket
import ssl
import struct
import time
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import httpcore
import httpx

from trove_fetcher.addresses import AddressPolicy
from trove_fetcher.dns import DnsConfig, DnsResolver
from trove_fetcher.egress import EgressConfig, EgressWatch
from trove_fetcher.errors import (
    BlockedAddress,
    DnsError,
    DnsTimeout,
    NetworkAway,
    PodExhausted,
    ResolverAway,
)
from trove_fetcher.streams import AsyncioBackend
from trove_fetcher.useragent import user_agent
from trove_schema.addresses import parse_address, resolve_entry
from trove_schema.exclusions import NO_EXCLUSIONS, Exclusions
from trove_schema.settings import FetcherSettings

log = logging.getLogger(__name__)

#: ``async (host, port) -> addresses``: how a hostname becomes IP literals.
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]

_LEGACY_IPV4 = re.compile(r"[0-9a-fA-FxX.]+")


def legacy_ipv4(host: str) -> str | None:
    """``167772161``, ``0x7f.1``, ``127.1``: IPv4 in the forms inet_aton (and browsers)
    read, or None. getaddrinfo reads them too, so they must never reach DNS unchecked.
    """
    if not _LEGACY_IPV4.fullmatch(host):
        return None
    try:
        return socket.inet_ntoa(socket.inet_aton(host))
    except OSError:
        return None


def literal_address(host: str) -> str | None:
    """The address ``host`` writes, spelt as a rule or a canonical URL spells it (IPv6
    compressed, IPv4 dotted-quad, ``legacy_ipv4``'s forms read), or None for a name.

    An IPv4 address with a trailing dot (``127.0.0.1.``, as a redirect may write it) is
    that address, as URLs read it: not a name to send to DNS."""
    try:
        return str(parse_address(host))
    except ValueError:
        pass
    bare = host.removesuffix(".") if host.endswith(".") and not host.endswith("..") else host
    return legacy_ipv4(bare)


def _normalize_host(host: str) -> str:
    return host.strip().rstrip(".").lower()


@dataclass(frozen=True, slots=True)
class StaticHosts:
    """``host=ip`` entries (``TROVE_RESOLVE``) answered without the system resolver.

    ``*.trove.test=127.0.0.1`` covers every subdomain of trove.test (not trove.test
    itself); an exact entry wins over a wildcard. The addresses are still checked.
    """

    exact: dict[str, str] = field(default_factory=dict)
    #: (".suffix", ip), longest suffix first.
    wildcards: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> StaticHosts:
        exact: dict[str, str] = {}
        wildcards: list[tuple[str, str]] = []
        for entry in entries:
            name, address = resolve_entry(entry)
            name = _normalize_host(name)
            if name.startswith("*."):
                wildcards.append((name[1:], address))
            else:
                exact[name] = address
        wildcards.sort(key=lambda item: len(item[0]), reverse=True)
        return cls(exact, tuple(wildcards))

    def lookup(self, host: str) -> str | None:
        host = _normalize_host(host)
        if host in self.exact:
            return self.exact[host]
        for suffix, address in self.wildcards:
            if host.endswith(suffix):
                return address
        return None


#: A body stops once more than this many times the cap came over the network (the
#: body reader's count, ``http``). A stream carries more than it holds only by its
#: framing: 5 bytes a stored block, and as many a flush, which a server streaming a
#: page may do every few dozen bytes (+9% at every 64 bytes of text that does not
#: compress).
MOST_CARRIED = 2
#: What one answer may carry on the wire besides ``MOST_CARRIED`` times the body cap
#: (``_MeteredStream``): its headers (h11 reads 100 KB at most) and a few informational
#: answers.
ANSWER_OVERHEAD_BYTES = 1024 * 1024


class _MeteredStream(httpcore.AsyncNetworkStream):
    """A connection that carries at most ``most`` bytes in answer to one request (the
    count starts again as the next request is written). The body reader counts only
    the body: httpcore reads informational answers (a 103, then another, for as long as
    they come) before the final one, and h11 drops a chunk's extensions unread, so a
    host could keep a core busy for the whole request timeout, or send gigabytes."""

    __slots__ = ("_carried", "_inner", "_most")

    def __init__(self, inner: httpcore.AsyncNetworkStream, most: int) -> None:
        self._inner = inner
        self._most = most
        self._carried = 0

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        data = await self._inner.read(max_bytes, timeout)
        self._carried += len(data)
        if self._carried > self._most:
            raise httpcore.ReadError(f"more than {self._most} bytes in answer to one request")
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        self._carried = 0
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> httpcore.AsyncNetworkStream:
        tls = await self._inner.start_tls(ssl_context, server_hostname, timeout)
        return _MeteredStream(tls, self._most)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class GuardedNetworkBackend(httpcore.AsyncNetworkBackend):
    """Resolves, checks every address, then connects the inner backend to the IP.

    Raises ``BlockedAddress`` (not an httpcore error, so httpx lets it through
    untouched) before any connection attempt when an address is refused.
    """

    def __init__(
        self,
        policy: AddressPolicy,
        *,
        static: StaticHosts | None = None,
        resolver: Resolver | None = None,
        inner: httpcore.AsyncNetworkBackend | None = None,
        exclusions: Exclusions = NO_EXCLUSIONS,
        egress: EgressWatch | None = None,
        most_carried: int | None = None,
    ) -> None:
        self.policy = policy
        self.exclusions = exclusions
        #: The most one answer carries on the wire (``_MeteredStream``); None: no bound.
        self.most_carried = most_carried
        #: Every TCP connection's outcome, to tell the pod's egress away from the hosts'.
        self.egress = EgressWatch() if egress is None else egress
        self._static = static or StaticHosts()
        self._resolver = DnsResolver() if resolver is None else resolver
        self._inner = inner or AsyncioBackend()

    def network_away(self, host: str) -> NetworkAway | None:
        """Before work for ``host`` takes its lease: ``ResolverAway`` when it needs a
        lookup that the pod's nameservers, known to be away, cannot answer now
        (``DnsResolver.away``); ``EgressAway`` while the pod's connections fail and it is
        not the one let through to find out (``EgressWatch.away``); None when it may go."""
        away = getattr(self._resolver, "away", None)
        if away is not None and self._addressed(host) is None:
            found: ResolverAway | None = away(host)
            if found is not None:
                return found
        return self.egress.away()

    def _addressed(self, host: str) -> str | None:
        """The address ``host`` has without a lookup: a literal, or a static entry."""
        return literal_address(host) or self._static.lookup(host)

    async def resolve(self, host: str, port: int) -> list[str]:
        """The checked addresses for ``host``: raises BlockedAddress if any is refused."""
        # Before the name is looked up: an excluded host gets no traffic at all. An
        # address is excluded however it is written (``1572395042`` is 93.184.216.34,
        # and reaches it); a name by its name, whatever address it has.
        rule = self.exclusions.covering(host.lower().rstrip("."))
        literal = literal_address(host)
        if rule is None and literal is not None:
            rule = self.exclusions.covering(literal)
        if rule is not None:
            raise BlockedAddress(host, host, f"excluded by the operator: {rule}")
        known = self._addressed(host)
        if known is not None:
            addresses = [known]
        else:
            try:
                addresses = list(await self._resolver(host, port))
            except NetworkAway:
                raise  # the pod's trouble, not the host's: passed through httpx untouched
            except DnsTimeout as exc:
                raise httpcore.ConnectTimeout(str(exc)) from exc
            except DnsError as exc:
                raise httpcore.ConnectError(str(exc)) from exc
            except OSError as exc:
                error = httpcore.ConnectError(f"cannot resolve {host}: {exc}")
                raise PodExhausted.of(exc) or error from exc
        if not addresses:
            raise httpcore.ConnectError(f"cannot resolve {host}: no address")
        # All of them, not just the first: a name with one private record among public
        # ones is a rebinding setup, not a site.
        for address in addresses:
            self.policy.check(address, host=host)
        return addresses

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        # The connect timeout is the connection's own, counted once the name has its
        # addresses: a lookup that waited for a query slot behind slow ones (the pod's
        # load, which the resolver bounds and hands back) must not time out a healthy
        # host's connection. The lookup still has a bound: its resolver's longest, when
        # it says, and one connect timeout on top.
        limit = None if timeout is None else timeout + getattr(self._resolver, "longest", 0.0)
        try:
            async with asyncio.timeout(limit):
                addresses = await self.resolve(host, port)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"resolving {host} timed out") from None
        deadline = None if timeout is None else time.monotonic() + timeout
        error: Exception | None = None
        for address in _tried(addresses):
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                stream = await self._inner.connect_tcp(
                    address,
                    port,
                    timeout=remaining,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except httpcore.ConnectTimeout as exc:
                error = exc
                break
            except httpcore.ConnectError as exc:
                error = exc
            else:
                self.egress.connected(address)
                most = self.most_carried
                return stream if most is None else _MeteredStream(stream, most)
        assert error is not None
        away = self.egress.failed(address, error)
        if away is not None:
            raise away from error
        raise error

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("the fetcher does not connect to unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


# Most specific first, as httpx's own transport maps them.
_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


@contextlib.contextmanager
def _httpx_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for source, target in _ERRORS:
            if isinstance(exc, source):
                raise target(str(exc)) from exc
        raise


#: What a closed response stream holds instead of its connection.
_CLOSED: tuple[bytes, ...] = ()


#: ``struct tcp_info`` (linux/tcp.h): ms since the last data segment was sent and since
#: the last one was received, as ``__u32``s at these offsets.
_TCP_INFO = getattr(socket, "TCP_INFO", None)
_TCP_INFO_LEN = 60
_LAST_DATA_SENT, _LAST_DATA_RECV = 44, 52
#: How much longer than the real one a "how long ago" of those may be, taken off every
#: one so that a moment worked out from it is never earlier than the real one. The
#: kernel keeps the times in jiffies (1000/HZ ms; HZ is 100 to 1000), and a segment is
#: stamped with the jiffies of its arrival, which run behind when the CPU that counts
#: them is not run (a busy node, a VM whose vCPU is descheduled): the kernel takes the
#: count over on another CPU after five ticks stalled. Six ticks at the coarsest HZ:
#: with one jiffy taken off, an answer's end could be placed tens of ms early, and its
#: host's next request as much inside the gap. The cost: an answer read within this of
#: its arrival counts from the read, up to 60 ms of rest the host did not ask for.
_STAMP_SLACK = 0.060

#: The response extension holding the response's ``AnswerTime``.
ANSWER_TIME = "trove.answer_time"


class AnswerTime:
    """How long the host took to answer, as the kernel saw it: from the last byte of the
    request sent to the last byte of the response received (so far, when the body is
    not read), in seconds; None where the kernel does not say (not Linux, not TCP).

    The pod's own clock would count the time its event loop took to get round to the
    socket: under a burst of work that is tens to hundreds of milliseconds, and the
    learned gap (``host_gap``: ten times the answer time) would take the pod's lag for
    a slow host. The kernel stamps both ends as the segments pass, whatever the loop
    is doing. Read once, when the response ends; the socket is not kept.

    ``received_at`` is when (``time.time()``) the last byte arrived, for a body read to
    its end: the moment a host's gap counts from (``FetchResult.ended_at``). A
    response closed before its end has none: its host may still be sending. A body that
    ends with the connection's close (``until_close``: no length, not chunked) ends at
    the host's FIN, which carries no data and so no stamp: a host that held the socket
    for seconds after its last byte is done only then, and the pod's read of the end,
    just after it, is the moment."""

    __slots__ = ("_socket", "_until_close", "received_at", "seconds")

    def __init__(self, sock: object, *, until_close: bool = False) -> None:
        self._socket: object | None = sock
        self._until_close = until_close
        self.seconds: float | None = None
        self.received_at: float | None = None

    def read(self, *, whole: bool = False) -> None:
        sock, self._socket = self._socket, None
        getsockopt = getattr(sock, "getsockopt", None)
        if getsockopt is None or _TCP_INFO is None:
            return
        try:
            info = getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _TCP_INFO_LEN)
            (sent_ago,) = struct.unpack_from("=I", info, _LAST_DATA_SENT)
            (received_ago,) = struct.unpack_from("=I", info, _LAST_DATA_RECV)
        except (OSError, struct.error, TypeError):
            return
        self.seconds = max(0, sent_ago - received_ago) / 1000.0
        if whole:
            now = time.time()
            early = 0.0 if self._until_close else max(0.0, received_ago / 1000.0 - _STAMP_SLACK)
            self.received_at = now - early


def _ends_with_the_close(method: str, status: int, headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether a response's body is delimited by the connection's close (HTTP/1.1's
    last resort: a body with neither ``Content-Length`` nor ``Transfer-Encoding``)."""
    if method == "HEAD" or status < 200 or status in (204, 304):
        return False
    names = {name.lower() for name, _ in headers}
    return b"content-length" not in names and b"transfer-encoding" not in names


class _ResponseStream(httpx.AsyncByteStream):
    """httpcore's body as httpx's; closed, it lets go of the connection under it.

    httpx binds every response to its stream and the stream to the response, a
    reference cycle, so a response lives until the garbage collector's next full
    pass. Holding the body stream, it would hold the connection too (socket, TLS state,
    buffers): hundreds of closed connections to hosts visited once, kept for nothing.
    When the body ends (read to its end, or closed before), ``answer`` is read.
    """

    def __init__(self, stream: AsyncIterable[bytes], answer: AnswerTime) -> None:
        self._stream: AsyncIterable[bytes] | Iterable[bytes] = stream
        self._answer = answer

    async def __aiter__(self) -> AsyncIterator[bytes]:
        stream = self._stream
        if not isinstance(stream, AsyncIterable):
            return
        with _httpx_errors():
            async for part in stream:
                yield part
        self._answer.read(whole=True)

    async def aclose(self) -> None:
        stream, self._stream = self._stream, _CLOSED
        self._answer.read()
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            with _httpx_errors():
                await aclose()


#: How long an idle connection is kept for another request to its origin (seconds).
KEEPALIVE_EXPIRY = 2.0


@dataclass(frozen=True, kw_only=True, slots=True)
class PoolConfig:
    """How the transport pools connections (totals, split evenly across the shards)."""

    max_connections: int = 128
    max_keepalive_connections: int = 128
    keepalive_expiry: float = KEEPALIVE_EXPIRY
    #: Pools the connections are spread over, by origin hash (httpx#3215).
    shards: int = 4

    @classmethod
    def for_settings(cls, settings: FetcherSettings) -> PoolConfig:
        """The defaults measured in ``bench/bench_transport.py``.

        Room for a page and a robots.txt fetch per concurrent job. Shards of about 32
        connections keep httpcore's per-request scans short. Keep-alive covers every
        connection: below the pool size, httpcore (1.0.9) closes idle connections
        whenever the pool holds more connections *in total* than the keep-alive
        limit, and reconnects nearly every request.

        Every request to a domain (a page, robots.txt, each redirect hop) waits the
        domain's gap after the end of the previous response, and no gap is shorter
        than ``min_domain_delay_seconds``. When that floor is past the keep-alive
        expiry (the default 10 s against 2 s), no connection can ever serve a second
        request: kept, it only holds a socket, its TLS state and a pool slot until it
        expires. Then every connection closes with its response, and a crawl of many
        hosts, each visited once in a while, holds only the connections in use.
        """
        connections = max(2 * settings.concurrency, 16)
        reusable = settings.min_domain_delay_seconds < KEEPALIVE_EXPIRY
        return cls(
            max_connections=connections,
            max_keepalive_connections=connections if reusable else 0,
            keepalive_expiry=KEEPALIVE_EXPIRY if reusable else 0.0,
            shards=math.ceil(connections / 32),
        )


class _ReleasingStream:
    """A response body that tells its connection when the response is closed."""

    def __init__(self, stream: AsyncIterable[bytes], connection: _KeptConnection) -> None:
        self._stream = stream
        self._connection = connection

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._stream:
            yield part

    async def aclose(self) -> None:
        try:
            aclose = getattr(self._stream, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            await self._connection.released()


class _KeptConnection(httpcore.AsyncConnectionInterface):
    """A pooled connection that is never closed under a request using it.

    httpcore 1.0.9 hands an idle connection to a queued request, and the request starts
    on it only when its task next runs. If the keep-alive expiry passes in between (an
    event loop busy with hundreds of requests takes that long), another task's pass
    over the pool finds the connection expired and closes it, after the request was
    sent: the server answers 200 and the fetcher reads a closed socket, a ``ReadError``
    (``ClosedResourceError`` inside; httpcore#1110). Here a close asked for while a
    request is on the connection waits until that response is closed; an idle
    connection closes at once, and a request that had not started yet then gets
    ``ConnectionNotAvailable`` and another connection, with nothing sent.
    """

    def __init__(self, inner: httpcore.AsyncConnectionInterface, pool: _KeptPool) -> None:
        self._inner = inner
        self._pool = pool
        self._close_when_released = False

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        try:
            response = await self._inner.handle_async_request(request)
        except httpcore.ConnectionNotAvailable:
            # Another request holds the connection (the pool can hand one connection
            # to two queued requests in one pass): this one never ran on it.
            raise
        except BaseException:
            await self.released()
            raise
        assert isinstance(response.stream, AsyncIterable)
        return httpcore.Response(
            status=response.status,
            headers=response.headers,
            content=_ReleasingStream(response.stream, self),
            extensions=response.extensions,
        )

    async def released(self) -> None:
        if self._close_when_released:
            self._close_when_released = False
            await self._inner.aclose()

    async def aclose(self) -> None:
        inner = self._inner
        if self._pool.closing or inner.is_idle() or inner.is_closed():
            await inner.aclose()
        else:
            self._close_when_released = True

    def can_handle_request(self, origin: httpcore.Origin) -> bool:
        return self._inner.can_handle_request(origin)

    def is_available(self) -> bool:
        return self._inner.is_available()

    def has_expired(self) -> bool:
        return self._inner.has_expired()

    def is_idle(self) -> bool:
        return self._inner.is_idle()

    def is_closed(self) -> bool:
        return self._inner.is_closed()

    def info(self) -> str:
        return self._inner.info()

    def __repr__(self) -> str:
        return f"<kept {self._inner!r}>"


class _KeptPool(httpcore.AsyncConnectionPool):
    """httpcore's pool over ``_KeptConnection``s (``create_connection`` is its seam)."""

    closing = False

    def create_connection(self, origin: httpcore.Origin) -> httpcore.AsyncConnectionInterface:
        return _KeptConnection(super().create_connection(origin), self)

    async def aclose(self) -> None:
        self.closing = True
        await super().aclose()


class GuardedTransport(httpx.AsyncBaseTransport):
    """An httpx transport over ``config.shards`` httpcore pools on a guarded backend."""

    def __init__(
        self,
        network_backend: httpcore.AsyncNetworkBackend,
        *,
        config: PoolConfig | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        config = config or PoolConfig()
        if config.shards < 1:
            raise ValueError("a transport needs at least one pool")
        context = ssl_context or httpx.create_ssl_context(trust_env=False)
        per_pool = math.ceil(config.max_connections / config.shards)
        keepalive = math.ceil(config.max_keepalive_connections / config.shards)
        self._pools: tuple[httpcore.AsyncConnectionPool, ...] = tuple(
            _KeptPool(
                ssl_context=context,
                max_connections=per_pool,
                max_keepalive_connections=keepalive,
                keepalive_expiry=config.keepalive_expiry,
                http1=True,
                http2=False,
                retries=0,
                network_backend=network_backend,
            )
            for _ in range(config.shards)
        )

    def _pool(self, url: httpx.URL) -> httpcore.AsyncConnectionPool:
        if len(self._pools) == 1:
            return self._pools[0]
        return self._pools[hash((url.raw_scheme, url.raw_host, url.port)) % len(self._pools)]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _httpx_errors():
            response = await self._pool(request.url).handle_async_request(core_request)
        assert isinstance(response.stream, AsyncIterable)
        extensions = dict(response.extensions)
        # Not the "network_stream": the response would hold the socket (see
        # ``_ResponseStream``); its answer time holds it only until the response ends.
        network = extensions.pop("network_stream", None)
        answer = AnswerTime(
            None if network is None else network.get_extra_info("socket"),
            until_close=_ends_with_the_close(request.method, response.status, response.headers),
        )
        extensions[ANSWER_TIME] = answer
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(response.stream, answer),
            extensions=extensions,
        )

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.aclose()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self.aclose()


def _no_cookies() -> http.cookiejar.CookieJar:
    # An empty allow-list refuses every domain: a cookie set by one site is never
    # stored, so it can neither follow the crawler to another site nor track it.
    return http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))


def build_network(
    settings: FetcherSettings,
    *,
    network_backend: httpcore.AsyncNetworkBackend | None = None,
    resolver: Resolver | None = None,
    exclusions: Exclusions | None = None,
) -> GuardedNetworkBackend:
    """The pod's way to the network: names resolved, addresses checked. ``network_backend``
    and ``resolver`` are test seams; ``exclusions``, when not given, are read from
    ``settings``."""
    return GuardedNetworkBackend(
        AddressPolicy.from_cidrs(settings.allowed_networks, settings.nat64_prefixes),
        static=StaticHosts.parse(settings.resolve),
        resolver=DnsResolver(DnsConfig.for_settings(settings)) if resolver is None else resolver,
        inner=network_backend,
        exclusions=Exclusions.from_settings(settings) if exclusions is None else exclusions,
        egress=EgressWatch(EgressConfig.for_settings(settings)),
        most_carried=MOST_CARRIED * settings.max_body_bytes + ANSWER_OVERHEAD_BYTES,
    )


def build_client(
    settings: FetcherSettings,
    *,
    network: GuardedNetworkBackend | None = None,
    network_backend: httpcore.AsyncNetworkBackend | None = None,
    resolver: Resolver | None = None,
    ssl_context: ssl.SSLContext | None = None,
    pool: PoolConfig | None = None,
    exclusions: Exclusions | None = None,
) -> httpx.AsyncClient:
    """The pod's one HTTP client, over ``network`` (else one ``build_network`` makes of
    ``network_backend``, ``resolver`` and ``exclusions``)."""
    if network is None:
        network = build_network(
            settings, network_backend=network_backend, resolver=resolver, exclusions=exclusions
        )
    pool = pool or PoolConfig.for_settings(settings)
    _warn_if_few_descriptors(pool, settings)
    transport = GuardedTransport(network, config=pool, ssl_context=ssl_context)
    return httpx.AsyncClient(
        transport=transport,
        headers={"User-Agent": user_agent(settings)},
        timeout=httpx.Timeout(
            connect=settings.connect_timeout,
            read=settings.read_timeout,
            write=settings.read_timeout,
            pool=settings.request_timeout,
        ),
        follow_redirects=False,
        trust_env=False,
        cookies=_no_cookies(),
    )


#: Descriptors a pod holds besides its connections and DNS sockets: the broker's
#: connection, the metrics server, the event loop's, the interpreter's own files.
DESCRIPTOR_MARGIN = 64


def _warn_if_few_descriptors(pool: PoolConfig, settings: FetcherSettings) -> None:
    """Say at start when the pod may open fewer descriptors than its settings can use at
    once: past the limit, connections and lookups fail (EMFILE), and though that work
    is handed back rather than blamed on its hosts (``PodExhausted``), it is not crawled."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    # A socket a connection, and one a query of each family of a lookup in flight.
    needed = pool.max_connections + 2 * settings.dns_concurrency + DESCRIPTOR_MARGIN
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "the pod may open %d file descriptors, and its settings use up to %d at once"
            " (%d connections, TROVE_DNS_CONCURRENCY=%d): raise its limit (ulimit -n) or"
            " lower TROVE_CONCURRENCY",
            soft,
            needed,
            pool.max_connections,
            settings.dns_concurrency,
        )


#: Addresses of a name one connection tries, of each family: a zone of thousands of
#: records would have a fetch knock at every one of them (other people's machines, on
#: any port), each a refusal or a timeout.
ADDRESSES_TRIED_PER_FAMILY = 2


def _tried(addresses: Sequence[str]) -> list[str]:
    """The first ``ADDRESSES_TRIED_PER_FAMILY`` addresses of each family, in order."""
    kept: list[str] = []
    counts = {False: 0, True: 0}
    for address in addresses:
        v6 = ":" in address
        if counts[v6] < ADDRESSES_TRIED_PER_FAMILY:
            counts[v6] += 1
            kept.append(address)
    return kept
