"""Each weight format's one-row (decode) rate beside the memory bandwidth, as `nvllm bench`'s "one row"
line has it (bench/floors.py), on synthetic matrices larger than the caches: for the one-row kernels'
work without loading a model.

    PYTHONPATH=daemon .venv/bin/python tools/one_row.py --threads 1,2 --formats Q4_K,Q8_0 --mib 128

Per format: matrices of the 1.5B shape's FFN (8960 x 1536 and 1536 x 8960) in turn, about --mib MiB of
weights in all (random blocks, their fp16 scales small and finite), each multiplied by one row of x;
GB/s of weights, best of --repeats passes, and the fraction of measure_bandwidth_gbs() at that thread
count. --variant picks the integer kernels' variant (default: model.activations' default, "exact").
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from nvllm.bench.floors import measure_bandwidth_gbs
from nvllm.model.kernels import matmul, threads
from nvllm.model.matrix.packed import PackedWeight
from nvllm.model.quant.blocks import BlockMatrix
from nvllm.model.quant.formats import BLOCK_DTYPES, FORMATS

_BY_NAME = {f.name: f for f in FORMATS.values()}
SHAPES = ((8960, 1536), (1536, 8960))


def random_blocks(name: str, rows: int, n_in: int, rng: np.random.Generator) -> BlockMatrix:
    """Random bytes for every field, the fp16 ones (d, m, dmin) set to small finite values."""
    fmt = _BY_NAME[name]
    per_row = n_in // fmt.block_elems
    raw = rng.integers(0, 256, size=rows * per_row * fmt.block_bytes, dtype=np.uint8)
    rec = raw.view(BLOCK_DTYPES[name])
    for field in ("d", "m", "dmin"):
        if field in (rec.dtype.names or ()):
            rec[field] = rng.uniform(1e-3, 1e-2, size=len(rec)).astype(np.float16)
    return BlockMatrix(fmt, raw.reshape(rows, per_row * fmt.block_bytes), (rows, n_in))


def weights_of(name: str, mib: float, shapes=SHAPES, seed: int = 0) -> list[PackedWeight]:
    rng = np.random.default_rng(seed)
    fmt = _BY_NAME[name]
    out, total, i = [], 0, 0
    base = [PackedWeight.of(random_blocks(name, r, c, rng)) for r, c in shapes]
    while total < mib * 2**20 or i < 2:
        w = base[i % 2] if i < 2 else PackedWeight(fmt, base[i % 2].data.copy(), base[i % 2].shape)
        out.append(w)
        total += w.data.nbytes
        i += 1
    return out


def rate(ws: list[PackedWeight], repeats: int) -> float:
    calls = [(w, np.random.default_rng(1).standard_normal((1, w.shape[1])).astype(np.float32),
              np.empty((1, w.shape[0]), np.float32)) for w in ws]

    def run() -> None:
        for w, x, y in calls:
            w.apply(x, y)

    run()
    best = min(_timed(run) for _ in range(repeats))
    return sum(w.data.nbytes for w in ws) / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--formats", default="Q4_K,Q5_0,Q5_K,Q6_K,Q8_0,Q4_1")
    ap.add_argument("--mib", type=float, default=128)
    ap.add_argument("--hot", action="store_true", help="two 2048 x 1536 matrices, in L3: the kernels' compute rate")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variant", default="")
    a = ap.parse_args()
    if a.variant:
        matmul.set_int_variant(a.variant)
    else:
        matmul.set_activations("exact")
    shapes = ((2048, 1536), (2048, 1536)) if a.hot else SHAPES
    weights = {name: weights_of(name, 0 if a.hot else a.mib, shapes) for name in a.formats.split(",")}
    print(f"variant {matmul.int_variant()}, {'hot' if a.hot else a.mib} MiB a format")
    for n in (int(t) for t in a.threads.split(",")):
        threads.configure(n)
        bw = measure_bandwidth_gbs()
        row = [f"threads {n}: bandwidth {bw:5.1f} GB/s |"]
        # each format twice, the best kept: the first measured otherwise pays for BLAS's threads, which
        # spin on for a while after the bandwidth's product (on 2 cores, against the team's second thread)
        best = {name: max(rate(ws, a.repeats) for _ in range(2)) for name, ws in weights.items()}
        for name, r in best.items():
            row.append(f"{name} {r:5.1f} ({r / bw:.2f})")
        print(" ".join(row), flush=True)


if __name__ == "__main__":
    main()
