"""The operator's excluded hosts: how a rule is read, which hosts it covers, and the shared
list every process keeps in force (on a real nats-server)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path
from typing import cast

import pytest
from nats.js.kv import KeyValue

from tests.conftest import eventually
from tests.ports import free_port
from trove_schema.bus import Bus
from trove_schema.errors import InvalidExclusion
from trove_schema.exclusions import (
    LIST_KEY,
    Exclusions,
    ListedExclusions,
    listed_with,
    listed_without,
    read_rules,
    read_rules_tolerantly,
    rule_of,
)
from trove_schema.settings import FetcherSettings
from trove_schema.topology import EXCLUSIONS_BUCKET, declare, ensure_topology
from trove_stack.nats import EmbeddedNats, NatsConfig


@pytest.mark.parametrize(
    ("raw", "rule"),
    [
        ("example.org", "example.org"),
        ("Example.ORG.", "example.org"),
        ("*.example.org", "example.org"),
        ("https://Blog.Example.org:8443/about?x=1", "blog.example.org"),
        ("Bücher.Example", "xn--bcher-kva.example"),
        ("127.0.0.5", "127.0.0.5"),
    ],
)
def test_a_rule_is_spelt_as_trove_spells_hosts(raw: str, rule: str) -> None:
    assert rule_of(raw) == rule


@pytest.mark.parametrize(
    ("raw", "why"),
    [("org", "top-level domain"), ("exa mple.org", "not a host name"), ("ftp://x.org/", "ftp")],
)
def test_a_rule_that_names_no_host_is_refused_with_the_reason(raw: str, why: str) -> None:
    with pytest.raises(InvalidExclusion, match=why):
        rule_of(raw)


def test_a_rule_covers_its_host_and_every_name_below_it_and_nothing_else() -> None:
    rules = Exclusions.of(["example.org", "spam.example.net", "127.0.0.5"])
    assert rules.covering("example.org") == "example.org"
    assert rules.covering("www.example.org") == "example.org"
    assert rules.covering("a.b.spam.example.net") == "spam.example.net"
    for host in ("notexample.org", "example.net", "org", "127.0.0.6", "0.0.5", "ham.example.net"):
        assert rules.covering(host) is None, host
    assert Exclusions().covering("example.org") is None


def test_rules_are_read_from_lines_with_commas_blanks_and_comments() -> None:
    lines = ["# spam farms", "a.example, b.example  c.example", "", "A.example # twice"]
    assert read_rules(lines) == ("a.example", "b.example", "c.example")


def test_the_settings_refuse_a_bad_rule_or_an_unreadable_file_at_start(tmp_path: Path) -> None:
    listed = tmp_path / "excluded.txt"
    listed.write_text("# removal requests\nblog.example\nshop.example\n")
    settings = FetcherSettings(excluded_hosts="spam.example", excluded_hosts_file=listed)
    rules = Exclusions.from_settings(settings)
    assert rules.rules == {"spam.example", "blog.example", "shop.example"}
    with pytest.raises(ValueError, match="top-level domain"):
        FetcherSettings(excluded_hosts="example, com")
    listed.write_text("fine.example\nexample.org/path, exa%mple.org\n")
    with pytest.raises(ValueError, match=r"excluded\.txt, line 2: 'exa%mple\.org' is not a host"):
        FetcherSettings(excluded_hosts_file=listed)
    with pytest.raises(ValueError, match="cannot read"):
        FetcherSettings(excluded_hosts_file=tmp_path / "missing.txt")


def test_the_shared_list_skips_a_line_that_names_no_host_and_keeps_the_others() -> None:
    lines = ["spam.example  # farm", "exa%mple.org, ok.example", "org", "Blog.Example"]
    rules, errors = read_rules_tolerantly(lines)
    assert rules == ("spam.example", "ok.example", "blog.example")
    assert [str(e).split(":")[0] for e in errors] == ["line 2", "line 3"]
    assert "'exa%mple.org' is not a host name" in str(errors[0])
    assert "'org' is a whole top-level domain" in str(errors[1])


def test_the_shared_lists_rules_join_the_settings_and_replace_the_last_ones() -> None:
    rules = Exclusions.of(["configured.example"])
    rules.take_listed(["a.example", "b.example"])
    assert rules.covering("www.a.example") == "a.example"
    assert rules.covering("configured.example") == "configured.example"
    rules.take_listed(["b.example"])
    assert rules.covering("a.example") is None
    assert rules.covering("b.example") == "b.example"
    rules.take_listed([])
    assert rules.rules == {"configured.example"}


def test_a_host_goes_on_the_list_once_with_its_note_and_comes_off_it_alone() -> None:
    text = listed_with("", "a.example", "asked by its owner (2026-11-28)")
    assert text == "a.example  # asked by its owner (2026-11-28)\n"
    assert listed_with(text, "a.example", "again") == text
    text = listed_with(text, "b.example")
    assert read_rules_tolerantly(text.splitlines())[0] == ("a.example", "b.example")
    # Spelt another way, it is the same rule.
    assert listed_without(text, rule_of("https://A.Example/x")) == "b.example\n"
    shared = "# farms\nc.example, d.example  # one line\n"
    assert listed_without(shared, "c.example") == "# farms\nd.example  # one line\n"
    assert listed_without("e.example\n", "e.example") == ""


async def _keeping(listed: ListedExclusions) -> tuple[asyncio.Event, asyncio.Task[None]]:
    await listed.refresh()
    stop = asyncio.Event()
    return stop, asyncio.create_task(listed.keep(stop))


async def _stopped(stop: asyncio.Event, task: asyncio.Task[None]) -> None:
    stop.set()
    await asyncio.wait_for(task, 10)


@pytest.mark.integration
async def test_the_shared_list_is_in_force_within_the_refresh_and_lifted_when_deleted(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    # A bucket of this test's own, shaped as the topology's: the stack's is shared.
    config = replace(
        next(b for b in declare().buckets if b.bucket == EXCLUSIONS_BUCKET),
        bucket="trove_exclusions_test",
    )
    kv = await bus.js.create_key_value(config)
    exclusions = Exclusions.of(["configured.example"])
    listed = ListedExclusions(exclusions, kv, interval=0.1)
    stop, task = await _keeping(listed)
    try:
        assert exclusions.rules == {"configured.example"}
        await kv.put(LIST_KEY, b"a.example  # asked by its owner\nb.example\n")
        await eventually(
            lambda: _covering(exclusions, "www.a.example"),
            until=lambda rule: rule == "a.example",
            timeout=10,
            what="the listed host excluded",
        )
        with caplog.at_level(logging.ERROR, logger="trove.exclusions"):
            await kv.put(LIST_KEY, b"b.example\nexa%mple.org\nc.example\n")
            await eventually(
                lambda: _covering(exclusions, "c.example"),
                until=lambda rule: rule == "c.example",
                timeout=10,
                what="the rules around a bad line in force",
            )
        assert exclusions.rules == {"configured.example", "b.example", "c.example"}
        assert any("line 2: 'exa%mple.org'" in r.getMessage() for r in caplog.records)
        await kv.delete(LIST_KEY)
        await eventually(
            lambda: _covering(exclusions, "b.example"),
            until=lambda rule: rule is None,
            timeout=10,
            what="the deleted list lifted",
        )
        assert exclusions.rules == {"configured.example"}
    finally:
        await _stopped(stop, task)
        await bus.js.delete_key_value(config.bucket)


@pytest.mark.integration
async def test_a_refusal_by_the_shared_list_is_judged_on_the_latest_list(bus: Bus) -> None:
    config = replace(
        next(b for b in declare().buckets if b.bucket == EXCLUSIONS_BUCKET),
        bucket="trove_exclusions_refusal_test",
    )
    kv = await bus.js.create_key_value(config)
    try:
        exclusions = Exclusions.of(["configured.example"])
        listed = ListedExclusions(exclusions, kv, interval=3600.0)
        await kv.put(LIST_KEY, b"lifted.example\nkept.example\n")
        await listed.refresh()
        # Taken off the list after this process read it, and before it looks again.
        await kv.put(LIST_KEY, b"kept.example\n")
        assert exclusions.covering("lifted.example") == "lifted.example"

        assert await listed.refusal("www.lifted.example") is None
        assert await listed.refusal("kept.example") == (
            "host kept.example is excluded by the operator (kept.example)"
        )
        assert await listed.refusal("configured.example") is not None
        assert await listed.refusal("free.example") is None
    finally:
        await bus.js.delete_key_value(config.bucket)


class _LateFirstAnswer:
    """The bucket, whose first answer is read at once and handed over only when let:
    what two reads in flight, or a replica behind the leader, can do."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self.read = asyncio.Event()
        self.let = asyncio.Event()
        self.calls = 0

    async def get(self, key: str) -> KeyValue.Entry:
        self.calls += 1
        entry = await self.kv.get(key)
        if self.calls == 1:
            self.read.set()
            await self.let.wait()
        return entry


