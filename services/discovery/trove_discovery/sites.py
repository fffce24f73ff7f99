"""A site's host names: how many of one registrable domain's hosts links bring in a cycle.

Politeness and the page budget are a host name's (PLATFORM.md says why). A server that
answers every name under its domain (wildcard DNS: a link farm, or a trap whose pages
link to made-up subdomains) would get a gap and a page budget for each name it invents,
and so as many requests at once as its pages name hosts. Discovery therefore counts the
host names of each site (registrable domain, ``trove_schema.urls.registrable_domain``)
that it brings pages of, and past ``TROVE_SITE_HOST_BUDGET`` in one cycle refuses a link
to a further name of the site as it refuses one over its host's page budget: the link
stays seen, and its page is not crawled this cycle. Seeds are the operator's and never
counted.

Platforms whose every subdomain is a different person's site are not counted. Those in
the public suffix list's private section are their own registrable domains already
(``alice.github.io``, ``bob.blogspot.com``); ``trove_schema.budgets.PLATFORMS`` names
the small web's others, and ``TROVE_PLATFORM_DOMAINS`` adds to it.

The count is one record a site in the seen bucket (``trove_schema.budgets.SiteCount``):
the names counted in the cycle, so that a page handled again (a redelivery, a second
replica) counts a name once, and when the cycle began. A refusal is always read from
the bucket, never from memory, as for the page budget: a stale refusal would lose the
page for a whole cycle.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from trove_discovery.sightings import Recent
from trove_schema.budgets import PLATFORMS, SiteCount, site_budget_key, site_of
from trove_schema.bus import Retry
from trove_schema.turns import Turns

log = logging.getLogger("trove.discovery")

#: Compare-and-sets of a site's record lost to other replicas before the page is handed
#: back to ask again.
WRITE_ATTEMPTS = 50
#: Sites a replica remembers refusing a host this cycle, and for how long (seconds): it
#: reads their record before a page's links to their hosts are claimed (``refused``).
REFUSED_MEMORY = 10_000
REFUSED_TTL = 600.0


class SiteHosts:
    """Counts the host names of each site that discovery brings pages of, per cycle."""

    def __init__(
        self,
        seen: KeyValue,
        *,
        budget: int,
        cycle: float,
        platforms: Iterable[str] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.seen = seen
        #: Host names a site may bring in a cycle; 0: no limit.
        self.budget = budget
        #: Seconds from a site's first host counted to its count starting afresh.
        self.cycle = cycle
        self.clock = clock
        self.platforms = PLATFORMS | frozenset(platforms)
        self.turns = Turns()
        #: Sites that refused a host lately: site -> when their cycle ends.
        self.full: Recent[float] = Recent(REFUSED_MEMORY, ttl=REFUSED_TTL)

    async def refused(self, hosts: Iterable[str]) -> set[str]:
        """Those of ``hosts`` their site's budget refuses this cycle, read and never
        written: only for sites this replica saw refuse a host lately (a trap on wildcard
        DNS names a new host in every link, each refused after its claim), one read of
        each such site's record, from the bucket, never from memory."""
        if not len(self.full):
            return set()  # no site refused lately: a page's hosts cost no lookup
        by_site: dict[str, list[str]] = {}
        for host in hosts:
            site = None if self.budget == 0 else site_of(host, self.platforms)
            if site is not None and self.full.get(site) is not None:
                by_site.setdefault(site, []).append(host)
        refused: set[str] = set()
        for site, named in by_site.items():
            try:
                entry = await self.seen.get(site_budget_key(site))
            except KeyNotFoundError:
                self.full.forget(site)
                continue
            counted = SiteCount.from_bytes(entry.value).in_cycle(self.clock(), self.cycle)
            if len(counted.hosts) < self.budget:
                self.full.forget(site)  # a new cycle, or room again
                continue
            self.full.remember(site, counted.since + self.cycle)  # known full for longer
            refused.update(host for host in named if host not in counted.hosts)
        return refused

    async def refused_until(self, host: str) -> float | None:
        """Count ``host`` against its site's budget if it is not counted yet; None when
        it is within the budget, else when the site's cycle ends (its count starts
        afresh then, and the host may be among the next cycle's)."""
        site = None if self.budget == 0 else site_of(host, self.platforms)
        if site is None:
            return None
        key = site_budget_key(site)
        # In turns within this replica: the new hosts of one site on a page are many.
        async with self.turns.of(key):
            return await self._refused_until(key, site, host)

    async def _refused_until(self, key: str, site: str, host: str) -> float | None:
        for _ in range(WRITE_ATTEMPTS):
            try:
                entry = await self.seen.get(key)
                counted = SiteCount.from_bytes(entry.value)
                revision: int | None = entry.revision
            except KeyNotFoundError:
                counted, revision = SiteCount(), None
            counted = counted.in_cycle(self.clock(), self.cycle)
            hosts = counted.hosts
            if host in hosts:
                return None
            if len(hosts) >= self.budget:
                self.full.remember(site, counted.since + self.cycle)
                return counted.since + self.cycle
            hosts = (*hosts, host)
            value = SiteCount(hosts, counted.since).to_bytes()
            try:
                if revision is None:
                    await self.seen.create(key, value)
                else:
                    await self.seen.update(key, value, last=revision)
            except KeyWrongLastSequenceError:
                continue
            if len(hosts) == self.budget:
                log.warning(
                    "site reached its host budget: its other hosts get no pages this cycle",
                    extra={"site": site, "hosts": self.budget},
                )
            return None
        raise Retry(f"the host budget of {site} is written by too many replicas", delay=1.0)
