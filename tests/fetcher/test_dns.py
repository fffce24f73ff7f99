"""The fetcher's resolver against a real DNS server on loopback UDP that counts queries.

TTLs run on an injected clock, so "after the TTL" takes no time; the timeouts are
real and short.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator

import dns.message
import dns.rcode
import dns.rdatatype
import pytest

from tests.conftest import eventually
from tests.fetcher._dns import DnsServer, dns_server
from trove_fetcher.dns import MAX_ADDRESSES, DnsConfig, DnsResolver
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


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def server() -> Iterator[DnsServer]:
    with dns_server("127.0.0.53") as running:
        running.records.update(
            {
                "site.trove.test": (("127.0.0.1",), 60),
                "dual.trove.test": (("127.0.0.1", "::1"), 60),
                "zero.trove.test": (("127.0.0.1",), 0),
                "long.trove.test": (("127.0.0.1",), 7 * 86_400),
                "v6only.trove.test": (("::1",), 60),
            }
        )
        running.missing.update({"gone.trove.test": 20})
        running.silent.update({"hang.trove.test"} | {f"hang{i}.trove.test" for i in range(8)})
        running.records.update({f"n{i}.trove.test": (("127.0.0.1",), 300) for i in range(20)})
        yield running


@pytest.fixture
def own_server() -> Iterator[DnsServer]:
    """A server of the test's own, to take down or break."""
    with dns_server("127.0.0.56") as running:
        running.records.update({f"n{i}.trove.test": (("127.0.0.1",), 60) for i in range(4)})
        running.silent.add("lame.trove.test")
        yield running


def _resolver(server: DnsServer, clock: Clock | None = None, **overrides: object) -> DnsResolver:
    values: dict[str, object] = {
        "nameservers": (server.address,),
        "timeout": 2.0,
        "min_ttl": 0.0,
        "max_ttl": 3600.0,
        "max_negative_ttl": 300.0,
    }
    values.update(overrides)
    config = DnsConfig(**values)  # type: ignore[arg-type]
    return DnsResolver(config, clock=clock or Clock())


async def test_second_lookup_within_the_ttl_is_not_sent(server: DnsServer) -> None:
    clock = Clock()
    resolver = _resolver(server, clock)
    before = server.asked("site.trove.test")
    assert await resolver.lookup("site.trove.test") == ("127.0.0.1",)
    assert server.asked("site.trove.test") == before + 2  # A and AAAA
    clock.now += 59
    assert await resolver.lookup("Site.Trove.Test.") == ("127.0.0.1",)
    assert server.asked("site.trove.test") == before + 2
    clock.now += 2
    assert await resolver.lookup("site.trove.test") == ("127.0.0.1",)
    assert server.asked("site.trove.test") == before + 4


async def test_both_address_families_are_returned_ipv4_first(server: DnsServer) -> None:
    resolver = _resolver(server)
    assert await resolver.lookup("dual.trove.test") == ("127.0.0.1", "::1")
    assert await resolver.lookup("v6only.trove.test") == ("::1",)


async def test_a_name_of_many_addresses_keeps_a_few_of_each_family(server: DnsServer) -> None:
    # Two of a family are tried and each kept is checked at every connection: a name of
    # hundreds (a UDP answer of ~100 here; over TCP, thousands) is no site's.
    many = tuple(f"127.0.{n // 250}.{n % 250 + 1}" for n in range(100))
    server.records["many.trove.test"] = (many, 60)
    resolver = _resolver(server)
    kept = await resolver.lookup("many.trove.test")
    assert len(kept) == MAX_ADDRESSES  # an answer's records come in no order
    assert set(kept) <= set(many)


async def test_ttl_is_clamped_to_the_configured_range(server: DnsServer) -> None:
    clock = Clock()
    resolver = _resolver(server, clock, min_ttl=30.0, max_ttl=600.0)
    await resolver.lookup("zero.trove.test")
    await resolver.lookup("long.trove.test")
    zero, long = server.asked("zero.trove.test"), server.asked("long.trove.test")
    clock.now += 29
    await resolver.lookup("zero.trove.test")
    assert server.asked("zero.trove.test") == zero  # a TTL of 0 still holds 30 s
    clock.now += 600
    await resolver.lookup("zero.trove.test")
    await resolver.lookup("long.trove.test")
    assert server.asked("zero.trove.test") == zero + 2
    assert server.asked("long.trove.test") == long + 2  # a week is cut to 10 minutes


