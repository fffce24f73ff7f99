"""Per-domain politeness shared by every fetcher pod, kept in NATS KV.

Each domain has one small record (``DomainSlot``) updated only by compare-and-set on
the KV revision, so among all pods exactly one wins each lease. The fetcher takes a
lease for every request it sends: a page, robots.txt, and each redirect hop (a hop's
lease is its own host's, taken once the previous response has ended).

* ``free_at``: no request may start before this; ``finish`` sets it to ``end + gap``.
  The gap is measured from the end of the previous response, so the site never sees
  two requests closer than the gap, whatever the network latency.
* ``busy_until``: a request is in flight, or about to start (a lease taken ahead for
  the moment the host is free, under a second away). Taking the lease sets it to the
  request's start plus ``request_timeout`` (the longest a request can take) and
  ``HOLD_SLACK``, so a pod that dies mid-fetch still leaves the domain alone until then;
  ``finish`` clears it. No request runs past it: the fetcher bounds each one by what is
  left of its hold.
* ``next``: the reservation frontier. A message that cannot go now is given the next
  free slot (``next`` advances by one gap) and comes back at that time as a NATS
  scheduled message: waiting costs no consumer capacity and no delivery attempts, so
  a domain with thousands of queued pages never holds up the others.
* ``gap``: the domain's delay (the configured minimum, raised by robots.txt
  Crawl-delay, capped by the configured maximum). The host's learned policy may
  lengthen it (a slow host gets a multiple of its response time: ``host_gap``).
  robots.txt is an origin's (``http://h``, ``https://h``, ``https://h:8443``) and the
  gap the host's: ``delays`` keeps each origin's Crawl-delay until its file expires,
  and the gap is the largest of them. Set from the file read last, an ``http://``
  origin answering 404, or sending every path to the ``https://`` home page, put the
  host back to the minimum that the ``https://`` file had raised.
* ``backoff_until``: the host is paused for every pod, and all of its URLs wait for the
  end of the pause at once: a Retry-After, or a pause the learned policy decided
  (failures in a row, a 429 without Retry-After, a ban or a challenge page).
* ``policy``: the host's learned policy (``trove_schema.policy.HostPolicy``). It lives
  in the lease's record because the lease is read and written anyway: acquiring hands
  it to the fetcher (which strategy to use, whether to send validators) at no extra
  round trip, and ``finish`` folds the attempt into it in the same compare-and-set that
  releases the lease. Every pod sees it at its next lease on the host, and no fetcher
  waits on Postgres for it.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from trove_schema.metrics import HOST_PAUSES
from trove_schema.policy import (
    TIME_DIGITS,
    HostPolicy,
    LearningConfig,
    Observation,
    host_gap,
    moved,
    observe,
)
from trove_schema.topology import domain_key
from trove_schema.turns import Turns

log = logging.getLogger("trove.fetcher")

#: ``claimed``: the moment the host is free that a late page waits for (``acquire``);
#: an older pod, which does not know it, reads the others and writes it back as 0.
FIELDS = ("free_at", "busy_until", "next", "gap", "backoff_until", "claimed")
#: The record's key for the learned policy: short, and unknown to older pods, which
#: read only ``FIELDS`` (a record they write back starts the host from its priors again).
POLICY_KEY = "p"
#: The record's key for its origins' Crawl-delays (``DomainSlot.delays``); a record an
#: older pod writes back keeps the gap it had, and the next robots.txt read sets them.
DELAYS_KEY = "d"
#: Origins whose Crawl-delay a host's record keeps: the largest (a host may have a
#: port a link names for each, and the record is read at every lease).
MAX_DELAY_ORIGINS = 8
#: Where a gap comes from that a record written without ``DELAYS_KEY`` raised, and how
#: long it is kept then: a robots.txt is obeyed a day at most (RFC 9309 2.4).
UNKNOWN_ORIGIN = "?"
LEGACY_DELAY_SECONDS = 86_400.0
#: Domains whose last written record a pod remembers (see ``Politeness._written``): a
#: record with its policy (a handful of estimates) is about 1 KB in memory, ~10 MB in all.
WRITTEN_MEMORY = 10_000
#: While another request to the domain is in flight, a reserved job looks again after
#: a gap, but never sooner than this: with a gap near 0 it read the record in a loop
#: (about 12 NATS messages a page from the fetchers in the throughput benchmark).
BUSY_RECHECK = 0.05
#: Seconds a hold allows, on top of the request's timeout, between the lease's start and
#: the request leaving: the pod's turn on the host, the round trips to the buckets (a
#: few milliseconds, a good part of a second under load). A request whose lease came
#: later still is cut short at the hold rather than outlast it (``Fetcher._time_left``).
HOLD_SLACK = 1.0


#: A record's times that a host rests until (``DomainSlot.decode``).
_RESTS = frozenset({"free_at", "busy_until", "backoff_until"})


class KV(Protocol):
    """The part of nats-py's KeyValue this module needs (the injected seam)."""

    async def get(self, key: str) -> object: ...
    async def create(self, key: str, value: bytes) -> int: ...
    async def update(self, key: str, value: bytes, last: int | None = None) -> int: ...


