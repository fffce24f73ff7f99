"""A small, strict kustomize: enough to render Trove's overlays without the binary.

It supports exactly what ``k8s/`` uses: ``resources`` (files inside the
kustomization's folder, and folders holding a kustomization.yaml), ``namespace``,
``images``, ``replicas``, and ``patches`` in JSON 6902 form with a ``kind``/``name``
target. Anything else is refused rather than ignored, so an overlay cannot rely on a
feature these tests would silently skip. Where kustomize is lenient (an image, a
replica count or a patch target that matches nothing), this is stricter: a typo in an
overlay fails here.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

Manifest = dict[str, Any]

SUPPORTED_FIELDS = frozenset(
    {"apiVersion", "kind", "namespace", "resources", "images", "replicas", "patches"}
)
CLUSTER_SCOPED = frozenset(
    {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "PersistentVolume",
        "PriorityClass",
        "StorageClass",
    }
)
SCALABLE = frozenset({"Deployment", "ReplicaSet", "StatefulSet"})


class KustomizeError(Exception):
    """The kustomization uses something this renderer does not do, or is wrong."""


def load_documents(path: Path) -> list[Manifest]:
    """Every non-empty YAML document of a file; each must be a mapping."""
    with path.open(encoding="utf-8") as handle:
        documents = [doc for doc in yaml.safe_load_all(handle) if doc is not None]
    for doc in documents:
        if not isinstance(doc, dict):
            raise KustomizeError(f"{path}: a document is not a mapping: {doc!r}")
    return documents


def render(directory: Path) -> list[Manifest]:
    """The manifests ``kubectl kustomize directory`` would produce (for what we support)."""
    root = directory.resolve()
    kustomization_file = root / "kustomization.yaml"
    if not kustomization_file.is_file():
        raise KustomizeError(f"{root}: no kustomization.yaml")
    kustomization = yaml.safe_load(kustomization_file.read_text(encoding="utf-8"))
    unsupported = set(kustomization) - SUPPORTED_FIELDS
    if unsupported:
        raise KustomizeError(f"{kustomization_file}: unsupported fields {sorted(unsupported)}")
    if kustomization.get("kind", "Kustomization") != "Kustomization":
        raise KustomizeError(f"{kustomization_file}: not a Kustomization")

    manifests: list[Manifest] = []
    for entry in kustomization.get("resources", []):
        path = (root / entry).resolve()
        if path.is_dir():
            manifests.extend(render(path))
        elif path.is_file():
            # kustomize's default load restrictor: files only from inside the root.
            if not path.is_relative_to(root):
                raise KustomizeError(f"{kustomization_file}: {entry} is outside {root}")
            manifests.extend(load_documents(path))
        else:
            raise KustomizeError(f"{kustomization_file}: resource {entry} not found")
    manifests = copy.deepcopy(manifests)

    for patch in kustomization.get("patches", []):
        _apply_patch(manifests, patch, root)
    if "namespace" in kustomization:
        for manifest in manifests:
            if manifest["kind"] not in CLUSTER_SCOPED:
                manifest.setdefault("metadata", {})["namespace"] = kustomization["namespace"]
    for image in kustomization.get("images", []):
        _set_image(manifests, image)
    for replica in kustomization.get("replicas", []):
        _set_replicas(manifests, replica)
    _check_unique(manifests)
    return manifests


def pod_specs(manifest: Manifest) -> Iterator[dict[str, Any]]:
    """The pod spec(s) of a workload (none for other kinds)."""
    kind, spec = manifest["kind"], manifest.get("spec", {})
    if kind == "Pod":
        yield spec
    elif kind in {"Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job"}:
        yield spec["template"]["spec"]
    elif kind == "CronJob":
        yield spec["jobTemplate"]["spec"]["template"]["spec"]


def containers(manifest: Manifest) -> Iterator[dict[str, Any]]:
    for spec in pod_specs(manifest):
        yield from spec.get("initContainers", [])
        yield from spec.get("containers", [])


def split_image(image: str) -> tuple[str, str | None, str | None]:
    """``registry:5000/name:tag@sha256:...`` -> (name, tag, digest)."""
    name, _, digest = image.partition("@")
    tag = None
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
    return name, tag, digest or None


def apply_json_patch(document: Any, operations: list[dict[str, Any]]) -> None:
    """RFC 6902 add, remove and replace, in place (test/move/copy are refused)."""
    for operation in operations:
        op, path = operation.get("op"), operation.get("path")
        if not isinstance(path, str) or not path.startswith("/"):
            raise KustomizeError(f"bad JSON patch path: {path!r}")
        parts = [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]
        parent = _walk(document, parts[:-1], path)
        key = parts[-1]
        if op == "add":
            value = copy.deepcopy(operation["value"])
            if isinstance(parent, list):
                index = len(parent) if key == "-" else _index(parent, key, path, insert=True)
                parent.insert(index, value)
            elif isinstance(parent, dict):
                parent[key] = value
            else:
                raise KustomizeError(f"{path}: parent is not a container")
        elif op == "replace":
            value = copy.deepcopy(operation["value"])
            if isinstance(parent, list):
                parent[_index(parent, key, path)] = value
            elif isinstance(parent, dict) and key in parent:
                parent[key] = value
            else:
                raise KustomizeError(f"{path}: nothing to replace")
        elif op == "remove":
            if isinstance(parent, list):
                del parent[_index(parent, key, path)]
            elif isinstance(parent, dict) and key in parent:
                del parent[key]
            else:
                raise KustomizeError(f"{path}: nothing to remove")
        else:
            raise KustomizeError(f"unsupported JSON patch op: {op!r}")


def _walk(document: Any, parts: list[str], path: str) -> Any:
    node = document
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list):
            node = node[_index(node, part, path)]
        else:
            raise KustomizeError(f"{path}: {part!r} does not exist")
    return node


def _index(items: list[Any], key: str, path: str, *, insert: bool = False) -> int:
    if not key.isdigit():
        raise KustomizeError(f"{path}: {key!r} is not a list index")
    index = int(key)
    if index > len(items) or (index == len(items) and not insert):
        raise KustomizeError(f"{path}: index {index} out of range")
    return index


def _apply_patch(manifests: list[Manifest], patch: dict[str, Any], root: Path) -> None:
    target = patch.get("target") or {}
    if not target or set(target) - {"kind", "name"}:
        raise KustomizeError(f"patch target must be kind/name only: {target!r}")
    if "patch" in patch:
        body = yaml.safe_load(patch["patch"])
    elif "path" in patch:
        body = yaml.safe_load((root / patch["path"]).read_text(encoding="utf-8"))
    else:
        raise KustomizeError(f"patch without patch or path: {patch!r}")
    if not isinstance(body, list):
        raise KustomizeError("only JSON 6902 patches (a list of operations) are supported")
    matched = [
        m
        for m in manifests
        if m["kind"] == target.get("kind", m["kind"])
        and m["metadata"]["name"] == target.get("name", m["metadata"]["name"])
    ]
    if not matched:
        raise KustomizeError(f"patch target matches nothing: {target!r}")
    for manifest in matched:
        apply_json_patch(manifest, body)


def _set_image(manifests: list[Manifest], image: dict[str, Any]) -> None:
    unsupported = set(image) - {"name", "newName", "newTag", "digest"}
    if unsupported:
        raise KustomizeError(f"unsupported image fields {sorted(unsupported)}")
    found = False
    for manifest in manifests:
        for container in containers(manifest):
            name, tag, digest = split_image(container["image"])
            if name != image["name"]:
                continue
            found = True
            new = image.get("newName", name)
            if "digest" in image:
                new += "@" + image["digest"]
            elif "newTag" in image or tag:
                new += ":" + str(image.get("newTag", tag))
                if digest and "newTag" not in image:
                    new += "@" + digest
            container["image"] = new
    if not found:
        raise KustomizeError(f"image {image['name']} is used by no container")


def _set_replicas(manifests: list[Manifest], replica: dict[str, Any]) -> None:
    matched = [
        m for m in manifests if m["kind"] in SCALABLE and m["metadata"]["name"] == replica["name"]
    ]
    if not matched:
        raise KustomizeError(f"replicas: no workload named {replica['name']}")
    for manifest in matched:
        manifest["spec"]["replicas"] = replica["count"]


def _check_unique(manifests: list[Manifest]) -> None:
    seen: set[tuple[str, str, str, str]] = set()
    for manifest in manifests:
        meta = manifest["metadata"]
        key = (
            manifest["apiVersion"].split("/")[0] if "/" in manifest["apiVersion"] else "",
            manifest["kind"],
            meta.get("namespace", ""),
            meta["name"],
        )
        if key in seen:
            raise KustomizeError(f"two resources with the id {key}")
        seen.add(key)
