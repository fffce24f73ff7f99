"""The sandbox fediverse instance over real HTTP: NodeInfo, timelines, ActivityPub, hooks."""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.sandbox.test_main import start_cli, stop_cli
from trove_sandbox import RunningSandbox, SandboxWeb, serve_sandbox
from trove_sandbox.fediverse import (
    HUGE_API_BYTES,
    FediverseInstance,
    RunningInstance,
    serve_instance,
)

TIMELINE = "/api/v1/timelines/public"
AP = "application/activity+json"


@pytest.fixture
async def social(running: RunningSandbox) -> AsyncIterator[RunningInstance]:
    """The instance beside the sandbox web: same port, one witness, links to that web."""
    instance = FediverseInstance.generate(web=running.web, posts=60, seed=7)
    async with serve_instance(instance, port=running.port, witness=running.witness) as served:
        yield served


async def fetch(
    client: httpx.AsyncClient, social: RunningInstance, url: str, accept: str | None = None
) -> httpx.Response:
    """GET ``url`` (a path or a URL on the instance) by IP, naming the instance in Host."""
    parts = urlsplit(url)
    if parts.netloc:
        assert parts.hostname == social.host, f"{url} leaves the instance"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    headers = {"Host": f"{social.host}:{social.port}"}
    if accept is not None:
        headers["Accept"] = accept
    return await client.get(social.ip_url(target), headers=headers)


async def walk(
    client: httpx.AsyncClient, social: RunningInstance, start: str, rel: str, pages: int = 50
) -> list[list[dict[str, Any]]]:
    """Follow the ``rel`` Link from ``start`` until a page has none (or is empty)."""
    found: list[list[dict[str, Any]]] = []
    url: str | None = start
    while url is not None:
        assert len(found) < pages, "pagination did not end"
        response = await fetch(client, social, url)
        assert response.status_code == 200
        page = response.json()
        if not page:
            break
        found.append(page)
        url = response.links.get(rel, {}).get("url")
    return found


def ids(page: list[dict[str, Any]]) -> list[str]:
    return [status["id"] for status in page]


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.anchors: list[tuple[str, str]] = []
        self.text: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        if tag == "a":
            self.anchors.append((values.get("href", ""), values.get("class", "")))
        if tag in ("title", "script", "style"):
            self._skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("title", "script", "style"):
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip and data.strip():
            self.text.append(data.strip())


def parse(html_text: str) -> _Anchors:
    parser = _Anchors()
    parser.feed(html_text)
    parser.close()
    return parser


def shared_by(status: dict[str, Any], instance_host: str) -> list[str]:
    """What a follower takes from an API status: content links that are not mentions,
    hashtags or the instance's own pages, then the card's URL."""
    urls = [
        href
        for href, classes in parse(status["content"]).anchors
        if "mention" not in classes.split() and urlsplit(href).hostname != instance_host
    ]
    if status["card"] is not None:
        urls.append(status["card"]["url"])
    return list(dict.fromkeys(urls))


async def test_nodeinfo_is_found_through_the_well_known_document(
    social: RunningInstance, client: httpx.AsyncClient
) -> None:
    well_known = await fetch(client, social, "/.well-known/nodeinfo")
    assert well_known.status_code == 200
    links = {link["rel"].rsplit("/", 1)[1]: link["href"] for link in well_known.json()["links"]}
    assert set(links) == {"2.0", "2.1"}
    assert links["2.0"] == social.url("/nodeinfo/2.0")
    document = await fetch(client, social, links["2.0"])
    assert document.headers["content-type"].startswith("application/json")
    body = document.json()
    assert body["version"] == "2.0"
    assert body["software"] == {"name": "mastodon", "version": "4.3.0"}
    assert body["protocols"] == ["activitypub"]
    assert body["openRegistrations"] is False
    assert body["usage"]["users"]["total"] == sum(1 for a in social.instance.accounts if a.local)
    newer = (await fetch(client, social, links["2.1"])).json()
    assert newer["software"]["repository"].endswith("/mastodon")
    v2 = (await fetch(client, social, "/api/v2/instance")).json()
    assert v2["domain"] == social.host
    assert v2["version"] == "4.3.0"
    v1 = (await fetch(client, social, "/api/v1/instance")).json()
    assert v1["uri"] == social.host
    assert v1["stats"]["status_count"] == body["usage"]["localPosts"]


