from __future__ import annotations

from typing import Annotated, Any

import pydantic
import pytest

from trove_schema.bus import Bus
from trove_schema.settings import (
    ALL_SETTINGS,
    MAX_DURATION_SECONDS,
    CommonSettings,
    DiscoverySettings,
    FetcherSettings,
    RecorderSettings,
    UnknownSetting,
    check_environment,
)
from trove_schema.topology import (
    EVENTS_STREAM,
    SEEN_BUCKET,
    TopologyOptions,
    declare,
    ensure_topology,
)


def test_unknown_trove_key_is_refused_with_a_hint() -> None:
    with pytest.raises(UnknownSetting, match="did you mean TROVE_MIN_DOMAIN_DELAY_SECONDS"):
        check_environment({"TROVE_MIN_DOMAIN_DELAY_SECOND": "3"})


def test_known_keys_of_every_service_are_accepted() -> None:
    check_environment(
        {
            "TROVE_NATS_URL": "nats://x",
            "TROVE_MIN_DOMAIN_DELAY_SECONDS": "3",
            "TROVE_MAX_ATTEMPTS": "3",
            "TROVE_HOST_PAGE_BUDGET": "10",
            "PATH": "/bin",
        }
    )


def test_settings_are_read_from_trove_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TROVE_MIN_DOMAIN_DELAY_SECONDS", "2.5")
    monkeypatch.setenv("TROVE_ALLOWED_NETWORKS", "127.0.0.0/24, 10.1.0.0/16")
    settings = FetcherSettings()
    assert settings.min_domain_delay_seconds == 2.5
    assert settings.allowed_networks == ("127.0.0.0/24", "10.1.0.0/16")


def test_a_bad_network_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TROVE_ALLOWED_NETWORKS", "not-a-cidr")
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 network"):
        FetcherSettings()


@pytest.mark.parametrize(
    ("name", "good", "bad", "reason"),
    [
        ("TROVE_RESOLVE", "a.test=127.0.0.1, *.b.test=[::1]", "a.test", "is not host=ip"),
        ("TROVE_RESOLVE", "a.test=127.0.0.1", "a.test=localhost", "is no IP address"),
        ("TROVE_DNS_NAMESERVERS", "10.0.0.53, [fd00::53]:5353", "notanip", "is not ip, ip:port"),
        ("TROVE_DNS_NAMESERVERS", "10.0.0.53:53", "10.0.0.53:x", "is not ip, ip:port"),
        ("TROVE_DNS_NAMESERVERS", "10.0.0.53:53", "10.0.0.53:70000", "port out of range"),
    ],
)
def test_resolve_entries_and_nameservers_are_read_at_the_start(
    monkeypatch: pytest.MonkeyPatch, name: str, good: str, bad: str, reason: str
) -> None:
    # Read only by the fetcher's transport and resolver, after its connect to NATS, a
    # typo crashed the pod and its restarts: a crash loop, not a line at the start.
    monkeypatch.setenv(name, good)
    FetcherSettings()
    monkeypatch.setenv(name, bad)
    with pytest.raises(ValueError, match=reason):
        FetcherSettings()


@pytest.mark.parametrize("settings_class", [FetcherSettings, DiscoverySettings])
def test_nat64_prefixes_are_read_and_an_ipv4_network_is_refused_as_one(
    monkeypatch: pytest.MonkeyPatch, settings_class: type[FetcherSettings | DiscoverySettings]
) -> None:
    monkeypatch.setenv("TROVE_NAT64_PREFIXES", "2a00:64::/96, fd00:64:1::/48")
    assert settings_class().nat64_prefixes == ("2a00:64::/96", "fd00:64:1::/48")
    monkeypatch.setenv("TROVE_NAT64_PREFIXES", "10.0.0.0/8")
    with pytest.raises(ValueError, match="is not a NAT64 prefix"):
        settings_class()


def test_a_host_record_ttl_shorter_than_what_a_record_holds_is_refused_with_its_name() -> None:
    with pytest.raises(ValueError, match=r"than TROVE_HOST_MOVE_RECHECK_SECONDS \(604800\)"):
        FetcherSettings(host_record_ttl_seconds=3 * 86_400)
    with pytest.raises(ValueError, match=r"than TROVE_HOST_PAUSE_MAX_SECONDS \(86400\)"):
        FetcherSettings(host_record_ttl_seconds=3600, host_move_recheck_seconds=60)

    def lowered(robots_ttl_seconds: float = 86_400) -> FetcherSettings:
        return FetcherSettings(
            host_record_ttl_seconds=3600,
            host_pause_max_seconds=60,
            ban_pause_seconds=60,
            max_backoff_seconds=60,
            host_move_recheck_seconds=60,
            robots_ttl_seconds=robots_ttl_seconds,
        )

    with pytest.raises(ValueError, match=r"than TROVE_ROBOTS_TTL_SECONDS \(86400\)"):
        lowered()
    assert lowered(robots_ttl_seconds=600).host_record_ttl_seconds == 3600
    assert FetcherSettings(host_record_ttl_seconds=0).host_record_ttl_seconds == 0
    assert FetcherSettings().host_record_ttl_seconds == 180 * 86_400


