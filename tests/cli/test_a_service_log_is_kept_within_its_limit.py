"""A local stack left running for months: each service's log is kept within a limit
(the last one kept aside), and a process's last lines are read from its log's end."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.conftest import eventually
from trove_cli.supervisor import RestartPolicy, Supervisor
from trove_stack.processes import TAIL_BYTES, Child

#: Writes numbered lines, a thousand a second (a service's chatter, not a wait: flat out
#: it would write hundreds of MB between two looks), until it is stopped.
CHATTY = (
    "import itertools, sys, time\n"
    "for n in itertools.count():\n"
    "    sys.stdout.write(f'line {n}\\n'); sys.stdout.flush(); time.sleep(0.001)\n"
)


def numbers(path: Path) -> list[int]:
    return [int(line.split()[1]) for line in path.read_text().splitlines()]


async def test_a_log_past_its_limit_is_kept_aside_and_the_process_writes_on_from_its_start(
    tmp_path: Path,
) -> None:
    log = tmp_path / "logs" / "chatty-0.log"
    children = [Child("chatty-0", [sys.executable, "-c", CHATTY], log_path=log)]
    supervisor = Supervisor(
        children,
        lambda name: children[0],
        state_dir=tmp_path,
        policy=RestartPolicy(poll_interval=0.05),
        log_limit=4096,
        log_check_interval=0.0,
    )
    supervisor.start()
    try:
        said = tmp_path / "logs" / "supervisor.log"

        async def trimmed() -> str:
            return said.read_text() if said.exists() else ""

        await eventually(trimmed, until=lambda text: "kept as chatty-0.log.1" in text,
                         timeout=30, what="the log kept aside")  # fmt: skip
        supervisor.stop()  # no second trim while it is read
        kept = log.with_name("chatty-0.log.1")

        async def written_on() -> list[int]:
            return numbers(log)

        after = await eventually(written_on, until=lambda ns: len(ns) >= 20, timeout=30,
                                 what="lines after the trim")  # fmt: skip
        before = numbers(kept)
    finally:
        supervisor.stop()
        children[0].stop(timeout=5)
    # Whole lines from the start (no hole of the old length before them), going on
    # from where the kept log ends: none twice, and none lost but those written
    # between the copy and the truncation (a millisecond's, a second's at the most).
    assert not log.read_bytes().startswith(b"\0")
    assert len(before) > 4096 // len("line 9999\n")
    assert after == list(range(after[0], after[0] + len(after)))
    assert before[-1] < after[0] <= before[-1] + 1000


def test_the_last_lines_are_read_from_the_end_of_a_long_log(tmp_path: Path) -> None:
    log = tmp_path / "long.log"
    with log.open("w") as out:
        for n in range(200_000):  # 2.6 MB, forty times what is read
            out.write(f"line {n}\n")
    child = Child("done", [sys.executable, "-c", "pass"], log_path=log)
    child.proc.wait(10)
    assert log.stat().st_size > 10 * TAIL_BYTES
    assert child.tail(3) == "line 199997\nline 199998\nline 199999"
    # The line the seek cut is left out, not shown as a fragment.
    assert len(child.tail(100_000).splitlines()) < TAIL_BYTES // len("line 199999\n") + 1
    assert all(line.startswith("line ") for line in child.tail(100_000).splitlines())


#: Writes 10 KB of numbered lines, then waits to be stopped, or ends with code 3.
WRITES_THEN = "import signal, sys\nsys.stdout.write(''.join(f'line {n}\\n' for n in range(1000)))\n"


async def test_the_log_of_a_process_that_ended_is_kept_whole_for_its_exit(
    tmp_path: Path,
) -> None:
    logs = tmp_path / "logs"
    running = Child(
        "running-0",
        [sys.executable, "-c", WRITES_THEN + "sys.stdout.flush(); signal.pause()"],
        log_path=logs / "running-0.log",
    )
    ended = Child(
        "ended-0",
        [sys.executable, "-c", WRITES_THEN + "sys.exit(3)"],
        log_path=logs / "ended-0.log",
    )
    children = [running, ended]
    supervisor = Supervisor(
        children,
        lambda name: next(c for c in children if c.name == name),
        state_dir=tmp_path,
        policy=RestartPolicy(first_delay=600.0),
        log_limit=4096,
        log_check_interval=0.0,
    )
    try:
        ended.proc.wait(10)

        async def written() -> int:
            return running.log_path.stat().st_size if running.log_path.exists() else 0

        await eventually(written, until=lambda size: size > 4096, timeout=10, what="10 KB")
        supervisor.check()  # one look, as the supervisor's thread takes them
    finally:
        running.stop(timeout=5)
    # The running one's log is kept aside and begun again; the one that ended keeps its
    # last lines for the message that says how it ended.
    assert running.log_path.with_name("running-0.log.1").exists()
    assert not ended.log_path.with_name("ended-0.log.1").exists()
    assert ended.tail(1) == "line 999"
