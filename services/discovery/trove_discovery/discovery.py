"""Discovery: seeds and outbound links in, PageDiscovered (and re-crawl requests) out.

Every consequence gets an id derived from its cause (the seed message's stream
sequence, the CrawlCompleted's id), so a redelivered input republishes the same ids,
which JetStream's duplicate window and every consumer drop.

Dedup is a NATS KV bucket shared by all replicas: the first replica to ``create`` a
URL's key discovers it; the key holds the id of the discovering event, so the same
cause delivered again still (re)publishes its event while any other cause is refused.

Re-crawls: each fetched page (and each refused by a choice that may be taken back,
``refused_unasked``) gets one pending ``CrawlRequested``, scheduled on the
page's own subject (``page_schedule_subject``), so a newer schedule replaces an older
one and a page never has two chains. Its interval follows the page's change history,
which travels in the chain (``trove_schema.change_rate``). Scheduling it also rewrites
the page's seen key, which keeps it alive (``seen_ttl`` is longer than the longest
interval) for as long as the page is re-crawled: the links of the pages fetched
meanwhile do not discover it again. A page whose chain ends (failed for good, rejected)
is forgotten one ``seen_ttl`` after its last request, and any link may bring it back:
a 304 shows no links, so each page is read whole (its re-crawl without validators) once
its re-crawl falls a ``seen_ttl`` or more after it last was: a page that links to it
shows it again at most a ``seen_ttl`` and an interval after its key expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from trove_discovery.errors import InvalidURL
from trove_discovery.replies import command_origin, command_place
from trove_discovery.scope import follow_link, in_scope, redirected_scope
from trove_discovery.seeds import SeedBatch, parse_seeds, reply
from trove_discovery.sightings import Recent, Sightings
from trove_discovery.sites import SiteHosts
from trove_discovery.traps import url_trap_reason
from trove_discovery.url_rules import Holds, UrlRules
from trove_schema.aliases import could_alias, rewrite
from trove_schema.budgets import HostCount, batch_mark, host_budget_key
from trove_schema.bus import Bus, Overtaken, Retry, jetstream_metadata, read_event
from trove_schema.change_rate import RecrawlPolicy, plan_recrawl, plan_refused
from trove_schema.errors import MalformedEvent
from trove_schema.events import (
    MAX_SAME_PAGE_HOPS,
    CrawlCompleted,
    CrawlOutcome,
    CrawlRequested,
    Link,
    LinkKind,
    PageDiscovered,
    Provenance,
    RequestReason,
    Scope,
    ScopeKind,
    SeedRejected,
    decode_event,
    derived_event_id,
    explored_attempt_id,
)
from trove_schema.exclusions import Exclusions, ListedExclusions
from trove_schema.metrics import BUDGET_REFUSALS, DISCOVERED, SEEDS
from trove_schema.settings import DiscoverySettings
from trove_schema.topology import page_schedule_subject
from trove_schema.turns import Turns
from trove_schema.urls import canonicalize_or_none, domain_of, is_private_host

log = logging.getLogger("trove.discovery")

#: Link kinds that lead to pages worth fetching (resources and the graph's other edges do
#: not). A rel=me link leads to its author's other pages, followed as an ``a`` link within
#: the seed's scope; a Webmention endpoint is an API to post to, never a page.
FOLLOWED_KINDS = frozenset(
    {
        LinkKind.A,
        LinkKind.FEED,
        LinkKind.FEED_ITEM,
        LinkKind.CANONICAL,
        LinkKind.REDIRECT,
        LinkKind.ME,
    }
)


#: How long this process trusts what it learned from the seen bucket (see ``Sightings``),
#: at most: never more than a quarter of the bucket's own TTL.
SIGHTINGS_TTL = 600.0
#: Hosts whose budget counter (and its revision) this process remembers.
BUDGET_MEMORY = 10_000
#: Compare-and-sets of a host's budget counter lost to other replicas before the page is
#: handed back to ask again.
BUDGET_WRITE_ATTEMPTS = 50
#: Bytes past which a full host's record read with batches past their memory is written
#: again without them (``_compact``): a hundred batches of a page each stay under it; a
#: tarpit that filled its budget in minutes, 500 pages a batch, left some 54 KB, read by
#: every batch that names the host for the rest of its cycle.
COMPACT_AT = 4096


#: Seen-set creates a handler has in flight at once (a page may give 500 links).
SEEN_AT_ONCE = 64
#: How often a moved page's request is tried where it moved to, each try overtaken by
#: another request written there; then it joins them.
MOVE_TRIES = 5
#: Seconds before a moved page's request looks again where it moved to, times the tries.
OVERTAKEN_PAUSE = 0.02


class Discovery:
    def __init__(
        self,
        *,
        bus: Bus,
        seen: KeyValue,
        settings: DiscoverySettings,
        url_rules: UrlRules | None = None,
        holds: Holds | None = None,
        listed: ListedExclusions | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bus = bus
        self.seen = seen
        self.settings = settings
        #: The wall clock the budgets' cycles are kept on (a seam for the tests).
        self.clock = clock
        #: Hosts the operator keeps Trove away from: never discovered. A link is judged on
        #: the copy ``listed`` refreshes every few seconds, a seed on the list as it is.
        self.listed = listed
        self.exclusions = listed.exclusions if listed else Exclusions.from_settings(settings)
        #: Each host's learned aliases; None: every spelling is its own page.
        self.url_rules = url_rules
        #: Pages handed back while their links wait for aliases to be learned.
        self.holds = holds
        trust = min(SIGHTINGS_TTL, settings.seen_ttl / 4)
        self.sightings = Sightings(settings.seen_memory, ttl=trust)
        #: Budget key -> (revision, the count) as this process wrote it.
        self.budgets: Recent[tuple[int, HostCount]] = Recent(BUDGET_MEMORY, ttl=trust)
        self.budget_turns = Turns()
        #: Host names each site may bring in a cycle (``trove_discovery.sites``).
        self.sites = SiteHosts(
            seen,
            budget=settings.site_host_budget,
            cycle=settings.recrawl_max,
            platforms=settings.platform_domains,
            clock=self.clock,
        )
        self.recrawl_policy = RecrawlPolicy(
            first=settings.recrawl_after_seconds,
            minimum=settings.recrawl_min,
            maximum=settings.recrawl_max,
        )

    # seeds ----------------------------------------------------------------------

    async def handle_seed(self, msg: Msg) -> None:
        place = command_place(msg)
        batch = parse_seeds(
            msg.data,
            origin=command_origin(msg),
            settings=self.settings,
            exclusions=await self._fresh(),
        )
        for n, rejected in enumerate(batch.rejected):
            rejection = SeedRejected(
                id=derived_event_id(f"seed:{place}:{n}", "rejected"),
                raw=rejected.raw[:512],
                reason=rejected.reason,
                provenance=Provenance(kind="seed", origin=command_origin(msg)),
            )
            log.warning("seed rejected", extra={"raw": rejection.raw, "reason": rejection.reason})
            SEEDS.labels("rejected").inc()
            await self.bus.publish(rejection)
        for seed in batch.accepted:
            url = await self._alias_target(seed.url)
            event = PageDiscovered(
                id=derived_event_id(f"seed:{place}:{url}", "discovered"),
                url=url,
                domain=domain_of(url),
                depth=0,
                priority=seed.priority,
                scope=seed.scope,
                provenance=seed.provenance,
                force=seed.force,
            )
            if seed.force:
                # Its place taken before it goes out: a link found before it is fetched
                # would bring it in again, a second fetch this cycle.
                await self._mark(event.url, event.id.encode())
            if seed.force or await self._first_sighting(event.url, event.id, seed=True):
                await self.bus.publish(event)
                SEEDS.labels("accepted").inc()
                DISCOVERED.labels("seed").inc()
                log.info("seed accepted", extra={"url": event.url, "event_id": event.id})
            else:
                log.info("seed already seen this cycle", extra={"url": event.url})

    async def _fresh(self) -> Exclusions:
        """The exclusions as they are now (a seed follows ``trove include`` at once)."""
        return await self.listed.fresh() if self.listed else self.exclusions

    async def reply_to_seed_request(self, msg: Msg) -> None:
        """A `nats req trove.seeds ...` gets what was accepted and rejected, and why."""
        if not msg.reply:
            return  # a plain publish: the stream consumer handles it
        batch: SeedBatch = parse_seeds(
            msg.data, origin="request", settings=self.settings, exclusions=await self._fresh()
        )
        await msg.respond(reply(msg.data, batch))

    # links ----------------------------------------------------------------------

    async def handle_crawl_completed(self, msg: Msg) -> None:
        event = read_event(msg)
        if not isinstance(event, CrawlCompleted):
            return
        deliveries = delivery_count(msg)
        # Handed back while its host's aliases were learned: only the links it held.
        again = self.holds.take(event.id, deliveries) if self.holds and deliveries > 1 else None
        if again is None and self.url_rules is not None:
            await self.url_rules.learn(event)
        # A page fetched under a spelling since learned to be an alias is not re-crawled
        # under it: its one spelling is followed instead, like its canonical link. So is
        # one under a spelling canonicalization has since learned to drop (a session id
        # named in a later release): its chain would otherwise go on beside its twin's.
        alias_of = await self._alias_target(canonicalize_or_none(event.url) or event.url)
        fetched = event.outcome in (CrawlOutcome.SUCCESS, CrawlOutcome.NOT_MODIFIED)
        kept = fetched or refused_unasked(event)
        # A refused visit folds too (its chain moves, refused alike until it is lifted),
        # or it would go on beside the one spelling's own chain for as long as it lasts.
        folded = again is None and kept and alias_of != event.url
        redirect = page_redirect(event, fetched=fetched)
        if event.nofollow and not self.settings.follow_nofollow:
            followable = [] if redirect is None else [redirect]
        else:
            followable = list(event.links)
        # The page's other names: its one canonical, and its one spelling once learned.
        names = {event.canonical_url}
        if fetched and alias_of != event.url:
            followable.insert(0, Link(url=alias_of, kind=LinkKind.CANONICAL))
            names.add(alias_of)
        if fetched and event.sitemaps:
            # The site's own list of its pages, from its robots.txt (a home page's attempt
            # carries it): followed as feeds, whatever the page's own nofollow says. After
            # the page's other names (the same page, at its depth) and before its links,
            # so a home page of many links (``max_links_per_page``) keeps them all.
            own = [
                link
                for link in followable
                if link == redirect or (link.kind is LinkKind.CANONICAL and link.url in names)
            ]
            sitemaps = [Link(url=url, kind=LinkKind.FEED) for url in event.sitemaps]
            followable = own + sitemaps + [link for link in followable if link not in own]
        if again is not None:
            followable = [link for link in followable if hash(link.url) in again]
        recrawl = again is None and kept and not folded
        # Where the page lives, asked once for its links and its request; a later round's
        # request (``later``) asks it then.
        lives_at = await self._lives_at(event) if recrawl else None
        skip: Collection[str] = frozenset()
        if lives_at is not None:
            # A page that moved is re-crawled where it lives: its canonical or redirect
            # link there is no new page either.
            skip = {event.url, lives_at}
        elif folded and not fetched:
            # Nor is a refused visit's redirect to its one spelling (robots.txt refused
            # the hop): discovered anew, without the page's history, its first visit
            # refused alike would end the chain there. The chain moves, history and all.
            skip = {event.url, self._fold_home(event, alias_of)}
        try:
            outgoing, held, over_budget = await self._follow(
                event,
                followable,
                names,
                redirect,
                deliveries,
                skip=skip,
            )
        except Exception:
            if recrawl or folded:
                # The page's chain goes on whatever became of its links. Read whole when
                # next due: its handling again plans the same request, under the same
                # id, which the record then drops, so it cannot say its links waited.
                with contextlib.suppress(Exception):
                    await self._request_recrawl(
                        event,
                        self._fold_home(event, alias_of) if folded else lives_at,
                        validators=False,
                    )
            raise
        later = deliveries > 1 and over_budget and fetched and alias_of == event.url
        if recrawl and not later:
            # A page whose links wait for their host's next cycle is read whole when it is
            # next due: answered 304, it would show them no more.
            await self._request_recrawl(event, lives_at, validators=not over_budget)
        elif later:
            # Links refused on a later delivery (held links, on this replica or another):
            # the request planned the first time may ask with the validators. One that
            # reads whole replaces it on the page's subject, under an id of its own (the
            # first's would be dropped as a copy). The first time may never have come
            # this far (a message handed back unhandled by a stopping pod, a pod gone
            # mid-handling, a schedule that failed): the request goes out regardless.
            await self._request_recrawl(event, lives_at, validators=False, after_hold=True)
        elif folded and all(d.url != alias_of for d in outgoing):
            # Its one spelling was not discovered by that link: known already (its own
            # chain goes on there, which this leaves alone) or refused (its host's
            # budget, a pattern scope, a place held by a cause whose chain ended). The
            # chain moves there as a moved page's does: moved, never ended by a refusal.
            home = self._fold_home(event, alias_of)
            validators = home == event.url and not over_budget
            await self._request_recrawl(event, home, validators=validators)
        if outgoing:
            # Sent together, in order, in one write; each still waits for its PubAck. A
            # failure hands the page back, and its redelivery publishes them all again
            # under the same ids (the seen keys hold them), which JetStream drops.
            await asyncio.gather(*(self.bus.publish(d) for d in outgoing))
            for discovered in outgoing:
                DISCOVERED.labels(discovered.provenance.kind).inc()
        if held and self.holds is not None:
            delay = self.holds.hold(event.id, held, deliveries)
            reason = f"{len(held)} links wait for their host's URL aliases"
            raise Retry(reason, delay=delay, expected=True)

    async def _follow(
        self,
        event: CrawlCompleted,
        followable: list[Link],
        names: set[str | None],
        redirect: Link | None,
        deliveries: int,
        *,
        skip: Collection[str],
    ) -> tuple[list[PageDiscovered], list[str], bool]:
        """The pages ``event``'s links discover (claimed in the seen set, within their
        hosts' budgets), the links held while their hosts' URL rules are learned, and
        whether a link waits for its host's next budget cycle. ``skip``: the page itself,
        by its URL and where it lives (``_lives_at``), which its own re-crawl asks for
        again (a link to it, its logo's or its canonical's, is no new page)."""
        may_hold = self.holds is not None and self.holds.may_hold(deliveries)
        held: list[str] = []
        over_budget = False
        candidates: dict[str, _Candidate] = {}
        #: Links counted as taken and known already, without a claim.
        known: set[str] = set()
        outgoing: list[PageDiscovered] = []
        taken = 0
        settings = self.settings
        exclusions = self.exclusions
        # Judged once a host for the page (most of its links name its own host or a
        # few others): whether the host may be discovered at all (not excluded, no
        # private address), and whether it is in the page's scope, for a scope that
        # only asks for the host (``in_scope``). Rules listed while the page is handled
        # apply from its next page, as they would had they come a moment later.
        admitted: dict[str, bool] = {}
        inside: dict[str, bool] = {}
        scoped_by_host = event.scope.kind in (ScopeKind.HOST, ScopeKind.DOMAIN)
        for link in followable:
            if taken >= settings.max_links_per_page:
                break
            if link.kind not in FOLLOWED_KINDS:
                continue
            if link.nofollow and not settings.follow_nofollow and link != redirect:
                # The page's own redirect is its move, not a link it vouches for: a
                # nofollow page marks it nofollow with the rest (``handle_crawl_completed``).
                continue
            try:
                host = domain_of(link.url)
            except InvalidURL:
                continue  # not from the fetcher, which canonicalizes every link
            admit = admitted.get(host)
            if admit is None:
                # As a seed or a shared link would be: the fetcher refuses the address
                # anyway, and each such page would be a failure retried and rechecked
                # for weeks.
                admit = admitted[host] = not (
                    exclusions and exclusions.covering(host)
                ) and not is_private_host(host, settings.allowed_networks, settings.nat64_prefixes)
            if not admit:
                continue
            # Before the seen check: an alias spelling is never discovered as a page.
            url = await self._alias_target(link.url)
            if url in skip:
                continue
            # The page's redirect and canonical target are the same page under another
            # name: same depth. Any other (a page may carry a hundred canonical and
            # refresh tags) is an ordinary link, or it would escape depth and scope.
            same_page = link == redirect or (link.kind is LinkKind.CANONICAL and link.url in names)
            if same_page and event.scope.same_page_hops >= MAX_SAME_PAGE_HOPS:
                same_page = False  # a chain of names without end takes a step of depth
            depth = event.depth if same_page else event.depth + 1
            if not same_page:
                if scoped_by_host and url == link.url:  # its host is ``host``: judged once
                    follows = inside.get(host)
                    if follows is None:
                        follows = inside[host] = follow_link(
                            url, depth=event.depth, scope=event.scope
                        )
                else:
                    follows = follow_link(url, depth=event.depth, scope=event.scope)
                if not follows:
                    continue
            scope = event.scope
            if same_page and not in_scope(url, scope):
                # A page named directly (depth 0) is crawled where it answers.
                named = link.kind is LinkKind.REDIRECT and event.depth == 0
                moved = redirected_scope(scope, url) if named else None
                if moved is None:
                    continue
                scope = moved
            hops = scope.same_page_hops + 1 if same_page else 0
            if hops != scope.same_page_hops:
                scope = scope.model_copy(update={"same_page_hops": hops})
            if url_trap_reason(
                url,
                max_length=settings.max_url_length,
                max_path_repetitions=settings.max_path_repetitions,
            ):
                continue
            if url in candidates or url in known:
                continue  # the same page linked twice (before a probe: one is enough)
            # A spelling that may be an alias not learned yet waits while a few of its
            # kind (probes) are fetched and teach the host's rules.
            event_id = derived_event_id(f"{event.id}:{url}", "discovered")
            probing = self._undecided(url) if may_hold else None
            if probing is not None and not self._probe(*probing):
                claimed = self.sightings.claimed_by(_seen_key(url))
                if claimed is not None and _refused_until(claimed) is not None:
                    if not self._refusal_ended(claimed):
                        over_budget = True  # waits for its host's next cycle
                        continue
                elif self._known(url, event_id):
                    continue
                held.append(link.url)
                continue
            taken += 1
            if probing is None and self._claimed_by_another(url, event_id):
                # Most of a page's links (its site's menu, its archive): the claim would
                # answer "known" from this memory, at the cost of a task each.
                known.add(url)
                continue
            # Recorded as found: a refresh tag followed as an ordinary link is a link.
            kind = link.kind if same_page else LinkKind.A
            candidates[url] = _Candidate(url, event_id, depth, kind, probing, scope)
        # A host over its budget this cycle refuses whatever new pages its links name:
        # claimed first, each would cost two writes (the claim, then the refusal's mark)
        # kept for the seen TTL, at every visit of a page whose links are new each time
        # (a tarpit, session ids in paths), without bound. Its links are read instead:
        # one its page's earlier delivery claimed goes on as its own (counted or refused
        # as any); a new one is offered again when the page is next read whole.
        by_host_ids: dict[str, list[str]] = defaultdict(list)
        for url, candidate in candidates.items():
            by_host_ids[domain_of(url)].append(candidate.event_id)
        full = await self._full_hosts(by_host_ids, event.id)
        if full:
            dropped = [c for url, c in candidates.items() if domain_of(url) in full]
            for start in range(0, len(dropped), SEEN_AT_ONCE):
                chunk = dropped[start : start + SEEN_AT_ONCE]
                for candidate, holder in zip(
                    chunk, await asyncio.gather(*(self._holder(c.url) for c in chunk)), strict=True
                ):
                    if holder == candidate.event_id.encode():
                        continue  # claimed by this page's earlier delivery: its own now
                    del candidates[candidate.url]
                    self._unprobe(candidate.probing)
                    # Known (another cause's): nothing waits. New, or a refusal: it waits
                    # for the next cycle, and the page is read whole then.
                    over_budget = (
                        over_budget or holder is None or _refused_until(holder) is not None
                    )
        # The seen set answers for many at once, not a round trip a link, which is what
        # a burst of home pages waited on.
        waiting = list(candidates.values())
        claims: list[bytes] = []
        for start in range(0, len(waiting), SEEN_AT_ONCE):
            chunk = waiting[start : start + SEEN_AT_ONCE]
            claims += await asyncio.gather(*(self._claim(c.url, c.event_id) for c in chunk))
        new: list[_Candidate] = []
        # Links whose host's budget has no room for them this cycle, now or before.
        over_budget = over_budget or any(_refused_until(c) is not None for c in claims)
        for candidate, claim in zip(waiting, claims, strict=True):
            if claim == candidate.event_id.encode():
                new.append(candidate)
            else:
                self._unprobe(candidate.probing)  # known already: it teaches nothing new
        # Only new URLs count against the host's budget; one refused by the budget is
        # marked so until the host's cycle ends, and offered again by the next page that
        # links to it after that.
        by_host: dict[str, list[_Candidate]] = defaultdict(list)
        for candidate in new:
            by_host[domain_of(candidate.url)].append(candidate)
        allowed = await asyncio.gather(
            *(
                self._within_budget(h, [c.event_id for c in group], cause=event.id)
                for h, group in by_host.items()
            )
        )
        refused: list[tuple[str, float]] = []
        for (host, group), (granted, until) in zip(by_host.items(), allowed, strict=True):
            for candidate in group:
                if candidate.event_id not in granted:
                    self._unprobe(candidate.probing)
                    refused.append((candidate.url, until))
            outgoing.extend(
                PageDiscovered(
                    id=c.event_id,
                    url=c.url,
                    domain=host,
                    depth=c.depth,
                    priority=event.priority,
                    scope=c.scope,
                    provenance=Provenance(
                        kind="redirect" if c.kind is LinkKind.REDIRECT else "link",
                        source_url=event.url,
                    ),
                    siblings=len(granted),
                )
                for c in group
                if c.event_id in granted
            )
        for start in range(0, len(refused), SEEN_AT_ONCE):
            marks = refused[start : start + SEEN_AT_ONCE]
            await asyncio.gather(*(self._refuse(url, until) for url, until in marks))
        return outgoing, held, over_budget or bool(refused)

    async def _request_recrawl(
        self,
        event: CrawlCompleted,
        lives_at: str | None = None,
        *,
        validators: bool = True,
        after_hold: bool = False,
    ) -> None:
        """Schedule the page's next visit, where it lives (``_lives_at``, when not given
        as ``lives_at``). ``after_hold``: in place of the one its first
        round scheduled, under an id of its own; once that is due, under its id instead
        (sent, it drops this one as a copy: a second would fetch the page twice in one
        interval; never sent, this one is the page's only request)."""
        # The page's history comes with the event and goes on in the request: the same
        # event always plans the same interval, and no replica keeps state per page.
        if refused_unasked(event):
            history = plan_refused(event.history, self.recrawl_policy)
        else:
            history = plan_recrawl(
                event.history,
                visited_at=event.completed_at,
                content_hash=event.content_hash,
                not_modified=event.outcome is CrawlOutcome.NOT_MODIFIED,
                policy=self.recrawl_policy,
            )
        delay = timedelta(seconds=history.interval or self.settings.recrawl_after_seconds)
        due = event.completed_at + delay
        # A 304 shows no links: a page whose seen key expired (its chain ended) would never
        # be found again from pages that answer 304 for ever. Each page is read whole
        # again once a seen TTL has passed since it last was (at the longest interval,
        # half its visits, with the defaults: more would spend the validators' savings
        # for a link found sooner). When that is not known
        # (a chain planned before it was kept) it counts from now: reading them all whole
        # at once would send every site all its bodies in one cycle.
        read_whole_at = event.completed_at
        if event.outcome is not CrawlOutcome.SUCCESS and history.read_whole_at is not None:
            read_whole_at = history.read_whole_at
        if (due - read_whole_at).total_seconds() >= self.settings.seen_ttl:
            validators = False
        url = lives_at or await self._lives_at(event)
        if url != event.url:
            # Read whole where it lives: its content was the old name's row's, and a 304
            # there would leave the page's own row without any.
            validators = False
        replaces = after_hold and due.timestamp() > self.clock()
        etag = event.etag if validators else None
        last_modified = event.last_modified if validators else None
        request = CrawlRequested(
            id=derived_event_id(event.id, "recrawl-after-hold" if replaces else "recrawl"),
            url=url,
            domain=event.domain,
            depth=event.depth,
            priority=event.priority,
            scope=event.scope,
            reason=RequestReason.RECRAWL,
            not_before=due,
            etag=etag,
            last_modified=last_modified,
            # The validators came from where the attempt ended: a redirect that leads
            # elsewhere next time must not have them sent to another page.
            validators_url=(event.final_url or event.url) if etag or last_modified else None,
            caused_by=event.id,
            history=history.model_copy(update={"read_whole_at": read_whole_at}),
        )
        schedule = page_schedule_subject(url)
        if url == event.url:
            # On the page's schedule subject: it replaces whatever request was pending.
            await self.bus.publish_at(request, due, schedule=schedule)
        else:
            await self._move_chain(request, due, schedule, event)
        # The request now holds the page's place in the seen set, for another full
        # seen_ttl: the event that discovered it was published long ago. A page that
        # moved keeps its old spelling's place too: a link to it would otherwise bring it
        # in again, a redirect and a second read this cycle.
        await self._mark(event.url, request.id.encode())
        if url != event.url:
            await self._mark(url, request.id.encode())

    async def _move_chain(
        self, request: CrawlRequested, due: datetime, schedule: str, event: CrawlCompleted
    ) -> None:
        """Schedule ``request``, the moved page's next visit, where it moved to, unless a
        chain of its own goes on there already (the target was a page of its own, or the
        old name came back by a link a seen TTL later): that one is left alone, with the
        change history it learned.

        The target's own request may be in flight while this looks (nothing waits), its
        completion scheduling the next while this publishes: the publish replaces only
        what it read, and reads again when overtaken."""
        for attempt in range(MOVE_TRIES):
            if attempt:
                # On a cluster, the write that overtook this one may not be readable yet.
                await asyncio.sleep(OVERTAKEN_PAUSE * attempt)
            waiting, seq = await self.bus.waiting(schedule)
            if _another_chains(waiting, event):
                return
            try:
                await self.bus.publish_at(request, due, schedule=schedule, replacing=seq)
                return
            except Overtaken:
                continue
        # Written to each time it was read: requests of other chains go on there.
        log.info(
            "a moved page joins the requests written where it moved", extra={"url": request.url}
        )

    @staticmethod
    def _fold_home(event: CrawlCompleted, spelling: str) -> str:
        """Where the chain of a page fetched under an alias of ``spelling`` goes on: at
        ``spelling``, or under the URL it was asked by when its scope (a pattern the
        rewrite leaves) does not take ``spelling`` in."""
        return spelling if in_scope(spelling, event.scope) else event.url

    async def _lives_at(self, event: CrawlCompleted) -> str:
        """Where the page of ``event`` is re-crawled: its own URL, or where it moved for
        good on its host without changing what it names (``moved_spelling``).

        Re-crawled under the URL it was asked by, such a page cost a redirect and two
        reads each cycle (the redirect's target is a page of its own too) and was kept
        twice. Its chain goes on at the target, on the target's schedule subject, which
        holds one request: where the target has a request pending already (a chain of
        its own), this one ends in it. A chain is moved, never ended, so no refusal (a
        budget, a scope, a learned spelling that maps the target back) can lose the page,
        and a site that moves it back moves its chain back. Only a move that keeps the
        path (the other scheme, a trailing slash) counts: a site-wide 301 to one page
        would otherwise make every page's chain that page's one chain."""
        if not event.moved or event.outcome not in (
            CrawlOutcome.SUCCESS,
            CrawlOutcome.NOT_MODIFIED,
        ):
            return event.url
        target = canonicalize_or_none(event.final_url or "")
        if (
            target is None
            or not moved_spelling(event.url, target)
            or not in_scope(target, event.scope)
            or url_trap_reason(
                target,
                max_length=self.settings.max_url_length,
                max_path_repetitions=self.settings.max_path_repetitions,
            )
            or await self._alias_target(target) != target
        ):
            return event.url
        return target

    # shared state -----------------------------------------------------------------

    def _undecided(self, url: str) -> tuple[str, list[str]] | None:
        """The host of ``url`` and what it could teach its rules, if anything."""
        if self.url_rules is None or not could_alias(url):
            return None
        host = domain_of(url)
        keys = self.url_rules.undecided(host, url)
        return (host, keys) if keys else None

    def _claimed_by_another(self, url: str, event_id: str) -> bool:
        """Whether ``_claim`` would answer, from this replica's memory alone, that
        another cause than ``event_id`` holds ``url``'s place: a claim that is neither
        the page's own (a redelivery, a redrive) nor a budget's refusal."""
        claimed_by = self.sightings.claimed_by(_seen_key(url))
        return (
            claimed_by is not None
            and claimed_by != event_id.encode()
            and _refused_until(claimed_by) is None
        )

    def _known(self, url: str, event_id: str) -> bool:
        """Claimed by another cause, as far as this replica remembers."""
        claimed_by = self.sightings.claimed_by(_seen_key(url))
        return claimed_by is not None and claimed_by != event_id.encode()

    def _probe(self, host: str, keys: list[str]) -> bool:
        """Take a probe's place for ``keys`` if one is left (before any await, so that
        concurrent handlers cannot all take the last one)."""
        return self.url_rules is None or self.url_rules.probe(host, keys)

    def _unprobe(self, probing: tuple[str, list[str]] | None) -> None:
        if probing is not None and self.url_rules is not None:
            self.url_rules.probed(*probing, count=-1)

    async def _alias_target(self, url: str) -> str:
        """The spelling of ``url`` its host's learned rules make its page's one spelling."""
        if self.url_rules is None or not could_alias(url):
            return url
        return rewrite(await self.url_rules.rules_for(domain_of(url)), url)

    async def discover(self, events: list[PageDiscovered], *, cause: str) -> None:
        """Publish those of ``events``, the pages ``cause`` brings (a poll's shares,
        ``trove_discovery.shares``), whose URLs are new this cycle and whose hosts have
        room, as for a page's links: one budget batch a host, which ``cause`` handled
        again is granted again, not counted twice."""
        wanted: list[PageDiscovered] = []
        for event in events:
            if self.exclusions and self.exclusions.covering(event.domain):
                continue
            url = await self._alias_target(event.url)
            if url != event.url:  # an alias spelling is never discovered as a page
                event = event.model_copy(update={"url": url})
            wanted.append(event)
        # As for a page's links: a host known full is read, not claimed (a busy timeline
        # naming new pages of a full host wrote two seen keys each at every poll); one
        # this cause's earlier handling claimed goes on, to be refused and marked.
        wanted_ids: dict[str, list[str]] = defaultdict(list)
        for event in wanted:
            wanted_ids[event.domain].append(event.id)
        full = await self._full_hosts(wanted_ids, cause)
        by_host: dict[str, list[PageDiscovered]] = defaultdict(list)
        for event in wanted:
            if event.domain in full and await self._holder(event.url) != event.id.encode():
                continue
            if await self._first_sighting(event.url, event.id):
                by_host[event.domain].append(event)
        for host, group in by_host.items():
            granted, until = await self._within_budget(host, [e.id for e in group], cause=cause)
            for refused in (e for e in group if e.id not in granted):
                await self._refuse(refused.url, until)
            for event in (e for e in group if e.id in granted):
                await self.bus.publish(event)
                DISCOVERED.labels(event.provenance.kind).inc()

    async def _first_sighting(self, url: str, event_id: str, *, seed: bool = False) -> bool:
        """Whether ``url`` is new to the seen set, claimed for ``event_id`` (``_claim``)."""
        return await self._claim(url, event_id, seed=seed) == event_id.encode()

    async def _claim(self, url: str, event_id: str, *, seed: bool = False) -> bytes:
        """Who holds ``url``'s place in the seen set: ``event_id`` itself when it is new
        (or the same cause seen again, a redelivery after a crash: published again,
        idempotently), or a budget's refusal that has not ended (``_refuse``; a ``seed``
        takes its place: budgets count the pages links bring, and a mark they left is no
        reason to refuse the operator's), or the cause that claimed it before."""
        key = _seen_key(url)
        mine = event_id.encode()
        claimed_by = self.sightings.claimed_by(key)
        if claimed_by is not None and self._gives_way(claimed_by, seed=seed):
            claimed_by = None
        attempts = 3
        while claimed_by is None:
            attempts -= 1
            try:
                await self.seen.create(key, mine)
                claimed_by = mine
            except KeyWrongLastSequenceError:
                try:
                    entry = await self.seen.get(key)
                    claimed_by = entry.value or b""
                    if self._gives_way(claimed_by, seed=seed):
                        # Its host's next cycle has begun (or a seed): offered again.
                        await self.seen.update(key, mine, last=entry.revision)
                        claimed_by = mine
                except (KeyNotFoundError, KeyWrongLastSequenceError):
                    # It expired, or another replica took it, in between: look again.
                    # Not a refusal, which would lose the link.
                    if attempts == 0:
                        raise Retry(f"the seen key of {url} keeps changing", delay=1.0) from None
                    claimed_by = None
                    continue
            self.sightings.remember(key, claimed_by)
        return claimed_by

    async def _holder(self, url: str) -> bytes | None:
        """Who holds ``url``'s place in the seen set, read and never written: None when
        no one does, or a refusal that ended (a link may take its place)."""
        key = _seen_key(url)
        claimed_by = self.sightings.claimed_by(key)
        if claimed_by is None:
            try:
                claimed_by = (await self.seen.get(key)).value or None
            except KeyNotFoundError:
                return None
            if claimed_by is not None:
                self.sightings.remember(key, claimed_by)
        if claimed_by is None or self._refusal_ended(claimed_by):
            return None
        return claimed_by

    def _refusal_ended(self, claimed_by: bytes) -> bool:
        until = _refused_until(claimed_by)
        return until is not None and until <= self.clock()

    def _gives_way(self, claimed_by: bytes, *, seed: bool) -> bool:
        """Whether ``claimed_by`` is a refusal that a link (once it ended) or a seed
        (at once) may take the place of."""
        return _refused_until(claimed_by) is not None if seed else self._refusal_ended(claimed_by)

    async def _refuse(self, url: str, until: float) -> None:
        """Mark ``url``, which its host's budget refused, until the budget's cycle ends
        (``until``): seen until then, offered again by a page that links to it after."""
        await self._mark(url, REFUSED + f"{until:.0f}".encode())

    async def _mark(self, url: str, value: bytes) -> None:
        """Hold ``url``'s place in the seen set for ``value``, whoever held it."""
        key = _seen_key(url)
        await self.seen.put(key, value)
        self.sightings.remember(key, value)

    async def _within_budget(
        self, domain: str, event_ids: list[str], *, cause: str | None = None
    ) -> tuple[frozenset[str], float]:
        """Count pages discovered per host this cycle; of ``event_ids`` (new pages of the
        host that ``cause`` brings, in order; None: a page alone, its own cause), those
        within the budget (trap defence), and when the budget that refused the rest has
        room again. A host with nothing counted yet this cycle is first counted
        against its site's host budget (``trove_discovery.sites``), which may refuse all
        of them.

        One compare-and-set for all of them, against the revision this process last
        wrote, so a busy host costs one round trip a page's links, not a read and a
        write a link. Another writer (a second replica, the key's expiry) makes the
        write fail, and then it reads. The record keeps which pages each cause's batch
        counted (``HostCount.marks``), so the same cause handled again (a redelivery, on
        any replica, after other batches of the host, with links a hold kept back the
        first time or folded since) is granted those again and counts only the others.
        """
        mark = batch_mark(cause or event_ids[0], domain)
        key = host_budget_key(domain)
        # In turns within this replica: side by side, the handlers of a host's pages all
        # wrote against one remembered revision, and one that lost, having to read before
        # writing again, could lose to the others every time (``trove_schema.turns``).
        async with self.budget_turns.of(key):
            granted, refused_by, until = await self._count_within_budget(
                key, domain, event_ids, mark
            )
        if len(granted) < len(event_ids):
            BUDGET_REFUSALS.labels(refused_by).inc(len(event_ids) - len(granted))
        return granted, until

    async def _full_hosts(self, hosts: Mapping[str, Sequence[str]], cause: str) -> set[str]:
        """Those of ``hosts`` (each with the ids of the new pages ``cause`` brings of it)
        whose budget is full this cycle for those pages: a batch of the cause that counted
        some of them before (a redelivery) is granted those again, but links a hold kept
        back then were not counted; and those their site's host budget refuses. Read from
        the bucket, only for hosts (and sites) this replica last knew full: a refusal is
        never taken from memory, and a host with room costs nothing more."""
        budget, cycle = self.settings.host_page_budget, self.settings.recrawl_max
        now = self.clock()
        full: set[str] = set()
        uncounted: list[str] = []
        for host in hosts:
            key = host_budget_key(host)
            remembered = self.budgets.get(key)
            if remembered is None:
                uncounted.append(host)
                continue
            if remembered[1].in_cycle(now, cycle).pages < budget:
                continue
            try:
                entry = await self.seen.get(key)
            except KeyNotFoundError:
                self.budgets.forget(key)
                continue
            stored = HostCount.from_bytes(entry.value)
            counted = stored.in_cycle(now, cycle)
            if counted.pages < budget:
                self.budgets.forget(key)  # a new cycle, or room: counted as any batch is
                continue
            revision = entry.revision
            if len(counted.marks) < len(stored.marks) and len(entry.value or b"") > COMPACT_AT:
                revision = await self._compact(key, counted, revision)
            # Known full for longer: a tarpit's re-crawls, each read whole, would claim
            # all their fresh links again whenever this memory of it ran out.
            if revision is not None:
                self.budgets.remember(key, (revision, counted))
            if not counted.counted_of(batch_mark(cause, host), hosts[host]):
                full.add(host)
        # A host its site refuses this cycle, unless it has pages counted in its own
        # cycle (admitted late in the site's last one: it is asked no more of its site).
        by_site = list(await self.sites.refused(uncounted))
        for start in range(0, len(by_site), SEEN_AT_ONCE):
            chunk = by_site[start : start + SEEN_AT_ONCE]
            counting = await asyncio.gather(*(self._counted_this_cycle(h, now) for h in chunk))
            full.update(host for host, counts in zip(chunk, counting, strict=True) if not counts)
        return full

    async def _compact(self, key: str, counted: HostCount, revision: int | None) -> int | None:
        """Write ``counted`` (a full host's record without the batches past their
        memory) in place of the record read at ``revision``: nothing writes a full
        host's record again for the rest of its cycle, and every batch that names it
        reads it. The revision it stands at; another writer's first, theirs (which
        dropped them as well) stands, and the one read is kept."""
        if revision is None:
            return None
        try:
            return await self.seen.update(key, counted.to_bytes(), last=revision)
        except KeyWrongLastSequenceError:
            return revision

    async def _counted_this_cycle(self, host: str, now: float) -> bool:
        """Whether ``host``'s own record counts pages in its cycle (read from the bucket)."""
        try:
            entry = await self.seen.get(host_budget_key(host))
        except KeyNotFoundError:
            return False
        counted = HostCount.from_bytes(entry.value).in_cycle(now, self.settings.recrawl_max)
        return counted.pages > 0

    async def _count_within_budget(
        self, key: str, domain: str, event_ids: list[str], mark: str
    ) -> tuple[frozenset[str], str, float]:
        """Those of ``event_ids`` within the budget, which budget refused the rest
        (``host_pages`` or ``site_hosts``), and when it has room again: the host's
        cycle's end, or, for its site's, the site's cycle's end."""
        budget, cycle = self.settings.host_page_budget, self.settings.recrawl_max
        remembered = self.budgets.get(key)
        for _ in range(BUDGET_WRITE_ATTEMPTS):
            now = self.clock()
            counted: HostCount | None = None
            if remembered is not None:
                revision: int | None = remembered[0]
                counted = remembered[1].in_cycle(now, cycle)
            if counted is None or counted.pages >= budget:
                # Nothing remembered, or a refusal: that is only taken from the bucket.
                try:
                    entry = await self.seen.get(key)
                    counted, revision = HostCount.from_bytes(entry.value), entry.revision
                except KeyNotFoundError:
                    counted, revision = HostCount(), None
                counted = counted.in_cycle(now, cycle)
            # Counted already: those the same batch counted before (its cause handled
            # again). Handled again, a page may bring other links of the host than the
            # first time (a link held then, one folded onto its alias since): those are
            # counted now, and the batch's mark names them too.
            done = frozenset(counted.counted_of(mark, event_ids))
            pending = [event_id for event_id in event_ids if event_id not in done]
            ends = counted.since + cycle
            if not pending:
                return done, "host_pages", ends
            within = min(len(pending), max(0, budget - counted.pages))
            if within == 0:
                if revision is not None:
                    # Known full: the host's next pages are refused before their links
                    # are claimed (``_full_hosts``), also when another replica filled it.
                    self.budgets.remember(key, (revision, counted))
                return done, "host_pages", ends
            # Nothing counted this cycle: a host new to it, which its site may not admit.
            # Not written then, so that the site's refusal is read again, never remembered.
            if counted.pages == 0 and (site_ends := await self.sites.refused_until(domain)):
                return frozenset(), "site_hosts", site_ends
            now_counted = counted.add(mark, pending[:within], now)
            value = now_counted.to_bytes()
            try:
                if revision is None:
                    written = await self.seen.create(key, value)
                else:
                    written = await self.seen.update(key, value, last=revision)
            except KeyWrongLastSequenceError:
                self.budgets.forget(key)
                remembered = None
                continue
            self.budgets.remember(key, (written, now_counted))
            return done.union(pending[:within]), "host_pages", ends
        # Other replicas wrote first every time. Not a refusal: refused links stay seen
        # and their pages would never be crawled. The page comes back and asks again.
        raise Retry(f"the page budget of {key} is written by too many replicas", delay=1.0)


@dataclass(frozen=True, slots=True)
class _Candidate:
    """A link that may be a new page, before the seen set and the budget have said."""

    url: str
    event_id: str
    depth: int
    kind: LinkKind
    probing: tuple[str, list[str]] | None
    scope: Scope


def refused_unasked(event: CrawlCompleted) -> bool:
    """Whether ``event`` is a visit refused before the page was asked for, by a choice
    that may be taken back: the operator's exclusions, or robots.txt for a page fetched
    before. Its chain goes on (``plan_refused``), each visit refused alike while the
    choice holds: ended, the page's seen key would keep it known, to links and to seeds
    not forced, for up to a seen TTL after it was taken back. A link robots.txt refused
    before its page was ever fetched ends there, as any new page that could not be:
    forgotten a seen TTL later, and found again by a link."""
    if event.outcome is CrawlOutcome.REJECTED:
        return event.excluded
    return (
        event.outcome is CrawlOutcome.BLOCKED_ROBOTS
        and event.history is not None
        and event.history.visited_at is not None
    )


def page_redirect(event: CrawlCompleted, *, fetched: bool) -> Link | None:
    """The page's one redirect: of a page not fetched, the redirect it answered or its
    host's move (the fetcher adds that link last); of a page fetched, its first refresh.
    None when it has none."""
    redirects = [link for link in event.links if link.kind is LinkKind.REDIRECT]
    if not redirects:
        return None
    return redirects[0] if fetched else redirects[-1]


def _another_chains(waiting: bytes | None, event: CrawlCompleted) -> bool:
    """Whether ``waiting``, the request pending where ``event``'s page moved to, is
    another chain's: not one this attempt planned on an earlier delivery (or its
    ``explored`` twin, the same page asked first another way), which it replaces."""
    if waiting is None:
        return False
    try:
        pending = decode_event(waiting)
    except MalformedEvent:
        return True
    ours = {event.id, explored_attempt_id(event.id)}
    return not (isinstance(pending, CrawlRequested) and pending.caused_by in ours)


def moved_spelling(url: str, target: str) -> bool:
    """Whether ``target`` names the page of ``url`` under another spelling of its own
    host: the other scheme of ``http``/``https``, its path with a trailing slash added
    or taken away, or both; the host, port, rest of the path and query the same."""
    a, b = urlsplit(url), urlsplit(target)
    if {a.scheme, b.scheme} - {"http", "https"} or a.netloc != b.netloc or a.query != b.query:
        return False
    if a.path != b.path and a.path.rstrip("/") + "/" != b.path.rstrip("/") + "/":
        return False
    # One slash at most: ``/a//`` is not ``/a``'s other spelling.
    if abs(len(a.path) - len(b.path)) > 1:
        return False
    return (a.scheme, a.path) != (b.scheme, b.path)


#: The seen set's value for a URL its host's budget refused, before the time (epoch
#: seconds) its cycle ends.
REFUSED = b"refused:"


def _refused_until(claimed_by: bytes) -> float | None:
    """When a budget's refusal ends, if ``claimed_by`` is one (``_refuse``)."""
    if not claimed_by.startswith(REFUSED):
        return None
    try:
        return float(claimed_by[len(REFUSED) :])
    except ValueError:
        return 0.0  # unreadable: ended


def _seen_key(url: str) -> str:
    return "u." + hashlib.sha256(url.encode()).hexdigest()[:40]


def delivery_count(msg: Msg) -> int:
    """How many times JetStream delivered ``msg`` (1 for a message from elsewhere)."""
    meta = jetstream_metadata(msg)
    return 1 if meta is None else int(meta.num_delivered)
