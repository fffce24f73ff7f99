"""The guarded HTTP client: every connection goes to a checked address, nothing else.

A ``RecordingBackend`` sits under the guard and notes each TCP connect; an address
the guard refuses must never appear there.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpcore
import httpx
import pytest

from tests.fetcher._dns import DnsServer, dns_server
from tests.fetcher._servers import (
    Certificate,
    Exchange,
    LocalServer,
    RecordingBackend,
    self_signed,
    serving,
)
from tests.ports import free_port
from trove_fetcher.addresses import AddressPolicy
from trove_fetcher.errors import BlockedAddress, EgressAway, ResolverAway
from trove_fetcher.http import FetchLimits, fetch
from trove_fetcher.robots import fetch_robots
from trove_fetcher.transport import (
    GuardedNetworkBackend,
    PoolConfig,
    StaticHosts,
    build_client,
    build_network,
)
from trove_fetcher.useragent import UNKNOWN_VERSION, trove_version, user_agent
from trove_schema.settings import FetcherSettings


def _echo(exchange: Exchange) -> None:
    seen = exchange.server.owner.seen[-1]
    body = "\n".join(
        [
            f"host={seen.headers.get('host', '')}",
            f"user-agent={seen.headers.get('user-agent', '')}",
            f"cookie={seen.headers.get('cookie', '')}",
        ]
    )
    exchange.send(200, body.encode(), content_type="text/plain")


def _set_cookie(exchange: Exchange) -> None:
    exchange.send(200, b"ok", {"Set-Cookie": "track=me; Path=/"}, content_type="text/plain")


ROUTES = {"/echo": _echo, "/set-cookie": _set_cookie}


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    with serving(ROUTES) as running:
        yield running


@pytest.fixture(scope="module")
def server_at_5() -> Iterator[LocalServer]:
    with serving(ROUTES, ip="127.0.0.5") as running:
        yield running


@pytest.fixture(scope="module")
def dns() -> Iterator[DnsServer]:
    with dns_server("127.0.0.54") as running:
        running.records["rebind.trove.test"] = (("127.0.0.1", "10.0.0.1"), 60)
        running.records["dns.trove.test"] = (("127.0.0.1",), 60)
        running.missing["nowhere.trove.test"] = 60
        yield running


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Certificate:
    return self_signed(tmp_path_factory.mktemp("tls"), "secure.trove.test")


@pytest.fixture(scope="module")
def tls_server(certificate: Certificate) -> Iterator[LocalServer]:
    with serving(ROUTES, ssl_context=certificate.server_context()) as running:
        yield running


def _settings(**overrides: Any) -> FetcherSettings:
    values: dict[str, Any] = {
        "allowed_networks": ("127.0.0.1/32",),
        "resolve": ("site.trove.test=127.0.0.1", "evil.trove.test=10.0.0.1"),
    }
    values.update(overrides)
    return FetcherSettings(**values)


@pytest.fixture
def recorder() -> RecordingBackend:
    return RecordingBackend()


@pytest.fixture
async def client(recorder: RecordingBackend) -> AsyncIterator[httpx.AsyncClient]:
    async with build_client(_settings(), network_backend=recorder) as built:
        yield built


async def test_connection_goes_to_the_checked_ip_with_the_hostname_kept(
    client: httpx.AsyncClient, recorder: RecordingBackend, server: LocalServer
) -> None:
    response = await client.get(server.url("/echo", host="site.trove.test"))
    assert response.status_code == 200
    assert f"host=site.trove.test:{server.port}" in response.text
    assert recorder.connects == [("127.0.0.1", server.port)]


async def test_allowed_range_admits_an_address_inside_it(
    recorder: RecordingBackend, server_at_5: LocalServer
) -> None:
    settings = _settings(allowed_networks=("127.0.0.0/24",))
    async with build_client(settings, network_backend=recorder) as client:
        response = await client.get(server_at_5.url("/echo"))
    assert response.status_code == 200
    assert recorder.connects == [("127.0.0.5", server_at_5.port)]


async def test_address_just_outside_the_allowed_range_is_never_connected(
    recorder: RecordingBackend, server_at_5: LocalServer
) -> None:
    settings = _settings(allowed_networks=("127.0.0.0/24",))
    async with build_client(settings, network_backend=recorder) as client:
        with pytest.raises(BlockedAddress, match="loopback"):
            await client.get(f"http://127.0.1.1:{server_at_5.port}/echo")
    assert recorder.connects == []


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.2:{port}/echo", "loopback"),
        ("http://169.254.169.254/latest/meta-data/", "cloud metadata"),
        ("http://10.0.0.1/", "private"),
        ("http://[::1]:{port}/echo", "loopback"),
        ("http://0.0.0.0:{port}/echo", "unspecified"),
        ("http://[::ffff:10.0.0.1]/", "IPv4-mapped"),
        ("http://[::ffff:127.0.0.1]:{port}/echo", "IPv4-mapped"),
        ("http://[64:ff9b::a00:1]/", "NAT64"),
        ("http://evil.trove.test/", "private"),
        ("https://evil.trove.test/", "private"),
        ("http://EVIL.trove.test./", "private"),
    ],
)
async def test_refused_address_is_never_connected(
    client: httpx.AsyncClient,
    recorder: RecordingBackend,
    server: LocalServer,
    url: str,
    reason: str,
) -> None:
    with pytest.raises(BlockedAddress, match=reason):
        await client.get(url.format(port=server.port))
    assert recorder.connects == []


async def test_a_name_of_many_addresses_has_a_few_of_each_family_tried(
    recorder: RecordingBackend,
) -> None:
    # A zone of thousands of records would have one fetch knock at each of them.
    many = [f"127.0.0.{n}" for n in range(10, 60)]

    async def resolver(host: str, port: int) -> list[str]:
        return many

    closed = free_port()
    settings = _settings(allowed_networks=("127.0.0.0/24",))
    async with build_client(settings, network_backend=recorder, resolver=resolver) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://many.trove.test:{closed}/")
    assert recorder.connects == [("127.0.0.10", closed), ("127.0.0.11", closed)]


async def test_numeric_hostname_is_read_as_the_ipv4_address_it_spells(
    client: httpx.AsyncClient, recorder: RecordingBackend
) -> None:
    # 167772161 is 10.0.0.1 as one number: httpx leaves it as a name, and inet_aton
    # (as getaddrinfo and browsers do) reads it as the private address.
    for host in ("167772161", "0xa.1", "10.1"):
        with pytest.raises(BlockedAddress, match=r"10\.0\.0\.1"):
            await client.get(f"http://{host}/")
    assert recorder.connects == []


async def test_hostname_is_resolved_by_dns_and_every_answer_checked(
    recorder: RecordingBackend, dns: DnsServer, server: LocalServer
) -> None:
    settings = _settings(dns_nameservers=(dns.address,))
    async with build_client(settings, network_backend=recorder) as client:
        with pytest.raises(BlockedAddress, match=r"rebind\.trove\.test resolves to 10\.0\.0\.1"):
            await client.get("http://rebind.trove.test/")
        response = await client.get(server.url("/echo", host="dns.trove.test"))
        assert response.status_code == 200
        assert f"host=dns.trove.test:{server.port}" in response.text
    assert recorder.connects == [("127.0.0.1", server.port)]


async def test_static_entry_is_answered_without_a_dns_query(
    recorder: RecordingBackend, dns: DnsServer, server: LocalServer
) -> None:
    settings = _settings(dns_nameservers=(dns.address,), resolve=("dns.trove.test=127.0.0.1",))
    before = dns.asked("dns.trove.test")
    async with build_client(settings, network_backend=recorder) as client:
        response = await client.get(server.url("/echo", host="dns.trove.test"))
    assert response.status_code == 200
    assert dns.asked("dns.trove.test") == before


@pytest.mark.parametrize("nat64", [(), ("2a00:64::/96",)])
async def test_a_name_answered_in_the_networks_own_nat64_prefix_is_judged_by_its_ipv4(
    recorder: RecordingBackend, nat64: tuple[str, ...]
) -> None:
    # On a network whose DNS64 answers with a prefix of its own, 2a00:64::a00:1 reaches
    # 10.0.0.1 through the translator: told the prefix, the guard refuses it before any
    # connection; not told, it takes it for a global IPv6 address (the test's backend
    # notes the attempt and dials nothing but loopback).
    settings = _settings(resolve=("nat64.trove.test=2a00:64::a00:1",), nat64_prefixes=nat64)
    async with build_client(settings, network_backend=recorder) as client:
        if nat64:
            with pytest.raises(BlockedAddress, match=r"NAT64 of 10\.0\.0\.1: private"):
                await client.get("http://nat64.trove.test/")
        else:
            with pytest.raises(httpx.ConnectError, match="not loopback, not dialled"):
                await client.get("http://nat64.trove.test/")
    assert recorder.connects == ([] if nat64 else [("2a00:64::a00:1", 80)])


async def test_an_excluded_host_is_neither_looked_up_nor_connected(
    recorder: RecordingBackend, dns: DnsServer, server: LocalServer
) -> None:
    settings = _settings(dns_nameservers=(dns.address,), excluded_hosts="trove.test")
    before = dns.asked("dns.trove.test"), dns.asked("notrove.test")
    async with build_client(settings, network_backend=recorder) as client:
        for host in ("dns.trove.test", "DNS.Trove.Test.", "trove.test"):
            with pytest.raises(BlockedAddress, match=r"excluded by the operator: trove\.test"):
                await client.get(server.url("/echo", host=host))
        # A name that only ends like the rule is not below it: it is looked up.
        with pytest.raises(httpx.ConnectError, match=r"notrove\.test"):
            await client.get("http://notrove.test/")
    assert dns.asked("dns.trove.test") == before[0]
    assert dns.asked("notrove.test") > before[1]
    assert recorder.connects == []


async def test_an_excluded_address_is_refused_however_it_is_written(
    recorder: RecordingBackend, server: LocalServer
) -> None:
    settings = _settings(
        allowed_networks=("127.0.0.1/32", "::1/128"), excluded_hosts="127.0.0.1 [::1]"
    )
    async with build_client(settings, network_backend=recorder) as client:
        for host in ("2130706433", "0x7f000001", "127.1", "0x7f.0.0.1", "0177.0.1"):
            with pytest.raises(BlockedAddress, match=r"excluded by the operator: 127\.0\.0\.1"):
                await client.get(server.url("/echo", host=host))
        with pytest.raises(BlockedAddress, match=r"excluded by the operator: ::1"):
            await client.get(server.url("/echo", host="[0:0:0:0:0:0:0:1]"))
    assert recorder.connects == []


async def test_name_that_does_not_exist_is_a_connect_error(
    recorder: RecordingBackend, dns: DnsServer
) -> None:
    settings = _settings(dns_nameservers=(dns.address,))
    async with build_client(settings, network_backend=recorder) as client:
        with pytest.raises(httpx.ConnectError, match=r"nowhere\.trove\.test: no such name"):
            await client.get("http://nowhere.trove.test/")
    assert recorder.connects == []


async def test_unresolvable_host_is_a_connect_error(recorder: RecordingBackend) -> None:
    async def fail(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    async with build_client(_settings(), network_backend=recorder, resolver=fail) as client:
        with pytest.raises(httpx.ConnectError, match=r"cannot resolve nowhere\.example"):
            await client.get("http://nowhere.example/")
    assert recorder.connects == []


async def test_resolution_slower_than_the_connect_timeout_is_a_connect_timeout(
    recorder: RecordingBackend,
) -> None:
    never = asyncio.Event()

    async def hang(host: str, port: int) -> list[str]:
        await never.wait()
        return []

    settings = _settings(connect_timeout=0.2)
    async with build_client(settings, network_backend=recorder, resolver=hang) as client:
        with pytest.raises(httpx.ConnectTimeout):
            await client.get("http://slow-dns.example/")
    assert recorder.connects == []


async def test_tls_certificate_is_verified_against_the_url_hostname(
    recorder: RecordingBackend, tls_server: LocalServer, certificate: Certificate
) -> None:
    settings = _settings(resolve=("secure.trove.test=127.0.0.1",))
    async with build_client(
        settings, network_backend=recorder, ssl_context=certificate.client_context()
    ) as client:
        response = await client.get(tls_server.url("/echo", host="secure.trove.test"))
        assert response.status_code == 200
        assert f"host=secure.trove.test:{tls_server.port}" in response.text
        # Same socket address, but the name checked against the certificate is the IP.
        with pytest.raises(httpx.ConnectError, match="certificate"):
            await client.get(tls_server.url("/echo"))
    assert recorder.connects == [("127.0.0.1", tls_server.port)] * 2


async def test_proxy_settings_in_the_environment_are_ignored(
    recorder: RecordingBackend, server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://10.0.0.1:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    async with build_client(_settings(), network_backend=recorder) as client:
        response = await client.get(server.url("/echo", host="site.trove.test"))
    assert response.status_code == 200
    assert recorder.connects == [("127.0.0.1", server.port)]


async def test_cookie_set_by_a_site_is_never_sent_back(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    first = await client.get(server.url("/set-cookie", host="site.trove.test"))
    assert "track=me" in first.headers["set-cookie"]
    second = await client.get(server.url("/echo", host="site.trove.test"))
    assert "cookie=\n" in second.text + "\n"
    assert "track" not in second.text


async def test_redirects_are_left_to_the_caller(client: httpx.AsyncClient) -> None:
    assert client.follow_redirects is False


async def test_user_agent_names_the_bot_its_version_and_info_page(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    response = await client.get(server.url("/echo", host="site.trove.test"))
    expected = f"TroveBot/{trove_version()} (+https://github.com/trove-crawler/trove/blob/main/docs/bot.md)"
    assert f"user-agent={expected}" in response.text


async def test_keep_alive_reuses_one_connection_per_origin_across_shards(
    recorder: RecordingBackend, server: LocalServer
) -> None:
    pool = PoolConfig(max_connections=32, max_keepalive_connections=32, shards=4)
    async with build_client(_settings(), network_backend=recorder, pool=pool) as client:
        for _ in range(3):
            response = await client.get(server.url("/echo", host="site.trove.test"))
            assert response.status_code == 200
    assert recorder.connects == [("127.0.0.1", server.port)]


async def test_guarded_backend_refuses_unix_sockets_whatever_the_policy() -> None:
    backend = GuardedNetworkBackend(AddressPolicy.from_cidrs(["0.0.0.0/0", "::/0"]))
    with pytest.raises(httpcore.ConnectError, match="unix sockets"):
        await backend.connect_unix_socket("/run/docker.sock")


def test_static_hosts_match_exact_names_before_wildcards() -> None:
    hosts = StaticHosts.parse(
        ["*.trove.test=127.0.0.2", "a.trove.test=127.0.0.3", "*.deep.trove.test=127.0.0.4"]
    )
    assert hosts.lookup("A.Trove.Test.") == "127.0.0.3"
    assert hosts.lookup("b.trove.test") == "127.0.0.2"
    assert hosts.lookup("x.deep.trove.test") == "127.0.0.4"
    assert hosts.lookup("trove.test") is None
    assert hosts.lookup("example.com") is None


@pytest.mark.parametrize("entry", ["nohost", "=127.0.0.1", "a.test=", "a.test=not-an-ip"])
def test_malformed_resolve_entry_is_refused_at_start(entry: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        StaticHosts.parse([entry])


def test_operator_user_agent_replaces_the_default() -> None:
    assert user_agent(FetcherSettings(user_agent="MyCrawler/1.0")) == "MyCrawler/1.0"


def test_default_user_agent_uses_the_robots_token_and_bot_info_url() -> None:
    settings = FetcherSettings(robots_token="TroveBot", bot_info_url="https://bot.example/")
    agent = user_agent(settings)
    assert agent == f"TroveBot/{trove_version()} (+https://bot.example/)"
    assert trove_version() != UNKNOWN_VERSION


def test_version_falls_back_when_trove_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert trove_version() == UNKNOWN_VERSION


def test_pool_config_follows_the_fetcher_concurrency() -> None:
    config = PoolConfig.for_settings(FetcherSettings(concurrency=64))
    assert config.max_connections >= 2 * 64
    assert config.max_keepalive_connections <= config.max_connections


class _StreamKeeper(RecordingBackend):
    """Notes a weak reference to every connection's network stream."""

    def __init__(self) -> None:
        super().__init__()
        self.streams: list[weakref.ref[httpcore.AsyncNetworkStream]] = []

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        stream = await super().connect_tcp(*args, **kwargs)
        self.streams.append(weakref.ref(stream))
        return stream


