"""The cycle's budgets discovery counts in the seen bucket (``trove_seen``), keyed here.

A host's page budget (``TROVE_HOST_PAGE_BUDGET``): the pages discovered of the host
this cycle, the last event counted, the last of each of the pages counted lately, and
when the cycle began (``{"n": 37, "last": "<event id>", "recent": [...], "since":
1795000000.0}``). A site's host budget
(``TROVE_SITE_HOST_BUDGET``, ``trove_discovery.sites``): the host names of the
registrable domain that got pages this cycle (``{"hosts": [...], "since": …}``).

A cycle is the longest re-crawl interval (``DiscoverySettings.recrawl_max``, 30 days),
counted from the first page or host it counts. Every write sets the key again, so its
expiry alone would never end the cycle of a host that keeps bringing new pages: a
blog posting every few days would add up its whole life against a budget meant for a
cycle, and then get nothing. A record older than its cycle counts from nothing, and a
key that expired too. A record written before cycles were kept (no ``since``) begins
its cycle when it is next read. Discovery writes them; ``trove domain`` reads them.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import dataclass, replace

from trove_schema.urls import registrable_domain

#: Hosting platforms of the small web that give each person a subdomain and are not in
#: the public suffix list (github.io, blogspot.com, pages.dev are, and need no entry).
PLATFORMS = frozenset(
    {
        "bandcamp.com",
        "bearblog.dev",
        "dreamwidth.org",
        "flounder.online",
        "ghost.io",
        "gitbook.io",
        "hashnode.dev",
        "itch.io",
        "jimdofree.com",
        "livejournal.com",
        "mataroa.blog",
        "medium.com",
        "micro.blog",
        "neocities.org",
        "over-blog.com",
        "posthaven.com",
        "prose.sh",
        "smol.pub",
        "substack.com",
        "surge.sh",
        "tumblr.com",
        "typepad.com",
        "weebly.com",
        "wordpress.com",
        "write.as",
    }
)


def site_of(host: str, platforms: frozenset[str] = PLATFORMS) -> str | None:
    """The site (registrable domain) whose host budget counts ``host``, or None when none
    does: an address has no names under it, and a platform's subdomains are each a site."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        site = registrable_domain(host)
        return None if site in platforms else site
    return None


def host_budget_key(host: str) -> str:
    return "b." + hashlib.sha256(host.encode()).hexdigest()[:40]


def site_budget_key(site: str) -> str:
    return "s." + hashlib.sha256(site.encode()).hexdigest()[:40]


#: Pages whose last counted link a host's record keeps: a page handled again (its ack
#: lost, an alias hold handed back) after others of its host were counted is known.
RECENT_COUNTED = 8


@dataclass(frozen=True, slots=True)
class HostCount:
    """A host's pages counted this cycle, up to the event ``last`` (and the last of each
    of the ``RECENT_COUNTED`` batches before it, ``recent``); the cycle began at
    ``since`` (seconds since the epoch; 0: not known)."""

    pages: int = 0
    last: str = ""
    since: float = 0.0
    recent: tuple[str, ...] = ()

    @classmethod
    def from_bytes(cls, value: bytes | None) -> HostCount:
        state = json.loads(value or b"{}")
        recent = state.get("recent")
        return cls(
            pages=int(state.get("n", 0)),
            last=str(state.get("last", "")),
            since=float(state.get("since", 0.0)),
            recent=tuple(str(v) for v in recent) if isinstance(recent, list) else (),
        )

    def to_bytes(self) -> bytes:
        state = {"n": self.pages, "last": self.last, "since": self.since}
        if self.recent:
            state["recent"] = list(self.recent)
        return json.dumps(state).encode()

    def counted(self, event_ids: list[str]) -> int:
        """How many of a page's ``event_ids`` (in its order) were counted already: up to
        the last of them this record knows."""
        marks = {self.last, *self.recent} - {""}
        for n in range(len(event_ids) - 1, -1, -1):
            if event_ids[n] in marks:
                return n + 1
        return 0

    def add(self, pending: list[str], within: int) -> HostCount:
        """This count with the first ``within`` of ``pending`` counted."""
        mark = pending[within - 1]
        recent = (*self.recent, mark)[-RECENT_COUNTED:]
        return HostCount(self.pages + within, mark, self.since, recent)

    def in_cycle(self, now: float, cycle: float) -> HostCount:
        """The count as it stands at ``now``: nothing once ``cycle`` seconds have passed
        since the cycle began."""
        if _ended(self.since, now, cycle):
            return HostCount(since=now)
        return self if self.since else replace(self, since=now)


@dataclass(frozen=True, slots=True)
class SiteCount:
    """The host names a site brought pages of this cycle, which began at ``since``."""

    hosts: tuple[str, ...] = ()
    since: float = 0.0

    @classmethod
    def from_bytes(cls, value: bytes | None) -> SiteCount:
        state = json.loads(value or b"{}")
        return cls(
            hosts=tuple(str(host) for host in state.get("hosts", [])),
            since=float(state.get("since", 0.0)),
        )

    def to_bytes(self) -> bytes:
        return json.dumps(
            {"hosts": list(self.hosts), "since": self.since}, separators=(",", ":")
        ).encode()

    def in_cycle(self, now: float, cycle: float) -> SiteCount:
        """As ``HostCount.in_cycle``."""
        if _ended(self.since, now, cycle):
            return SiteCount(since=now)
        return self if self.since else replace(self, since=now)


def _ended(since: float, now: float, cycle: float) -> bool:
    """Whether a cycle that began at ``since`` (0: not known) is over at ``now``."""
    return bool(since and cycle and now - since >= cycle)
