"""CPU the fetcher's body reader spends a page: decoding what the network hands over.

``BodyReader.read`` runs on the event loop for every page. This times it on an ordinary
page (identity and gzip), a gzipped sitemap, and hostile bodies, with the working tree's
``trove_fetcher.http`` and, side by side in the same process, the module as it was at
``--baseline`` (a git revision): the ratios are between runs made alternately. The
bodies are handed over in pieces as httpcore reads them, from memory, so what is timed
is the reader alone.

    .venv/bin/python bench/bench_body_reader.py --baseline 6288733
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import random
import sys
import time
from pathlib import Path
from types import ModuleType

import httpx

ROOT = Path(__file__).resolve().parents[1]
for path in ("", "services/fetcher", "libs/schema"):
    sys.path.insert(0, str(ROOT / path))

from bench._baseline import module_at  # noqa: E402
from trove_fetcher import http as current  # noqa: E402

MODULE = "services/fetcher/trove_fetcher/http.py"
CAP = 2 * 1024 * 1024
#: httpcore reads up to 64 KiB at a time; loopback hands over that much.
PIECE = 64 * 1024


class _Pieces(httpx.AsyncByteStream):
    """The body in pieces: an iterator, not an async generator, so a body read in part
    leaves nothing for the loop to finalise after it has stopped."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def __aiter__(self) -> _Pieces:
        return self

    async def __anext__(self) -> bytes:
        if self.at >= len(self.data):
            raise StopAsyncIteration
        self.at += PIECE
        return self.data[self.at - PIECE : self.at]


def bodies() -> dict[str, tuple[dict[str, str], bool, bytes, int]]:
    """Name → (headers, packed, body, times read a run)."""
    rnd = random.Random(1)
    words = b" ".join(b"w%d" % rnd.randrange(3000) for _ in range(8000))
    page = b"<html><body><p>" + words + b"</p></body></html>"
    sitemap = b"<urlset>" + b"".join(
        b"<url><loc>https://blog.example/post/%d</loc></url>" % n for n in range(20_000)
    )
    html = {"Content-Type": "text/html"}
    packed = {"Content-Type": "application/gzip"}
    return {
        "page 45 KB": (html, False, page, 400),
        "page 45 KB, gzip": (html | {"Content-Encoding": "gzip"}, False, gzip.compress(page), 400),
        "sitemap 1 MB, .xml.gz": (packed, True, gzip.compress(sitemap), 40),
        # Hostile: what inflates to nothing, read until the bound on bytes carried.
        "empty members 4 MB": (packed, True, gzip.compress(b"", mtime=0) * 200_000, 4),
    }


async def _read(module: ModuleType, headers: dict[str, str], packed: bool, body: bytes) -> int:
    response = httpx.Response(200, headers=headers, stream=_Pieces(body))
    try:
        reader = module.BodyReader(max_bytes=CAP, max_ratio=100, packed=packed)
    except TypeError:  # a revision before gzip files were read
        reader = module.BodyReader(max_bytes=CAP, max_ratio=100)
    try:
        return len(await reader.read(response))
    except Exception:  # a refusal (an unknown coding, a bomb) is an answer too
        return -1
    finally:
        # A body read in part leaves httpx's raw iterator to be closed by the loop.
        await asyncio.sleep(0)


def measure(module: ModuleType, spec: tuple[dict[str, str], bool, bytes, int]) -> float:
    """CPU seconds a read, over ``times`` reads."""
    headers, packed, body, times = spec
    loop = asyncio.new_event_loop()
    try:
        started = time.process_time()
        for _ in range(times):
            loop.run_until_complete(_read(module, headers, packed, body))
        return (time.process_time() - started) / times
    finally:
        loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="HEAD", help="git revision to compare with")
    parser.add_argument("--runs", type=int, default=5, help="runs of each, medians kept")
    args = parser.parse_args()
    old = module_at(args.baseline, MODULE, "http_baseline")
    print(f"baseline {args.baseline}; CPU µs a read, medians of {args.runs} runs alternating")
    heading = f"{'body':24} {'baseline':>10} {'now':>10} {'now/base':>9}"
    print(f"{heading}  decoded bytes (base → now; -1 refused)")
    loop = asyncio.new_event_loop()
    for name, spec in bodies().items():
        headers, packed, body, _ = spec
        runs: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(args.runs):
            runs["old"].append(measure(old, spec))
            runs["new"].append(measure(current, spec))
        before = sorted(runs["old"])[args.runs // 2] * 1e6
        after = sorted(runs["new"])[args.runs // 2] * 1e6
        got = [loop.run_until_complete(_read(m, headers, packed, body)) for m in (old, current)]
        print(f"{name:24} {before:10.1f} {after:10.1f} {after / before:9.3f}  {got[0]} → {got[1]}")
    loop.close()


if __name__ == "__main__":
    main()
