"""What structured output costs per engine step, and what compiling a schema costs (nvllm/bench/structured.py
measures; this prints it).

    .venv/bin/python tools/bench_structured.py [--model models/smollm2-135m-instruct] [--rows 1 16 32] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nvllm.bench.structured import bench_structured, format_structured
from nvllm.config import load_settings
from nvllm.engine.assembly.factory import build_engine

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "smollm2-135m-instruct"))
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 32])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    settings = load_settings(overrides={"model": {"path": args.model},
                                        "scheduler": {"max_num_seqs": max(args.rows)}})
    result = {"model": args.model, **bench_structured(build_engine(settings), args.rows, args.steps, args.rounds)}
    print(json.dumps(result) if args.json else f"model {args.model}, " + format_structured(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
