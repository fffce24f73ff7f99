"""docs/deploy.md and k8s/README.md agree with the files they describe."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.deploy._kustomize import containers
from tests.deploy._support import REPO, find, rendered
from trove_schema import topology
from trove_schema.settings import known_keys

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


def test_resources_table_matches_the_manifests() -> None:
    text = (REPO / "docs" / "deploy.md").read_text("utf-8")
    manifests = rendered("base")
    for name in ("fetcher", "discovery", "recorder"):
        (container,) = containers(find(manifests, "Deployment", f"trove-{name}"))
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        cpu = limits["cpu"] if limits["cpu"] != "1" else "1 CPU"
        row = f"| {name} | {requests['cpu']}, {requests['memory']} | {cpu}, {limits['memory']} |"
        assert row in text, row