async def test_max_id_paging_walks_every_public_post_once_newest_first(
    social: RunningInstance, client: httpx.AsyncClient
) -> None:
    pages = await walk(client, social, f"{TIMELINE}?local=true&limit=7", "next")
    expected = [s.sid for s in social.instance.timeline()]
    walked = [i for page in pages for i in ids(page)]
    assert walked == expected
    assert len(set(walked)) == len(walked)
    assert all(len(page) == 7 for page in pages[:-1])
    # Ids are strings that grow with time, compared as numbers.
    assert [int(i) for i in walked] == sorted((int(i) for i in walked), reverse=True)
    last = await fetch(client, social, f"{TIMELINE}?local=true&limit=7&max_id={walked[-1]}")
    assert last.json() == []
    assert "link" not in last.headers


async def test_min_id_pages_forward_from_the_oldest_post(
    social: RunningInstance, client: httpx.AsyncClient
) -> None:
    pages = await walk(client, social, f"{TIMELINE}?local=true&limit=6&min_id=0", "prev")
    for page in pages:
        assert ids(page) == sorted(ids(page), key=int, reverse=True)
    walked = [i for page in reversed(pages) for i in ids(page)]
    assert walked == [s.sid for s in social.instance.timeline()]
    assert ids(pages[0]) == [s.sid for s in social.instance.timeline()[-6:]]


async def test_new_posts_appear_after_the_since_id_cursor(
    social: RunningInstance, client: httpx.AsyncClient
) -> None:
    instance = social.instance
    first = await fetch(client, social, f"{TIMELINE}?local=true&limit=1")
    cursor = first.json()[0]["id"]
    assert (await fetch(client, social, f"{TIMELINE}?local=true&since_id={cursor}")).json() == []
    added = [instance.add_post("ada", visibility="public") for _ in range(5)]
    hidden = instance.add_post("bruno", visibility="private")
    since = await fetch(client, social, f"{TIMELINE}?local=true&since_id={cursor}&limit=2")
    assert ids(since.json()) == [added[4].sid, added[3].sid]
    after = await fetch(client, social, f"{TIMELINE}?local=true&min_id={cursor}&limit=2")
    assert ids(after.json()) == [added[1].sid, added[0].sid]
    everything = await fetch(client, social, f"{TIMELINE}?local=true&since_id={cursor}")
    assert ids(everything.json()) == [s.sid for s in reversed(added)]
    assert hidden.sid not in ids(everything.json())
    assert all(int(s.sid) > int(cursor) for s in added)


