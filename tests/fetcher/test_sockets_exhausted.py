"""The pod out of file descriptors (EMFILE): the connection or the DNS query that cannot
get a socket is the pod's trouble, handed back (``PodExhausted``, a ``NetworkAway``),
never a failure of the host. The test lowers its own process's descriptor limit and
fills it, against a real HTTP server and a real DNS server on loopback."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import resource
import ssl
from collections.abc import Iterator

import pytest

from tests.fetcher._dns import DnsServer, dns_server
from tests.fetcher._servers import Exchange, LocalServer, serving
from trove_fetcher.dns import DnsConfig, DnsResolver
from trove_fetcher.errors import DnsError, EgressAway, NetworkAway, PodExhausted
from trove_fetcher.fetcher import _waits_for_network
from trove_fetcher.http import FetchLimits, fetch
from trove_fetcher.robots import fetch_robots
from trove_fetcher.transport import PoolConfig, build_client, build_network
from trove_schema.settings import FetcherSettings

SETTINGS = FetcherSettings(allowed_networks=("127.0.0.1/32",))


def _page(exchange: Exchange) -> None:
    exchange.send(200, b"<p>here</p>")


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    with serving({"/page": _page}) as running:
        yield running


@pytest.fixture
def names() -> Iterator[DnsServer]:
    with dns_server("127.0.0.61") as running:
        running.records.update({f"n{i}.trove.test": (("127.0.0.1",), 60) for i in range(3)})
        yield running


@contextlib.contextmanager
def descriptor_limit(soft: int) -> Iterator[None]:
    """This process may open descriptors numbered below ``soft`` only, until the end."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


@contextlib.contextmanager
def no_descriptor_left() -> Iterator[None]:
    """Every descriptor this process may open is open, as in a pod at its limit."""
    held: list[int] = []
    with descriptor_limit(len(os.listdir("/proc/self/fd")) + 32):
        try:
            while True:
                try:
                    held.append(os.open(os.devnull, os.O_RDONLY))
                except OSError:
                    break
            yield
        finally:
            for fd in held:
                os.close(fd)


async def test_a_connection_the_pod_has_no_descriptor_for_is_handed_back_not_blamed(
    server: LocalServer,
) -> None:
    network = build_network(SETTINGS)
    url = server.url("/page")
    async with build_client(SETTINGS, network=network) as client:
        with no_descriptor_left():
            with pytest.raises(PodExhausted, match="out of file descriptors"):
                await fetch(
                    client,
                    url,
                    etag=None,
                    last_modified=None,
                    limits=FetchLimits(),
                    is_parseable=lambda kind: True,
                )
            with pytest.raises(PodExhausted):
                await fetch_robots(client, url.removesuffix("/page"), max_bytes=1024)
        assert not network.egress.is_away  # nor the pod's way out
        result = await fetch(
            client,
            url,
            etag=None,
            last_modified=None,
            limits=FetchLimits(),
            is_parseable=lambda kind: True,
        )
    assert result.outcome.value == "success"
    assert [seen.path for seen in server.requests_for(server.ip)] == ["/page"]


async def test_a_lookup_the_pod_has_no_socket_for_is_handed_back_not_blamed(
    server: LocalServer, names: DnsServer
) -> None:
    # The clock stands still: the nameservers answered "since" any later lookup was sent,
    # as they do in a busy pod, so a lookup failing now would be taken for its host's.
    config = DnsConfig(nameservers=(names.address,), timeout=1.0)
    resolver = DnsResolver(config, clock=lambda: 1000.0)
    assert await resolver.lookup("n0.trove.test") == ("127.0.0.1",)
    async with build_client(SETTINGS, resolver=resolver) as client:
        with no_descriptor_left():
            with pytest.raises(PodExhausted, match="out of file descriptors") as raised:
                await resolver.lookup("n1.trove.test")
            assert not isinstance(raised.value, DnsError)
            # Through the client too, rather than a connect error fetch would record.
            with pytest.raises(NetworkAway):
                await client.get(server.url("/page", host="n2.trove.test"))
        assert resolver.cached == 1  # nothing cached of either name
        assert resolver.away("n1.trove.test") is None  # nor the nameservers taken away
        assert await resolver.lookup("n1.trove.test") == ("127.0.0.1",)
        response = await client.get(server.url("/page", host="n2.trove.test"))
    assert response.status_code == 200


async def test_a_descriptor_limit_below_what_the_settings_use_is_warned_of_at_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 512 jobs: 1,024 connections, and 512 lookups of two queries each, and the rest.
    settings = FetcherSettings(concurrency=512, dns_concurrency=512)
    assert PoolConfig.for_settings(settings).max_connections == 1024
    with caplog.at_level(logging.WARNING, logger="trove_fetcher.transport"):
        with descriptor_limit(2112):
            async with build_client(settings):
                pass
        assert caplog.text == ""
        with descriptor_limit(2000):
            async with build_client(settings):
                pass
    assert "may open 2000 file descriptors, and its settings use up to 2112" in caplog.text


def test_only_the_kernels_shortages_are_the_pods() -> None:
    assert PodExhausted.of(OSError(errno.EMFILE, "Too many open files")) is not None
    assert PodExhausted.of(OSError(errno.ENOBUFS, "No buffer space available")) is not None
    assert PodExhausted.of(ConnectionRefusedError(errno.ECONNREFUSED, "refused")) is None
    # OpenSSL's codes share the errno field: a bad handshake is the host's.
    assert PodExhausted.of(ssl.SSLError(errno.ENOMEM, "handshake failure")) is None


def test_work_handed_back_for_the_pods_shortage_says_so_aloud() -> None:
    # Nameservers and egress have a watch that logs their outage once; a pod short of
    # descriptors has none, so each hand-back is a warning that names the shortage.
    shortage = PodExhausted.of(OSError(errno.EMFILE, "Too many open files"))
    assert shortage is not None
    retry = _waits_for_network(shortage)
    assert not retry.expected
    assert "the pod is short" in str(retry)
    assert "file descriptors" in str(retry)
    away = _waits_for_network(EgressAway("no connection succeeds"))
    assert away.expected
    assert "egress is away" in str(away)
