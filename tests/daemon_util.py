"""The real daemon as a subprocess, and the small gRPC helpers the end-to-end and stress tests share.

`DaemonProcess` runs `python -m nvllm.cli serve` with the test hooks switched on:
  NVLLM_FAKE_MEMORY_FILE  available memory is read from a file (`set_available`), so pressure can be
                          injected without using any memory;
  NVLLM_TEST_STALL_S      SIGUSR1 (`stall`) makes the engine loop sleep that long without progress;
  NVLLM_TEST_FAIL_STEP    SIGUSR2 (`fail_step`) makes the next engine step raise (when set to 1).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parent.parent
NUM_BLOCKS = 256
MAX_MESSAGE_BYTES = 64 * 1024
PLENTY = str(64 << 30)        # fake "available bytes": no pressure
READY_TIMEOUT_S = 60.0

BASE_CONFIG = f"""
log_level = "info"
[cache]
block_size = 16
[scheduler]
max_num_seqs = 16
max_num_batched_tokens = 256
max_waiting = 64
[server]
max_message_bytes = {MAX_MESSAGE_BYTES}
max_stop_strings = 4
drain_grace_s = 30.0
[watchdog]
interval_s = 0.05
low_mb = 256
high_mb = 512
"""


def config_with(config: str, **changes: Any) -> str:
    """config with `key = value` lines replaced (or added to their section), e.g. max_waiting=2.

    Keys are given as section__key for settings not yet in config: server__max_streams_per_client=4.
    """
    lines = config.splitlines()
    for name, value in changes.items():
        section, _, key = name.rpartition("__")
        text = json.dumps(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) \
            else str(value)
        for i, line in enumerate(lines):
            if line.split("=")[0].strip() == key:
                lines[i] = f"{key} = {text}"
                break
        else:
            if not section:
                raise KeyError(f"{key} is not in the config: name it section__{key}")
            at = lines.index(f"[{section}]") + 1 if f"[{section}]" in lines else None
            if at is None:
                lines += [f"[{section}]", f"{key} = {text}"]
            else:
                lines.insert(at, f"{key} = {text}")
    return "\n".join(lines) + "\n"


class DaemonProcess:
    """`nvllm serve` as a subprocess; its stdout is drained by a thread (so it never blocks)."""

    def __init__(self, tmp: Path, model: Path, config: str = BASE_CONFIG, listen: str = "127.0.0.1:0",
                 num_blocks: int = NUM_BLOCKS, extra_env: dict[str, str] | None = None,
                 extra_args: tuple[str, ...] = (), ready_line: str = "nvllm serving ") -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.memory_file = tmp / "available_bytes"
        self.memory_file.write_text(PLENTY)
        cfg = tmp / "nvllm.toml"
        cfg.write_text(config)
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
        env.update({"NVLLM_FAKE_MEMORY_FILE": str(self.memory_file), "NVLLM_TEST_STALL_S": "2",
                    "PYTHONUNBUFFERED": "1", **(extra_env or {})})
        self.lines: list[str] = []
        self.line_times: list[float] = []       # time.monotonic() when each line was read
        self.ready = threading.Event()
        self.address = ""
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nvllm.cli", "serve", "--config", str(cfg), "--model", str(model),
             "--listen", listen, "--num-blocks", str(num_blocks), *extra_args],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._ready_line = ready_line
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self.ready.wait(READY_TIMEOUT_S) or not self.address:
            self.kill()
            raise AssertionError("daemon did not get ready:\n" + "\n".join(self.lines))

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.line_times.append(time.monotonic())
            self.lines.append(line)
            if line.startswith(self._ready_line):
                self.address = line.rsplit(" on ", 1)[1]
                self.ready.set()
        self.ready.set()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def log(self) -> str:
        return "\n".join(self.lines)

    def seen_at(self, text: str, after: float = 0.0) -> float | None:
        """When the first line containing text (read after `after`) was read, or None."""
        for t, line in zip(list(self.line_times), list(self.lines)):
            if t >= after and text in line:
                return t
        return None

    def rss(self) -> int:
        """The daemon's resident set, in bytes."""
        return psutil.Process(self.proc.pid).memory_info().rss

    def set_available(self, n: int) -> None:
        self.memory_file.write_text(str(n))

    def stall(self) -> None:
        """The engine loop sleeps NVLLM_TEST_STALL_S seconds (2 by default) from its next iteration on."""
        self.proc.send_signal(signal.SIGUSR1)

    def fail_step(self) -> None:
        """The next engine step raises (needs NVLLM_TEST_FAIL_STEP=1 in the daemon's environment)."""
        self.proc.send_signal(signal.SIGUSR2)

    def wait(self, timeout: float = 30.0) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(5)
        return rc

    def kill9(self) -> int:
        """SIGKILL, no drain; returns the exit status (-9)."""
        self.proc.send_signal(signal.SIGKILL)
        return self.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# -- requests and answers ----------------------------------------------------------------------
