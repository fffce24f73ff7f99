"""Learned URL aliases in discovery, on real NATS: the KV record, its cache, the link path.

Discovery handles real ``CrawlCompleted`` messages; what it publishes is read back from
the events stream and the rules from the ``trove_url_rules`` bucket.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from nats.js.errors import KeyNotFoundError

from tests.conftest import StackUrls, eventually
from tests.discovery.crawl_support import discoveries, handle, seed
from tests.discovery.test_recrawl import pending_request
from tests.support import services
from trove_discovery.discovery import REFUSED, Discovery, _seen_key
from trove_discovery.url_rules import Holds, UrlRules, record_key
from trove_schema.aliases import AliasLimits
from trove_schema.bus import Bus, Consumer
from trove_schema.events import (
    ChangeHistory,
    CrawlCompleted,
    CrawlOutcome,
    CrawlRequested,
    Link,
    LinkKind,
    Scope,
    ScopeKind,
    decode_event,
    utcnow,
)
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import (
    DISCOVERY_LINKS,
    EVENT_SCHEDULES_PREFIX,
    EVENTS_STREAM,
    SEEN_BUCKET,
    URL_RULES_BUCKET,
    page_schedule_subject,
)

pytestmark = pytest.mark.usefixtures("clean")

SITE = "https://site.example"
SCOPE = Scope(kind=ScopeKind.HOST, value="site.example", max_depth=5)
_ids = itertools.count()


async def replica(
    bus: Bus, *, ttl: float = 5.0, holds: Holds | None = None, **settings: int
) -> Discovery:
    rules = UrlRules(await bus.js.key_value(URL_RULES_BUCKET), ttl=ttl)
    return Discovery(
        bus=bus,
        seen=await bus.js.key_value(SEEN_BUCKET),
        settings=DiscoverySettings(**settings),  # type: ignore[arg-type]
        url_rules=rules,
        holds=holds,
    )


@contextlib.asynccontextmanager
async def consuming(bus: Bus, discovery: Discovery) -> AsyncIterator[None]:
    """Discovery's events consumer running, as in the service (Retry is a delayed nak)."""
    stop = asyncio.Event()
    consumer = Consumer(
        bus=bus,
        stream=EVENTS_STREAM,
        durable=DISCOVERY_LINKS,
        handler=discovery.handle_crawl_completed,
        concurrency=4,
    )
    task = asyncio.create_task(consumer.run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)


def page(path: str, *, canonical: str | None = None, links: tuple[str, ...] = ()) -> CrawlCompleted:
    now = utcnow()
    return CrawlCompleted(
        url=SITE + path,
        domain="site.example",
        scope=SCOPE,
        request_id=f"work-{next(_ids)}",
        outcome=CrawlOutcome.SUCCESS,
        started_at=now,
        completed_at=now,
        content_hash=hashlib.sha256(path.encode()).hexdigest(),
        title="A page of the site",  # content: the audit's success, all evidence needs
        canonical_url=SITE + canonical if canonical else None,
        links=tuple(Link(url=SITE + link) for link in links),
    )


async def discovered(bus: Bus) -> list[str]:
    """URLs of every PageDiscovered in the record, in order."""
    return [e.url for e in await discoveries(bus)]


async def learn_ref(discovery: Discovery, bus: Bus) -> None:
    """Two pages whose canonical drops ``?ref=``, with two different values."""
    await handle(discovery, bus, page("/p/1?ref=home", canonical="/p/1"))
    await handle(discovery, bus, page("/p/2?ref=p1", canonical="/p/2"))


async def test_a_learned_alias_is_never_discovered_and_a_real_parameter_is(bus: Bus) -> None:
    discovery = await replica(bus)
    await learn_ref(discovery, bus)
    before = set(await discovered(bus))
    await handle(
        discovery,
        bus,
        page("/p/3", links=("/p/7?ref=p3", "/p/7?ref=again", "/list?page=2", "/p/8?ref=x&tag=a")),
    )
    new = set(await discovered(bus)) - before
    assert new == {SITE + "/p/7", SITE + "/list?page=2", SITE + "/p/8?tag=a"}
    stored = await (await bus.js.key_value(URL_RULES_BUCKET)).keys()
    assert len(stored) == 1


