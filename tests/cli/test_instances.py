"""``trove follow``, ``trove unfollow``, ``trove instances`` and the report's shared pages,
on real NATS and Postgres (the tables written by the recorder's own projection)."""

from __future__ import annotations

import io
import ipaddress
import json
import os
import time
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any

import pytest
from nats.js.errors import NotFoundError
from rich.console import Console
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from tests.conftest import StackUrls, eventually
from tests.support import query, run_trove, sandbox_env, services
from trove_cli import instances as instances_module
from trove_cli.instances import (
    follow_command,
    instances_command,
    list_instances,
    render_instances,
    timelines_never_polled,
)
from trove_cli.report import build_report, render
from trove_cli.search import search
from trove_recorder.projections import apply_batch
from trove_recorder.retries import RetryPolicy
from trove_sandbox.fediverse import FediverseInstance, serve_instance
from trove_sandbox.server import serve_sandbox
from trove_sandbox.web import SandboxWeb
from trove_schema.bus import Bus
from trove_schema.events import (
    CrawlOutcome,
    Event,
    InstanceFollowed,
    InstanceUnfollowed,
    Provenance,
    SharedPost,
    TimelinePolled,
    decode_event,
)
from trove_schema.topology import FOLLOW_SUBJECT, INSTANCE_FOLLOWED, SEEDS_STREAM

pytestmark = pytest.mark.usefixtures("clean")

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def follow(instance: str, timeline: str = "local") -> InstanceFollowed:
    return InstanceFollowed(
        instance=instance,
        domain=instance.split("/")[2],
        timeline=timeline,
        occurred_at=NOW - timedelta(hours=2),
        provenance=Provenance(kind="seed", origin="test"),
    )


def polled(
    followed: InstanceFollowed,
    poll: int,
    posts: tuple[SharedPost, ...] = (),
    outcome: CrawlOutcome = CrawlOutcome.SUCCESS,
    **fields: Any,
) -> TimelinePolled:
    ended = NOW - timedelta(minutes=60 - poll)
    return TimelinePolled(
        request_id=f"00000000-0000-0000-0000-{poll:012d}",
        instance=followed.instance,
        domain=followed.domain,
        timeline=followed.timeline,
        follow_id=followed.id,
        poll=poll,
        outcome=outcome,
        started_at=ended - timedelta(seconds=1),
        completed_at=ended,
        posts=posts,
        **({"requests": 1} | fields),  # a poll deferred for its host's slot asks nothing
    )


def post(instance: str, n: int, *links: str) -> SharedPost:
    return SharedPost(
        uri=f"{instance}/users/ada/statuses/{n}", account="ada@social.example", links=links
    )


async def project(engine: AsyncEngine, events: list[Event]) -> None:
    async with async_sessionmaker(engine).begin() as session:
        await apply_batch(session, events, RetryPolicy(max_attempts=3, delay_seconds=60.0))


async def five_timelines(engine: AsyncEngine) -> None:
    """A timeline in each state ``trove instances`` tells apart."""
    ok = follow("https://ok.example")
    paused = follow("https://paused.example")
    failing = follow("https://failing.example", "tag:smallweb")
    gone = follow("https://gone.example", "public")
    fresh = follow("https://fresh.example")
    slowed = follow("https://slowed.example")
    await project(
        engine,
        [
            ok,
            paused,
            failing,
            gone,
            fresh,
            slowed,
            polled(
                ok,
                1,
                (post(ok.instance, 1, "https://a.example/", "https://b.example/"),),
                skipped=2,
                software="gotosocial",
                software_version="0.17.1",
            ),
            polled(ok, 2, (post(ok.instance, 2, "https://a.example/"),)),
            polled(
                paused,
                1,
                outcome=CrawlOutcome.BLOCKED_4XX,
                status_code=429,
                error_message="HTTP 429",
                retry_after=7200.0,
            ),
            polled(failing, 1, software="akkoma", software_version="3.13"),
            polled(
                failing,
                2,
                outcome=CrawlOutcome.REJECTED,
                error_message="the API answered HTML, not JSON",
            ),
            polled(failing, 3, outcome=CrawlOutcome.TIMEOUT),
            polled(gone, 1),
            # What it read is kept; the rate limit stopped it before the next page.
            polled(
                slowed,
                1,
                (post(slowed.instance, 9, "https://c.example/"),),
                error_message="rate limit nearly spent",
                retry_after=3600.0,
                more=True,
            ),
            InstanceUnfollowed(
                instance=gone.instance,
                domain=gone.domain,
                occurred_at=NOW - timedelta(minutes=30),
                provenance=Provenance(kind="seed", origin="test"),
            ),
        ],
    )