@dataclass(frozen=True, slots=True)
class CrawlDelay:
    """The gap an origin's robots.txt asked for (its Crawl-delay, clamped to the gap's
    bounds), valid while its file is (``until``, on the pods' shared clock)."""

    origin: str
    gap: float
    until: float


@dataclass(slots=True)
class DomainSlot:
    free_at: float = 0.0
    busy_until: float = 0.0
    next: float = 0.0
    gap: float = 0.0
    backoff_until: float = 0.0
    claimed: float = 0.0
    policy: HostPolicy = field(default_factory=HostPolicy)
    #: Each origin's Crawl-delay: origin -> (gap, until).
    delays: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: Read from a record with a time or gap this pod could not read (never written).
    damaged: bool = False
    #: Read from a record that cannot tell whether a request is in flight or has just
    #: ended (its hold or its free time unreadable, or no record this pod can read at
    #: all), and not yet written back with a hold of its own (``Politeness._read``;
    #: never encoded).
    hold_unknown: bool = False
    #: Origins whose Crawl-delay's expiry did not read: kept a day from when the record
    #: is read to be written (``Politeness._read``; never encoded).
    delays_unread: frozenset[str] = frozenset()

    def set_delay(self, delay: CrawlDelay, now: float) -> None:
        """Keep ``delay`` for its origin, forget the expired, and make the host's gap
        the largest its origins' files ask for."""
        kept = {o: d for o, d in self.delays.items() if d[1] > now and o != delay.origin}
        if not self.delays and self.gap > delay.gap:
            # Raised by a file a pod before origins were kept read, of an origin not
            # known: kept for as long as that file may have been obeyed.
            kept[UNKNOWN_ORIGIN] = (self.gap, now + LEGACY_DELAY_SECONDS)
        kept[delay.origin] = (delay.gap, delay.until)
        largest = sorted(kept.items(), key=lambda item: item[1][0], reverse=True)
        self.delays = dict(largest[:MAX_DELAY_ORIGINS])
        self.gap = max(gap for gap, _ in self.delays.values())

    def encode(self) -> bytes:
        raw: dict[str, object] = {k: getattr(self, k) for k in FIELDS}
        raw[POLICY_KEY] = self.policy.to_json()
        if self.delays:
            raw[DELAYS_KEY] = {o: [gap, until] for o, (gap, until) in self.delays.items()}
        return json.dumps(raw, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes | None, default_gap: float) -> DomainSlot:
        if not data:
            return cls(gap=default_gap)
        try:
            raw = json.loads(data)
        except ValueError:
            raw = None
        if not isinstance(raw, dict):
            return cls(gap=default_gap, damaged=True, hold_unknown=True)
        # Field by field, and failing safe: a field this pod cannot read (a release that
        # wrote it otherwise, a hand-made record) costs that field, never the record. A
        # record read as blank granted a host paused for an hour with a request in flight
        # a lease at once, and the write-back erased the pause. An unreadable time is
        # taken as the latest the record can tell (its policy's pause included), so the
        # host waits at least as long as it knew to; an unreadable gap is the largest its
        # origins' Crawl-delays ask for, or the default. The queue's times (``next``,
        # ``claimed``) are not times the host rests until, and are not taken: a host
        # with a day of pages queued stood idle for the day. But a pause that does not
        # read runs to the queue's end (below): a pause is never cut short. An
        # unreadable hold is given when the record is read to be written
        # (``Politeness._read``).
        try:
            values = [float(raw.get(k, 0.0)) for k in FIELDS]
        except (ValueError, TypeError, OverflowError):  # an integer past a float's range
            values = []
        read: dict[str, float | None] = {}
        if not values or not all(map(math.isfinite, values)):
            read = {k: finite(raw.get(k, 0.0)) for k in FIELDS}
            latest = max((v for k, v in read.items() if k in _RESTS and v is not None), default=0.0)
            fill = {"gap": default_gap, "busy_until": 0.0}
            values = [fill.get(k, latest) if v is None else v for k, v in read.items()]
        free_at, busy_until, next_, gap, backoff_until, claimed = values
        slot = cls(free_at, busy_until, next_, gap, backoff_until, claimed)
        # Read tolerantly: a record without a policy (written by an older pod) or with
        # one this pod cannot read keeps its lease, and the host starts from its priors.
        try:
            slot.policy = HostPolicy.from_json(raw.get(POLICY_KEY) or {})
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
            slot.policy = HostPolicy()
        try:
            # Each Crawl-delay as far as it reads. A NaN gap compares false with every
            # other, and made the host's gap NaN, which no time is a gap after; dropped,
            # a delay that did not read let the next Crawl-delay another origin set make
            # the host's gap from the rest. A delay whose gap does not read is the
            # record's gap, for an origin not known; one whose expiry does not read is
            # kept a day (a robots.txt is obeyed a day at most) from the read.
            delays: dict[str, tuple[float, float]] = {}
            unread: set[str] = set()
            for origin, (gap, until) in (raw.get(DELAYS_KEY) or {}).items():
                read_gap, read_until = finite(gap), finite(until)
                key = str(origin) if read_gap is not None else UNKNOWN_ORIGIN
                if read_gap is None:
                    read_gap = slot.gap
                if read_until is None:
                    unread.add(key)
                # Two delays read as one origin's (the origin not known) keep the
                # longer gap and the later expiry: the later one does not replace the
                # first, which may be the live one.
                prior_gap, prior_until = delays.get(key, (0.0, 0.0))
                delays[key] = (max(read_gap, prior_gap), max(read_until or 0.0, prior_until))
            slot.delays, slot.delays_unread = delays, frozenset(unread)
        except (ValueError, TypeError, AttributeError):
            slot.delays, slot.delays_unread = {}, frozenset()
        if None in read.values():
            slot.damaged = True
            # The policy's pause, however written (a number's text, which the policy's
            # reader does not take).
            written = raw.get(POLICY_KEY)
            told = finite(written.get("paused_until")) if isinstance(written, dict) else None
            slot.backoff_until = max(slot.backoff_until, slot.policy.paused_until, told or 0.0)
            if read["backoff_until"] is None:
                # A pause that does not read runs to the queue's end, where the pages
                # that came during it were placed. Not to the policy's alone: an older
                # pod writes none, and a host paused before keeps its pause in the
                # record only.
                slot.backoff_until = max(slot.backoff_until, read["next"] or 0.0)
            if read["gap"] is None and slot.delays:
                slot.gap = max(slot.gap, *(gap for gap, _ in slot.delays.values()))
            slot.hold_unknown = read["busy_until"] is None or read["free_at"] is None
        return slot