async def test_before_learning_each_spelling_is_its_own_page(bus: Bus) -> None:
    discovery = await replica(bus)
    await handle(discovery, bus, page("/p/1?ref=home", canonical="/p/1"))
    await handle(discovery, bus, page("/p/3", links=("/p/7?ref=p3", "/p/7")))
    assert set(await discovered(bus)) >= {SITE + "/p/7?ref=p3", SITE + "/p/7"}


async def test_a_rule_reaches_another_replica_within_its_cache_time(bus: Bus) -> None:
    ttl = 1.0
    first, second = await replica(bus, ttl=ttl), await replica(bus, ttl=ttl)
    assert second.url_rules is not None
    assert not await second.url_rules.rules_for("site.example")  # cached: nothing learned
    await learn_ref(first, bus)
    loop = asyncio.get_running_loop()
    learned_at = loop.time()
    rules = await eventually(
        lambda: second.url_rules.rules_for("site.example"),  # type: ignore[union-attr]
        until=bool,
        timeout=3 * ttl,
        interval=0.05,
        what="the rule seen by the second replica",
    )
    assert loop.time() - learned_at <= ttl + 0.5
    assert rules.names == {"ref"}


async def test_links_cost_one_read_per_host_per_cache_time(bus: Bus) -> None:
    discovery = await replica(bus, ttl=30.0)
    assert discovery.url_rules is not None
    links = tuple(f"/p/{n}?ref=x{n}" for n in range(300))
    await asyncio.gather(*(handle(discovery, bus, page(f"/q/{n}", links=links)) for n in range(5)))
    assert discovery.url_rules.reads == 1


async def test_two_replicas_learning_at_once_lose_no_evidence(bus: Bus) -> None:
    first, second = await replica(bus), await replica(bus)
    await asyncio.gather(
        *(
            handle(replica_, bus, page(f"/p/{n}?ref=r{n}", canonical=f"/p/{n}"))
            for n, replica_ in zip(range(10), itertools.cycle((first, second)), strict=False)
        )
    )
    assert second.url_rules is not None
    rules = UrlRules(await bus.js.key_value(URL_RULES_BUCKET), ttl=1.0)
    assert (await rules.rules_for("site.example")).names == {"ref"}


async def test_a_page_fetched_under_an_alias_is_not_recrawled_under_it(bus: Bus) -> None:
    discovery = await replica(bus)
    await learn_ref(discovery, bus)
    before = set(await discovered(bus))
    alias = page("/p/5?ref=old", canonical=None)
    await handle(discovery, bus, alias)
    info = await bus.js.stream_info(EVENTS_STREAM, subjects_filter=f"{EVENT_SCHEDULES_PREFIX}.>")
    pending = info.state.subjects or {}
    assert page_schedule_subject(alias.url) not in pending
    # The page the rule was learned on is an alias by the time its links are followed.
    assert page_schedule_subject(SITE + "/p/2?ref=p1") not in pending
    assert page_schedule_subject(SITE + "/p/1?ref=home") in pending  # before: one more fetch
    # Its one spelling is followed instead, like a canonical link.
    assert set(await discovered(bus)) - before == {SITE + "/p/5"}


async def test_a_page_under_an_alias_on_a_full_host_moves_its_chain_to_its_one_spelling(
    bus: Bus,
) -> None:
    # Its one spelling is new to the seen set, and the host's budget has no room for a
    # new page: handed only to the link path, the page had no request left anywhere.
    discovery = await replica(bus, host_page_budget=1)
    await learn_ref(discovery, bus)  # /p/2 discovered: the budget is spent
    before = set(await discovered(bus))
    alias = page("/p/5?ref=old")
    await handle(discovery, bus, alias)

    assert set(await discovered(bus)) == before
    assert await pending_request(bus, alias.url) is None
    moved = await pending_request(bus, SITE + "/p/5")
    assert moved is not None
    assert (moved.url, moved.caused_by, moved.etag) == (SITE + "/p/5", alias.id, None)
    # Both names hold the page's place: no link brings it in a second time.
    assert not await discovery._first_sighting(SITE + "/p/5", "a-link-to-it")


