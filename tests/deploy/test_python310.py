"""JetPack 6 ships Python 3.10: nothing in the project may need a newer one.

- vermin (a static checker) finds no syntax, module, function or keyword newer than 3.10 in daemon/,
  models/, tools/ and tests/: this runs on any machine.
- Where a Python 3.10 interpreter exists (this image has pyenv's), every source file compiles under it,
  and nvllm installed into a 3.10 venv with pip (so every dependency resolves for 3.10) imports and
  passes a smoke subset of the tests, the daemon round trip included.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import ROOT

SOURCES = ("daemon", "models", "tools", "tests")
TARGET = "3.10"
SMOKE = ["tests/model/weights/test_loader.py", "tests/engine/test_sampling_params.py", "tests/engine/test_stops.py",
         "tests/text/test_tokenizer.py", "tests/text/test_chat_template.py", "tests/text/test_detokenizer.py",
         "tests/deploy/test_aarch64.py::test_daemon_round_trip_serve_health_and_a_streamed_answer"]


def python310() -> str | None:
    """A working Python 3.10: $NVLLM_PYTHON310, pyenv's, or python3.10 on PATH (pyenv's shims may not run)."""
    candidates = [os.environ.get("NVLLM_PYTHON310", "")]
    candidates += [str(p) for p in sorted((Path.home() / ".pyenv/versions").glob("3.10.*/bin/python"), reverse=True)]
    candidates += [shutil.which("python3.10") or ""]
    for exe in filter(None, candidates):
        try:
            r = subprocess.run([exe, "-c", "import sys; print(sys.version_info[:2] == (3, 10))"],
                               capture_output=True, text=True, timeout=30)
        except OSError:
            continue
        if r.stdout.strip() == "True":
            return exe
    return None


@pytest.fixture(scope="module")
def py310() -> str:
    exe = python310()
    if exe is None:
        pytest.skip("no Python 3.10 interpreter on this machine (set NVLLM_PYTHON310); vermin's check still runs")
    return exe


def test_vermin_finds_nothing_newer_than_python_3_10() -> None:
    if importlib.util.find_spec("vermin") is None:
        if os.environ.get("CI"):
            pytest.fail("vermin is missing: it is a test dependency (pip install -e '.[test]')")
        pytest.skip("vermin is not installed (pip install -e '.[test]')")
    run_vermin = "import sys, vermin; sys.argv[0] = 'vermin'; sys.exit(vermin.main())"
    r = subprocess.run([sys.executable, "-c", run_vermin, f"--target={TARGET}-", "--violations", "--no-tips",
                        *SOURCES], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"code that needs a Python newer than {TARGET}:\n{r.stdout}{r.stderr}"


def test_every_source_file_compiles_under_python_3_10(py310: str) -> None:
    # compile() in memory: no __pycache__ is written into the checkout.
    code = ("import sys, pathlib\n"
            "bad = []\n"
            "for d in sys.argv[1:]:\n"
            "    for p in sorted(pathlib.Path(d).rglob('*.py')):\n"
            "        try:\n"
            "            compile(p.read_bytes(), str(p), 'exec', dont_inherit=True)\n"
            "        except SyntaxError as e:\n"
            "            bad.append(f'{p}:{e.lineno}: {e.msg}')\n"
            "print(sys.version.split()[0], len(bad)); print('\\n'.join(bad))\n"
            "sys.exit(1 if bad else 0)\n")
    r = subprocess.run([py310, "-c", code, *SOURCES], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.stdout.startswith(TARGET), r.stdout + r.stderr
    assert r.returncode == 0, f"syntax errors under {TARGET}:\n{r.stdout}{r.stderr}"


@pytest.mark.slow
def test_installs_imports_and_runs_under_python_3_10(py310: str, tiny_models, tmp_path: Path) -> None:
    # A copy of the checkout, as install.sh makes one: pip's build leaves nothing in the work tree.
    src = tmp_path / "src"
    top = {".git", ".venv", "models", "build"}

    def ignore(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n in ("__pycache__", ".pytest_cache", ".hypothesis") or n.endswith(".egg-info")
                or (Path(folder) == ROOT and n in top)}
    shutil.copytree(ROOT, src, ignore=ignore)
    venv = tmp_path / "venv310"
    subprocess.run([py310, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                          f"{src}[test]"], capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, f"pip install under {TARGET} failed:\n{pip.stdout[-4000:]}{pip.stderr[-4000:]}"

    py = str(venv / "bin/python")
    imports = ("import sys, nvllm, nvllm.cli, nvllm.llm, nvllm.bench, nvllm.model_files.registry, nvllm.server.daemon; "
               "assert sys.version_info[:2] == (3, 10), sys.version; print(nvllm.__file__)")
    r = subprocess.run([py, "-c", imports], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert str(venv) in r.stdout, f"nvllm should come from the 3.10 venv, not {r.stdout}"

    # The smoke subset runs from the checkout's tests against the package installed in the 3.10 venv.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    r = subprocess.run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SMOKE], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"smoke tests under {TARGET} failed:\n{r.stdout[-6000:]}{r.stderr[-2000:]}"
