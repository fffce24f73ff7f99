"""``trove seed`` against a real NATS with no discovery running."""

from __future__ import annotations

import os

import pytest

from tests.conftest import StackUrls
from tests.support import run_trove
from trove_schema.bus import Bus
from trove_schema.topology import SEEDS_STREAM

pytestmark = pytest.mark.usefixtures("clean")


async def test_a_seed_asked_for_an_answer_with_no_discovery_running_is_kept_and_said_so(
    stack: StackUrls, bus: Bus
) -> None:
    before = (await bus.js.stream_info(SEEDS_STREAM)).state.messages
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TROVE_")},
        "TROVE_NATS_URL": stack.nats_url,
    }
    code, out = await run_trove("seed", "--request", "https://kept.example/", env=env)
    assert code == 0, out
    assert "no answer from discovery" in " ".join(out.split())
    assert "Traceback" not in out
    info = await bus.js.stream_info(SEEDS_STREAM)
    assert info.state.messages == before + 1
    stored = await bus.js.get_msg(SEEDS_STREAM, info.state.last_seq)
    assert stored.data == b"https://kept.example/"