def request(prompt: str | None = "The quick brown fox", **sampling: Any) -> pb.GenerateRequest:
    req = pb.GenerateRequest()
    if prompt is not None:
        req.prompt = prompt
    stop = sampling.pop("stop", None)
    req.sampling_params.CopyFrom(pb.SamplingParams(**sampling))
    if stop:
        req.sampling_params.stop.extend(stop)
    return req


def health(address: str, connect: Callable[[], grpc.Channel] | None = None) -> pb.HealthResponse:
    """One Health call on a new channel (connect() makes it; plaintext to address by default)."""
    with (connect() if connect else grpc.insecure_channel(address)) as ch:
        return pb_grpc.GeneratorStub(ch).Health(pb.HealthRequest(), timeout=5)


def check(address: str, service: str) -> int:
    with grpc.insecure_channel(address) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def wait_for(predicate, what: str, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def pages_all_back(h: pb.HealthResponse) -> bool:
    return h.running == 0 and h.waiting == 0 and h.pages_free + h.pages_cached == h.pages_total


def health_when(address: str, predicate, what: str, timeout: float = 10.0) -> pb.HealthResponse:
    """The first Health answer that satisfies predicate."""
    def poll():
        h = health(address)
        return h if predicate(h) else None
    return wait_for(poll, what, timeout)


async def collect(stub: pb_grpc.GeneratorStub, req: pb.GenerateRequest, timeout: float | None = 60
                  ) -> list[pb.GenerateResponse]:
    return [r async for r in stub.Generate(req, timeout=timeout)]


async def read_rest(call) -> list[pb.GenerateResponse]:
    """The remaining messages of a call already read with call.read() (the APIs may not mix)."""
    out = []
    while (r := await call.read()) is not grpc.aio.EOF:
        out.append(r)
    return out


def run_bounded(coro, timeout: float = 300.0):
    """asyncio.run with an upper bound, so that a stuck call fails the test instead of hanging it."""
    import asyncio

    return asyncio.run(asyncio.wait_for(coro, timeout))


def joined(responses: list[pb.GenerateResponse]) -> tuple[str, list[int]]:
    return "".join(r.text for r in responses), [t for r in responses for t in r.token_ids]


def offline_result(offline, prompt, **params):
    from nvllm import SamplingParams
    return offline.generate([prompt], SamplingParams(**params))[0]


# -- the end of every stress test ----------------------------------------------------------------
REFERENCE_PROMPT = "The quick brown fox"
REFERENCE_PARAMS = dict(temperature=0.0, max_tokens=16, ignore_eos=True)


def assert_sound(daemon: DaemonProcess, offline, timeout: float = 30.0,
                 connect: Callable[[], grpc.Channel] | None = None) -> pb.HealthResponse:
    """The daemon is alive, holds no request, has every page free or cached, and still answers a
    greedy request exactly as the offline engine does. Returns the Health answer. connect() makes
    the channel (plaintext to the daemon's address by default)."""
    assert daemon.proc.poll() is None, f"the daemon exited ({daemon.proc.returncode}):\n{daemon.log()[-4000:]}"

    def settled():
        h = health(daemon.address, connect)
        return h if pages_all_back(h) else None
    h = wait_for(settled, "every page to be free or cached", timeout)
    assert h.pages_free + h.pages_cached == h.pages_total
    want = offline_result(offline, REFERENCE_PROMPT, **REFERENCE_PARAMS)
    with (connect() if connect else grpc.insecure_channel(daemon.address)) as ch:
        got = list(pb_grpc.GeneratorStub(ch).Generate(request(REFERENCE_PROMPT, **REFERENCE_PARAMS), timeout=60))
    assert joined(got) == (want.text, want.token_ids)
    return wait_for(settled, "the reference request's pages to return", timeout)


class NotifySocket:
    """A unix datagram socket standing in for systemd's $NOTIFY_SOCKET: records what the daemon sends."""

    def __init__(self, path: Path) -> None:
        import socket

        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.got: list[tuple[float, str]] = []
        self._done = threading.Event()
        self._reader = threading.Thread(target=self._receive, daemon=True)
        self._reader.start()

    def _receive(self) -> None:
        import socket

        while not self._done.is_set():
            try:
                self.got.append((time.monotonic(), self.sock.recv(4096).decode()))
            except socket.timeout:
                pass

    def env(self, watchdog_s: float) -> dict[str, str]:
        return {"NOTIFY_SOCKET": str(self.path), "WATCHDOG_USEC": str(int(watchdog_s * 1e6))}

    def has(self, line: str) -> bool:
        return any(line in m.split("\n") for _, m in self.got)

    def ping_times(self) -> list[float]:
        return [t for t, m in self.got if "WATCHDOG=1" in m.split("\n")]

    def close(self) -> None:
        self._done.set()
        self._reader.join()
        self.sock.close()
