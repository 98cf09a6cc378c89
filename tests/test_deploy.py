"""deploy/: the config file, the systemd unit, install.sh and uninstall.sh.

systemd-analyze (Debian package `systemd`) checks the unit; a missing one skips those tests on a
developer's machine and fails them in CI (CI=true). install.sh and uninstall.sh run against a temporary
root (NVLLM_ROOT), never the live system: no user is created and systemctl only links units offline.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nvllm.config import Settings, load_settings

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "nvllm.service"
TOML = DEPLOY / "nvllm.toml"
INSTALL = DEPLOY / "install.sh"
UNINSTALL = DEPLOY / "uninstall.sh"
SANDBOX = ROOT / "tests" / "unit_sandbox.py"

# `systemd-analyze security --offline=yes deploy/nvllm.service` on systemd 252 (Debian 12). Lower is
# better (0-10); raise it only with a reason written in the unit next to the option given up.
MAX_EXPOSURE = 1.1

DEFAULT_MODEL = "smollm2-135m-instruct"


def need_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is missing; CI must have it (apt-get install -y systemd)")
        pytest.skip(f"{name} is not installed (apt-get install -y systemd)")
    return path


# --------------------------------------------------------------------------------------------- config


def test_deploy_config_loads_to_exactly_the_defaults() -> None:
    assert load_settings(TOML) == Settings()


KEY_LINE = re.compile(r"#?\s*(\w+)\s*=.*")


def documented_keys(text: str) -> dict[tuple[str, str], bool]:
    """(section, key) -> whether a comment line stands right above it. '# key = ...' counts as a key."""
    found: dict[tuple[str, str], bool] = {}
    section = ""
    previous = ""
    for raw in text.splitlines():
        line = raw.strip()
        header = re.fullmatch(r"\[(\w+)\]", line)
        key = KEY_LINE.fullmatch(line)
        if header:
            section = header.group(1)
        elif key:
            found[(section, key.group(1))] = previous.startswith("#") and not KEY_LINE.fullmatch(previous)
        previous = line
    return found


def test_every_setting_is_written_down_with_a_comment() -> None:
    expected = set()
    for f in dataclasses.fields(Settings):
        value = getattr(Settings(), f.name)
        if dataclasses.is_dataclass(value):
            expected |= {(f.name, sub.name) for sub in dataclasses.fields(value)}
        else:
            expected.add(("", f.name))
    found = documented_keys(TOML.read_text())
    assert set(found) == expected
    assert [k for k, commented in found.items() if not commented] == []


def test_settings_without_a_toml_value_are_commented_out() -> None:
    # TOML has no null: a None default can only be shown as a commented line.
    text = TOML.read_text()
    assert re.search(r"^# num_blocks = \d+$", text, re.M)
    assert Settings().cache.num_blocks is None


# ----------------------------------------------------------------------------------------------- unit


def unit_entries(text: str) -> list[tuple[str, str, str]]:
    entries, section = [], ""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        entries.append((section, key, value))
    return entries


def unit_value(key: str) -> str:
    values = [v for _, k, v in unit_entries(UNIT.read_text()) if k == key]
    assert len(values) == 1, f"{key} appears {len(values)} times"
    return values[0]


def test_unit_is_a_notify_service_with_a_watchdog() -> None:
    assert unit_value("Type") == "notify"
    assert unit_value("NotifyAccess") == "main"
    assert unit_value("ExecStart") == "/opt/nvllm/venv/bin/nvllm serve --config /etc/nvllm/nvllm.toml"
    assert int(unit_value("WatchdogSec")) > 0
    assert unit_value("Restart") == "on-failure"
    assert unit_value("KillSignal") == "SIGTERM"
    assert (unit_value("User"), unit_value("Group"), unit_value("DynamicUser")) == ("nvllm", "nvllm", "no")
    assert unit_value("StateDirectory") == "nvllm"
    assert unit_value("ConfigurationDirectory") == "nvllm"
    # The default models_dir ("models") is relative: it must land in the state directory.
    assert Path(unit_value("WorkingDirectory")) / Settings().model.models_dir == Path("/var/lib/nvllm/models")


def test_stop_timeout_outlasts_the_drain_grace() -> None:
    grace = load_settings(TOML).server.drain_grace_s
    assert int(unit_value("TimeoutStopSec")) > grace


def test_memory_limits_are_shares_of_ram() -> None:
    high, hard = unit_value("MemoryHigh"), unit_value("MemoryMax")
    assert high.endswith("%") and hard.endswith("%") and int(high[:-1]) < int(hard[:-1]) < 100


def test_unit_sets_no_blas_thread_count() -> None:
    assert not re.search(r"(OMP|OPENBLAS)_NUM_THREADS", "\n".join(
        v for _, k, v in unit_entries(UNIT.read_text()) if k == "Environment"))


@pytest.fixture
def verifiable_unit(tmp_path: Path) -> Path:
    """The unit with ExecStart's program swapped for one that exists (verify checks it); nothing else changes."""
    program = tmp_path / "bin" / "nvllm"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    original = UNIT.read_text().splitlines(keepends=True)
    copy = [line.replace("/opt/nvllm/venv/bin/nvllm", str(program)) if line.startswith("ExecStart=") else line
            for line in original]
    assert [i for i, (a, b) in enumerate(zip(original, copy)) if a != b] == \
        [i for i, line in enumerate(original) if line.startswith("ExecStart=")]
    unit = tmp_path / "nvllm.service"
    unit.write_text("".join(copy))
    return unit


