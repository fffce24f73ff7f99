"""Where each Trove service's CPU goes in a benchmark run, from py-spy.

``Profiler.attach`` starts one ``py-spy record`` per service process (``--format raw``,
collapsed stacks; ``--nonblocking``, so the process is never paused) and ``stop`` ends
them with SIGINT, on which py-spy writes its file. py-spy keeps only the samples of
threads the OS shows running, which includes a runnable thread waiting for a core: on
two busy cores the samples are several times the CPU time. So only shares are taken
from them, and the absolute figure comes from ``/proc`` (the benchmark's own CPU
reading of the same window): a bucket's CPU a page is the group's CPU seconds times the
bucket's share of the group's samples, divided by the pages.

A sample falls in the bucket of its innermost frame that belongs to a named library
(extraction, HTTP, the NATS client, the event records, Postgres): the socket write that
nats-py asks of the event loop is NATS's, the validation pydantic does for an event is
the events'. What no named library caused and ends in the loop (asyncio,
selectors, the executor's threads) is the loop's; the rest is Trove's own code and the
standard library it calls.

nats-server is sampled by Go's own profiler when the stack serves it
(``Stack.profile_nats``): consecutive CPU profiles of ``NATS_WINDOW`` seconds, read
with ``bench.pprof``. Go samples CPU time, so there its samples are the CPU itself; a
sample falls in the part of the server of its innermost frame that names one
(``NATS_PARTS``). Postgres is not sampled: ``report`` gives its CPU a page as a line.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

from bench import pprof
from bench._common import cpu_seconds

#: Samples a second: off the beat of the 100 Hz timers the processes may run.
RATE = 97
#: Seconds py-spy may take to attach, and to write its file after SIGINT.
ATTACH_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0
#: The services py-spy is attached to, in the order they are reported.
SERVICES = ("discovery", "fetcher", "recorder")
#: Processes py-spy cannot sample (not Python), reported by their CPU alone unless
#: sampled otherwise (nats-server by Go's profiler).
UNSAMPLED = {"nats": "nats-server", "postgres": "Postgres"}
#: Seconds of each of nats-server's CPU profiles: the last one runs past ``stop`` by
#: this much at most.
NATS_WINDOW = 2
#: nats-server's function names start so; shown without it.
_NATS_PACKAGE = "github.com/nats-io/nats-server/v2/server"
#: The parts of nats-server a sample is counted in: the first whose pattern finds its
#: innermost frame that any pattern finds. A stack none finds is Go's runtime (the
#: scheduler, the collector) when no frame is the server's, else the rest of the server.
NATS_PARTS = (
    ("consumers' state written to disk", re.compile(r"writeAtomically|\(\*consumerFileStore\)")),
    (
        "the stream store: message blocks, indexes, compression",
        re.compile(r"\(\*(?:msgBlock|fileStore)\)|/stree\.|/avl\.|klauspost/compress"),
    ),
    (
        "delivery: headers, queueing, socket writes",
        re.compile(
            r"\(\*client\)\.(?:flushOutbound|writeLoop|queueOutbound|deliverMsg|msgHeader)|genHeader"
        ),
    ),
    (
        "reading clients: socket reads, parsing, routing",
        re.compile(
            r"\(\*client\)\.(?:readLoop|parse|processInbound|processMsgResults|processServiceImport)"
            r"|\(\*Sublist\)|matchLevel|getHeaderKeyIndex"
        ),
    ),
    (
        "JetStream: streams, consumers, acks, schedules, KV reads",
        re.compile(
            r"\(\*(?:stream|consumer|jsAccount)\)|\(\*Server\)\.(?:js|processJS)|ipQueue"
            r"|MsgSchedule|checkMsgId"
        ),
    ),
)
NATS_RUNTIME = "Go's runtime: scheduler, collector"
NATS_REST = "the rest of the server"
NATS_PART_NAMES = (*(name for name, _ in NATS_PARTS), NATS_RUNTIME, NATS_REST)
TOP_INCLUSIVE = 12
TOP_SELF = 8
_BANNER = "py-spy> Sampling"
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")

Matcher = Callable[[str, str], bool]


def _top(file: str) -> str:
    """The package (or the module, for a top-level one) a py-spy file name is in."""
    return file.split("/", 1)[0]


def _in(*tops: str) -> Matcher:
    return lambda function, file: _top(file) in tops


def _files(*files: str) -> Matcher:
    return lambda function, file: file in files


def _any(*matchers: Matcher) -> Matcher:
    return lambda function, file: any(m(function, file) for m in matchers)


@dataclass(frozen=True)
class Bucket:
    name: str
    matches: Matcher


#: Named libraries, each with the Trove modules that are only a thin layer on them.
BUCKETS = (
    Bucket(
        "extraction (lxml, lingua, keywords)",
        _any(
            _in("lxml", "lingua", "html", "pypdf"),
            _files(
                "trove_fetcher/extract.py",
                "trove_fetcher/language.py",
                "trove_fetcher/keywords.py",
                "trove_fetcher/charset.py",
                "trove_fetcher/pdf.py",
            ),
            # Everything a strategy does in its ``extract`` is extraction.
            lambda function, file: file.startswith("trove_fetcher/") and "extract" in function,
        ),
    ),
    Bucket(
        "HTTP (httpx, httpcore, h11, ssl)",
        _any(
            _in("httpx", "httpcore", "h11", "h2", "hpack", "anyio", "sniffio", "ssl.py"),
            _files("trove_fetcher/transport.py", "trove_fetcher/dns.py"),
        ),
    ),
    Bucket("NATS client (nats-py)", _in("nats")),
    Bucket(
        "events: build, encode, decode (pydantic, json)",
        _any(
            _in("pydantic", "pydantic_core", "msgspec", "json", "orjson"),
            _files("trove_schema/events.py", "trove_schema/text.py"),
        ),
    ),
    Bucket("Postgres client (SQLAlchemy, asyncpg)", _in("sqlalchemy", "asyncpg")),
)
LOOP = Bucket(
    "event loop (asyncio, selectors, threads)",
    _in("asyncio", "selectors.py", "concurrent", "threading.py", "queue.py"),
)
REST = "Trove's own code and the rest"
BUCKET_NAMES = (*(b.name for b in BUCKETS), LOOP.name, REST)


def _scaffold(function: str, file: str) -> bool:
    """Frames every stack passes through: entry points, the loop's and threads' dispatch."""
    if file.startswith("<frozen") or file.endswith("__main__.py"):
        return True
    if file in ("asyncio/runners.py", "threading.py", "concurrent/futures/thread.py"):
        return True
    if file == "trove_schema/service.py" and function == "run":
        return True
    return (function, file) in {
        ("BaseEventLoop.run_forever", "asyncio/base_events.py"),
        ("BaseEventLoop.run_until_complete", "asyncio/base_events.py"),
        ("BaseEventLoop._run_once", "asyncio/base_events.py"),
        ("Handle._run", "asyncio/events.py"),
    }


def parse_frame(text: str) -> tuple[str, str]:
    """``function (file:line)`` -> (function, file)."""
    found = _FRAME.match(text)
    return (found["function"], found["file"]) if found else (text, "")


def bucket_of(frames: Sequence[tuple[str, str]]) -> str:
    """The bucket of a stack, outermost frame first (see the module's docstring)."""
    for function, file in reversed(frames):
        for bucket in BUCKETS:
            if bucket.matches(function, file):
                return bucket.name
    if frames and LOOP.matches(*frames[-1]):
        return LOOP.name
    return REST


def label(function: str, file: str) -> str:
    return f"{function} ({file})" if file else function


@dataclass
class Samples:
    """The collapsed stacks of one group of processes, counted."""

    processes: int = 0
    total: int = 0
    inclusive: Counter[str] = field(default_factory=Counter)
    leaf: Counter[str] = field(default_factory=Counter)
    buckets: Counter[str] = field(default_factory=Counter)

    def add(self, raw: str) -> None:
        """Add py-spy's raw output: one ``frame;frame;... count`` line per stack."""
        for line in raw.splitlines():
            stack, _, count = line.strip().rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = [parse_frame(f) for f in stack.split(";")]
            self.total += n
            # A sample that ends in an entry point or the loop's dispatch is in native
            # code under it: the selector's wait, an executor thread taking its next item.
            native = " + native code under it" if _scaffold(*frames[-1]) else ""
            self.leaf[label(*frames[-1]) + native] += n
            self.buckets[bucket_of(frames)] += n
            for frame in {label(*f) for f in frames if not _scaffold(*f)}:
                self.inclusive[frame] += n

    def share(self, counts: Counter[str], key: str) -> float:
        return counts[key] / self.total if self.total else 0.0


def _short(function: str) -> str:
    return function.replace(_NATS_PACKAGE, "server")


def nats_part(stack: Sequence[str]) -> str:
    """The part of nats-server a Go stack (innermost first) is counted in (``NATS_PARTS``)."""
    for function in stack:
        for name, pattern in NATS_PARTS:
            if pattern.search(function):
                return name
    return NATS_REST if any(_NATS_PACKAGE in f for f in stack) else NATS_RUNTIME


@dataclass
class GoSamples:
    """nats-server's CPU profiles, summed: CPU nanoseconds by part and by function."""

    total: int = 0
    windows: int = 0
    parts: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)
    leaf: Counter[str] = field(default_factory=Counter)

    def add(self, samples: Sequence[pprof.Sample]) -> None:
        self.windows += 1
        for sample in samples:
            if not sample.stack:
                continue
            self.total += sample.cpu_ns
            self.parts[nats_part(sample.stack)] += sample.cpu_ns
            self.leaf[_short(sample.stack[0])] += sample.cpu_ns
            # The server's own functions, less the goroutines' entry points every stack
            # of its kind passes through.
            for function in {_short(f) for f in sample.stack if _NATS_PACKAGE in f}:
                if not function.endswith((".startGoRoutine.func1", ".createClientEx.func1")):
                    self.inclusive[function] += sample.cpu_ns

    def share(self, counts: Counter[str], key: str) -> float:
        return counts[key] / self.total if self.total else 0.0


