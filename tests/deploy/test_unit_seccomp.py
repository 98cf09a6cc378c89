"""deploy/nvllm.service's seccomp rules (SystemCallFilter, MemoryDenyWriteExecute) applied in-process by
tests/helpers/unit_sandbox.py: the runtime libraries work under them, and so does `nvllm serve` as systemd
would run it (NOTIFY_SOCKET, WATCHDOG_USEC).

The rules are expanded with systemd-analyze (Debian package `systemd`) and loaded through libseccomp; a
missing one skips these tests on a developer's machine and fails them in CI (CI=true).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.deploy_files import TOML, need_tool
from helpers.paths import ROOT

SANDBOX = ROOT / "tests" / "helpers" / "unit_sandbox.py"


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
        messages: list[str] = []
        while not any(m.startswith("READY=1") for m in messages):
            try:
                messages.append(notify.recv(4096).decode())
            except TimeoutError:
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
