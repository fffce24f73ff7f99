"""A small, strict kustomize: enough to render Trove's overlays without the binary.

It supports exactly what ``k8s/`` uses: ``resources`` (files inside the
kustomization's folder, and folders holding a kustomization.yaml), ``namespace``,
``images``, ``replicas``, ``patches`` in JSON 6902 form with a ``kind``/``name``
target, and ``configMapGenerator`` from ``envs`` files (named ``<name>-<hash>`` as
kustomize names them, and every pod template's reference to it renamed so).
Anything else is refused rather than ignored, so an overlay cannot rely on a feature
these tests would silently skip. Where kustomize is lenient (an image, a replica count
or a patch target that matches nothing), this is stricter: a typo in an overlay fails
here.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

Manifest = dict[str, Any]

SUPPORTED_FIELDS = frozenset(
    {
        "apiVersion",
        "kind",
        "namespace",
        "resources",
        "images",
        "replicas",
        "patches",
        "configMapGenerator",
    }
)
#: Marks a generated ConfigMap until the outermost kustomization names it by its hash.
NEEDS_HASH = "kustomize.config.k8s.io/needs-hash"
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


def render(directory: Path, *, outermost: bool = True) -> list[Manifest]:
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
            manifests.extend(render(path, outermost=False))
        elif path.is_file():
            # kustomize's default load restrictor: files only from inside the root.
            if not path.is_relative_to(root):
                raise KustomizeError(f"{kustomization_file}: {entry} is outside {root}")
            manifests.extend(load_documents(path))
        else:
            raise KustomizeError(f"{kustomization_file}: resource {entry} not found")
    manifests = copy.deepcopy(manifests)
    for generator in kustomization.get("configMapGenerator", []):
        manifests.append(_generated_config_map(generator, root))

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
    if outermost:
        _name_by_hash(manifests)
    _check_unique(manifests)
    return manifests


def _generated_config_map(generator: dict[str, Any], root: Path) -> Manifest:
    unsupported = set(generator) - {"name", "envs", "options"}
    options = generator.get("options", {})
    if unsupported or set(options) - {"labels"}:
        raise KustomizeError(f"unsupported configMapGenerator fields: {generator!r}")
    data: dict[str, str] = {}
    for entry in generator.get("envs", []):
        path = (root / entry).resolve()
        if not path.is_relative_to(root) or not path.is_file():
            raise KustomizeError(f"configMapGenerator: {entry} not found in {root}")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            key, equals, value = line.partition("=")
            if not equals or not key.strip():
                raise KustomizeError(f"{path}:{number}: not KEY=value: {line!r}")
            data[key.strip()] = value  # as kustomize: the value as written, no quoting
    metadata: dict[str, Any] = {"name": generator["name"], "annotations": {NEEDS_HASH: "true"}}
    if options.get("labels"):
        metadata["labels"] = dict(options["labels"])
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def config_map_hash(config_map: Manifest) -> str:
    """kustomize's name suffix: the first ten hex digits of the SHA-256 of the map's kind,
    name and data as sorted JSON, with the digits and letters it avoids replaced."""
    encoded = json.dumps(
        {
            "data": config_map.get("data", {}),
            "kind": "ConfigMap",
            "name": config_map["metadata"]["name"],
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    digits = hashlib.sha256(encoded.encode()).hexdigest()[:10]
    return digits.translate(str.maketrans("013ae", "ghkmt"))


def _name_by_hash(manifests: list[Manifest]) -> None:
    renamed: dict[tuple[str, str], str] = {}
    for manifest in manifests:
        annotations = manifest["metadata"].get("annotations", {})
        if manifest["kind"] != "ConfigMap" or annotations.pop(NEEDS_HASH, None) is None:
            continue
        if not annotations:
            del manifest["metadata"]["annotations"]
        name = manifest["metadata"]["name"]
        namespace = manifest["metadata"].get("namespace", "")
        manifest["metadata"]["name"] = f"{name}-{config_map_hash(manifest)}"
        renamed[(namespace, name)] = manifest["metadata"]["name"]
    for manifest in manifests:
        namespace = manifest["metadata"].get("namespace", "")
        for spec in pod_specs(manifest):
            for ref in _config_map_refs(spec):
                ref["name"] = renamed.get((namespace, ref["name"]), ref["name"])


def _config_map_refs(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every place a pod spec names a ConfigMap."""
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                yield source["configMapRef"]
        for variable in container.get("env", []):
            ref = variable.get("valueFrom", {}).get("configMapKeyRef")
            if ref is not None:
                yield ref
    for volume in spec.get("volumes", []):
        if "configMap" in volume:
            yield volume["configMap"]
        for source in volume.get("projected", {}).get("sources", []):
            if "configMap" in source:
                yield source["configMap"]


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
