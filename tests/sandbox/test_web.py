"""The generated web as a model: its shape, its content and its ground truth."""

from __future__ import annotations

import ipaddress
import re
import struct
import urllib.robotparser
import zlib
from collections import deque
from typing import Any
from urllib.parse import urlsplit
from xml.etree import ElementTree

import pytest
from lingua import LanguageDetectorBuilder

from tests.sandbox.support import absolute_links, read_page
from trove_sandbox import TRAP_HOST, SandboxWeb
from trove_sandbox.texts import TEXTS

PORT = 8123


def generated(**kwargs: Any) -> SandboxWeb:
    web = SandboxWeb.generate(**kwargs)
    web.port = PORT
    return web


def host_of(url: str) -> str:
    return urlsplit(url).hostname or ""


def path_of(url: str) -> str:
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


def html_pages(web: SandboxWeb) -> list[str]:
    """Every HTML page URL the model defines (home, articles, drafts, private)."""
    return [web.url(spec.host, spec.path) for spec in web.page_specs()]


def crawl_model(web: SandboxWeb, follow_nofollow: bool) -> set[str]:
    """A host-scoped crawl over the rendered HTML, obeying robots.txt as served."""
    fetched: set[str] = set()
    for seed in web.seeds():
        host = host_of(seed)
        robots = urllib.robotparser.RobotFileParser()
        robots.parse(web.page(host, "/robots.txt").text.splitlines())
        queue, seen = deque([seed]), {seed}
        while queue:
            url = queue.popleft()
            if not robots.can_fetch("TroveBot", url):
                continue
            response = web.page(host, path_of(url))
            if not (response.content_type or "").startswith("text/html"):
                continue
            fetched.add(url)
            for link, nofollow in absolute_links(url, response.text):
                if urlsplit(link).hostname != host or (nofollow and not follow_nofollow):
                    continue
                if link not in seen:
                    seen.add(link)
                    queue.append(link)
    return fetched


def test_generation_is_deterministic_for_a_seed() -> None:
    first, second, other = generated(seed=11), generated(seed=11), generated(seed=12)
    urls = html_pages(first)
    assert urls == html_pages(second)
    for url in urls:
        host, path = host_of(url), path_of(url)
        assert first.page(host, path).body == second.page(host, path).body
    other_urls = set(html_pages(other))
    assert any(
        first.page(host_of(u), path_of(u)).body != other.page(host_of(u), path_of(u)).body
        for u in urls
        if u in other_urls
    )


def test_hosts_have_readable_names_under_the_test_tld_on_their_own_loopback_ip() -> None:
    web = generated()
    resolve = web.resolve_map()
    names = [h for h in resolve if h != TRAP_HOST]
    assert names[:2] == ["alice-blog.trove.test", "bob-notes.trove.test"]
    assert all(re.fullmatch(r"[a-z]+-[a-z]+\.trove\.test", name) for name in names)
    assert list(resolve.values()) == [f"127.0.0.{10 + i}" for i in range(6)]
    assert web.seeds() == [f"http://{name}:{PORT}/" for name in names]


def test_allowed_network_covers_every_host_ip_including_the_trap() -> None:
    web = generated(hosts=6, with_trap=True)
    network = ipaddress.ip_network(web.allowed_network())
    assert network == ipaddress.ip_network("127.0.0.0/24")
    assert all(ipaddress.ip_address(ip) in network for ip in web.resolve_map().values())
    wide = generated(hosts=20, base_ip="127.0.0.250", pages_per_host=1)
    wide_net = ipaddress.ip_network(wide.allowed_network())
    assert all(ipaddress.ip_address(ip) in wide_net for ip in wide.resolve_map().values())


def test_generate_refuses_ips_outside_loopback_and_empty_webs() -> None:
    with pytest.raises(ValueError, match=r"127\.0\.0\.0/8"):
        SandboxWeb.generate(base_ip="10.0.0.1")
    with pytest.raises(ValueError, match="127"):
        SandboxWeb.generate(hosts=10, base_ip="127.255.255.250")
    with pytest.raises(ValueError, match="host"):
        SandboxWeb.generate(hosts=0)


def test_every_article_is_reachable_from_its_home_page() -> None:
    web = generated(pages_per_host=40)
    for seed in web.seeds():
        host = host_of(seed)
        reached, queue = {seed}, deque([seed])
        while queue:
            url = queue.popleft()
            for link, nofollow in absolute_links(url, web.page(host, path_of(url)).text):
                if not nofollow and urlsplit(link).hostname == host and link not in reached:
                    reached.add(link)
                    queue.append(link)
        articles = web.articles(host)
        assert len(articles) == 39
        assert set(articles) <= reached


def test_expected_pages_match_a_robots_obeying_crawl_of_the_html() -> None:
    web = generated()
    expected = web.expected_pages()
    assert expected == crawl_model(web, follow_nofollow=False)
    assert web.expected_pages(follow_nofollow=True) == crawl_model(web, follow_nofollow=True)
    homes_and_articles = set(web.seeds()) | {
        a for s in web.seeds() for a in web.articles(host_of(s))
    }
    assert expected == homes_and_articles
    assert all(not u.endswith((".css", ".png", ".xml", ".txt")) for u in expected)


