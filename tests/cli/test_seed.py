"""``trove seed`` against a real NATS with no discovery running."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from tests.conftest import StackUrls
from tests.support import run_trove
from trove_discovery.seeds import parse_seeds, reply
from trove_schema.bus import Bus
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import SEEDS_STREAM, SEEDS_SUBJECT

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


@pytest.mark.parametrize("command", [("seed",), ("crawl", "--join")])
async def test_a_seed_that_is_not_utf8_is_refused_before_anything_is_sent(
    stack: StackUrls, bus: Bus, tmp_path: Path, command: tuple[str, ...]
) -> None:
    # "café" typed in a Latin-1 terminal: Python keeps the byte 0xE9 as a surrogate.
    before = (await bus.js.stream_info(SEEDS_STREAM)).state.messages
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TROVE_")},
        "TROVE_NATS_URL": stack.nats_url,
        "TROVE_DATABASE_URL": stack.database_url,
        "TROVE_STATE_DIR": str(tmp_path / "state"),
    }

    code, out = await run_trove(
        *command, "https://kept.example/", "https://caf\udce9.example/", env=env, timeout=120
    )

    assert code == 2, out
    assert "not UTF-8 text: https://caf\\xe9.example/" in out
    assert "Traceback" not in out
    assert (await bus.js.stream_info(SEEDS_STREAM)).state.messages == before


@pytest.mark.parametrize(
    ("urls", "code"),
    [
        (("https://kept.example/",), 0),
        (("https://kept.example/", "not a url"), 1),
        (('{"url": "https://kept.example/"}',), 0),
        (('[{"url": "https://kept.example/"}, {"url": "ftp://nope.example/"}]',), 1),
        (("https://kept.example/", "\x1b]52;c;cm0gLXJmIH4=\x1b\\\x1b[2J"), 1),
    ],
    ids=["accepted", "one refused", "as JSON", "one refused, as JSON", "terminal sequences"],
)
async def test_a_seed_request_fails_when_discovery_refuses_a_seed(
    stack: StackUrls, bus: Bus, urls: tuple[str, ...], code: int
) -> None:
    # Discovery's own parsing and summary answer the request, as its handler does.
    async def answer(msg: Msg) -> None:
        batch = parse_seeds(msg.data, origin="request", settings=DiscoverySettings())
        await msg.respond(reply(msg.data, batch))

    responder = await bus.nc.subscribe(SEEDS_SUBJECT, cb=answer)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TROVE_")},
        "TROVE_NATS_URL": stack.nats_url,
    }
    try:
        exit_code, out = await run_trove("seed", "--request", *urls, env=env)
    finally:
        await responder.unsubscribe()
    assert exit_code == code, out
    assert "https://kept.example/" in out
    # A refused seed is repeated as sent: shown, never acted on by the terminal.
    assert "\x1b" not in out


async def test_a_forced_seed_goes_as_json_that_says_force(stack: StackUrls, bus: Bus) -> None:
    # A page the crawl knows this cycle is otherwise dropped as seen, its place kept.
    sent: list[bytes] = []

    async def answer(msg: Msg) -> None:
        sent.append(msg.data)
        batch = parse_seeds(msg.data, origin="request", settings=DiscoverySettings())
        await msg.respond(reply(msg.data, batch))

    responder = await bus.nc.subscribe(SEEDS_SUBJECT, cb=answer)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TROVE_")},
        "TROVE_NATS_URL": stack.nats_url,
    }
    # One argument may hold several lines, as `"$(cat urls.txt)"` gives them.
    urls = (
        "https://kept.example/",
        "https://kept.example/about\n\n# notes\rhttps://kept.example/b https://kept.example/c # d",
    )
    try:
        code, out = await run_trove("seed", "--force", "--request", *urls, env=env)
        refused, said = await run_trove("seed", "--force", '{"url": "https://x.example/"}', env=env)
    finally:
        await responder.unsubscribe()
    assert code == 0, out
    (payload,) = sent
    batch = parse_seeds(payload, origin="request", settings=DiscoverySettings())
    expected = [
        "https://kept.example/",
        "https://kept.example/about",
        "https://kept.example/b",
        "https://kept.example/c",
    ]
    assert [(seed.url, seed.force) for seed in batch.accepted] == [(u, True) for u in expected]
    assert refused == 2
    assert '"force": true' in said
