"""The sandbox served over HTTP: dispatch, conditional GET, keep-alive, the witness."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import deque
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import protego
import pytest

from tests.sandbox.support import absolute_links, by_ip, get, read_page
from trove_sandbox import RunningSandbox, SandboxWeb, Witness, serve_sandbox

ALICE = "alice-blog.trove.test"
BOB = "bob-notes.trove.test"


async def raw_exchange(ip: str, port: int, data: bytes, *, until_close: bool = True) -> bytes:
    """Send raw bytes and read what comes back (until the server closes, with a deadline)."""
    reader, writer = await asyncio.open_connection(ip, port)
    try:
        writer.write(data)
        await writer.drain()
        if until_close:
            return await asyncio.wait_for(reader.read(), 5.0)
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
    finally:
        writer.close()
        await writer.wait_closed()


async def read_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One Content-Length framed response: (head, body)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    body = await asyncio.wait_for(reader.readexactly(length), 5.0)
    return head, body


async def test_home_page_is_served_by_host_header(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    for seed in running.seeds:
        response = await get(client, running, seed)
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/html; charset=utf-8"
        host = urlsplit(seed).hostname or ""
        assert read_page(response.text).title == host.removesuffix(".trove.test")


async def test_every_host_ip_listens_on_the_same_port(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    assert running.port > 0
    assert running.web.port == running.port
    assert running.seeds == running.web.seeds()
    assert all(f":{running.port}/" in seed for seed in running.seeds)
    for host, ip in running.resolve_map.items():
        # No Host header naming a sandbox host: the socket's IP decides.
        response = await client.get(f"http://{ip}:{running.port}/robots.txt")
        assert response.status_code == 200
        assert response.text == running.web.robots_txt(host)
        assert running.witness.requests()[-1].host == host


async def test_base_url_and_ip_url_name_the_same_page(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    assert running.base_url(BOB) == f"http://{BOB}:{running.port}"
    assert running.ip_url(BOB, "/x") == f"http://127.0.0.11:{running.port}/x"
    by_name = await get(client, running, running.base_url(BOB) + "/")
    direct = await client.get(running.ip_url(BOB), headers={"Host": BOB})
    assert by_name.content == direct.content


async def test_unknown_host_header_falls_back_to_the_socket_ip(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    response = await client.get(running.ip_url(BOB), headers={"Host": "who.example:1"})
    assert response.status_code == 200
    assert read_page(response.text).title == "bob-notes"


async def test_host_header_wins_over_the_socket_ip(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    response = await client.get(running.ip_url(BOB), headers={"Host": f"{ALICE}:{running.port}"})
    assert read_page(response.text).title == "alice-blog"
    assert running.witness.requests()[-1].host == ALICE


async def test_conditional_get_gets_304(running: RunningSandbox, client: httpx.AsyncClient) -> None:
    url = running.web.articles(ALICE)[0]
    first = await get(client, running, url)
    etag, modified = first.headers["etag"], first.headers["last-modified"]
    assert etag.startswith('"')
    by_etag = await get(client, running, url, {"If-None-Match": etag})
    assert by_etag.status_code == 304
    assert by_etag.content == b""
    assert by_etag.headers["etag"] == etag
    by_date = await get(client, running, url, {"If-Modified-Since": modified})
    assert by_date.status_code == 304
    weak_list = await get(client, running, url, {"If-None-Match": f'"nope", W/{etag}'})
    assert weak_list.status_code == 304


async def test_changed_validators_get_the_full_page(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    url = running.web.articles(ALICE)[0]
    stale_tag = await get(client, running, url, {"If-None-Match": '"stale"'})
    assert stale_tag.status_code == 200
    assert stale_tag.content
    old = await get(client, running, url, {"If-Modified-Since": "Mon, 01 Jan 2001 00:00:00 GMT"})
    assert old.status_code == 200
    # If-None-Match wins over If-Modified-Since when both are sent.
    both = await get(
        client,
        running,
        url,
        {"If-None-Match": '"stale"', "If-Modified-Since": "Fri, 01 Jan 2100 00:00:00 GMT"},
    )
    assert both.status_code == 200
    garbage = await get(client, running, url, {"If-Modified-Since": "yesterday-ish"})
    assert garbage.status_code == 200


async def test_every_page_carries_an_etag_and_last_modified(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    for url in sorted(running.web.expected_pages()):
        response = await get(client, running, url)
        assert response.status_code == 200
        assert response.headers["etag"]
        assert response.headers["last-modified"].endswith("GMT")


async def test_head_request_has_headers_but_no_body(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    full = await get(client, running, running.seeds[0])
    head = await get(client, running, running.seeds[0], method="HEAD")
    assert head.status_code == 200
    assert head.content == b""
    assert head.headers["content-length"] == str(len(full.content))
    assert head.headers["etag"] == full.headers["etag"]


async def test_other_methods_get_405(running: RunningSandbox, client: httpx.AsyncClient) -> None:
    target, host = by_ip(running, running.seeds[0])
    response = await client.post(target, headers=host, content=b"a=1")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, HEAD"
    after = await client.get(target, headers=host)
    assert after.status_code == 200


async def test_witness_records_each_request_with_its_host(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    before = time.time()
    await get(client, running, running.seeds[0], {"User-Agent": "TroveBot/0.1 (+test)"})
    await get(client, running, running.base_url(BOB) + "/feed.xml", {"If-None-Match": '"x"'})
    await get(client, running, running.base_url(BOB) + "/missing")
    records = running.witness.requests()
    assert [(r.host, r.path, r.method, r.status) for r in records] == [
        (ALICE, "/", "GET", 200),
        (BOB, "/feed.xml", "GET", 200),
        (BOB, "/missing", "GET", 404),
    ]
    assert records[0].user_agent == "TroveBot/0.1 (+test)"
    assert records[1].if_none_match == '"x"'
    assert records[0].if_modified_since is None
    assert records[0].ip == "127.0.0.10"
    assert before <= records[0].wall <= time.time()
    assert records[0].monotonic <= records[1].monotonic <= records[2].monotonic
    assert [r.path for r in running.witness.requests(host=BOB)] == ["/feed.xml", "/missing"]
    assert running.witness.paths(ALICE) == ["/"]


async def test_witness_min_gap_is_the_shortest_interval_per_host(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    witness = running.witness
    assert witness.min_gap(ALICE) is None
    await get(client, running, running.seeds[0])
    assert witness.min_gap(ALICE) is None
    for _ in range(3):
        await get(client, running, running.seeds[0])
    await get(client, running, running.seeds[1])
    times = [r.monotonic for r in witness.requests(ALICE)]
    gap = witness.min_gap(ALICE)
    assert gap is not None
    assert gap == min(b - a for a, b in itertools.pairwise(times))
    assert 0 <= gap < 5
    assert witness.min_gap(BOB) is None


async def test_witness_wait_for_returns_when_the_condition_holds(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    witness = running.witness
    waiting = asyncio.create_task(witness.wait_for(lambda w: len(w.requests(BOB)) >= 2, 5.0))
    await get(client, running, running.seeds[1])
    assert not waiting.done()
    await get(client, running, running.seeds[1])
    await asyncio.wait_for(waiting, 5.0)
    with pytest.raises(TimeoutError):
        await witness.wait_for(lambda w: len(w.requests(BOB)) >= 3, 0.05)


async def test_witness_writes_jsonl_as_requests_arrive(
    web: SandboxWeb, tmp_path: Path, client: httpx.AsyncClient
) -> None:
    log_path = tmp_path / "witness.jsonl"
    async with serve_sandbox(web, witness_path=log_path) as running:
        await get(client, running, running.seeds[2], {"User-Agent": "probe"})
        lines = log_path.read_text().splitlines()
        assert len(lines) == 1
        entry = json.loads(lines[0])
        assert entry["host"] == "carol-garden.trove.test"
        assert entry["path"] == "/"
        assert entry["status"] == 200
        assert entry["user_agent"] == "probe"
        await get(client, running, running.seeds[2] + "robots.txt")
        assert len(log_path.read_text().splitlines()) == 2


def test_witness_without_a_file_keeps_records_in_memory() -> None:
    witness = Witness()
    assert witness.requests() == []
    assert witness.min_gap("any") is None
    witness.close()


async def test_keep_alive_serves_several_requests_on_one_connection(
    running: RunningSandbox,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.10", running.port)
    try:
        request = f"GET / HTTP/1.1\r\nHost: {ALICE}\r\n\r\n".encode()
        writer.write(request)
        head1, body1 = await read_response(reader)
        writer.write(request)
        _, body2 = await read_response(reader)
        # Two pipelined requests in one write are answered in order.
        writer.write(request + f"GET /robots.txt HTTP/1.1\r\nHost: {ALICE}\r\n\r\n".encode())
        _, body3 = await read_response(reader)
        _, body4 = await read_response(reader)
    finally:
        writer.close()
        await writer.wait_closed()
    assert head1.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Connection: keep-alive" in head1
    assert body1 == body2 == body3
    assert body4.startswith(b"# robots.txt")
    assert len(running.witness.requests()) == 4


async def test_connection_close_and_http_10_end_the_connection(running: RunningSandbox) -> None:
    closing = await raw_exchange(
        "127.0.0.10",
        running.port,
        f"GET / HTTP/1.1\r\nHost: {ALICE}\r\nConnection: close\r\n\r\n".encode(),
    )
    assert closing.startswith(b"HTTP/1.1 200 OK")
    assert b"Connection: close" in closing
    assert closing.endswith(b"</html>\n")
    old = await raw_exchange("127.0.0.10", running.port, b"GET / HTTP/1.0\r\n\r\n")
    assert old.startswith(b"HTTP/1.1 200 OK")
    assert old.endswith(b"</html>\n")


async def test_absolute_form_request_target_names_the_host(running: RunningSandbox) -> None:
    reply = await raw_exchange(
        "127.0.0.10",
        running.port,
        f"GET http://{BOB}:{running.port}/robots.txt HTTP/1.1\r\nHost: x\r\n"
        "Connection: close\r\n\r\n".encode(),
    )
    assert b"Disallow: /private/" in reply
    assert running.witness.requests()[-1].host == BOB


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GARBAGE\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nNo colon here\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nHost: a\r\n folded: value\r\n\r\n", b"400"),
        (b"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n", b"400"),
        (b"GET relative HTTP/1.1\r\nHost: a\r\n\r\n", b"400"),
        (b"GET / HTTP/2.0\r\n\r\n", b"505"),
        (b"GET / SPDY\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nContent-Length: nine\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", b"400"),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", b"400"),
        (b"POST / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n", b"413"),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 40_000 + b"\r\n\r\n", b"400"),
    ],
)
async def test_malformed_request_gets_an_error_and_the_server_keeps_serving(
    running: RunningSandbox, client: httpx.AsyncClient, raw: bytes, status: bytes
) -> None:
    reply = await raw_exchange("127.0.0.12", running.port, raw)
    assert reply.startswith(b"HTTP/1.1 " + status + b" ")
    assert running.witness.requests()[-1].status == int(status)
    healthy = await get(client, running, running.seeds[2])
    assert healthy.status_code == 200


async def test_client_vanishing_mid_request_does_not_hurt_the_server(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    for partial in (b"", b"GET / HT", b"GET / HTTP/1.1\r\nHost: a"):
        _, writer = await asyncio.open_connection("127.0.0.10", running.port)
        writer.write(partial)
        await writer.drain()
        writer.close()
        await writer.wait_closed()
    response = await get(client, running, running.seeds[0])
    assert response.status_code == 200


async def test_location_header_cannot_be_split_by_a_query(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    trap = running.base_url("trap.trove.test")
    response = await get(client, running, trap + "/redirect-private?to=/x%0d%0aX-Evil:%201")
    assert response.status_code == 302
    assert "x-evil" not in response.headers
    assert response.headers["location"] == "/xX-Evil: 1"


async def test_a_polite_crawl_of_the_served_web_fetches_exactly_the_expected_pages(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    web = running.web
    fetched: set[str] = set()
    for seed in running.seeds:
        host = urlsplit(seed).hostname or ""
        robots = protego.Protego.parse((await get(client, running, seed + "robots.txt")).text)
        queue, seen = deque([seed]), {seed}
        while queue:
            url = queue.popleft()
            if not robots.can_fetch(url, "TroveBot"):
                continue
            response = await get(client, running, url)
            assert response.status_code == 200, url
            if not response.headers["content-type"].startswith("text/html"):
                continue
            fetched.add(url)
            for link, nofollow in absolute_links(url, response.text):
                if urlsplit(link).hostname == host and not nofollow and link not in seen:
                    seen.add(link)
                    queue.append(link)
    assert fetched == web.expected_pages()
    requested = {running.url(r.host, r.path) for r in running.witness.requests()}
    assert not requested & web.disallowed_urls()
    assert web.disallowed_urls()


async def test_server_answers_every_request_of_many_keep_alive_connections(
    running: RunningSandbox,
) -> None:
    # Its speed is the benchmarks' to measure (bench_fetcher.py, the server's ceiling).
    per_connection, connections = 100, 24
    hosts = [urlsplit(seed).hostname or "" for seed in running.seeds]

    async def keep_alive_client(host: str) -> None:
        reader, writer = await asyncio.open_connection(running.resolve_map[host], running.port)
        request = f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
        try:
            for _ in range(per_connection):
                writer.write(request)
                head, body = await read_response(reader)
                assert head.startswith(b"HTTP/1.1 200 ")
                assert body.endswith(b"</html>\n")
        finally:
            writer.close()
            await writer.wait_closed()

    await asyncio.gather(*(keep_alive_client(hosts[k % len(hosts)]) for k in range(connections)))
    assert len(running.witness.requests()) == per_connection * connections


async def test_server_closes_cleanly_with_connections_open(
    web: SandboxWeb, client: httpx.AsyncClient
) -> None:
    async with serve_sandbox(web) as running:
        slow = asyncio.create_task(
            get(client, running, running.base_url("trap.trove.test") + "/slow-headers")
        )
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.10", running.port)
        await running.witness.wait_for(lambda w: len(w.requests()) == 1, 5.0)
    leftovers = [
        task
        for task in asyncio.all_tasks()
        if "trove_sandbox" in repr(task.get_coro()) and not task.done()
    ]
    assert leftovers == []
    with pytest.raises(httpx.HTTPError):
        await asyncio.wait_for(slow, 5.0)
    assert await asyncio.wait_for(idle_reader.read(), 5.0) == b""
    idle_writer.close()
    await idle_writer.wait_closed()
    with pytest.raises(OSError, match="onnect"):
        await asyncio.open_connection("127.0.0.10", running.port)


async def test_a_fixed_port_is_honoured_and_reusable(web: SandboxWeb) -> None:
    async with serve_sandbox(web) as first:
        port = first.port
    async with serve_sandbox(web, port=port) as second:
        assert second.port == port
        assert second.seeds[0] == f"http://{ALICE}:{port}/"


async def test_a_taken_port_is_reported(web: SandboxWeb) -> None:
    async with serve_sandbox(web) as first:
        other = SandboxWeb.generate(hosts=2)
        with pytest.raises(OSError, match="in use"):
            async with serve_sandbox(other, port=first.port):
                pass
