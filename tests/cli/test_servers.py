"""Which servers a command talks to: the TROVE_* URLs, or the stack `trove up` started."""

from __future__ import annotations

import json
from pathlib import Path

from trove_cli.local import STACK_FILE
from trove_cli.main import _urls
from trove_schema.settings import CommonSettings

LOCAL_NATS = "nats://127.0.0.1:4222"
LOCAL_DB = "postgresql+asyncpg://trove@127.0.0.1:5432/trove"
PROD_DB = "postgresql+asyncpg://trove@db.example.internal:5432/trove"


def settings(state: Path, nats_url: str = "", database_url: str = "") -> CommonSettings:
    (state / STACK_FILE).write_text(
        json.dumps({"TROVE_NATS_URL": LOCAL_NATS, "TROVE_DATABASE_URL": LOCAL_DB})
    )
    return CommonSettings.model_validate(
        {"state_dir": state, "nats_url": nats_url, "database_url": database_url}
    )


def test_a_running_stack_fills_in_only_what_belongs_with_the_urls_given(tmp_path: Path) -> None:
    assert _urls(settings(tmp_path)) == (LOCAL_NATS, LOCAL_DB)
    assert _urls(settings(tmp_path, database_url=LOCAL_DB)) == (LOCAL_NATS, LOCAL_DB)
    # A production database is never paired with this machine's event record (a
    # replay would fill it with the laptop's crawl): the broker must be named too.
    assert _urls(settings(tmp_path, database_url=PROD_DB)) == ("", PROD_DB)
    assert _urls(settings(tmp_path, nats_url="nats://nats.example:4222")) == (
        "nats://nats.example:4222",
        "",
    )
