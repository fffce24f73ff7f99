"""The tests' small kustomize renders what it supports and refuses what it does not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy._kustomize import KustomizeError, apply_json_patch, render, split_image

DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "web", "annotations": {"a/b": "1"}},
    "spec": {
        "replicas": 2,
        "template": {"spec": {"containers": [{"name": "c", "image": "example/web:1.0"}]}},
    },
}


def write(folder: Path, name: str, content: Any) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(yaml.safe_dump(content), encoding="utf-8")


def project(tmp_path: Path, overlay: dict[str, Any]) -> Path:
    write(tmp_path / "base", "web.yaml", DEPLOYMENT)
    write(
        tmp_path / "base",
        "kustomization.yaml",
        {"resources": ["web.yaml"], "namespace": "apps"},
    )
    write(tmp_path / "overlay", "kustomization.yaml", {"resources": ["../base"], **overlay})
    return tmp_path / "overlay"


def test_overlay_applies_images_replicas_and_json_patches(tmp_path: Path) -> None:
    overlay = project(
        tmp_path,
        {
            "images": [{"name": "example/web", "newName": "web", "newTag": "local"}],
            "replicas": [{"name": "web", "count": 1}],
            "patches": [
                {
                    "target": {"kind": "Deployment", "name": "web"},
                    "patch": yaml.safe_dump(
                        [
                            {"op": "add", "path": "/metadata/labels", "value": {"x": "y"}},
                            {"op": "replace", "path": "/metadata/annotations/a~1b", "value": "2"},
                        ]
                    ),
                }
            ],
        },
    )
    (deployment,) = render(overlay)
    assert deployment["metadata"]["namespace"] == "apps"
    assert deployment["metadata"]["labels"] == {"x": "y"}
    assert deployment["metadata"]["annotations"] == {"a/b": "2"}
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "web:local"


@pytest.mark.parametrize(
    "overlay",
    [
        {"commonLabels": {"a": "b"}},
        {"configMapGenerator": [{"name": "x", "literals": ["a=b"]}]},
        {"patches": [{"target": {"kind": "Deployment", "name": "web"}, "patch": "spec: {}"}]},
        {"patches": [{"target": {"kind": "Deployment", "name": "nope"}, "patch": "[]"}]},
        {"patches": [{"target": {"labelSelector": "a=b"}, "patch": "[]"}]},
        {"images": [{"name": "example/other", "newTag": "2"}]},
        {"replicas": [{"name": "nope", "count": 1}]},
    ],
)
def test_unsupported_or_dangling_kustomizations_are_refused(
    tmp_path: Path, overlay: dict[str, Any]
) -> None:
    with pytest.raises(KustomizeError):
        render(project(tmp_path, overlay))


def test_files_outside_the_kustomization_root_are_refused(tmp_path: Path) -> None:
    write(tmp_path, "web.yaml", DEPLOYMENT)
    write(tmp_path / "overlay", "kustomization.yaml", {"resources": ["../web.yaml"]})
    with pytest.raises(KustomizeError, match="outside"):
        render(tmp_path / "overlay")


def test_duplicate_resources_are_refused(tmp_path: Path) -> None:
    write(tmp_path, "web.yaml", DEPLOYMENT)
    write(tmp_path, "kustomization.yaml", {"resources": ["web.yaml", "web.yaml"]})
    with pytest.raises(KustomizeError, match="two resources"):
        render(tmp_path)


def test_json_patch_follows_rfc_6902() -> None:
    document: dict[str, Any] = {"list": [1, 2], "map": {"k": "v"}}
    apply_json_patch(
        document,
        [
            {"op": "add", "path": "/list/-", "value": 3},
            {"op": "add", "path": "/list/0", "value": 0},
            {"op": "remove", "path": "/list/1"},
            {"op": "replace", "path": "/map/k", "value": "w"},
        ],
    )
    assert document == {"list": [0, 2, 3], "map": {"k": "w"}}
    for operation in (
        {"op": "replace", "path": "/map/missing", "value": 1},
        {"op": "remove", "path": "/list/9"},
        {"op": "add", "path": "/missing/k", "value": 1},
        {"op": "move", "from": "/map/k", "path": "/map/j"},
    ):
        with pytest.raises(KustomizeError):
            apply_json_patch(document, [operation])


@pytest.mark.parametrize(
    ("image", "parts"),
    [
        ("trove", ("trove", None, None)),
        ("trove:local", ("trove", "local", None)),
        ("ghcr.io/a/trove:0.1.0", ("ghcr.io/a/trove", "0.1.0", None)),
        ("registry:5000/trove", ("registry:5000/trove", None, None)),
        ("r:5000/t:1@sha256:ab", ("r:5000/t", "1", "sha256:ab")),
    ],
)
def test_image_references_split_into_name_tag_and_digest(
    image: str, parts: tuple[str, str | None, str | None]
) -> None:
    assert split_image(image) == parts


def test_a_generated_config_map_is_named_by_its_content_and_so_are_its_references(
    tmp_path: Path,
) -> None:
    # As kustomize does: a changed setting is a new name in every pod template, which
    # rolls the pods; a rollback's pods name the settings of their own release.
    base = tmp_path / "base"
    web = {
        **DEPLOYMENT,
        "spec": {
            "replicas": 1,
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "image": "example/web:1.0",
                            "envFrom": [{"configMapRef": {"name": "settings"}}],
                        }
                    ]
                }
            },
        },
    }
    write(base, "web.yaml", web)
    (base / "settings.env").write_text("# a comment\nA=1\n\nB=two words\n", encoding="utf-8")
    generator = {"name": "settings", "envs": ["settings.env"]}
    write(
        base, "kustomization.yaml", {"resources": ["web.yaml"], "configMapGenerator": [generator]}
    )
    patch = "- op: replace\n  path: /data/A\n  value: '2'\n"
    overlay = project_overlay(
        tmp_path, [{"target": {"kind": "ConfigMap", "name": "settings"}, "patch": patch}]
    )

    names = []
    for directory in (base, overlay):
        manifests = render(directory)
        (config,) = [m for m in manifests if m["kind"] == "ConfigMap"]
        (deployment,) = [m for m in manifests if m["kind"] == "Deployment"]
        name = config["metadata"]["name"]
        assert name.startswith("settings-")
        assert len(name) == len("settings-") + 10
        assert "annotations" not in config["metadata"]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["envFrom"] == [{"configMapRef": {"name": name}}]
        names.append(name)
    assert render(base)[1]["data"] == {"A": "1", "B": "two words"}
    assert names[0] != names[1]  # the overlay's patch changed the content
    assert render(base)[1]["metadata"]["name"] == names[0]  # and the same content, the same


def project_overlay(tmp_path: Path, patches: list[dict[str, Any]]) -> Path:
    write(
        tmp_path / "overlay", "kustomization.yaml", {"resources": ["../base"], "patches": patches}
    )
    return tmp_path / "overlay"


def test_a_settings_file_line_that_is_not_key_equals_value_is_refused(tmp_path: Path) -> None:
    (tmp_path / "settings.env").write_text("A=1\nnot a setting\n", encoding="utf-8")
    generator = {"name": "settings", "envs": ["settings.env"]}
    write(tmp_path, "kustomization.yaml", {"configMapGenerator": [generator]})
    with pytest.raises(KustomizeError, match=r"settings\.env:2"):
        render(tmp_path)
