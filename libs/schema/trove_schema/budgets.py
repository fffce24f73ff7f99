"""The cycle's budgets discovery counts in the seen bucket (``trove_seen``), keyed here.

A host's page budget (``TROVE_HOST_PAGE_BUDGET``): the pages discovered of the host
this cycle, when the cycle began, and the batches counted lately: each one's mark (its
cause and the host, ``batch_mark``), its pages counted, when, and which (``{"n": 37,
"since": 1795000000.0, "marks": [["q3Zx9aBcD0eF", 3, 1795000123, "<page keys>"],
...]}``; a record written before marks were kept, with ``last`` and ``recent``, reads as
one without them, and a mark written before they named their pages as their number). A
site's host budget (``TROVE_SITE_HOST_BUDGET``, ``trove_discovery.sites``): the host
names of the registrable domain that got pages this cycle (``{"hosts": [...], "since":
…}``).

A cycle is the longest re-crawl interval (``DiscoverySettings.recrawl_max``, 30 days),
counted from the first page or host it counts. Every write sets the key again, so its
expiry alone would never end the cycle of a host that keeps bringing new pages: a
blog posting every few days would add up its whole life against a budget meant for a
cycle, and then get nothing. A record older than its cycle counts from nothing, and a
key that expired too. A record written before cycles were kept (no ``since``) begins
its cycle when it is next read. Discovery writes them; ``trove domain`` reads them.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

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


#: The IPv6 network one holder is given (RFC 6177: a /64 at least, to any VPS): its
#: addresses are one site, as a domain's subdomains are.
IPV6_SITE_PREFIX = 64


def site_of(host: str, platforms: frozenset[str] = PLATFORMS) -> str | None:
    """The site whose host budget counts ``host``, or None when none does: a registrable
    domain; an IPv6 address's /64, which one server is given whole and whose addresses
    are as free to link to as subdomains; none for an IPv4 address (too scarce to make
    a farm of) and for a platform's subdomains, each a site of its own."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        site = registrable_domain(host)
        return None if site in platforms else site
    if address.version == 6:
        return str(ipaddress.ip_network((address, IPV6_SITE_PREFIX), strict=False))
    return None


def host_budget_key(host: str) -> str:
    return "b." + hashlib.sha256(host.encode()).hexdigest()[:40]


def site_budget_key(site: str) -> str:
    return "s." + hashlib.sha256(site.encode()).hexdigest()[:40]


def batch_mark(cause: str, host: str) -> str:
    """The mark of a budget batch: the pages of ``host`` that ``cause`` (the event whose
    handling counts them: a crawled page, a poll) brings. 72 bits of a hash, 12
    characters in the record where the two ids would take some 50."""
    digest = hashlib.sha256(f"{cause} {host}".encode()).digest()[:9]
    return base64.urlsafe_b64encode(digest).decode()


#: How long a host's record remembers a batch it counted, so that its cause handled again
#: (its ack lost, its pod gone, an alias hold handed back, on this replica or another)
#: is granted its pages again, not counted twice: longer than a redelivery comes after
#: the count. The longest alias hold the settings allow (``TROVE_ALIAS_HOLD_SECONDS`` at
#: most 30 s, doubled over at most 3 rounds: 210 s), the events consumer's ack wait
#: (30 s), a failing handler's back-off before it is parked (2 + 4 + 8 + 16 s) and a
#: stopping pod's hand-back (at once) all fall within it: it is the events stream's
#: duplicate window, which the same redelivery's events rely on to be dropped as copies.
BATCH_MEMORY_SECONDS = 600.0
#: Batches a host's record remembers at most, however busy: past one batch every 6 s
#: for ten minutes the oldest go sooner, and a redelivery after a hundred others of the
#: host counts its pages again (a little of its budget). A host's own pages come one per
#: politeness gap (10 s by default), so only links from many other sites' pages reach
#: that, and on such a host over its budget every batch reads the record for the rest
#: of the cycle: some 30 bytes a batch and under 6 a page it counted (3.5 KB at a hundred
#: batches of a page, read in ~0.16 ms on a 2-core VM; 14 KB at a hundred of twenty
#: pages, ~0.22 ms), until its batches pass their memory.
BATCH_MEMORY = 100
#: Bytes of each counted page's key (``_page_key``) a batch keeps: a false match among a
#: page's few hundred links (one in ~4·10⁹ a pair) grants one page without counting it.
PAGE_KEY_BYTES = 4


def _page_key(event_id: str) -> bytes:
    return hashlib.sha256(event_id.encode()).digest()[:PAGE_KEY_BYTES]