def finite(value: object) -> float | None:
    """``value`` as a finite number (a JSON number or its text, as a record or a header
    carries it), else None."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (ValueError, TypeError, OverflowError):
        return None
    return number if math.isfinite(number) else None


@dataclass(frozen=True, slots=True)
class Granted:
    """The lease is ours: send the request at ``start``. ``hold_until`` identifies our hold."""

    hold_until: float
    gap: float
    #: The host's learned policy as the lease found it.
    policy: HostPolicy = field(default_factory=HostPolicy)
    #: When the request may go: the time of the acquire, or a moment later for a lease
    #: taken ahead (``Politeness.acquire``'s ``ahead``).
    start: float = 0.0


@dataclass(frozen=True, slots=True)
class Deferred:
    """Not now: come back at ``at`` (a reserved slot, or when the domain frees up)."""

    at: float


@dataclass(frozen=True, slots=True)
class Moved:
    """The host moved to ``origin`` (its learned policy): ask there, not here."""

    origin: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PolitenessConfig:
    min_delay: float = 10.0
    max_delay: float = 120.0
    #: Longest a request may take (the fetch's total timeout): the pessimistic hold.
    request_timeout: float = 30.0
    #: The longest pause a site's Retry-After may impose on every pod.
    max_backoff: float = 3600.0


class Politeness:
    """Leases and slots for domains, over a KV bucket (one instance per pod)."""

    def __init__(
        self,
        kv: KV,
        config: PolitenessConfig,
        learning: LearningConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kv = kv
        self.config = config
        #: The pods' shared time, read when a record's hold cannot be (``_read``): a
        #: release or an answer written late (after its extraction, or retried while
        #: the broker was away) would give a hold already past from its own instant.
        self.clock = clock
        # The gap's bounds are the politeness settings', whatever the learning says.
        self.learning = replace(
            learning if learning is not None else LearningConfig(),
            min_gap=config.min_delay,
            max_gap=max(config.max_delay, config.min_delay),
        )
        #: The record and revision of each domain as this pod last wrote it. A guess to
        #: write against: when it is current (the usual case, one pod per domain at a
        #: time) a lease, a reservation or a finish costs one KV round trip instead of
        #: two; when it is stale the compare-and-set fails and the record is read.
        #: Decisions that write nothing are never taken from it.
        self._written: dict[str, tuple[DomainSlot, int]] = {}
        #: Each domain's lock and how many of this pod's operations hold or await it.
        #: One read-modify-write of a domain's record at a time in this pod: a page's
        #: links often name one host several times, and their messages arrive together.
        self._turns = Turns()

    @staticmethod
    def key(domain: str) -> str:
        return domain_key(domain)

    def clamp_gap(self, gap: float) -> float:
        return min(
            max(gap, self.config.min_delay), max(self.config.max_delay, self.config.min_delay)
        )

    def gap_of(self, slot: DomainSlot) -> float:
        """The host's gap now: its configured gap (or Crawl-delay), as its policy sets it.
        The gap a record holds is read within the politeness settings' longest (read as
        written, a hand-made one of 1e9 held its host for decades); only a pace its 429s
        taught goes past that, up to the longest back-off (``host_gap``)."""
        return host_gap(slot.policy, min(slot.gap, self.learning.max_gap), self.learning)

    async def acquire(
        self,
        domain: str,
        now: float,
        *,
        reserved: bool = False,
        ahead: float = 0.0,
        follow_moves: bool = False,
        queue: bool = True,
    ) -> Granted | Deferred | Moved:
        """Take the domain's lease at ``now``, or say when to come back.

        ``reserved`` messages already hold a slot (they were deferred once); fresh ones
        queue behind every reservation. With ``ahead``, a lease that can start within
        that many seconds is taken now, for its start (``Granted.start``): the caller
        waits for it and sends without another round trip to the bucket. Only when no
        request is in flight (the end of one is what its gap counts from), and only for
        the moment the host is free: a fresh message behind reservations takes a slot
        of its own, since a lease taken for a later start would hold the host idle
        while the messages that came before it wait. With ``follow_moves``, a host whose
        policy says it moved answers ``Moved``, and nothing is written. A reserved
        message that finds the host paused takes a place behind the pause, unless
        ``queue`` is false (a timeline poll, which has no place: it comes back at the
        pause's end, and takes the host's next free moment then).
        """
        key = self.key(domain)
        async with self._turns.of(key):
            guess = self._guess(key)
            while True:
                slot, revision = guess if guess is not None else await self._read(key, now)
                if slot.hold_unknown:
                    # Written back at once with the hold ``_read`` gave it, before any
                    # decision: a wait that writes nothing would find it unknown again
                    # each time, and hold the host further each time.
                    guess = self._guess(key) if await self._write(key, slot, revision) else None
                    continue
                if follow_moves:
                    origin = moved(slot.policy, now, self.learning)
                    if origin is not None:
                        if guess is not None:  # writes nothing: only on the bucket's word
                            guess = None
                            continue
                        return Moved(origin)
                gap = self.gap_of(slot)
                # Slots are planned a gap and the host's usual answer apart: a request's
                # gap runs from its end, and slots a gap apart from each start fell
                # behind by an answer each, until every page of a long queue came due
                # before its host was free. With no gap (a test's, a benchmark's) nothing
                # falls behind, and pages take the host as it comes free: planned an
                # answer apart, the pages a page revealed (an alias's probes) waited
                # behind every page found before them.
                spacing = gap + _usual_answer(slot) if gap > 0 else 0.0
                # A paused host (``backoff_until``) is refused to every message: its URLs
                # come back when the pause ends, not one failed request each.
                # A hold nobody released (its pod died, or lost the broker, or took longer
                # than the fetch's timeout to finish) ended no later than it expired, but
                # when is unknown: the host rests a gap after it, as after any answer.
                expired_hold = slot.busy_until + gap if 0 < slot.busy_until <= now else 0.0
                free = max(slot.free_at, slot.backoff_until, expired_hold)
                earliest = max(free, slot.busy_until)
                if not reserved:
                    earliest = max(earliest, slot.next)
                if now >= earliest or (
                    slot.busy_until <= now and earliest == free and earliest - now <= ahead
                ):
                    start = max(now, earliest)
                    hold = start + self.config.request_timeout + HOLD_SLACK
                    slot.busy_until = hold
                    slot.free_at = start + gap
                    slot.next = max(slot.next, start + spacing)
                    if await self._write(key, slot, revision):
                        return Granted(hold_until=hold, gap=gap, policy=slot.policy, start=start)
                    guess = None
                    continue
                # A paused host holds its reserved messages too. Told to come back at the
                # pause's end, all of them would meet there, one win, and the rest be told
                # to come back a gap later, again and again until the last (n² look-ups for
                # a host with n queued pages): they take places one gap apart behind the
                # pause instead, as fresh ones do.
                if reserved and (slot.backoff_until <= now or not queue):
                    if guess is not None:  # a wait that writes nothing: only on the bucket's word
                        guess = None
                        continue
                    # Keep our place: the domain is busy or cooling down a little longer. While
                    # a request is in flight we cannot know when it ends. It cannot end before
                    # it started, so ``free`` (one gap after its start) is the first moment
                    # worth a look; past that (a slow answer), look again a gap on.
                    if slot.busy_until > now and now >= free:
                        return Deferred(at=now + max(gap, BUSY_RECHECK))
                    if free - now <= ahead or not queue:
                        return Deferred(at=free)
                    # Late by more than ``ahead`` (an answer slower than the host's usual,
                    # its gap raised since the slots were planned). Told to come back when
                    # the host is free, every late page of a queue met there, one won,
                    # and the rest came back a gap later, again and again (n² for n
                    # pages). The first to find that moment waits for it, and claims it
                    # in the record; any other, or one later than a slot, takes a new
                    # place behind the queue, as behind a pause (sent there, every late
                    # page left its slot idle). While a request is in flight, the moment
                    # is a usual answer past ``free`` (one gap after its start); a claim
                    # holds until the host is free past it, whatever the answer moved.
                    claim = free + (_usual_answer(slot) if slot.busy_until > now else 0.0)
                    if not _claimed(slot, free, ahead) and free - now < spacing:
                        slot.claimed = claim
                        if await self._write(key, slot, revision):
                            return Deferred(at=claim)
                        guess = None
                        continue
                # The in-flight hold is pessimistic; slots are planned apart (``spacing``)
                # and checked again when they come due. Taking one writes ``next``, so the
                # compare-and-set checks a guess: a current one saves the read. A page
                # comes a slot after the moment a late one claimed, not at it.
                after = max(free, slot.claimed) + spacing if _claimed(slot, free, ahead) else free
                at = max(slot.next, after, now)
                slot.next = at + spacing
                if await self._write(key, slot, revision):
                    return Deferred(at=at)
                guess = None

    async def finish(
        self,
        domain: str,
        grant: Granted,
        end: float,
        observation: Observation | None = None,
        *,
        delays: tuple[CrawlDelay, ...] = (),
        rest_until: float = 0.0,
    ) -> HostPolicy:
        """The request ended at ``end``: the domain is free again one (learned) gap later,
        and not before ``rest_until`` (a wait its answer asked, up to ``max_backoff``).

        ``observation`` (what the attempt said about the host) is folded into the host's
        policy in the same write: its gap and any pause it decides take effect for every
        pod with the release. ``delays`` are Crawl-delays of the host's origins (their
        robots.txt just read), set in the same write too, and counted from this ``end``
        already. Returns the policy as written.
        """
        if observation is not None and observation.retry_after is not None:
            # What a site may ask of every pod is capped.
            capped = min(observation.retry_after, self.config.max_backoff)
            observation = replace(observation, retry_after=capped)
        key = self.key(domain)
        async with self._turns.of(key):
            guess = self._guess(key)
            while True:
                slot, revision = guess if guess is not None else await self._read(key, end)
                before = slot.policy
                for delay in delays:
                    slot.set_delay(delay, end)
                if observation is not None:
                    slot.policy = self._folded(before, observation)
                slot.free_at = max(slot.free_at, end + self.gap_of(slot))
                asked = min(rest_until, end + self.config.max_backoff)
                slot.backoff_until = max(slot.backoff_until, slot.policy.paused_until, asked)
                if slot.busy_until == grant.hold_until and not slot.hold_unknown:
                    slot.busy_until = 0.0
                if await self._write(key, slot, revision):
                    _said_if_paused(domain, before, slot.policy, end)
                    return slot.policy
                guess = None

    async def set_delay(self, domain: str, delay: CrawlDelay, end: float) -> None:
        """Set a Crawl-delay of ``domain``'s (its origin's robots.txt, read from the host
        it redirected to, under that host's lease), counted from ``end``."""
        key = self.key(domain)
        async with self._turns.of(key):
            guess = self._guess(key)
            while True:
                slot, revision = guess if guess is not None else await self._read(key, end)
                slot.set_delay(delay, end)
                slot.free_at = max(slot.free_at, end + self.gap_of(slot))
                slot.next = max(slot.next, slot.free_at)
                if await self._write(key, slot, revision):
                    return
                guess = None

    async def observe(self, domain: str, observation: Observation) -> HostPolicy:
        """Fold what a request made outside ``finish`` said about the host (a timeline
        poll's last answer): a pause it decides holds every pod at once."""
        if observation.retry_after is not None:
            capped = min(observation.retry_after, self.config.max_backoff)
            observation = replace(observation, retry_after=capped)
        key = self.key(domain)
        async with self._turns.of(key):
            while True:
                slot, revision = await self._read(key, observation.at)
                before = slot.policy
                slot.policy = self._folded(before, observation)
                slot.backoff_until = max(slot.backoff_until, slot.policy.paused_until)
                if await self._write(key, slot, revision):
                    _said_if_paused(domain, before, slot.policy, observation.at)
                    return slot.policy

    def _folded(self, policy: HostPolicy, observation: Observation) -> HostPolicy:
        """``policy`` once ``observation`` is known, unless it is known already: a release
        whose write was applied but whose answer was lost (the broker away a moment) is
        tried again, and its attempt must not count twice (two 429s, a longer pause). A
        host's attempts end one at a time under its lease, so the last one folded is
        recognised by its instant."""
        if policy.attempts and policy.last_attempt_at == round(observation.at, TIME_DIGITS):
            return policy
        return observe(policy, observation, self.learning)

    async def state(self, domain: str) -> DomainSlot:
        """The host's record as the bucket holds it (a look: no hold is given)."""
        slot, _ = await self._read(self.key(domain), None)
        return slot

    async def _read(self, key: str, now: float | None) -> tuple[DomainSlot, int | None]:
        """The record and its revision, read to be written back at ``now``."""
        try:
            entry = await self.kv.get(key)
        except KeyNotFoundError:
            return DomainSlot(gap=self.config.min_delay), None
        value = getattr(entry, "value", None)
        revision = getattr(entry, "revision", None)
        slot = DomainSlot.decode(value, self.config.min_delay)
        if slot.damaged:
            # What the record's policy still says of the host's last answer: the host is
            # free a gap after it, whichever of the record's times could not be read.
            slot.free_at = max(slot.free_at, slot.policy.last_attempt_at + self.gap_of(slot))
        if now is None or not (slot.delays_unread or slot.hold_unknown):
            return slot, revision
        read_at = max(now, self.clock())
        if slot.delays_unread:
            until = read_at + LEGACY_DELAY_SECONDS
            for origin in slot.delays_unread:
                gap, known = slot.delays[origin]
                slot.delays[origin] = (gap, max(known, until))
            slot.delays_unread = frozenset()
        if slot.hold_unknown:
            # A record that cannot tell whether a request is in flight or has just ended
            # (a release that writes it otherwise, a hand-made value) may stand for one
            # granted just now: read as free, the host was granted at once. It is held
            # as a lease granted as it is read would hold it, and every pod waits out
            # that hold and a gap after it once it is written back. A lease taken ahead
            # (``acquire``'s ``ahead``) starts after it was granted, a gap before the
            # free time it wrote: the hold runs from there when that is later.
            gap = self.gap_of(slot)
            start = max(read_at, slot.free_at - gap)
            slot.busy_until = max(slot.busy_until, start + self.config.request_timeout + HOLD_SLACK)
            slot.free_at = max(slot.free_at, start + gap)
        return slot, revision

    async def _write(self, key: str, slot: DomainSlot, revision: int | None) -> bool:
        """Compare-and-set: False when another pod changed the record first."""
        try:
            if revision is None:
                written = await self.kv.create(key, slot.encode())
            else:
                written = await self.kv.update(key, slot.encode(), last=revision)
        except KeyWrongLastSequenceError:
            self._written.pop(key, None)
            return False
        if len(self._written) >= WRITTEN_MEMORY and key not in self._written:
            del self._written[next(iter(self._written))]
        # The policy is immutable, so a shallow copy is a copy.
        self._written[key] = (replace(slot, hold_unknown=False, delays_unread=frozenset()), written)
        return True

    def _guess(self, key: str) -> tuple[DomainSlot, int] | None:
        """A copy of the record as this pod last wrote it, if it remembers one."""
        known = self._written.get(key)
        return None if known is None else (replace(known[0]), known[1])