class _GoProfiles:
    """Consecutive CPU profiles of one Go server, until ``stop``; each kept as a file."""

    def __init__(self, url: str, folder: Path) -> None:
        self.url = url.rstrip("/") + f"/debug/pprof/profile?seconds={NATS_WINDOW}"
        self.folder = folder
        self.samples = GoSamples()
        self.error = ""
        self._stopping = asyncio.Event()
        self._task = asyncio.create_task(self._record())

    async def _record(self) -> None:
        async with httpx.AsyncClient(timeout=NATS_WINDOW + 30) as client:
            while not self._stopping.is_set():
                try:
                    answer = await client.get(self.url)
                    answer.raise_for_status()
                    window = self.folder / f"nats-server-{self.samples.windows}.pb.gz"
                    await asyncio.to_thread(window.write_bytes, answer.content)
                    self.samples.add(pprof.read(answer.content))
                except (httpx.HTTPError, ValueError) as exc:
                    self.error = f"{type(exc).__name__}: {exc}"
                    return

    async def stop(self) -> GoSamples:
        self._stopping.set()
        await self._task
        return self.samples


@dataclass
class Profile:
    """What ``Profiler.stop`` returns: the samples of each group, and py-spy's own cost."""

    folder: Path
    groups: dict[str, Samples]
    #: CPU seconds the py-spy processes used, on the same cores, counted in no group.
    own_cpu: float
    #: nats-server's own profiles, when the stack served them.
    nats: GoSamples | None = None
    #: Why nats-server's profiles ended early, if they did.
    nats_error: str = ""


