"""A cluster's servers given as the nats CLI takes them, comma-separated."""

from __future__ import annotations

from trove_schema.bus import nats_servers


def test_comma_separated_servers_are_a_list_of_urls() -> None:
    url = "tls://fetcher:pw@nats-0:4222, tls://fetcher:pw@nats-1:4222,,"
    assert nats_servers(url) == ["tls://fetcher:pw@nats-0:4222", "tls://fetcher:pw@nats-1:4222"]


def test_one_server_is_a_list_of_one() -> None:
    assert nats_servers("nats://127.0.0.1:4222") == ["nats://127.0.0.1:4222"]