async def test_limit_defaults_to_twenty_and_is_capped_at_forty(
    running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    instance = FediverseInstance.generate(web=running.web, posts=120, seed=3)
    async with serve_instance(instance, port=0) as social:
        default = await fetch(client, social, TIMELINE)
        assert len(default.json()) == 20
        capped = await fetch(client, social, f"{TIMELINE}?limit=400")
        assert len(capped.json()) == 40
        junk = await fetch(client, social, f"{TIMELINE}?limit=lots")
        assert len(junk.json()) == 20
        assert social.witness.requests()[0].host == social.host


async def test_non_public_posts_never_reach_a_public_timeline(
    social: RunningInstance, client: httpx.AsyncClient
) -> None:
    instance = social.instance
    hidden = instance.non_public_posts()
    assert {s.visibility for s in hidden} == {"unlisted", "private", "direct"}
    for start in (f"{TIMELINE}?limit=40", f"{TIMELINE}?local=true&limit=40"):
        served = [s for page in await walk(client, social, start, "next") for s in page]
        assert {s["visibility"] for s in served} == {"public"}
        assert not {s.sid for s in hidden} & set(ids(served))
    for status in hidden:
        uri = instance.status_uri(status)
        answer = await fetch(client, social, uri, accept=AP)
        api = await fetch(client, social, f"/api/v1/statuses/{status.sid}")
        if status.visibility == "unlisted":
            assert answer.json()["id"] == uri
            assert api.json()["visibility"] == "unlisted"
        else:
            assert answer.status_code == 404
            assert api.status_code == 404


async def test_local_timeline_has_no_remote_accounts(
    social: RunningInstance, client: httpx.AsyncClient
) -> None:
    local = [
        s for p in await walk(client, social, f"{TIMELINE}?local=true&limit=40", "next") for s in p
    ]
    everyone = [s for p in await walk(client, social, f"{TIMELINE}?limit=40", "next") for s in p]
    assert all("@" not in s["account"]["acct"] for s in local)
    remote = [s for s in everyone if "@" in s["account"]["acct"]]
    assert remote
    assert len(everyone) == len(local) + len(remote)
    assert ids(everyone) == [s.sid for s in social.instance.timeline(local=False)]


async def test_opted_out_accounts_are_flagged_on_their_posts(
    social: RunningInstance, client: httpx.AsyncClient
) -> None:
    instance = social.instance
    served = [
        s for p in await walk(client, social, f"{TIMELINE}?local=true&limit=40", "next") for s in p
    ]

    def opted_out(status: dict[str, Any]) -> bool:
        account = status["account"]
        return (
            account["indexable"] is False
            or account["noindex"] is True
            or account["discoverable"] is False
        )

    flagged = {s["id"] for s in served if opted_out(s)}
    assert flagged == {s.sid for s in instance.opted_out_posts()}
    kinds = {
        key
        for s in served
        for key, out in (("indexable", False), ("noindex", True), ("discoverable", False))
        if s["account"][key] is out
    }
    assert kinds == {"indexable", "noindex", "discoverable"}
    instance.opt_out("ada", "noindex")
    again = (await fetch(client, social, f"{TIMELINE}?local=true&limit=40")).json()
    ada = [s for s in again if s["account"]["acct"] == "ada"]
    assert ada
    assert all(s["account"]["noindex"] is True for s in ada)
    assert all(
        s.sid not in instance.links_by_post() for s in instance.timeline() if s.account == "ada"
    )
    actor = (await fetch(client, social, "/users/dmitri", accept=AP)).json()
    assert actor["type"] == "Person"
    assert actor["indexable"] is False
    assert actor["discoverable"] is True


async def test_content_uses_mastodon_markup_for_mentions_hashtags_and_links(
    social: RunningInstance, client: httpx.AsyncClient
) -> None:
    served = [s for p in await walk(client, social, f"{TIMELINE}?limit=40", "next") for s in p]
    mentioned = [s for s in served if s["mentions"]]
    tagged = [s for s in served if s["tags"]]
    assert mentioned
    assert tagged
    for status in mentioned:
        classes = [c for _, c in parse(status["content"]).anchors]
        assert classes.count("u-url mention") == len(status["mentions"])
    for status in tagged:
        hrefs = {h for h, c in parse(status["content"]).anchors if c == "mention hashtag"}
        assert hrefs == {t["url"] for t in status["tags"]}
    assert any(s["card"] for s in served)
    assert any(s["sensitive"] for s in served)
    assert any(s["media_attachments"] for s in served)


async def test_ground_truth_agrees_with_what_the_api_serves(
    social: RunningInstance, client: httpx.AsyncClient
) -> None:
    instance = social.instance
    served = [
        s for p in await walk(client, social, f"{TIMELINE}?local=true&limit=40", "next") for s in p
    ]
    counts: dict[str, int] = {}
    per_post: dict[str, list[str]] = {}
    own_links = 0
    for status in served:
        hosts = {urlsplit(h).hostname for h, c in parse(status["content"]).anchors if not c}
        own_links += social.host in hosts
        urls = shared_by(status, social.host)
        assert urls == instance.shared_links(instance.status(status["id"]))
        account = status["account"]
        if account["indexable"] and account["discoverable"] and not account["noindex"] and urls:
            per_post[status["id"]] = urls
            for url in urls:
                counts[url] = counts.get(url, 0) + 1
    assert own_links > 0, "some posts link to the instance's own pages"
    assert per_post == instance.links_by_post()
    assert counts == instance.expected_links()
    assert max(counts.values()) > 1, "some URLs are shared by several posts"
    web_hosts = {h.name for h in social.instance.web.hosts}
    assert {urlsplit(u).hostname for u in counts} <= web_hosts
    assert instance.forbidden_links().isdisjoint(counts)


async def test_shared_links_point_at_pages_the_sandbox_web_serves(
    social: RunningInstance, running: RunningSandbox, client: httpx.AsyncClient
) -> None:
    for url in sorted(social.instance.expected_links())[:5]:
        parts = urlsplit(url)
        assert parts.port == running.port
        host = parts.hostname or ""
        response = await client.get(
            running.ip_url(host, parts.path), headers={"Host": parts.netloc}
        )
        assert response.status_code == 200


async def test_status_uri_answers_activity_json_or_an_empty_shell_by_accept(
    social: RunningInstance, client: httpx.AsyncClient
) -> None:
    api_status = (await fetch(client, social, f"{TIMELINE}?local=true&limit=40")).json()
    status = next(s for s in api_status if s["tags"] and s["mentions"])
    for accept in (AP, 'application/ld+json; profile="https://www.w3.org/ns/activitystreams"'):
        answer = await fetch(client, social, status["uri"], accept=accept)
        assert answer.headers["content-type"].startswith(AP)
        assert answer.headers["vary"] == "Accept"
        note = answer.json()
        assert note["type"] == "Note"
        assert note["id"] == status["uri"]
        assert note["url"] == status["url"]
        assert note["content"] == status["content"]
        assert note["contentMap"] == {status["language"]: status["content"]}
        assert note["attributedTo"] == status["account"]["uri"]
        assert "https://www.w3.org/ns/activitystreams#Public" in note["to"]
        assert datetime.fromisoformat(note["published"]) == datetime.fromisoformat(
            status["created_at"]
        )
        kinds = {t["type"] for t in note["tag"]}
        assert kinds == {"Mention", "Hashtag"}
        assert isinstance(note["attachment"], list)
    for url in (status["uri"], status["url"]):
        shell = await fetch(client, social, url, accept="text/html")
        assert shell.headers["content-type"].startswith("text/html")
        page = parse(shell.text)
        assert page.text == []
        assert page.anchors == []
        assert 'id="mastodon"' in shell.text
        assert shell.text.count("<script") >= 2
    actor = await fetch(client, social, status["account"]["uri"], accept=AP)
    assert actor.json()["preferredUsername"] == status["account"]["username"]


async def test_throttle_answers_429_with_retry_after_until_lifted(
    social: RunningInstance, client: httpx.AsyncClient
) -> None:
    social.instance.throttle(3)
    limited = await fetch(client, social, TIMELINE)
    assert limited.status_code == 429
    assert limited.headers["retry-after"] == "3"
    assert limited.headers["x-ratelimit-remaining"] == "0"
    assert (await fetch(client, social, "/.well-known/nodeinfo")).status_code == 200
    social.instance.throttle("Wed, 21 Oct 2015 07:28:00 GMT")
    dated = await fetch(client, social, TIMELINE)
    assert dated.headers["retry-after"] == "Wed, 21 Oct 2015 07:28:00 GMT"
    social.instance.throttle(None)
    assert (await fetch(client, social, TIMELINE)).status_code == 200
    assert [r.status for r in social.witness.requests(social.host)][-4:] == [429, 200, 429, 200]


async def test_rate_limit_headers_count_down_then_429(
    web: SandboxWeb, client: httpx.AsyncClient
) -> None:
    instance = FediverseInstance.generate(web=web, posts=5, seed=1, rate_limit=3)
    async with serve_instance(instance, port=0) as social:
        remaining = []
        for _ in range(3):
            response = await fetch(client, social, TIMELINE)
            assert response.status_code == 200
            assert response.headers["x-ratelimit-limit"] == "3"
            remaining.append(int(response.headers["x-ratelimit-remaining"]))
            reset = datetime.fromisoformat(response.headers["x-ratelimit-reset"])
            assert reset > datetime.now(UTC)
        assert remaining == [2, 1, 0]
        over = await fetch(client, social, TIMELINE)
        assert over.status_code == 429
        assert 0 < int(over.headers["retry-after"]) <= 300
        assert (await fetch(client, social, "/robots.txt")).status_code == 200


async def test_robots_txt_is_mastodons_and_can_be_replaced(
    social: RunningInstance, client: httpx.AsyncClient
) -> None:
    robots = await fetch(client, social, "/robots.txt")
    assert "Disallow: /media_proxy/" in robots.text
    social.instance.set_robots("User-agent: *\nDisallow: /\n")
    assert (await fetch(client, social, "/robots.txt")).text == "User-agent: *\nDisallow: /\n"


async def test_misbehaving_api_wrong_types_and_html(
    social: RunningInstance, client: httpx.AsyncClient
) -> None:
    social.instance.misbehave("wrong-types")
    body = (await fetch(client, social, TIMELINE)).json()
    assert body[-3:] == ["status", None, 7]
    assert isinstance(body[0]["id"], int)
    assert isinstance(body[0]["account"], str)
    assert body[0]["content"] is None
    social.instance.misbehave("html")
    page = await fetch(client, social, TIMELINE)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    with pytest.raises(json.JSONDecodeError):
        json.loads(page.text)
    social.instance.misbehave(None)
    assert isinstance((await fetch(client, social, TIMELINE)).json()[0]["id"], str)


async def test_misbehaving_api_pagination_that_never_ends(
    social: RunningInstance, client: httpx.AsyncClient
) -> None:
    social.instance.misbehave("endless")
    seen: list[list[str]] = []
    url = f"{TIMELINE}?local=true&limit=5"
    for _ in range(4):
        response = await fetch(client, social, url)
        seen.append(ids(response.json()))
        url = response.links["next"]["url"]
    assert seen[1:] == [seen[0]] * 3
    social.instance.misbehave("bottomless")
    oldest: list[int] = []
    url = f"{TIMELINE}?local=true&limit=40"
    for _ in range(5):
        response = await fetch(client, social, url)
        page = [int(i) for i in ids(response.json())]
        assert len(page) == 40
        assert not oldest or page[0] < oldest[-1]
        oldest.append(page[-1])
        url = response.links["next"]["url"]


async def test_misbehaving_api_redirects_off_the_instance_or_sends_a_huge_page(
    social: RunningInstance, client: httpx.AsyncClient
) -> None:
    social.instance.misbehave("redirect")
    moved = await fetch(client, social, TIMELINE)
    assert moved.status_code == 302
    assert urlsplit(moved.headers["location"]).hostname != social.host
    elsewhere = social.instance.web.url("alice-blog.trove.test", "/")
    social.instance.misbehave("redirect", redirect_to=elsewhere)
    assert (await fetch(client, social, TIMELINE)).headers["location"] == elsewhere
    social.instance.misbehave("huge")
    huge = await fetch(client, social, TIMELINE)
    assert int(huge.headers["content-length"]) == HUGE_API_BYTES
    assert len(json.loads(huge.content)) > 1000


async def test_tag_timeline_and_webfinger(
    social: RunningInstance, client: httpx.AsyncClient
) -> None:
    instance = social.instance
    tag = next(t for s in instance.timeline() for t in s.tags)
    pages = await walk(client, social, f"/api/v1/timelines/tag/{tag}?limit=3", "next")
    walked = [i for page in pages for i in ids(page)]
    assert walked == [s.sid for s in instance.timeline(local=False, tag=tag)]
    assert all(tag in {t["name"] for t in s["tags"]} for page in pages for s in page)
    finger = await fetch(client, social, f"/.well-known/webfinger?resource=acct:ada@{social.host}")
    links = {link["rel"]: link["href"] for link in finger.json()["links"]}
    assert links["self"] == social.url("/users/ada")
    assert (
        await fetch(client, social, "/.well-known/webfinger?resource=acct:nobody")
    ).status_code == 404


def test_instance_is_reproducible_from_its_seed() -> None:
    web = SandboxWeb.generate(seed=5)
    first = FediverseInstance.generate(web=web, posts=30, seed=11)
    again = FediverseInstance.generate(web=web, posts=30, seed=11)
    other = FediverseInstance.generate(web=web, posts=30, seed=12)
    assert first.statuses == again.statuses
    assert first.expected_links() == again.expected_links()
    assert first.statuses != other.statuses
    assert first.add_post() == again.add_post()


async def test_instance_serves_standalone_with_its_own_web(client: httpx.AsyncClient) -> None:
    instance = FediverseInstance.generate(posts=10, seed=2)
    async with serve_instance(instance, port=0) as social:
        assert social.resolve_map == {social.host: "127.0.0.30"}
        response = await fetch(client, social, f"{TIMELINE}?local=true")
        assert ids(response.json()) == [s.sid for s in instance.timeline()]
    assert all(":" not in urlsplit(u).netloc for u in instance.expected_links())


async def test_served_web_and_instance_share_one_witness(
    web: SandboxWeb, client: httpx.AsyncClient
) -> None:
    async with serve_sandbox(web) as running:
        instance = FediverseInstance.generate(web=web, posts=5)
        async with serve_instance(instance, port=running.port, witness=running.witness) as social:
            await fetch(client, social, "/robots.txt")
            await client.get(running.ip_url("bob-notes.trove.test", "/robots.txt"))
            hosts = [r.host for r in running.witness.requests()]
            assert hosts == [social.host, "bob-notes.trove.test"]


async def test_sandbox_command_serves_the_instance_beside_the_web() -> None:
    process, lines = await start_cli(
        "--hosts", "2", "--pages", "3", "--base-ip", "127.0.0.80", "--fediverse", "12"
    )
    try:
        banner = next(line for line in lines if line.startswith("Fediverse instance"))
        assert "(12 posts)" in banner
        url = urlsplit(banner.rsplit(" ", 1)[1])
        env = dict(line.split("=", 1) for line in lines if line.startswith("TROVE_"))
        assert env["TROVE_RESOLVE"].endswith(",social.trove.test=127.0.0.82")
        assert env["TROVE_ALLOWED_NETWORKS"] == "127.0.0.0/24"
        async with httpx.AsyncClient(trust_env=False, timeout=10.0) as client:
            response = await client.get(
                f"http://127.0.0.82:{url.port}{TIMELINE}?local=true&limit=40",
                headers={"Host": url.netloc},
            )
        assert response.status_code == 200
        shared = [u for s in response.json() for u in shared_by(s, "social.trove.test")]
        assert shared
        assert all(f":{url.port}/" in u for u in shared)
    finally:
        code, stderr = await stop_cli(process, signal.SIGINT)
    assert code == 0
    assert "Traceback" not in stderr
