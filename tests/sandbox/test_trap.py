"""The misbehaving host and the robots/ad-hoc test hooks, seen through HTTP."""

from __future__ import annotations

import re
import zlib
from xml.etree import ElementTree

import httpx
import pytest

from tests.sandbox.support import by_ip, get, read_page
from trove_sandbox import TRAP_HOST, RunningSandbox, SandboxWeb, serve_sandbox
from trove_sandbox.trap import BOMB_BYTES, FIXED_ETAG, HUGE_BYTES

BOB = "bob-notes.trove.test"


def trap(running: RunningSandbox, path: str) -> str:
    return running.base_url(TRAP_HOST) + path


async def test_trap_host_is_served_on_its_own_ip_but_is_not_a_seed(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    assert running.resolve_map[TRAP_HOST] == "127.0.0.16"
    assert all(TRAP_HOST not in seed for seed in running.seeds)
    index = await get(client, running, trap(running, "/"))
    assert index.status_code == 200
    assert "/gzip-bomb" in index.text
    robots = await get(client, running, trap(running, "/robots.txt"))
    assert "Allow: /" in robots.text


async def test_trap_is_absent_unless_asked_for() -> None:
    web = SandboxWeb.generate()
    assert web.trap_host is None
    assert TRAP_HOST not in web.resolve_map()
    assert web.page(TRAP_HOST, "/huge").status == 404


async def test_slow_body_sends_headers_at_once_then_trickles(running: RunningSandbox) -> None:
    target, host = by_ip(running, trap(running, "/slow-body"))
    received = bytearray()

    async def read_body(response: httpx.Response) -> None:
        async for chunk in response.aiter_raw():
            received.extend(chunk)

    timeout = httpx.Timeout(5.0, read=0.3)
    async with (
        httpx.AsyncClient(trust_env=False, timeout=timeout) as client,
        client.stream("GET", target, headers=host) as response,
    ):
        assert response.status_code == 200
        assert response.headers["transfer-encoding"] == "chunked"
        with pytest.raises(httpx.ReadTimeout):
            await read_body(response)
    assert bytes(received) == b"<"


async def test_slow_headers_make_a_client_time_out(running: RunningSandbox) -> None:
    target, host = by_ip(running, trap(running, "/slow-headers"))
    async with httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(5.0, read=0.3)) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.get(target, headers=host)
    assert running.witness.paths(TRAP_HOST) == ["/slow-headers"]


@pytest.mark.parametrize("query", ["", "?chunked=1"])
async def test_huge_page_is_ten_mebibytes_streamed(
    running: RunningSandbox, client: httpx.AsyncClient, query: str
) -> None:
    target, host = by_ip(running, trap(running, "/huge" + query))
    async with client.stream("GET", target, headers=host) as response:
        assert response.headers["content-type"].startswith("text/html")
        if query:
            assert "content-length" not in response.headers
        else:
            assert response.headers["content-length"] == str(HUGE_BYTES)
        size = 0
        first = b""
        async for chunk in response.aiter_raw():
            first = first or chunk
            size += len(chunk)
    assert size == HUGE_BYTES == 10 * 1024 * 1024
    assert first.startswith(b"<!DOCTYPE html>")


