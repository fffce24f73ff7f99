"""The "real small web" of ``bench_vs_scrapy.py``: slow, uneven sites, some over TLS.

The pages are the benchmark web of ``witness_server.py`` (skewed site sizes, ~``--page-kb``
KiB, ~``--links`` links, the same robots.txt), served by this process with what a
local web lacks:

* **response times** drawn per request around a median drawn per host: the hosts'
  medians follow a log-normal (``--latency-median``, ``--host-sigma``), clipped to
  ``--latency-min``..``--latency-max``, and each request a narrower log-normal around
  its host's (``--request-sigma``). A delay is a function of (seed, host, path), so the
  manifest knows every one and the politeness bound counts them;
* **stalls**: ``--stall-hosts`` of the smallest hosts never answer their articles (the
  connection is held for ``--stall-seconds``, longer than either crawler waits). Those
  pages are not expected; the manifest lists them;
* **TLS**: a ``--tls-share`` of the hosts is served over HTTPS only, with one server
  certificate naming them all, signed by a CA made for the run (``ca.pem`` next to the
  manifest). Their URLs, links included, are ``https://``.

One listening socket per host, each on its own loopback address (127.0.0.10 upwards,
never 0.0.0.0), all on the same port: as many hosts as addresses, so a host is an
address as on the real web, and per-host politeness is visible per socket. 1,000
hosts need 1,000 listening sockets plus the crawlers' connections, so the process
raises its RLIMIT_NOFILE to the hard limit first.

Every request is appended on arrival to ``--witness`` (JSONL: host, path, method,
monotonic, wall, status, user agent, ip) as ``witness_server.py`` does; ``--manifest``
is written once serving, with the same keys plus ``latency_per_host`` (seconds the
host spends answering the expected requests and its robots.txt), ``stalled`` (URLs),
``stalled_per_host`` and ``ca_file``. Stops on SIGTERM or SIGINT, after
``--max-seconds``, or when its parent goes away.

    .venv/bin/python bench/smallweb.py --hosts 1000 --witness /tmp/w.jsonl \\
        --manifest /tmp/m.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import hashlib
import ipaddress
import json
import math
import os
import random
import signal
import ssl
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The repository root, for the benchmark web shared with witness_server.py.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import raise_nofile
from bench.witness_server import FEED_PATH, build_web, expected_urls
from trove_sandbox import SandboxWeb

MAX_HEAD = 16 * 1024
#: A keep-alive connection idle this long is closed (both crawlers reconnect).
IDLE_SECONDS = 15.0


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    content_type: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Latency:
    """How a host's response times are drawn (seconds)."""

    median: float
    host_sigma: float
    request_sigma: float
    low: float
    high: float


def _unit(seed: int, *parts: str) -> float:
    """A number in (0, 1) that depends only on ``seed`` and ``parts``."""
    digest = hashlib.blake2b("\0".join((str(seed), *parts)).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 0.5) / 2**64


def _normal(seed: int, *parts: str) -> float:
    """A standard normal draw (Box-Muller) that depends only on ``seed`` and ``parts``."""
    u1, u2 = _unit(seed, *parts, "a"), _unit(seed, *parts, "b")
    return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)


def host_median(seed: int, host: str, latency: Latency) -> float:
    value = latency.median * math.exp(latency.host_sigma * _normal(seed, host))
    return min(latency.high, max(latency.low, value))


def delay(seed: int, host: str, path: str, latency: Latency) -> float:
    """Seconds before ``host`` answers ``path``: the same every time it is asked."""
    value = host_median(seed, host, latency) * math.exp(
        latency.request_sigma * _normal(seed, host, path)
    )
    return min(latency.high, max(latency.low, value))


# --- TLS --------------------------------------------------------------------------------


def make_certificates(folder: Path, names: list[str]) -> tuple[Path, Path, Path]:
    """A CA for the run and one server certificate it signs for ``names``.

    Returns (CA certificate, server certificate chain, server key) as PEM files.
    """
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Trove bench small-web CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    ca_file, cert_file, key_file = folder / "ca.pem", folder / "server.pem", folder / "key.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca_file, cert_file, key_file


# --- the web ----------------------------------------------------------------------------


@dataclass
class SmallWeb:
    web: SandboxWeb
    seed: int
    latency: Latency
    tls: set[str]
    stalled: set[tuple[str, str]]
    stall_seconds: float
    answers: dict[tuple[str, str], Answer]
    by_ip: dict[str, str]

    def origin(self, host: str) -> str:
        scheme = "https" if host in self.tls else "http"
        return f"{scheme}://{host}:{self.web.port}"

    def url(self, host: str, path: str) -> str:
        return self.origin(host) + path


