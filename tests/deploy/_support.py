"""What the deployment tests share: the files, the rendered variants, the schemas.

Everything is offline: the Kubernetes JSON schemas come from the kubernetes-validate
wheel, the Compose Specification schema from the check-jsonschema wheel (its vendored
copy of compose-spec.json); both are read as package data, nothing is fetched.
"""

from __future__ import annotations

import importlib.resources
import json
import posixpath
import re
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from tests.deploy._kustomize import Manifest, containers, pod_specs, render

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
VARIANTS = {
    "base": K8S / "base",
    "local": K8S / "overlays" / "local",
    "production": K8S / "overlays" / "production",
}
#: The oldest Kubernetes the manifests are checked against, and the newest bundled.
OLDEST_KUBERNETES = "1.30.0"

# ---------------------------------------------------------------------------- files


@cache
def pyproject() -> dict[str, Any]:
    with (REPO / "pyproject.toml").open("rb") as handle:
        return tomllib.load(handle)


def entry_points() -> dict[str, str]:
    scripts: dict[str, str] = pyproject()["project"]["scripts"]
    return scripts


@cache
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((REPO / "compose.yaml").read_text("utf-8"))
    return document


@cache
def nats_users() -> dict[str, dict[str, Any]]:
    """deploy/nats/users.conf by user name. The file keeps to the JSON subset of the NATS
    configuration format, but for comment lines and unquoted ``$VARIABLE`` references."""
    lines = (REPO / "deploy" / "nats" / "users.conf").read_text("utf-8").splitlines()
    text = "\n".join(line for line in lines if not line.strip().startswith("#"))
    text = re.sub(r'(?<!")(\$[A-Z_][A-Z0-9_]*)', r'"\1"', text)
    users: list[dict[str, Any]] = json.loads("{" + text + "}")["users"]
    return {user["user"]: user for user in users}


@cache
def rendered(variant: str) -> tuple[Manifest, ...]:
    return tuple(render(VARIANTS[variant]))


def find(manifests: tuple[Manifest, ...], kind: str, name: str) -> Manifest:
    for manifest in manifests:
        if manifest["kind"] == kind and manifest["metadata"]["name"] == name:
            return manifest
    raise AssertionError(f"no {kind} {name}")


def settings_map(manifests: tuple[Manifest, ...]) -> Manifest:
    """The ConfigMap of Trove's settings, named ``trove-config-<hash>``."""
    (found,) = [
        m
        for m in manifests
        if m["kind"] == "ConfigMap" and m["metadata"]["name"].startswith("trove-config-")
    ]
    return found


