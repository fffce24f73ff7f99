"""A lookup queued behind slow ones, through the client: the wait for a query slot is the
pod's load, not the host's slowness, so it does not count against the connect timeout.
A real DNS server on loopback, whose lame names hold the resolver's slots."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from tests.fetcher._dns import DnsServer, dns_server
from tests.fetcher._servers import Exchange, LocalServer, serving
from trove_fetcher.dns import DnsConfig, DnsResolver
from trove_fetcher.errors import DnsTimeout
from trove_fetcher.transport import build_client
from trove_schema.settings import FetcherSettings


def _page(exchange: Exchange) -> None:
    exchange.send(200, b"<p>here</p>")


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    with serving({"/page": _page}) as running:
        yield running


@pytest.fixture
def names() -> Iterator[DnsServer]:
    with dns_server("127.0.0.59") as running:
        running.records["site.trove.test"] = (("127.0.0.1",), 60)
        running.silent.update(f"lame{i}.trove.test" for i in range(4))
        yield running


async def test_a_connection_waiting_for_a_query_slot_is_not_timed_out_for_it(
    server: LocalServer, names: DnsServer
) -> None:
    # Two rounds of lame names hold both slots for 1 s; the connect timeout is 0.3 s.
    resolver = DnsResolver(
        DnsConfig(nameservers=(names.address,), timeout=0.5, max_concurrent=2, queue_timeout=5.0)
    )
    settings = FetcherSettings(allowed_networks=("127.0.0.1/32",), connect_timeout=0.3)
    async with build_client(settings, resolver=resolver) as client:
        lame = [resolver.lookup(f"lame{i}.trove.test") for i in range(4)]
        results = await asyncio.gather(
            *lame, client.get(server.url("/page", host="site.trove.test")), return_exceptions=True
        )
    assert all(isinstance(result, DnsTimeout) for result in results[:4]), results
    response = results[4]
    assert isinstance(response, httpx.Response), response
    assert response.status_code == 200
    assert [seen.path for seen in server.requests_for("site.trove.test")] == ["/page"]
