"""deploy/install.sh and deploy/uninstall.sh: install, upgrade, uninstall and purge, a real venv from the
wheel, custom paths written into the unit, and unsafe paths or unknown arguments refused.

The scripts run against a temporary root (NVLLM_ROOT), never the live system: no user is created and
systemctl only links units offline.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.deploy_files import INSTALL, TOML, UNINSTALL, UNIT, fake_venv, ok, run, tree
from helpers.paths import ROOT
from nvllm.config import Settings, load_settings

DEFAULT_MODEL = "smollm2-135m-instruct"


def enabled_link() -> set[str]:
    return set() if shutil.which("systemctl") is None else {
        "etc/systemd/system/multi-user.target.wants/nvllm.service"}


MODEL_FILE = f"var/lib/nvllm/models/{DEFAULT_MODEL}.gguf"


def test_install_upgrade_uninstall_purge(tmp_path: Path) -> None:
    root = tmp_path / "root"
    fake_venv(root / "opt/nvllm/venv")
    venv_files = {"opt/nvllm/venv/bin/python", "opt/nvllm/venv/bin/nvllm"}

    ok(run(INSTALL, root, NVLLM_SKIP_PIP="1"))
    assert tree(root) == venv_files | enabled_link() | {
        "opt/nvllm/venv/bin/pull.log", "etc/nvllm/nvllm.toml", "etc/systemd/system/nvllm.service", MODEL_FILE}
    assert (root / "etc/systemd/system/nvllm.service").read_text() == UNIT.read_text()
    assert (root / "etc/nvllm/nvllm.toml").read_text() == TOML.read_text()
    assert (root / "etc/nvllm/nvllm.toml").stat().st_mode & 0o777 == 0o640
    assert (root / "var/lib/nvllm").stat().st_mode & 0o777 == 0o750
    pull_log = root / "opt/nvllm/venv/bin/pull.log"
    assert pull_log.read_text().splitlines() == [f"models pull {DEFAULT_MODEL} --dir {root}/var/lib/nvllm/models"]
    if enabled_link():
        link = root / enabled_link().pop()
        assert os.readlink(link) == "/etc/systemd/system/nvllm.service"

    # An upgrade keeps the admin's config and the model already pulled.
    config = root / "etc/nvllm/nvllm.toml"
    config.write_text(config.read_text().replace('listen = "127.0.0.1:50051"', 'listen = "0.0.0.0:50051"'))
    edited = config.read_text()
    out = ok(run(INSTALL, root, NVLLM_SKIP_PIP="1")).stdout
    assert "keeping the existing" in out
    assert config.read_text() == edited
    assert len(pull_log.read_text().splitlines()) == 1

    # Uninstall keeps config and models, twice over.
    for _ in range(2):
        ok(run(UNINSTALL, root))
        assert tree(root) == {"etc/nvllm/nvllm.toml", MODEL_FILE}
        assert config.read_text() == edited
        assert not (root / "opt/nvllm").exists()

    # --purge leaves nothing, and can run again.
    for _ in range(2):
        ok(run(UNINSTALL, root, "--purge"))
        assert tree(root) == set()
        assert not (root / "etc/nvllm").exists() and not (root / "var/lib/nvllm").exists()


def build_wheel(tmp_path: Path) -> Path:
    """nvllm's wheel, built offline from a copy of the checkout (the build writes into its source tree)."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "models", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis"))
    out = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--disable-pip-version-check",
           "-w", str(out), str(src)]
    # Offline with this venv's setuptools when it can build wheels (>= 70.1, which grpcio-tools pulls in);
    # else pip fetches the build backend from the package index as usual.
    offline = subprocess.run(pip + ["--no-build-isolation", "--no-index"], capture_output=True, text=True,
                             timeout=300)
    if offline.returncode != 0:
        ok(subprocess.run(pip, capture_output=True, text=True, timeout=300))
    (wheel,) = out.glob("nvllm-*.whl")
    return wheel


