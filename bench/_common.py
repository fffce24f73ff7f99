"""Helpers shared by the benchmarks: a clean slate, work for the fetcher, /proc readings.

Also a small HTTP/1.1 load generator (``python bench/_common.py loadgen``, config as JSON
on stdin, result as JSON on stdout) used to measure the sandbox server's own ceiling
from another process. Loopback only; every loop is bounded in count and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import math
import os
import resource
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from sqlalchemy.ext.asyncio import AsyncEngine

from trove_schema.bus import Bus
from trove_schema.events import PageDiscovered, Provenance, Scope, ScopeKind
from trove_schema.urls import canonicalize, domain_of
from trove_stack.reset import reset as reset_stack

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_SELF = os.path.abspath(__file__)
MIB = 1024 * 1024


# --- the stack ----------------------------------------------------------------------


@contextlib.contextmanager
def migrated_database() -> Iterator[str]:
    """A scratch Postgres from the embedded stack, migrated to the head; its URL."""
    import tempfile

    from trove_schema.migrate import upgrade
    from trove_stack.stack import Stack

    with (
        tempfile.TemporaryDirectory() as tmp,
        Stack(state_dir=Path(tmp) / "stack", fast_and_unsafe=True) as stack,
    ):
        upgrade(stack.database_url)
        yield stack.database_url


async def reset(bus: Bus, engine: AsyncEngine) -> None:
    """An empty crawl (see trove_stack.reset). Run it while no service is connected."""
    await reset_stack(bus.js, engine)


async def publish_work(
    bus: Bus, urls: Sequence[str], *, window: int = 128, origin: str = "bench"
) -> list[str]:
    """Hand URLs straight to the fetcher as discovery would; returns the event ids.

    Up to ``window`` publishes wait for their PubAck at once.
    """
    events = []
    for url in urls:
        canonical = canonicalize(url)
        domain = domain_of(canonical)
        events.append(
            PageDiscovered(
                url=canonical,
                domain=domain,
                scope=Scope(kind=ScopeKind.HOST, value=domain, max_depth=0),
                provenance=Provenance(kind="seed", origin=origin),
            )
        )
    for start in range(0, len(events), window):
        await asyncio.gather(*(bus.publish(e) for e in events[start : start + window]))
    return [e.id for e in events]


def frontier_urls(*, urls: int, hosts: int, base_ip: str, port: int) -> Iterator[str]:
    """A large frontier: ``urls`` pages over ``hosts`` consecutive addresses, round robin.

    The same URLs, in the same order, for every crawler that is handed them.
    """
    first = ipaddress.IPv4Address(base_ip)
    if not (first.is_loopback and (first + max(0, hosts - 1)).is_loopback):
        raise ValueError(f"frontier hosts must stay inside 127.0.0.0/8, from {base_ip}")
    for k in range(urls):
        yield f"http://{first + k % hosts}:{port}/p/{k // hosts}.html"


async def subject_count(bus: Bus, stream: str, subject: str) -> int:
    """Messages stored on ``subject`` in ``stream`` (one stream-info request)."""
    info = await bus.js.stream_info(stream, subjects_filter=subject)
    return int((info.state.subjects or {}).get(subject, 0))


async def stream_messages(bus: Bus, stream: str) -> int:
    info = await bus.js.stream_info(stream)
    return int(info.state.messages)


async def subject_counts(bus: Bus, stream: str) -> dict[str, int]:
    """Messages a subject in ``stream``, every subject.

    nats-server answers at most 100,000 subjects a request (and says how many there
    are), so a frontier of a million scheduled messages is read a page at a time.
    """
    counts: dict[str, int] = {}
    while True:
        request = {"subjects_filter": ">", "offset": len(counts)}
        reply = await bus.nc.request(
            f"$JS.API.STREAM.INFO.{stream}", json.dumps(request).encode(), timeout=60
        )
        answer = json.loads(reply.data)
        if "error" in answer:
            raise RuntimeError(f"stream info of {stream}: {answer['error']}")
        page = answer.get("state", {}).get("subjects") or {}
        counts.update(page)
        if not page or len(counts) >= int(answer.get("total", 0)):
            return counts


async def pull_waiting(bus: Bus, stream: str, durable: str) -> int:
    """Pull requests waiting on a consumer: one per connected, idle consumer loop."""
    try:
        info = await bus.js.consumer_info(stream, durable)
    except NotFoundError:
        return 0
    return int(info.num_waiting or 0)


async def consumer_redelivered(bus: Bus, stream: str, durable: str) -> int:
    """Messages the consumer delivered more than once (0 if it is gone)."""
    try:
        info = await bus.js.consumer_info(stream, durable)
    except NotFoundError:
        return 0
    return int(info.num_redelivered or 0)


async def stored_times(
    bus: Bus, stream: str, subject: str, *, expected: int, max_seconds: float = 15.0
) -> dict[str, float]:
    """Nats-Msg-Id -> the time JetStream stored the message (epoch seconds), for ``subject``.

    Reads with an ephemeral pull consumer, at most ``expected`` messages and for at most
    ``max_seconds``.
    """
    config = ConsumerConfig(
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.NONE,
        inactive_threshold=30.0,
        max_ack_pending=-1,
    )
    psub = await bus.js.pull_subscribe(subject, stream=stream, config=config)
    times: dict[str, float] = {}
    deadline = time.monotonic() + max_seconds
    try:
        while len(times) < expected and time.monotonic() < deadline:
            try:
                msgs = await psub.fetch(min(256, expected - len(times)), timeout=1.0)
            except (TimeoutError, NatsTimeoutError):
                break
            for msg in msgs:
                msg_id = (msg.headers or {}).get("Nats-Msg-Id")
                if msg_id:
                    times[msg_id] = msg.metadata.timestamp.timestamp()
    finally:
        with contextlib.suppress(Exception):
            await psub.unsubscribe()
    return times


# --- /proc --------------------------------------------------------------------------


def raise_nofile(wanted: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE towards ``wanted`` (at most the hard limit).

    A server of thousands of loopback hosts holds a listening socket for each.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (all its threads), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def memory_mib(pid: int, key: str = "VmHWM") -> float | None:
    """A ``/proc/<pid>/status`` memory line (VmHWM: peak RSS, VmRSS: now) in MiB."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024 / MIB
    except OSError:
        return None
    return None


