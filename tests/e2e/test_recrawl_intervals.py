"""Re-crawl intervals that follow each page's changes: discovery and fetchers as processes.

Time is scaled down to seconds: the first interval is 1 s, the bounds 0.5 s and 2 s. The
``changing`` host of the learning web serves one page that changes ten times a second
(every visit finds it changed) and one that never changes (every conditional visit is
answered 304). The witness is the server's own log.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import nats
import pytest

from tests.conftest import StackUrls, eventually
from tests.support import services
from trove_sandbox.learning import CHANGE_PERIODS, LearningWeb, serve_learning_web
from trove_sandbox.server import WitnessRecord
from trove_schema.bus import Bus
from trove_schema.events import CrawlRequested, RequestReason, decode_event
from trove_schema.topology import CRAWL_REQUESTED, EVENTS_STREAM, SEEDS_SUBJECT
from trove_schema.urls import canonicalize

FIRST, MINIMUM, MAXIMUM = 1.0, 0.5, 2.0
#: The learning web's "hourly" period, in seconds.
HOURLY = CHANGE_PERIODS["hourly"] or 3600.0


async def recrawl_requests(bus: Bus, url: str) -> list[CrawlRequested]:
    """The re-crawl requests of ``url`` that fired, in order."""
    info = await bus.js.stream_info(EVENTS_STREAM)
    found: list[CrawlRequested] = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            msg = await bus.js.get_msg(EVENTS_STREAM, seq)
        except Exception:  # noqa: S112 - deleted sequence (a schedule that fired)
            continue
        if msg.subject == CRAWL_REQUESTED and msg.data:
            event = decode_event(msg.data)
            assert isinstance(event, CrawlRequested)
            if event.url == url and event.reason is RequestReason.RECRAWL:
                found.append(event)
    return found


@pytest.mark.usefixtures("clean")
async def test_a_page_changing_at_every_visit_is_recrawled_sooner_than_one_that_never_changes(
    stack: StackUrls, bus: Bus, state_dir: Path
) -> None:
    # Ten changes a second on the "hourly" pages; the "never" pages keep their content.
    web = LearningWeb(pages=1, time_scale=HOURLY * 10)
    env = {
        "TROVE_RESOLVE": web.resolve_setting(),
        "TROVE_ALLOWED_NETWORKS": "127.0.0.0/8",
        "TROVE_MIN_DOMAIN_DELAY_SECONDS": "0.1",
        "TROVE_MAX_DEPTH": "0",
        "TROVE_RECRAWL_AFTER_SECONDS": str(FIRST),
        "TROVE_RECRAWL_MIN_SECONDS": str(MINIMUM),
        "TROVE_RECRAWL_MAX_SECONDS": str(MAXIMUM),
        # Longer than the test: no visit is the whole read that comes once a seen TTL.
        "TROVE_SEEN_TTL_SECONDS": "600",
    }
    async with (
        serve_learning_web(web) as running,
        services(stack, state_dir, env, only=("discovery", "fetcher")) as local,
    ):
        changing, still = web.url("changing", "/c/hourly/0"), web.url("changing", "/c/never/0")
        nc = await nats.connect(stack.nats_url)
        await nc.publish(SEEDS_SUBJECT, f"{changing}\n{still}".encode())
        await nc.flush()
        await nc.close()

        def visits(path: str) -> list[WitnessRecord]:
            return [r for r in running.witness.requests(web.host("changing")) if r.path == path]

        async def progress() -> tuple[int, float | None]:
            local.check_alive()
            fired = await recrawl_requests(bus, canonicalize(changing))
            latest = fired[-1].history if fired else None
            return len(visits("/c/never/0")), latest.interval if latest else None

        # The unchanged page fetched four times (then 1 s, 2 s and 2 s apart), and the
        # changing page's interval down to the minimum.
        await eventually(
            progress,
            until=lambda p: p[0] >= 4 and p[1] == MINIMUM,
            timeout=40,
            interval=0.5,
            what="four fetches of the still page, the changing one at the minimum",
        )
        fast, slow = visits("/c/hourly/0"), visits("/c/never/0")
        requested = {
            url: await recrawl_requests(bus, canonicalize(url)) for url in (changing, still)
        }

    # The intervals the requests carried: the unchanged page drifts to the maximum,
    # doubling a visit; the changing page comes down to the minimum.
    slow_intervals = [(r.history and r.history.interval) or 0.0 for r in requested[still]]
    fast_intervals = [(r.history and r.history.interval) or 0.0 for r in requested[changing]]
    assert slow_intervals[:3] == [FIRST, 2 * FIRST, MAXIMUM], slow_intervals
    assert fast_intervals[0] == FIRST, fast_intervals
    assert fast_intervals[-1] == MINIMUM, fast_intervals
    # The server saw them: no fetch before its interval was up (each counts from the
    # end of the fetch before; a fetch may be later, waiting for the host's gap), and
    # the changing page fetched far more often meanwhile.
    for pages, intervals in ((slow, slow_intervals), (fast, fast_intervals)):
        gaps = [b.monotonic - a.monotonic for a, b in itertools.pairwise(pages)]
        assert all(g >= i for g, i in zip(gaps, intervals, strict=False)), (gaps, intervals)
    assert len(fast) >= len(slow) + 3, (len(fast), len(slow))
    assert fast[-1].monotonic - fast[-2].monotonic < slow[-1].monotonic - slow[-2].monotonic

    # Every re-crawl of the unchanged page asked with its validators and got 304.
    assert slow[0].status == 200
    assert slow[0].if_none_match is None
    for later in slow[1:]:
        assert later.if_none_match is not None or later.if_modified_since is not None
        assert later.status == 304, later

    # The requests carried the history the intervals came from.
    still_history = requested[still][-1].history
    assert still_history is not None
    assert still_history.visits
    assert not any(changed for _, changed in still_history.visits)
    assert still_history.interval == MAXIMUM
    changing_history = requested[changing][-1].history
    assert changing_history is not None
    assert len(changing_history.visits) >= 4
    assert all(changed for _, changed in changing_history.visits)
    assert changing_history.interval == MINIMUM
