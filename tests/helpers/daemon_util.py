"""The real daemon as a subprocess, and the small gRPC helpers the end-to-end and stress tests share.

`DaemonProcess` runs one of:
- tests/helpers/daemon_main.py (the default): `nvllm serve`'s daemon built with the tests' injection points:
  available memory is read from a file (`set_available`), so pressure can be injected without using
  any memory; SIGUSR1 holds the engine loop still until the next one (`stall`, `resume`); SIGUSR2
  makes the next forward pass raise (`fail_step`). Each returns once the daemon logged that it acted.
- plain `python -m nvllm.cli serve` (plain=True): the daemon as an operator runs it, for the tests
  that measure it (idle CPU, resident set, start-up time, a round trip under emulation).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from helpers.daemon_main import FAULT_ARMED, STALL_BEGAN, STALL_ENDED
from helpers.paths import ROOT
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

LAUNCHER = Path(__file__).resolve().parent / "daemon_main.py"
NUM_BLOCKS = 256
MAX_MESSAGE_BYTES = 64 * 1024
PLENTY = str(64 << 30)        # "available bytes" in the memory file: no pressure
# Under emulation Python, NumPy and gRPC load through qemu, so the wait is long. A daemon that exits
# ends the wait at once.
READY_TIMEOUT_S = float(os.environ.get("NVLLM_TEST_READY_TIMEOUT_S", "300"))
LINE_TIMEOUT_S = 30.0         # for a line the daemon logs in reply to a signal

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
    """The daemon as a subprocess on `listen` (a loopback port the kernel picks by default), ready
    when constructed; its output is read by a thread (so it never blocks) into `lines`.

    config None: no --config (the built-in defaults); num_blocks None: the pool sized from memory.
    """

    def __init__(self, tmp: Path, model: Path, config: str | None = BASE_CONFIG, listen: str = "127.0.0.1:0",
                 num_blocks: int | None = NUM_BLOCKS, extra_env: dict[str, str] | None = None,
                 extra_args: tuple[str, ...] = (), plain: bool = False, http_listen: str | None = None,
                 ollama_listen: str | None = None) -> None:
        """http_listen: also serve the HTTP API there ("127.0.0.1:0": a port the kernel picks); its
        base URL (http://host:port) is then `http_url`; ollama_listen likewise (--ollama-listen),
        `ollama_url`."""
        tmp.mkdir(parents=True, exist_ok=True)
        args = ["--model", str(model), "--listen", listen, *extra_args]
        if http_listen is not None:
            args += ["--http-listen", http_listen]
        if ollama_listen is not None:
            args += ["--ollama-listen", ollama_listen]
        if num_blocks is not None:
            args += ["--num-blocks", str(num_blocks)]
        if config is not None:
            (tmp / "nvllm.toml").write_text(config)
            args += ["--config", str(tmp / "nvllm.toml")]
        self.memory_file = tmp / "available_bytes"
        if plain:
            command = [sys.executable, "-m", "nvllm.cli", "serve", *args]
        else:
            self.set_available(int(PLENTY))
            command = [sys.executable, str(LAUNCHER), "--memory-file", str(self.memory_file), *args]
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
        env.update({"PYTHONUNBUFFERED": "1", **(extra_env or {})})
        self.lines: list[str] = []
        self.address = ""
        self.ready_after_s = 0.0        # launch -> the "nvllm serving" line, as this process saw it
        self.held = False               # stall() sent and resume() not yet
        self._new_line = threading.Condition()
        self._ended = False
        self.launched = time.monotonic()
        self.proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            line = self.wait_line("nvllm serving ", timeout=READY_TIMEOUT_S)
        except AssertionError:
            self.stop()
            raise AssertionError("the daemon did not get ready:\n" + self.log()) from None
        self.address = line.rsplit(" on ", 1)[1]
        self.http_url = ""
        if http_listen is not None:
            self.http_url = self.wait_line("nvllm HTTP API on ").rsplit(" on ", 1)[1]
        self.ollama_url = ""
        if ollama_listen is not None:
            self.ollama_url = self.wait_line("nvllm Ollama API on ").rsplit(" on ", 1)[1]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("nvllm serving ") and not self.ready_after_s:
                self.ready_after_s = time.monotonic() - self.launched
            with self._new_line:
                self.lines.append(line.rstrip("\n"))
                self._new_line.notify_all()
        with self._new_line:
            self._ended = True
            self._new_line.notify_all()

    def wait_line(self, text: str, start: int = 0, timeout: float = LINE_TIMEOUT_S) -> str:
        """The first line from lines[start] on that contains text, once the daemon has written it.
        AssertionError if the daemon's output ends or timeout passes first."""
        deadline = time.monotonic() + timeout
        with self._new_line:
            while True:
                found = next((line for line in self.lines[start:] if text in line), None)
                if found is not None:
                    return found
                start = len(self.lines)
                left = deadline - time.monotonic()
                if self._ended or left <= 0:
                    raise AssertionError(f"the daemon wrote no line with {text!r}:\n" + "\n".join(self.lines[-60:]))
                self._new_line.wait(left)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def log(self) -> str:
        return "\n".join(self.lines)

    def rss(self) -> int:
        """The daemon's resident set, in bytes."""
        return psutil.Process(self.proc.pid).memory_info().rss

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """`nvllm ARGS --target ADDRESS` in a fresh process."""
        return subprocess.run([sys.executable, "-m", "nvllm.cli", *args, "--target", self.address],
                              cwd=ROOT, capture_output=True, text=True, timeout=timeout)

    # -- the injection points (not with plain=True) ---------------------------------------------
    def set_available(self, n: int) -> None:
        """What the memory watchdog reads next; the file is replaced whole, never seen half-written."""
        part = self.memory_file.with_name(self.memory_file.name + ".part")
        part.write_text(str(n))
        os.replace(part, self.memory_file)

    def stall(self) -> None:
        """Hold the engine loop still until resume(); returns once the engine thread is held. Adds
        sent meanwhile wait in its inbox (Health counts them as waiting)."""
        self.held = True
        self._signal(signal.SIGUSR1, STALL_BEGAN)

    def resume(self) -> None:
        """Let the held engine loop go; returns once it runs again."""
        self.held = False
        self._signal(signal.SIGUSR1, STALL_ENDED)

    def fail_step(self) -> None:
        """The next forward pass raises; returns once that is armed."""
        self._signal(signal.SIGUSR2, FAULT_ARMED)

    def _signal(self, signum: int, reply: str) -> None:
        start = len(self.lines)
        self.proc.send_signal(signum)
        self.wait_line(reply, start)

    # -- the end ---------------------------------------------------------------------------------
    def wait(self, timeout: float = 30.0) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(5)
        return rc

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (the drain; a held engine is let go first) and the exit status; SIGKILL after timeout."""
        if self.proc.poll() is None:
            if self.held:
                self.proc.send_signal(signal.SIGUSR1)
                self.held = False
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.wait()


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

        while not self._done.is_set():
            try:
                self.got.append((time.monotonic(), self.sock.recv(4096).decode()))
            except TimeoutError:
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


def pings_while_stalled(daemon: DaemonProcess, notify: NotifySocket, window_s: float) -> list[float]:
    """Hold the daemon's engine loop; once the daemon logs that it withholds the watchdog ping, keep it
    held window_s longer and note the pings that arrive meanwhile; let it go and wait for the pings to
    resume. Returns the pings that came while withheld (there should be none).

    The window only sets how long the pings are watched: the engine stays held however long the test
    takes, so a slow machine shortens nothing."""
    start = len(daemon.lines)
    daemon.stall()
    daemon.wait_line("made no progress", start)
    withheld = time.monotonic()
    time.sleep(window_s)
    quiet = [t for t in notify.ping_times() if t > withheld]
    daemon.resume()
    daemon.wait_line("watchdog pings resume", start)
    resumed = time.monotonic()
    wait_for(lambda: notify.ping_times() and notify.ping_times()[-1] > resumed, "a ping after the stall")
    return quiet


async def drained(engine: Any, ae: Any) -> None:
    """Waits (5 s at most) until the engine runs no request and the async engine has no stream open."""
    for _ in range(500):
        if engine.stats()["running"] == 0 and not ae.num_streams:
            return
        await asyncio.sleep(0.01)


def assert_pages_all_back(engine: Any) -> None:
    """Every page of the engine's pool is free or cached again, and its books agree."""
    bm = engine.block_manager
    assert len(bm.free_ids) + bm.num_cached_blocks == bm.num_blocks
    bm.check_integrity()
