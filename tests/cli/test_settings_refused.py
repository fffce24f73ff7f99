"""A `trove` command given a TROVE_* setting it cannot use refuses it as a service does."""

from __future__ import annotations

import pytest

from trove_cli.main import main


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("TROVE_MIN_DOMAIN_DELAY_SECOND", "1", "did you mean TROVE_MIN_DOMAIN_DELAY_SECONDS"),
        ("TROVE_REPLICAS", "abc", "TROVE_REPLICAS"),
    ],
    ids=["an unknown name", "a refused value"],
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
