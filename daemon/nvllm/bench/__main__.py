"""`python -m nvllm.bench sampler`: sample()'s time per call for each parameter mix (bench/sampler.py)."""

from __future__ import annotations

import sys

import numpy as np

from nvllm.bench.sampler import bench_sampler


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["sampler"]:
        print("usage: python -m nvllm.bench sampler  (the engine bench is `nvllm bench`)", file=sys.stderr)
        return 2
    rows, vocab, repeats = 32, 49152, 30
    print(f"sample(): N={rows} rows, V={vocab}, numpy {np.__version__}; ms per call, median (min) of {repeats}")
    for r in bench_sampler(rows, vocab, repeats):
        print(f"  {r['median_ms']:7.2f} ({r['min_ms']:6.2f})  {r['case']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
