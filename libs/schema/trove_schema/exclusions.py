"""Hosts the operator keeps Trove away from: spam farms, and sites that asked to be left out.

A rule is a host name, and it covers that host and every name below it: ``example.org``
covers ``www.example.org`` and ``blog.example.org``, so one rule answers a site owner
who asks for their site to be left alone, whatever its spellings. A rule is written as
a host or as a URL (its host is taken), and spelt as Trove spells hosts in canonical
URLs (lower case, IDNA), so ``Bücher.Example`` and ``xn--bcher-kva.example`` are one
rule. A single label (``org``) is refused: it would be a whole top-level domain.

Rules come from two places, and a host is excluded when either has it:

* the services' settings (``TROVE_EXCLUDED_HOSTS``, and one or more a line in
  ``TROVE_EXCLUDED_HOSTS_FILE``), fixed for the life of a process: a change is a rollout;
* the shared list, the ``hosts`` key of the ``trove_exclusions`` bucket, in the file's
  format (``trove exclude HOST``, or ``nats kv put trove_exclusions hosts ...``). Every
  discovery and fetcher process reads it at start and looks again every
  ``TROVE_EXCLUSIONS_REFRESH_SECONDS`` (``ListedExclusions``), so a site owner's request
  holds within seconds, without a rollout. A line of it that names no host is logged
  and skipped, so one typo does not hold back the other rules; while the broker is away
  the rules last read stay in force.

Discovery never discovers a page on an excluded host (a seed for one is refused with the
reason), and the fetcher never sends it a request: work that was already queued or
scheduled for it is recorded as ``rejected`` without one, so the host's pages leave the
search at their next visit.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from nats.js.errors import KeyNotFoundError

from trove_schema.errors import InvalidExclusion, InvalidURL
from trove_schema.urls import canonicalize, domain_of

if TYPE_CHECKING:
    from nats.js.kv import KeyValue

    from trove_schema.settings import CommonSettings

#: The shared list's key in ``trove_schema.topology.EXCLUSIONS_BUCKET``.
LIST_KEY = "hosts"

log = logging.getLogger("trove.exclusions")


def rule_of(raw: str) -> str:
    """The rule ``raw`` (a host name or a URL) stands for. Raises InvalidExclusion."""
    text = raw.strip()
    if text.startswith("*."):
        text = text[2:]  # "*.example.org": the rule covers the names below it anyway
    url = text if "://" in text else f"http://{text.rstrip('.')}/"
    try:
        host = domain_of(canonicalize(url))
    except InvalidURL as exc:
        raise InvalidExclusion(f"{raw!r} is not a host name: {exc.reason}") from None
    if "." not in host and ":" not in host:
        raise InvalidExclusion(f"{raw!r} is a whole top-level domain")
    return host


def read_rules(lines: Iterable[str]) -> tuple[str, ...]:
    """Rules from lines of text: one or more a line, separated by commas or blanks; ``#``
    starts a comment. Raises InvalidExclusion for the first that is not a host."""
    rules, errors = read_rules_tolerantly(lines)
    if errors:
        raise errors[0]
    return rules


def read_rules_tolerantly(
    lines: Iterable[str],
) -> tuple[tuple[str, ...], list[InvalidExclusion]]:
    """The rules of ``lines`` that name a host, and an error for each that does not."""
    rules: dict[str, None] = {}
    errors: list[InvalidExclusion] = []
    for number, line in enumerate(lines, start=1):
        for raw in _words(line):
            try:
                rules[rule_of(raw)] = None
            except InvalidExclusion as exc:
                errors.append(InvalidExclusion(f"line {number}: {exc}"))
    return tuple(rules), errors


def _words(line: str) -> list[str]:
    return line.split("#", 1)[0].replace(",", " ").split()


def read_rules_file(path: Path) -> tuple[str, ...]:
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidExclusion(f"cannot read the excluded hosts in {path}: {exc}") from None
    try:
        return read_rules(text.splitlines())
    except InvalidExclusion as exc:
        raise InvalidExclusion(f"{path}, {exc}") from None


class Exclusions:
    """The operator's rules, asked of every host before Trove goes near it.

    One object a process, shared by everything in it that asks (discovery's seeds and
    links, the fetcher's work and its transport), so that all of them answer alike; the
    shared list's rules are swapped in whole (``take_listed``) when it changes.
    """

    __slots__ = ("configured", "rules")

    def __init__(self, rules: Iterable[str] = ()) -> None:
        #: The settings' rules, fixed for the process.
        self.configured: frozenset[str] = frozenset(rules)
        #: Every rule in force: the settings' and the shared list's.
        self.rules: frozenset[str] = self.configured

    @classmethod
    def of(cls, *groups: Iterable[str]) -> Exclusions:
        return cls(rule for group in groups for rule in group)

    @classmethod
    def from_settings(cls, settings: CommonSettings) -> Exclusions:
        listed = settings.excluded_hosts
        if settings.excluded_hosts_file is None:
            return cls.of(listed)
        return cls.of(listed, read_rules_file(settings.excluded_hosts_file))

    def take_listed(self, listed: Iterable[str]) -> None:
        """Put the shared list's rules in force, in place of the ones it had before."""
        self.rules = self.configured | frozenset(listed)

    def covering(self, host: str) -> str | None:
        """The rule that covers ``host`` (a canonical URL's host), if one does."""
        if not self.rules:
            return None
        if host in self.rules:
            return host
        if is_address(host):
            return None  # an address is covered by itself only
        dot = host.find(".")
        while dot != -1:
            parent = host[dot + 1 :]
            if parent in self.rules:
                return parent
            dot = host.find(".", dot + 1)
        return None

    def refusal(self, host: str) -> str | None:
        """Why Trove goes nowhere near ``host``, in words for the operator; None if it may."""
        rule = self.covering(host)
        return None if rule is None else f"host {host} is excluded by the operator ({rule})"

    def __bool__(self) -> bool:
        return bool(self.rules)


#: No rules: what a caller that was given none asks (never given a shared list).
NO_EXCLUSIONS = Exclusions()


def is_address(host: str) -> bool:
    """Whether ``host`` is an IP address: a rule of one covers that address alone."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class ListedExclusions:
    """Keeps a process's ``Exclusions`` up to date with the shared list.

    The list is one key, read with a direct get every ``interval``: a request that costs
    nats-server less than a watch's consumer would, and that needs nothing rebuilt when
    the broker comes back.
    """

    def __init__(self, exclusions: Exclusions, kv: KeyValue, interval: float) -> None:
        self.exclusions = exclusions
        self.kv = kv
        self.interval = interval
        #: The revision of the list in force: None before the first read, 0 when there is none.
        self.revision: int | None = None
        self._away = False

    async def refresh(self) -> None:
        """Read the list once and put it in force if it changed. Raises what the broker
        raises (it is away, or slow to answer)."""
        try:
            entry = await self.kv.get(LIST_KEY)
        except KeyNotFoundError as exc:
            # Never written (revision 0), or deleted or purged: no listed rules since the
            # marker, whose revision nats-py hands over with the error.
            revision, text = (exc.entry.revision if exc.entry else 0) or 0, ""
        else:
            revision, text = entry.revision or 0, (entry.value or b"").decode("utf-8", "replace")
        if self.revision is not None and revision <= self.revision:
            # Never back to an older list: two reads in flight (the loop's, a refusal's)
            # may answer out of turn, and a direct get may be answered by a replica
            # behind the leader; a host excluded a moment ago was let through again.
            return
        rules, errors = read_rules_tolerantly(text.splitlines())
        for error in errors:
            log.error(
                "the shared list of excluded hosts (revision %d): %s; skipped", revision, error
            )
        self.exclusions.take_listed(rules)
        self.revision = revision
        log.info(
            "excluded hosts: %d in force (%d listed, revision %d)",
            len(self.exclusions.rules),
            len(rules),
            revision,
        )

    async def refusal(self, host: str) -> str | None:
        """Why Trove goes nowhere near ``host``, judged on the latest list when a listed
        rule is why: a host taken off the list a moment ago is not refused on this
        process's older copy (its work would be recorded ``rejected`` and not come back).
        Raises what the broker raises."""
        rule = self.exclusions.covering(host)
        if rule is not None and rule not in self.exclusions.configured:
            await self.refresh()
        return self.exclusions.refusal(host)

    async def fresh(self) -> Exclusions:
        """The rules as the shared list has them now, for a judgement an operator waits
        on (a seed, a follow): it holds right after ``trove exclude`` or ``trove
        include``, not within the refresh interval. One read; with the broker away or
        slow, the rules in force."""
        try:
            await self.refresh()
        except Exception as exc:  # the broker's trouble: keep what is in force
            log.debug("the shared list of excluded hosts not read, kept as it was: %s", exc)
        return self.exclusions

    async def keep(self, stop: asyncio.Event) -> None:
        """Refresh every ``interval`` until ``stop``. While the broker is away the rules
        last read stay in force; that is logged once, and once again when it answers."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
            if stop.is_set():
                return
            try:
                await self.refresh()
            except Exception as exc:  # the broker away or slow: keep what is in force
                if not self._away:
                    log.warning(
                        "the shared list of excluded hosts not read, kept as it was: %s", exc
                    )
                self._away = True
            else:
                if self._away:
                    log.info("the shared list of excluded hosts read again")
                self._away = False


def listed_with(text: str, rule: str, note: str = "") -> str:
    """The shared list ``text`` with ``rule`` on a line of its own (and ``note`` as its
    comment), unless a line already names it."""
    if rule in _rules_named(text):
        return text
    line = f"{rule}  # {note}" if note else rule
    return f"{text.rstrip()}\n{line}\n" if text.strip() else f"{line}\n"


def listed_without(text: str, rule: str) -> str:
    """The shared list ``text`` without ``rule``: the lines that name only it are dropped,
    and it is taken out of the lines that name others too."""
    kept: list[str] = []
    for line in text.splitlines():
        words = _words(line)
        named = [w for w in words if _spelt(w) == rule]
        if not named:
            kept.append(line)
        elif len(named) < len(words):
            comment = line.split("#", 1)[1] if "#" in line else ""
            rest = " ".join(w for w in words if _spelt(w) != rule)
            kept.append(f"{rest}  #{comment}" if comment else rest)
    return "\n".join(kept) + "\n" if kept else ""


def _rules_named(text: str) -> set[str | None]:
    return {_spelt(word) for line in text.splitlines() for word in _words(line)}


def _spelt(word: str) -> str | None:
    try:
        return rule_of(word)
    except InvalidExclusion:
        return None
