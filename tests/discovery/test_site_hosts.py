"""A site's host budget: how many host names of one registrable domain links bring pages
of in a cycle, counted in the shared seen bucket on real NATS."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import bucket_keys
from tests.discovery.crawl_support import claimed_at_each_visit, crawled, discoveries, handle
from trove_discovery.discovery import Discovery
from trove_discovery.sightings import Recent
from trove_discovery.sites import REFUSED_MEMORY
from trove_schema.budgets import PLATFORMS, host_budget_key
from trove_schema.bus import Bus
from trove_schema.events import Scope, ScopeKind
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import SEEN_BUCKET

pytestmark = pytest.mark.usefixtures("clean")

HOSTS = 4


async def replica(bus: Bus, hosts: int = HOSTS, platforms: str = "") -> Discovery:
    settings = DiscoverySettings(
        host_page_budget=50, site_host_budget=hosts, platform_domains=platforms
    )
    return Discovery(bus=bus, seen=await bus.js.key_value(SEEN_BUCKET), settings=settings)


async def granted(discovery: Discovery, host: str, page: str) -> int:
    return len((await discovery._within_budget(host, [f"{page}-{n}" for n in range(3)]))[0])


async def test_a_farm_of_subdomains_gets_pages_for_its_first_hosts_only(bus: Bus) -> None:
    discovery = await replica(bus)
    farm = [f"n{k}.farm.example" for k in range(10)]
    assert [await granted(discovery, host, f"page-{host}") for host in farm] == [3] * HOSTS + [
        0
    ] * (10 - HOSTS)
    # The hosts admitted go on getting pages up to their own budget; the others none.
    assert await granted(discovery, farm[0], "page-later") == 3
    assert await granted(discovery, farm[HOSTS], "page-later") == 0
    # Another site is counted apart, and so is the bare name's site with its www twin.
    assert await granted(discovery, "blog.other.example", "page-o") == 3


async def test_two_replicas_side_by_side_admit_exactly_the_budget(bus: Bus) -> None:
    first, second = await replica(bus), await replica(bus)
    farm = [f"n{k}.farm.example" for k in range(12)]

    async def page(k: int) -> int:
        return await granted(first if k % 2 else second, farm[k], f"page-{k}")

    result = await asyncio.gather(*(page(k) for k in range(12)))
    assert sorted(result) == [0] * (12 - HOSTS) + [3] * HOSTS
    # Each admitted host is admitted on either replica, the others on neither.
    admitted = [farm[k] for k, n in enumerate(result) if n]
    for host in farm:
        expected = 3 if host in admitted else 0
        assert await granted(first, host, "again-1") == expected
        assert await granted(second, host, "again-2") == expected


async def test_a_host_counted_once_is_not_counted_again_when_its_page_comes_back(
    bus: Bus,
) -> None:
    # A redelivery, or the host's page key expiring before the site's record: the
    # host is in the site's record, and is admitted without taking another place.
    discovery = await replica(bus)
    assert await granted(discovery, "a.farm.example", "page-1") == 3
    seen = await bus.js.key_value(SEEN_BUCKET)
    counted = host_budget_key("a.farm.example")
    assert (await seen.get(counted)).value  # the host's count, gone with its cycle
    await seen.purge(counted)
    restarted = await replica(bus)  # nothing remembered: it reads both records
    assert await granted(restarted, "a.farm.example", "page-1") == 3
    for k in range(HOSTS - 1):
        assert await granted(discovery, f"b{k}.farm.example", "page-b") == 3
    assert await granted(discovery, "c.farm.example", "page-c") == 0


async def test_a_new_cycle_counts_a_sites_hosts_afresh(bus: Bus) -> None:
    # The site's record expires with the cycle's keys: a refusal is read from the bucket.
    discovery = await replica(bus, hosts=1)
    assert await granted(discovery, "a.farm.example", "page-a") == 3
    assert await granted(discovery, "b.farm.example", "page-b") == 0
    await bus.js.purge_stream(f"KV_{SEEN_BUCKET}")  # the cycle's keys expired
    assert await granted(discovery, "b.farm.example", "page-b") == 3


async def test_a_sites_hosts_are_counted_afresh_each_cycle_though_its_record_lives_on(
    bus: Bus,
) -> None:
    # A site that adds a host every few weeks writes its record before it can expire.
    now = [1_800_000_000.0]
    settings = DiscoverySettings(host_page_budget=50, site_host_budget=2)
    discovery = Discovery(
        bus=bus,
        seen=await bus.js.key_value(SEEN_BUCKET),
        settings=settings,
        clock=lambda: now[0],
    )
    assert await granted(discovery, "a.grows.example", "page-a") == 3
    now[0] += settings.recrawl_max / 2
    assert await granted(discovery, "b.grows.example", "page-b") == 3
    assert await granted(discovery, "c.grows.example", "page-c") == 0
    # Its links wait for the site's cycle to end, not for a whole cycle from the refusal.
    refused = await discovery._within_budget("c.grows.example", ["page-c-0"])
    assert refused == (frozenset(), 1_800_000_000.0 + settings.recrawl_max)
    now[0] += settings.recrawl_max / 2
    assert await granted(discovery, "c.grows.example", "page-c") == 3


async def test_the_addresses_of_one_ipv6_64_are_one_site(bus: Bus) -> None:
    # Any server is given a /64 whole: its addresses are as free to link to as names.
    discovery = await replica(bus)
    farm = [f"[2001:db8:0:1::{k + 1:x}]" for k in range(10)]
    assert [await granted(discovery, host, f"page-{host}") for host in farm] == [3] * HOSTS + [
        0
    ] * (10 - HOSTS)
    assert await granted(discovery, "[2001:db8:0:2::1]", "page-next-64") == 3


async def test_platforms_and_ipv4_addresses_are_never_counted(bus: Bus) -> None:
    discovery = await replica(bus, hosts=1, platforms="Blogs.Example.")
    builtin = sorted(PLATFORMS)[0]
    for k in range(5):
        assert await granted(discovery, f"user{k}.{builtin}", f"page-p{k}") == 3
        assert await granted(discovery, f"user{k}.blogs.example", f"page-q{k}") == 3
        assert await granted(discovery, f"127.0.0.{k + 1}", f"page-r{k}") == 3
    # github.io is in the public suffix list: each user's is its own site already.
    for k in range(3):
        assert await granted(discovery, f"user{k}.github.io", f"page-g{k}") == 3


async def test_a_full_sites_new_hosts_cost_no_seen_key_at_every_visit(bus: Bus) -> None:
    # A trap on wildcard DNS: its page names new subdomains at every visit. Once this
    # replica saw the site refuse a host, their links are refused before any is claimed.
    discovery = await replica(bus, hosts=2)
    links, visits = 20, 6
    for visit in range(visits):
        fresh = [f"https://n{visit}-{k}.farm.example/" for k in range(links)]
        page = crawled("https://www.farm.example/", *fresh, "https://ok.farm.example/p")
        page = page.model_copy(update={"scope": Scope(kind=ScopeKind.OPEN, max_depth=5)})
        await handle(discovery, bus, page)
    hosts = {d.domain for d in await discoveries(bus)}
    assert len(hosts) == 2  # the site's budget: the first visit's first two
    keys = [k for k in await bucket_keys(bus, SEEN_BUCKET) if k.startswith("u.")]
    # The first visit's links (claimed, then refused), the page's own key, and nothing
    # more at the visits after.
    assert len(keys) <= links + 2, len(keys)


async def test_a_full_site_stays_known_full_while_its_pages_keep_coming(bus: Bus) -> None:
    # The farm's pages are re-crawled for months: each visit that finds the site full
    # again keeps it known full, or every few minutes one visit claims its new hosts'
    # links again.
    discovery = await replica(bus, hosts=2)
    now = [0.0]
    memory = discovery.sites.full.ttl
    discovery.sites.full = Recent(REFUSED_MEMORY, ttl=memory, clock=lambda: now[0])

    def minutes_later() -> None:  # a visit every few minutes, over many memories' length
        now[0] += memory / 3

    claimed = await claimed_at_each_visit(
        bus,
        discovery,
        "https://www.farm.example/",
        lambda visit: [f"https://n{visit}-{k}.farm.example/" for k in range(20)],
        visits=8,
        next_visit=minutes_later,
    )
    assert claimed[1:] == [0] * 7, claimed


async def test_a_host_admitted_late_in_its_sites_last_cycle_keeps_getting_pages(bus: Bus) -> None:
    # Its own cycle goes on into the site's next, which fills with other hosts: a replica
    # that saw the site refuse one still lets the admitted host's new links through.
    now = [1_800_000_000.0]
    settings = DiscoverySettings(host_page_budget=50, site_host_budget=2)
    cycle = settings.recrawl_max
    seen = await bus.js.key_value(SEEN_BUCKET)

    def replica_now() -> Discovery:
        return Discovery(bus=bus, seen=seen, settings=settings, clock=lambda: now[0])

    first = replica_now()
    assert len((await first._within_budget("a.grows.example", ["a-1"]))[0]) == 1
    now[0] += 0.9 * cycle
    assert len((await first._within_budget("b.grows.example", ["b-1"]))[0]) == 1
    now[0] += 0.15 * cycle  # the site's next cycle; b's own runs on
    assert len((await first._within_budget("c.grows.example", ["c-1"]))[0]) == 1
    assert len((await first._within_budget("d.grows.example", ["d-1"]))[0]) == 1
    second = replica_now()
    assert len((await second._within_budget("e.grows.example", ["e-1"]))[0]) == 0
    page = crawled("https://www.other.example/", "https://b.grows.example/new")
    page = page.model_copy(update={"scope": Scope(kind=ScopeKind.OPEN, max_depth=5)})
    await handle(second, bus, page)
    assert "https://b.grows.example/new" in {d.url for d in await discoveries(bus)}


async def test_no_limit_when_the_budget_is_zero(bus: Bus) -> None:
    discovery = await replica(bus, hosts=0)
    for k in range(30):
        assert await granted(discovery, f"n{k}.farm.example", f"page-{k}") == 3