def _claimed(slot: DomainSlot, free: float, ahead: float) -> bool:
    """Whether a late page has claimed the moment the host is next free, ``free``
    (within ``ahead``: the answer in flight ends a little sooner or later than usual)."""
    return slot.claimed >= free - ahead


def _usual_answer(slot: DomainSlot) -> float:
    """Seconds the host's answers usually take (the median its policy keeps), 0 unknown."""
    response_ms = slot.policy.response_ms
    return 0.0 if response_ms is None else max(0.0, response_ms) / 1000.0


def _said_if_paused(domain: str, before: HostPolicy, after: HostPolicy, now: float) -> None:
    """Count and log a pause this write decided (or made longer): the one line that
    says why a host is left alone, when the operator asks why it is not crawled. A
    pace its 429s set is logged too: it slows the host for hours."""
    if before.refused_after and not after.refused_after and after.pace > before.pace:
        log.info(
            "host paced at %gs between requests: its 429s let one through %gs after an answer",
            after.pace,
            round(after.answered_at - before.answered_at, 1),
            extra={"domain": domain, "pace_seconds": after.pace},
        )
    if after.paused_until <= max(before.paused_until, now):
        return
    reason = after.pause_reason or "unknown"
    HOST_PAUSES.labels(reason).inc()
    seconds = round(after.paused_until - now, 1)
    log.info(
        "host paused for %gs: %s",
        seconds,
        reason,
        extra={"domain": domain, "pause_reason": reason, "paused_seconds": seconds},
    )