async def test_a_response_kept_after_its_connection_closed_does_not_keep_the_socket(
    server: LocalServer,
) -> None:
    # httpx's responses sit in reference cycles that only the collector frees: with it
    # off, a socket (and its TLS state) must still go as soon as the pool closes it.
    keeper = _StreamKeeper()
    gc.disable()
    try:
        async with build_client(_settings(), network_backend=keeper) as client:
            response = await client.get(server.url("/echo", host="site.trove.test"))
            assert response.status_code == 200
        assert len(keeper.streams) == 1
        assert keeper.streams[0]() is None
        assert response.text.startswith("host=")
    finally:
        gc.enable()


async def test_connection_closes_with_its_response_when_no_gap_is_shorter_than_keep_alive(
    server: LocalServer,
) -> None:
    # The next request to the host comes a gap (10 s at least) after this response:
    # a connection kept for it would only hold a socket.
    keeper = _StreamKeeper()
    settings = _settings(min_domain_delay_seconds=10.0)
    async with build_client(settings, network_backend=keeper) as client:
        first = await client.get(server.url("/echo", host="site.trove.test"))
        assert first.status_code == 200
        assert keeper.streams[0]() is None
        await client.get(server.url("/echo", host="site.trove.test"))
    assert len(keeper.connects) == 2


