"""docs/deploy.md and k8s/README.md agree with the files they describe."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.deploy._kustomize import containers
from tests.deploy._support import REPO, find, rendered
from trove_schema import topology
from trove_schema.settings import ALL_SETTINGS, known_keys

DOCS = [REPO / "docs" / "deploy.md", REPO / "k8s" / "README.md"]
STREAMS = {
    topology.SEEDS_STREAM,
    topology.EVENTS_STREAM,
    topology.WORK_STREAM,
    topology.DEAD_STREAM,
}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_paths_named_in_the_docs_exist(doc: Path) -> None:
    text = doc.read_text("utf-8")
    paths = set(re.findall(r"`((?:k8s|tests|docs)/[\w./-]*)`", text))
    paths |= set(re.findall(r"-[fk] ((?:k8s)/[\w./-]+)", text))
    assert paths
    for path in paths:
        assert (REPO / path).exists(), path


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_settings_named_in_the_docs_are_known(doc: Path) -> None:
    text = doc.read_text("utf-8")
    names = set(re.findall(r"\bTROVE_[A-Z0-9_]*[A-Z0-9]\b", text)) - STREAMS
    assert names <= known_keys(), sorted(names - known_keys())


def test_every_setting_is_described_under_settings() -> None:
    text = (REPO / "docs" / "deploy.md").read_text("utf-8")
    section = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"\bTROVE_[A-Z0-9_]*[A-Z0-9]\b", section))
    assert known_keys() <= named, sorted(known_keys() - named)


def _settings_rows() -> list[tuple[list[str], list[str]]]:
    """(names, defaults) of each row of docs/deploy.md's settings table."""
    text = (REPO / "docs" / "deploy.md").read_text("utf-8")
    section = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| `TROVE_"):
            continue
        names_cell, default_cell = (c.strip() for c in line.strip("|").split("|")[:2])
        names = re.findall(r"`(TROVE_[A-Z0-9_]+)`", names_cell)
        # A comma inside brackets is the note's, not a separator of defaults.
        defaults = [d.strip() for d in re.split(r",(?![^(]*\))", default_cell)]
        rows.append((names, defaults * len(names) if len(defaults) == 1 else defaults))
    return rows


def test_the_settings_table_gives_the_defaults_of_the_code() -> None:
    defaults = {
        f"TROVE_{name.upper()}": field.get_default(call_default_factory=True)
        for cls in ALL_SETTINGS
        for name, field in cls.model_fields.items()
    }
    checked = 0
    for names, written in _settings_rows():
        assert len(names) == len(written), names
        for name, cell in zip(names, written, strict=True):
            value, shown = defaults[name], cell.split(" ")[0]
            if shown in ("", "—"):
                assert not value, f"{name}: the table says none, the code {value!r}"
                continue
            if isinstance(value, bool | str) or value is None:
                assert shown.strip("`").lower() == str(value).lower(), (name, shown, value)
            else:
                assert float(shown) == float(value), (name, shown, value)
            checked += 1
    assert checked > 50


def test_resources_table_matches_the_manifests() -> None:
    text = (REPO / "docs" / "deploy.md").read_text("utf-8")
    manifests = rendered("base")
    for name in ("fetcher", "discovery", "recorder"):
        (container,) = containers(find(manifests, "Deployment", f"trove-{name}"))
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        cpu = limits["cpu"] if limits["cpu"] != "1" else "1 CPU"
        row = f"| {name} | {requests['cpu']}, {requests['memory']} | {cpu}, {limits['memory']} |"
        assert row in text, row
