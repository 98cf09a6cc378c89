"""deploy/'s files, and install.sh / uninstall.sh run against a temporary root, for the deploy tests.

`run` gives the scripts NVLLM_ROOT, never the live system: no user is created and systemctl only links
units offline (skipped where there is none). `fake_venv` is a venv install.sh reuses without pip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import ROOT

DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "nvllm.service"
TOML = DEPLOY / "nvllm.toml"
INSTALL = DEPLOY / "install.sh"
UNINSTALL = DEPLOY / "uninstall.sh"


def need_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is missing; CI must have it (apt-get install -y systemd)")
        pytest.skip(f"{name} is not installed (apt-get install -y systemd)")
    return path


def run(script: Path, root: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("NVLLM_")}
    base.update(NVLLM_ROOT=str(root), NVLLM_SKIP_USER="1", **env)
    if shutil.which("systemctl") is None:
        base["NVLLM_SKIP_SYSTEMCTL"] = "1"
    return subprocess.run(["bash", str(script), *args], env=base, capture_output=True, text=True, timeout=600)


def ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def tree(root: Path) -> set[str]:
    """Every file and symlink under root (directories left out), relative."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()}


FAKE_NVLLM = """#!/bin/sh
# Stands in for the venv's nvllm: `models pull NAME --dir DIR` writes DIR/NAME.gguf.
[ "$1 $2 $4" = "models pull --dir" ] || exit 64
mkdir -p "$5" && echo 'GGUF' > "$5/$3.gguf"
echo "$*" >> "$(dirname "$0")/pull.log"
"""


def fake_venv(path: Path) -> None:
    """A venv that install.sh reuses (bin/python exists); with NVLLM_SKIP_PIP nothing is pip-installed."""
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "python").symlink_to(sys.executable)
    (path / "bin" / "nvllm").write_text(FAKE_NVLLM)
    (path / "bin" / "nvllm").chmod(0o755)
