"""The learning web over real HTTP: each host behaves the one way its name says."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from trove_sandbox.learning import (
    LearningWeb,
    RunningLearningWeb,
    serve_learning_web,
)

AP = "application/activity+json"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def served() -> AsyncIterator[RunningLearningWeb]:
    web = LearningWeb(pages=10, clock=Clock(), time_scale=3600.0, flaky_stall=0.2)
    async with serve_learning_web(web) as running:
        yield running


async def get(served: RunningLearningWeb, kind: str, path: str, **headers: str) -> httpx.Response:
    web = served.web
    async with httpx.AsyncClient(timeout=5.0) as client:
        return await client.get(
            f"http://{web.ip(kind)}:{served.port}{path}",
            headers={"Host": f"{web.host(kind)}:{served.port}", **headers},
        )


async def test_spa_host_serves_a_shell_as_html_and_the_article_as_activity_json(
    served: RunningLearningWeb,
) -> None:
    shell = await get(served, "spa", "/a/3", Accept="text/html")
    assert shell.status_code == 200
    assert "<div id='root'></div>" in shell.text
    assert "<p>" not in shell.text
    note = await get(served, "spa", "/a/3", Accept=AP)
    assert note.headers["content-type"].startswith(AP)
    body = json.loads(note.text)
    assert body["type"] == "Note"
    assert body["content"].count("<p>") >= 6
    assert body["id"].endswith("/a/3")


async def test_html_host_ignores_accept_and_sends_its_page(served: RunningLearningWeb) -> None:
    page = await get(served, "html", "/a/1", Accept=AP)
    assert page.headers["content-type"].startswith("text/html")
    assert page.text.count("<p>") == 6


async def test_pdf_host_sends_a_well_formed_pdf(served: RunningLearningWeb) -> None:
    doc = await get(served, "pdf", "/docs/2.pdf")
    assert doc.headers["content-type"] == "application/pdf"
    assert doc.content.startswith(b"%PDF-1.4")
    assert doc.content.rstrip().endswith(b"%%EOF")
    start = int(doc.content.rsplit(b"startxref\n", 1)[1].split(b"\n", 1)[0])
    assert doc.content[start:].startswith(b"xref")


async def test_challenge_host_answers_everything_with_a_challenge(
    served: RunningLearningWeb,
) -> None:
    for path in ("/robots.txt", "/a/1"):
        page = await get(served, "challenge", path)
        assert page.status_code == 403
        assert page.headers["cf-mitigated"] == "challenge"
        assert "cloudflare" in page.headers["server"]


async def test_ratelimit_host_sends_429_until_released(served: RunningLearningWeb) -> None:
    assert "retry-after" not in (await get(served, "ratelimit", "/a/1")).headers
    served.web.retry_after = 7
    limited = await get(served, "ratelimit", "/a/1")
    assert (limited.status_code, limited.headers["retry-after"]) == (429, "7")
    served.web.limiting = False
    assert (await get(served, "ratelimit", "/a/1")).status_code == 200


async def test_paced_host_lets_one_request_through_a_window_robots_txt_counted(
    served: RunningLearningWeb,
) -> None:
    served.web.pace_window = 3_600.0
    assert (await get(served, "paced", "/robots.txt")).status_code == 200
    refused = await get(served, "paced", "/a/1")
    assert (refused.status_code, "retry-after" in refused.headers) == (429, False)
    served.web.pace_window = 0.0
    assert (await get(served, "paced", "/a/1")).status_code == 200


async def test_down_host_resets_the_connection_until_it_is_back(
    served: RunningLearningWeb,
) -> None:
    with pytest.raises(httpx.TransportError):
        await get(served, "down", "/a/1")
    served.web.down_now = False
    assert (await get(served, "down", "/a/1")).status_code == 200


async def test_flaky_host_fails_about_its_share_of_requests(served: RunningLearningWeb) -> None:
    failures = 0
    for _ in range(40):
        try:
            async with httpx.AsyncClient(timeout=0.1) as client:
                web = served.web
                page = await client.get(
                    f"http://{web.ip('flaky')}:{served.port}/a/1",
                    headers={"Host": web.host("flaky")},
                )
            assert page.status_code == 200
        except httpx.TransportError:
            failures += 1
    assert 4 <= failures <= 22  # 30% of 40 is 12


async def test_slow_host_answers_after_its_delay(served: RunningLearningWeb) -> None:
    served.web.slow_delay = 0.3
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert (await get(served, "slow", "/a/1")).status_code == 200
    assert loop.time() - started >= 0.3


async def test_drift_host_becomes_a_shell(served: RunningLearningWeb) -> None:
    assert "<p>" in (await get(served, "drift", "/a/1")).text
    served.web.drifted = True
    assert "<p>" not in (await get(served, "drift", "/a/1")).text
    assert json.loads((await get(served, "drift", "/a/1", Accept=AP)).text)["type"] == "Note"


async def test_alias_spellings_name_one_canonical_page_and_list_pages_differ(
    served: RunningLearningWeb,
) -> None:
    plain = await get(served, "aliases", "/p/4/")
    for spelling in ("/p/4/index.html", "/p/4/?ref=x", "/p/4/?from=sidebar", "/p/4/?share=m"):
        variant = await get(served, "aliases", spelling)
        assert variant.content == plain.content
    assert '<link rel="canonical" href="/p/4/">' in plain.text
    first, second = (
        await get(served, "aliases", "/list?page=1"),
        await get(served, "aliases", "/list?page=2"),
    )
    assert first.status_code == second.status_code == 200
    assert first.content != second.content


async def test_changing_pages_change_at_their_rate_and_answer_304_when_unchanged(
    served: RunningLearningWeb,
) -> None:
    web = served.web
    clock = web.clock
    assert isinstance(clock, Clock)
    first = await get(served, "changing", "/c/never/1")
    again = await get(served, "changing", "/c/never/1", **{"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304
    # time_scale 3600: "hourly" changes about once a second of the clock.
    changes = []
    for _ in range(50):
        before = web.version("hourly", 2)[0]
        clock.now += 1.0
        changes.append(web.version("hourly", 2)[0] - before)
    assert 30 <= sum(changes) <= 75
    hourly = await get(served, "changing", "/c/hourly/2")
    clock.now += 20.0
    later = await get(
        served, "changing", "/c/hourly/2", **{"If-None-Match": hourly.headers["etag"]}
    )
    assert later.status_code == 200
    assert later.content != hourly.content
    assert web.true_rate("hourly") == pytest.approx(1.0)


async def test_mixed_host_serves_every_third_page_as_a_shell(served: RunningLearningWeb) -> None:
    assert "<p>" not in (await get(served, "mixed", "/a/3")).text
    assert "<p>" in (await get(served, "mixed", "/a/4")).text
    assert json.loads((await get(served, "mixed", "/a/6", Accept=AP)).text)["type"] == "Note"
