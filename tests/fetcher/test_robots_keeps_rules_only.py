"""A robots.txt policy keeps the lines its parser reads, never a page's text.

A robots.txt request may be answered with any page: redirected to the home page, or a
soft 404 (a site serving its index.html for every path). The policy is shared through
the ``trove_robots`` bucket, on disk for a day; it keeps the rules, which parse as the
file received did, and an error that says what went wrong without quoting the page.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import bucket_keys
from tests.fetcher._completions import Completions
from tests.fetcher._servers import Exchange, LocalServer, Route, serving
from trove_fetcher import robots as robots_module
from trove_fetcher.fetcher import Fetcher, Job
from trove_fetcher.http import FetchLimits
from trove_fetcher.politeness import Politeness, PolitenessConfig
from trove_fetcher.robots import RobotsPolicy, RobotsRule, fetch_robots
from trove_fetcher.transport import build_client
from trove_schema.bus import Bus
from trove_schema.events import CrawlOutcome, PageDiscovered, Provenance, Scope
from trove_schema.settings import FetcherSettings
from trove_schema.topology import DOMAINS_BUCKET, ROBOTS_BUCKET
from trove_schema.urls import canonicalize, domain_of

IP = "127.0.0.67"
CAP = 512 * 1024
PERSONAL = (b"Jane Doe", b"Welcome back", b"jane@example.org", b"Patient record")

# A blog's home page, with a robots.txt shown in a code block: its two rule lines are
# what protego reads of the page, and all the policy keeps of it.
HOME_PAGE = b"""\
<!doctype html>
<html lang="en">
<head><title>Home</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="https://cdn.example/site.css?v=3&theme=dark">
</head>
<body>
<p class="greeting">Welcome back, Jane Doe</p>
Account: jane@example.org
<h2>How I keep bots out of my drafts</h2>
<pre>
User-agent: *
Disallow: /drafts/
</pre>
</body>
</html>
"""

# The page a proxy sends as chunked when it is not: h11 quotes the line it cannot read.
PATIENT_RECORD = (
    b"<!doctype html><title>Patient record</title>Name: Jane Doe, born 1970-01-01\r\n"
    b"<p>Welcome back, Jane Doe</p>\r\n"
)

GROUPS = b"""\
# robots.txt for www.shop.example -- questions to jane@example.org
User-agent: Googlebot
User-agent: TroveBot/1.0   # our own name for it
Disallow: /checkout/
Allow: /checkout/help   # Jane Doe asked for this
Crawl-delay: 5

