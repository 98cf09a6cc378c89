"""deploy/aarch64-check.sh in the background from the start of a session that runs its test.

The emulated run spends most of its ten minutes on one core (gcc on the kernels' C under qemu) while the rest of
the suite keeps the other busy, so tests/conftest.py starts it as soon as the test is collected and moves
the test last, and the test only waits for what ran beside everything else. Its output goes to a file,
never a pipe nobody reads; a session that ends early kills it with everything it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from helpers.paths import ROOT

SCRIPT = ROOT / "deploy" / "aarch64-check.sh"
TEST = "tests/deploy/test_aarch64.py::test_emulated_aarch64_run_passes"


@dataclass
class Run:
    proc: subprocess.Popen
    log: Path
    started: float


_run: Run | None = None


def start() -> None:
    """Start the emulated run, once per session."""
    global _run
    if _run is not None:
        return
    fd, name = tempfile.mkstemp(prefix="nvllm-aarch64-", suffix=".log")
    with os.fdopen(fd, "wb") as log:
        proc = subprocess.Popen(["bash", str(SCRIPT)], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    _run = Run(proc, Path(name), time.monotonic())


def result(timeout_s: float) -> tuple[int, str, float]:
    """(exit status, output, seconds since it started): started now if it was not; waits at most timeout_s
    more, then kills it (exit status -9)."""
    start()
    assert _run is not None
    try:
        rc = _run.proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        stop()
        rc = -signal.SIGKILL
    return rc, _run.log.read_text(errors="replace"), time.monotonic() - _run.started


def stop() -> None:
    """End the run and what it started (its own session), if it is still going: SIGTERM, then SIGKILL."""
    if _run is None or _run.proc.poll() is not None:
        return
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
        try:
            os.killpg(_run.proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            _run.proc.wait(grace)
            break
        except subprocess.TimeoutExpired:
            continue
