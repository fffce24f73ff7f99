"""The rest a pod keeps on its own clock for each host it released (``LocalRests``)."""

from __future__ import annotations

import pytest

from trove_fetcher import politeness
from trove_fetcher.politeness import LocalRests


def test_a_rest_is_left_until_its_end_on_the_pods_clock() -> None:
    rests = LocalRests()
    rests.rest("a.test", 10.0)
    assert rests.left("a.test", 4.0) == 6.0
    assert rests.left("b.test", 4.0) == 0.0
    assert rests.left("a.test", 10.0) == 0.0
    assert rests.left("a.test", 4.0) == 0.0  # a rest that ended is forgotten


def test_the_latest_release_of_a_host_sets_its_rest() -> None:
    rests = LocalRests()
    rests.rest("a.test", 10.0)
    rests.rest("a.test", 7.0)
    assert rests.left("a.test", 5.0) == 2.0


def test_a_pod_remembers_the_rests_of_the_hosts_it_released_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(politeness, "LOCAL_RESTS_MEMORY", 3)
    rests = LocalRests()
    for n in range(4):
        rests.rest(f"{n}.test", 100.0 + n)
    rests.rest("1.test", 200.0)  # released again: the latest, not the oldest
    rests.rest("4.test", 104.0)
    assert [rests.left(f"{n}.test", 0.0) > 0 for n in range(5)] == [
        False,
        True,
        False,
        True,
        True,
    ]
