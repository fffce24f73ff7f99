"""robots.txt: fetched from loopback sites, read as RFC 9309 says, cached as bytes."""

from __future__ import annotations

import gzip
import logging
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import nats.errors
import protego
import pytest

from tests.fetcher._servers import (
    Exchange,
    LocalServer,
    RecordingBackend,
    serving,
    stall,
)
from tests.ports import free_port
from trove_fetcher import robots as robots_module
from trove_fetcher.errors import HopGateFailed, RedirectPaused
from trove_fetcher.robots import (
    DEFAULT_TTL,
    RETRY_TTL,
    SITEMAP_LINES_READ,
    RobotsPolicy,
    RobotsRule,
    fetch_robots,
)
from trove_fetcher.transport import build_client
from trove_schema.events import MAX_SITEMAPS
from trove_schema.exclusions import Exclusions, read_rules
from trove_schema.settings import FetcherSettings
from trove_schema.urls import canonicalize

ROBOTS = b"""\
User-agent: *
Disallow: /

User-agent: TroveBot
Disallow: /private/
Allow: /private/ok
Crawl-delay: 12

Sitemap: http://a.trove.test/sitemap.xml
"""

OTHER_SITE_ROBOTS = b"User-agent: *\nDisallow: /from-b/\n"

# Line by line past 512 KiB; the rule after the cap must not count.
_FILLER = b"".join(f"Disallow: /filler/{n:06d}\n".encode() for n in range(25_000))
OVERSIZE_ROBOTS = b"User-agent: *\n" + _FILLER + b"Disallow: /late/\n"
# The same file with a bare CR ending each line, as RFC 9309 allows.
OVERSIZE_CR_ROBOTS = OVERSIZE_ROBOTS.replace(b"\n", b"\r")
CAP = 512 * 1024


def _text(body: bytes, status: int = 200, headers: dict[str, str] | None = None) -> Any:
    def route(exchange: Exchange) -> None:
        exchange.send(status, body, headers, content_type="text/plain")

    return route


def _redirect(location: str) -> Any:
    def route(exchange: Exchange) -> None:
        exchange.redirect(location.format(port=exchange.server.server_address[1]), 301)

    return route


ROUTES: dict[str, Any] = {
    "a.trove.test/robots.txt": _text(ROBOTS),
    "b.trove.test/robots.txt": _text(OTHER_SITE_ROBOTS),
    "notfound.trove.test/robots.txt": _text(b"gone", 404),
    "forbidden.trove.test/robots.txt": _text(b"no", 403),
    "broken.trove.test/robots.txt": _text(b"oops", 500),
    "busy.trove.test/robots.txt": _text(b"slow down", 429, {"Retry-After": "60"}),
    "challenged.trove.test/robots.txt": _text(
        b"<title>Just a moment...</title>",
        403,
        {"Server": "cloudflare", "cf-mitigated": "challenge"},
    ),
    "moved.trove.test/robots.txt": _redirect("http://b.trove.test:{port}/robots.txt"),
    # 127.0.0.1, the server's own address, as one number.
    "numbered.trove.test/robots.txt": _redirect("http://2130706433:{port}/robots.txt"),
    "metadata.trove.test/robots.txt": _redirect("http://169.254.169.254/robots.txt"),
    "loop.trove.test/robots.txt": _redirect("http://loop.trove.test:{port}/robots.txt"),
    "hostless.trove.test/robots.txt": _redirect("https://:443/robots.txt"),
    "dot.trove.test/robots.txt": _redirect("http://./robots.txt"),
    "portless.trove.test/robots.txt": _redirect("http://b.trove.test:80:80/robots.txt"),
    "mailto.trove.test/robots.txt": _redirect("mailto:webmaster@example.org"),
    "emoji.trove.test/robots.txt": _redirect("http://xn--ls8h.la/robots.txt"),
    # A host that ends in a number longer than int() reads (4,300 digits).
    "digits.trove.test/robots.txt": _redirect("http://" + "1" * 4400 + "/robots.txt"),
    "big.trove.test/robots.txt": _text(OVERSIZE_ROBOTS),
    "bigcr.trove.test/robots.txt": _text(OVERSIZE_CR_ROBOTS),
    "zipped.trove.test/robots.txt": lambda ex: ex.send(
        200, gzip.compress(ROBOTS), {"Content-Encoding": "gzip"}, content_type="text/plain"
    ),
    "bom.trove.test/robots.txt": _text(b"\xef\xbb\xbfUser-agent: *\nDisallow: /x/\n"),
    "slow.trove.test/robots.txt": stall,
}

