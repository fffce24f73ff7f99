"""512 concurrent requests through the fetcher's client against a server that answers
every one: none may fail.

httpcore's pool hands an idle keep-alive connection to a request, and the request
starts on it only when its task next runs; if the keep-alive expiry passes in between,
another task's pass over the pool closes the connection, possibly after the request
was sent (httpcore#1110). The server then answers 200 and the fetcher reads a closed
socket: a ``ReadError``, a page recorded as failed. To make the window show within
1,000 requests, every worker keeps to one host and asks again just before the
connection's keep-alive expiry, and the pool has few shards, so that each pass over a
shard is long. Without ``_KeptConnection`` this fails with 5-40 ReadErrors a run.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import httpx

from trove_fetcher.transport import PoolConfig, build_client
from trove_sandbox import SandboxWeb, serve_sandbox
from trove_schema.settings import FetcherSettings

WORKERS = 512
REQUESTS_EACH = 2
EXPIRY = 0.1


async def test_512_concurrent_requests_reusing_expiring_connections_all_succeed() -> None:
    web = SandboxWeb.generate(hosts=32, pages_per_host=2)
    rng = random.Random(7)
    async with serve_sandbox(web) as sandbox:
        urls = sandbox.seeds
        settings = FetcherSettings(
            concurrency=WORKERS,
            resolve=tuple(f"{name}={ip}" for name, ip in sandbox.resolve_map.items()),
            allowed_networks=(web.allowed_network(),),
            connect_timeout=30.0,
            read_timeout=30.0,
            request_timeout=60.0,
        )
        pool = PoolConfig(
            max_connections=2 * WORKERS,
            max_keepalive_connections=2 * WORKERS,
            keepalive_expiry=EXPIRY,
            shards=4,
        )
        outcomes: Counter[str] = Counter()
        async with build_client(settings, pool=pool) as client:

            async def worker(k: int) -> None:
                url = urls[k % len(urls)]
                for _ in range(REQUESTS_EACH):
                    try:
                        response = await client.get(url)
                        outcomes[str(response.status_code)] += 1
                    except httpx.HTTPError as exc:
                        outcomes[type(exc).__name__] += 1
                    await asyncio.sleep(rng.uniform(0.85, 1.0) * EXPIRY)

            await asyncio.gather(*(worker(k) for k in range(WORKERS)))
        answered = Counter(str(r.status) for r in sandbox.witness.requests())
    assert outcomes == Counter({"200": WORKERS * REQUESTS_EACH}), outcomes
    assert answered == outcomes
