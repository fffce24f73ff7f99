"""A `trove` command given a TROVE_* setting it cannot use refuses it as a service does."""

from __future__ import annotations

from pathlib import Path

import pytest

from trove_cli.main import main


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("TROVE_MIN_DOMAIN_DELAY_SECOND", "1", "did you mean TROVE_MIN_DOMAIN_DELAY_SECONDS"),
        ("TROVE_REPLICAS", "abc", "TROVE_REPLICAS"),
        (
            "TROVE_DATABASE_URL",
            "postgresql+asyncpg://trove:s3cr3t@127.0.0.1:99999/trove",
            "TROVE_DATABASE_URL: Value error, port 99999 is not one from 1 to 65535",
        ),
        (
            "TROVE_DATABASE_URL",
            "postgresql+asyncpg://trove:s3cr3t@127.0.0.1:abc/trove",
            "TROVE_DATABASE_URL: Value error, not a database URL",
        ),
        (
            "TROVE_DATABASE_URL",
            "postgresql+asyncpg://trove:s3cr3t@127.0.0.1/trove?sslmode=require",
            "not libpq's sslmode",
        ),
    ],
    ids=[
        "an unknown name",
        "a refused value",
        "a database port past 65535",
        "a database port that is no number",
        "libpq's sslmode",
    ],
)
def test_a_setting_it_cannot_use_ends_the_command_with_exit_2_before_any_server_is_asked(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    value: str,
    said: str,
) -> None:
    # Nothing listens here: a command that went on would fail on the broker instead.
    monkeypatch.setenv("TROVE_NATS_URL", "nats://127.0.0.1:9")
    monkeypatch.setenv(variable, value)

    code = main(["status"])

    out = " ".join(capsys.readouterr().out.split())
    assert code == 2, out
    assert "error: settings:" in out
    assert said in out
    assert "s3cr3t" not in out
    assert "Traceback" not in out


@pytest.mark.parametrize(
    ("command", "variable", "value"),
    [
        (["crawl", "--sandbox", "--timeout", "60"], "TROVE_MAX_DEPTH", "abc"),
        (["up"], "TROVE_RESOLVE", "a.example"),
        (["crawl", "https://a.example/", "--timeout", "60"], "TROVE_MAX_ATTEMPTS", "0"),
    ],
    ids=["discovery's", "the fetcher's", "the recorder's"],
)
def test_a_service_setting_it_cannot_use_ends_up_and_crawl_before_any_service_starts(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    command: list[str],
    variable: str,
    value: str,
) -> None:
    # Checked by the service alone, it exited 2 at each restart, and a crawl waited on it
    # until its timeout, then said that its seeds were known from an earlier crawl.
    monkeypatch.setenv("TROVE_STATE_DIR", str(tmp_path))
    monkeypatch.setenv(variable, value)

    code = main(command)

    out = " ".join(capsys.readouterr().out.split())
    assert code == 2, out
    assert "error: settings:" in out
    assert variable in out
    assert not (tmp_path / "nats").exists()  # refused before any server started