@dataclass
class _Recording:
    group: str
    pid: int
    output: Path
    process: subprocess.Popen[bytes]
    log: IO[bytes]

    @property
    def log_path(self) -> Path:
        return self.output.with_suffix(".log")


def _start(folder: Path, groups: Mapping[str, Sequence[int]], longest: float) -> list[_Recording]:
    folder.mkdir(parents=True, exist_ok=True)
    recordings: list[_Recording] = []
    for group in SERVICES:
        for pid in groups.get(group, ()):
            output = folder / f"{group}-{pid}.txt"
            log = output.with_suffix(".log").open("wb")
            command = [
                py_spy(), "record", "--pid", str(pid), "--format", "raw",
                "--rate", str(RATE), "--nonblocking", "--duration", str(int(longest) + 1),
                "--output", str(output),
            ]  # fmt: skip
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
            recordings.append(_Recording(group, pid, output, process, log))
    return recordings


def py_spy() -> str:
    """The py-spy next to this interpreter (the project's dev extras), else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if not found:
        raise SystemExit("--profile needs py-spy: .venv/bin/pip install py-spy")
    return found


class Profiler:
    """py-spy recording every process of the named groups until ``stop``."""

    def __init__(
        self, folder: Path, recordings: list[_Recording], nats: _GoProfiles | None = None
    ) -> None:
        self.folder = folder
        self._recordings = recordings
        self._nats = nats
        # Were the run to fail between attach and stop, py-spy still ends with its
        # process; this ends it with the benchmark too.
        atexit.register(self._kill)

    @classmethod
    async def attach(
        cls,
        folder: Path,
        groups: Mapping[str, Sequence[int]],
        longest: float,
        nats_profile_url: str = "",
    ) -> Profiler:
        """Start py-spy on each pid and return once all of them are sampling; with
        ``nats_profile_url`` (``EmbeddedNats.profile_url``), nats-server's profiles too.

        ``longest`` bounds a recording (seconds), should nobody stop it.
        """
        profiler = cls(folder, await asyncio.to_thread(_start, folder, groups, longest))
        try:
            await profiler._sampling()
        except BaseException:
            profiler._kill()
            raise
        if nats_profile_url:
            profiler._nats = _GoProfiles(nats_profile_url, folder)
        return profiler

    async def _sampling(self) -> None:
        deadline = time.monotonic() + ATTACH_TIMEOUT
        waiting = list(self._recordings)
        while waiting:
            for r in list(waiting):
                said = r.log_path.read_text(errors="replace")
                if _BANNER in said:
                    waiting.remove(r)
                elif r.process.poll() is not None:
                    raise RuntimeError(f"py-spy on {r.group} (pid {r.pid}): {said.strip()}")
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(f"py-spy not sampling within {ATTACH_TIMEOUT:.0f} s")
            await asyncio.sleep(0.05)

    async def stop(self) -> Profile:
        """End every recording (SIGINT: py-spy writes its file) and count the samples."""
        own_cpu = 0.0
        for r in self._recordings:
            if r.process.poll() is None:
                own_cpu += cpu_seconds(r.process.pid) or 0.0
                r.process.send_signal(signal.SIGINT)
        nats = await self._nats.stop() if self._nats else None
        groups = await asyncio.to_thread(self._collect)
        atexit.unregister(self._kill)
        error = self._nats.error if self._nats else ""
        return Profile(self.folder, groups, own_cpu, nats, error)

    def _collect(self) -> dict[str, Samples]:
        groups: dict[str, Samples] = {}
        for r in self._recordings:
            try:
                r.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                r.process.kill()
                r.process.wait()
            r.log.close()
            samples = groups.setdefault(r.group, Samples())
            samples.processes += 1
            if r.output.exists():
                samples.add(r.output.read_text(errors="replace"))
        return groups

    def _kill(self) -> None:
        for r in self._recordings:
            if r.process.poll() is None:
                r.process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    r.process.wait(5)
            r.log.close()


def report(profile: Profile, cpu: Mapping[str, float], pages: int) -> str:
    """Per group: CPU a page by bucket, the top frames inclusive and self; then the rest."""
    folder, profiles = profile.folder, profile.groups
    if pages <= 0:
        return f"    profile: no page done, nothing to divide by (py-spy files in {folder})"

    def ms(seconds: float) -> str:
        return f"{1000 * seconds / pages:6.2f}"

    lines = [
        f"    CPU a page by process (py-spy at {RATE} Hz; ms = the group's CPU from /proc x "
        f"the share of its samples / {pages} pages; raw stacks in {folder}):"
    ]
    for group in SERVICES:
        if group not in profiles or group not in cpu:
            continue
        s, used = profiles[group], cpu[group]
        many = f", {s.processes} processes" if s.processes > 1 else ""
        per_tick = f"{s.total / (used * RATE):.1f}x" if used > 0 else "-"
        lines.append(
            f"    {group}{many}: {ms(used).strip()} ms a page ({used:.2f} s CPU); {s.total} "
            f"samples, {per_tick} its CPU at {RATE} Hz (a thread waiting for a core is "
            "sampled too)"
        )
        if not s.total:
            continue
        lines.append("      by bucket:")
        for name in BUCKET_NAMES:
            share = s.share(s.buckets, name)
            if share:
                lines.append(f"        {ms(used * share)} ms {share:6.1%}  {name}")
        lines.append(
            f"      inclusive, top {TOP_INCLUSIVE} (entry points and loop dispatch left out):"
        )
        for frame, _ in s.inclusive.most_common(TOP_INCLUSIVE):
            share = s.share(s.inclusive, frame)
            lines.append(f"        {ms(used * share)} ms {share:6.1%}  {frame}")
        lines.append(f"      self, top {TOP_SELF}:")
        for frame, _ in s.leaf.most_common(TOP_SELF):
            share = s.share(s.leaf, frame)
            lines.append(f"        {ms(used * share)} ms {share:6.1%}  {frame}")
    nats = profile.nats
    for group, name in UNSAMPLED.items():
        if group == "nats" and group in cpu and nats is not None and nats.total:
            lines.extend(_nats_lines(nats, cpu[group], ms))
        elif group in cpu:
            lines.append(
                f"    {name}: {ms(cpu[group]).strip()} ms a page ({cpu[group]:.2f} s CPU), "
                "not sampled"
            )
    if profile.nats_error:
        lines.append(f"    nats-server's profiles ended early: {profile.nats_error}")
    total = sum(cpu.values())
    lines.append(f"    all processes: {ms(total).strip()} ms a page ({total:.2f} s CPU)")
    lines.append(
        f"    py-spy itself: {profile.own_cpu:.2f} s CPU on the same cores, counted in none"
    )
    return "\n".join(lines)


def _nats_lines(nats: GoSamples, used: float, ms: Callable[[float], str]) -> list[str]:
    sampled = nats.total / 1e9
    lines = [
        f"    nats-server: {ms(used).strip()} ms a page ({used:.2f} s CPU); Go's profiler "
        f"sampled {sampled:.2f} s of it in {nats.windows} windows of {NATS_WINDOW} s "
        "(the last runs past the crawl; shares of the samples times the CPU)",
        "      by part:",
    ]
    for name in NATS_PART_NAMES:
        share = nats.share(nats.parts, name)
        if share:
            lines.append(f"        {ms(used * share)} ms {share:6.1%}  {name}")
    lines.append(f"      inclusive, top {TOP_INCLUSIVE} (goroutines' entry points left out):")
    for function, _ in nats.inclusive.most_common(TOP_INCLUSIVE):
        share = nats.share(nats.inclusive, function)
        lines.append(f"        {ms(used * share)} ms {share:6.1%}  {function}")
    lines.append(f"      self, top {TOP_SELF}:")
    for function, _ in nats.leaf.most_common(TOP_SELF):
        share = nats.share(nats.leaf, function)
        lines.append(f"        {ms(used * share)} ms {share:6.1%}  {function}")
    return lines