async def test_instances_show_software_counts_and_state(engine: AsyncEngine) -> None:
    await five_timelines(engine)

    found = {t.instance: t for t in await list_instances(engine)}
    out = io.StringIO()
    render_instances(list(found.values()), Console(file=out, width=250), now=NOW)
    cells = [[c for c in line.split() if c != "│"] for line in out.getvalue().splitlines()[3:]]
    rows = {row[0]: row for row in cells}

    ok = found["https://ok.example"]
    assert (ok.software_label, ok.polls, ok.posts_seen, ok.links_found, ok.skipped) == (
        "gotosocial 0.17.1",
        2,
        2,
        3,
        2,
    )
    assert ok.state(NOW) == "ok"
    assert rows["https://ok.example"] == [
        "https://ok.example",
        "local",
        "gotosocial",
        "0.17.1",
        "2026-11-23",
        "11:02:00",
        "2",
        "2",
        "3",
        "2",
        "ok",
    ]
    assert found["https://paused.example"].state(NOW) == "failing since 2026-11-23 11:01:00: " + (
        "HTTP 429, paused until 2026-11-23 13:01:00"
    )
    assert (
        found["https://failing.example"].state(NOW)
        == "failing since 2026-11-23 11:02:00: timeout"  # the first failure; the last reason
    )
    assert found["https://failing.example"].software_label == "akkoma 3.13"
    assert found["https://gone.example"].state(NOW) == "unfollowed 2026-11-23 11:30:00"
    assert found["https://fresh.example"].state(NOW) == "waiting for its first poll"
    assert found["https://fresh.example"].software_label == "?"
    assert found["https://slowed.example"].state(NOW) == (
        "paused until 2026-11-23 12:01:00: rate limit nearly spent"
    )
    assert found["https://slowed.example"].state(NOW + timedelta(minutes=2)) == (
        "ok: rate limit nearly spent"
    )
    # Followed timelines first, the unfollowed one last.
    assert list(rows)[-1] == "https://gone.example"
    # What `trove crawl --follow` waits for: a first poll (spelled as the operator did).
    never = ["HTTPS://OK.example/", "https://fresh.example", "https://unknown.example"]
    assert await timelines_never_polled(engine, never) == 2


async def test_trove_instances_command_prints_the_table(
    stack: StackUrls, engine: AsyncEngine, tmp_path: Path
) -> None:
    await five_timelines(engine)
    env = {
        **os.environ,
        "TROVE_DATABASE_URL": stack.database_url,
        "TROVE_NATS_URL": stack.nats_url,
        "TROVE_STATE_DIR": str(tmp_path / "state"),
        "COLUMNS": "250",
    }

    code, printed = await run_trove("instances", env=env)

    assert code == 0, printed
    assert "6 followed timeline(s), times in UTC" in printed
    row = next(line for line in printed.splitlines() if "https://failing.example" in line)
    assert row.split()[:4] == ["https://failing.example", "│", "tag:smallweb", "│"]
    assert "akkoma 3.13" in row
    assert "failing since 2026-11-23 11:02:00: timeout" in row


