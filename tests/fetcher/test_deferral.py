"""What a deferred work message carries, and the horizon it is never scheduled past."""

from __future__ import annotations

import itertools

import pytest

from trove_fetcher.deferral import (
    CHAIN_HEADER,
    HOPS_HEADER,
    SLOT_HEADER,
    Carried,
    Chain,
    ChainKind,
    horizon,
    schedule_at,
)

NOW = 1_800_000_000.0
WEEK = 7 * 86_400.0


def test_a_slot_within_the_horizon_is_scheduled_at_the_slot() -> None:
    assert schedule_at(NOW + 120, NOW, horizon(WEEK)) == NOW + 120


def test_a_slot_beyond_the_horizon_is_scheduled_at_the_horizon() -> None:
    """Crawl-delay 120 s and 10,000 queued pages: the slot is 2 weeks out."""
    slot = NOW + 120 * 10_000
    at = schedule_at(slot, NOW, horizon(WEEK))
    assert at == NOW + WEEK / 2
    assert at - NOW < WEEK  # fires long before the stream would age it out


def test_a_message_back_from_the_horizon_is_scheduled_again_towards_its_slot() -> None:
    slot = NOW + 3 * WEEK
    first = schedule_at(slot, NOW, horizon(WEEK))
    second = schedule_at(slot, first, horizon(WEEK))
    assert NOW < first < second <= slot
    hops = [NOW]
    while hops[-1] < slot:
        hops.append(schedule_at(slot, hops[-1], horizon(WEEK)))
    assert hops[-1] == slot  # it arrives at its slot, never before and never lost
    assert all(b - a <= WEEK / 2 for a, b in itertools.pairwise(hops))


def test_the_slot_and_a_paused_chain_survive_the_headers() -> None:
    chain = Chain(ChainKind.ROBOTS, ("http://a.test/robots.txt", "https://b.test/robots.txt"))
    carried = Carried(NOW + 12.5, chain)
    headers = carried.headers()
    assert headers[SLOT_HEADER] == f"{NOW + 12.5:.3f}"
    assert Carried.from_headers(headers) == carried
    assert Carried.from_headers(Carried(NOW).headers()) == Carried(NOW, None)


@pytest.mark.parametrize(
    "headers",
    [
        None,
        {},
        {SLOT_HEADER: "soon"},
        {SLOT_HEADER: "inf"},
        {CHAIN_HEADER: "page", HOPS_HEADER: "not json"},
        {CHAIN_HEADER: "page", HOPS_HEADER: "[]"},
        {CHAIN_HEADER: "page", HOPS_HEADER: "[1, 2]"},
        {CHAIN_HEADER: "elsewhere", HOPS_HEADER: '["http://a.test/"]'},
    ],
)
def test_unreadable_headers_mean_a_fresh_start(headers: dict[str, str] | None) -> None:
    assert Carried.from_headers(headers) == Carried()
