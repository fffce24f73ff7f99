"""End to end: discovery -> fetcher -> recorder, each its own process, on real NATS and Postgres."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gzip
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import nats
import psutil
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import StackUrls, eventually
from tests.fetcher._servers import Exchange, LocalServer
from tests.support import run_trove, sandbox_env, services
from trove_sandbox.server import serve_sandbox
from trove_sandbox.web import SandboxWeb
from trove_schema.topology import SEEDS_SUBJECT
from trove_stack.nats import server_in
from trove_stack.postgres import postmaster_in


def _without_port(url: str) -> tuple[str | None, str]:
    parts = urlsplit(url)
    return parts.hostname, parts.path


async def scalar(engine: AsyncEngine, sql: str, **params: Any) -> Any:
    async with engine.connect() as conn:
        return (await conn.execute(text(sql), params)).scalar_one()


@pytest.mark.usefixtures("clean")
async def test_a_plain_text_seed_published_like_the_nats_cli_is_crawled_and_recorded(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    web = SandboxWeb.generate(hosts=1, pages_per_host=2)
    async with serve_sandbox(web) as running:
        seed = running.seeds[0]
        async with services(stack, state_dir, sandbox_env(web, gap=0.2)) as local:
            nc = await nats.connect(stack.nats_url)
            await nc.publish(SEEDS_SUBJECT, seed.encode())  # raw bytes, no headers
            await nc.flush()
            await nc.close()

            async def status() -> str | None:
                local.check_alive()
                async with engine.connect() as conn:
                    row = (
                        await conn.execute(
                            text("SELECT status FROM pages WHERE url = :u"), {"u": seed}
                        )
                    ).one_or_none()
                return None if row is None else str(row[0])

            await eventually(
                status, until=lambda s: s == "fetched", timeout=60, what="seed fetched"
            )
    crawls = await scalar(
        engine,
        "SELECT count(*) FROM page_crawls c JOIN pages p ON p.id = c.page_id WHERE p.url = :u",
        u=seed,
    )
    assert crawls == 1
    title = await scalar(engine, "SELECT title FROM pages WHERE url = :u", u=seed)
    assert title


@pytest.mark.usefixtures("clean")
async def test_trove_crawl_fetches_and_records_every_sandbox_page(
    stack: StackUrls, engine: AsyncEngine, tmp_path: Path
) -> None:
    """What `make run` does, the sandbox served here and crawled by services joined to the
    session's servers (`--sandbox` takes no servers), so the tables can be read after."""
    web = SandboxWeb.generate()
    async with serve_sandbox(web) as running:
        env = {**on_the_stack(stack, tmp_path), **sandbox_env(web, gap=0.5)}
        code, report = await run_trove(
            "crawl", "--join", "--until-idle", "--timeout", "240", *running.seeds,
            env=env, timeout=300,
        )  # fmt: skip
    assert code == 0, report
    assert "Pages by status" in report
    assert "Crawls by outcome" in report

    # Every HTML page, and each host's feed: feeds linked from pages are fetched as pages.
    expected = web.expected_pages() | {web.url(h.name, "/feed.xml") for h in web.hosts}
    port_free = {_without_port(u) for u in expected}
    async with engine.connect() as conn:
        fetched = (
            (await conn.execute(text("SELECT url FROM pages WHERE status = 'fetched'")))
            .scalars()
            .all()
        )
        per_page = (
            await conn.execute(
                text(
                    # An exploring attempt that got nothing usable is rejected and
                    # the page fetched again: one fetch of the page, one request more.
                    "SELECT p.url, count(c.id) FILTER (WHERE c.outcome <> 'rejected') "
                    "FROM pages p LEFT JOIN page_crawls c "
                    "ON c.page_id = p.id WHERE p.status = 'fetched' GROUP BY p.url"
                )
            )
        ).all()
        links = (await conn.execute(text("SELECT count(*) FROM page_links"))).scalar_one()
        private = (
            await conn.execute(
                text(
                    "SELECT count(*) FROM page_crawls c JOIN pages p ON p.id = c.page_id "
                    "WHERE p.url LIKE '%/private/%' AND c.outcome <> 'blocked_robots'"
                )
            )
        ).scalar_one()
    assert len(fetched) == len(expected), report
    assert {_without_port(u) for u in fetched} == port_free
    assert all(n == 1 for _, n in per_page)
    assert links > len(expected)
    assert private == 0