def test_nofollow_only_pages_are_expected_only_when_following_nofollow() -> None:
    web = generated()
    extra = web.expected_pages(follow_nofollow=True) - web.expected_pages()
    assert extra
    assert all("/drafts/" in url for url in extra)
    assert len(extra) == len(web.seeds())


def test_disallowed_page_is_linked_but_not_expected() -> None:
    web = generated()
    disallowed = web.disallowed_urls()
    assert disallowed == {f"http://bob-notes.trove.test:{PORT}/private/diary.html"}
    home = web.page("bob-notes.trove.test", "/")
    linked = {url for url, nofollow in absolute_links(web.seeds()[1], home.text) if not nofollow}
    assert disallowed <= linked
    assert not disallowed & web.expected_pages(follow_nofollow=True)


def test_robots_txt_has_a_trovebot_group_and_a_wildcard_group() -> None:
    web = generated()
    for seed in web.seeds():
        host = host_of(seed)
        response = web.page(host, "/robots.txt")
        assert response.status == 200
        assert (response.content_type or "").startswith("text/plain")
        assert "User-agent: TroveBot" in response.text
        assert "User-agent: *" in response.text
    bob = urllib.robotparser.RobotFileParser()
    bob.parse(web.robots_txt("bob-notes.trove.test").splitlines())
    private = f"http://bob-notes.trove.test:{PORT}/private/diary.html"
    assert not bob.can_fetch("TroveBot", private)
    assert not bob.can_fetch("SomeOtherBot", private)
    assert not bob.can_fetch("BadBot", web.seeds()[1])


def test_one_host_asks_for_a_crawl_delay() -> None:
    web = generated()
    delays = {h.name: web.crawl_delay(h.name) for h in web.hosts}
    assert delays.pop("carol-garden.trove.test") == 2.0
    assert set(delays.values()) == {None}
    assert "Crawl-delay: 2" in web.robots_txt("carol-garden.trove.test")


def test_pages_have_a_title_text_and_the_usual_head_links() -> None:
    web = generated()
    for url in web.expected_pages():
        host = host_of(url)
        response = web.page(host, path_of(url))
        page = read_page(response.text)
        assert page.title.strip(), url
        assert len(page.text.split()) >= 60, url
        rels = {(link.get("rel"), link.get("href")) for link in page.head_links}
        assert ("stylesheet", "/style.css") in rels
        assert ("alternate", "/feed.xml") in rels
        assert "/logo.png" in page.images
        assert 1500 <= len(response.body) <= 4500, (url, len(response.body))


def test_some_but_not_all_pages_declare_their_language() -> None:
    web = generated()
    langs = {
        url: read_page(web.page(host_of(url), path_of(url)).text).lang
        for url in web.expected_pages()
    }
    declared = {url: lang for url, lang in langs.items() if lang}
    assert 0 < len(declared) < len(langs)
    assert all(web.language(url) == lang for url, lang in declared.items())


def test_hosts_write_in_six_different_languages() -> None:
    web = generated()
    assert [web.language(seed) for seed in web.seeds()] == ["en", "fr", "de", "es", "nl", "it"]
    with pytest.raises(KeyError):
        web.language("http://elsewhere.example/")


def test_a_language_detector_identifies_every_page() -> None:
    detector = LanguageDetectorBuilder.from_all_languages().build()
    web = generated()
    for url in web.expected_pages(follow_nofollow=True):
        text = read_page(web.page(host_of(url), path_of(url)).text).text
        detected = detector.detect_language_of(text)
        assert detected is not None, url
        assert detected.iso_code_639_1.name.lower() == web.language(url), url


def test_articles_link_to_other_hosts_some_with_nofollow() -> None:
    web = generated()
    cross = nofollow_count = 0
    for seed in web.seeds():
        host = host_of(seed)
        for url in web.articles(host):
            links = absolute_links(url, web.page(host, path_of(url)).text)
            others = [(u, n) for u, n in links if urlsplit(u).hostname != host]
            assert others, url
            cross += len(others)
            nofollow_count += sum(n for _, n in links)
    assert cross > 40
    assert nofollow_count > 5


def test_nothing_links_to_the_trap_host() -> None:
    web = generated(with_trap=True)
    assert all(TRAP_HOST not in seed for seed in web.seeds())
    for spec in web.page_specs():
        assert TRAP_HOST not in web.page(spec.host, spec.path).text
    assert TRAP_HOST in web.resolve_map()


