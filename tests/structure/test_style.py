"""The style the tools hold, on the whole tree: ruff (lint and import order) and mypy (check_untyped_defs
everywhere, no untyped defs in daemon/), as configured in pyproject.toml; and no Python file so long that
it no longer fits in a head."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import ROOT

MAX_LINES = 450
# what the line limit does not cover: generated code
GENERATED = ("daemon/nvllm/v1/nvllm_pb2.py", "daemon/nvllm/v1/nvllm_pb2_grpc.py")


def _tool(name: str) -> str:
    """The tool installed beside this Python (the test extra pins it), else skip: a run without the test
    extra has nothing to check with."""
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip(f"{name} is not installed beside {sys.executable} (pip install -e '.[test]')")
    return found


def python_files() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=ROOT,
                             capture_output=True, text=True)
    if tracked.returncode == 0 and tracked.stdout.strip():
        return [ROOT / line for line in tracked.stdout.split()]
    return [p for d in ("daemon", "tests", "tools", "models") for p in (ROOT / d).rglob("*.py")]


def test_ruff_finds_nothing() -> None:
    r = subprocess.run([_tool("ruff"), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]


def test_mypy_finds_nothing() -> None:
    r = subprocess.run([_tool("mypy"), "--no-incremental"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]


def test_no_python_file_is_over_the_line_limit() -> None:
    long = {}
    for path in python_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel in GENERATED or not path.exists():
            continue
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_LINES:
            long[rel] = n
    assert long == {}, f"over {MAX_LINES} lines: split along their seams"
