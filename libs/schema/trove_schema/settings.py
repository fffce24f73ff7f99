"""Typed settings, one object per service, read from ``TROVE_*`` environment variables.

All of them live here so that an unknown ``TROVE_*`` key (a typo such as
``TROVE_MIN_DOMAIN_DELAY_SECOND``) is refused at start by every service, with the
closest known name, instead of being silently ignored.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self, TypeVar

from pydantic import AfterValidator, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from trove_schema.addresses import nat64_prefix, parse_nameserver, resolve_entry
from trove_schema.errors import TroveError
from trove_schema.events import MAX_LINKS_PER_PAGE, MAX_URL_LENGTH
from trove_schema.exclusions import read_rules, read_rules_file

PREFIX = "TROVE_"

#: The longest any duration setting is: a century. Ages and TTLs go to JetStream as
#: int64 nanoseconds (292 years at most; the seen TTL's default, twice the longest
#: re-crawl interval, still fits), and a retention's cut-off (now less its window) is a
#: datetime, which starts at year 1: a longer value passed every other check and then
#: stopped a service at start, or a retention at every pass.
MAX_DURATION_SECONDS = 100 * 365 * 86_400.0


def _at_most_a_century(seconds: float) -> float:
    # Read as a century rather than refused: a row of nines was how an operator said
    # "for ever" where 0 did not (the audit's retention), and such a setting started.
    return min(seconds, MAX_DURATION_SECONDS)


#: A duration setting, in seconds; each field adds its lower bound. A field with a
#: tighter upper bound of its own stays a plain float.
Seconds = Annotated[float, AfterValidator(_at_most_a_century)]

#: The shortest period of a loop a setting times (a refresh, a recheck, a pass): the
#: tests scale a day down to seconds, but a loop every tenth of a millisecond spent a
#: fifth to a third of a core on its round trips.
MIN_INTERVAL_SECONDS = 0.1
Interval = Annotated[float, Field(ge=MIN_INTERVAL_SECONDS), AfterValidator(_at_most_a_century)]


def _for_ever_or_a_second(seconds: float) -> float:
    # JetStream refuses an age under 100 ms, which a service took for a broker not ready
    # and tried again for ever; and an age that short keeps nothing a service could use.
    if 0 < seconds < 1:
        raise ValueError("must be 0 (kept for ever) or at least 1 second")
    return seconds


#: How long a stream keeps what it holds; 0 keeps it for ever.
Age = Annotated[
    float, Field(ge=0.0), AfterValidator(_for_ever_or_a_second), AfterValidator(_at_most_a_century)
]


class UnknownSetting(TroveError):
    """A TROVE_* environment variable that no Trove settings object knows."""


class CommonSettings(BaseSettings):
    # inf (1e400 too) passes every lower bound: no setting means it, nor nan.
    model_config = SettingsConfigDict(
        env_prefix=PREFIX, extra="forbid", frozen=True, allow_inf_nan=False
    )

    #: Empty means: start the embedded nats-server (CLI only; services need a URL).
    #: Credentials go in the URL (tls://user:password@host:4222).
    nats_url: str = ""
    #: PEM file of the CA that signed the NATS server's certificate; unset, the system's
    #: CAs (a server that requires TLS is still verified).
    nats_tls_ca: Path | None = None
    #: A client certificate and its key (PEM files), for a NATS that verifies clients.
    nats_tls_cert: Path | None = None
    nats_tls_key: Path | None = None
    #: SQLAlchemy URL, e.g. postgresql+asyncpg://trove:trove@db/trove. Empty: embedded.
    database_url: str = ""

    @field_validator("database_url")
    @classmethod
    def _database_url_is_usable(cls, value: str) -> str:
        """Refused in one line at start where the first connect gave a traceback: a port
        past 65535 (an OverflowError), one that is no number, libpq's ``sslmode``, which
        asyncpg does not take (a TypeError). The message never quotes the URL: it may
        hold the password."""
        if not value:
            return value
        # Here, not at the module's import: the fetcher and discovery have no database,
        # and SQLAlchemy would add 11 MiB to each of their pods.
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            url = make_url(value)
            port = url.port
        except (ArgumentError, ValueError):
            raise ValueError(
                "not a database URL: postgresql+asyncpg://user:password@host:5432/database"
            ) from None
        if port is not None and not 1 <= port <= 65535:
            raise ValueError(f"port {port} is not one from 1 to 65535")
        if "sslmode" in url.query:
            raise ValueError("asyncpg takes ssl=require (or verify-full), not libpq's sslmode")
        return value

    #: Where the embedded stack keeps its data.
    state_dir: Path = Path(".trove")
    #: `trove up` and `trove crawl` restart a service process that dies after this
    #: delay, doubled with each exit in a row up to the maximum; a process that ran for
    #: the reset time before it died starts over from the first delay.
    restart_delay_seconds: Interval = 1.0
    restart_max_delay_seconds: Seconds = Field(default=60.0, gt=0.0)
    restart_reset_after_seconds: Seconds = Field(default=30.0, gt=0.0)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "text"] = "json"
    #: JetStream replicas for streams and buckets (3 on a production cluster).
    replicas: int = Field(default=1, ge=1, le=5)
    #: Port for /healthz, /readyz and /metrics; 0 disables the HTTP endpoint.
    http_port: int = Field(default=0, ge=0, le=65535)
    #: How long the event record (TROVE_EVENTS) keeps events; 0 keeps them for ever.
    events_max_age_seconds: Age = 0.0
    # What waits in TROVE_EVENTS as a schedule: discovery's re-crawls and timeline polls
    # (the recorder's retries below). Every service reads them, so that the recorder,
    # which owns the stream's retention, refuses one that would drop them.
    #: A fetched page is re-requested after this many seconds (default 7 days); later
    #: intervals follow the page's changes (``trove_schema.change_rate``) within
    #: TROVE_RECRAWL_MIN_SECONDS and the bound below.
    recrawl_after_seconds: Seconds = Field(default=7 * 86_400.0, ge=1)
    #: Longest re-crawl interval. 0, the default: 30 days, or the first interval if
    #: that is longer.
    recrawl_max_seconds: Seconds = Field(default=0.0, ge=0.0)
    #: A followed timeline is polled again this many seconds after a poll that read
    #: everything new (at once when the poll stopped at its page bound).
    poll_interval_seconds: Interval = 300.0
    #: Longest pause after failed polls (the pause doubles with each failure in a row)
    #: or asked for by an instance (Retry-After, its rate-limit reset).
    poll_max_backoff_seconds: Seconds = Field(default=6 * 3600.0, gt=0.0)
    #: How the event record's finished blocks are stored on disk: S2-compressed, or not.
    #: Set by the recorder, which owns the stream (bench/bench_record_size.py measures both).
    events_compression: Literal["s2", "none"] = "s2"
    #: How long deferred fetch work (TROVE_WORK) is kept; 0, the default, keeps it until
    #: a fetcher has handled it (the fetchers purge what they acked): work waits for a
    #: fetcher however long none runs. With an age, work that came due while no fetcher
    #: ran for longer than it is lost, and no slot is planned past half of it.
    work_max_age_seconds: Age = 0.0
    #: How long seeds sent to trove.seeds are kept (TROVE_SEEDS).
    seeds_max_age_seconds: Seconds = Field(default=30 * 86_400.0, ge=60.0)
    #: How long parked messages are kept (TROVE_DEAD); 0, the default, keeps them until
    #: an operator re-drives or drops them with `trove dead`.
    dead_max_age_seconds: Age = 0.0
    #: Largest message a stream accepts; events are built to fit below it.
    max_message_bytes: int = Field(default=1 << 20, ge=64 * 1024, le=8 << 20)
    # The learned per-host policy (trove_schema.policy): the fetcher acts on it, the
    # recorder projects it for the operator, so both read the same values.
    #: Seconds between two requests to one domain; robots.txt Crawl-delay may raise it.
    min_domain_delay_seconds: Seconds = Field(default=10.0, ge=0.0)
    max_domain_delay_seconds: Seconds = Field(default=120.0, ge=0.0)
    #: Longest a 429/503 Retry-After may pause a whole domain.
    max_backoff_seconds: Seconds = Field(default=3600.0, gt=0.0)
    #: A host's gap is at least this many times its recent response time (a median).
    gap_response_factor: float = Field(default=10.0, ge=0.0)
    #: First pause of a host that refuses, times out or answers 5xx; doubled per
    #: failure in a row, up to the maximum.
    host_pause_seconds: Seconds = Field(default=60.0, gt=0.0)
    host_pause_max_seconds: Seconds = Field(default=86_400.0, gt=0.0)
    #: First pause after a 429/503 without Retry-After, doubled per answer in a row (up
    #: to TROVE_MAX_BACKOFF_SECONDS).
    rate_pause_seconds: Seconds = Field(default=60.0, gt=0.0)
    #: Pause after a ban or a challenge page.
    ban_pause_seconds: Seconds = Field(default=86_400.0, gt=0.0)
    #: A host whose best fetch strategy often gets nothing usable is asked another way
    #: at most once in this many requests (0: never); a host served well, never.
    explore_every: int = Field(default=50, ge=0)
    #: A host learned to have moved (its redirects keep the path, to one other origin)
    #: is not asked for this long; its pages are asked for at the new origin meanwhile.
    host_move_recheck_seconds: Seconds = Field(default=7 * 86_400.0, ge=0.0)
    #: Seed priors (TOML, see trove_schema/priors.toml); unset, the shipped ones.
    priors_file: Path | None = None
    #: Hosts Trove never crawls, each with every name below it (trove_schema.exclusions):
    #: comma-separated here, one or more a line in the file. Read by discovery and the
    #: fetcher at start.
    excluded_hosts: Annotated[tuple[str, ...], NoDecode] = ()
    excluded_hosts_file: Path | None = None
    #: How often discovery, the fetcher and the recorder read the shared list of excluded
    #: hosts (the ``trove_exclusions`` bucket): a host listed there is left alone, and its
    #: pages marked rejected in the tables, within this long.
    exclusions_refresh_seconds: Interval = 5.0

    @model_validator(mode="after")
    def _schedules_are_kept(self) -> Self:
        first = self.recrawl_after_seconds
        if self.recrawl_max_seconds and self.recrawl_max_seconds < first:
            raise ValueError(
                f"TROVE_RECRAWL_MAX_SECONDS ({self.recrawl_max_seconds:g}) must not be shorter "
                f"than TROVE_RECRAWL_AFTER_SECONDS ({first:g}), the first interval"
            )
        if self.poll_max_backoff_seconds < self.poll_interval_seconds:
            # A failing timeline would be polled more often than a healthy one, and an
            # instance's longer Retry-After cut to the cap.
            raise ValueError(
                f"TROVE_POLL_MAX_BACKOFF_SECONDS ({self.poll_max_backoff_seconds:g}) must not "
                f"be shorter than TROVE_POLL_INTERVAL_SECONDS ({self.poll_interval_seconds:g})"
            )
        _check_schedules_kept(self.events_max_age_seconds, self.recrawl_max, "re-crawls")
        _check_schedules_kept(
            self.events_max_age_seconds,
            max(self.poll_interval_seconds, self.poll_max_backoff_seconds),
            "timeline polls",
        )
        return self

    @model_validator(mode="after")
    def _pauses_back_off(self) -> Self:
        # Each bound and what it may not be shorter than. A bound left at its default
        # follows it up (a gap of an hour asks longer pauses than the defaults, not an
        # operator's second setting); one set shorter is refused.
        bounds = (
            # Every robots.txt Crawl-delay would be cut to the minimum, unsaid.
            ("TROVE_MAX_DOMAIN_DELAY_SECONDS", "TROVE_MIN_DOMAIN_DELAY_SECONDS", ""),
            (
                "TROVE_HOST_PAUSE_MAX_SECONDS",
                "TROVE_HOST_PAUSE_SECONDS",
                ", the first pause it bounds",
            ),
            (
                "TROVE_MAX_BACKOFF_SECONDS",
                "TROVE_RATE_PAUSE_SECONDS",
                ", the first pause it bounds",
            ),
            # A host's next request waits for its gap anyway: a pause no longer than
            # the gap would answer a 429, a ban or a host that keeps failing with none.
            (
                "TROVE_HOST_PAUSE_MAX_SECONDS",
                "TROVE_MIN_DOMAIN_DELAY_SECONDS",
                ": a pause within the gap is no pause",
            ),
            (
                "TROVE_MAX_BACKOFF_SECONDS",
                "TROVE_MIN_DOMAIN_DELAY_SECONDS",
                ": a pause within the gap is no pause",
            ),
            (
                "TROVE_BAN_PAUSE_SECONDS",
                "TROVE_MIN_DOMAIN_DELAY_SECONDS",
                ": a pause within the gap is no pause",
            ),
        )
        for longest, shortest, why in bounds:
            floor = self._seconds(shortest)
            if self._seconds(longest) >= floor:
                continue
            field = longest.removeprefix(PREFIX).lower()
            if field not in self.model_fields_set:
                object.__setattr__(self, field, floor)  # frozen: set once, while built
                continue
            raise ValueError(
                f"{longest} ({self._seconds(longest):g}) must not be shorter than "
                f"{shortest} ({floor:g}){why}"
            )
        return self

    def _seconds(self, name: str) -> float:
        value: float = getattr(self, name.removeprefix(PREFIX).lower())
        return value

    @property
    def recrawl_max(self) -> float:
        return self.recrawl_max_seconds or max(30 * 86_400.0, self.recrawl_after_seconds)

    @field_validator("excluded_hosts", mode="before")
    @classmethod
    def _read_excluded_hosts(cls, value: Any) -> Any:
        if isinstance(value, str):
            return read_rules(value.splitlines())
        if isinstance(value, list | tuple):
            return read_rules(str(v) for v in value)
        return value

    @field_validator("excluded_hosts_file")
    @classmethod
    def _excluded_hosts_file_is_readable(cls, value: Path | None) -> Path | None:
        if value is not None:
            read_rules_file(value)  # refused at start, not at the first host it covers
        return value


class DiscoverySettings(CommonSettings):
    #: Default scope of a seed: host, domain, pattern or open.
    default_scope: Literal["host", "domain", "pattern", "open"] = "host"
    max_depth: int = Field(default=5, ge=0, le=100)
    #: Most pages discovered per host in one cycle (a trap defence).
    host_page_budget: int = Field(default=10_000, ge=1)
    #: Most host names of one site (registrable domain) that links bring pages of in one
    #: cycle (``trove_discovery.sites``): a server answering every name under its domain
    #: would otherwise get a gap and a page budget a name. 0: no limit. At most 1,000:
    #: the site's record lists the names, and must stay well within a KV value's limit.
    site_host_budget: int = Field(default=100, ge=0, le=1000)
    #: Registrable domains whose every subdomain is someone's own site (a blog platform),
    #: added to the built-in list (``trove_schema.budgets.PLATFORMS``): not counted.
    platform_domains: Annotated[tuple[str, ...], NoDecode] = ()
    # Neither can exceed what an event carries: a page's event holds at most
    # MAX_LINKS_PER_PAGE links, and no event holds a longer URL than MAX_URL_LENGTH.
    max_links_per_page: int = Field(default=500, ge=0, le=MAX_LINKS_PER_PAGE)
    max_url_length: int = Field(default=MAX_URL_LENGTH, ge=64, le=MAX_URL_LENGTH)
    max_path_repetitions: int = Field(default=3, ge=1)
    follow_nofollow: bool = False
    #: URLs whose seen-bucket answer discovery remembers (~200 bytes each); 0 turns it off.
    seen_memory: int = Field(default=100_000, ge=0)
    #: How long a replica uses a host's learned URL aliases before reading them again
    #: (a rule learned by one replica reaches the others within this time).
    url_rules_cache_seconds: float = Field(default=5.0, ge=MIN_INTERVAL_SECONDS, le=300.0)
    #: Confirmations (rel=canonical, equal content) before a URL alias is learned.
    alias_confirmations: int = Field(default=2, ge=1, le=100)
    #: A page's links that may be aliases not learned yet wait this long (doubled each
    #: round, for up to TROVE_ALIAS_HOLD_ROUNDS rounds) while a few of them are fetched to
    #: learn from; 0 lets every spelling through at once. The whole wait stays inside
    #: the events stream's 10-minute duplicate window.
    alias_hold_seconds: float = Field(default=10.0, ge=0.0, le=30.0)
    alias_hold_rounds: int = Field(default=3, ge=0, le=3)
    #: Shortest re-crawl interval. 0, the default: one hour, or the first interval if
    #: that is shorter.
    recrawl_min_seconds: Seconds = Field(default=0.0, ge=0.0)
    #: How long a URL stays seen (not discovered again) after its discovery or its last
    #: re-crawl request; it must be longer than the longest re-crawl interval (refused
    #: otherwise), so that links never start a second chain of re-crawls. 0, the
    #: default, means twice that interval: the margin lets a re-crawl come late (its
    #: host's gap or pause, the recorder's retries) with its key still there. One that
    #: comes after its key expired lets the next link discover the page again: a fetch
    #: more, and a count more against its host's page budget, never a request out of
    #: turn. Discovery warns at start of a TTL under 1.5 times the interval.
    seen_ttl_seconds: Seconds = Field(default=0.0, ge=0.0)
    #: How long a host's URL alias record outlives its last write: the bucket holds the
    #: hosts of the crawl's recent months, not every host it ever met. Unset: 180 days,
    #: or twice the longest re-crawl interval if that is longer; 0 keeps them for ever.
    url_rules_ttl_seconds: Seconds | None = Field(default=None, ge=0.0)
    #: Networks seeds may point into although private (tests, the sandbox).
    allowed_networks: Annotated[tuple[str, ...], NoDecode] = ()
    #: The network's own NAT64 prefixes, as the fetchers' (``FetcherSettings``): a URL
    #: written as an address in one is judged by the IPv4 address it carries.
    nat64_prefixes: Annotated[tuple[str, ...], NoDecode] = ()

    @field_validator("allowed_networks", mode="before")
    @classmethod
    def _split_networks(cls, value: Any) -> Any:
        return _split_cidrs(value)

    @field_validator("nat64_prefixes", mode="before")
    @classmethod
    def _split_nat64(cls, value: Any) -> Any:
        return _split_nat64_prefixes(value)

    @field_validator("platform_domains", mode="before")
    @classmethod
    def _split_platforms(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.split(",")
        return tuple(
            name.strip().strip(".").lower() for name in value or () if name.strip().strip(".")
        )

    @model_validator(mode="after")
    def _cycle_is_consistent(self) -> DiscoverySettings:
        first = self.recrawl_after_seconds
        if self.recrawl_min_seconds and self.recrawl_min_seconds > first:
            raise ValueError(
                f"TROVE_RECRAWL_MIN_SECONDS ({self.recrawl_min_seconds:g}) must not be longer "
                f"than TROVE_RECRAWL_AFTER_SECONDS ({first:g}), the first interval"
            )
        if self.seen_ttl_seconds and self.seen_ttl_seconds <= self.recrawl_max:
            raise ValueError(
                f"TROVE_SEEN_TTL_SECONDS ({self.seen_ttl_seconds:g}) must be longer than "
                f"the longest re-crawl interval ({self.recrawl_max:g}, "
                "TROVE_RECRAWL_MAX_SECONDS): a page would be discovered again while its "
                "re-crawl is pending"
            )
        if self.url_rules_ttl_seconds and self.url_rules_ttl_seconds <= self.recrawl_max:
            raise ValueError(
                f"TROVE_URL_RULES_TTL_SECONDS ({self.url_rules_ttl_seconds:g}) must be 0 or "
                f"longer than the longest re-crawl interval ({self.recrawl_max:g}, "
                "TROVE_RECRAWL_MAX_SECONDS): a host visited once a cycle would learn its "
                "URL aliases again at every visit"
            )
        return self

    @property
    def recrawl_min(self) -> float:
        return self.recrawl_min_seconds or min(3600.0, self.recrawl_after_seconds)

    @property
    def seen_ttl(self) -> float:
        return self.seen_ttl_seconds or 2 * self.recrawl_max

    @property
    def url_rules_ttl(self) -> float:
        if self.url_rules_ttl_seconds is not None:
            return self.url_rules_ttl_seconds
        return max(180 * 86_400.0, 2 * self.recrawl_max)


class FetcherSettings(CommonSettings):
    user_agent: str = ""
    bot_info_url: str = "https://github.com/trove-crawler/trove/blob/main/docs/bot.md"
    robots_token: str = "TroveBot"  # noqa: S105 - the robots.txt user-agent token
    concurrency: int = Field(default=64, ge=1, le=4096)
    #: How often each pod looks whether TROVE_WORK holds enough handled work to purge it
    #: (``deferral.purge_handled``).
    work_purge_interval_seconds: Interval = 60.0
    #: How many handled work messages TROVE_WORK keeps before a pod purges them (four
    #: times as many while every pod's hands are full).
    work_purge_after_messages: int = Field(default=10_000, ge=1)
    #: Work messages handed out to all fetcher pods before any is acked (consumer-wide).
    max_ack_pending: int = Field(default=2000, ge=1)
    #: How long a pod may hold a work message before JetStream gives it to another pod.
    ack_wait_seconds: Seconds = Field(default=90.0, ge=5.0)
    #: The time a stopping pod has from SIGTERM to SIGKILL (the fetcher's
    #: terminationGracePeriodSeconds, compose's stop_grace_period): what its requests
    #: taught about their hosts and the broker did not take is tried until 10 s before.
    stop_grace_seconds: Seconds = Field(default=180.0, gt=10.0)
    #: How far behind its cursor a poll of a timeline with other instances' posts
    #: (``public``, tags) reads again, for posts that arrived after a newer one; 0: none.
    poll_lookback_seconds: float = Field(default=600.0, ge=0.0, le=86_400.0)
    connect_timeout: Seconds = Field(default=5.0, gt=0)
    read_timeout: Seconds = Field(default=10.0, gt=0)
    request_timeout: Seconds = Field(default=30.0, gt=0)
    max_body_bytes: int = Field(default=2 * 1024 * 1024, ge=1024)
    max_redirects: int = Field(default=5, ge=0, le=20)
    #: How long a robots.txt is obeyed before it is asked for again: a day at most, as
    #: RFC 9309 (2.4) asks of a crawler's cache.
    robots_ttl_seconds: float = Field(default=86_400.0, ge=1.0, le=86_400.0)
    #: The most of a robots.txt read (RFC 9309 2.5: 500 KiB at least; the rules after the
    #: cut are not obeyed). The fetcher keeps it within what its bucket takes.
    robots_max_bytes: int = Field(default=512 * 1024, ge=1024)
    #: CIDRs the fetcher may connect to although private (tests, the local sandbox).
    allowed_networks: Annotated[tuple[str, ...], NoDecode] = ()
    #: The NAT64 prefixes the pods' network translates with, besides the well-known
    #: 64:ff9b::/96 (RFC 6052; comma-separated): an address in one reaches the IPv4
    #: address it carries, which may be private, and is judged as that address.
    nat64_prefixes: Annotated[tuple[str, ...], NoDecode] = ()
    #: Extra host -> IP mappings (the sandbox's names); "host=ip,host=ip".
    resolve: Annotated[tuple[str, ...], NoDecode] = ()
    #: Nameservers ("ip", "ip:port", "[ipv6]:port", comma-separated); empty: resolv.conf.
    dns_nameservers: Annotated[tuple[str, ...], NoDecode] = ()
    dns_timeout_seconds: Seconds = Field(default=5.0, gt=0)
    dns_concurrency: int = Field(default=64, ge=1, le=4096)
    #: Names the fetcher's DNS cache keeps (~0.5 KB each; see trove_fetcher.dns).
    dns_cache_entries: int = Field(default=10_000, ge=1)
    #: Answers are cached for their TTL clamped to [min, max]; negative ones to
    #: [min, max_negative].
    dns_min_ttl_seconds: Seconds = Field(default=30.0, ge=0.0)
    dns_max_ttl_seconds: Seconds = Field(default=3600.0, ge=0.0)
    dns_max_negative_ttl_seconds: Seconds = Field(default=300.0, ge=0.0)
    #: Nameservers found to answer nothing are asked again after this long; until then
    #: the work that needs a name not cached waits (``trove_fetcher.dns``).
    dns_recheck_seconds: Interval = 5.0
    #: The pod's egress is taken to be away when this many addresses failed to connect in
    #: a row, none connecting in between nor for ``egress_quiet_seconds``; its work then
    #: waits, one job every ``egress_recheck_seconds`` going ahead to find out, for at
    #: most ``egress_patience_seconds`` (``trove_fetcher.egress``).
    egress_suspect_after: int = Field(default=8, ge=2)
    egress_quiet_seconds: Seconds = Field(default=0.0, ge=0.0)
    egress_recheck_seconds: Interval = 10.0
    egress_patience_seconds: Seconds = Field(default=3600.0, ge=0.0)
    #: How long a host's record in ``trove_domains`` (its politeness state and learned
    #: policy) is kept after the last request to it; 0 keeps every host's for ever.
    host_record_ttl_seconds: Seconds = Field(default=180 * 86_400.0, ge=0.0)

    @field_validator("allowed_networks", mode="before")
    @classmethod
    def _split_networks(cls, value: Any) -> Any:
        return _split_cidrs(value)

    @field_validator("nat64_prefixes", mode="before")
    @classmethod
    def _split_nat64(cls, value: Any) -> Any:
        return _split_nat64_prefixes(value)

    @model_validator(mode="after")
    def _records_outlive_what_they_hold(self) -> FetcherSettings:
        held = {
            "TROVE_MAX_DOMAIN_DELAY_SECONDS": self.max_domain_delay_seconds,
            "TROVE_HOST_PAUSE_MAX_SECONDS": self.host_pause_max_seconds,
            "TROVE_BAN_PAUSE_SECONDS": self.ban_pause_seconds,
            "TROVE_MAX_BACKOFF_SECONDS": self.max_backoff_seconds,
            "TROVE_HOST_MOVE_RECHECK_SECONDS": self.host_move_recheck_seconds,
            # The record holds the Crawl-delay, which is set again only when robots.txt
            # is read again: a record gone first would put the host back at the minimum.
            "TROVE_ROBOTS_TTL_SECONDS": self.robots_ttl_seconds,
        }
        name, longest = max(held.items(), key=lambda item: item[1])
        if self.host_record_ttl_seconds and self.host_record_ttl_seconds <= longest:
            raise ValueError(
                f"TROVE_HOST_RECORD_TTL_SECONDS ({self.host_record_ttl_seconds:g}) must be 0 "
                f"(kept for ever) or longer than {name} ({longest:g}): a host's record would "
                "expire while it still holds a gap (its Crawl-delay), a pause or a move"
            )
        return self

    @field_validator("resolve", "dns_nameservers", mode="before")
    @classmethod
    def _split_resolve(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    # Read here, at the start, as the fetcher reads them: else a typo passed the
    # settings and crashed the fetcher after it connected, a crash loop.
    @field_validator("resolve")
    @classmethod
    def _resolve_entries_are_host_ip(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for entry in value:
            resolve_entry(entry)
        return value

    @field_validator("dns_nameservers")
    @classmethod
    def _nameservers_are_addresses(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for entry in value:
            parse_nameserver(entry)
        return value


class RecorderSettings(CommonSettings):
    retry_delay_seconds: Seconds = Field(default=3600.0, ge=0.0)
    #: The longest a site's Retry-After may put off a retry.
    retry_max_delay_seconds: Seconds = Field(default=7 * 86_400.0, ge=0.0)
    max_attempts: int = Field(default=3, ge=1, le=20)
    #: How long a page whose retries ran out is asked again (a new chain every
    #: ``retry_max_delay_seconds``, or its re-crawl interval if longer), counted from its
    #: first attempt after its last success; 0: its chain ends with its retries.
    recheck_failing_for_seconds: Seconds = Field(default=30 * 86_400.0, ge=0.0)
    batch_size: int = Field(default=500, ge=1, le=10_000)
    #: The most bytes of events a batch holds (a larger event goes alone): what bounds
    #: the recorder's memory while it catches up on pages with many links.
    batch_max_bytes: int = Field(default=8 * 1024 * 1024, ge=64 * 1024, le=1024**3)
    #: Longest the recorder waits to fill a batch once it has some events (latency for
    #: fewer, larger transactions); 0 handles whatever has arrived at once.
    batch_linger_seconds: float = Field(default=0.3, ge=0.0, le=5.0)
    #: Longest one of the recorder's transactions (a batch of events, an event of a
    #: batch that failed, a batch of retention's rows) runs before its connection is
    #: closed under it and its work handed back, for this recorder or another to do
    #: again: a statement on a primary gone silent otherwise waits for ever. A batch of
    #: 500 takes a fraction of a second; the default leaves room for a slow server and
    #: for the row locks of a recorder lost mid-batch, which its server frees after a
    #: minute (``idle_in_transaction_session_timeout``), and is past the minute in which
    #: TCP fails a connection to a peer that is gone.
    batch_timeout_seconds: Seconds = Field(default=120.0, ge=1.0)
    #: URLs whose page id the recorder remembers (~200 bytes each); 0 turns it off.
    page_id_cache: int = Field(default=200_000, ge=0)
    #: Audit rows (``fetcher_attempts`` and their tags) older than this are deleted; 0
    #: keeps every attempt.
    audit_retention_seconds: Seconds = Field(default=90 * 86_400.0, ge=0.0)
    #: ``page_crawls`` rows (the crawl history) older than this are deleted, except each
    #: page's last success the projection applied and the attempts after it, which its
    #: retries are counted from; 0 keeps every attempt.
    crawl_history_retention_seconds: Seconds = Field(default=0.0, ge=0.0)
    #: ``page_shares`` rows (a shared link of a followed timeline's post) first seen
    #: longer ago than this are deleted; 0 keeps every share.
    shares_retention_seconds: Seconds = Field(default=0.0, ge=0.0)
    #: Rows deleted per statement by every retention (the crawl history's: rows read, kept
    #: ones included): short transactions, no long locks.
    audit_prune_batch: int = Field(default=5_000, ge=1, le=100_000)
    #: How often the recorder looks for expired rows (the audit, the crawl history, the
    #: outbox's published rows, the ids of applied events).
    audit_prune_interval_seconds: Interval = 600.0
    #: Longest an idle recorder goes without looking at the outbox. Its own retries wake
    #: it at once; the look is for rows no pod was woken for (one that died between its
    #: commit and its publish, a replay), and it is made 1 s after activity, then half
    #: as often each time it finds nothing, down to this.
    outbox_poll_max_seconds: float = Field(default=30.0, ge=1.0, le=3600.0)

    @model_validator(mode="after")
    def _retries_are_kept(self) -> RecorderSettings:
        if self.retry_max_delay_seconds < self.retry_delay_seconds:
            raise ValueError(
                f"TROVE_RETRY_MAX_DELAY_SECONDS ({self.retry_max_delay_seconds:g}) caps every "
                f"retry's delay: it must not be shorter than TROVE_RETRY_DELAY_SECONDS "
                f"({self.retry_delay_seconds:g})"
            )
        # A retry waits as long as its site's Retry-After asks, up to the longest delay.
        longest = self.retry_max_delay_seconds
        _check_schedules_kept(self.events_max_age_seconds, longest, "retries")
        return self


ALL_SETTINGS: tuple[type[CommonSettings], ...] = (
    CommonSettings,
    DiscoverySettings,
    FetcherSettings,
    RecorderSettings,
)

#: Keys read by the CLI and the test fixtures rather than by a service.
OTHER_KEYS = frozenset({"TROVE_POSTGRES_BIN", "TROVE_TEST_STACK"})


def known_keys() -> frozenset[str]:
    keys = {PREFIX + name.upper() for cls in ALL_SETTINGS for name in cls.model_fields}
    return frozenset(keys | OTHER_KEYS)


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Refuse TROVE_* variables that no settings object knows (typos are not ignored)."""
    env = os.environ if environ is None else environ
    known = known_keys()
    unknown = sorted(k for k in env if k.upper().startswith(PREFIX) and k.upper() not in known)
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key.upper(), known, n=1)
            hints.append(f"{key}" + (f" (did you mean {close[0]}?)" if close else ""))
        raise UnknownSetting("unknown Trove setting(s): " + ", ".join(hints))


