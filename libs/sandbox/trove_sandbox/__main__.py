"""``python -m trove_sandbox`` (and ``trove sandbox``): serve the small web in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

from trove_sandbox.server import serve_sandbox
from trove_sandbox.web import SandboxWeb


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trove sandbox",
        description="Serve a synthetic small web on 127.0.0.0/8 until interrupted.",
    )
    parser.add_argument("--hosts", type=int, default=6, help="number of sites (default 6)")
    parser.add_argument("--pages", type=int, default=8, help="pages per site (default 8)")
    parser.add_argument("--port", type=int, default=0, help="shared port (default: a free one)")
    parser.add_argument("--seed", type=int, default=7, help="generation seed (default 7)")
    parser.add_argument("--base-ip", default="127.0.0.10", help="IP of the first host")
    parser.add_argument("--witness", metavar="FILE", help="append every request as JSONL to FILE")
    parser.add_argument("--trap", action="store_true", help="also serve trap.trove.test")
    parser.add_argument("--page-kb", type=int, help="benchmark mode: pad pages to about N KiB")
    parser.add_argument("--links-per-page", type=int, help="benchmark mode: links on each page")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        web = SandboxWeb.generate(
            hosts=args.hosts,
            pages_per_host=args.pages,
            seed=args.seed,
            base_ip=args.base_ip,
            port=args.port,
            page_kb=args.page_kb,
            links_per_page=args.links_per_page,
            with_trap=args.trap,
        )
    except ValueError as exc:
        print(f"trove sandbox: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(web, args.witness))
    except OSError as exc:
        print(f"trove sandbox: cannot serve: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


async def _serve(web: SandboxWeb, witness: str | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    try:
        async with serve_sandbox(web, witness_path=witness) as running:
            count = sum(1 for h in web.hosts if not h.is_trap)
            print(f"Trove sandbox: {count} hosts on port {running.port}", flush=True)
            print("Seeds:", flush=True)
            for seed in running.seeds:
                print(f"  {seed}", flush=True)
            if web.trap_host:
                print(f"Trap host (not a seed): {running.base_url(web.trap_host)}/", flush=True)
            print("Environment for Trove:", flush=True)
            print(f"TROVE_RESOLVE={web.resolve_setting()}", flush=True)
            print(f"TROVE_ALLOWED_NETWORKS={web.allowed_network()}", flush=True)
            print("Serving; press Ctrl-C to stop.", flush=True)
            await stop.wait()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


if __name__ == "__main__":
    raise SystemExit(main())
