"""nvllm bench: throughput and latency beside this machine's own floors (nvllm/bench.py measures)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nvllm.cli.flags import add_activations_flag, add_quantization_flag, add_threads_flag
from nvllm.config import DEFAULT_MODEL_FILE


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    b = sub.add_parser("bench", help="throughput and latency beside this machine's own floors")
    b.add_argument("--model", default=f"models/{DEFAULT_MODEL_FILE}",
                   help="a model folder or .gguf file (in-process run)")
    b.add_argument("--concurrency", default="1,8,32", help="comma-separated numbers of requests in flight")
    b.add_argument("--prompt-len", type=int, default=128)
    b.add_argument("--gen-len", type=int, default=64)
    b.add_argument("--prefill-len", default="128,512", help="comma-separated prompt lengths for prefill")
    b.add_argument("--target", default=None, help="measure a running daemon over gRPC instead")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    add_threads_flag(b, default=0)
    add_quantization_flag(b)
    add_activations_flag(b)
    b.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from nvllm import bench
    from nvllm.config import ConfigError
    from nvllm.engine.factory import EngineBuildError

    def numbers(text: str, flag: str) -> list[int]:
        try:
            values = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            values = []
        if not values or min(values) < 1:
            raise SystemExit(f"nvllm bench: {flag} takes positive whole numbers separated by commas, got {text!r}")
        return values

    try:
        bench.run(None if args.target else Path(args.model), numbers(args.concurrency, "--concurrency"),
                  args.prompt_len, args.gen_len, args.target, args.json,
                  numbers(args.prefill_len, "--prefill-len"), args.threads, args.quantization,
                  args.activations)
    except (ConfigError, EngineBuildError) as e:
        print(f"nvllm bench: {e}", file=sys.stderr)
        return 2
    return 0
