"""A module of the project as it was at a git revision, loaded beside the working
tree's, so that a benchmark times both in one process, alternately."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def module_at(revision: str, path: str, name: str) -> ModuleType:
    """The file ``path`` (from the repository's root) at ``revision``, as module ``name``."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{revision}:{path}"],
        check=True,
        capture_output=True,
    ).stdout
    copy = Path(tempfile.mkdtemp()) / f"{name}.py"
    copy.write_bytes(source)
    spec = importlib.util.spec_from_file_location(name, copy)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
