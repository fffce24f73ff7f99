"""What an idle Trove costs: the stack and the services up, no work, CPU by process.

A crawler left running for months spends most of its life waiting: between re-crawl
cycles, and on a small web whose hosts each allow a page every ten seconds. This starts
the embedded nats-server and Postgres, creates the topology, then measures, each for
``--seconds`` after ``--settle`` seconds of quiet:

* **topology, no client**: nats-server alone with Trove's streams and buckets;
* **idle, as configured**: the services up (``--fetchers`` fetcher pods), nothing to do;
* **idle, outbox each second**: the same with ``TROVE_OUTBOX_POLL_MAX_SECONDS=1``, the
  recorder looking at its outbox every second as it did before its pause grew.

It prints ms of CPU per second by process group, and the ratio of the two idle runs,
measured side by side in one run.

    .venv/bin/python bench/bench_idle.py [--seconds 60] [--settle 10] [--fetchers 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import CpuGroups, children_of, pids_with_cmdline, postmaster_pid
from trove_cli.local import SERVICES, LocalTrove
from trove_schema.migrate import upgrade
from trove_stack.stack import Stack


def _measure(groups: CpuGroups, seconds: float) -> dict[str, float]:
    """ms of CPU a second by group over ``seconds`` of wall time."""
    before, started = groups.sample(), time.monotonic()
    time.sleep(seconds)  # the window measured: nothing happens in it, by design
    used = CpuGroups.delta(before, groups.sample())
    window = time.monotonic() - started
    return {name: 1000 * cpu / window for name, cpu in used.items()}


def _groups(stack_dir: Path, local: LocalTrove | None) -> CpuGroups:
    postmaster = postmaster_pid(stack_dir / "postgres" / "data")
    pg = [postmaster] if postmaster else []
    members: dict[str, Callable[[], Sequence[int]]] = {
        "nats": lambda: pids_with_cmdline(str(stack_dir / "nats")),
        "postgres": lambda: pg + [c for p in pg for c in children_of(p)],
    }
    if local is not None:
        for service in SERVICES:
            members[service] = lambda s=service: [  # type: ignore[misc]
                c.pid for c in local.children if c.name.startswith(s + "-")
            ]
    return CpuGroups(members)


def _idle(
    stack: Stack, state: Path, args: argparse.Namespace, env: dict[str, str]
) -> dict[str, float]:
    local = LocalTrove(
        state_dir=state,
        nats_url=stack.nats_url,
        database_url=stack.database_url,
        fetchers=args.fetchers,
        service_env=env,
    )
    local.start()
    try:
        time.sleep(args.settle)  # past start-up: topology checks, first pulls
        return _measure(_groups(stack.state_dir, local), args.seconds)
    finally:
        local.stop()


def _line(label: str, used: dict[str, float]) -> str:
    parts = ", ".join(f"{name} {ms:.1f}" for name, ms in sorted(used.items()))
    return f"{label:<28} {sum(used.values()):6.1f} ms/s  ({parts})"


def bench(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="trove-idle-") as tmp:
        state = Path(tmp)
        stack = Stack(state_dir=state / "stack", fast_and_unsafe=True)
        stack.start()
        try:
            upgrade(stack.database_url)
            configured = _idle(stack, state / "configured", args, {})
            every_second = _idle(
                stack, state / "every-second", args, {"TROVE_OUTBOX_POLL_MAX_SECONDS": "1"}
            )
            time.sleep(args.settle)
            bare = _measure(_groups(stack.state_dir, None), args.seconds)
        finally:
            stack.stop()
    print(f"Idle CPU, {args.seconds:.0f} s windows, {args.fetchers} fetcher(s):")
    print(_line("topology, no client", bare))
    print(_line("idle, as configured", configured))
    print(_line("idle, outbox each second", every_second))
    ratio = sum(configured.values()) / sum(every_second.values())
    recorder = configured["recorder"] / every_second["recorder"]
    print(f"as configured / outbox each second: stack x{ratio:.2f}, recorder x{recorder:.2f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="each window measured")
    parser.add_argument("--settle", type=float, default=10.0, help="quiet before a window")
    parser.add_argument("--fetchers", type=int, default=2, help="fetcher pods")
    return bench(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