User-agent: *
Disallow: /cart
Disallow: /*?sessionid=
Dissallow: /old/
Request-rate: 1/10s
Visit-time: 0600-0845

Sitemap: https://www.shop.example/sitemap.xml
Host: www.shop.example
"""

# An unknown directive between two user-agent lines ends the first group: the second
# group's rules are TroveBot's only.
UNKNOWN_BETWEEN_GROUPS = b"""\
User-agent: TroveBot
Noindex: /tag/
User-agent: OtherBot
Disallow: /
Clean-param: ref /articles/
"""

# Read the generous way protego reads them: no colon, a field in two words.
LOOSE = b"""\
User agent TroveBot
Disallow /tmp
Crawl delay 7
Sitemap https://loose.example/map.xml
"""

CRLF_BOM = b"\xef\xbb\xbfUser-agent: *\r\nDisallow: /x/\r\n\r\n# Welcome back, Jane Doe\r\n"
BARE_CR = b"User-agent: *\rAllow: /\r\rUser-agent: TroveBot\rDisallow: /private\r"
LATIN_1 = b"User-agent: *\nDisallow: /caf\xe9/\nDisallow: /\xff\xfe\n# \xe9t\xe9 Jane Doe\n"

FILES: dict[str, bytes] = {
    "groups": GROUPS,
    "unknown": UNKNOWN_BETWEEN_GROUPS,
    "loose": LOOSE,
    "crlfbom": CRLF_BOM,
    "barecr": BARE_CR,
    "latin": LATIN_1,
    "homepage": HOME_PAGE,
}

PATHS = (
    "/",
    "/checkout/pay",
    "/checkout/help",
    "/cart",
    "/cart?item=1",
    "/list?sessionid=9&page=2",
    "/list?page=2&sessionid=9",
    "/old/a",
    "/tag/x",
    "/tmp/y",
    "/x/y",
    "/private/z",
    "/caf%C3%A9/",
    "/caf\u00e9/",
    "/drafts/first",
    "/search?q=a&v=3",
)
TOKENS = ("TroveBot", "Googlebot", "OtherBot", "SomeBot")


def reading(policy: RobotsPolicy) -> object:
    """Everything protego read of a policy's file: each group's rules, delay, request rate
    and visit time, the sitemaps and the preferred host."""
    parser = robots_module._parse(policy._key, policy.body).parser
    assert parser is not None
    groups = {
        agent: (
            [(rule.field, rule.value._pattern) for rule in group._rules],
            group.crawl_delay,
            group.request_rate,
            group.visit_time,
        )
        for agent, group in parser._user_agents.items()
    }
    return groups, list(parser.sitemaps), parser.preferred_host


def answers(policy: RobotsPolicy, origin: str) -> object:
    """What the fetcher asks of a policy, for every path and token above."""
    return (
        [policy.allows(f"{origin}{path}", token) for path in PATHS for token in TOKENS],
        [policy.crawl_delay(token) for token in TOKENS],
        policy.sitemaps(),
    )


def as_received(body: bytes, origin: str) -> RobotsPolicy:
    return RobotsPolicy(origin=origin, rule=RobotsRule.PARSED, fetched_at=0.0, body=body)


def reads_as_received(policy: RobotsPolicy, body: bytes) -> None:
    received = as_received(body, policy.origin)
    assert reading(policy) == reading(received)
    assert answers(policy, policy.origin) == answers(received, policy.origin)


def chunked_in_name_only(exchange: Exchange) -> None:
    exchange.send_response(200)
    exchange.send_header("Content-Type", "text/plain")
    exchange.send_header("Transfer-Encoding", "chunked")
    exchange.end_headers()
    exchange.wfile.write(PATIENT_RECORD)
    exchange.wfile.flush()


def _text(body: bytes) -> Route:
    return lambda exchange: exchange.send(200, body, content_type="text/plain")


def _home_page(exchange: Exchange) -> None:
    exchange.send(200, HOME_PAGE)


ROUTES: dict[str, Route] = {
    **{f"{name}.trove.test/robots.txt": _text(body) for name, body in FILES.items()},
    "home.trove.test/robots.txt": lambda exchange: exchange.redirect("/", 301),
    "home.trove.test/": _home_page,
    "home.trove.test/about": lambda exchange: exchange.send(200, b"<title>About</title>"),
    "home.trove.test/drafts/first": lambda exchange: exchange.send(200, b"<title>Draft</title>"),
    "creds.trove.test/robots.txt": lambda exchange: exchange.redirect(
        f"http://alice:hunter2@creds.trove.test:{exchange.server.server_address[1]}/rules.txt"
    ),
    "creds.trove.test/rules.txt": _text(b"User-agent: *\nDisallow: /private/\n"),
    "chunked.trove.test/robots.txt": chunked_in_name_only,
    "chunked.trove.test/about": lambda exchange: exchange.send(200, b"<title>About</title>"),
}
HOSTS = sorted({key.split("/", 1)[0] for key in ROUTES})


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    with serving(ROUTES, IP) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    settings_ = FetcherSettings(
        allowed_networks=(f"{IP}/32",), resolve=tuple(f"{host}={IP}" for host in HOSTS)
    )
    async with build_client(settings_) as built:
        yield built


def origin(server: LocalServer, name: str) -> str:
    return f"http://{name}.trove.test:{server.port}"


@pytest.mark.parametrize("name", sorted(FILES))
async def test_a_robots_txt_is_kept_as_the_rules_it_parses_to_and_no_other_text(
    client: httpx.AsyncClient, server: LocalServer, name: str
) -> None:
    body = FILES[name]
    policy = await fetch_robots(client, origin(server, name), max_bytes=CAP)
    assert policy.rule is RobotsRule.PARSED
    reads_as_received(policy, body)
    assert len(policy.body) <= len(body)
    stored = policy.to_bytes()
    for text in PERSONAL:
        assert text not in stored
    assert RobotsPolicy.from_bytes(stored) == policy


def test_a_file_of_rules_alone_is_kept_as_it_came() -> None:
    rules = b"User-agent: *\nDisallow: /cart\n\nUser-agent: TroveBot\r\nAllow: /\r\n"
    assert robots_module._rules_only(rules) == rules


def test_a_policy_an_older_pod_stored_with_the_file_as_received_reads_as_before() -> None:
    received = as_received(GROUPS, "https://www.shop.example")
    restored = RobotsPolicy.from_bytes(received.to_bytes())
    assert restored.body == GROUPS
    assert not restored.allows("https://www.shop.example/checkout/pay")
    assert restored.allows("https://www.shop.example/checkout/help")
    assert restored.crawl_delay() == 5.0
    assert restored.sitemaps() == ("https://www.shop.example/sitemap.xml",)


# Lines made of what robots.txt files and pages are made of: known fields (spelled as
# protego reads them), unknown ones, a page's text; values, comments and line ends.
_FIELDS = st.sampled_from(
    [
        "User-agent",
        "user agent",
        "Allow",
        "Disallow",
        "Dissallow",
        "Crawl-delay",
        "Request-rate",
        "Visit-time",
        "Sitemap",
        "Host",
        "Noindex",
        "Clean-param",
        '<a href="https',
        "Welcome back, Jane Doe",
        "",
        "#",
    ]
)
_SEPARATORS = st.sampled_from([": ", ":", " ", "\t: ", "", ":\u00a0"])
_VALUES = st.sampled_from(
    [
        "",
        "*",
        "/",
        "/private",
        "/a?b=",
        "/*&page=",
        "/p$",
        "TroveBot/1.0",
        "OtherBot",
        "**",
        "5",
        "1/10s",
        "0600-0845",
        "https://x.example/sitemap.xml",
        "//x.example/y",
        "caf\u00e9",
        "Jane Doe",
    ]
)
_COMMENTS = st.sampled_from(["", " # note", "#x: y", "   "])
_ENDS = st.sampled_from(["\n", "\r\n", "\r", "\x0c", "\u2028"])
# Whole lines too, three lines in four, so that groups and what ends them come up often.
_WHOLE = st.sampled_from(
    [
        "User-agent: *",
        "User-agent: TroveBot",
        "User-agent: OtherBot",
        "Disallow: /private",
        "Allow: /private/ok",
        "Crawl-delay: 5",
        "Sitemap: https://x.example/sitemap.xml",
        "Noindex: /tag/",
        '<a href="https://x.example/">Home</a>',
        "Welcome back, Jane Doe",
        "",
        "# a comment",
    ]
)
_WHOLE_LINE = st.builds(lambda *parts: "".join(parts), _WHOLE, _ENDS)
_LINE = st.one_of(
    _WHOLE_LINE,
    _WHOLE_LINE,
    _WHOLE_LINE,
    st.builds(lambda *parts: "".join(parts), _FIELDS, _SEPARATORS, _VALUES, _COMMENTS, _ENDS),
)
_RAW = st.sampled_from([b"", b"\xff", b"\xe9", b"\xe2\x80", b"\xef\xbb\xbf"])


@settings(max_examples=1000, deadline=None)
@given(
    lines=st.lists(st.tuples(_LINE, _RAW), max_size=25),
    bom=st.booleans(),
    last_end=st.booleans(),
)
def test_what_is_kept_parses_as_the_file_received_and_is_never_longer(
    lines: list[tuple[str, bytes]], bom: bool, last_end: bool
) -> None:
    body = (b"\xef\xbb\xbf" if bom else b"") + b"".join(raw + line.encode() for line, raw in lines)
    if not last_end:
        body = body.rstrip(b"\r\n")
    kept = robots_module._rules_only(body)
    assert len(kept) <= len(body)
    received = as_received(body, "https://x.example")
    policy = as_received(kept, "https://x.example")
    assert reading(policy) == reading(received)
    assert answers(policy, "https://x.example") == answers(received, "https://x.example")


# The fetcher, its shared bucket and its completions -------------------------------


@pytest.fixture
async def fetcher(bus: Bus, client: httpx.AsyncClient) -> AsyncIterator[Fetcher]:
    built = Fetcher(
        bus=bus,
        client=client,
        politeness=Politeness(
            await bus.js.key_value(DOMAINS_BUCKET), PolitenessConfig(min_delay=0.05)
        ),
        robots_kv=await bus.js.key_value(ROBOTS_BUCKET),
        limits=FetchLimits(total_timeout=10.0),
        robots_token="TroveBot",
        robots_max_bytes=CAP,
    )
    try:
        yield built
    finally:
        built.close()


def work(server: LocalServer, host: str, path: str) -> PageDiscovered:
    url = canonicalize(server.url(path, host))
    return PageDiscovered(
        url=url, domain=domain_of(url), scope=Scope(value=host), provenance=Provenance(kind="seed")
    )


async def stored_policy(bus: Bus) -> tuple[bytes, RobotsPolicy]:
    kv = await bus.js.key_value(ROBOTS_BUCKET)
    (key,) = await bucket_keys(bus, ROBOTS_BUCKET)
    entry = await kv.get(key)
    assert entry.value is not None
    return entry.value, RobotsPolicy.from_bytes(entry.value)


@pytest.mark.usefixtures("clean")
async def test_a_robots_txt_redirected_to_a_home_page_stores_its_rules_without_its_text(
    bus: Bus, fetcher: Fetcher, server: LocalServer
) -> None:
    about = work(server, "home.trove.test", "/about")
    draft = work(server, "home.trove.test", "/drafts/first")
    for page in (about, draft):
        await fetcher.process(Job(page), page.to_wire())

    events = await Completions(bus.js).wait_for(2, timeout=20)
    assert events[about.url].outcome is CrawlOutcome.SUCCESS
    # The rules the page holds are obeyed, as parsed from the page received.
    assert events[draft.url].outcome is CrawlOutcome.BLOCKED_ROBOTS
    assert server.requests_to("/drafts/first", "home.trove.test") == []
    record, stored = await stored_policy(bus)
    for text in PERSONAL:
        assert text not in record
    assert stored.rule is RobotsRule.PARSED
    reads_as_received(stored, HOME_PAGE)


@pytest.mark.usefixtures("clean")
async def test_a_robots_txt_sent_as_chunked_that_is_not_stores_an_error_without_its_text(
    bus: Bus, fetcher: Fetcher, server: LocalServer
) -> None:
    about = work(server, "chunked.trove.test", "/about")
    await fetcher.process(Job(about), about.to_wire())

    events = await Completions(bus.js).wait_for(1, timeout=20)
    refused = events[about.url]
    assert refused.outcome is CrawlOutcome.FAILED
    record, stored = await stored_policy(bus)
    assert stored.rule is RobotsRule.DISALLOW_ALL
    assert stored.failure == "network_error"
    for message in (stored.error, refused.error_message):
        says_its_kind_and_nothing_of_the_page(message)
    for text in PERSONAL:
        assert text not in record


def says_its_kind_and_nothing_of_the_page(message: str | None) -> None:
    assert message is not None
    assert "RemoteProtocolError: illegal chunk header" in message
    for text in ("Jane Doe", "Patient record", "doctype", "bytearray"):
        assert text not in message


async def test_a_robots_txt_redirect_with_credentials_is_followed_without_them(
    client: httpx.AsyncClient, server: LocalServer
) -> None:
    policy = await fetch_robots(client, origin(server, "creds"), max_bytes=CAP)
    assert policy.rule is RobotsRule.PARSED
    followed = server.requests_to("/rules.txt")
    assert followed
    assert all("authorization" not in request.headers for request in followed)
    assert "hunter2" not in policy.to_bytes().decode("utf-8", "replace")
