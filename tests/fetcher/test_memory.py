"""The bounded LRU memory behind the fetcher's per-origin and per-work caches."""

from __future__ import annotations

from trove_fetcher.memory import Memory


def test_the_least_recently_used_entry_goes_first() -> None:
    memory: Memory[str, int] = Memory(max_entries=2)
    memory.put("a", 1)
    memory.put("b", 2)
    assert memory.get("a") == 1  # a is now the most recent
    memory.put("c", 3)
    assert "b" not in memory
    assert memory.get("a") == 1
    assert memory.get("c") == 3
    assert len(memory) == 2


def test_the_weight_bound_holds_whatever_the_entries() -> None:
    memory: Memory[int, bytes] = Memory(max_entries=1000, max_weight=100)
    for n in range(50):
        memory.put(n, b"x" * 30, weight=30)
        assert memory.weight <= 100
    assert len(memory) == 3
    memory.put(99, b"x" * 500, weight=500)  # heavier than the whole memory: not kept
    assert 99 not in memory
    assert memory.weight <= 100


def test_replacing_or_popping_an_entry_keeps_the_weight_right() -> None:
    memory: Memory[str, str] = Memory(max_entries=10, max_weight=100)
    memory.put("a", "x", weight=40)
    memory.put("a", "y", weight=10)
    assert memory.weight == 10
    assert memory.pop("a") == "y"
    assert memory.pop("a") is None
    assert memory.weight == 0
