"""The long fuzz run: thousands of hostile seeds and pages through the real services.

    python bench/bench_fuzz.py [--rounds 4] [--seeds 600] [--pages 400] [--seed 1]

Each round starts from an empty crawl on an embedded NATS and Postgres, sends its seed
messages (random bytes and text, every seed form with wrong types, sizes, encodings and
NULs) and hostile pages (served by ``tests/fuzz/hostile.py``: broken HTML and feeds,
hostile charsets, NULs in titles, links and headers, enormous attributes, deep nesting,
lying headers, broken gzip, resets, invalid status lines, endless headers, redirects to
unparseable places), and judges the end as ``tests/fuzz`` does: one recorded answer per
input, nothing parked, no error in any service's log. Loopback only. Exit status 1 when
any round broke a rule. ``make fuzz`` runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

from sqlalchemy.ext.asyncio import create_async_engine

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import StackUrls
from tests.fuzz.harness import Report, fuzz_round
from trove_schema.bus import Bus
from trove_schema.migrate import upgrade
from trove_stack.reset import reset
from trove_stack.stack import Stack


async def run(urls: StackUrls, state: Path, args: argparse.Namespace) -> list[Report]:
    engine = create_async_engine(urls.database_url)
    reports = []
    try:
        for number in range(args.rounds):
            bus = await Bus.connect(urls.nats_url, name="bench-fuzz")
            try:
                await reset(bus.js, engine)
            finally:
                await bus.close()
            report = await fuzz_round(
                urls,
                engine,
                state / f"round-{number}",
                seed=args.seed + number,
                seed_count=args.seeds,
                page_count=args.pages,
                hosts=args.hosts,
                timeout=args.timeout,
                fetchers=args.fetchers,
            )
            print(f"round {number}: {json.dumps(report.summary())}", flush=True)
            for problem in report.problems[:20]:
                print(f"  problem: {problem}")
            for line in report.unexpected_errors[:20]:
                print(f"  error: {line}")
            reports.append(report)
    finally:
        await engine.dispose()
    return reports


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=600, help="seed messages per round")
    parser.add_argument("--pages", type=int, default=400, help="hostile pages per round")
    parser.add_argument("--hosts", type=int, default=40, help="host names the pages share")
    parser.add_argument("--fetchers", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1, help="random seed of round 0")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a round may take")
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="trove-fuzz-"))
    with Stack(state_dir=state / "stack", fast_and_unsafe=True) as stack:
        upgrade(stack.database_url)
        urls = StackUrls(stack.nats_url, stack.database_url, "embedded")
        reports = asyncio.run(run(urls, state, args))
    outcomes: Counter[str] = Counter()
    families: Counter[str] = Counter()
    reasons: dict[str, str] = {}
    for report in reports:
        for (kind, outcome), reason in report.reasons.items():
            reasons.setdefault(f"{kind} -> {outcome}", reason)
        outcomes.update(report.outcomes)
        families.update(
            {f"{kind} -> {outcome}": n for (kind, outcome), n in report.page_outcomes.items()}
        )
    total = {
        "inputs": sum(r.seed_messages + r.pages for r in reports),
        "seed_messages": sum(r.seed_messages for r in reports),
        "hostile_pages": sum(r.pages for r in reports),
        "seeds_rejected": sum(r.rejected_seeds for r in reports),
        "urls_accepted": sum(r.accepted_urls for r in reports),
        "attempts_by_outcome": dict(outcomes.most_common()),
        "pages_by_family_and_outcome": dict(sorted(families.items())),
        "a_reason_of_each": dict(sorted(reasons.items())),
        "parked": sum(r.parked for r in reports),
        "unexpected_errors": sum(len(r.unexpected_errors) for r in reports),
        "problems": sum(len(r.problems) for r in reports),
        "seconds": round(sum(r.seconds for r in reports), 1),
    }
    print(json.dumps(total, indent=2))
    print(f"logs: {state}")
    return 1 if total["parked"] or total["unexpected_errors"] or total["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
