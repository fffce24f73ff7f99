"""The cycle's budgets discovery counts in the seen bucket (``trove_seen``), keyed here.

A host's page budget (``TROVE_HOST_PAGE_BUDGET``): the pages discovered of the host
this cycle, and the last event counted (``{"n": 37, "last": "<event id>"}``). A site's
host budget (``TROVE_SITE_HOST_BUDGET``, ``trove_discovery.sites``): the host names of
the registrable domain that got pages this cycle (``{"hosts": [...]}``). Both expire
with the bucket's keys, which is what makes them a cycle's. Discovery writes them;
``trove domain`` reads them.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class HostCount:
    """A host's pages counted this cycle, up to the event ``last``."""

    pages: int = 0
    last: str = ""

    @classmethod
    def from_bytes(cls, value: bytes | None) -> HostCount:
        state = json.loads(value or b"{}")
        return cls(pages=int(state.get("n", 0)), last=str(state.get("last", "")))

    def to_bytes(self) -> bytes:
        return json.dumps({"n": self.pages, "last": self.last}).encode()


def site_hosts(value: bytes | None) -> list[str]:
    """The host names a site's record counts."""
    return [str(host) for host in json.loads(value or b"{}").get("hosts", [])]


def site_hosts_bytes(hosts: list[str]) -> bytes:
    return json.dumps({"hosts": hosts}, separators=(",", ":")).encode()
