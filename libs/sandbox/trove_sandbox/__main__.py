"""``python -m trove_sandbox`` (and ``trove sandbox``): serve the small web in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import signal
import sys

from trove_sandbox.fediverse import FediverseInstance, serve_instance
from trove_sandbox.server import serve_sandbox
from trove_sandbox.web import TLD, SandboxWeb


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
    parser.add_argument(
        "--fediverse",
        metavar="POSTS",
        type=int,
        help="also serve a fediverse instance with POSTS posts sharing the web's pages",
    )
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
        instance = None
        if args.fediverse is not None:
            # The instance takes the IP after the web's last host.
            ip = str(ipaddress.IPv4Address(web.hosts[-1].ip) + 1)
            instance = FediverseInstance.generate(
                web=web, posts=args.fediverse, seed=args.seed, ip=ip
            )
    except ValueError as exc:
        print(f"trove sandbox: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(web, args.witness, instance))
    except OSError as exc:
        print(f"trove sandbox: cannot serve: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


async def _serve(web: SandboxWeb, witness: str | None, instance: FediverseInstance | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    try:
        async with contextlib.AsyncExitStack() as stack:
            running = await stack.enter_async_context(serve_sandbox(web, witness_path=witness))
            resolve, ips = web.resolve_setting(), [h.ip for h in web.hosts]
            if instance is not None:
                await stack.enter_async_context(
                    serve_instance(instance, port=running.port, witness=running.witness)
                )
                resolve += f",{instance.host}={instance.ip}"
                ips.append(instance.ip)
            count = sum(1 for h in web.hosts if not h.is_trap)
            print(f"Trove sandbox: {count} hosts on port {running.port}", flush=True)
            print("Seeds:", flush=True)
            for seed in running.seeds:
                print(f"  {seed}", flush=True)
            if web.trap_host:
                print(f"Trap host (not a seed): {running.base_url(web.trap_host)}/", flush=True)
            if instance is not None:
                posts = len(instance.statuses)
                print(f"Fediverse instance ({posts} posts): {instance.url()}", flush=True)
            print("Environment for Trove:", flush=True)
            print(f"TROVE_RESOLVE={resolve}", flush=True)
            print(f"TROVE_ALLOWED_NETWORKS={_network(ips)}", flush=True)
            print(f"TROVE_PLATFORM_DOMAINS={TLD}", flush=True)
            print("Serving; press Ctrl-C to stop.", flush=True)
            await stop.wait()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def _network(ips: list[str]) -> str:
    """The narrowest network from /24 down that holds every IP (for TROVE_ALLOWED_NETWORKS)."""
    addresses = [ipaddress.IPv4Address(ip) for ip in ips]
    prefix = 24
    while True:
        net = ipaddress.IPv4Network(f"{min(addresses)}/{prefix}", strict=False)
        if max(addresses) in net:
            return str(net)
        prefix -= 1


if __name__ == "__main__":
    raise SystemExit(main())
