"""The committed AsyncAPI document is the one the code generates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_committed_asyncapi_document_is_current(tmp_path: Path) -> None:
    out = tmp_path / "asyncapi.yaml"
    subprocess.run(
        [sys.executable, "-m", "faststream", "docs", "gen", "trove_schema.asyncapi:app",
         "--yaml", "--out", str(out)],
        check=True, capture_output=True, cwd=tmp_path,
    )  # fmt: skip
    committed = yaml.safe_load((ROOT / "docs" / "asyncapi.yaml").read_text())
    assert yaml.safe_load(out.read_text()) == committed, "run `make asyncapi` and commit it"


def test_asyncapi_lists_every_event_subject() -> None:
    document = yaml.safe_load((ROOT / "docs" / "asyncapi.yaml").read_text())
    addresses = {channel["address"] for channel in document["channels"].values()}
    assert {
        "trove.seeds",
        "trove.events.page.discovered",
        "trove.events.crawl.requested",
        "trove.events.crawl.completed",
        "trove.events.seed.rejected",
    } <= addresses
    schemas = set(document["components"]["schemas"])
    assert {"PageDiscovered", "CrawlRequested", "CrawlCompleted", "SeedRejected"} <= schemas
