"""SIGTERM and SIGHUP stop a command as Ctrl-C does: its task is cancelled, and each
part stops in turn. Raised wherever it landed, the signal's ``KeyboardInterrupt`` could
end a client's own task (nats-py's reader, say) whose work the stopping then waited for:
`trove crawl` stopped its stack and hung."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

# A command whose client has a task of its own, busy nearly all the time (a signal lands
# there), which its closing needs: as nats-py's close needs its reader and flusher.
COMMAND = """
import asyncio, signal, sys, time
from trove_cli.main import _stops

async def command() -> int:
    stop, closed = asyncio.Event(), asyncio.Event()

    async def client() -> None:
        while not stop.is_set():
            began = time.monotonic()
            while time.monotonic() - began < 0.01:
                pass
            await asyncio.sleep(0)
        closed.set()

    running = asyncio.create_task(client())
    print("ready", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        stop.set()
        await closed.wait()
        await running
        print("closed", flush=True)
    return 0

signal.signal(signal.SIGTERM, _stops)
signal.signal(signal.SIGHUP, _stops)
sys.exit(asyncio.run(_stops.run(command())))
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
async def test_a_command_stopped_by_a_signal_lets_its_clients_close(signum: int) -> None:
    roots = [str(Path(__file__).resolve().parents[2] / "cli"), os.environ.get("PYTHONPATH", "")]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        COMMAND,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, roots))},
    )
    assert proc.stdout is not None
    try:
        assert await asyncio.wait_for(proc.stdout.readline(), timeout=30) == b"ready\n"
        proc.send_signal(signum)
        printed, _ = await asyncio.wait_for(proc.communicate(), timeout=30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert printed == b"closed\n"
    assert proc.returncode == 130