async def test_a_page_under_an_alias_its_scope_leaves_out_keeps_its_chain_where_it_is(
    bus: Bus,
) -> None:
    discovery = await replica(bus)
    await learn_ref(discovery, bus)
    # Seeded with a pattern that names the spellings with ?ref= only.
    scope = Scope(kind=ScopeKind.PATTERN, value=r"^https://site[.]example/p/[0-9]+[?]ref=")
    alias = page("/p/6?ref=old").model_copy(update={"scope": scope})
    await handle(discovery, bus, alias)

    assert SITE + "/p/6" not in await discovered(bus)
    kept = await pending_request(bus, alias.url)
    assert kept is not None
    assert kept.caused_by == alias.id


async def test_a_page_under_an_alias_leaves_its_one_spellings_own_chain_alone(bus: Bus) -> None:
    discovery = await replica(bus)
    await learn_ref(discovery, bus)
    own = page("/p/4")
    await handle(discovery, bus, own)
    await handle(discovery, bus, page("/p/4?ref=old"))

    pending = await pending_request(bus, SITE + "/p/4")
    assert pending is not None
    assert pending.caused_by == own.id  # with the history that page's own chain learned


@pytest.mark.parametrize("own_chain", [True, False], ids=["its own chain", "none"])
async def test_a_refused_visit_under_an_alias_moves_its_chain_to_its_one_spelling(
    bus: Bus, own_chain: bool
) -> None:
    # robots.txt refuses the page now: kept under the alias, its chain ran beside the
    # one spelling's own for as long as the refusal lasted (for good, for some sites).
    discovery = await replica(bus)
    await learn_ref(discovery, bus)
    own = page("/p/4")
    if own_chain:
        await handle(discovery, bus, own)
    visited = ChangeHistory(content_hash="a", visited_at=utcnow(), interval=3600.0)
    refused = page("/p/4?ref=old").model_copy(
        update={"outcome": CrawlOutcome.BLOCKED_ROBOTS, "history": visited, "content_hash": None}
    )
    await handle(discovery, bus, refused)

    assert await pending_request(bus, refused.url) is None
    pending = await pending_request(bus, SITE + "/p/4")
    assert pending is not None
    assert pending.caused_by == (own.id if own_chain else refused.id)


async def test_a_refused_visit_under_an_alias_redirected_to_its_spelling_moves_its_chain(
    bus: Bus,
) -> None:
    # robots.txt refused the redirect's hop to the one spelling: discovered from that
    # link, the spelling was a new page without the history, whose first visit, refused
    # alike, ended the chain there.
    discovery = await replica(bus)
    await learn_ref(discovery, bus)
    before = set(await discovered(bus))
    visited = ChangeHistory(content_hash="a", visited_at=utcnow(), interval=3600.0)
    refused = page("/p/4?ref=old").model_copy(
        update={
            "outcome": CrawlOutcome.BLOCKED_ROBOTS,
            "history": visited,
            "content_hash": None,
            "links": (Link(url=SITE + "/p/4", kind=LinkKind.REDIRECT),),
        }
    )
    await handle(discovery, bus, refused)

    assert set(await discovered(bus)) == before
    moved = await pending_request(bus, SITE + "/p/4")
    assert moved is not None
    assert moved.history is not None
    assert moved.history.content_hash == "a"


async def test_a_seed_is_rewritten_before_the_seen_check(bus: Bus) -> None:
    discovery = await replica(bus)
    await learn_ref(discovery, bus)
    # As `nats pub trove.seeds URL` sends it: the stream stores it without answering.
    await seed(bus, discovery, f"{SITE}/p/9?ref=newsletter")
    assert SITE + "/p/9" in await discovered(bus)
    assert SITE + "/p/9?ref=newsletter" not in await discovered(bus)


