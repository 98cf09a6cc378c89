"""The floors nvllm bench sets its figures beside, measured in the same run with the same BLAS.

  matmul floor  the model's own weight matrices multiplied by as many rows as the step has tokens,
                back to back, nothing else: what a perfect engine on this BLAS would take.
  roofline      this machine's limits: reading every weight once at the measured memory bandwidth,
                or the step's FLOPs at the measured peak sgemm rate, whichever is slower.
  integer peak  the multiply-accumulates per second (two operations each) of the dot instruction the
                integer kernels in use are built on, beside sgemm's GFLOP/s, in all and per thread.
  one row       each weight format's matrices times one row of x (a decode step's matmuls), in bytes of
                weights per second, in all and per thread: what the one-row kernels reach of the memory
                bandwidth.
Each is measured at the thread count its figures were (`nvllm bench --threads 1,2,4`: one run per count).
"""

from __future__ import annotations

import functools
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from nvllm.model.kernels import matmul, peak
from nvllm.model.matrix.weight import Weight
from nvllm.model.weights.layout import ModelWeights
from nvllm.model.workspace import Activations


def _best(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm caches, pages and BLAS threads
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def blas_info() -> dict[str, Any]:
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg["Build Dependencies"]["blas"]
        return {"name": blas.get("name"), "version": blas.get("version"),
                "openblas_config": blas.get("openblas configuration")}
    except Exception:  # older NumPy: no dict form
        return {"name": "unknown"}


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model")):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "arch": platform.machine(), "cores": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "numpy": np.__version__, "blas": blas_info()}


def measure_bandwidth_gbs(mib: int = 256) -> float:
    """Bytes per second a BLAS matrix-vector product streams from memory: how weights are read in decode."""
    n = int(np.sqrt(mib * 2**20 / 4))
    w = np.ones((n, n), dtype=np.float32)
    x = np.ones((1, n), dtype=np.float32)
    return w.nbytes / _best(lambda: x @ w, 5) / 1e9


def measure_sgemm_gflops(n: int = 1536) -> float:
    a = np.ones((n, n), dtype=np.float32)
    b = np.ones((n, n), dtype=np.float32)
    return 2 * n ** 3 / _best(lambda: a @ b, 3) / 1e9


def measure_int_peak_gops(threads: int) -> tuple[str, float] | None:
    """The integer peak of the kernels' variant in use, on `threads` threads: (variant, GOP/s); None where
    the quantized formats are multiplied in float (no library, or no integer variant runs)."""
    variant = matmul.int_variant()
    if variant in ("", "float"):
        return None
    return variant, peak.int_peak_gops(variant, threads)


def one_row_rates(w: ModelWeights, repeats: int = 5) -> dict[str, float]:
    """GB/s of weights each storage format's matrices are multiplied at by one row of x, every matrix of
    the format in turn (the parts of a fused matrix each with its own), best of `repeats`."""
    by_format: dict[str, list[Weight]] = {}
    for a in matrices(w) + [w.lm_head]:
        for part in getattr(a, "parts", (a,)):
            by_format.setdefault(part.formats[0], []).append(part)
    rates = {}
    for name, parts in sorted(by_format.items()):
        calls = [(p, np.ones((1, p.shape[1]), dtype=np.float32), np.empty((1, p.shape[0]), dtype=np.float32))
                 for p in parts]
        rates[name] = sum(p.nbytes for p in parts) / _best(functools.partial(_apply_all, calls), repeats) / 1e9
    return rates


def kernel_floors(w: ModelWeights, threads: int, bandwidth_gbs: float) -> dict[str, Any]:
    """The kernels' floors on `threads` threads (set already: kernels/threads.py): the integer peak, and each
    format's one-row rate in all and per thread, and as a fraction of `bandwidth_gbs` measured at that count."""
    out: dict[str, Any] = {}
    peak = measure_int_peak_gops(threads)
    if peak is not None:
        out["int_peak"] = {"variant": peak[0], "gops": round(peak[1], 1),
                           "gops_per_thread": round(peak[1] / threads, 1)}
    out["one_row_gbs"] = {
        name: {"gbs": round(r, 2), "gbs_per_thread": round(r / threads, 2),
               "of_bandwidth": round(r / bandwidth_gbs, 3)}
        for name, r in one_row_rates(w).items()}
    return out


def _apply_all(calls: list[tuple[Weight, np.ndarray, np.ndarray]]) -> None:
    for weight, x, out in calls:
        weight.apply(x, out)


@dataclass
class Floors:
    bandwidth_gbs: float
    sgemm_gflops: float
    weight_bytes: int
    flops_per_token: float          # 2 * matmul parameters (lm_head counted per logit row)
    matmul_s: dict[tuple[int, int], float] = field(default_factory=dict)

    def matmul(self, weights: ModelWeights, rows: int, logit_rows: int, acts: Activations | None = None) -> float:
        """Seconds of the model's matmuls for one step of `rows` tokens, `logit_rows` of them through lm_head.

        Measured again at every call, the best kept: prefill measures it right before each timed run and
        compares best with best, so a machine whose speed drifts (a shared VM, a board warming up)
        drifts under both alike."""
        key = (rows, logit_rows)
        t = matmul_floor(weights, rows, logit_rows, acts=acts)
        self.matmul_s[key] = min(t, self.matmul_s.get(key, t))
        return self.matmul_s[key]

    def step_flops(self, rows: int, logit_rows: int, lm_head_flops: float) -> float:
        """The matmuls' operations of a step of `rows` tokens, `logit_rows` of them through lm_head."""
        return (self.flops_per_token - lm_head_flops) * rows + lm_head_flops * logit_rows

    def int_peak_s(self, rows: int, logit_rows: int, lm_head_flops: float, peak_gops: float) -> float:
        """Seconds of the step's multiply-adds (two operations each, as the peak counts them) at the
        integer peak: what prefill's integer GEMM would take at the dot instruction's throughput."""
        return self.step_flops(rows, logit_rows, lm_head_flops) / (peak_gops * 1e9)

    def roofline(self, rows: int, logit_rows: int, lm_head_flops: float) -> float:
        flops = self.step_flops(rows, logit_rows, lm_head_flops)
        return max(self.weight_bytes / (self.bandwidth_gbs * 1e9), flops / (self.sgemm_gflops * 1e9))


def matrices(w: ModelWeights) -> list:
    return [a for layer in w.layers for a in (layer.qkv, layer.o, layer.gate_up, layer.down)]


def weight_formats(w: ModelWeights) -> dict[str, int]:
    """Matrices by storage format, e.g. {"Q4_1": 120, "F32": 1}: what the bench's figures were run on."""
    names = [f for a in matrices(w) + [w.lm_head] for f in a.formats]
    return {n: names.count(n) for n in sorted(set(names))}


def floor_pass(w: ModelWeights, rows: int, logit_rows: int, acts: Activations | None = None) -> Callable[[], None]:
    """One step's worth of the model's own matmuls and nothing else: every weight matrix times `rows`
    rows, lm_head times `logit_rows`, each multiplied the way the decoder multiplies it. With `acts` (the
    model's workspace, Workspace.take(rows), between steps) each product reads and writes the views the
    decoder's does, so a prefill-sized floor adds nothing to the resident set (512 rows of SmolLM2 were 10 MiB
    of inputs and outputs)."""
    last = np.ones((logit_rows, w.lm_head.shape[1]), dtype=np.float32)
    calls: list[tuple[Weight, np.ndarray, np.ndarray | None]]
    if acts is None:
        xs = {a.shape[1]: np.ones((rows, a.shape[1]), dtype=np.float32) for a in matrices(w)}
        calls = [(a, xs[a.shape[1]], None) for a in matrices(w)]
    else:
        attn = acts.attn.reshape(rows, -1)
        for x in (acts.h, attn, acts.act):   # finite inputs, whatever a step left there
            x.fill(1.0)
        calls = [call for layer in w.layers for call in ((layer.qkv, acts.h, acts.qkv), (layer.o, attn, acts.out),
                                                         (layer.gate_up, acts.h, acts.gate_up),
                                                         (layer.down, acts.act, acts.out))]

    def run() -> None:
        for a, x, out in calls:
            a.apply(x, out)
        w.lm_head.apply(last)
    return run


def matmul_floor(w: ModelWeights, rows: int, logit_rows: int, repeats: int = 3,
                 acts: Activations | None = None) -> float:
    return _best(floor_pass(w, rows, logit_rows, acts), repeats)


def weight_matmul_params(w: ModelWeights) -> tuple[int, int]:
    def params(a: Weight) -> int:
        return a.shape[0] * a.shape[1]
    return sum(params(a) for a in matrices(w)), params(w.lm_head)