def choose(args: argparse.Namespace, web: SandboxWeb) -> tuple[set[str], set[tuple[str, str]]]:
    """The TLS hosts (a seeded sample) and the stalled pages (articles of the smallest hosts)."""
    names = [h.name for h in web.hosts]
    rng = random.Random(args.seed)
    tls = set(rng.sample(names, round(args.tls_share * len(names))))
    stall_hosts = set(names[len(names) - args.stall_hosts :]) if args.stall_hosts else set()
    stalled = {
        (spec.host, spec.path)
        for spec in web.page_specs()
        if spec.host in stall_hosts and spec.kind == "article"
    }
    return tls, stalled


def render(small: SmallWeb, urls: list[str]) -> None:
    """Every answer built once, TLS hosts' origins rewritten to https (no crawler pays)."""
    web = small.web
    swaps = [
        (f"http://{host}:{web.port}".encode(), f"https://{host}:{web.port}".encode())
        for host in sorted(small.tls)
    ]
    for host, path in [_host_path(u) for u in urls] + [(h.name, "/robots.txt") for h in web.hosts]:
        response = web.page(host, path)
        body = response.body
        if swaps and b"http://" in body:
            for old, new in swaps:
                if old in body:
                    body = body.replace(old, new)
        small.answers[(host, path)] = Answer(
            response.status, response.content_type or "text/plain", body
        )


def manifest(small: SmallWeb, urls: list[str], ca_file: Path | None) -> dict[str, Any]:
    web = small.web
    expected = [u for u in urls if _host_path(u) not in small.stalled]
    per_host = Counter(_host_path(u)[0] for u in expected)
    latency_per_host: dict[str, float] = {
        h.name: delay(small.seed, h.name, "/robots.txt", small.latency) for h in web.hosts
    }
    for u in expected:
        name, path = _host_path(u)
        latency_per_host[name] += delay(small.seed, name, path, small.latency)
    html = [len(small.answers[_host_path(u)].body) for u in expected if not u.endswith(FEED_PATH)]
    stalled = sorted(small.url(h, p) for h, p in small.stalled)
    return {
        "port": web.port,
        "resolve": web.resolve_map(),
        "resolve_setting": web.resolve_setting(),
        "allowed_network": web.allowed_network(),
        "seeds": [small.url(h.name, "/") for h in web.hosts],
        "expected": expected,
        "per_host": dict(per_host),
        "max_depth": web.max_depth(),
        "disallowed": sorted(_to_scheme(small, u) for u in web.disallowed_urls()),
        "page_bytes_mean": sum(html) / max(1, len(html)),
        "links_per_page": web.links_per_page,
        "latency_per_host": latency_per_host,
        "stalled": stalled,
        "stalled_per_host": dict(Counter(h for h, _ in small.stalled)),
        "tls_hosts": sorted(small.tls),
        "ca_file": str(ca_file) if ca_file else None,
        "host_medians": sorted(host_median(small.seed, h.name, small.latency) for h in web.hosts),
    }


