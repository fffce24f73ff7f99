"""The fetcher: turns work (PageDiscovered, CrawlRequested) into CrawlCompleted, politely.

For each work message: robots.txt (shared cache) -> the domain's lease (shared KV) ->
the request -> extraction off the event loop -> publish CrawlCompleted, wait for its
PubAck -> ack the work. A message whose domain is busy is re-scheduled for the
domain's next free slot as a NATS scheduled message and acked: it costs nothing while
it waits. A pod killed anywhere before the ack loses nothing: the work is redelivered
and the lease still protects the domain.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from trove_fetcher.extract import Extraction, extract, is_parseable
from trove_fetcher.http import FetchLimits, FetchResult, fetch
from trove_fetcher.politeness import Deferred, Granted, Politeness
from trove_fetcher.robots import RobotsPolicy, fetch_robots
from trove_schema.bus import Bus, Retry, schedule_header
from trove_schema.events import (
    MAX_LINKS_PER_PAGE,
    CrawlCompleted,
    CrawlOutcome,
    CrawlRequested,
    LinkKind,
    PageDiscovered,
    decode_event,
    derived_event_id,
)
from trove_schema.metrics import (
    FETCH_BYTES,
    FETCH_SECONDS,
    FETCHES,
    FETCHES_IN_FLIGHT,
    LEASES,
    ROBOTS_CACHE,
)
from trove_schema.topology import FETCH_DEFERRED, WORK_SCHEDULES_PREFIX
from trove_schema.urls import canonicalize_or_none, origin_of

log = logging.getLogger("trove.fetcher")

#: Header on a deferred work message: the slot it was given.
SLOT_HEADER = "Trove-Slot"
#: Waits shorter than this are spent in the task rather than in a scheduled message
#: (the JetStream scheduler fires with a granularity of a few hundred milliseconds).
LOCAL_WAIT = 1.0


@dataclass(frozen=True, slots=True)
class Job:
    work: PageDiscovered | CrawlRequested
    reserved: bool

    @property
    def url(self) -> str:
        return self.work.url

    @property
    def domain(self) -> str:
        return self.work.domain


class Fetcher:
    """One per pod: the shared HTTP client, KV handles and a thread pool for parsing."""

    def __init__(
        self,
        *,
        bus: Bus,
        client: httpx.AsyncClient,
        politeness: Politeness,
        robots_kv: KeyValue,
        limits: FetchLimits,
        robots_token: str,
        robots_max_bytes: int,
        parse_workers: int = 2,
    ) -> None:
        self.bus = bus
        self.client = client
        self.politeness = politeness
        self.robots_kv = robots_kv
        self.limits = limits
        self.robots_token = robots_token
        self.robots_max_bytes = robots_max_bytes
        self.parser = ThreadPoolExecutor(max_workers=parse_workers, thread_name_prefix="parse")
        self._robots_local: dict[str, tuple[float, RobotsPolicy]] = {}

    async def handle(self, msg: Msg) -> None:
        event = decode_event(msg.data)
        if not isinstance(event, PageDiscovered | CrawlRequested):
            return  # not work for us; ack it
        reserved = bool(msg.headers and msg.headers.get(SLOT_HEADER))
        job = Job(event, reserved)
        try:
            await self.process(job, msg.data)
        except (httpx.HTTPError, OSError) as exc:  # defensive: fetch() classifies these itself
            raise Retry(f"transient fetch error: {exc}") from exc

    async def process(self, job: Job, payload: bytes) -> None:
        robots = await self._cached_robots(job.url)
        if robots is not None and not robots.allows(job.url, self.robots_token):
            await self._complete(job, _robots_refusal(job, robots))
            return
        grant = await self._lease(job, payload)
        if grant is None:
            return
        if robots is None:
            # Another task or pod may have fetched it while we waited for the lease.
            robots = await self._cached_robots(job.url)
            if robots is None:
                robots = await self._fetch_robots(job, grant)
                # robots.txt used this lease; the page waits for the next one.
                if robots.allows(job.url, self.robots_token):
                    grant = await self._lease(job, payload)
                    if grant is None:
                        return
            if not robots.allows(job.url, self.robots_token):
                await self.politeness.finish(job.domain, grant, time.time())
                await self._complete(job, _robots_refusal(job, robots))
                return
        await self._fetch_page(job, grant)

    async def _lease(self, job: Job, payload: bytes) -> Granted | None:
        reserved = job.reserved
        while True:
            now = time.time()
            decision = await self.politeness.acquire(job.domain, now, reserved=reserved)
            if isinstance(decision, Granted):
                LEASES.labels("granted").inc()
                return decision
            wait = decision.at - now
            if wait <= LOCAL_WAIT:
                LEASES.labels("waited").inc()
                await asyncio.sleep(max(0.0, wait))
                reserved = True
                continue
            LEASES.labels("deferred").inc()
            await self._defer(job, payload, decision)
            return None

    async def _defer(self, job: Job, payload: bytes, decision: Deferred) -> None:
        slot = f"{decision.at:.3f}"
        schedule_id = derived_event_id(f"{job.work.id}:{slot}", "slot")
        at = datetime.fromtimestamp(decision.at, UTC)
        headers = {
            "Nats-Msg-Id": schedule_id,
            SLOT_HEADER: slot,
            "Nats-Schedule": schedule_header(at),
            "Nats-Schedule-Target": FETCH_DEFERRED,
        }
        await self.bus.js.publish(
            f"{WORK_SCHEDULES_PREFIX}.{schedule_id}", payload, headers=headers
        )
        log.debug("deferred", extra={"url": job.url, "domain": job.domain, "slot": slot})

    async def _fetch_page(self, job: Job, grant: Granted) -> None:
        etag = job.work.etag if isinstance(job.work, CrawlRequested) else None
        last_modified = job.work.last_modified if isinstance(job.work, CrawlRequested) else None
        started = datetime.now(UTC)
        FETCHES_IN_FLIGHT.inc()
        try:
            result = await fetch(
                self.client,
                job.url,
                etag=etag,
                last_modified=last_modified,
                limits=self.limits,
                is_parseable=is_parseable,
                robots_allows=self._redirect_allowed,
            )
        finally:
            FETCHES_IN_FLIGHT.dec()
            await self.politeness.finish(job.domain, grant, time.time())
        FETCH_SECONDS.observe(result.elapsed)
        FETCH_BYTES.inc(result.bytes_read)
        if result.status_code in (429, 503) and result.retry_after:
            await self.politeness.back_off(
                job.domain, time.time() + result.retry_after, time.time()
            )
        extraction: Extraction | None = None
        if result.outcome is CrawlOutcome.SUCCESS and result.body is not None:
            loop = asyncio.get_running_loop()
            extraction = await loop.run_in_executor(self.parser, self._extract, result)
        await self._complete(job, _completed(job, result, extraction, started))

    async def _redirect_allowed(self, url: str) -> bool:
        """A same-host redirect hop must be allowed by robots.txt too (when it is known)."""
        policy = await self._cached_robots(url)
        return policy is None or policy.allows(url, self.robots_token)

    def _extract(self, result: FetchResult) -> Extraction:
        assert result.body is not None
        return extract(
            result.body,
            url=result.final_url or "",
            content_type=result.content_type,
            x_robots_tag=result.x_robots_tag,
            robots_token=self.robots_token,
        )

    async def _complete(self, job: Job, event: CrawlCompleted) -> None:
        await self.bus.publish(event)
        FETCHES.labels(event.outcome.value).inc()
        log.info(
            "crawled",
            extra={
                "url": job.url,
                "domain": job.domain,
                "outcome": event.outcome.value,
                "status": event.status_code,
                "event_id": event.id,
            },
        )

    # robots.txt -----------------------------------------------------------------

    async def _cached_robots(self, url: str) -> RobotsPolicy | None:
        origin = origin_of(url)
        now = time.monotonic()
        local = self._robots_local.get(origin)
        if local is not None and local[0] > now:
            ROBOTS_CACHE.labels("local").inc()
            return local[1]
        try:
            entry = await self.robots_kv.get(_robots_key(origin))
        except KeyNotFoundError:
            ROBOTS_CACHE.labels("miss").inc()
            return None
        if entry.value is None:
            return None
        try:
            policy = RobotsPolicy.from_bytes(entry.value)
        except ValueError:
            return None  # an unreadable cache entry is a miss: fetch robots.txt again
        if policy.expired(time.time()):
            return None
        self._robots_local[origin] = (now + min(60.0, policy.expires_in(time.time())), policy)
        ROBOTS_CACHE.labels("shared").inc()
        return policy

    async def _fetch_robots(self, job: Job, grant: Granted) -> RobotsPolicy:
        origin = origin_of(job.url)
        try:
            policy = await fetch_robots(self.client, origin, max_bytes=self.robots_max_bytes)
        finally:
            end = time.time()
        await self.politeness.set_gap(job.domain, policy.crawl_delay(self.robots_token))
        await self.politeness.finish(job.domain, grant, end)
        await self.robots_kv.put(_robots_key(origin), policy.to_bytes())
        self._robots_local[origin] = (time.monotonic() + 60.0, policy)
        return policy

    def close(self) -> None:
        self.parser.shutdown(wait=False, cancel_futures=True)


def _robots_key(origin: str) -> str:
    return hashlib.sha1(origin.encode(), usedforsecurity=False).hexdigest()


def _base(job: Job) -> dict[str, object]:
    work = job.work
    return {
        "url": work.url,
        "domain": work.domain,
        "depth": work.depth,
        "priority": work.priority,
        "scope": work.scope,
        "attempt": work.attempt if isinstance(work, CrawlRequested) else 1,
        "request_id": work.id,
        # One attempt per work event: a redelivered job republishes the same id.
        "id": derived_event_id(work.id, "crawl"),
    }


def _robots_refusal(job: Job, robots: RobotsPolicy) -> CrawlCompleted:
    """The site's robots.txt forbids the URL; or it could not be read, so nothing is
    allowed for now: that is a failed (retryable) attempt, not the site's refusal."""
    now = datetime.now(UTC)
    if robots.temporary:
        status = f" ({robots.status_code})" if robots.status_code else ""
        outcome = CrawlOutcome.FAILED
        reason = f"robots.txt unavailable{status}: {robots.error or 'disallow all for now'}"
    else:
        outcome, reason = CrawlOutcome.BLOCKED_ROBOTS, "disallowed by robots.txt"
    return CrawlCompleted(
        **_base(job),
        outcome=outcome,
        error_message=reason[:2000],
        started_at=now,
        completed_at=now,
    )