def test_systemd_analyze_verify_is_silent(verifiable_unit: Path) -> None:
    tool = need_tool("systemd-analyze")
    done = subprocess.run([tool, "verify", str(verifiable_unit)], capture_output=True, text=True,
                          cwd=verifiable_unit.parent, timeout=120)
    assert (done.returncode, done.stderr, done.stdout) == (0, "", "")


def test_security_exposure_stays_low(verifiable_unit: Path) -> None:
    tool = need_tool("systemd-analyze")
    done = subprocess.run([tool, "security", "--offline=yes", "--no-pager", str(verifiable_unit)],
                          capture_output=True, text=True, cwd=verifiable_unit.parent, timeout=120)
    assert done.returncode == 0, done.stderr
    match = re.search(r"Overall exposure level for nvllm\.service: (\d+\.\d+)", done.stdout)
    assert match, done.stdout[-2000:]
    assert float(match.group(1)) <= MAX_EXPOSURE, done.stdout


WORKLOAD = r'''
import asyncio, ctypes, glob, sys
import numpy as np

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
wx = libc.mmap(None, 4096, 0x7, 0x22, -1, 0)  # PROT_READ|WRITE|EXEC, MAP_PRIVATE|ANONYMOUS
print("W+X mmap", "refused" if wx in (None, 2**64 - 1) else "ALLOWED", flush=True)

a = np.random.default_rng(0).standard_normal((768, 768), dtype=np.float32)
assert np.isfinite(a @ a.T).all()  # OpenBLAS threads, buffers, mbind
import psutil
assert psutil.virtual_memory().available > 0 and psutil.Process().memory_info().rss > 0
from tokenizers import Tokenizer
from safetensors.numpy import load_file
model = sys.argv[1]
assert Tokenizer.from_file(model + "/tokenizer.json").encode("hello world").ids
assert load_file(glob.glob(model + "/*.safetensors")[0])
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

async def serve() -> None:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.add_insecure_port("unix:" + sys.argv[2])
    await server.start()
    for target in (f"127.0.0.1:{port}", "unix:" + sys.argv[2]):
        async with grpc.aio.insecure_channel(target) as ch:
            reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=30)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
    await server.stop(0)

asyncio.run(serve())
print("WORKLOAD OK", flush=True)
'''


def need_seccomp() -> None:
    need_tool("systemd-analyze")
    try:
        ctypes.CDLL("libseccomp.so.2")
    except OSError:
        if os.environ.get("CI"):
            pytest.fail("libseccomp.so.2 is missing; CI must have it (apt-get install -y libseccomp2)")
        pytest.skip("libseccomp.so.2 is not installed")


def test_runtime_libraries_work_under_the_units_seccomp_rules(tmp_path: Path, tiny_models) -> None:
    """MemoryDenyWriteExecute and SystemCallFilter: NumPy/OpenBLAS, psutil, tokenizers, safetensors and
    grpc (TCP and unix) under the unit's own filter, applied in-process through libseccomp."""
    need_seccomp()
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    done = subprocess.run([sys.executable, str(SANDBOX), str(script), str(tiny_models["tiny-llama"]),
                           str(tmp_path / "grpc.sock")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "MemoryDenyWriteExecute=yes" in done.stdout
    assert "W+X mmap refused" in done.stdout  # the filter is really in force
    assert "WORKLOAD OK" in done.stdout


def test_daemon_serves_and_pings_under_the_units_seccomp_rules(tmp_path: Path, tiny_models) -> None:
    """`nvllm serve` as systemd would run it: the unit's filter, NOTIFY_SOCKET and WATCHDOG_USEC set.
    It says READY=1, answers a generation, pings the watchdog, and on SIGTERM says STOPPING=1."""
    need_seccomp()
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(120)
    listen = f"unix:{tmp_path / 'nvllm.sock'}"
    env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
    env.update(NOTIFY_SOCKET=str(tmp_path / "notify.sock"), WATCHDOG_USEC="2000000")
    daemon = subprocess.Popen(
        [sys.executable, str(SANDBOX), "-m", "nvllm.cli", "serve", "--config", str(TOML),
         "--model", str(tiny_models["tiny-llama"]), "--listen", listen, "--num-blocks", "64"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        messages = []
        while not any(m.startswith("READY=1") for m in messages):
            try:
                messages.append(notify.recv(4096).decode())
            except socket.timeout:
                daemon.kill()
                pytest.fail(f"no READY=1; got {messages}; output: {daemon.communicate()[0]}")
        query = subprocess.run([sys.executable, "-m", "nvllm.cli", "query", "--target", listen, "hello",
                                "--max-tokens", "4", "--json"], capture_output=True, text=True, timeout=120)
        assert query.returncode == 0, query.stdout + query.stderr
        while "WATCHDOG=1" not in messages:
            messages.append(notify.recv(4096).decode())
        daemon.send_signal(signal.SIGTERM)
        out, _ = daemon.communicate(timeout=120)
        notify.setblocking(False)
        try:
            while True:
                messages.append(notify.recv(4096).decode())
        except BlockingIOError:
            pass
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.communicate()
        notify.close()
    assert daemon.returncode == 0, out
    assert "MemoryDenyWriteExecute=yes" in out
    assert any(m.startswith("STOPPING=1") for m in messages), messages


# -------------------------------------------------------------------------------- install / uninstall


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