async def sandbox_crawl(state: Path, *flags: str) -> asyncio.subprocess.Process:
    """`trove crawl --sandbox` as a user runs it (its own process), its state in ``state``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TROVE_")}
    env["TROVE_STATE_DIR"] = str(state)
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "trove_cli", "crawl", "--sandbox", *flags,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip


async def printed_until(proc: asyncio.subprocess.Process, start: str) -> bytes:
    """What ``proc`` printed up to the first line that begins with ``start``, included."""
    assert proc.stdout is not None
    printed, line = b"", b""
    while not line.lstrip().startswith(start.encode()):
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=120)
        assert line, f"trove crawl ended before {start!r}: {printed.decode()}"
        printed += line
    return printed


@pytest.mark.parametrize("ending", ["SIGTERM", "SIGHUP", "Ctrl-C twice", "SIGKILL"])
async def test_trove_crawl_stopped_leaves_no_process_behind(tmp_path: Path, ending: str) -> None:
    """The embedded stack and every service stop with the CLI: on SIGTERM, when its
    terminal closes (SIGHUP; the children have sessions of their own, so nothing else
    tells them), on a second Ctrl-C while it stops them, and when it is killed outright
    (SIGKILL, the OOM killer: its lifeline's watcher stops them)."""
    state = tmp_path / "state"
    proc = await sandbox_crawl(state, "--fresh")
    await printed_until(proc, "seeds:")

    def ours() -> list[int]:
        found = []
        for process in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error):
                if str(state) in " ".join(process.cmdline()) or (
                    process.environ().get("TROVE_STATE_DIR") == str(state)
                    and process.pid != proc.pid
                ):
                    found.append(process.pid)
        return found

    running = ours()
    assert len(running) >= 5, running  # nats-server, postgres, three services

    async def left() -> list[int]:
        return ours()

    if ending == "Ctrl-C twice":
        proc.send_signal(signal.SIGINT)
        # The second while the first is being handled: a process of the stack gone.
        await eventually(left, until=lambda pids: len(pids) < len(running), timeout=60)
        proc.send_signal(signal.SIGINT)
    elif ending == "SIGKILL":
        proc.kill()
    else:
        proc.send_signal(signal.SIGTERM if ending == "SIGTERM" else signal.SIGHUP)
    await asyncio.wait_for(proc.communicate(), timeout=60)
    await eventually(left, until=lambda pids: pids == [], timeout=60, what="everything stopped")


@pytest.mark.parametrize("server", ["nats-server", "Postgres"])
@pytest.mark.parametrize("after", ["seeds:", "crawled "], ids=["starting", "crawling"])
async def test_a_server_of_the_stack_that_dies_mid_crawl_is_named_as_the_cause(
    tmp_path: Path, server: str, after: str
) -> None:
    """The OOM killer, a full disk: the crawl ends saying which server exited, not with
    the connection that failed with it (or after two minutes of a client reconnecting),
    and without a screen of nats-py's tracebacks (one a reconnect, twice a second)."""
    state = tmp_path / "state"
    proc = await sandbox_crawl(state, "--fresh")
    printed = await printed_until(proc, after)
    pid = (
        server_in(state / "nats")
        if server == "nats-server"
        else postmaster_in((state / "postgres" / "data").resolve())
    )
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    rest, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    output = (printed + rest).decode()
    assert proc.returncode not in (0, None), output
    assert f"{server} exited (code -9" in output, output
    assert "Traceback" not in output, output


async def test_a_crawl_waiting_for_the_servers_a_killed_one_left_stops_on_ctrl_c(
    tmp_path: Path,
) -> None:
    """`make run` just after one killed outright waits for its lifeline's watcher to
    stop the servers it left, saying so; a Ctrl-C meanwhile ends it at once, not when
    the wait runs out (a wait in a thread held the command for it)."""
    state = (tmp_path / "state").resolve()
    (state / "nats").mkdir(parents=True)
    conf = state / "nats" / "nats-server.conf"
    conf.write_text("")
    # A process the folder's pid file names, with the folder's configuration on its
    # command line: a server left behind, as far as the start can tell.
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", str(conf)])
    (state / "nats" / "nats-server.pid").write_text(str(left.pid))
    try:
        proc = await sandbox_crawl(state)
        await printed_until(proc, "waiting for nats-server")
        proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.communicate(), timeout=15)
        assert proc.returncode == 130
    finally:
        left.kill()
        left.wait()


def on_the_stack(stack: StackUrls, tmp_path: Path) -> dict[str, str]:
    """`trove crawl --join`'s environment: the session's servers, a state folder of its own."""
    return {
        **os.environ,
        "TROVE_NATS_URL": stack.nats_url,
        "TROVE_DATABASE_URL": stack.database_url,
        "TROVE_STATE_DIR": str(tmp_path / "state"),
    }