async def test_nxdomain_is_cached_for_its_negative_ttl(server: DnsServer) -> None:
    clock = Clock()
    resolver = _resolver(server, clock)
    before = server.asked("gone.trove.test")
    with pytest.raises(NameNotFound, match=r"gone\.trove\.test: no such name"):
        await resolver.lookup("gone.trove.test")
    clock.now += 19
    with pytest.raises(NameNotFound):
        await resolver.lookup("gone.trove.test")
    assert server.asked("gone.trove.test") == before + 2
    clock.now += 2
    with pytest.raises(NameNotFound):
        await resolver.lookup("gone.trove.test")
    assert server.asked("gone.trove.test") == before + 4


async def test_negative_ttl_is_capped(server: DnsServer) -> None:
    clock = Clock()
    resolver = _resolver(server, clock, max_negative_ttl=5.0)
    before = server.asked("gone.trove.test")
    with pytest.raises(NameNotFound):
        await resolver.lookup("gone.trove.test")
    clock.now += 6
    with pytest.raises(NameNotFound):
        await resolver.lookup("gone.trove.test")
    assert server.asked("gone.trove.test") == before + 4


async def test_silent_nameserver_times_out_without_holding_a_thread(server: DnsServer) -> None:
    resolver = _resolver(server, timeout=0.3)
    threads = threading.active_count()
    started = time.monotonic()
    with pytest.raises(DnsTimeout):
        await resolver.lookup("hang.trove.test")
    assert time.monotonic() - started < 1.5
    assert threading.active_count() == threads
    # A timeout says nothing about the name: it is asked again, not cached.
    asked = server.asked("hang.trove.test")
    with pytest.raises(DnsTimeout):
        await resolver.lookup("hang.trove.test")
    assert server.asked("hang.trove.test") > asked
    assert resolver.cached == 0


async def test_cache_never_grows_past_its_bound(server: DnsServer) -> None:
    resolver = _resolver(server, cache_entries=5)
    for i in range(20):
        await resolver.lookup(f"n{i}.trove.test")
        assert resolver.cached == min(i + 1, 5)
    # The most recent names stayed: asking one again sends nothing.
    asked = server.asked("n19.trove.test")
    await resolver.lookup("n19.trove.test")
    assert server.asked("n19.trove.test") == asked


async def test_concurrent_lookups_of_one_name_send_one_query(server: DnsServer) -> None:
    resolver = _resolver(server)
    before = server.asked("dual.trove.test")
    answers = await asyncio.gather(*(resolver.lookup("dual.trove.test") for _ in range(50)))
    assert set(answers) == {("127.0.0.1", "::1")}
    assert server.asked("dual.trove.test") == before + 2


async def test_queries_in_flight_are_bounded(server: DnsServer) -> None:
    resolver = _resolver(server, timeout=0.5, max_concurrent=2)
    names = [f"hang{i}.trove.test" for i in range(8)]
    before = {name: server.asked(name) for name in names}

    async def sent() -> list[str]:
        return [name for name in names if server.asked(name) > before[name]]

    lookups = asyncio.gather(*(resolver.lookup(n) for n in names), return_exceptions=True)
    await eventually(sent, until=lambda s: len(s) >= 2, timeout=2, interval=0.01, what="sent")
    assert len(await sent()) == 2  # the others wait for a slot, for 0.5 s at least
    results = await lookups
    assert all(isinstance(result, DnsTimeout) for result in results)
    assert len(await sent()) == 8  # each its own timeout, once it had a slot


async def test_a_lookup_queued_behind_slow_ones_gets_its_whole_timeout_once_it_has_a_slot(
    server: DnsServer,
) -> None:
    # Two rounds of lame names fill both slots for twice the lookup timeout: a name
    # behind them is answered, not timed out for waiting.
    resolver = _resolver(server, timeout=0.5, max_concurrent=2)
    slow = [resolver.lookup(f"hang{i}.trove.test") for i in range(4)]
    results = await asyncio.gather(
        *slow, resolver.lookup("site.trove.test"), return_exceptions=True
    )
    assert all(isinstance(result, DnsTimeout) for result in results[:4]), results
    assert results[4] == ("127.0.0.1",)


async def test_a_wait_for_a_query_slot_too_long_is_the_pods_trouble_not_the_hosts(
    server: DnsServer,
) -> None:
    resolver = _resolver(server, timeout=1.0, max_concurrent=1, queue_timeout=0.2)
    before = server.asked("hang0.trove.test"), server.asked("site.trove.test")
    lame = asyncio.create_task(resolver.lookup("hang0.trove.test"))

    async def asked() -> int:
        return server.asked("hang0.trove.test")

    await eventually(asked, until=lambda n: n > before[0], timeout=2, interval=0.01, what="sent")
    with pytest.raises(PodExhausted, match=r"no DNS query slot free for 0\.2 s") as raised:
        await resolver.lookup("site.trove.test")
    assert isinstance(raised.value, NetworkAway)  # handed back, nothing recorded
    assert not isinstance(raised.value, DnsError)
    assert server.asked("site.trove.test") == before[1]  # never asked: nothing said of it
    with pytest.raises(DnsTimeout):
        await lame
    assert resolver.cached == 0
    assert await resolver.lookup("site.trove.test") == ("127.0.0.1",)


