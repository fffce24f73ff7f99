"""Hosts the operator keeps Trove away from: spam farms, and sites that asked to be left out.

A rule is a host name, and it covers that host and every name below it: ``example.org``
covers ``www.example.org`` and ``blog.example.org``, so one rule answers a site owner
who asks for their site to be left alone, whatever its spellings. A rule is written as
a host or as a URL (its host is taken), and spelt as Trove spells hosts in canonical
URLs (lower case, IDNA), so ``Bücher.Example`` and ``xn--bcher-kva.example`` are one
rule. A single label (``org``) is refused: it would be a whole top-level domain.

Rules come from the services' settings (``TROVE_EXCLUDED_HOSTS``, and one a line in
``TROVE_EXCLUDED_HOSTS_FILE``), so a change is a rollout, as for any setting. Discovery
never discovers a page on an excluded host (a seed for one is refused with the reason),
and the fetcher never sends it a request: work that was already queued or scheduled for
it is recorded as ``rejected`` without one, so the host's pages leave the search at
their next visit.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trove_schema.errors import InvalidExclusion, InvalidURL
from trove_schema.urls import canonicalize, domain_of

if TYPE_CHECKING:
    from trove_schema.settings import CommonSettings


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
    rules: dict[str, None] = {}
    for number, line in enumerate(lines, start=1):
        for raw in line.split("#", 1)[0].replace(",", " ").split():
            try:
                rules[rule_of(raw)] = None
            except InvalidExclusion as exc:
                raise InvalidExclusion(f"line {number}: {exc}") from None
    return tuple(rules)


def read_rules_file(path: Path) -> tuple[str, ...]:
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidExclusion(f"cannot read the excluded hosts in {path}: {exc}") from None
    try:
        return read_rules(text.splitlines())
    except InvalidExclusion as exc:
        raise InvalidExclusion(f"{path}, {exc}") from None


@dataclass(frozen=True, slots=True)
class Exclusions:
    """The operator's rules, asked of every host before Trove goes near it."""

    rules: frozenset[str] = frozenset()

    @classmethod
    def of(cls, *groups: Iterable[str]) -> Exclusions:
        return cls(frozenset(rule for group in groups for rule in group))

    @classmethod
    def from_settings(cls, settings: CommonSettings) -> Exclusions:
        listed = settings.excluded_hosts
        if settings.excluded_hosts_file is None:
            return cls.of(listed)
        return cls.of(listed, read_rules_file(settings.excluded_hosts_file))

    def covering(self, host: str) -> str | None:
        """The rule that covers ``host`` (a canonical URL's host), if one does."""
        if not self.rules:
            return None
        if host in self.rules:
            return host
        if _is_address(host):
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


#: No rules: what a caller that was given none asks.
NO_EXCLUSIONS = Exclusions()


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