@pytest.mark.usefixtures("clean")
@pytest.mark.parametrize(
    "until", [("--until-idle",), ("--max-pages", "50")], ids=["until idle", "up to 50 pages"]
)
async def test_a_crawl_whose_seeds_are_all_refused_ends_at_once(
    stack: StackUrls, tmp_path: Path, until: tuple[str, ...]
) -> None:
    """No page is ever queued: that is idle too, not an hour's wait for the timeout
    (nor for pages that will not come, under --max-pages)."""
    code, report = await run_trove(
        "crawl",
        "--join",
        *until,
        "--timeout",
        "600",
        "ftp://refused.example/",
        env=on_the_stack(stack, tmp_path),
        timeout=120,
    )
    assert code == 0, report
    assert "stopped after" not in report
    assert "no page was queued" not in report  # every seed refused: the report says why


@pytest.mark.usefixtures("clean")
async def test_a_crawl_of_seeds_an_earlier_crawl_knows_says_so_and_force_crawls_them(
    stack: StackUrls, tmp_path: Path
) -> None:
    """The same `make run SEEDS=...` twice on its kept state folder: discovery takes a
    URL once a cycle, so the second crawl queued nothing, and said nothing of why."""
    with LocalServer("127.0.0.176") as server:
        server.routes["/"] = lambda ex: ex.send(200, b"<title>home</title><p>words</p>")
        env = {
            **on_the_stack(stack, tmp_path),
            "TROVE_ALLOWED_NETWORKS": "127.0.0.176/32",
            "TROVE_MIN_DOMAIN_DELAY_SECONDS": "0.2",
        }

        async def crawl(*flags: str) -> str:
            code, report = await run_trove(
                "crawl", "--join", *flags, server.url(), env=env, timeout=120
            )
            assert code == 0, report
            return report

        first = await crawl()
        again = await crawl()
        assert len(server.requests_to("/")) == 1
        forced = await crawl("--force")
        assert len(server.requests_to("/")) == 2
    assert "no page was queued" not in first
    assert "no page was queued" in again
    assert "--force" in again
    assert "no page was queued" not in forced


def _send_page(exchange: Exchange, body: bytes) -> None:
    exchange.send(200, body)


def _local_env(stack: StackUrls, tmp_path: Path, networks: str) -> dict[str, str]:
    """A crawl of the test's own servers (``networks``), a fifth of a second apart."""
    return {
        **on_the_stack(stack, tmp_path),
        "TROVE_ALLOWED_NETWORKS": networks,
        "TROVE_MIN_DOMAIN_DELAY_SECONDS": "0.2",
    }


@pytest.mark.usefixtures("clean")
async def test_a_crawl_prints_its_seeds_without_their_credentials(
    stack: StackUrls, tmp_path: Path
) -> None:
    """A seed pasted with its userinfo was echoed whole on the ``seeds:`` line, into a
    terminal's scrollback and a CI log; no request carries it either."""
    with LocalServer("127.0.0.177") as server:
        server.routes["/"] = lambda ex: ex.send(200, b"<title>home</title><p>words</p>")
        env = _local_env(stack, tmp_path, "127.0.0.177/32")
        seed = server.url().replace("http://", "http://ada:s3cret@")
        code, report = await run_trove("crawl", "--join", seed, env=env, timeout=120)
        (request,) = server.requests_to("/")
    assert code == 0, report
    assert "seeds: http://***@127.0.0.177" in report
    assert "s3cret" not in report
    assert "authorization" not in request.headers