async def test_a_page_that_changes_with_its_parameter_keeps_it(bus: Bus) -> None:
    discovery = await replica(bus)
    # The list's pages each say they are the list, but each lists other posts.
    await handle(discovery, bus, page("/list", links=("/list?page=2",)))
    for n in range(2, 6):
        await handle(discovery, bus, page(f"/list?page={n}", canonical="/list"))
    await handle(discovery, bus, page("/p/1", links=("/list?page=9", "/list?page=9&ref=a")))
    found = await discovered(bus)
    assert SITE + "/list?page=9" in found


async def test_pages_a_redirect_led_to_teach_nothing_of_the_address_asked(bus: Bus) -> None:
    # Withdrawn products sent to the catalogue: the catalogue's canonical and content
    # are the catalogue's, not the products'; `?id=` still names a product.
    discovery = await replica(bus)
    for n in (991, 992, 993):
        redirected = page(f"/item.php?id={n}", canonical="/item.php").model_copy(
            update={
                "final_url": SITE + "/item.php",
                "content_hash": hashlib.sha256(b"the catalogue").hexdigest(),
            }
        )
        await handle(discovery, bus, redirected)
    await handle(discovery, bus, page("/p/1", links=("/item.php?id=5",)))
    assert SITE + "/item.php?id=5" in await discovered(bus)


@pytest.mark.parametrize("content", [False, True], ids=["one-shell-for-all", "the-same-page"])
async def test_only_the_pages_own_content_teaches_that_a_parameter_is_noise(
    bus: Bus, content: bool
) -> None:
    # A site serving one body for every URL: an app shell (or a challenge, a login wall)
    # says nothing of its parameters; the same page under each spelling does.
    discovery = await replica(bus)
    same = hashlib.sha256(b"one body").hexdigest()
    body: dict[str, object] = {"content_hash": same}
    if not content:
        body |= {"title": None, "shell": True, "text_chars": 0}
    for path in ("/list", "/list?page=2", "/list?page=3"):
        fetched = page(path, links=("/list?page=2",)).model_copy(update=body)
        await handle(discovery, bus, fetched)
    await handle(discovery, bus, page("/p/1", links=("/list?page=9",)))
    found = await discovered(bus)
    assert (SITE + "/list?page=9" in found) is not content


async def test_canonical_links_of_alias_pages_stay_one_page(bus: Bus) -> None:
    discovery = await replica(bus)
    await learn_ref(discovery, bus)
    for n, ref in enumerate(("a", "b", "c")):
        event = page(f"/p/3?ref={ref}{n}", canonical="/p/3")
        linked = Link(url=SITE + "/p/3", kind=LinkKind.CANONICAL)
        await handle(discovery, bus, event.model_copy(update={"links": (linked,)}))
    found = await discovered(bus)
    assert found.count(SITE + "/p/3") == 1
    assert not [url for url in found if url.startswith(SITE + "/p/3?")]


async def test_spellings_beyond_the_probes_wait_and_come_back_rewritten(bus: Bus) -> None:
    discovery = await replica(bus, ttl=0.2, holds=Holds(first=0.3, rounds=3))
    variants = [f"/p/{n}?ref=r{n}" for n in range(1, 7)]
    async with consuming(bus, discovery):
        await bus.publish(page("/p/0", links=(*variants, "/list?page=2")))
        # Two spellings go out to teach ?ref= (and the list page, its own probe).
        probes = {SITE + v for v in variants[:2]}
        await eventually(
            lambda: discovered(bus),
            until=lambda found: set(found) >= probes | {SITE + "/list?page=2"},
            timeout=10,
            what="the probes",
        )
        for n in (1, 2):
            await bus.publish(page(f"/p/{n}?ref=r{n}", canonical=f"/p/{n}"))
        rewritten = {SITE + f"/p/{n}" for n in range(3, 7)}
        found = await eventually(
            lambda: discovered(bus),
            until=lambda found: set(found) >= rewritten,
            timeout=10,
            what="the held links, rewritten",
        )
    assert not {SITE + v for v in variants[2:]} & set(found)
    assert len(found) == len(set(found))