def _completed(
    job: Job, result: FetchResult, extraction: Extraction | None, started: datetime
) -> CrawlCompleted:
    # Links as plain dicts: pydantic validates them in one go, in Rust, when the event is
    # built (~1 us a link; model_construct, in Python, takes ~3.5).
    links: list[dict[str, object]] = []
    truncated = False
    extra: dict[str, object] = {}
    if extraction is not None:
        canonical: dict[tuple[str, LinkKind], bool] = {}
        for found in extraction.links:
            url = canonicalize_or_none(found.url)
            if url is not None and (url, found.kind) not in canonical:
                canonical[(url, found.kind)] = found.nofollow
        links = [
            {"url": url, "kind": kind, "nofollow": nofollow}
            for (url, kind), nofollow in canonical.items()
        ]
        truncated = extraction.links_truncated
        extra = {
            "title": extraction.title,
            "language": extraction.language,
            "keywords": extraction.keywords,
            "content_hash": extraction.content_hash,
            "canonical_url": canonicalize_or_none(extraction.canonical_url or ""),
            "noindex": extraction.noindex,
            "nofollow": extraction.nofollow,
        }
    if result.redirect_target:
        target = canonicalize_or_none(result.redirect_target)
        if target is not None:
            links = [*links[: MAX_LINKS_PER_PAGE - 1], {"url": target, "kind": LinkKind.REDIRECT}]
    final_url = result.final_url if result.final_url and result.final_url != job.url else None
    return CrawlCompleted(
        **_base(job),
        outcome=result.outcome,
        status_code=result.status_code,
        error_message=result.error_message,
        started_at=started,
        completed_at=datetime.now(UTC),
        retry_after=result.retry_after,
        content_type=result.content_type,
        content_length=len(result.body) if result.body is not None else result.bytes_read,
        final_url=final_url,
        links=links,
        links_truncated=truncated,
        etag=result.etag,
        last_modified=result.last_modified,
        **extra,
    )