PAUSES = (
    "TROVE_MAX_BACKOFF_SECONDS",
    "TROVE_HOST_PAUSE_SECONDS",
    "TROVE_HOST_PAUSE_MAX_SECONDS",
    "TROVE_RATE_PAUSE_SECONDS",
    "TROVE_BAN_PAUSE_SECONDS",
)


@pytest.mark.parametrize("variable", PAUSES)
def test_no_pause_after_a_site_s_defences_can_be_set_to_nothing(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    # 0 would send the next request one gap after a 429, a ban or a challenge page.
    for name in PAUSES:
        monkeypatch.setenv(name, "0.5")
    monkeypatch.setenv("TROVE_MIN_DOMAIN_DELAY_SECONDS", "0.5")
    assert getattr(FetcherSettings(), variable.removeprefix("TROVE_").lower()) == 0.5
    monkeypatch.setenv(variable, "0")
    with pytest.raises(ValueError, match="greater than 0"):
        FetcherSettings()


@pytest.mark.parametrize(
    ("longest", "first"),
    [
        ("TROVE_HOST_PAUSE_MAX_SECONDS", "TROVE_HOST_PAUSE_SECONDS"),
        ("TROVE_MAX_BACKOFF_SECONDS", "TROVE_RATE_PAUSE_SECONDS"),
    ],
)
def test_a_longest_pause_shorter_than_the_first_is_refused(
    monkeypatch: pytest.MonkeyPatch, longest: str, first: str
) -> None:
    # The cap would cut every pause, the first included, to itself unsaid.
    monkeypatch.setenv(first, "60")
    monkeypatch.setenv(longest, "60")
    assert FetcherSettings()
    monkeypatch.setenv(longest, "59")
    with pytest.raises(ValueError, match=rf"{longest} \(59\) must not be shorter than {first}"):
        FetcherSettings()


@pytest.mark.parametrize(
    "longest",
    ["TROVE_HOST_PAUSE_MAX_SECONDS", "TROVE_MAX_BACKOFF_SECONDS", "TROVE_BAN_PAUSE_SECONDS"],
)
def test_a_pause_within_the_gap_is_refused(monkeypatch: pytest.MonkeyPatch, longest: str) -> None:
    # A 429 that asked for an hour was asked again one gap later: the pause was 1 ms.
    for name in PAUSES:
        monkeypatch.setenv(name, "0.5")
    monkeypatch.setenv("TROVE_MIN_DOMAIN_DELAY_SECONDS", "0.5")
    assert FetcherSettings()
    monkeypatch.setenv("TROVE_MIN_DOMAIN_DELAY_SECONDS", "0.6")
    monkeypatch.setenv("TROVE_MAX_DOMAIN_DELAY_SECONDS", "0.6")
    for name in {
        "TROVE_HOST_PAUSE_MAX_SECONDS",
        "TROVE_MAX_BACKOFF_SECONDS",
        "TROVE_BAN_PAUSE_SECONDS",
    } - {longest}:
        monkeypatch.setenv(name, "0.6")
    with pytest.raises(ValueError, match=rf"{longest} \(0.5\) .* a pause within the gap"):
        FetcherSettings()


def test_a_longest_gap_shorter_than_the_shortest_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every robots.txt Crawl-delay would have been cut to the shortest gap.
    monkeypatch.setenv("TROVE_MAX_DOMAIN_DELAY_SECONDS", "10")
    assert FetcherSettings().max_domain_delay_seconds == 10
    monkeypatch.setenv("TROVE_MAX_DOMAIN_DELAY_SECONDS", "5")
    with pytest.raises(
        ValueError, match=r"TROVE_MAX_DOMAIN_DELAY_SECONDS \(5\) must not be shorter than"
    ):
        FetcherSettings()


def test_a_bound_left_at_its_default_follows_a_longer_gap_or_first_pause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An operator who asks for two hours between requests asks nothing else: the longest
    # Crawl-delay taken and the backoff's ceiling follow, the longer ones stay.
    monkeypatch.setenv("TROVE_MIN_DOMAIN_DELAY_SECONDS", "7200")
    hourly = FetcherSettings()
    assert (hourly.max_domain_delay_seconds, hourly.max_backoff_seconds) == (7200, 7200)
    assert (hourly.host_pause_max_seconds, hourly.ban_pause_seconds) == (86_400, 86_400)
    monkeypatch.setenv("TROVE_HOST_PAUSE_SECONDS", "100000")
    assert FetcherSettings().host_pause_max_seconds == 100_000
    # Set, a bound shorter than what it bounds is the operator's mistake, said.
    monkeypatch.setenv("TROVE_MAX_BACKOFF_SECONDS", "3600")
    with pytest.raises(
        ValueError, match=r"TROVE_MAX_BACKOFF_SECONDS \(3600\) must not be shorter than"
    ):
        FetcherSettings()


INTERVALS = {
    "TROVE_RESTART_DELAY_SECONDS": CommonSettings,
    "TROVE_POLL_INTERVAL_SECONDS": DiscoverySettings,
    "TROVE_EXCLUSIONS_REFRESH_SECONDS": FetcherSettings,
    "TROVE_URL_RULES_CACHE_SECONDS": DiscoverySettings,
    "TROVE_WORK_PURGE_INTERVAL_SECONDS": FetcherSettings,
    "TROVE_DNS_RECHECK_SECONDS": FetcherSettings,
    "TROVE_EGRESS_RECHECK_SECONDS": FetcherSettings,
    "TROVE_AUDIT_PRUNE_INTERVAL_SECONDS": RecorderSettings,
}


@pytest.mark.parametrize("variable", sorted(INTERVALS))
def test_a_loop_s_interval_under_a_tenth_of_a_second_is_refused(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    # A loop every 0.1 ms spent a fifth to a third of a core on its round trips.
    settings_class = INTERVALS[variable]
    monkeypatch.setenv(variable, "0.1")
    assert getattr(settings_class(), variable.removeprefix("TROVE_").lower()) == 0.1
    monkeypatch.setenv(variable, "0.0001")
    with pytest.raises(ValueError, match=r"greater than or equal to 0\.1"):
        settings_class()


@pytest.mark.parametrize(
    ("variable", "settings_class", "longest_kept"),
    [
        # The record's age must outlast the schedules in it (a week's re-crawls).
        ("TROVE_EVENTS_MAX_AGE_SECONDS", RecorderSettings, "1e9"),
        ("TROVE_WORK_MAX_AGE_SECONDS", FetcherSettings, "1"),
        ("TROVE_DEAD_MAX_AGE_SECONDS", RecorderSettings, "1"),
    ],
)
def test_a_stream_age_is_for_ever_or_at_least_a_second(
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    settings_class: type[CommonSettings],
    longest_kept: str,
) -> None:
    # Under 100 ms JetStream refuses the stream, and the service tried again for ever.
    field = variable.removeprefix("TROVE_").lower()
    for good in ("0", longest_kept):
        monkeypatch.setenv(variable, good)
        assert getattr(settings_class(), field) == float(good)
    for bad in ("0.05", "0.5"):
        monkeypatch.setenv(variable, bad)
        with pytest.raises(ValueError, match="at least 1 second"):
            settings_class()


def test_a_poll_backoff_shorter_than_the_poll_interval_is_refused() -> None:
    # A failing timeline would be polled every 6 h while a healthy one waits a day.
    with pytest.raises(ValueError, match=r"shorter than TROVE_POLL_INTERVAL_SECONDS \(86400\)"):
        DiscoverySettings(poll_interval_seconds=86_400)
    assert DiscoverySettings(poll_interval_seconds=86_400, poll_max_backoff_seconds=86_400)


def test_a_platform_list_is_read_as_registrable_domains() -> None:
    settings = DiscoverySettings(platform_domains=" Blogs.Example., ,other.example ")
    assert settings.platform_domains == ("blogs.example", "other.example")


def test_the_event_record_is_compressed_unless_the_recorder_is_told_not_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert TopologyOptions.from_settings(RecorderSettings()).events_compression is True
    monkeypatch.setenv("TROVE_EVENTS_COMPRESSION", "none")
    assert TopologyOptions.from_settings(RecorderSettings()).events_compression is False
    monkeypatch.setenv("TROVE_EVENTS_COMPRESSION", "zstd")
    with pytest.raises(ValueError, match="'s2' or 'none'"):
        RecorderSettings()


def test_a_robots_txt_is_obeyed_a_day_at_most(monkeypatch: pytest.MonkeyPatch) -> None:
    # RFC 9309 (2.4): a crawler should not use a cached robots.txt for more than a day.
    assert FetcherSettings().robots_ttl_seconds == 86_400
    monkeypatch.setenv("TROVE_ROBOTS_TTL_SECONDS", "172800")
    with pytest.raises(ValueError, match="less than or equal to 86400"):
        FetcherSettings()


@pytest.mark.parametrize(
    ("name", "value"), [("TROVE_MAX_URL_LENGTH", "4096"), ("TROVE_MAX_LINKS_PER_PAGE", "2000")]
)
def test_discovery_takes_no_more_than_an_event_carries(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match="less than or equal to"):
        DiscoverySettings()


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e400"])
@pytest.mark.parametrize(
    "variable", ["TROVE_MIN_DOMAIN_DELAY_SECONDS", "TROVE_GAP_RESPONSE_FACTOR"]
)
@pytest.mark.parametrize("settings", ALL_SETTINGS, ids=lambda cls: cls.__name__)
def test_a_setting_that_is_no_finite_number_is_refused(
    monkeypatch: pytest.MonkeyPatch, settings: type[CommonSettings], variable: str, value: str
) -> None:
    # 1e400 is read as inf, which passes every lower bound: a delay between two
    # requests to a host of inf, a gap inf times a host's response time.
    monkeypatch.setenv(variable, value)
    with pytest.raises(pydantic.ValidationError, match="finite number"):
        settings()


def durations() -> dict[str, type[CommonSettings]]:
    """Every duration setting, with the first settings object that has it."""
    found: dict[str, type[CommonSettings]] = {}
    for cls in ALL_SETTINGS:
        for name in cls.model_fields:
            if name.endswith(("_seconds", "_timeout")):
                found.setdefault(name, cls)
    return found


@pytest.mark.parametrize(("name", "settings"), durations().items(), ids=durations())
def test_no_duration_setting_is_longer_than_a_century(
    name: str, settings: type[CommonSettings]
) -> None:
    # TROVE_RECRAWL_MAX_SECONDS=1e10 would pass every other check, and the seen bucket's
    # TTL (twice it, in int64 nanoseconds) could not be declared: discovery would stop
    # at every start. Each duration is read as a century at most, or refused by a
    # tighter bound of its own (read alone: the checks across settings aside).
    field = settings.model_fields[name]
    alone: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(
        Annotated[field.annotation, *field.metadata]  # type: ignore[arg-type]
    )
    assert read_alone(alone, 1e10) in (MAX_DURATION_SECONDS, "less_than_equal")


def read_alone(adapter: pydantic.TypeAdapter[Any], value: float) -> object:
    """``value`` as ``adapter`` reads it, or the kind of its refusal."""
    try:
        return adapter.validate_python(value)
    except pydantic.ValidationError as refused:
        return refused.errors()[0]["type"]


def test_a_duration_longer_than_a_century_is_read_as_one() -> None:
    # A row of nines for "for ever" (the audit's retention, before 0 said it) started
    # before the bound: it is read as a century, not refused.
    recorder = RecorderSettings(audit_retention_seconds=9_999_999_999)
    assert recorder.audit_retention_seconds == MAX_DURATION_SECONDS
    discovery = DiscoverySettings(recrawl_max_seconds=1e10)
    assert discovery.recrawl_max_seconds == MAX_DURATION_SECONDS


@pytest.mark.usefixtures("clean")
async def test_the_longest_durations_allowed_declare_every_stream_and_bucket(bus: Bus) -> None:
    century = MAX_DURATION_SECONDS
    discovery = DiscoverySettings(
        recrawl_after_seconds=century, recrawl_max_seconds=century, seeds_max_age_seconds=century
    )
    fetcher = FetcherSettings(work_max_age_seconds=century, host_record_ttl_seconds=century)
    recorder = RecorderSettings(events_max_age_seconds=century, dead_max_age_seconds=century)
    assert discovery.seen_ttl == discovery.url_rules_ttl == 2 * century
    options = {
        "discovery": TopologyOptions.from_settings(
            discovery, seen_ttl=discovery.seen_ttl, url_rules_ttl=discovery.url_rules_ttl
        ),
        "fetcher": TopologyOptions.from_settings(
            fetcher, domains_ttl=fetcher.host_record_ttl_seconds
        ),
        "recorder": TopologyOptions.from_settings(recorder),
    }
    for owner, option in options.items():
        await ensure_topology(bus.js, declare(option), owner=owner)
    seen = await bus.js.stream_info(f"KV_{SEEN_BUCKET}")
    assert seen.config.max_age == 2 * century
    events = await bus.js.stream_info(EVENTS_STREAM)
    assert events.config.max_age == century


def test_a_robots_txt_is_read_to_500_kib_at_least() -> None:
    assert FetcherSettings().robots_max_bytes >= 500 * 1024