async def test_a_spelling_linked_twice_on_a_page_takes_one_probe(bus: Bus) -> None:
    # A post in the page's feed is linked both ways: an <a> and a feed item.
    discovery = await replica(bus, holds=Holds(first=30.0, rounds=3))
    twice = page("/p/0", links=("/p/1?ref=a", "/p/2?ref=b"))
    item = Link(url=SITE + "/p/1?ref=a", kind=LinkKind.FEED_ITEM)
    event = twice.model_copy(update={"links": (twice.links[0], item, twice.links[1])})
    await handle(discovery, bus, event)
    # Both spellings go out to teach ?ref=, the second not held for want of a probe.
    assert set(await discovered(bus)) == {SITE + "/p/1?ref=a", SITE + "/p/2?ref=b"}


async def test_held_spellings_go_out_as_they_are_when_nothing_is_learned(bus: Bus) -> None:
    discovery = await replica(bus, ttl=0.2, holds=Holds(first=0.2, rounds=2))
    variants = {SITE + f"/p/{n}?id={n}" for n in range(1, 6)}
    async with consuming(bus, discovery):
        await bus.publish(page("/p/0", links=tuple(v[len(SITE) :] for v in variants)))
        first = await eventually(
            lambda: discovered(bus), until=bool, timeout=10, interval=0.05, what="the probes"
        )
        assert len(first) == 2  # the others wait a round or two
        found = await eventually(
            lambda: discovered(bus),
            until=lambda found: set(found) >= variants,
            timeout=10,
            what="every spelling, after the rounds",
        )
    assert len(found) == len(variants)


async def test_a_rule_is_the_host_s_own(bus: Bus) -> None:
    discovery = await replica(bus)
    await learn_ref(discovery, bus)
    elsewhere = "https://other.example/p/7?ref=p3"
    event = page("/p/3").model_copy(
        update={
            "scope": Scope(kind=ScopeKind.OPEN, max_depth=5),
            "links": (Link(url=elsewhere), Link(url=SITE + "/p/8?ref=p3")),
        }
    )
    await handle(discovery, bus, event)
    found = set(await discovered(bus))
    assert {elsewhere, SITE + "/p/8"} <= found
    assert SITE + "/p/8?ref=p3" not in found


