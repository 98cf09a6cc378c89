"""`nvllm serve` as a subprocess on a loopback port the kernel picks, for the footprint and aarch64 tests.

Plain on purpose (no test hooks): what these tests measure (CPU at rest, resident set, start-up time,
a round trip under emulation) is the daemon as an operator runs it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Under emulation Python, NumPy and gRPC load through qemu, so the wait is long.
READY_TIMEOUT_S = float(os.environ.get("NVLLM_TEST_READY_TIMEOUT_S", "300"))


class Served:
    def __init__(self, model: Path, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
        env["PYTHONUNBUFFERED"] = "1"
        self.launched = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nvllm.cli", "serve", "--model", str(model), "--listen", "127.0.0.1:0", *args],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.pid = self.proc.pid
        self.lines: list[str] = []
        self.address = ""
        self.ready_after_s = 0.0        # launch -> the "nvllm serving" line, as this process saw it
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(READY_TIMEOUT_S) or not self.address:
            self.stop()
            raise AssertionError("the daemon did not get ready:\n" + self.log())

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("nvllm serving "):
                self.ready_after_s = time.monotonic() - self.launched
                self.address = line.strip().rsplit(" on ", 1)[1]
                self._ready.set()
        self._ready.set()

    def log(self) -> str:
        return "\n".join(self.lines)

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """`nvllm ARGS --target ADDRESS` in a fresh process."""
        return subprocess.run([sys.executable, "-m", "nvllm.cli", *args, "--target", self.address],
                              cwd=ROOT, capture_output=True, text=True, timeout=timeout)

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()