def of_kind(manifests: tuple[Manifest, ...], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def workloads(manifests: tuple[Manifest, ...]) -> list[Manifest]:
    return [m for m in manifests if any(True for _ in pod_specs(m))]


def container_environment(
    manifests: tuple[Manifest, ...], container: dict[str, Any]
) -> dict[str, str | None]:
    """The variables a container gets: ConfigMap values, literal values, None for secrets."""
    env: dict[str, str | None] = {}
    for source in container.get("envFrom", []):
        config_map = source.get("configMapRef")
        assert config_map is not None, f"only ConfigMaps are used with envFrom: {source}"
        env.update(find(manifests, "ConfigMap", config_map["name"]).get("data", {}))
    for variable in container.get("env", []):
        env[variable["name"]] = variable.get("value")
    return env


def all_containers(manifests: tuple[Manifest, ...]) -> list[tuple[Manifest, dict[str, Any]]]:
    return [(m, c) for m in manifests for c in containers(m)]


# ------------------------------------------------------------------------- schemas

_SCHEMAS = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"


def kubernetes_versions() -> tuple[str, str]:
    names = [p.name for p in _SCHEMAS.iterdir() if p.name.endswith("-local-strict")]
    versions = sorted(
        (n.removeprefix("v").removesuffix("-local-strict") for n in names),
        key=lambda v: tuple(int(x) for x in v.split(".")),
    )
    assert OLDEST_KUBERNETES in versions, versions
    return OLDEST_KUBERNETES, versions[-1]


@cache
def _registry(version: str) -> Registry[Any]:
    folder = _SCHEMAS / f"v{version}-local-strict"
    definitions = Resource.from_contents(json.loads((folder / "_definitions.json").read_text()))
    return definitions @ Registry()


@cache
def kubernetes_validator(version: str, api_version: str, kind: str) -> Draft202012Validator:
    """The strict (no unknown fields) schema of a built-in kind, as kubernetes-validate names it."""
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    path = _SCHEMAS / f"v{version}-local-strict" / f"{kind.lower()}-{group_version}.json"
    if not path.is_file():
        raise LookupError(f"no Kubernetes {version} schema for {api_version} {kind}")
    schema = json.loads(path.read_text())
    registry = Resource.from_contents(schema) @ _registry(version)
    return Draft202012Validator(schema, registry=registry)


@cache
def compose_validator() -> Draft202012Validator:
    """The Compose Specification schema as vendored by check-jsonschema."""
    text = (
        importlib.resources.files("check_jsonschema")
        / "builtin_schemas"
        / "vendor"
        / "compose-spec.json"
    ).read_text()
    schema = json.loads(text)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def schema_errors(validator: Draft202012Validator, document: Any) -> list[str]:
    return [
        f"{error.json_path}: {error.message[:300]}"
        for error in sorted(validator.iter_errors(document), key=lambda e: e.json_path)
    ]


# ----------------------------------------------------------------------- Dockerfile


@dataclass(frozen=True)
class Instruction:
    keyword: str
    value: str
    stage: int


def dockerfile() -> list[Instruction]:
    """Instructions with their continuation lines joined and comment lines dropped."""
    instructions: list[Instruction] = []
    stage = -1
    pending = ""
    for line in (REPO / "Dockerfile").read_text("utf-8").splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        keyword, _, value = full.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        instructions.append(Instruction(keyword, value.strip(), stage))
    assert not pending, "the Dockerfile ends inside a continuation"
    return instructions


def global_args() -> dict[str, str]:
    """ARG defaults declared before the first FROM."""
    args: dict[str, str] = {}
    for instruction in dockerfile():
        if instruction.stage >= 0:
            break
        if instruction.keyword == "ARG":
            name, _, default = instruction.value.partition("=")
            args[name] = default
    return args


def stage_base(stage: int) -> tuple[str, str]:
    """(image, alias) of a stage's FROM, with global ARGs substituted."""
    (instruction,) = [i for i in dockerfile() if i.keyword == "FROM" and i.stage == stage]
    image, _, alias = instruction.value.partition(" AS ")
    for name, value in global_args().items():
        image = image.replace("${" + name + "}", value).replace("$" + name, value)
    return image.strip(), alias.strip()


def exec_form(value: str) -> list[str]:
    form = json.loads(value)
    assert isinstance(form, list), value
    assert all(isinstance(x, str) for x in form), value
    return form


def env_instructions(stage: int) -> dict[str, str]:
    """ENV key=value pairs of a stage (values unquoted)."""
    env: dict[str, str] = {}
    for instruction in dockerfile():
        if instruction.stage == stage and instruction.keyword == "ENV":
            for pair in re.findall(r'(\w+)=("[^"]*"|\S+)', instruction.value):
                env[pair[0]] = pair[1].strip('"')
    return env


# --------------------------------------------------------------------- .dockerignore


def dockerignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text("utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out += pattern[i : end + 1]
            i = end + 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out)


def ignored_by_docker(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents wins."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for raw in patterns:
        negated = raw.startswith("!")
        pattern = posixpath.normpath(raw.removeprefix("!").strip()).lstrip("/")
        regex = _pattern_regex(pattern)
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            excluded = not negated
    return excluded


# ---------------------------------------------------------------------- quantities

_UNITS = {"": 1, "m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3, "M": 1e6, "G": 1e9}


def quantity(value: str | int | float) -> float:
    """A Kubernetes quantity ("250m", "1", "512Mi") as a number."""
    match = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(value))
    assert match, f"not a quantity: {value!r}"
    assert match.group(2) in _UNITS, f"unknown unit: {value!r}"
    return float(match.group(1)) * _UNITS[match.group(2)]