@pytest.mark.integration
async def test_an_answer_older_than_the_list_in_force_never_puts_it_back(bus: Bus) -> None:
    config = replace(
        next(b for b in declare().buckets if b.bucket == EXCLUSIONS_BUCKET),
        bucket="trove_exclusions_late_test",
    )
    kv = await bus.js.create_key_value(config)
    try:
        await kv.put(LIST_KEY, b"old.example\n")
        late = _LateFirstAnswer(kv)
        exclusions = Exclusions()
        listed = ListedExclusions(exclusions, cast(KeyValue, late), interval=3600.0)
        first = asyncio.create_task(listed.refresh())
        await asyncio.wait_for(late.read.wait(), 10)
        await kv.put(LIST_KEY, b"old.example\nnew.example\n")
        await listed.refresh()
        assert exclusions.covering("new.example") == "new.example"
        late.let.set()
        await first
        # The list read first, answered last, is older than the one in force.
        assert exclusions.covering("new.example") == "new.example"
        assert await listed.refusal("new.example") is not None
    finally:
        await bus.js.delete_key_value(config.bucket)


@pytest.mark.integration
async def test_the_rules_last_read_stay_in_force_while_the_broker_is_away(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = NatsConfig(store_dir=tmp_path / "nats", port=free_port("127.0.0.1"))
    server = EmbeddedNats(config).start()
    own = await Bus.connect(server.url, name="exclusions-test")
    try:
        await ensure_topology(own.js, declare())
        kv = await own.js.key_value(EXCLUSIONS_BUCKET)
        await kv.put(LIST_KEY, b"a.example\n")
        exclusions = Exclusions()
        listed = ListedExclusions(exclusions, kv, interval=0.1)
        stop, task = await _keeping(listed)
        try:
            assert exclusions.rules == {"a.example"}
            with caplog.at_level(logging.INFO, logger="trove.exclusions"):
                server.stop()
                await eventually(
                    lambda: _messages(caplog),
                    until=lambda logged: any("not read, kept as it was" in m for m in logged),
                    timeout=20,
                    what="the broker's absence noticed",
                )
                assert exclusions.rules == {"a.example"}
                assert not task.done()
                server = EmbeddedNats(config).start()
                writer = await Bus.connect(server.url, name="exclusions-writer")
                try:
                    written = await writer.js.key_value(EXCLUSIONS_BUCKET)
                    await written.put(LIST_KEY, b"a.example\nb.example\n")
                finally:
                    await writer.close()
                await eventually(
                    lambda: _covering(exclusions, "b.example"),
                    until=lambda rule: rule == "b.example",
                    timeout=30,
                    what="the list read again once the broker is back",
                )
            logged = _messages_now(caplog)
            assert sum("not read, kept as it was" in m for m in logged) == 1
            assert any("read again" in m for m in logged)
        finally:
            await _stopped(stop, task)
    finally:
        await own.close()
        server.stop()


async def _covering(exclusions: Exclusions, host: str) -> str | None:
    return exclusions.covering(host)


async def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return _messages_now(caplog)


def _messages_now(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "trove.exclusions"]
