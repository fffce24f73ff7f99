"""A page's new links as ten JetStream publishes against one batch, atomic or fast.

Discovery publishes the ``PageDiscovered`` of a page's new links together, each waiting
for its own PubAck: ten links, ten round trips. nats-server 2.12 can store a batch of
messages to one stream atomically with one PubAck at its commit (ADR-50,
``allow_atomic``), and 2.14 a fast-ingest batch stored message by message with a flow
ack at its start and one PubAck at its commit (``allow_batched``): each would send the
client eight or nine replies fewer a page. This starts a nats-server, declares a stream
with both allowed, and publishes ``--pages`` pages of ``--links`` events of a
``PageDiscovered``'s size each way, alternating by round, every message with its own
``Nats-Msg-Id`` as Trove's events carry:

* the client's CPU (``time.process_time``) and nats-server's (``/proc/<pid>/stat``) a
  page, medians of ``--rounds``, and their ratios;
* what the server answers a batch that repeats the message ids of one stored, which is
  what a redelivered page publishes, and how many messages it stored.

Nothing is asserted.

    .venv/bin/python bench/bench_batch_publish.py [--pages 1000] [--links 10] [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import StreamConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import cpu_seconds
from trove_schema.events import PageDiscovered, Provenance, Scope
from trove_stack.nats import EmbeddedNats, NatsConfig

STREAM = "BATCH_BENCH"


def payload() -> bytes:
    """A ``PageDiscovered`` as discovery publishes one for a link."""
    return PageDiscovered(
        url="https://blog.example/posts/2026/11/a-post-about-something-small.html",
        domain="blog.example",
        depth=2,
        scope=Scope(value="blog.example"),
        provenance=Provenance(kind="link", source_url="https://blog.example/"),
    ).to_wire()


async def one_by_one(nc: Client, body: bytes, ids: list[str]) -> None:
    js = nc.jetstream()
    await asyncio.gather(
        *(
            js.publish(f"bench.page.{n}", body, headers={"Nats-Msg-Id": message_id})
            for n, message_id in enumerate(ids)
        )
    )


async def atomic(nc: Client, body: bytes, ids: list[str]) -> dict[str, object]:
    batch = uuid.uuid4().hex
    for n, message_id in enumerate(ids[:-1], 1):
        headers = {"Nats-Batch-Id": batch, "Nats-Batch-Sequence": str(n), "Nats-Msg-Id": message_id}
        await nc.publish(f"bench.page.{n}", body, headers=headers)
    commit = {
        "Nats-Batch-Id": batch,
        "Nats-Batch-Sequence": str(len(ids)),
        "Nats-Batch-Commit": "1",
        "Nats-Msg-Id": ids[-1],
    }
    reply = await nc.request("bench.page.last", body, timeout=10, headers=commit)
    answer: dict[str, object] = json.loads(reply.data)
    return answer


class FastBatches:
    """Fast-ingest batches (nats-server 2.14+, ``allow_batched``): each message stored as
    it comes, the batch's coordinates in its reply subject, a flow ack at the start and
    the PubAck at the commit, on one subscription."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.prefix = nc.new_inbox()
        self.waiting: dict[str, asyncio.Future[dict[str, object]]] = {}

    async def start(self) -> None:
        await self.nc.subscribe(f"{self.prefix}.>", cb=self._answer)

    async def _answer(self, msg: Msg) -> None:
        answer = json.loads(msg.data)
        if answer.get("type") == "ack":
            return  # flow control: the batch may go on
        batch = msg.subject[len(self.prefix) + 1 :].split(".", 1)[0]
        future = self.waiting.pop(batch, None)
        if future is not None and not future.done():
            future.set_result(answer)

    async def __call__(self, nc: Client, body: bytes, ids: list[str]) -> dict[str, object]:
        batch = uuid.uuid4().hex
        done = asyncio.get_running_loop().create_future()
        self.waiting[batch] = done
        for n, message_id in enumerate(ids, 1):
            op = 0 if n == 1 else 2 if n == len(ids) else 1  # start, append, commit
            reply = f"{self.prefix}.{batch}.{len(ids)}.fail.{n}.{op}.$FI"
            await nc.publish(
                f"bench.page.{n}", body, reply=reply, headers={"Nats-Msg-Id": message_id}
            )
        return await asyncio.wait_for(done, 10)


async def timed(
    way: Callable[[Client, bytes, list[str]], Awaitable[object]],
    nc: Client,
    pid: int,
    body: bytes,
    args: argparse.Namespace,
) -> tuple[float, float]:
    """µs of the client's and of nats-server's CPU a page."""
    server, client = cpu_seconds(pid) or 0.0, time.process_time()
    for _ in range(args.pages):
        await way(nc, body, [uuid.uuid4().hex for _ in range(args.links)])
    client_cpu = time.process_time() - client
    server_cpu = (cpu_seconds(pid) or 0.0) - server
    return 1e6 * client_cpu / args.pages, 1e6 * server_cpu / args.pages


async def bench(args: argparse.Namespace) -> None:
    folder = Path(tempfile.mkdtemp(prefix="trove-batch-publish-"))
    broker = EmbeddedNats(NatsConfig(folder / "nats")).start()
    try:
        assert broker.pid is not None
        nc = await nats.connect(broker.url)
        await nc.jetstream().add_stream(
            StreamConfig(name=STREAM, subjects=["bench.>"], allow_atomic=True, allow_batched=True)
        )
        body = payload()
        fast = FastBatches(nc)
        await fast.start()
        ids = [uuid.uuid4().hex for _ in range(args.links)]
        first = await atomic(nc, body, ids)
        again = await atomic(nc, body, ids)
        fresh = [uuid.uuid4().hex for _ in range(args.links)]
        fast_first = await fast(nc, body, fresh)
        fast_again = await fast(nc, body, fresh)
        stored = (await nc.jetstream().stream_info(STREAM)).state.messages
        ways: dict[str, Callable[[Client, bytes, list[str]], Awaitable[object]]] = {
            "one by one": one_by_one,
            "atomic batch": atomic,
            "fast batch": fast,
        }
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
        for number in range(args.rounds):
            order = list(ways.items())
            for name, way in order if number % 2 == 0 else order[::-1]:
                results[name].append(await timed(way, nc, broker.pid, body, args))
        await nc.close()
    finally:
        broker.stop()
    print(
        f"{args.pages} pages of {args.links} events ({len(body)} bytes each), "
        f"medians of {args.rounds} rounds:"
    )
    medians = {
        name: (statistics.median(c for c, _ in runs), statistics.median(s for _, s in runs))
        for name, runs in results.items()
    }
    for name, (client, server) in medians.items():
        print(f"  {name:<13} client {client:7.0f} µs a page, nats-server {server:7.0f} µs a page")
    c1, s1 = medians["one by one"]
    for name in ("atomic batch", "fast batch"):
        c2, s2 = medians[name]
        print(
            f"  {name} / one by one: client x{c2 / c1:.2f}, nats-server x{s2 / s1:.2f}, "
            f"both x{(c2 + s2) / (c1 + s1):.2f}"
        )
    print(f"an atomic batch committed: {first}")
    print(f"the same atomic batch again (a redelivered page): {again}")
    print(f"a fast batch committed: {fast_first}")
    print(f"the same fast batch again: {fast_again}; {stored} messages stored of 2 x 2 batches")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--links", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=4)
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
