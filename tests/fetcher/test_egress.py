"""The egress watch: when the pod's failed connections say its way out is down, and when
they are the hosts' own. Its time is a clock the test turns."""

from __future__ import annotations

from trove_fetcher.egress import EgressConfig, EgressWatch
from trove_fetcher.errors import EgressAway
from trove_schema.metrics import EGRESS_AWAY

CONFIG = EgressConfig(suspect_after=3, quiet=30.0, recheck=10.0, patience=600.0)
REFUSED = ConnectionRefusedError("refused")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def away_watch(clock: Clock) -> EgressWatch:
    """A watch that has just taken egress to be away."""
    watch = EgressWatch(CONFIG, clock=clock)
    clock.now += 31
    for address in ("192.0.2.1", "192.0.2.2"):
        assert watch.failed(address, REFUSED) is None
    assert isinstance(watch.failed("192.0.2.3", REFUSED), EgressAway)
    return watch


def test_failures_are_the_hosts_until_enough_addresses_fail_over_a_quiet_spell() -> None:
    clock = Clock()
    watch = EgressWatch(CONFIG, clock=clock)
    clock.now += 29  # quiet for less than 30 s since the start
    for address in ("192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4"):
        assert watch.failed(address, REFUSED) is None
    assert watch.away() is None
    clock.now += 1
    away = watch.failed("192.0.2.5", REFUSED)
    assert isinstance(away, EgressAway)
    assert "none connected for 30 s" in str(away)
    assert watch.is_away


def test_one_dead_address_failing_again_and_again_is_never_the_pods_egress() -> None:
    clock = Clock()
    watch = EgressWatch(CONFIG, clock=clock)
    for _ in range(50):
        clock.now += 5
        assert watch.failed("192.0.2.9", REFUSED) is None
    assert not watch.is_away


def test_a_connection_that_succeeds_clears_the_failures_counted_before_it() -> None:
    clock = Clock()
    watch = EgressWatch(CONFIG, clock=clock)
    clock.now += 60
    assert watch.failed("192.0.2.1", REFUSED) is None
    assert watch.failed("192.0.2.2", REFUSED) is None
    watch.connected("192.0.2.200")
    clock.now += 31
    assert watch.failed("192.0.2.3", REFUSED) is None
    assert watch.failed("192.0.2.4", REFUSED) is None
    assert isinstance(watch.failed("192.0.2.5", REFUSED), EgressAway)


def test_while_away_work_waits_and_one_job_each_recheck_goes_ahead_to_find_out() -> None:
    clock = Clock()
    watch = away_watch(clock)
    # A failure while away is not the host's either, whichever address it is.
    assert isinstance(watch.failed("198.51.100.7", REFUSED), EgressAway)
    waiting = watch.away()
    assert isinstance(waiting, EgressAway)
    assert waiting.retry_after == CONFIG.recheck  # handed back until the next look
    clock.now += 9.9
    assert isinstance(watch.away(), EgressAway)
    clock.now += 0.1
    assert watch.away() is None  # this one goes ahead
    assert isinstance(watch.away(), EgressAway)  # the rest wait for its answer
    assert isinstance(watch.failed("192.0.2.1", REFUSED), EgressAway)
    clock.now += 10
    assert watch.away() is None
    watch.connected("192.0.2.200")
    assert not watch.is_away
    assert watch.away() is None
    assert watch.failed("192.0.2.1", REFUSED) is None  # the host's again


def test_an_outage_past_the_patience_is_the_hosts_again_until_a_connection_succeeds() -> None:
    clock = Clock()
    watch = away_watch(clock)
    clock.now += 599
    assert isinstance(watch.failed("192.0.2.1", REFUSED), EgressAway)
    clock.now += 1
    assert watch.failed("192.0.2.1", REFUSED) is None
    assert not watch.is_away
    assert EGRESS_AWAY.labels("IPv4")._value.get() == 1  # nothing connects still: alerting
    assert watch.away() is None
    for address in ("192.0.2.4", "192.0.2.5", "192.0.2.6", "192.0.2.7"):
        assert watch.failed(address, REFUSED) is None  # not suspected again meanwhile
    watch.connected("192.0.2.200")
    assert EGRESS_AWAY.labels("IPv4")._value.get() == 0
    clock.now += 31
    for address in ("192.0.2.1", "192.0.2.2"):
        assert watch.failed(address, REFUSED) is None
    assert isinstance(watch.failed("192.0.2.3", REFUSED), EgressAway)


def test_ipv6_failing_in_a_pod_where_it_never_worked_is_the_hosts_and_leaves_ipv4_alone() -> None:
    clock = Clock()
    watch = EgressWatch(CONFIG, clock=clock)
    clock.now += 60
    for n in range(10):
        assert watch.failed(f"2001:db8::{n + 1}", REFUSED) is None
    assert not watch.is_away
    assert watch.away() is None


def test_ipv6_away_once_it_worked_holds_ipv6_failures_but_not_ipv4_work() -> None:
    clock = Clock()
    watch = EgressWatch(CONFIG, clock=clock)
    watch.connected("2001:db8::1")
    watch.connected("192.0.2.1")
    clock.now += 31
    assert watch.failed("2001:db8::2", REFUSED) is None
    assert watch.failed("2001:db8::3", REFUSED) is None
    assert isinstance(watch.failed("2001:db8::4", REFUSED), EgressAway)
    assert watch.is_away
    assert watch.away() is None  # IPv4 work goes on
    assert watch.failed("192.0.2.9", REFUSED) is None  # an IPv4 host's own failure
    watch.connected("2001:db8::5")
    assert not watch.is_away