@pytest.mark.usefixtures("clean")
@pytest.mark.parametrize("posts_path", ["/posts.xml", "/posts.xml.gz"])
async def test_a_sitemap_seeded_brings_the_pages_it_lists_and_no_link_reaches(
    stack: StackUrls, tmp_path: Path, posts_path: str
) -> None:
    """An operator seeds a site's sitemap index: its sitemaps are read, gzipped or not,
    and the pages they list are crawled, though no page links to them; a URL of another
    host in it is scoped out as any link would be."""
    with LocalServer("127.0.0.178") as server, LocalServer("127.0.0.179") as other:
        other.routes["/elsewhere"] = lambda ex: ex.send(200, b"<title>elsewhere</title>")
        xml = "application/xml"
        ns = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
        index = f"<sitemapindex {ns}><sitemap><loc>{server.url(posts_path)}</loc></sitemap>"
        posts = (
            "".join(f"<url><loc>{server.url(f'/post/{n}')}</loc></url>" for n in range(3))
            + f"<url><loc>{other.url('/elsewhere')}</loc></url>"
        ).encode()
        packed = posts_path.endswith(".gz")
        server.routes["/sitemap.xml"] = lambda ex: ex.send(
            200, (index + "</sitemapindex>").encode(), content_type=xml
        )
        sitemap = f"<urlset {ns}>".encode() + posts + b"</urlset>"
        body, kind = (gzip.compress(sitemap), "application/gzip") if packed else (sitemap, xml)
        server.routes[posts_path] = lambda ex: ex.send(200, body, content_type=kind)
        for n in range(3):
            page = f"<title>post {n}</title><p>words of post {n}</p>".encode()
            server.routes[f"/post/{n}"] = functools.partial(_send_page, body=page)
        env = _local_env(stack, tmp_path, "127.0.0.178/31")
        code, report = await run_trove(
            "crawl", "--join", server.url("/sitemap.xml"), env=env, timeout=180
        )
        asked = {path: len(server.requests_to(path)) for path in server.routes}
        elsewhere = other.requests_to("/elsewhere")
    assert code == 0, report
    assert elsewhere == []
    assert asked == {"/sitemap.xml": 1, posts_path: 1, "/post/0": 1, "/post/1": 1, "/post/2": 1}


@pytest.mark.usefixtures("clean")
@pytest.mark.parametrize("home", ["nofollow", "busy"])
async def test_a_sitemap_its_robots_txt_lists_is_read_from_the_home_pages_visit(
    stack: StackUrls, tmp_path: Path, home: str
) -> None:
    """A site whose home page links nowhere else lists its pages in a sitemap named by
    its robots.txt: the home page's visit brings the sitemap, and the sitemap its pages.
    A home page that says nofollow keeps its own links unfollowed; one with more links
    than a page's are followed (here three) has its canonical (the same page under
    another name, written after its links) followed first, then the sitemap, then its
    first link."""
    with LocalServer("127.0.0.180") as server:
        ns = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
        pages = "".join(f"<url><loc>{server.url(f'/hidden/{n}')}</loc></url>" for n in range(2))
        server.routes["/robots.txt"] = lambda ex: ex.send(
            200,
            b"User-agent: *\nDisallow: /private/\nSitemap: /sitemap.xml\n",
            content_type="text/plain",
        )
        links = b'<a href="/linked">linked</a><a href="/linked/too">linked too</a>'
        robots = b'<meta name="robots" content="nofollow">' if home == "nofollow" else b""
        named = b'<link rel="canonical" href="/index.html">'
        server.routes["/"] = functools.partial(
            _send_page, body=b"<title>home</title>" + robots + b"<p>words</p>" + links + named
        )
        server.routes["/index.html"] = functools.partial(
            _send_page, body=b"<title>home</title>" + named + b"<p>words</p>"
        )
        for path in ("/linked", "/linked/too"):
            server.routes[path] = functools.partial(_send_page, body=b"<title>linked</title>")
        server.routes["/sitemap.xml"] = lambda ex: ex.send(
            200, f"<urlset {ns}>{pages}</urlset>".encode(), content_type="application/xml"
        )
        for n in range(2):
            page = f"<title>hidden {n}</title><p>words of page {n}</p>".encode()
            server.routes[f"/hidden/{n}"] = functools.partial(_send_page, body=page)
        env = _local_env(stack, tmp_path, "127.0.0.180/32")
        if home == "busy":
            env["TROVE_MAX_LINKS_PER_PAGE"] = "3"
        code, report = await run_trove("crawl", "--join", server.url("/"), env=env, timeout=180)
        asked = {path: len(server.requests_to(path)) for path in server.routes}
    assert code == 0, report
    assert asked == {
        "/robots.txt": 1,
        "/": 1,
        # A nofollow page's canonical is not followed (its redirect would be).
        "/index.html": 0 if home == "nofollow" else 1,
        "/linked": 0 if home == "nofollow" else 1,
        "/linked/too": 0,
        "/sitemap.xml": 1,
        "/hidden/0": 1,
        "/hidden/1": 1,
    }


@pytest.mark.usefixtures("clean")
async def test_a_crawl_until_idle_stopped_by_its_timeout_exits_1(
    stack: StackUrls, tmp_path: Path
) -> None:
    web = SandboxWeb.generate()
    async with serve_sandbox(web) as running:
        env = {**on_the_stack(stack, tmp_path), **sandbox_env(web, gap=0.5)}
        code, report = await run_trove(
            "crawl", "--join", "--until-idle", "--timeout", "1", *running.seeds,
            env=env, timeout=120,
        )  # fmt: skip
    assert code == 1, report
    assert "not idle yet" in report