async def test_a_hosts_rules_go_once_it_is_left_alone_and_stay_while_it_is_crawled(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    """``TROVE_URL_RULES_TTL_SECONDS``, months in seconds: the bucket keeps the hosts of
    the crawl's recent months, not every host it ever met (it grew for ever). A host
    still crawled keeps its rules though its pages teach nothing new (304s)."""
    ttl = 5.0
    env = {
        "TROVE_URL_RULES_TTL_SECONDS": str(ttl),
        "TROVE_RECRAWL_AFTER_SECONDS": "1",
        "TROVE_RECRAWL_MAX_SECONDS": "2",
    }

    def unchanged(host: str, n: int) -> CrawlCompleted:
        now = utcnow()
        return CrawlCompleted(
            url=f"https://{host}/p/{n}",
            domain=host,
            scope=Scope(kind=ScopeKind.HOST, value=host, max_depth=5),
            request_id=f"work-{next(_ids)}",
            outcome=CrawlOutcome.NOT_MODIFIED,
            status_code=304,
            started_at=now,
            completed_at=now,
        )

    def fetched(host: str, n: int) -> CrawlCompleted:
        now = utcnow()
        scope = Scope(kind=ScopeKind.HOST, value=host, max_depth=5)
        return CrawlCompleted(
            url=f"https://{host}/p/{n}?ref=r{n}",
            domain=host,
            scope=scope,
            request_id=f"work-{next(_ids)}",
            outcome=CrawlOutcome.SUCCESS,
            started_at=now,
            completed_at=now,
            content_hash=hashlib.sha256(f"{host}{n}".encode()).hexdigest(),
            title="A page",
            canonical_url=f"https://{host}/p/{n}",
        )

    rules = await bus.js.key_value(URL_RULES_BUCKET)

    async def held() -> set[str]:
        # Each host's key read on its own: a listing of the bucket's keys is a watch,
        # which may end before it has seen them all.
        found = set()
        for host in ("left.example", "crawled.example"):
            with contextlib.suppress(KeyNotFoundError):
                await rules.get(record_key(host))
                found.add(host)
        return found

    async with services(stack, state_dir, env, only=("discovery",)):
        await bus.publish(fetched("left.example", 0))
        await bus.publish(fetched("crawled.example", 0))
        await bus.publish(fetched("crawled.example", 1))  # two values: ``ref`` learned
        await eventually(held, until=lambda keys: len(keys) == 2, timeout=30)
        left_at = asyncio.get_running_loop().time()
        n = 0
        while True:  # the crawled host answers 304 every second; the other is not asked
            n += 1
            await bus.publish(unchanged("crawled.example", n % 2))
            keys = await held()
            if len(keys) < 2:
                break
            assert asyncio.get_running_loop().time() - left_at < 6 * ttl, "nothing expired"
            await asyncio.sleep(1.0)  # the crawled host's pace, the behaviour under test
        assert keys == {"crawled.example"}
        # The one kept is the host still crawled, for as long again: its record as it
        # was learned would have gone by now, discovery wrote it again.
        for _ in range(int(ttl) + 1):
            n += 1
            await bus.publish(unchanged("crawled.example", n % 2))
            await asyncio.sleep(1.0)  # the same pace
        assert await held() == keys
        reader = UrlRules(rules, ttl=0.0)
        assert (await reader.rules_for("crawled.example")).names == {"ref"}
        assert not await reader.rules_for("left.example")


async def test_a_spelling_past_the_probes_its_budget_refused_has_its_page_read_whole(
    bus: Bus,
) -> None:
    # The third spelling waits for no probe: its host's budget refused it this cycle.
    # The page that links to it is read whole when next due, as for any link waiting
    # so; a 304 would never show it again.
    discovery = await replica(bus, holds=Holds(first=30.0, rounds=3))
    waiting = SITE + "/p/3?id=3"
    await discovery._refuse(waiting, time.time() + 3600)
    hub = page("/p/0", links=("/p/1?id=1", "/p/2?id=2", "/p/3?id=3"))
    await handle(discovery, bus, hub.model_copy(update={"etag": '"v1"'}))

    assert waiting not in await discovered(bus)
    msg = await bus.js.get_last_msg(EVENTS_STREAM, page_schedule_subject(SITE + "/p/0"))
    pending = decode_event(msg.data or b"")
    assert isinstance(pending, CrawlRequested)
    assert pending.etag is None


async def hub_refused_after_a_hold(
    bus: Bus, clock: Callable[[], float], *, handed_over: bool = False
) -> CrawlRequested:
    """The hub's two probes take its host's whole budget; its other spellings, held a
    round, come back to find it spent. The hub's request pending after that.
    ``handed_over``: the round after the hold is another replica's, which never held."""
    rules = UrlRules(await bus.js.key_value(URL_RULES_BUCKET), ttl=0.2)
    seen = await bus.js.key_value(SEEN_BUCKET)

    def replica_of(first: float) -> Discovery:
        return Discovery(
            bus=bus,
            seen=seen,
            settings=DiscoverySettings(host_page_budget=2),
            url_rules=rules,
            holds=Holds(first=first, rounds=1),
            clock=clock,
        )

    discovery = replica_of(0.2)
    hub = page("/p/0", links=tuple(f"/p/{n}?id={n}" for n in range(1, 5)))
    held = [SITE + f"/p/{n}?id={n}" for n in (3, 4)]
    if handed_over:
        holding = replica_of(3.0)  # long enough to stop it before the hold ends
        async with consuming(bus, holding):
            await bus.publish(hub.model_copy(update={"etag": '"v1"'}))
            await eventually(
                lambda: discovered(bus),
                until=lambda urls: len(urls) == 2,
                timeout=10,
                what="the probes",
            )

    async def refused_and_done() -> bool:
        # Refused: marked so, or (their host known full by then) never claimed at all.
        for url in held:
            try:
                entry = await seen.get(_seen_key(url))
            except KeyNotFoundError:
                continue
            if not (entry.value or b"").startswith(REFUSED):
                return False
        info = await bus.js.consumer_info(EVENTS_STREAM, DISCOVERY_LINKS)
        return (
            (info.num_pending or 0) == 0
            and (info.num_ack_pending or 0) == 0
            and (info.delivered.stream_seq or 0) > 0
        )

    async with consuming(bus, discovery):
        if not handed_over:
            await bus.publish(hub.model_copy(update={"etag": '"v1"'}))
        await eventually(
            refused_and_done, until=bool, timeout=10, what="the held links refused, the hub done"
        )
    assert set(await discovered(bus)) == {SITE + "/p/1?id=1", SITE + "/p/2?id=2"}
    schedule = page_schedule_subject(hub.url)
    pending = await bus.js.stream_info(EVENTS_STREAM, subjects_filter=schedule)
    assert pending.state.subjects == {schedule: 1}
    msg = await bus.js.get_last_msg(EVENTS_STREAM, schedule)
    request = decode_event(msg.data or b"")
    assert isinstance(request, CrawlRequested)
    assert request.caused_by == hub.id
    return request


async def test_links_refused_after_an_alias_hold_have_the_page_read_whole(bus: Bus) -> None:
    # The re-crawl planned in the first round asked with the validators, and a 304
    # would never show the refused links again.
    request = await hub_refused_after_a_hold(bus, time.time)
    assert (request.etag, request.last_modified) == (None, None)


async def test_links_refused_by_another_replica_after_a_hold_have_the_page_read_whole(
    bus: Bus,
) -> None:
    # The hold is one replica's memory: its redelivery, taken by the other replica, is
    # a round like the first there, which plans the first round's request again (under
    # its id, dropped as a copy).
    request = await hub_refused_after_a_hold(bus, time.time, handed_over=True)
    assert (request.etag, request.last_modified) == (None, None)


async def test_a_page_due_already_is_not_asked_for_again_after_an_alias_hold(bus: Bus) -> None:
    # Its re-crawl (a week) was due before the hold's last round (the clock a week and a
    # day on): it went out already, and another would fetch the page twice in a cycle.
    request = await hub_refused_after_a_hold(bus, lambda: time.time() + 8 * 86_400)
    assert request.etag == '"v1"'


async def test_a_value_that_showed_another_values_page_lets_another_probe_out(bus: Bus) -> None:
    # A home page lists one post as "featured" and as "latest", and others as "latest":
    # the two probes are that post's two links, one page, which teaches nothing of ?ref=.
    # One more goes out, another post's, and the links still held come back rewritten.
    discovery = await replica(bus, ttl=0.2, holds=Holds(first=0.5, rounds=4))
    links = ("/post/9?ref=featured", "/post/9?ref=latest", "/post/8?ref=latest")
    held = "/post/7?ref=latest"
    one_post = hashlib.sha256(b"post 9").hexdigest()
    async with consuming(bus, discovery):
        await bus.publish(page("/", links=(*links, held)))
        await eventually(
            lambda: discovered(bus),
            until=lambda found: set(found) >= {SITE + link for link in links[:2]},
            timeout=10,
            what="the probes",
        )
        for link in links[:2]:
            fetched = page(link, canonical="/post/9").model_copy(update={"content_hash": one_post})
            await bus.publish(fetched)
        third = SITE + links[2]
        await eventually(
            lambda: discovered(bus),
            until=lambda found: third in found,
            timeout=10,
            what="a third probe",
        )
        await bus.publish(page(links[2], canonical="/post/8"))
        found = await eventually(
            lambda: discovered(bus),
            until=lambda found: SITE + "/post/7" in found,
            timeout=10,
            what="the held link, rewritten",
        )
    assert SITE + held not in found
    assert found.count(third) == 1
    assert discovery.url_rules is not None
    assert (await discovery.url_rules.rules_for("site.example")).names == {"ref"}


async def test_a_name_whose_every_value_shows_one_page_holds_no_link_back_for_long(
    bus: Bus,
) -> None:
    # Every ?next= of a sign-in form shows the one form, never fetched without it: each
    # value is a try that teaches nothing. After a few the name is decided, unlearned,
    # and a page's links that carry it all go out as they are, none held for it.
    discovery = await replica(bus, holds=Holds(first=30.0, rounds=3))
    form = hashlib.sha256(b"Sign in to continue").hexdigest()
    for value in "abcd":
        signin = page(f"/login?next=/{value}", canonical="/login")
        await handle(discovery, bus, signin.model_copy(update={"content_hash": form}))
    before = set(await discovered(bus))
    links = ("/login?next=/x", "/login?next=/y", "/login?next=/z")
    await handle(discovery, bus, page("/account", links=links))
    assert set(await discovered(bus)) - before == {SITE + link for link in links}
    assert discovery.url_rules is not None
    assert not await discovery.url_rules.rules_for("site.example")


#: A sample of four: a learned name is put to the test after four fetches of its host.
SMALL = AliasLimits(max_samples=4)


async def due_for_a_probe(bus: Bus) -> tuple[Discovery, UrlRules]:
    """A replica whose host learned ``?ref=`` and is due to put it to the test: the next
    page fetched chooses a probe among its links."""
    rules = UrlRules(await bus.js.key_value(URL_RULES_BUCKET), ttl=5.0, limits=SMALL)
    discovery = Discovery(
        bus=bus,
        seen=await bus.js.key_value(SEEN_BUCKET),
        settings=DiscoverySettings(),
        url_rules=rules,
    )
    await learn_ref(discovery, bus)
    for n in range(SMALL.max_samples - 1):
        await handle(discovery, bus, page(f"/q/{n}"))
    assert not (await rules.rules_for("site.example")).probes
    return discovery, rules


async def test_a_probe_is_chosen_among_the_links_discovery_follows(bus: Bus) -> None:
    # One it never sends would leave the name untested until the probe is given up.
    discovery, rules = await due_for_a_probe(bus)
    hidden = page("/hidden", links=("/p/5?ref=a",)).model_copy(update={"nofollow": True})
    await handle(discovery, bus, hidden)
    assert not (await rules.rules_for("site.example")).probes
    links = (
        Link(url=SITE + "/p/5?ref=a", kind=LinkKind.IMG),
        Link(url=SITE + "/p/6?ref=b", nofollow=True),
        Link(url=SITE + "/p/7?ref=c"),
    )
    await handle(discovery, bus, page("/list").model_copy(update={"links": links}))
    assert (await rules.rules_for("site.example")).probes == {SITE + "/p/7?ref=c"}
    assert SITE + "/p/7?ref=c" in await discovered(bus)  # sent as it is


@pytest.mark.parametrize(
    "answer",
    [{"final_url": SITE + "/p/7"}, {"title": None, "shell": True, "text_chars": 0}],
    ids=["redirected-to-the-page-without-it", "unusable"],
)
async def test_a_probe_whose_fetch_is_no_evidence_has_come_back(
    bus: Bus, answer: dict[str, object]
) -> None:
    # Still out, it would hold its name's next test back, and its spelling would be
    # crawled again as a page of its own.
    discovery, rules = await due_for_a_probe(bus)
    probe = SITE + "/p/7?ref=c"
    await handle(discovery, bus, page("/list", links=("/p/7?ref=c",)))
    assert (await rules.rules_for("site.example")).probes == {probe}
    before = set(await discovered(bus))
    await handle(discovery, bus, page("/p/7?ref=c").model_copy(update=answer))
    learned = await rules.rules_for("site.example")
    assert not learned.probes
    assert learned.names == {"ref"}
    info = await bus.js.stream_info(EVENTS_STREAM, subjects_filter=f"{EVENT_SCHEDULES_PREFIX}.>")
    assert page_schedule_subject(probe) not in (info.state.subjects or {})
    # Its one spelling is followed instead, as for any page fetched under an alias.
    assert SITE + "/p/7" in set(await discovered(bus)) - before
