"""``trove exclude``, ``trove include`` and ``trove exclusions``, run as a user runs them,
on a real nats-server: what they write is the list the services read."""

from __future__ import annotations

import os

import pytest
from nats.js.errors import KeyNotFoundError

from tests.conftest import StackUrls
from tests.support import run_trove
from trove_schema.bus import Bus
from trove_schema.exclusions import LIST_KEY, read_rules_tolerantly
from trove_schema.topology import EXCLUSIONS_BUCKET

pytestmark = pytest.mark.usefixtures("clean")


async def _listed(bus: Bus) -> tuple[str, ...]:
    kv = await bus.js.key_value(EXCLUSIONS_BUCKET)
    entry = await kv.get(LIST_KEY)
    return read_rules_tolerantly((entry.value or b"").decode().splitlines())[0]


async def test_an_operator_puts_hosts_on_the_shared_list_and_takes_them_off(
    stack: StackUrls, bus: Bus
) -> None:
    env = {**os.environ, "TROVE_NATS_URL": stack.nats_url, "COLUMNS": "200"}

    code, printed = await run_trove(
        "exclude",
        "https://Blog.Example/about",
        "spam.example",
        "--reason",
        "asked\nby mail",
        env=env,
    )
    assert code == 0, printed
    assert "blog.example: excluded" in printed
    assert await _listed(bus) == ("blog.example", "spam.example")

    code, printed = await run_trove("exclusions", env=env)
    assert code == 0, printed
    assert "blog.example  # asked by mail (" in printed
    # Twice is once.
    code, printed = await run_trove("exclude", "blog.example", env=env)
    assert code == 0, printed
    assert "blog.example: on the shared list already" in printed
    assert await _listed(bus) == ("blog.example", "spam.example")

    code, printed = await run_trove("include", "BLOG.example", "other.example", env=env)
    assert code == 0, printed
    assert "blog.example: taken off the shared list" in printed
    assert "other.example: not on the shared list" in printed
    assert await _listed(bus) == ("spam.example",)
    code, printed = await run_trove("include", "spam.example", env=env)
    assert code == 0, printed
    code, printed = await run_trove("exclusions", env=env)
    assert "no host is on the shared list" in printed
    # A list emptied and deleted by hand is written again.
    await (await bus.js.key_value(EXCLUSIONS_BUCKET)).delete(LIST_KEY)
    code, printed = await run_trove("exclude", "again.example", env=env)
    assert code == 0, printed
    assert await _listed(bus) == ("again.example",)


async def test_a_host_that_is_none_is_refused_and_nothing_is_written(
    stack: StackUrls, bus: Bus
) -> None:
    env = {**os.environ, "TROVE_NATS_URL": stack.nats_url}

    code, printed = await run_trove("exclude", "fine.example", "org", env=env)

    assert code == 1
    assert "'org' is a whole top-level domain" in printed
    # The refusal comes before the list is read: the good host is not written either.
    with pytest.raises(KeyNotFoundError):
        await (await bus.js.key_value(EXCLUSIONS_BUCKET)).get(LIST_KEY)