async def test_trove_instances_reads_a_pause_on_nats_servers_clock_not_this_machines(
    stack: StackUrls, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A poll's times are nats-server's (the fetchers stamp them so; one machine here:
    # the real clock is the server's). A machine an hour ahead must not show a timeline
    # its instance paused for ten more minutes as no longer paused.
    paused = follow("https://paused.example")
    real = datetime.now(UTC)
    limited = polled(
        paused, 1, outcome=CrawlOutcome.BLOCKED_4XX, status_code=429, retry_after=600.0
    ).model_copy(update={"started_at": real - timedelta(seconds=2), "completed_at": real})
    await project(engine, [paused, limited])

    class HourAhead(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> HourAhead:
            return cls.fromtimestamp(time.time() + 3600, tz)

    monkeypatch.setattr(instances_module, "datetime", HourAhead)
    out = io.StringIO()

    code = await instances_command(stack.database_url, Console(file=out, width=250), stack.nats_url)

    assert code == 0
    row = next(line for line in out.getvalue().splitlines() if "paused.example" in line)
    assert "paused until" in row, row


async def test_the_report_lists_the_most_shared_pages(engine: AsyncEngine) -> None:
    one, two = follow("https://one.example"), follow("https://two.example", "public")
    await project(
        engine,
        [
            one,
            two,
            polled(
                one,
                1,
                (
                    post(one.instance, 1, "https://a.example/", "https://b.example/"),
                    post(one.instance, 2, "https://a.example/"),
                ),
            ),
            # The same post seen again on another instance is not another share.
            polled(two, 1, (post(one.instance, 2, "https://a.example/"),)),
            polled(two, 2, (post(two.instance, 3, "https://a.example/"),)),
        ],
    )

    report = await build_report(engine)

    assert report.top_shared == [
        ("https://a.example/", None, 3, 2),
        ("https://b.example/", None, 1, 1),
    ]
    out = io.StringIO()
    render(report, Console(file=out, width=200))
    printed = out.getvalue()
    assert "Most shared pages (fediverse)" in printed
    assert "2 fediverse timeline(s) followed: 4 posts read, 5 links shared, 0 posts" in printed
    row = next(line for line in printed.splitlines() if "https://a.example/" in line)
    assert row.split()[-3:] == ["3", "│", "2"]


async def test_a_follow_sent_while_no_discovery_runs_waits_in_the_stream(
    stack: StackUrls, bus: Bus
) -> None:
    out = io.StringIO()

    code = await follow_command(
        stack.nats_url,
        Console(file=out, width=200),
        instance="https://social.example",
        timeline="tag:smallweb",
        max_depth=2,
        timeout=0.5,
    )

    assert code == 0
    assert "no answer from discovery within 0.5 s" in out.getvalue()
    stored = await bus.js.get_last_msg(SEEDS_STREAM, FOLLOW_SUBJECT)
    assert stored.data is not None
    assert json.loads(stored.data) == {
        "instance": "https://social.example",
        "timeline": "tag:smallweb",
        "max_depth": 2,
    }


async def test_trove_follow_and_unfollow_get_discovery_s_answer(
    stack: StackUrls, bus: Bus, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "TROVE_NATS_URL": stack.nats_url,
        "TROVE_DATABASE_URL": stack.database_url,
        "TROVE_STATE_DIR": str(tmp_path / "cli"),
    }
    async with services(stack, tmp_path / "state", {}, only=("discovery",)):
        # A refusal follows nothing; asked until discovery listens (a request sent
        # before that times out, and is handled from the stream later).
        out = io.StringIO()
        console = Console(file=out, width=200)

        async def refusal() -> int:
            return await follow_command(
                stack.nats_url, console, instance="https://social.example/a/path", timeline=None,
                timeout=1.0,
            )  # fmt: skip

        await eventually(refusal, until=lambda code: code == 1, timeout=30, what="a refusal")
        assert "refused 'https://social.example/a/path': " in out.getvalue()

        code, printed = await run_trove(
            "follow", "https://social.example", "--timeline", "public", "--max-depth", "1", env=env
        )
        assert code == 0, printed
        assert "following https://social.example (public)" in printed

        async def followed() -> InstanceFollowed | None:
            try:
                msg = await bus.js.get_last_msg("TROVE_EVENTS", INSTANCE_FOLLOWED)
            except NotFoundError:
                return None
            assert msg.data is not None
            event = decode_event(msg.data)
            assert isinstance(event, InstanceFollowed)
            return event

        event = await eventually(
            followed, until=lambda e: e is not None, timeout=30, what="InstanceFollowed"
        )
        assert event is not None
        assert (event.instance, event.timeline, event.max_depth) == (
            "https://social.example",
            "public",
            1,
        )

        code = await follow_command(
            stack.nats_url, console, instance="https://social.example", timeline=None, unfollow=True
        )
        assert code == 0
        assert "no longer following https://social.example (every timeline)" in out.getvalue()


async def test_a_followed_sandbox_instance_fills_shares_instances_and_search(
    stack: StackUrls, engine: AsyncEngine, state_dir: Path
) -> None:
    web = SandboxWeb.generate(hosts=2, pages_per_host=3)
    ip = str(ipaddress.IPv4Address(web.hosts[-1].ip) + 1)
    instance = FediverseInstance.generate(web=web, posts=16, ip=ip)
    env = sandbox_env(web, 0.2)
    env["TROVE_RESOLVE"] += f",{instance.host}={instance.ip}"
    env["TROVE_ALLOWED_NETWORKS"] += f",{instance.ip}/32"
    async with (
        serve_sandbox(web) as running,
        serve_instance(instance, port=running.port, witness=running.witness),
        services(stack, state_dir, env),
    ):
        out = io.StringIO()

        async def follow_it() -> str:
            await follow_command(
                stack.nats_url, Console(file=out), instance=instance.origin, timeline=None,
                timeout=1.0,
            )  # fmt: skip
            return out.getvalue()

        # Asked until discovery listens; the requests before it are followed from the
        # stream, and following a followed timeline again changes nothing.
        await eventually(follow_it, until=lambda said: "following" in said, timeout=30)
        expected = instance.expected_links()
        assert max(expected.values(), default=0) > 1  # the sandbox shares some pages twice

        async def shared() -> dict[str, int]:
            rows = await query(
                engine, "SELECT url, count(*) AS n FROM page_shares GROUP BY url ORDER BY url"
            )
            return {r.url: r.n for r in rows}

        await eventually(shared, until=lambda s: s == expected, timeout=60, what="page shares")
        top = max(expected, key=lambda url: (expected[url], url))

        async def fetched() -> str | None:
            rows = await query(
                engine, "SELECT title FROM pages WHERE url = :u AND status = 'fetched'", u=top
            )
            return rows[0].title if rows else None

        title = await eventually(fetched, until=bool, timeout=60, what="the top page fetched")

    opted_out = {instance.status_uri(s) for s in instance.opted_out_posts()}
    assert opted_out  # the sandbox has opted-out accounts: none of their posts is a share
    rows = await query(engine, "SELECT DISTINCT post_uri FROM page_shares")
    assert not opted_out & {r.post_uri for r in rows}
    (followed,) = await list_instances(engine)
    assert (followed.instance, followed.timeline, followed.software_label) == (
        instance.origin,
        "local",
        "mastodon 4.3.0",
    )
    assert followed.posts_seen >= len(instance.links_by_post())
    assert followed.skipped >= len(instance.opted_out_posts())
    hits = await search(engine, title or "", limit=50)
    (hit,) = [h for h in hits if h.url == top]
    assert hit.shares == expected[top]
