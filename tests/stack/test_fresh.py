"""``--fresh`` (``make run``) empties the state folder, never under a stack that runs there."""

from __future__ import annotations

from pathlib import Path

import pytest

from trove_schema.errors import StackError
from trove_stack.stack import Stack, running_in


def test_a_fresh_stack_refuses_a_folder_whose_servers_run_and_empties_it_once_they_stop(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    first = Stack(state_dir=state, fast_and_unsafe=True).start()
    try:
        marker = state / "logs" / "kept.log"
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("the running stack's")
        with pytest.raises(StackError, match=r"(Postgres|nats-server) \(pid \d+\) runs on"):
            Stack(state_dir=state, fresh=True, fast_and_unsafe=True).start()
        assert marker.exists()  # nothing deleted under it
        assert running_in(state) is not None
    finally:
        first.stop()
    assert running_in(state) is None
    second = Stack(state_dir=state, fresh=True, fast_and_unsafe=True).start()
    try:
        assert not marker.exists()  # a fresh folder
    finally:
        second.stop()
