"""`nvllm models pull` of Hub references and a [[models]] table's `source`, end to end in a subprocess whose
HF_ENDPOINT is the stand-in Hub (conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from helpers.daemon_util import BASE_CONFIG, DaemonProcess
from helpers.fake_hub import FakeHub
from helpers.paths import ROOT
from model_files.conftest import FOLDER_REPO, GGUF_REPO


def _nvllm(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nvllm.cli", *args], cwd=cwd, env=dict(os.environ),
                          capture_output=True, text=True, timeout=60)


def test_pull_list_and_the_errors_of_the_command(hub: FakeHub, tmp_path: Path) -> None:
    models = tmp_path / "models"
    r = _nvllm("models", "pull", f"hf.co/{GGUF_REPO}:q8_0", "--dir", str(models))
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{models / 'tiny-llama-Q8_0.gguf'}\n"
    assert "nvllm pull: pulling manifest" in r.stderr and "nvllm pull: success" in r.stderr

    r = _nvllm("models", "pull", FOLDER_REPO, "--dir", str(models), "--quiet")
    assert (r.returncode, r.stdout, r.stderr) == (0, f"{models / 'tiny-llama'}\n", "")

    r = _nvllm("models", "list", "--dir", str(models))
    lines = r.stdout.splitlines()
    assert any(f"source=hf.co/{GGUF_REPO}:Q8_0" in line for line in lines), r.stdout
    assert any(f"source=hf.co/{FOLDER_REPO}" in line and line.startswith("name=tiny-llama ") for line in lines)

    for args, message in [
        ((f"{GGUF_REPO}:Q2_K",), f"{GGUF_REPO} has no Q2_K GGUF: it has Q4_0, Q8_0"),
        (("nobody/nothing",), f"no repository nobody/nothing on {hub.url} (or it is private: set HF_TOKEN)"),
        (("no-such-model",), "unknown model 'no-such-model'; known models: smollm2-135m-instruct, whisper-tiny.en; "
                             "or a Hugging Face Hub reference"),
    ]:
        r = _nvllm("models", "pull", *args, "--dir", str(models), "--quiet")
        assert r.returncode == 1 and r.stdout == ""
        assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"nvllm models pull: {message}"), r.stderr
    hub.broken.add(FOLDER_REPO)
    r = _nvllm("models", "pull", FOLDER_REPO, "--dir", str(tmp_path / "other"), "--quiet")
    assert r.returncode == 1 and r.stderr == f"nvllm models pull: the Hub at {hub.url} answered 500 for " \
                                             f"{FOLDER_REPO}: try again later\n"


def _config(tmp_path: Path, models: Path, source: str) -> Path:
    path = tmp_path / "nvllm.toml"
    path.write_text(f'[model]\nmodels_dir = "{models}"\n[[models]]\nsource = "{source}"\n')
    return path


def test_a_models_source_is_pulled_at_start_and_only_once(hub: FakeHub, tmp_path: Path, tiny: Path) -> None:
    models = tmp_path / "models"
    config = _config(tmp_path, models, f"{GGUF_REPO}:Q8_0")
    r = _nvllm("serve", "--config", str(config), "--model", str(tiny), "--dry-run", "--num-blocks", "16")
    assert r.returncode == 0, r.stderr
    assert (models / "tiny-llama-Q8_0.gguf").is_file()
    assert f"pulling {GGUF_REPO}:Q8_0 into {models}" in r.stdout + r.stderr     # the log

    hub.requests.clear()
    r = _nvllm("serve", "--config", str(config), "--model", str(tiny), "--dry-run", "--num-blocks", "16")
    assert r.returncode == 0, r.stderr
    assert hub.requests == [] and "pulling" not in r.stdout + r.stderr     # the record says it is there

    r = _nvllm("serve", "--config", str(_config(tmp_path, models, f"{GGUF_REPO}:Q5_K_M")), "--model", str(tiny),
               "--dry-run")
    assert r.returncode == 2
    assert f"nvllm serve: [[models]] source '{GGUF_REPO}:Q5_K_M': {GGUF_REPO} has no Q5_K_M GGUF: it has Q4_0, " \
           "Q8_0" in r.stderr


def test_the_daemon_serves_a_pulled_source_by_its_name(hub: FakeHub, tmp_path: Path, tiny: Path) -> None:
    models = tmp_path / "models"
    config = BASE_CONFIG + f'[model]\nmodels_dir = "{models}"\n[[models]]\nsource = "hf.co/{GGUF_REPO}:Q4_0"\n'
    d = DaemonProcess(tmp_path / "d", tiny, config, http_listen="127.0.0.1:0", num_blocks=64,
                      extra_env=dict(os.environ))
    try:
        with urllib.request.urlopen(f"{d.http_url}/v1/models", timeout=30) as resp:
            served = {m["id"] for m in json.load(resp)["data"]}
        assert served == {"tiny-llama", "tiny-llama-Q4_0"}
        body = json.dumps({"model": "tiny-llama-Q4_0", "prompt": "Hi", "max_tokens": 3, "temperature": 0}).encode()
        req = urllib.request.Request(f"{d.http_url}/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert json.load(resp)["usage"]["completion_tokens"] == 3
    finally:
        d.stop()
