"""``trove exclude``, ``trove include`` and ``trove exclusions``: the shared list of
excluded hosts.

The list is the ``hosts`` key of the ``trove_exclusions`` bucket, in the format of
``TROVE_EXCLUDED_HOSTS_FILE`` (``trove_schema.exclusions``). ``trove exclude HOST``
adds a line for each host, with the reason and the date as its comment; ``trove include
HOST`` takes a host off the list. Each change is a compare-and-set on the key's last
revision, so two operators editing at once both keep their change. Discovery and every
fetcher read the list within ``TROVE_EXCLUSIONS_REFRESH_SECONDS``: no rollout. Rules
in the services' settings are not on this list, and cannot be lifted from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from rich.console import Console
from rich.markup import escape

from trove_cli.broker import connect
from trove_schema.exclusions import (
    LIST_KEY,
    listed_with,
    listed_without,
    read_rules_tolerantly,
    rule_of,
)
from trove_schema.settings import CommonSettings
from trove_schema.topology import EXCLUSIONS_BUCKET, TopologyOptions, declare, ensure_topology

#: Compare-and-sets tried before giving up on a list that others keep changing.
ATTEMPTS = 10


async def exclusions_command(
    nats_url: str,
    console: Console,
    *,
    action: str,
    hosts: Sequence[str] = (),
    reason: str = "",
) -> int:
    """``action``: ``exclude`` or ``include`` the ``hosts``, or ``list`` the shared list.
    Raises InvalidExclusion (before anything is written) for a host that is none."""
    rules = [rule_of(host) for host in hosts]
    nc = await connect(nats_url)
    try:
        js = nc.jetstream()
        # The CLI owns nothing: it creates the bucket if no service has yet.
        await ensure_topology(
            js, declare(TopologyOptions.from_settings(CommonSettings())), owner="cli"
        )
        kv = await js.key_value(EXCLUSIONS_BUCKET)
        if action == "list":
            _, text = await _read(kv)
            return _show(console, text)
        today = f"{datetime.now(UTC):%Y-%m-%d}"
        # One line: a reason's own line breaks would end the comment.
        note = f"{' '.join(reason.split())} ({today})" if reason.strip() else today
        for _ in range(ATTEMPTS):
            revision, text = await _read(kv)
            changed = text
            unchanged: list[str] = []
            for rule in rules:
                before = changed
                if action == "exclude":
                    changed = listed_with(changed, rule, note)
                else:
                    changed = listed_without(changed, rule)
                if changed == before:
                    unchanged.append(rule)
            if changed == text:
                break
            try:
                if revision:
                    await kv.update(LIST_KEY, changed.encode(), last=revision)
                else:  # none yet, or deleted (nats-py writes over the delete marker)
                    await kv.create(LIST_KEY, changed.encode())
            except KeyWrongLastSequenceError:
                continue  # another change came first: apply ours to it
            break
        else:
            console.print(f"[red]the list kept changing: tried {ATTEMPTS} times[/red]")
            return 1
        for rule in rules:
            if rule not in unchanged:
                done = "excluded" if action == "exclude" else "taken off the shared list"
                console.print(f"{escape(rule)}: {done} (the services read it within seconds)")
            elif action == "exclude":
                console.print(f"{escape(rule)}: on the shared list already")
            else:
                # It may still be in the services' settings, which this list cannot lift.
                console.print(f"{escape(rule)}: not on the shared list")
        return 0
    finally:
        await nc.close()


async def _read(kv: KeyValue) -> tuple[int, str]:
    """The list's revision (0: there is none, or it was deleted) and its text."""
    try:
        entry = await kv.get(LIST_KEY)
    except KeyNotFoundError:
        return 0, ""
    return entry.revision or 0, (entry.value or b"").decode("utf-8", "replace")


def _show(console: Console, text: str) -> int:
    rules, errors = read_rules_tolerantly(text.splitlines())
    if not rules and not errors:
        console.print(f"no host is on the shared list ({EXCLUSIONS_BUCKET} {LIST_KEY})")
        return 0
    for line in text.splitlines():
        if line.strip():
            console.print(escape(line))
    for error in errors:
        console.print(f"[red]skipped by the services: {escape(str(error))}[/red]")
    return 0