#: Settings whose values are not printed: their URLs carry passwords.
SECRET_SETTINGS = frozenset({"TROVE_NATS_URL", "TROVE_DATABASE_URL"})

_Settings = TypeVar("_Settings", bound=BaseSettings)


def settings_problem(exc: ValidationError) -> str:
    """A settings error as the variables the operator set: ``TROVE_REPLICAS='abc': ...``.
    One about several settings together (a retention against the re-crawls) is its
    message alone: its input is every setting, passwords included."""
    parts = []
    for error in exc.errors():
        if not error["loc"]:
            parts.append(error["msg"])
            continue
        name = PREFIX + "_".join(str(part) for part in error["loc"]).upper()
        value = error.get("input")
        shown_value = "" if name in SECRET_SETTINGS or isinstance(value, dict) else f"={value!r}"
        parts.append(f"{name}{shown_value}: {error['msg']}")
    return "; ".join(parts)


def load_settings(cls: type[_Settings], service: str) -> _Settings:
    """A service's settings from its environment, or exit 2 with what is wrong in one
    line on stderr: a value refused, or a TROVE_* name nobody knows. Said as a
    traceback, the reason was its last line, and a crash-looping pod's log showed little
    else."""
    try:
        check_environment()
        return cls()
    except ValidationError as exc:
        problem = settings_problem(exc)
    except UnknownSetting as exc:
        problem = str(exc)
    print(f"{service}: error: settings: {problem}", file=sys.stderr)
    raise SystemExit(2)


def _check_schedules_kept(events_max_age: float, delay: float, what: str) -> None:
    """Scheduled requests wait in TROVE_EVENTS: a shorter retention would drop them unseen."""
    if 0 < events_max_age <= delay:
        raise ValueError(
            f"TROVE_EVENTS_MAX_AGE_SECONDS ({events_max_age:g}) must be 0 (keep for ever) or "
            f"longer than the delay of scheduled {what} ({delay:g} s): they wait in "
            "TROVE_EVENTS and would be aged out before they fire"
        )


def _split_cidrs(value: Any) -> Any:
    if isinstance(value, str):
        value = tuple(part.strip() for part in value.split(",") if part.strip())
    for cidr in value or ():
        ipaddress.ip_network(cidr, strict=False)
    return value


def _split_nat64_prefixes(value: Any) -> Any:
    if isinstance(value, str):
        value = tuple(part.strip() for part in value.split(",") if part.strip())
    for cidr in value or ():
        nat64_prefix(cidr)
    return value