async def test_localhost_is_loopback_without_a_query(server: DnsServer) -> None:
    resolver = _resolver(server)
    assert await resolver.lookup("localhost") == ("127.0.0.1", "::1")
    assert server.asked("localhost") == 0


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("10.0.0.53", ("10.0.0.53", 53)),
        ("127.0.0.53:5353", ("127.0.0.53", 5353)),
        ("[::1]:5353", ("::1", 5353)),
        ("::1", ("::1", 53)),
    ],
)
def test_nameserver_setting_takes_an_optional_port(text: str, parsed: tuple[str, int]) -> None:
    assert parse_nameserver(text) == parsed


@pytest.mark.parametrize("text", ["ns.example", "10.0.0.1:0", "[::1]x", "10.0.0.1:dns"])
def test_malformed_nameserver_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        parse_nameserver(text)


async def test_nameservers_that_answer_nothing_are_the_pods_trouble_not_the_hosts(
    own_server: DnsServer,
) -> None:
    own_server.down = True
    resolver = _resolver(own_server, timeout=0.3)
    with pytest.raises(ResolverAway, match="no nameserver answers for the root zone"):
        await resolver.lookup("n0.trove.test")
    # The root was asked once, after the name got no answer.
    assert own_server.asked(".") == 1
    assert resolver.away("n1.trove.test") is not None


async def test_nameservers_that_fail_everything_are_the_pods_trouble(
    own_server: DnsServer,
) -> None:
    own_server.failing = True  # SERVFAIL: a resolver that cannot reach the world
    resolver = _resolver(own_server, timeout=0.3)
    with pytest.raises(ResolverAway, match="SERVFAIL"):
        await resolver.lookup("n0.trove.test")


async def test_a_name_without_an_answer_is_its_own_trouble_while_the_nameservers_answer(
    own_server: DnsServer,
) -> None:
    resolver = _resolver(own_server, timeout=0.3)
    with pytest.raises(DnsTimeout) as raised:
        await resolver.lookup("lame.trove.test")
    assert not isinstance(raised.value, ResolverAway)
    assert own_server.asked(".") == 1  # nothing else had answered since: it asked
    assert resolver.away("n0.trove.test") is None


async def test_no_root_query_when_the_nameservers_answered_others_meanwhile(
    own_server: DnsServer,
) -> None:
    clock = Clock()
    # The other name must be answered within it: 0.5 s was too little on a loaded
    # machine, and the lame name's timeout is all this costs.
    resolver = _resolver(own_server, clock=clock, timeout=2.0)
    lame = asyncio.create_task(resolver.lookup("lame.trove.test"))
    # Another name answered after the lame one was sent: the nameservers work.

    async def asked() -> int:
        return own_server.asked("lame.trove.test")

    await eventually(asked, until=bool, timeout=2, interval=0.01, what="the lame name asked")
    clock.now += 0.1
    assert await resolver.lookup("n0.trove.test") == ("127.0.0.1",)
    with pytest.raises(DnsTimeout):
        await lame
    assert own_server.asked(".") == 0


async def test_while_the_nameservers_are_away_cached_names_resolve_and_others_wait(
    own_server: DnsServer,
) -> None:
    clock = Clock()
    resolver = _resolver(own_server, clock=clock, timeout=0.3, recheck=5.0)
    assert await resolver.lookup("n0.trove.test") == ("127.0.0.1",)
    own_server.down = True
    clock.now += 1
    with pytest.raises(ResolverAway) as away:
        await resolver.lookup("n1.trove.test")
    assert away.value.retry_after == 5.0  # its work is handed back until the next look
    asked = own_server.total()
    # Within the recheck: a name not cached fails at once, without a query...
    with pytest.raises(ResolverAway):
        await resolver.lookup("n2.trove.test")
    assert own_server.total() == asked
    # ... and a cached one is answered from the cache.
    assert await resolver.lookup("n0.trove.test") == ("127.0.0.1",)
    assert resolver.away("n0.trove.test") is None
    assert resolver.away("n2.trove.test") is not None
    # Back, and past the recheck: the next lookup asks, and work goes on.
    own_server.down = False
    clock.now += 5
    assert resolver.away("n2.trove.test") is None
    assert await resolver.lookup("n2.trove.test") == ("127.0.0.1",)
    assert own_server.total() > asked


