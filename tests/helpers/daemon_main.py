"""`nvllm serve` for the tests: the same daemon and arguments, built with the tests' injection points.

    python tests/helpers/daemon_main.py --memory-file PATH [nvllm serve arguments]

- The memory watchdog reads "available bytes" from PATH (an integer the test rewrites), so memory
  pressure can be injected without using any memory.
- SIGUSR1 holds the engine thread still at the top of its loop (no step, no progress, so no systemd
  watchdog ping) until the next SIGUSR1. The lines STALL_BEGAN and STALL_ENDED are logged when the
  hold takes effect and when it ends: tests wait for them instead of sleeping.
- SIGUSR2 makes the model's next forward pass raise FAULT_MESSAGE, so the engine step that runs it
  fails its requests (and only those) the way a real fault would; FAULT_ARMED is logged.
- --pull-from SRC --pull-into DIR: the daemon's puller (Ollama's /api/pull) copies SRC/NAME.gguf for a
  reference "ORG/NAME" or "ORG/NAME:TAG" into DIR with its pull record, progress as the Hub's puller
  reports it (`copying_puller`); a NAME SRC lacks fails as an unknown repository does.

All of this wraps the daemon's objects from here (`Daemon(memory_reader=..., signal_handlers=...)`,
methods shadowed on one engine or model instance): nvllm itself has no test branch and reads no test
variable. DaemonProcess (daemon_util.py) runs this, or plain `nvllm serve` for the tests that measure
the daemon as an operator runs it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nvllm.cli import build_parser, serve
from nvllm.engine.assembly.memory import MemoryReading
from nvllm.model.decoder import Model
from nvllm.server.daemon import Daemon

STALL_BEGAN = "test launcher: engine loop held (SIGUSR1)"
STALL_ENDED = "test launcher: engine loop released (SIGUSR1)"
FAULT_ARMED = "test launcher: the next forward pass fails (SIGUSR2)"
FAULT_MESSAGE = "injected step fault (SIGUSR2)"

log = logging.getLogger("nvllm.tests.launcher")


def file_memory_reader(path: Path) -> Callable[[], MemoryReading]:
    """Readings from a file holding the available bytes (the test replaces it whole, never half-written)."""
    def read() -> MemoryReading:
        return MemoryReading(int(path.read_text().strip()), f"test file {path}")
    return read


class EngineHold:
    """SIGUSR1: hold the engine thread inside LLMEngine.has_unfinished, which its loop calls once per
    iteration after bumping `progress`; the next SIGUSR1 lets it go."""

    def __init__(self) -> None:
        self._gate: threading.Event | None = None

    def toggle(self, daemon: Daemon) -> None:
        if daemon.engine is None:
            log.warning("SIGUSR1 before the engine started: ignored")
            return
        if self._gate is None:
            self._gate = threading.Event()
            engine = daemon.engine.engine
            if "has_unfinished" not in vars(engine):
                # shadowed on the instance (and found there by the check above)
                engine.has_unfinished = self._held(engine.has_unfinished)  # type: ignore[method-assign]
        else:
            gate, self._gate = self._gate, None
            gate.set()

    def _held(self, has_unfinished: Callable[[], bool]) -> Callable[[], bool]:
        def held() -> bool:
            gate = self._gate
            if gate is not None and not gate.is_set():
                log.warning(STALL_BEGAN)
                gate.wait()
                log.warning(STALL_ENDED)
            return has_unfinished()
        return held


def fail_next_forward(daemon: Daemon) -> None:
    """SIGUSR2: shadow the model's forward with one that restores the real one and raises."""
    if daemon.engine is None:
        log.warning("SIGUSR2 before the engine started: ignored")
        return
    model = daemon.engine.engine.model
    assert isinstance(model, Model)
    if "forward" not in vars(model):
        def failing_forward(*args: Any, **kwargs: Any) -> Any:
            del model.forward
            raise RuntimeError(FAULT_MESSAGE)
        model.forward = failing_forward  # type: ignore[method-assign]  # on the instance: `del` restores the class's
    log.warning(FAULT_ARMED)


def copying_puller(source: Path, into: Path) -> Callable[[str, Callable[[dict[str, Any]], None]],
                                                          tuple[str, Path, list[str]]]:
    """A puller that copies a GGUF from source, as the Hub's writes one: the file in parts with progress,
    checked, then its pull record (`.NAME.gguf.nvllm-pull.json`: source, aliases, files)."""
    def pull(ref: str, progress: Callable[[dict[str, Any]], None]) -> tuple[str, Path, list[str]]:
        repo, _, tag = ref.removeprefix("hf.co/").partition(":")
        name = repo.rsplit("/", 1)[-1].lower()
        progress({"status": "pulling manifest"})
        src = source / f"{name}.gguf"
        if not src.is_file():
            raise RuntimeError(f"the repository {repo!r} does not exist")
        data = src.read_bytes()
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        dest, part = into / f"{name}.gguf", into / f".{name}.gguf.part"
        with open(part, "wb") as f:
            for at in range(0, len(data), len(data) // 4 + 1):
                f.write(data[at:at + len(data) // 4 + 1])
                progress({"status": f"pulling {digest[7:19]}", "digest": digest, "total": len(data),
                          "completed": min(len(data), at + len(data) // 4 + 1)})
        progress({"status": "verifying sha256 digest"})
        part.rename(dest)
        aliases = [ref, f"hf.co/{repo}" + (f":{tag}" if tag else ""), repo + (f":{tag}" if tag else "")]
        (into / f".{name}.gguf.nvllm-pull.json").write_text(json.dumps(
            {"source": f"hf.co/{repo}:{tag or 'F32'}", "aliases": aliases, "files": {dest.name: digest[7:]}}))
        progress({"status": "success"})
        return name, dest, aliases
    return pull


def main(argv: list[str]) -> int:
    own = argparse.ArgumentParser(prog="daemon_main.py", allow_abbrev=False)
    own.add_argument("--memory-file", type=Path, required=True)
    own.add_argument("--pull-from", type=Path, default=None)
    own.add_argument("--pull-into", type=Path, default=None)
    ours, serve_args = own.parse_known_args(argv)
    args = build_parser().parse_args(["serve", *serve_args])
    injected: dict[str, Any] = {}
    if ours.pull_from is not None:
        injected["puller"] = copying_puller(ours.pull_from, ours.pull_into)
    return serve.main(args, memory_reader=file_memory_reader(ours.memory_file),
                      signal_handlers={signal.SIGUSR1: EngineHold().toggle, signal.SIGUSR2: fail_next_forward},
                      **injected)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