class Batch(NamedTuple):
    """A batch a host's record remembers: its ``batch_mark``, the pages it counted, when
    (seconds since the epoch), and which (``packed``: their ``_page_key``s, one after the
    other, in base64; None for a mark written by a release that kept their number alone).

    Which, not how many: the same cause handled again may bring other pages of the host
    than the first time (a link held then while its host's aliases were learned, one
    since folded onto its one spelling, the round before on another replica), so the
    number alone could neither say which of them to grant again nor which to count.
    Kept packed, and read only for the one batch asked about: a full host's record is
    read at every batch that names it."""

    mark: str
    pages: int
    at: int
    packed: str | None = None

    def _raw(self) -> bytes | None:
        """The pages' keys one after the other; None when the mark names none, or names
        them unreadably (then it is read as its number alone)."""
        if self.packed is None:
            return None
        try:
            raw = base64.b64decode(self.packed, validate=True)
        except ValueError:
            return None
        return raw if len(raw) % PAGE_KEY_BYTES == 0 else None

    def keys(self) -> frozenset[bytes] | None:
        """The pages' keys; None when the mark does not name them (``_raw``)."""
        raw = self._raw()
        if raw is None:
            return None
        size = PAGE_KEY_BYTES
        return frozenset(raw[i : i + size] for i in range(0, len(raw), size))

    def with_pages(self, event_ids: Sequence[str], now: float) -> Batch:
        """This batch with ``event_ids`` counted too, at ``now``."""
        raw = self._raw()
        packed = None
        if raw is not None:
            packed = base64.b64encode(raw + b"".join(map(_page_key, event_ids))).decode()
        return Batch(self.mark, self.pages + len(event_ids), int(now), packed)

    def to_json(self) -> list[object]:
        if self.packed is None:
            return [self.mark, self.pages, self.at]
        # A list of four, which the release before reads as no mark at all (it takes
        # lists of three): rolled back to, it counts a redelivery's pages again.
        return [self.mark, self.pages, self.at, self.packed]

    @classmethod
    def from_json(cls, mark: object) -> Batch | None:
        if not isinstance(mark, list) or len(mark) not in (3, 4):
            return None
        packed = mark[3] if len(mark) == 4 and isinstance(mark[3], str) else None
        return cls(str(mark[0]), int(mark[1]), int(mark[2]), packed)


@dataclass(frozen=True, slots=True)
class HostCount:
    """A host's pages counted this cycle, which began at ``since`` (seconds since the
    epoch; 0: not known), and the batches counted within ``BATCH_MEMORY_SECONDS``
    (``marks``)."""

    pages: int = 0
    since: float = 0.0
    marks: tuple[Batch, ...] = ()

    @classmethod
    def from_bytes(cls, value: bytes | None) -> HostCount:
        state = json.loads(value or b"{}")
        marks = state.get("marks")
        return cls(
            pages=int(state.get("n", 0)),
            since=float(state.get("since", 0.0)),
            marks=tuple(
                batch
                for mark in (marks if isinstance(marks, list) else ())
                if (batch := Batch.from_json(mark)) is not None
            ),
        )

    def to_bytes(self) -> bytes:
        marks = [batch.to_json() for batch in self.marks]
        state = {"n": self.pages, "since": self.since, "marks": marks}
        return json.dumps(state, separators=(",", ":")).encode()

    def _batch(self, mark: str) -> Batch | None:
        return next((batch for batch in self.marks if batch.mark == mark), None)

    def counted_of(self, mark: str, event_ids: Sequence[str]) -> list[str]:
        """Those of ``event_ids`` (new pages of the host, in order) the batch ``mark``
        counted already. One remembered by their number alone counted the first ones."""
        batch = self._batch(mark)
        if batch is None:
            return []
        keys = batch.keys()
        if keys is None:
            return list(event_ids[: batch.pages])
        return [event_id for event_id in event_ids if _page_key(event_id) in keys]

    def add(self, mark: str, event_ids: Sequence[str], now: float) -> HostCount:
        """This count with the pages ``event_ids`` of the batch ``mark``, counted at ``now``."""
        before = self._batch(mark) or Batch(mark, 0, int(now), "")
        kept = [b for b in self.marks if b.mark != mark and now - b.at < BATCH_MEMORY_SECONDS]
        marks = (*kept, before.with_pages(event_ids, now))[-BATCH_MEMORY:]
        return HostCount(self.pages + len(event_ids), self.since, marks)

    def in_cycle(self, now: float, cycle: float) -> HostCount:
        """The count as it stands at ``now``: nothing once ``cycle`` seconds have passed
        since the cycle began."""
        if _ended(self.since, now, cycle):
            return HostCount(since=now)
        # Marks past their memory are dropped here, not only when a batch is added: a host
        # over its budget is read at every batch and written at none.
        marks = tuple(b for b in self.marks if now - b.at < BATCH_MEMORY_SECONDS)
        return replace(self, since=self.since or now, marks=marks)


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
