"""Discovery's memory of the seen bucket: bounded in size and in time."""

from __future__ import annotations

from trove_discovery.sightings import Sightings


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_answer_is_remembered_until_two_rotations_pass() -> None:
    clock = Clock()
    memory = Sightings(capacity=100, ttl=10.0, clock=clock)
    memory.remember("u.a", b"event-1")
    clock.now = 6.0  # one rotation: still in the older generation
    assert memory.claimed_by("u.a") == b"event-1"
    clock.now = 12.0  # a second rotation drops it
    assert memory.claimed_by("u.a") is None


def test_an_answer_is_forgotten_after_its_ttl_however_quiet_the_memory_was() -> None:
    clock = Clock()
    memory = Sightings(capacity=100, ttl=10.0, clock=clock)
    clock.now = 4.0
    memory.remember("u.a", b"event-1")
    clock.now = 10_000.0  # nothing asked meanwhile: no rotation came
    assert memory.claimed_by("u.a") is None


def test_no_more_than_capacity_answers_are_kept() -> None:
    memory = Sightings(capacity=10, ttl=3600.0, clock=Clock())
    for n in range(100):
        memory.remember(f"u.{n}", b"e")
    assert len(memory) <= 10
    assert memory.claimed_by("u.99") == b"e"
    assert memory.claimed_by("u.0") is None


def test_capacity_zero_remembers_nothing() -> None:
    memory = Sightings(capacity=0, ttl=60.0, clock=Clock())
    memory.remember("u.a", b"e")
    assert memory.claimed_by("u.a") is None
