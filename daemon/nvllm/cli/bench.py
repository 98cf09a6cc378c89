"""nvllm bench: throughput and latency beside this machine's own floors (the bench/ package measures)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nvllm.bench.counts import thread_counts
from nvllm.cli.flags import add_activations_flag, add_kv_cache_dtype_flag, add_quantization_flag
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
    b.add_argument("--query", default=None, metavar="URL",
                   help="time the drone's query through a running daemon's HTTP API (e.g. http://127.0.0.1:8000): "
                        "190 prompt tokens, the first 176 already cached, 20 answered")
    b.add_argument("--speculation", action="store_true",
                   help="one stream's time per token with n-gram speculation and without, on tasks that repeat "
                        "their input and on free text (in-process, --gen-len tokens at most)")
    b.add_argument("--draft-model", default=None, metavar="PATH",
                   help="with --speculation: proposals by this draft model (a folder or .gguf sharing --model's "
                        "tokenizer) instead of n-grams")
    b.add_argument("--embed", action="store_true",
                   help="an embedding model's sequences/s and tokens/s: --inputs inputs of --prompt-len tokens "
                        "(in-process, 2,048 tokens a step as llama-embedding batches them)")
    b.add_argument("--inputs", type=int, default=64, help="with --embed: inputs embedded at once (default 64)")
    b.add_argument("--repeats", type=int, default=5, help="questions --query times (default 5)")
    b.add_argument("--api-key-file", default=None, help="with --query: the daemon's HTTP API key, in a file")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.add_argument("--threads", "--blas-threads", dest="threads", type=thread_counts, default="0", metavar="N[,N...]",
                   help="threads for the matmuls (model.threads; 0: one per usable core but one, the cgroup's CPU "
                        "quota counted), or a comma-separated list of counts, e.g. 1,2,4: the whole bench once per "
                        "count, each beside floors measured at that count; --blas-threads is its old name")
    add_quantization_flag(b)
    add_activations_flag(b)
    add_kv_cache_dtype_flag(b)
    b.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from nvllm.bench import throughput
    from nvllm.config import ConfigError
    from nvllm.engine.build.factory import EngineBuildError

    def numbers(text: str, flag: str) -> list[int]:
        try:
            values = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            values = []
        if not values or min(values) < 1:
            raise SystemExit(f"nvllm bench: {flag} takes positive whole numbers separated by commas, got {text!r}")
        return values

    if len(args.threads) > 1 and (args.query or args.speculation or args.target or args.embed):
        print(f"nvllm bench: --threads takes one count with --query, --speculation, --embed or --target, got "
              f"{','.join(map(str, args.threads))}", file=sys.stderr)
        return 2
    if args.query:
        return _query(args)
    if args.speculation:
        return _speculation(args)
    if args.embed:
        return _embed(args)
    if args.draft_model:
        print("nvllm bench: --draft-model goes with --speculation", file=sys.stderr)
        return 2
    try:
        throughput.run(None if args.target else Path(args.model), numbers(args.concurrency, "--concurrency"),
                  args.prompt_len, args.gen_len, args.target, args.json,
                  numbers(args.prefill_len, "--prefill-len"), args.threads, args.quantization,
                  args.activations, args.kv_cache_dtype)
    except (ConfigError, EngineBuildError) as e:
        print(f"nvllm bench: {e}", file=sys.stderr)
        return 2
    return 0


def _query(args: argparse.Namespace) -> int:
    import json

    from nvllm.bench.query import QueryError, drone_query, format_query

    if args.repeats < 1:
        print(f"nvllm bench: --repeats must be at least 1, got {args.repeats}", file=sys.stderr)
        return 2
    try:
        key = Path(args.api_key_file).read_text().strip() if args.api_key_file else ""
        result = drone_query(args.query, args.repeats, key)
    except OSError as e:
        print(f"nvllm bench: --api-key-file: {e.strerror or e}", file=sys.stderr)
        return 2
    except QueryError as e:
        print(f"nvllm bench: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result) if args.json else format_query(result))
    return 0


def _speculation(args: argparse.Namespace) -> int:
    import json

    from nvllm.bench.speculation import bench_speculation, format_speculation
    from nvllm.config import ConfigError
    from nvllm.engine.build.factory import EngineBuildError

    try:
        result = bench_speculation(Path(args.model), args.gen_len, threads=args.threads[0],
                                   draft_model=args.draft_model)
    except (ConfigError, EngineBuildError) as e:
        print(f"nvllm bench: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result) if args.json else format_speculation(result))
    return 0


def _embed(args: argparse.Namespace) -> int:
    import json

    from nvllm.bench.embedding import bench_embed, format_embed
    from nvllm.config import ConfigError
    from nvllm.engine.build.factory import EngineBuildError

    if args.inputs < 1 or args.prompt_len < 2:
        print(f"nvllm bench: --inputs must be at least 1 and --prompt-len 2, got {args.inputs} and {args.prompt_len}",
              file=sys.stderr)
        return 2
    try:
        result = bench_embed(Path(args.model), args.inputs, args.prompt_len, args.threads[0],
                             quantization=args.quantization or "")
    except (ConfigError, EngineBuildError, ValueError) as e:
        print(f"nvllm bench: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result) if args.json else format_embed(result))
    return 0