async def test_lookups_failing_together_ask_the_root_once(own_server: DnsServer) -> None:
    own_server.down = True
    resolver = _resolver(own_server, timeout=0.3)
    names = [f"n{i}.trove.test" for i in range(4)]
    results = await asyncio.gather(*(resolver.lookup(n) for n in names), return_exceptions=True)
    assert all(isinstance(r, ResolverAway) for r in results), results
    assert own_server.asked(".") == 1


def aaaa_broken(server: DnsServer, monkeypatch: pytest.MonkeyPatch, name: str, how: str) -> None:
    """``server`` answers ``name``'s AAAA query with nothing (``silent``) or SERVFAIL, as
    some hosts' nameservers do, and everything else as before; every query is counted."""
    answer = server.answer

    def answering(wire: bytes) -> bytes | None:
        reply = answer(wire)
        query = dns.message.from_wire(wire)
        question = query.question[0]
        if question.rdtype != dns.rdatatype.AAAA or question.name.to_text().rstrip(".") != name:
            return reply
        if how == "silent":
            return None
        response = dns.message.make_response(query)
        response.set_rcode(dns.rcode.SERVFAIL)
        return response.to_wire()

    monkeypatch.setattr(server, "answer", answering)


@pytest.mark.parametrize("aaaa", ["silent", "servfail"])
async def test_an_ipv4_answer_is_kept_when_aaaa_alone_fails(
    own_server: DnsServer, monkeypatch: pytest.MonkeyPatch, aaaa: str
) -> None:
    own_server.records["v4.trove.test"] = (("127.0.0.1",), 3600)
    aaaa_broken(own_server, monkeypatch, "v4.trove.test", aaaa)
    clock = Clock()
    resolver = _resolver(own_server, clock, timeout=0.3, max_negative_ttl=60.0)
    assert await resolver.lookup("v4.trove.test") == ("127.0.0.1",)
    asked = own_server.asked("v4.trove.test")
    # Cached, but the family that failed is asked again as soon as a negative answer
    # would be, not after the A record's hour.
    clock.now += 59
    assert await resolver.lookup("v4.trove.test") == ("127.0.0.1",)
    assert own_server.asked("v4.trove.test") == asked
    clock.now += 2
    assert await resolver.lookup("v4.trove.test") == ("127.0.0.1",)
    assert own_server.asked("v4.trove.test") > asked


async def test_no_address_and_a_failed_aaaa_is_a_failure_not_a_name_without_address(
    own_server: DnsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    own_server.records["v6.trove.test"] = (("::1",), 60)
    aaaa_broken(own_server, monkeypatch, "v6.trove.test", "servfail")
    resolver = _resolver(own_server, timeout=0.3)
    with pytest.raises(DnsFailure):
        await resolver.lookup("v6.trove.test")
    assert resolver.cached == 0  # its AAAA is not known to be missing
    assert own_server.asked(".") == 0  # the A's answer showed the nameservers work


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_dropped_aaaa_query_does_not_hold_up_the_ipv4_answer(
    own_server: DnsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    own_server.records["v4.trove.test"] = (("127.0.0.1",), 3600)
    aaaa_broken(own_server, monkeypatch, "v4.trove.test", "silent")
    resolver = _resolver(own_server, timeout=2.0)
    assert await resolver.lookup("n0.trove.test") == ("127.0.0.1",)
    descriptors = _open_descriptors()
    started = time.monotonic()
    assert await resolver.lookup("v4.trove.test") == ("127.0.0.1",)
    assert time.monotonic() - started < 1.0  # not the 2 s the AAAA query could take
    assert own_server.queries[("v4.trove.test", "AAAA")] == 1  # asked, and dropped
    # The AAAA query given up on is over, its socket closed, not left running.
    assert not [task for task in asyncio.all_tasks() if task.get_name().startswith("dns")]
    assert _open_descriptors() == descriptors


async def test_a_prompt_aaaa_answer_is_kept_with_the_ipv4_one(own_server: DnsServer) -> None:
    own_server.records["both.trove.test"] = (("127.0.0.1", "::1"), 60)
    clock = Clock()
    resolver = _resolver(own_server, clock, timeout=2.0, max_negative_ttl=5.0)
    assert await resolver.lookup("both.trove.test") == ("127.0.0.1", "::1")
    asked = own_server.asked("both.trove.test")
    # A whole answer: cached for its TTL, not the shorter hold of a family missing.
    clock.now += 30
    assert await resolver.lookup("both.trove.test") == ("127.0.0.1", "::1")
    assert own_server.asked("both.trove.test") == asked