async def test_connection_is_kept_for_the_next_request_when_gaps_are_short(
    server: LocalServer,
) -> None:
    keeper = _StreamKeeper()
    settings = _settings(min_domain_delay_seconds=0.5)
    async with build_client(settings, network_backend=keeper) as client:
        for _ in range(2):
            response = await client.get(server.url("/echo", host="site.trove.test"))
            assert response.status_code == 200
        assert keeper.streams[0]() is not None
    assert len(keeper.connects) == 1


async def test_nameservers_away_pass_through_the_client_fetch_and_robots_untouched(
    recorder: RecordingBackend,
) -> None:
    # Not a connect error that fetch() would record against the site: the pod's own
    # nameservers answer nothing, and the caller hands the work back.
    with dns_server("127.0.0.57") as names:
        names.down = True
        settings = _settings(dns_nameservers=(names.address,), dns_timeout_seconds=0.3)
        network = build_network(settings, network_backend=recorder)
        assert network.network_away("dns.trove.test") is None  # not known yet
        async with build_client(settings, network=network) as client:
            with pytest.raises(ResolverAway):
                await client.get("http://dns.trove.test/")
            with pytest.raises(ResolverAway):
                await fetch(
                    client,
                    "http://other.trove.test/",
                    etag=None,
                    last_modified=None,
                    limits=FetchLimits(),
                    is_parseable=lambda kind: True,
                )
            with pytest.raises(ResolverAway):
                await fetch_robots(client, "http://third.trove.test", max_bytes=1024)
            # Known now: a name that needs a lookup waits; an address or a static entry
            # (the settings' site.trove.test) goes on.
            assert network.network_away("fourth.trove.test") is not None
            assert network.network_away("site.trove.test") is None
            assert network.network_away("127.0.0.1") is None
    assert recorder.connects == []


