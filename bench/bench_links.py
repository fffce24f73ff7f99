"""CPU a page's links cost where every page's links go: canonicalized by the fetcher
(``trove_schema.urls.canonicalize``, in its parse threads) and read for traps by
discovery (``trove_discovery.traps.url_trap_reason``).

A blog page's ~100 links as lxml resolves them: its menu, tags and posts, a tenth with
a fragment (``#comments``) or a plain query (``?p=123``, ``?s=...&paged=2``), two
with tracking parameters (``?utm_source=rss``), images,
links to other sites, a share link full of escapes. Timed with the working tree's
modules and, side by side in the same process, the modules as they were at
``--baseline`` (a git revision), alternating; medians of ``--runs``, microseconds of CPU
a page. Both must give the same URLs and verdicts (said when they do not).

    .venv/bin/python bench/bench_links.py --baseline 2d0751e
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
for path in ("", "services/discovery", "libs/schema"):
    sys.path.insert(0, str(ROOT / path))

from bench._baseline import module_at  # noqa: E402
from trove_discovery import traps  # noqa: E402
from trove_schema import urls  # noqa: E402

HOST = "blog.example.org"


def page_links(page: int) -> list[str]:
    """One page's links, as its parser resolves them; each page names other posts."""
    rnd = random.Random(page)
    site = f"https://{HOST}"
    posts = [rnd.randrange(100_000) for _ in range(48)]
    links = [f"{site}/", f"{site}/about/", f"{site}/archive/", f"{site}/feed.xml"]
    links += [f"{site}/tags/{tag}/" for tag in ("python", "rust", "web", "linux", "notes")]
    links += [f"{site}/{2020 + n % 5}/{1 + n % 12:02d}/post-{n}/" for n in posts[:40]]
    links += [f"{site}/{2020 + n % 5}/{1 + n % 12:02d}/post-{n}/#comments" for n in posts[40:]]
    links += [f"{site}/#content", f"{site}/?p={posts[0]}", f"{site}/?s=rust&paged=2"]
    links += [f"{site}/post-{n}/?utm_source=rss&utm_medium=feed" for n in posts[:2]]
    links += [f"{site}/page/{n}/" for n in range(2, 6)]
    links += [f"{site}/images/photo-{n}.jpg" for n in posts[:10]]
    links += [f"https://other{n % 50}.example.com/post/{n}" for n in posts[:10]]
    links += [f"https://en.wikipedia.org/wiki/Topic_{n}" for n in posts[:3]]
    links += [f"https://share.example/intent?url=https%3A%2F%2F{HOST}%2Fp&text=read%20this"]
    return links


def timed(work: Callable[[], object]) -> tuple[float, object]:
    start = time.process_time()
    result = work()
    return time.process_time() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="HEAD", help="git revision to compare with")
    parser.add_argument("--pages", type=int, default=300, help="pages a run")
    parser.add_argument("--runs", type=int, default=7, help="runs of each, medians kept")
    args = parser.parse_args()
    old_urls = module_at(args.baseline, "libs/schema/trove_schema/urls.py", "urls_baseline")
    old_traps = module_at(args.baseline, "services/discovery/trove_discovery/traps.py", "traps_b")
    pages = [page_links(n) for n in range(args.pages)]
    canonical = [[u for u in map(urls.canonicalize_or_none, links) if u] for links in pages]

    def canonicalize(module: ModuleType) -> Callable[[], object]:
        return lambda: [[module.canonicalize_or_none(u) for u in links] for links in pages]

    def trap_reasons(module: ModuleType) -> Callable[[], object]:
        return lambda: [
            [module.url_trap_reason(u, max_length=2048, max_path_repetitions=3) for u in links]
            for links in canonical
        ]

    works = {
        "canonicalize (fetcher)": (canonicalize(old_urls), canonicalize(urls)),
        "url_trap_reason (discovery)": (trap_reasons(old_traps), trap_reasons(traps)),
    }
    links = sum(map(len, pages))
    print(f"baseline {args.baseline}; {args.pages} pages, {links / args.pages:.0f} links a page")
    print(f"{'':28} {'baseline':>10} {'now':>10} {'ratio':>7}   µs of CPU a page, medians")
    for name, (before, after) in works.items():
        runs: dict[str, list[float]] = {"baseline": [], "now": []}
        results: dict[str, object] = {}
        for _ in range(args.runs):
            for label, work in (("baseline", before), ("now", after)):
                seconds, results[label] = timed(work)
                runs[label].append(seconds / args.pages * 1e6)
        old, new = statistics.median(runs["baseline"]), statistics.median(runs["now"])
        same = "" if results["baseline"] == results["now"] else "   RESULTS DIFFER"
        print(f"{name:28} {old:10.1f} {new:10.1f} {old / new:6.2f}x{same}")


if __name__ == "__main__":
    main()