def _host_path(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return (parts.hostname or "").lower(), parts.path or "/"


# --- the server -------------------------------------------------------------------------


class Server:
    def __init__(self, small: SmallWeb, witness: TextIO) -> None:
        self.small = small
        self.witness = witness
        self.servers: list[asyncio.Server] = []
        self.hosts = set(small.by_ip.values())

    async def start(self, port: int, tls: ssl.SSLContext | None) -> int:
        by_ip = self.small.by_ip
        for ip, host in by_ip.items():
            context = tls if host in self.small.tls else None
            server = await asyncio.start_server(
                self._connection, ip, port, ssl=context, backlog=256, limit=MAX_HEAD
            )
            self.servers.append(server)
            if port == 0:
                port = int(server.sockets[0].getsockname()[1])
        return port

    async def close(self) -> None:
        for server in self.servers:
            server.close()
        for server in self.servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2.0)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        local_ip = str(writer.get_extra_info("sockname")[0])
        try:
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_SECONDS)
                except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                    return
                if not await self._request(head, local_ip, writer):
                    return
        except (ConnectionError, ssl.SSLError, OSError):
            return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _request(self, head: bytes, local_ip: str, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection must close."""
        arrived, wall = time.monotonic(), time.time()
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = [*lines[0].split(" ", 2), "", ""][:3]
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        host = headers.get("host", "").rsplit(":", 1)[0].lower().rstrip(".")
        if host not in self.hosts:
            host = self.small.by_ip.get(local_ip, host)
        path = urlsplit(target).path or "/"
        stalled = (host, path) in self.small.stalled
        answer = self.small.answers.get((host, path))
        status = 0 if stalled else (answer.status if answer else 404)
        record = {
            "host": host,
            "path": path,
            "method": method,
            "monotonic": arrived,
            "wall": wall,
            "status": status,
            "user_agent": headers.get("user-agent"),
            "ip": local_ip,
        }
        self.witness.write(json.dumps(record) + "\n")
        if stalled:
            await asyncio.sleep(self.small.stall_seconds)
            return False
        await asyncio.sleep(delay(self.small.seed, host, path, self.small.latency))
        if answer is None:
            answer = Answer(404, "text/plain", b"not found\n")
        keep = headers.get("connection", "").lower() != "close"
        body = b"" if method == "HEAD" else answer.body
        writer.write(
            (
                f"HTTP/1.1 {answer.status} {'OK' if answer.status == 200 else 'Not Found'}\r\n"
                f"Content-Type: {answer.content_type}\r\n"
                f"Content-Length: {len(answer.body)}\r\n"
                f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n"
            ).encode("latin-1")
            + body
        )
        await writer.drain()
        return keep


async def serve(args: argparse.Namespace, witness: TextIO) -> int:
    limit = raise_nofile(args.hosts * 4 + 1024)
    if limit < args.hosts + 256:
        print(f"smallweb: RLIMIT_NOFILE {limit} is too low for {args.hosts} hosts", file=sys.stderr)
        return 2
    web = build_web(
        hosts=args.hosts,
        articles=args.articles,
        skew=args.skew,
        page_kb=args.page_kb,
        links=args.links,
        seed=args.seed,
    )
    tls, stalled = choose(args, web)
    small = SmallWeb(
        web=web,
        seed=args.seed,
        latency=Latency(
            args.latency_median,
            args.host_sigma,
            args.request_sigma,
            args.latency_min,
            args.latency_max,
        ),
        tls=tls,
        stalled=stalled,
        stall_seconds=args.stall_seconds,
        answers={},
        by_ip={h.ip: h.name for h in web.hosts},
    )
    for ip in small.by_ip:
        if not ipaddress.IPv4Address(ip).is_loopback:
            raise SystemExit(f"smallweb serves loopback addresses only, not {ip}")
    target = Path(args.manifest)
    ca_file: Path | None = None
    context: ssl.SSLContext | None = None
    if tls:
        ca_file, cert_file, key_file = make_certificates(target.parent / "tls", sorted(tls))
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert_file, key_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    parent = os.getppid()
    server = Server(small, witness)
    try:
        web.port = await server.start(args.port, context)
        urls = [_to_scheme(small, u) for u in expected_urls(web)]
        render(small, urls)
        data = manifest(small, urls, ca_file)
        partial = target.with_suffix(".partial")
        partial.write_text(json.dumps(data))
        partial.replace(target)
        print(
            f"smallweb: {len(web.hosts)} hosts ({len(tls)} over TLS, {args.stall_hosts} "
            f"stalling) on port {web.port}, {len(data['expected'])} pages to crawl, "
            f"RLIMIT_NOFILE {limit}",
            flush=True,
        )
        deadline = loop.time() + args.max_seconds
        while not stop.is_set() and loop.time() < deadline and os.getppid() == parent:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
    finally:
        await server.close()
    return 0


def _to_scheme(small: SmallWeb, url: str) -> str:
    host, path = _host_path(url)
    return small.url(host, path)


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--hosts", type=int, default=1000, help="sites, one loopback IP each")
    parser.add_argument("--articles", type=int, default=20, help="articles of the largest site")
    parser.add_argument("--skew", type=float, default=1.0, help="size fall-off exponent")
    parser.add_argument("--page-kb", type=int, default=30, help="page size (KiB)")
    parser.add_argument("--links", type=int, default=100, help="links a page")
    parser.add_argument("--seed", type=int, default=7, help="generation seed")
    parser.add_argument("--port", type=int, default=0, help="shared port (0: a free one)")
    parser.add_argument("--latency-median", type=float, default=0.15, help="median of hosts (s)")
    parser.add_argument("--host-sigma", type=float, default=1.0, help="log-normal sigma, hosts")
    parser.add_argument(
        "--request-sigma", type=float, default=0.3, help="log-normal sigma, a host's requests"
    )
    parser.add_argument("--latency-min", type=float, default=0.02, help="fastest answer (s)")
    parser.add_argument("--latency-max", type=float, default=4.0, help="slowest answer (s)")
    parser.add_argument("--tls-share", type=float, default=0.2, help="share of hosts over TLS")
    parser.add_argument(
        "--stall-hosts", type=int, default=10, help="smallest hosts whose articles never answer"
    )
    parser.add_argument(
        "--stall-seconds", type=float, default=60.0, help="how long a stalled request is held"
    )
    parser.add_argument("--witness", required=True, help="JSONL file every request goes to")
    parser.add_argument("--manifest", required=True, help="JSON file written once serving")
    parser.add_argument(
        "--max-seconds", type=float, default=3600.0, help="stop after this long whatever happens"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 1 <= args.hosts <= 60000 or args.articles < 1 or args.skew < 0:
        print("smallweb: --hosts 1..60000, --articles >= 1, --skew >= 0", file=sys.stderr)
        return 2
    if not 0 <= args.tls_share <= 1 or not 0 <= args.stall_hosts < args.hosts:
        print("smallweb: --tls-share 0..1, --stall-hosts 0..hosts-1", file=sys.stderr)
        return 2
    try:
        with open(args.witness, "a", buffering=1, encoding="utf-8") as witness:
            return asyncio.run(serve(args, witness))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