@contextlib.contextmanager
def silent_listener(ip: str) -> Iterator[int]:
    """A port on ``ip`` whose accept queue is full: the kernel drops every new SYN, as a
    way out that lost its route does, so a connection attempt times out."""
    with socket.socket() as listener, socket.socket() as queued:
        listener.bind((ip, 0))
        listener.listen(0)
        port: int = listener.getsockname()[1]
        queued.connect((ip, port))  # fills the queue; never accepted
        yield port


async def test_connections_timing_out_everywhere_pass_through_fetch_and_robots_as_egress_away(
    server: LocalServer,
) -> None:
    settings = _settings(
        allowed_networks=("127.0.0.0/8",),
        connect_timeout=0.3,
        egress_suspect_after=3,
        egress_quiet_seconds=0.0,
    )
    network = build_network(settings)
    limits = FetchLimits(total_timeout=5.0)
    with (
        silent_listener("127.0.0.191") as a,
        silent_listener("127.0.0.192") as b,
        silent_listener("127.0.0.193") as c,
        silent_listener("127.0.0.194") as d,
    ):
        async with build_client(settings, network=network) as client:
            # The first two are the hosts' own timeouts, as far as anyone can tell yet.
            with pytest.raises(httpx.ConnectTimeout):
                await client.get(f"http://127.0.0.191:{a}/")
            outcome = await fetch(
                client,
                f"http://127.0.0.192:{b}/",
                etag=None,
                last_modified=None,
                limits=limits,
                is_parseable=lambda kind: True,
            )
            assert outcome.outcome.value == "timeout"
            # The third address in a row: the pod's way out, not the host.
            with pytest.raises(EgressAway):
                await fetch(
                    client,
                    f"http://127.0.0.193:{c}/",
                    etag=None,
                    last_modified=None,
                    limits=limits,
                    is_parseable=lambda kind: True,
                )
            with pytest.raises(EgressAway):
                await fetch_robots(client, f"http://127.0.0.194:{d}", max_bytes=1024)
            assert network.network_away("site.trove.test") is not None
            # A connection that succeeds ends it.
            assert (
                await client.get(server.url("/echo", host="site.trove.test"))
            ).status_code == 200
            assert network.network_away("site.trove.test") is None
