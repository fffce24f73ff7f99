"""CPU a robots.txt costs the fetcher's event loop: parsing a file, and judging a URL.

``RobotsPolicy.allows`` runs on the event loop, before the lease, for every message of a
host. This times it for hostile files and an ordinary one, with the working tree's
``trove_fetcher.robots`` and, side by side in the same process, the module as it was at
``--baseline`` (a git revision): the ratios are between runs made alternately.

    .venv/bin/python bench/bench_robots.py --baseline b5f281e
"""

from __future__ import annotations

import argparse
import itertools
import random
import string
import sys
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
for path in ("", "services/fetcher", "libs/schema"):
    sys.path.insert(0, str(ROOT / path))

from bench._baseline import module_at  # noqa: E402
from trove_fetcher import robots as current  # noqa: E402

MODULE = "services/fetcher/trove_fetcher/robots.py"
SITE = "http://h.test"
MANY_PARAMETERS = f"{SITE}/s/search?" + "&".join(f"p{n:02d}=v" for n in range(20))
PLAIN_URL = f"{SITE}/page/zz"


def files() -> dict[str, bytes]:
    rnd = random.Random(1)

    def word(n: int) -> str:
        return "".join(rnd.choice(string.ascii_lowercase) for _ in range(n))

    def filled(line: object) -> bytes:
        lines, size = ["User-agent: *"], 0
        while size < 500 * 1024:
            text = str(line() if callable(line) else line)
            lines.append(text)
            size += len(text) + 1
        return ("\n".join(lines) + "\n").encode()

    agents = ["".join(p) for p in itertools.product(string.ascii_lowercase, repeat=3)]
    return {
        "ordinary (12 rules)": b"User-agent: *\n"
        + b"".join(b"Disallow: /private%d/\nDisallow: /*?session=\n" % n for n in range(6)),
        "plain 500 KiB": filled(lambda: f"Disallow: /{word(8)}"),
        "plain+? 500 KiB": filled(lambda: f"Disallow: /s/{word(8)}?x").replace(
            b"User-agent: *\n", b"User-agent: *\nAllow: /s\n"
        ),
        "wildcards 500 KiB": filled(lambda: f"Disallow: /*{word(3)}*{word(3)}$"),
        "many parts 500 KiB": filled(lambda: "Disallow: /*p*=*v*&*" + word(2)),
        # As many such rules as the bound takes: what a file judged may cost at most.
        "wildcards, bound": b"User-agent: *\n"
        + "".join(f"Disallow: /*{word(3)}*{word(3)}$\n" for _ in range(4_900)).encode(),
        "1000 agents x 2000": (
            "".join(f"User-agent: {a}\n" for a in agents[:1000])
            + "".join(f"Disallow: /p{n}\n" for n in range(2000))
        ).encode(),
    }


def measure(module: ModuleType, body: bytes) -> tuple[list[float], list[bool]]:
    """CPU seconds, and whether it was allowed: parse and a first URL, a URL of 20
    parameters, a plain URL."""
    module._parsed.clear()
    setattr(module, "_parsed_bytes", 0)  # noqa: B010 (a module of either revision)
    policy = module.RobotsPolicy(
        origin=SITE,
        rule=module.RobotsRule.PARSED,
        fetched_at=1.0,
        body=module._rules_only(body),
    )
    times, allowed = [], []
    for url in (f"{SITE}/warm", MANY_PARAMETERS, PLAIN_URL):
        start = time.process_time()
        allowed.append(policy.allows(url))
        times.append(time.process_time() - start)
    return times, allowed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="HEAD", help="git revision to compare with")
    parser.add_argument("--runs", type=int, default=3, help="runs of each, medians kept")
    args = parser.parse_args()
    old = module_at(args.baseline, MODULE, "robots_baseline")
    print(f"baseline {args.baseline}; CPU ms, medians of {args.runs} runs alternating")
    print(f"{'file':22} {'parse+1st':>20} {'20-param URL':>22} {'plain URL':>18}  allowed")
    for name, body in files().items():
        runs: dict[str, list[tuple[list[float], list[bool]]]] = {"old": [], "new": []}
        for _ in range(args.runs):
            runs["old"].append(measure(old, body))
            runs["new"].append(measure(current, body))
        cells = []
        for column in range(3):
            before = sorted(r[0][column] for r in runs["old"])[args.runs // 2] * 1e3
            after = sorted(r[0][column] for r in runs["new"])[args.runs // 2] * 1e3
            ratio = before / after if after > 0 else float("inf")
            cells.append(f"{before:7.2f} → {after:6.2f} x{ratio:<5.0f}")
        verdict = " ".join(
            f"{'yn'[not old]}→{'yn'[not new]}"
            for old, new in zip(runs["old"][0][1][1:], runs["new"][0][1][1:], strict=True)
        )
        print(f"{name:22} {cells[0]:>20} {cells[1]:>22} {cells[2]:>18}  {verdict}")


if __name__ == "__main__":
    main()