def test_feeds_list_every_article_of_their_host() -> None:
    web = generated()
    atom = "{http://www.w3.org/2005/Atom}"
    kinds = set()
    for seed in web.seeds():
        host = host_of(seed)
        response = web.page(host, "/feed.xml")
        kinds.add((response.content_type or "").split(";")[0])
        root = ElementTree.fromstring(response.body)  # noqa: S314 (our own generated feed)
        if root.tag == "rss":
            links = [item.findtext("link") for item in root.iter("item")]
        else:
            links = [link.get("href") for link in root.iter(f"{atom}link")]
            links = [u for u in links if u and u.endswith(".html")]
        assert links == web.articles(host)
    assert kinds == {"application/rss+xml", "application/atom+xml"}


def test_stylesheet_and_logo_are_real_files() -> None:
    web = generated()
    css = web.page("alice-blog.trove.test", "/style.css")
    assert (css.content_type or "").startswith("text/css")
    assert "body {" in css.text
    png = web.page("alice-blog.trove.test", "/logo.png")
    assert png.content_type == "image/png"
    assert png.body.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", png.body[16:24])
    assert (width, height) == (16, 16)
    idat_len = struct.unpack(">I", png.body[33:37])[0]
    assert png.body[37:41] == b"IDAT"
    assert len(zlib.decompress(png.body[41 : 41 + idat_len])) == 16 * (1 + 16 * 3)


def test_benchmark_mode_pads_pages_with_text_and_links() -> None:
    plain = generated(pages_per_host=20)
    big = generated(pages_per_host=20, page_kb=30, links_per_page=120)
    for url in big.articles("dave-bikes.trove.test")[:5]:
        response = big.page("dave-bikes.trove.test", path_of(url))
        assert 30 * 1024 <= len(response.body) <= 36 * 1024
        assert len(read_page(response.text).links) >= 120
    assert big.expected_pages() == plain.expected_pages()
    assert big.expected_pages() == crawl_model(big, follow_nofollow=False)


def test_large_hosts_stay_shallow_enough_for_a_default_crawl_depth() -> None:
    web = generated(hosts=2, pages_per_host=1000)
    assert len(web.expected_pages()) == 2000
    assert web.max_depth() <= 5


def test_page_words_are_never_mixed_across_languages() -> None:
    for code, text in TEXTS.items():
        assert len(text.sentences) == 8, code
        assert len(set(text.sentences)) == 8, code
        assert len(text.topics) == 8, code
        assert all(len(s.split()) >= 12 for s in text.sentences), code


def test_set_robots_changes_the_ground_truth() -> None:
    web = generated()
    web.set_robots("alice-blog.trove.test", "User-agent: TroveBot\nDisallow: /posts/\n")
    expected = web.expected_pages()
    assert f"http://alice-blog.trove.test:{PORT}/" in expected
    assert not [u for u in expected if u.startswith(f"http://alice-blog.trove.test:{PORT}/posts/")]
    assert set(web.articles("alice-blog.trove.test")) <= web.disallowed_urls()
    web.set_robots("alice-blog.trove.test", None)
    assert set(web.articles("alice-blog.trove.test")) <= web.expected_pages()


def test_robots_status_404_allows_everything_and_500_disallows_the_host() -> None:
    web = generated()
    bob = "bob-notes.trove.test"
    web.set_robots_status(bob, 404)
    assert web.page(bob, "/robots.txt").status == 404
    assert f"http://{bob}:{PORT}/private/diary.html" in web.expected_pages()
    web.set_robots_status(bob, 500)
    assert web.page(bob, "/robots.txt").status == 500
    assert not [u for u in web.expected_pages() if bob in u]
    web.set_robots_status(bob, "timeout")
    assert web.page(bob, "/robots.txt").delay >= 30
    assert not [u for u in web.expected_pages() if bob in u]
    web.set_robots_status(bob, None)
    assert web.page(bob, "/robots.txt").status == 200
    with pytest.raises(ValueError, match="robots status"):
        web.set_robots_status(bob, 302)


def test_added_pages_are_served_and_their_links_join_the_ground_truth() -> None:
    web = generated()
    alice = "alice-blog.trove.test"
    url = web.add_page(
        alice,
        "/",
        '<html><body><a href="/fresh.html">fresh</a> <a href="/hidden.html" rel="nofollow">h</a>'
        "</body></html>",
    )
    web.add_page(alice, "/fresh.html", "<html><body><p>fresh</p></body></html>")
    web.add_page(alice, "/gone.html", "gone", status=410, headers={"Content-Type": "text/plain"})
    assert url == f"http://{alice}:{PORT}/"
    assert "/fresh.html" in web.page(alice, "/").text
    assert web.page(alice, "/fresh.html").etag
    gone = web.page(alice, "/gone.html")
    assert (gone.status, gone.content_type) == (410, "text/plain")
    alice_expected = {u for u in web.expected_pages() if alice in u}
    assert alice_expected == {url, f"http://{alice}:{PORT}/fresh.html"}
    assert f"http://{alice}:{PORT}/hidden.html" in web.expected_pages(follow_nofollow=True)


def test_unknown_paths_and_hosts_are_404() -> None:
    web = generated()
    assert web.page("alice-blog.trove.test", "/nope.html").status == 404
    assert web.page("nobody.trove.test", "/").status == 404
