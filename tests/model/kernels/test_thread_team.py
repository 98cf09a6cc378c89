"""The thread team a decode step runs on (csrc/team.c): a step gives the same bits on 1, 2, 3 and 4 threads, for one
row and for many (each op split across the team: rows, columns, heads, output panels), matmul_team_run still
runs every part, and model.pin_threads pins thread i to the i-th allowed CPU and unpins them again."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.schedule import run_schedule
from nvllm.model.decoder import Model
from nvllm.model.kernels import matmul, ops, peak, threads

pytestmark = pytest.mark.skipif(matmul.lib is None or ops.lib is None, reason="the C kernels are not built")

PROMPT_LENS = (5, 19, 33, 40, 7)
# a five-row step, one-row steps, then three rows: every split the team makes (rows, or columns of one row)
STEPS = [list(PROMPT_LENS)] + [[1] * 5] * 2 + [[0, 1, 0, 0, 0]] * 2 + [[1, 0, 1, 1, 0]] * 2


@pytest.mark.parametrize(("name", "quantization"), [("tiny-qwen2", "q4_k"), ("tiny-phi3", "q8_0"),
                                                     ("tiny-gemma3", "q8_0"), ("tiny-llama-f16", "")])
def test_a_step_gives_the_same_bits_on_any_number_of_threads(tiny_models: dict[str, Path], name: str,
                                                             quantization: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    model = Model.from_dir(tiny_models[name], quantization=quantization)
    model.layers_in_c = True
    rng = np.random.default_rng(3)
    total = [n + sum(s[i] for s in STEPS[1:]) for i, n in enumerate(PROMPT_LENS)]
    ids = [rng.integers(0, model.config.vocab_size, n) for n in total]
    got = {}
    for n in (1, 2, 3, 4):
        monkeypatch.setattr(threads, "count", n)
        got[n] = run_schedule(model, ids, STEPS)
    for n in (2, 3, 4):
        for i, (a, b) in enumerate(zip(got[1], got[n])):
            bad = np.flatnonzero(~(a == b).all(axis=1))
            assert not bad.size, f"{n} threads, prompt {i}: positions {bad.tolist()} differ from one thread's"


def test_matmul_team_run_runs_every_part_once() -> None:
    """dot.c's peak measurement: each part writes its count, here on fewer threads than parts too."""
    job = peak.PeakJob(matmul.INT_VARIANTS["scalar"], 1)
    part = ctypes.cast(matmul.lib.dot_peak_part, ctypes.c_void_p).value or 0   # type: ignore[union-attr]
    matmul.team_run(part, ctypes.addressof(job), 5)
    assert [job.done[i] > 0 for i in range(6)] == [True] * 5 + [False]


PIN_SCRIPT = """
import os, json, numpy as np
from nvllm.model.kernels import matmul
w = matmul.float_blocks(np.ones((256, 64), np.float32))
x = np.ones((1, 64), np.float32)
before = set(os.listdir("/proc/self/task"))
matmul.quant_matmul(w, x, 3)                     # grows the team to two workers
workers = sorted(int(t) for t in set(os.listdir("/proc/self/task")) - before)
allowed = sorted(os.sched_getaffinity(0))
matmul.pin_threads(True)
pinned = [sorted(os.sched_getaffinity(t)) for t in [os.getpid()] + workers]
matmul.quant_matmul(w, x, 3)                     # still runs, pinned
matmul.pin_threads(False)
unpinned = [sorted(os.sched_getaffinity(t)) for t in [os.getpid()] + workers]
print(json.dumps({"allowed": allowed, "workers": len(workers), "pinned": pinned, "unpinned": unpinned}))
"""


def test_pin_threads_pins_thread_i_to_the_ith_allowed_cpu_and_back() -> None:
    """In a child process: pinning the test process's own thread would slow every test after it."""
    daemon = Path(matmul.__file__).parents[3]
    out = subprocess.run([sys.executable, "-c", PIN_SCRIPT], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(daemon), "PATH": "/usr/bin:/bin"}, timeout=120)
    got = json.loads(out.stdout)
    allowed = got["allowed"]
    assert got["workers"] == 2
    assert got["pinned"] == [[allowed[i % len(allowed)]] for i in range(3)]
    assert got["unpinned"] == [allowed] * 3


def test_pin_threads_takes_only_a_bool() -> None:
    with pytest.raises(ValueError, match="model.pin_threads must be true or false"):
        matmul.pin_threads(1)  # type: ignore[arg-type]
