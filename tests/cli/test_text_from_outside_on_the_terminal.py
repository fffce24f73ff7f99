"""Text from a page or an instance that would act on a terminal (an OSC 8 link whose
text is another URL, an OSC 52 write to the clipboard, a screen cleared) reaches the
operator's terminal as text. Each test drives the real extraction (fetcher), the event
as the bus carries it (JSON round trip), the recorder's projection, and the command's
own output."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from tests.conftest import StackUrls
from trove_cli.instances import instances_command
from trove_cli.outside import visible
from trove_cli.report import build_report, render
from trove_cli.search import search_command
from trove_fetcher.extract import extract
from trove_fetcher.nodeinfo import software_of
from trove_recorder.projections import apply_batch
from trove_recorder.retries import RetryPolicy
from trove_schema.events import (
    CrawlCompleted,
    CrawlOutcome,
    Event,
    InstanceFollowed,
    Provenance,
    Scope,
    TimelinePolled,
    decode_event,
)

pytestmark = pytest.mark.usefixtures("clean")

URL = "https://evil.example/"
# OSC 8: a hyperlink whose text says one URL and whose target is another; OSC 52: write
# the operator's clipboard ("rm -rf ~" base64); CSI 2J: clear the screen.
HOSTILE_HTML = (
    b"<html><head><title>smallweb &#27;]8;;https://evil.example/x&#27;\\https://good.example/"
    b"&#27;]8;;&#27;\\ &#27;]52;c;cm0gLXJmIH4=&#27;\\&#27;[2J</title></head>"
    b"<body><p>smallweb crawler notes, a page about the small web and its crawlers.</p>"
    b"</body></html>"
)
POLICY = RetryPolicy(max_attempts=3, delay_seconds=60.0)


def terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=200, color_system="standard"), out


async def project(engine: AsyncEngine, *events: Event) -> None:
    for event in events:
        on_the_bus = decode_event(event.to_wire())
        async with async_sessionmaker(engine).begin() as session:
            await apply_batch(session, [on_the_bus], POLICY)


def crawled_page() -> CrawlCompleted:
    found = extract(HOSTILE_HTML, url=URL, content_type="text/html; charset=utf-8")
    assert "\x1b]52;" in (found.title or "")  # the fetcher keeps ESC in the title
    now = datetime.now(UTC)
    return CrawlCompleted(
        url=URL,
        domain="evil.example",
        scope=Scope(value="evil.example"),
        request_id="00000000-0000-0000-0000-000000000001",
        outcome=CrawlOutcome.SUCCESS,
        status_code=200,
        content_type="text/html",
        started_at=now - timedelta(milliseconds=100),
        completed_at=now,
        title=found.title,
        language="en",
        keywords=found.keywords,
        content_hash=found.content_hash,
    )


async def test_trove_search_prints_no_terminal_escape_from_a_page_title(
    stack: StackUrls, engine: AsyncEngine
) -> None:
    await project(engine, crawled_page())
    console, out = terminal()
    await search_command(stack.database_url, "smallweb", None, 20, console)
    printed = out.getvalue()
    assert "evil.example" in printed  # the hit is listed
    assert "\x1b]" not in printed, repr(printed)
    assert "␛]8;;" in printed  # shown, as a mark where it was


async def test_the_crawl_report_prints_no_terminal_escape_from_a_page_title(
    engine: AsyncEngine,
) -> None:
    event = crawled_page()
    await project(engine, event)
    report = await build_report(engine)
    # As the most linked/most shared tables show it: the title beside its URL.
    report.top_linked = [(URL, event.title, 3)]
    console, out = terminal()
    render(report, console)
    assert "\x1b]" not in out.getvalue(), repr(out.getvalue())


async def test_trove_instances_prints_no_terminal_escape_from_nodeinfo(
    stack: StackUrls, engine: AsyncEngine
) -> None:
    nodeinfo = {
        "version": "2.1",
        "software": {"name": "mastodon\x1b]52;c;cm0gLXJmIH4=\x1b\\", "version": "4.3\x1b[2J"},
    }
    software = software_of(nodeinfo)
    assert software is not None
    now = datetime.now(UTC)
    followed = InstanceFollowed(
        instance="https://social.example",
        domain="social.example",
        timeline="local",
        occurred_at=now - timedelta(hours=1),
        provenance=Provenance(kind="seed", origin="test"),
    )
    poll = TimelinePolled(
        request_id="00000000-0000-0000-0000-000000000002",
        instance=followed.instance,
        domain=followed.domain,
        timeline=followed.timeline,
        follow_id=followed.id,
        poll=1,
        outcome=CrawlOutcome.SUCCESS,
        started_at=now - timedelta(seconds=2),
        completed_at=now - timedelta(seconds=1),
        software=software.name,
        software_version=software.version,
    )
    await project(engine, followed, poll)
    console, out = terminal()
    await instances_command(stack.database_url, console)
    printed = out.getvalue()
    assert "social.example" in printed
    assert "\x1b]52" not in printed, repr(printed)
    assert "\x1b[2J" not in printed, repr(printed)
    assert "␛]52;c;" in printed  # shown, as a mark where it was


def test_every_character_a_terminal_acts_on_is_shown_as_a_mark() -> None:
    assert visible("a\x1b[2Jb\x9b31m\u202eevil\u2066\x7f") == "a␛[2Jb\\u009b31m\\u202eevil\\u2066␡"
    assert visible("tab\tand newline\n stay; ünïcödé too") == "tab\tand newline\n stay; ünïcödé too"