NAMES = sorted({key.split(".", 1)[0] for key in ROUTES})


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    with serving(ROUTES) as running:
        yield running


@pytest.fixture
def recorder() -> RecordingBackend:
    return RecordingBackend()


@pytest.fixture
async def client(recorder: RecordingBackend) -> AsyncIterator[httpx.AsyncClient]:
    settings = FetcherSettings(
        allowed_networks=("127.0.0.1/32",),
        resolve=tuple(f"{name}.trove.test=127.0.0.1" for name in NAMES),
    )
    async with build_client(settings, network_backend=recorder) as built:
        yield built


def origin(server: LocalServer, name: str) -> str:
    return f"http://{name}.trove.test:{server.port}"


async def robots_of(client: httpx.AsyncClient, server: LocalServer, name: str) -> RobotsPolicy:
    return await fetch_robots(client, origin(server, name), max_bytes=CAP)


async def test_paths_are_allowed_or_disallowed_by_the_trovebot_group(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    policy = await robots_of(client, server, "a")
    site = origin(server, "a")
    assert policy.rule is RobotsRule.PARSED
    assert policy.status_code == 200
    assert policy.allows(f"{site}/")
    assert policy.allows(f"{site}/blog/post")
    assert not policy.allows(f"{site}/private/secret")
    assert policy.allows(f"{site}/private/ok")
    assert policy.crawl_delay() == 12.0
    assert policy.sitemaps() == ("http://a.trove.test/sitemap.xml",)


async def test_trovebot_group_wins_over_the_star_group(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    policy = await robots_of(client, server, "a")
    page = f"{origin(server, 'a')}/blog/post"
    assert policy.allows(page, "TroveBot")
    assert policy.allows(page, "trovebot")
    assert not policy.allows(page, "SomeOtherBot")
    assert policy.crawl_delay("SomeOtherBot") is None


@pytest.mark.parametrize(
    "agent", ["TroveBot/1.0", "trovebot (+https://example.org/bot)", "TroveBot/2; Linux"]
)
def test_a_group_named_with_a_version_or_a_comment_is_trovebots(agent: str) -> None:
    body = f"User-agent: *\nAllow: /\n\nUser-agent: {agent}\nDisallow: /\nCrawl-delay: 30\n"
    policy = RobotsPolicy(
        origin="https://a.example",
        rule=RobotsRule.PARSED,
        fetched_at=time.time(),
        body=body.encode(),
    )
    assert not policy.allows("https://a.example/page")
    assert policy.crawl_delay() == 30.0
    assert policy.allows("https://a.example/page", "OtherBot")


LINE_ENDS = pytest.mark.parametrize("end", ["\n", "\r\n", "\r"], ids=["lf", "crlf", "cr"])


@LINE_ENDS
def test_a_versioned_trovebot_group_after_another_is_trovebots_whatever_the_line_ends(
    end: str,
) -> None:
    """protego reads a bare CR as a line end (``str.splitlines``); the token is cut on
    the same lines, or the group after the first line names no one."""
    lines = ["User-agent: *", "Allow: /", "", "User-agent: TroveBot/2.1", "Disallow: /"]
    policy = parsed((end.join(lines) + end).encode(), origin="https://a.example")
    assert not policy.allows("https://a.example/page")
    assert policy.allows("https://a.example/page", "OtherBot")


@pytest.mark.parametrize(("name", "status"), [("notfound", 404), ("forbidden", 403)])
async def test_client_error_allows_everything(
    client: httpx.AsyncClient, server: LocalServer, name: str, status: int
) -> None:
    policy = await robots_of(client, server, name)
    assert policy.rule is RobotsRule.ALLOW_ALL
    assert policy.status_code == status
    assert policy.allows(f"{origin(server, name)}/anything")
    assert policy.ttl == DEFAULT_TTL
    assert not policy.temporary


@pytest.mark.parametrize(
    ("name", "status", "failure", "retry_after"),
    [
        ("broken", 500, "server_error", None),
        ("busy", 429, "rate_limited", 60.0),
        # A 4xx is "allow all", but not a challenge: that is the host's defence.
        ("challenged", 403, "blocked_captcha", None),
    ],
)
async def test_server_error_or_429_disallows_everything_for_a_short_while(
    client: httpx.AsyncClient,
    server: LocalServer,
    name: str,
    status: int,
    failure: str,
    retry_after: float | None,
) -> None:
    policy = await robots_of(client, server, name)
    assert policy.rule is RobotsRule.DISALLOW_ALL
    assert policy.status_code == status
    # What the fetcher learns about the host from it.
    assert (policy.failure, policy.retry_after) == (failure, retry_after)
    assert not policy.allows(f"{origin(server, name)}/")
    assert policy.temporary
    assert policy.ttl == RETRY_TTL
    assert RETRY_TTL - 5 < policy.expires_in() <= RETRY_TTL


async def test_unreachable_site_disallows_everything(client: httpx.AsyncClient) -> None:
    policy = await fetch_robots(client, f"http://a.trove.test:{free_port()}", max_bytes=CAP)
    assert policy.rule is RobotsRule.DISALLOW_ALL
    assert policy.status_code is None
    assert policy.error is not None
    assert "ConnectError" in policy.error
    assert policy.failure == "network_error"
    assert policy.ttl == RETRY_TTL


async def test_robots_that_never_finishes_disallows_everything_within_the_timeout(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    started = time.monotonic()
    policy = await fetch_robots(client, origin(server, "slow"), max_bytes=CAP, total_timeout=1.0)
    assert policy.rule is RobotsRule.DISALLOW_ALL
    assert policy.error is not None
    assert "timeout" in policy.error
    assert policy.failure == "timeout"
    assert time.monotonic() - started < 3.0


async def test_redirect_to_another_host_is_followed(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    policy = await robots_of(client, server, "moved")
    assert policy.rule is RobotsRule.PARSED
    assert policy.origin == origin(server, "moved")
    assert not policy.allows(f"{origin(server, 'moved')}/from-b/page")
    assert policy.allows(f"{origin(server, 'moved')}/elsewhere")
    assert server.requests_to("/robots.txt", host="b.trove.test")


async def test_a_redirect_to_no_host_ends_the_chain_as_a_missing_file(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    # Handed to the hop's lease, a host-less URL failed there: the page came back and
    # asked robots.txt again, a gap later, for ever.
    gates: list[tuple[str, ...]] = []

    async def gate(hops: tuple[str, ...]) -> None:
        gates.append(hops)

    policy = await fetch_robots(client, origin(server, "hostless"), max_bytes=CAP, before_hop=gate)
    assert policy.rule is RobotsRule.ALLOW_ALL
    assert policy.error == "redirected to https:/robots.txt: no host"
    assert gates == []


async def test_a_redirect_to_a_host_of_dots_ends_the_chain_as_a_missing_file(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    # httpx reads ``.`` as a host, which no host key or rule can name: an unexpected
    # error then, the whole site disallowed a while and the failure logged at each try.
    policy = await fetch_robots(client, origin(server, "dot"), max_bytes=CAP)
    assert policy.rule is RobotsRule.ALLOW_ALL
    assert policy.failure is None
    assert policy.error == "redirected to http://./robots.txt: no host"


@pytest.mark.parametrize("name", ["portless", "mailto", "emoji"])
async def test_a_redirect_to_a_location_no_request_can_go_to_is_a_missing_file(
    client: httpx.AsyncClient, server: LocalServer, name: str
) -> None:
    # Read as the host's network failing, it disallowed the whole site ten minutes at a
    # time, for ever, and paused the host each time.
    policy = await fetch_robots(client, origin(server, name), max_bytes=CAP)
    assert policy.rule is RobotsRule.ALLOW_ALL
    assert policy.failure is None
    assert policy.error is not None
    assert policy.error.startswith("redirected to an unusable Location")


async def test_a_redirect_to_a_number_too_long_for_an_address_ends_the_chain_as_a_missing_file(
    client: httpx.AsyncClient, server: LocalServer, caplog: pytest.LogCaptureFixture
) -> None:
    # Its host key was a ValueError (int() of 4,400 digits): an unexpected error, the
    # whole site disallowed ten minutes at a time and a traceback logged at each try.
    policy = await fetch_robots(client, origin(server, "digits"), max_bytes=CAP)
    assert policy.rule is RobotsRule.ALLOW_ALL
    assert policy.failure is None
    assert policy.error is not None
    assert policy.error.endswith(": no host")
    assert len(policy.error) <= 500
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


async def test_a_redirect_hop_waits_at_the_gate_and_can_resume_later(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    target = f"{origin(server, 'b')}/robots.txt"

    async def pause(hops: tuple[str, ...]) -> None:
        raise RedirectPaused(hops, at=time.time() + 60)

    before = len(server.requests_to("/robots.txt", host="b.trove.test"))
    with pytest.raises(RedirectPaused) as paused:
        await fetch_robots(client, origin(server, "moved"), max_bytes=CAP, before_hop=pause)
    assert paused.value.hops == (target,)
    assert len(server.requests_to("/robots.txt", host="b.trove.test")) == before
    policy = await fetch_robots(
        client, origin(server, "moved"), max_bytes=CAP, resume=paused.value.hops
    )
    assert policy.origin == origin(server, "moved")  # the policy is the origin's
    assert not policy.allows(f"{origin(server, 'moved')}/from-b/page")
    assert len(server.requests_to("/robots.txt", host="b.trove.test")) == before + 1


async def test_a_redirect_to_an_excluded_host_disallows_everything_without_asking_it(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    asked: list[str] = []

    async def excluded(host: str) -> str | None:
        asked.append(host)
        return "excluded by the operator" if host == "b.trove.test" else None

    before = len(server.requests_to("/robots.txt", host="b.trove.test"))
    policy = await fetch_robots(client, origin(server, "moved"), max_bytes=CAP, excluded=excluded)
    assert not policy.temporary  # the site's lasting choice, not a failure to retry soon
    assert policy.ttl == DEFAULT_TTL
    assert not policy.allows(f"{origin(server, 'moved')}/")
    assert not policy.allows(f"{origin(server, 'moved')}/elsewhere", token="AnyBot")
    assert policy.error is not None
    assert "excluded by the operator" in policy.error
    assert asked == ["b.trove.test"]
    assert len(server.requests_to("/robots.txt", host="b.trove.test")) == before
    # Not excluded, the same redirect is followed.
    allowed = await fetch_robots(
        client, origin(server, "moved"), max_bytes=CAP, excluded=nothing_excluded
    )
    assert allowed.rule is RobotsRule.PARSED


async def test_a_redirect_to_an_excluded_address_written_otherwise_is_not_asked(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    rules = Exclusions(read_rules(["127.0.0.1"]))

    async def excluded(host: str) -> str | None:
        return rules.refusal(host)

    policy = await fetch_robots(
        client, origin(server, "numbered"), max_bytes=CAP, excluded=excluded
    )
    assert policy.error is not None
    assert "excluded by the operator (127.0.0.1)" in policy.error
    assert not policy.allows(f"{origin(server, 'numbered')}/")
    assert server.requests_to("/robots.txt", host="2130706433") == []


async def test_an_exclusions_check_that_fails_is_not_the_sites_answer(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    async def broken(host: str) -> str | None:
        raise nats.errors.TimeoutError

    with pytest.raises(HopGateFailed) as failed:
        await fetch_robots(client, origin(server, "moved"), max_bytes=CAP, excluded=broken)
    assert isinstance(failed.value.__cause__, nats.errors.TimeoutError)


async def nothing_excluded(host: str) -> str | None:
    return None


async def test_redirect_to_a_metadata_address_is_never_connected(
    client: httpx.AsyncClient, recorder: RecordingBackend, server: LocalServer
) -> None:
    policy = await robots_of(client, server, "metadata")
    assert policy.rule is RobotsRule.DISALLOW_ALL
    assert policy.error is not None
    assert policy.error.startswith("blocked address: ")
    assert policy.failure is None  # our refusal, nothing the host did
    assert recorder.connects == [("127.0.0.1", server.port)]


async def test_endless_redirects_count_as_unavailable_after_five_hops(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    before = len(server.requests_to("/robots.txt", host="loop.trove.test"))
    policy = await robots_of(client, server, "loop")
    assert policy.rule is RobotsRule.ALLOW_ALL
    assert policy.error == "more than 5 redirects"
    assert len(server.requests_to("/robots.txt", host="loop.trove.test")) - before == 6


async def test_oversize_robots_is_cut_at_the_cap_on_a_line_boundary(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    assert len(OVERSIZE_ROBOTS) > CAP
    policy = await robots_of(client, server, "big")
    site = origin(server, "big")
    assert policy.rule is RobotsRule.PARSED
    assert policy.truncated
    assert len(policy.body) <= CAP
    assert policy.body.endswith(b"\n")
    assert OVERSIZE_ROBOTS.startswith(policy.body)
    assert not policy.allows(f"{site}/filler/000001")
    assert policy.allows(f"{site}/late/page")


async def test_oversize_robots_with_cr_line_ends_is_cut_at_its_last_line_too(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    """Cut at the last LF only, a file of CR line ends would keep nothing: allow all."""
    policy = await robots_of(client, server, "bigcr")
    site = origin(server, "bigcr")
    assert policy.truncated
    assert not policy.allows(f"{site}/filler/000001")
    assert policy.allows(f"{site}/late/page")
    assert len(policy.body) <= CAP
    assert policy.body.endswith(b"\r")
    assert OVERSIZE_CR_ROBOTS.startswith(policy.body)


async def test_gzipped_robots_is_decoded(client: httpx.AsyncClient, server: LocalServer) -> None:
    policy = await robots_of(client, server, "zipped")
    assert policy.body == ROBOTS
    assert not policy.allows(f"{origin(server, 'zipped')}/private/x")


async def test_byte_order_mark_does_not_hide_the_first_line(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    policy = await robots_of(client, server, "bom")
    assert not policy.allows(f"{origin(server, 'bom')}/x/y")


async def test_policy_survives_a_round_trip_through_bytes(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    for name in ("a", "notfound", "broken", "busy", "big"):
        policy = await robots_of(client, server, name)
        restored = RobotsPolicy.from_bytes(policy.to_bytes())
        assert restored == policy
        page = f"{origin(server, name)}/private/secret"
        assert restored.allows(page) == policy.allows(page)
        assert restored.crawl_delay() == policy.crawl_delay()
        assert restored.expires_at == policy.expires_at


def test_a_policy_an_older_pod_stored_is_read_without_what_it_did_not_know() -> None:
    stored = (
        b'{"v":1,"origin":"http://old.test","rule":"disallow_all","fetched_at":5.0,'
        b'"ttl":600.0,"status":429,"truncated":false,"error":"HTTP 429"}\n'
    )
    policy = RobotsPolicy.from_bytes(stored)
    assert (policy.rule, policy.status_code, policy.ttl) == (RobotsRule.DISALLOW_ALL, 429, 600.0)
    assert (policy.failure, policy.retry_after) == (None, None)


def test_stored_bytes_stay_within_the_cap_plus_a_small_header() -> None:
    policy = RobotsPolicy(
        origin="http://x.test", rule=RobotsRule.PARSED, fetched_at=1.0, body=b"\xff" * CAP
    )
    assert len(policy.to_bytes()) < CAP + 512


@pytest.mark.parametrize("data", [b"", b"not json\nbody", b'{"v": 99}\n', b'{"v": 1}\n'])
def test_bytes_that_are_not_a_policy_are_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="robots policy"):
        RobotsPolicy.from_bytes(data)


@pytest.mark.parametrize(
    "fetched_at",
    ["NaN", "Infinity", "1" + "0" * 400],
    ids=["nan", "infinity", "an-integer-past-a-float"],
)
def test_a_stored_policy_whose_times_never_come_is_refused(fetched_at: str) -> None:
    # A NaN or an infinity never expired (the policy was kept for good); an integer past
    # a float's range raised OverflowError, which the cache did not take for a miss.
    stored = (
        b'{"v":1,"origin":"http://odd.test","rule":"allow_all","fetched_at":'
        + fetched_at.encode()
        + b',"ttl":600.0,"status":404,"truncated":false,"error":null}\n'
    )
    with pytest.raises(ValueError, match="robots policy"):
        RobotsPolicy.from_bytes(stored)


def test_a_restored_policy_is_parsed_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    original = protego.Protego.parse

    def counting(content: str) -> protego.Protego:
        calls.append(content)
        return original(content)

    monkeypatch.setattr(protego.Protego, "parse", counting)
    stored = RobotsPolicy(
        origin="http://lru.test",
        rule=RobotsRule.PARSED,
        fetched_at=time.time(),
        body=b"User-agent: *\nDisallow: /no/\n",
    ).to_bytes()
    for _ in range(3):
        policy = RobotsPolicy.from_bytes(stored)
        assert not policy.allows("http://lru.test/no/1")
        assert policy.allows("http://lru.test/yes")
    assert len(calls) == 1


def test_policy_expires_after_its_ttl() -> None:
    policy = RobotsPolicy(
        origin="http://x.test", rule=RobotsRule.ALLOW_ALL, fetched_at=1000.0, ttl=60.0
    )
    assert policy.expires_at == 1060.0
    assert policy.expires_in(1000.0) == 60.0
    assert not policy.expired(1059.0)
    assert policy.expired(1060.0)
    assert policy.expires_in(2000.0) == 0.0


@pytest.mark.parametrize(
    ("written", "seconds"),
    [
        ("30s", 30.0),
        ("30 seconds", 30.0),
        ("30 Secs", 30.0),
        ("2,5", 2.5),
        ("12.5 s", 12.5),
        ("30", 30.0),
        ("2 minutes", 120.0),
        ("1,5min", 90.0),
        ("soon", None),
        ("30 hours", None),
        ("-5", None),
        # Past a float's range: the longest wait there is, which the gap's bound cuts.
        ("1e400", sys.float_info.max),
        ("Infinity", sys.float_info.max),
        ("nan", None),
    ],
)
def test_a_crawl_delay_written_with_its_unit_or_a_decimal_comma_is_its_number(
    written: str, seconds: float | None
) -> None:
    # The site's wait, not the default gap: "30s" read as no Crawl-delay asked a third.
    policy = parsed(f"User-agent: *\nCrawl-delay: {written}\n".encode(), "https://a.example")
    assert policy.crawl_delay() == seconds


def parsed(body: bytes, origin: str = "https://big.example") -> RobotsPolicy:
    return RobotsPolicy(origin=origin, rule=RobotsRule.PARSED, fetched_at=0.0, body=body)


def test_the_parsed_files_kept_are_bounded_by_their_size() -> None:
    big = b"User-agent: *\n" + b"Disallow: /x\n" * 40_000  # ~0.5 MB, as a file may be
    for n in range(3 * robots_module.PARSED_CACHE_BYTES // len(big)):
        assert not parsed(big, origin=f"https://site{n}.example").allows(
            f"https://site{n}.example/x"
        )
    assert robots_module._parsed_bytes <= robots_module.PARSED_CACHE_BYTES
    assert sum(key[2] for key in robots_module._parsed) == robots_module._parsed_bytes


WIKI_ROBOTS = b"""\
User-agent: *
Disallow: /index.php?title=Special:
Disallow: /search?q=
Allow: /search?q=open
"""


def test_a_query_rule_holds_whatever_order_the_canonical_url_sorts_the_query_in() -> None:
    """A canonical URL's parameters are sorted by name; the site's links and rules are
    not. A URL the rules disallow as linked must not be allowed as sorted."""
    policy = parsed(WIKI_ROBOTS, origin="https://wiki.example")
    linked = "https://wiki.example/index.php?title=Special:RecentChanges&days=30&limit=500"
    sorted_ = "https://wiki.example/index.php?days=30&limit=500&title=Special:RecentChanges"
    assert canonicalize(linked) == sorted_
    assert not policy.allows(linked)
    assert not policy.allows(sorted_)
    assert not policy.allows(canonicalize("https://wiki.example/search?q=cats&page=2"))
    # An Allow that matches in every order still allows.
    assert policy.allows(canonicalize("https://wiki.example/search?q=open&page=2"))
    # Parameters the rules do not name, in any order, stay allowed.
    assert policy.allows(canonicalize("https://wiki.example/index.php?title=Main&action=raw"))
    assert policy.allows("https://wiki.example/search?page=2&sort=new")


def test_a_wildcard_rule_that_reaches_into_the_query_holds_in_the_linked_order_too() -> None:
    policy = parsed(b"User-agent: *\nDisallow: /list*&page=\n", origin="https://shop.example")
    # Linked as ``?q=shoes&page=2``; its canonical spelling puts page first.
    assert not policy.allows(canonicalize("https://shop.example/list?q=shoes&page=2"))
    assert policy.allows("https://shop.example/list?page=2")


@LINE_ENDS
def test_a_query_rule_holds_whatever_the_line_ends(end: str) -> None:
    """A query rule on any line of a file of CR line ends is seen: the URL's other
    orders are checked."""
    body = f"User-agent: *{end}Disallow: /search?q={end}".encode()
    policy = parsed(body, origin="https://find.example")
    assert not policy.allows("https://find.example/search?page=2&q=cats")
    assert policy.allows("https://find.example/search?page=2&sort=new")


def test_any_order_a_rule_disallows_refuses_even_where_an_allow_matched_the_canonical_one() -> None:
    """``?page=`` is allowed first, ``?q=`` is not: the site could link it q first, and
    a URL is refused if any order checked is disallowed."""
    body = b"User-agent: *\nAllow: /search?page=\nDisallow: /search?q=\n"
    policy = parsed(body, origin="https://find.example")
    assert not policy.allows("https://find.example/search?page=2&q=cats")
    assert policy.allows("https://find.example/search?page=2&sort=new")


def test_a_files_sitemap_lines_are_canonical_urls_each_once_and_bounded() -> None:
    lines = [
        "Sitemap: https://Blog.Example:443/sitemap.xml",
        "Sitemap: /sitemap-posts.xml",  # relative: read against the file's own URL
        "sitemap: https://blog.example/sitemap.xml",  # the first again, spelt otherwise
        "Sitemap: javascript:alert(1)",
        "Sitemap: ftp://blog.example/sitemap.xml",
        *(f"Sitemap: https://blog.example/more-{n}.xml" for n in range(MAX_SITEMAPS + 5)),
    ]
    policy = parsed(
        "\n".join(["User-agent: *", "Disallow:", *lines]).encode(), "https://blog.example"
    )

    found = policy.sitemap_urls("https://blog.example")

    assert found[:3] == (
        "https://blog.example/sitemap.xml",
        "https://blog.example/sitemap-posts.xml",
        "https://blog.example/more-0.xml",
    )
    assert len(found) == MAX_SITEMAPS
    assert parsed(b"User-agent: *\nDisallow: /\n").sitemap_urls("https://big.example") == ()


def test_only_a_files_first_sitemap_lines_are_read_for_its_sitemaps() -> None:
    # Read on the event loop at every visit of a home page: tens of thousands of lines
    # that read as no URL took seconds each time.
    junk = ["Sitemap: ftp://blog.example/a.xml"] * (SITEMAP_LINES_READ + 1000)
    body = "\n".join(["User-agent: *", "Disallow:", *junk, "Sitemap: /late.xml"]).encode()

    assert parsed(body, "https://blog.example").sitemap_urls("https://blog.example") == ()
