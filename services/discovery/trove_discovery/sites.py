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
(``alice.github.io``, ``bob.blogspot.com``); ``PLATFORMS`` names the small web's others,
and ``TROVE_PLATFORM_DOMAINS`` adds to it.

The count is one record a site in the seen bucket, expiring with its keys (the cycle):
the names counted, so that a page handled again (a redelivery, a second replica) counts
a name once. A refusal is always read from the bucket, never from memory, as for the
page budget: a stale refusal would lose the page for a whole cycle.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
from collections.abc import Iterable

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from trove_schema.bus import Retry
from trove_schema.turns import Turns
from trove_schema.urls import registrable_domain

log = logging.getLogger("trove.discovery")

#: Hosting platforms of the small web that give each person a subdomain and are not in
#: the public suffix list (github.io, blogspot.com, pages.dev are, and need no entry).
PLATFORMS = frozenset(
    {
        "bearblog.dev",
        "dreamwidth.org",
        "flounder.online",
        "ghost.io",
        "hashnode.dev",
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
        "tumblr.com",
        "typepad.com",
        "weebly.com",
        "wordpress.com",
        "write.as",
    }
)

#: Compare-and-sets of a site's record lost to other replicas before the page is handed
#: back to ask again.
WRITE_ATTEMPTS = 50


class SiteHosts:
    """Counts the host names of each site that discovery brings pages of, per cycle."""

    def __init__(self, seen: KeyValue, *, budget: int, platforms: Iterable[str] = ()) -> None:
        self.seen = seen
        #: Host names a site may bring in a cycle; 0: no limit.
        self.budget = budget
        self.platforms = PLATFORMS | frozenset(platforms)
        self.turns = Turns()

    def site_of(self, host: str) -> str | None:
        """The site whose budget ``host`` counts against, or None when none does: an
        address has no names under it, and a platform's subdomains are each a site."""
        if self.budget == 0 or _is_address(host):
            return None
        site = registrable_domain(host)
        return None if site in self.platforms else site

    async def admits(self, host: str) -> bool:
        """Count ``host`` against its site's budget if it is not counted yet; whether it
        is within the budget."""
        site = self.site_of(host)
        if site is None:
            return True
        key = "s." + hashlib.sha256(site.encode()).hexdigest()[:40]
        # In turns within this replica: the new hosts of one site on a page are many.
        async with self.turns.of(key):
            return await self._admits(key, site, host)

    async def _admits(self, key: str, site: str, host: str) -> bool:
        for _ in range(WRITE_ATTEMPTS):
            try:
                entry = await self.seen.get(key)
                hosts = list(json.loads(entry.value or b"{}").get("hosts", []))
                revision: int | None = entry.revision
            except KeyNotFoundError:
                hosts, revision = [], None
            if host in hosts:
                return True
            if len(hosts) >= self.budget:
                return False
            hosts.append(host)
            value = json.dumps({"hosts": hosts}, separators=(",", ":")).encode()
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
            return True
        raise Retry(f"the host budget of {site} is written by too many replicas", delay=1.0)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True
