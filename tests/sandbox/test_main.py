"""``python -m trove_sandbox``: what an operator runs and reads."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import httpx
import pytest

from trove_sandbox.__main__ import build_parser, main


async def start_cli(
    *args: str, command: tuple[str, ...] = ("trove_sandbox",)
) -> tuple[asyncio.subprocess.Process, list[str]]:
    """Start the CLI (``python -m`` ``command``) and read its banner up to the last
    environment line."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        *command,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    lines: list[str] = []
    try:
        while not lines or not lines[-1].startswith("TROVE_ALLOWED_NETWORKS="):
            line = await asyncio.wait_for(process.stdout.readline(), 20.0)
            assert line, "the sandbox CLI exited before printing its environment"
            lines.append(line.decode().rstrip("\n"))
    except BaseException:
        process.kill()
        await process.wait()
        raise
    return process, lines


async def stop_cli(process: asyncio.subprocess.Process, sig: signal.Signals) -> tuple[int, str]:
    process.send_signal(sig)
    _, stderr = await asyncio.wait_for(process.communicate(), 20.0)
    assert process.returncode is not None
    return process.returncode, stderr.decode()


async def test_trove_sandbox_takes_the_sandboxs_own_options() -> None:
    """``trove sandbox --hosts 2`` (and ``--fediverse``, which PLATFORM names) was refused
    as an unknown option of trove's own."""
    process, lines = await start_cli(
        "--hosts", "2", "--pages", "3", "--base-ip", "127.0.0.68", command=("trove_cli", "sandbox")
    )
    code, _ = await stop_cli(process, signal.SIGINT)
    seeds = [line.strip() for line in lines if line.startswith("  http://")]
    assert len(seeds) == 2
    assert code == 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_cli_prints_seeds_and_environment_and_stops_on_a_signal(
    tmp_path: Path, sig: signal.Signals
) -> None:
    witness = tmp_path / "witness.jsonl"
    process, lines = await start_cli(
        "--hosts", "2", "--pages", "3", "--base-ip", "127.0.0.60", "--witness", str(witness)
    )
    try:
        seeds = [line.strip() for line in lines if line.startswith("  http://")]
        assert len(seeds) == 2
        assert seeds[0].startswith("http://alice-blog.trove.test:")
        env = dict(line.split("=", 1) for line in lines if line.startswith("TROVE_"))
        assert env["TROVE_RESOLVE"] == (
            "alice-blog.trove.test=127.0.0.60,bob-notes.trove.test=127.0.0.61"
        )
        assert env["TROVE_ALLOWED_NETWORKS"] == "127.0.0.0/24"
        port = int(seeds[0].rsplit(":", 1)[1].rstrip("/"))
        async with httpx.AsyncClient(trust_env=False, timeout=10.0) as client:
            response = await client.get(
                f"http://127.0.0.61:{port}/", headers={"Host": "bob-notes.trove.test"}
            )
        assert response.status_code == 200
        entry = json.loads(witness.read_text().splitlines()[0])
        assert (entry["host"], entry["path"], entry["status"]) == ("bob-notes.trove.test", "/", 200)
    finally:
        code, stderr = await stop_cli(process, sig)
    assert code == 0
    assert "Traceback" not in stderr


async def test_cli_can_serve_the_trap_host_too() -> None:
    process, lines = await start_cli(
        "--hosts", "1", "--pages", "1", "--base-ip", "127.0.0.70", "--trap"
    )
    try:
        assert any("trap.trove.test" in line and "not a seed" in line for line in lines)
        resolve = next(line for line in lines if line.startswith("TROVE_RESOLVE="))
        assert resolve.endswith(",trap.trove.test=127.0.0.71")
    finally:
        code, _ = await stop_cli(process, signal.SIGINT)
    assert code == 0


def test_cli_refuses_an_impossible_web(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--hosts", "0"]) == 2
    assert "at least one host" in capsys.readouterr().err


def test_cli_options_have_sensible_defaults() -> None:
    args = build_parser().parse_args([])
    assert (args.hosts, args.pages, args.port, args.witness) == (6, 8, 0, None)
    assert args.trap is False