async def test_gzip_bomb_is_small_on_the_wire_and_huge_inflated(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    target, host = by_ip(running, trap(running, "/gzip-bomb"))
    inflater = zlib.decompressobj(wbits=31)
    wire = inflated = 0
    async with client.stream("GET", target, headers=host) as response:
        assert response.headers["content-encoding"] == "gzip"
        assert int(response.headers["content-length"]) < 200_000
        async for chunk in response.aiter_raw():
            wire += len(chunk)
            inflated += len(inflater.decompress(chunk, 1 << 20))
            while inflater.unconsumed_tail:
                inflated += len(inflater.decompress(inflater.unconsumed_tail, 1 << 20))
    assert wire < 200_000
    assert inflated == BOMB_BYTES >= 100 * 1024 * 1024


async def test_redirect_loop_goes_round_in_circles(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    first = await get(client, running, trap(running, "/redirect-loop"))
    second = await get(client, running, trap(running, "/redirect-loop/b"))
    assert (first.status_code, first.headers["location"]) == (302, "/redirect-loop/b")
    assert (second.status_code, second.headers["location"]) == (302, "/redirect-loop")
    self_loop = await get(client, running, trap(running, "/redirect-self"))
    assert self_loop.headers["location"] == "/redirect-self"


async def test_redirect_chain_takes_n_hops_then_a_page(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    url = trap(running, "/redirect-chain/3")
    hops = 0
    while True:
        response = await get(client, running, url)
        if response.status_code != 302:
            break
        hops += 1
        url = trap(running, response.headers["location"])
    assert hops == 3
    assert response.status_code == 200
    assert url.endswith("/redirect-chain/0")
    too_long = await get(client, running, trap(running, "/redirect-chain/5000"))
    assert too_long.status_code == 404


async def test_redirect_cross_points_at_another_sandbox_host(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    response = await get(client, running, trap(running, "/redirect-cross"))
    assert response.status_code == 302
    assert response.headers["location"] == running.seeds[0]


@pytest.mark.parametrize(
    ("query", "location"),
    [
        ("", "http://127.0.0.1:1/"),
        (
            "?to=http://169.254.169.254/latest/meta-data/",
            "http://169.254.169.254/latest/meta-data/",
        ),
        ("?to=http%3A%2F%2F%5B%3A%3A1%5D%3A1%2F", "http://[::1]:1/"),
        ("?to=file:///etc/passwd", "file:///etc/passwd"),
    ],
)
async def test_redirect_private_sends_the_location_asked_for(
    running: RunningSandbox, client: httpx.AsyncClient, query: str, location: str
) -> None:
    response = await get(client, running, trap(running, "/redirect-private" + query))
    assert response.status_code == 302
    assert response.headers["location"] == location


async def test_binary_pdf_is_served_as_pdf(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    response = await get(client, running, trap(running, "/binary.pdf"))
    assert response.headers["content-type"] == "application/pdf"
    assert response.content.startswith(b"%PDF-")


async def test_bad_charset_pages_lie_about_their_encoding(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    latin = await get(client, running, trap(running, "/bad-charset"))
    assert latin.headers["content-type"] == "text/html; charset=utf-8"
    with pytest.raises(UnicodeDecodeError):
        latin.content.decode("utf-8")
    assert "café" in latin.content.decode("latin-1").lower()
    assert running.web.language(trap(running, "/bad-charset")) == "fr"
    bogus = await get(client, running, trap(running, "/bogus-charset"))
    assert bogus.headers["content-type"] == "text/html; charset=x-nonsense"
    assert b'<meta charset="x-nonsense">' in bogus.content


@pytest.mark.parametrize(
    ("path", "status", "retry_after"),
    [
        ("/status/404", 404, None),
        ("/status/410", 410, None),
        ("/status/500", 500, None),
        ("/status/429", 429, "5"),
        ("/status/429?after=120", 429, "120"),
        ("/status/503", 503, "5"),
        ("/status/503?after=Wed, 21 Oct 2099 07:28:00 GMT", 503, "Wed, 21 Oct 2099 07:28:00 GMT"),
        ("/status/204", 204, None),
        ("/status/299", 299, None),
    ],
)
async def test_status_paths_answer_any_code_with_retry_after_where_due(
    running: RunningSandbox,
    client: httpx.AsyncClient,
    path: str,
    status: int,
    retry_after: str | None,
) -> None:
    response = await get(client, running, trap(running, path))
    assert response.status_code == status
    assert response.headers.get("retry-after") == retry_after
    if status == 204:
        assert response.content == b""


async def test_status_out_of_range_is_refused(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    response = await get(client, running, trap(running, "/status/100"))
    assert response.status_code == 400


async def test_etag_page_honours_if_none_match(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    first = await get(client, running, trap(running, "/etag"))
    assert first.headers["etag"] == FIXED_ETAG
    assert "last-modified" not in first.headers
    again = await get(client, running, trap(running, "/etag"), {"If-None-Match": FIXED_ETAG})
    assert again.status_code == 304
    other = await get(client, running, trap(running, "/etag"), {"If-None-Match": '"other"'})
    assert other.status_code == 200
    assert [r.status for r in running.witness.requests(TRAP_HOST)] == [200, 304, 200]


async def test_calendar_links_months_forever(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    url = trap(running, "/calendar/2024/11")
    seen = []
    for _ in range(30):
        page = await get(client, running, url)
        assert page.status_code == 200
        links = [href for href, _ in read_page(page.text).links]
        assert len(links) == 2
        seen.append(url.rsplit("/calendar/", 1)[1])
        url = trap(running, links[1])
    assert seen[:3] == ["2024/11", "2024/12", "2025/01"]
    assert seen[-1] == "2027/04"
    december = await get(client, running, trap(running, "/calendar/2024/12"))
    assert '"/calendar/2024/11"' in december.text
    bad = await get(client, running, trap(running, "/calendar/2024/13"))
    assert bad.status_code == 404


async def test_trap_atom_feed_links_trap_pages(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    response = await get(client, running, trap(running, "/feed.atom"))
    assert response.headers["content-type"] == "application/atom+xml"
    root = ElementTree.fromstring(response.content)  # noqa: S314 (our own generated feed)
    atom = "{http://www.w3.org/2005/Atom}"
    links = [entry.find(f"{atom}link") for entry in root.iter(f"{atom}entry")]
    hrefs = [link.get("href") for link in links if link is not None]
    assert len(hrefs) == 5
    assert all(href and href.startswith(running.base_url(TRAP_HOST) + "/") for href in hrefs)


async def test_noindex_and_x_robots_tag_pages(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    meta = await get(client, running, trap(running, "/noindex"))
    assert read_page(meta.text).meta["robots"] == "noindex,nofollow"
    assert read_page(meta.text).links
    header = await get(client, running, trap(running, "/xrobots"))
    assert header.headers["x-robots-tag"] == "noindex"


async def test_set_robots_is_served_at_once(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    running.web.set_robots(BOB, "User-agent: *\nDisallow: /\n")
    response = await get(client, running, running.base_url(BOB) + "/robots.txt")
    assert response.text == "User-agent: *\nDisallow: /\n"
    assert not [url for url in running.web.expected_pages() if BOB in url]


@pytest.mark.parametrize("status", [404, 500, 503])
async def test_robots_status_override_is_served(
    running: RunningSandbox, client: httpx.AsyncClient, status: int
) -> None:
    running.web.set_robots_status(BOB, status)
    response = await get(client, running, running.base_url(BOB) + "/robots.txt")
    assert response.status_code == status
    home = await get(client, running, running.base_url(BOB) + "/")
    assert home.status_code == 200


async def test_robots_timeout_override_never_answers_in_time(running: RunningSandbox) -> None:
    running.web.set_robots_status(BOB, "timeout")
    target, host = by_ip(running, running.base_url(BOB) + "/robots.txt")
    async with httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(5.0, read=0.3)) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.get(target, headers=host)


async def test_added_page_is_served_with_its_status_and_headers(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    url = running.web.add_page(
        BOB, "/ad-hoc.html", "<p>gone</p>", status=410, headers={"X-Test": "yes"}
    )
    assert url == running.base_url(BOB) + "/ad-hoc.html"
    response = await get(client, running, url)
    assert response.status_code == 410
    assert response.headers["x-test"] == "yes"
    assert response.text == "<p>gone</p>"
    assert re.fullmatch(r'"[0-9a-f]+"', response.headers["etag"])


async def test_a_web_can_be_served_without_a_trap(client: httpx.AsyncClient) -> None:
    web = SandboxWeb.generate(hosts=2, pages_per_host=2, base_ip="127.0.0.40")
    async with serve_sandbox(web) as running:
        assert set(running.resolve_map.values()) == {"127.0.0.40", "127.0.0.41"}
        response = await get(client, running, running.seeds[1])
        assert response.status_code == 200