def pss_mib(pid: int) -> float | None:
    """Proportional set size (MiB): shared pages split among the processes that map them.

    Summing RSS over Postgres's processes counts its shared buffers once per backend.
    """
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024 / MIB
    except OSError:
        return None
    return None


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def pids_with_cmdline(fragment: str) -> list[int]:
    """Processes whose command line contains ``fragment``."""
    found = []
    for pid in _all_pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fragment in cmdline:
            found.append(pid)
    return found


def children_of(parent: int) -> list[int]:
    """Direct children of ``parent`` (Postgres backends of a postmaster)."""
    found = []
    for pid in _all_pids():
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(pid)
    return found


def postmaster_pid(data_dir: str | os.PathLike[str]) -> int | None:
    """The postmaster's pid, from the first line of ``postmaster.pid`` in its data folder."""
    try:
        with open(os.path.join(data_dir, "postmaster.pid"), encoding="ascii") as f:
            return int(f.readline().strip())
    except (OSError, ValueError):
        return None


class CpuGroups:
    """CPU seconds of named groups of processes, sampled together.

    A process that appears between two samples counts from zero (its whole life is
    inside the window); one that exits in between is lost (its last reading is gone).
    """

    def __init__(self, groups: dict[str, Callable[[], Sequence[int]]]) -> None:
        self.groups = groups

    def sample(self) -> dict[str, dict[int, float]]:
        taken: dict[str, dict[int, float]] = {}
        for name, pids in self.groups.items():
            readings = {pid: cpu_seconds(pid) for pid in pids()}
            taken[name] = {pid: cpu for pid, cpu in readings.items() if cpu is not None}
        return taken

    @staticmethod
    def delta(
        before: dict[str, dict[int, float]], after: dict[str, dict[int, float]]
    ) -> dict[str, float]:
        used: dict[str, float] = {}
        for name, now in after.items():
            then = before.get(name, {})
            used[name] = sum(cpu - then.get(pid, 0.0) for pid, cpu in now.items())
        return used


def machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs since boot, from ``/proc/stat``."""
    with open("/proc/stat", encoding="ascii") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user
    return total - idle, total


# --- statistics ---------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def median(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return percentile(finite, 50)


# --- load generator (runs in a child process) ----------------------------------------


@dataclass(frozen=True)
class LoadResult:
    requests: int
    errors: int
    seconds: float
    bytes: int
    client_cpu: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else math.nan


async def run_loadgen(
    targets: Sequence[tuple[str, int, str, str]],
    *,
    connections: int,
    max_requests: int,
    max_seconds: float,
) -> LoadResult:
    """GET ``targets`` ((ip, port, host, path)) from a child process; wait for its result."""
    config = {
        "targets": [list(t) for t in targets],
        "connections": connections,
        "max_requests": max_requests,
        "max_seconds": max_seconds,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        _SELF,
        "loadgen",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(
            proc.communicate(json.dumps(config).encode()), max_seconds + 30
        )
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError("load generator did not finish in time") from None
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed: {err.decode(errors='replace')[-2000:]}")
    data: dict[str, Any] = json.loads(out)
    return LoadResult(
        requests=int(data["requests"]),
        errors=int(data["errors"]),
        seconds=float(data["seconds"]),
        bytes=int(data["bytes"]),
        client_cpu=float(data["client_cpu"]),
    )


async def _get(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, path: str
) -> tuple[int, int]:
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: bench-loadgen\r\n\r\n".encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    if length:
        await reader.readexactly(length)
    return status, length


async def _loadgen(config: dict[str, Any]) -> dict[str, Any]:
    targets = [(str(t[0]), int(t[1]), str(t[2]), str(t[3])) for t in config["targets"]]
    max_requests = int(config["max_requests"])
    deadline = time.monotonic() + float(config["max_seconds"])
    issued = 0
    done = 0
    errors = 0
    received = 0

    groups: dict[tuple[str, int], list[tuple[str, str]]] = {}
    for ip, port, host, path in targets:
        groups.setdefault((ip, port), []).append((host, path))
    addresses = list(groups)

    async def worker(k: int) -> None:
        nonlocal issued, done, errors, received
        ip, port = addresses[k % len(addresses)]
        pages = groups[(ip, port)]
        reader, writer = await asyncio.open_connection(ip, port, limit=1 << 20)
        try:
            n = k
            while issued < max_requests and time.monotonic() < deadline:
                issued += 1
                host, path = pages[n % len(pages)]
                n += 1
                status, length = await _get(reader, writer, host, path)
                done += 1
                received += length
                if status != 200:
                    errors += 1
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    cpu0, t0 = time.process_time(), time.perf_counter()
    results = await asyncio.gather(
        *(worker(k) for k in range(int(config["connections"]))), return_exceptions=True
    )
    seconds = time.perf_counter() - t0
    errors += sum(1 for r in results if isinstance(r, BaseException))
    return {
        "requests": done,
        "errors": errors,
        "seconds": seconds,
        "bytes": received,
        "client_cpu": time.process_time() - cpu0,
    }


def _main() -> int:
    if sys.argv[1:] != ["loadgen"]:
        print("usage: _common.py loadgen < config.json", file=sys.stderr)
        return 2
    config = json.loads(sys.stdin.read())
    print(json.dumps(asyncio.run(_loadgen(config))))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())


#: Warnings the services log in normal operation (a benchmark's own shutdown).
EXPECTED_WARNINGS = frozenset({"nats: disconnected"})


def extra_env(items: Sequence[str]) -> dict[str, str]:
    extra = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("TROVE_"):
            raise SystemExit(f"--env wants TROVE_NAME=value, not {item!r}")
        extra[key] = value
    return extra


def fmt(value: float, spec: str = ".0f") -> str:
    return "-" if math.isnan(value) else format(value, spec)


def log_warnings(logs: Path) -> Counter[str]:
    """Warning and error lines of the services' JSON logs, by service and message."""
    found: Counter[str] = Counter()
    for path in sorted(logs.glob("*.log")):
        service = path.stem.rsplit("-", 1)[0]
        for line in path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                if line.strip():
                    found[f"{service}: {line.strip()[:100]}"] += 1
                continue
            if isinstance(entry, dict) and entry.get("level") in ("warning", "error", "critical"):
                message = " ".join(str(entry.get("message", "")).split())
                if message not in EXPECTED_WARNINGS:
                    found[f"{service}: {message[:100]}"] += 1
    return found