@pytest.mark.slow
def test_install_creates_a_real_clean_venv(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    root = tmp_path / "root"
    env = dict(NVLLM_SOURCE=str(wheel), NVLLM_PYTHON=sys.executable, NVLLM_SKIP_PULL="1",
               NVLLM_PIP_ARGS="--no-deps --no-index")  # the dependencies are the dev venv's business
    ok(run(INSTALL, root, **env))
    venv = root / "opt/nvllm/venv"
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    nvllm = venv / "bin/nvllm"
    assert os.access(nvllm, os.X_OK)
    assert nvllm.read_text().splitlines()[0] == f"#!{venv}/bin/python"
    version = subprocess.run([str(venv / "bin/python"), "-c",
                              "import importlib.metadata as m, nvllm.server.systemd; print(m.version('nvllm'))"],
                             capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.strip() == "0.1.0", version.stderr
    assert load_settings(root / "etc/nvllm/nvllm.toml") == Settings()

    ok(run(INSTALL, root, **env))  # a reinstall over the same venv
    ok(run(UNINSTALL, root, "--purge"))
    assert tree(root) == set()


def test_custom_paths_are_written_into_the_unit(tmp_path: Path) -> None:
    root = tmp_path / "root"
    paths = dict(NVLLM_VENV="/srv/nvllm/venv", NVLLM_ETC="/srv/nvllm/etc", NVLLM_STATE="/srv/nvllm/state")
    fake_venv(root / "srv/nvllm/venv")
    ok(run(INSTALL, root, NVLLM_SKIP_PIP="1", NVLLM_SKIP_SYSTEMCTL="1", **paths))
    installed = (root / "etc/systemd/system/nvllm.service").read_text().splitlines()
    original = UNIT.read_text().splitlines()
    changed = {a: b for a, b in zip(original, installed) if a != b}
    assert len(installed) == len(original)
    assert changed == {
        "ExecStart=/opt/nvllm/venv/bin/nvllm serve --config /etc/nvllm/nvllm.toml":
            "ExecStart=/srv/nvllm/venv/bin/nvllm serve --config /srv/nvllm/etc/nvllm.toml",
        "WorkingDirectory=/var/lib/nvllm": "WorkingDirectory=/srv/nvllm/state",
        "Documentation=file:/etc/nvllm/nvllm.toml": "Documentation=file:/srv/nvllm/etc/nvllm.toml",
    }
    assert (root / "srv/nvllm/state/models" / f"{DEFAULT_MODEL}.gguf").exists()
    ok(run(UNINSTALL, root, "--purge", NVLLM_SKIP_SYSTEMCTL="1", **paths))
    assert tree(root) == set()


@pytest.mark.parametrize("script", [INSTALL, UNINSTALL])
@pytest.mark.parametrize("bad", ["relative/path", "/", "/with space", "/a#b"])
def test_unsafe_paths_are_refused_before_anything_happens(tmp_path: Path, script: Path, bad: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "keep").write_text("x")
    done = run(script, root, "--purge", NVLLM_STATE=bad) if script == UNINSTALL else \
        run(script, root, NVLLM_STATE=bad, NVLLM_SKIP_PIP="1")
    assert done.returncode != 0 and "NVLLM_STATE" in done.stderr
    assert tree(root) == {"keep"}


@pytest.mark.parametrize("script", [INSTALL, UNINSTALL])
def test_unknown_argument_is_refused(tmp_path: Path, script: Path) -> None:
    done = run(script, tmp_path, "--frobnicate")
    assert done.returncode == 2 and "unknown argument" in done.stderr
    assert tree(tmp_path) == set()


@pytest.mark.parametrize("script", [INSTALL, UNINSTALL])
def test_scripts_are_strict_bash(script: Path) -> None:
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "\nset -euo pipefail\n" in text
    assert os.access(script, os.X_OK)
    ok(subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True))
