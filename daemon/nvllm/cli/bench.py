"""nvllm bench: throughput and latency beside this machine's own floors (the bench/ package measures)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from nvllm.bench.counts import thread_counts
from nvllm.cli.flags import add_activations_flag, add_kv_cache_dtype_flag, add_quantization_flag
from nvllm.config import DEFAULT_MODEL_FILE

DEFAULT_SPEECH_MODEL = "whisper-tiny.en"   # `nvllm models pull whisper-tiny.en` puts it there

if TYPE_CHECKING:
    from nvllm.bench.quality import Source


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    b = sub.add_parser("bench", help="throughput and latency beside this machine's own floors")
    b.add_argument("--model", default=None,
                   help=f"a model folder or .gguf file (in-process run; default models/{DEFAULT_MODEL_FILE}, and "
                        f"with --transcribe or --voice-query the speech model, default models/{DEFAULT_SPEECH_MODEL})")
    b.add_argument("--concurrency", default="1,8,32", help="comma-separated numbers of requests in flight")
    b.add_argument("--prompt-len", type=int, default=128)
    b.add_argument("--gen-len", type=int, default=64)
    b.add_argument("--prefill-len", default="128,512", help="comma-separated prompt lengths for prefill")
    b.add_argument("--target", default=None, help="measure a running daemon over gRPC instead")
    b.add_argument("--query", default=None, metavar="URL[,URL...]",
                   help="time the drone's query through a running daemon, each front door given: http://HOST:PORT "
                        "(its HTTP API; its /metrics split the time) or grpc://HOST:PORT; with --model, the same "
                        "file's decode in this process beside it: 351 prompt tokens, the first 320 already cached, "
                        "20 answered, streamed")
    b.add_argument("--speculation", action="store_true",
                   help="one stream's time per token with n-gram speculation and without, on tasks that repeat "
                        "their input and on free text (in-process, --gen-len tokens at most)")
    b.add_argument("--speculation-query", default=None, metavar="URL",
                   help="--speculation's tasks through a running daemon's HTTP API (e.g. http://127.0.0.1:8000), "
                        "each answered with its proposals and without (disable_speculation), streamed and whole")
    b.add_argument("--draft-model", default=None, metavar="PATH",
                   help="with --speculation: proposals by this draft model (a folder or .gguf sharing --model's "
                        "tokenizer) instead of n-grams")
    b.add_argument("--embed", action="store_true",
                   help="an embedding model's sequences/s and tokens/s: --inputs inputs of --prompt-len tokens "
                        "(in-process, 2,048 tokens a step as llama-embedding batches them)")
    b.add_argument("--inputs", type=int, default=64, help="with --embed: inputs embedded at once (default 64)")
    b.add_argument("--quality", action="store_true",
                   help="what --model's arithmetic costs against its float path, as llama-perplexity "
                        "--kl-divergence reports it (perplexity, KL mean/median/p99/max, same top token) and "
                        "the share of 64 chat prompts whose greedy answer (16 tokens) is the float path's; "
                        "per activation mode (exact and int8, or --activations)")
    b.add_argument("--reference", default=None, metavar="PATH",
                   help="with --quality: the float reference is this model (same vocabulary) in place of --model's "
                        "own float path")
    b.add_argument("--formats", default=None, metavar="F[,F...]",
                   help="with --quality and an F32/F16 --model: each weight format a row of its own, against "
                        "--model: a GGUF's file types (Q8_0, Q4_K_M, Q5_0, IQ4_NL, ...: written as nvllm models "
                        "quantize writes them, in a scratch folder) or a folder's model.quantization (q8_0, "
                        "q4_0, q4_k)")
    b.add_argument("--text-tokens", type=int, default=0, metavar="N",
                   help="with --quality: read only the held text's first N tokens (default: all, about 2k)")
    b.add_argument("--profile", action="store_true",
                   help="where a decode step's time goes: each part of the step in microseconds, at each "
                        "--concurrency, --gen-len steps after a --prompt-len prompt")
    b.add_argument("--transcribe", default=None, metavar="FILE",
                   help="a speech model's (--model) speed on this audio file, in process: real-time factor, the "
                        "front end / encoder / decoder split, and --clips copies at once")
    b.add_argument("--clips", default=None, metavar="N[,N...]",
                   help="with --transcribe: copies of the clip transcribed at once, each count a row (default 1,16)")
    b.add_argument("--voice-query", default=None, metavar="FILE",
                   help="a spoken question (this audio file) asked through a daemon serving --model (speech) and "
                        "--chat-model, one streamed HTTP chat completion with an input_audio part: upload, "
                        "transcription, the answer's first token and the rest")
    b.add_argument("--chat-model", default=None, metavar="PATH",
                   help=f"with --voice-query: the chat model (default models/{DEFAULT_MODEL_FILE})")
    b.add_argument("--repeats", type=int, default=None,
                   help="questions --query times (default 5); runs of each row of --transcribe (the best kept) and "
                        "questions --voice-query times (their mean; default 3 for both)")
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
    from nvllm.engine.assembly.factory import EngineBuildError

    speech = args.transcribe or args.voice_query
    refused = _speech_flags_refused(args)
    if refused:
        print(f"nvllm bench: {refused}", file=sys.stderr)
        return 2
    args.model_given = args.model is not None
    args.model = args.model or (f"models/{DEFAULT_SPEECH_MODEL}" if speech else f"models/{DEFAULT_MODEL_FILE}")
    args.repeats = args.repeats if args.repeats is not None else 3 if speech else 5
    if args.transcribe:
        return _transcribe(args)
    if args.voice_query:
        return _voice_query(args)

    def numbers(text: str, flag: str) -> list[int]:
        try:
            values = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            values = []
        if not values or min(values) < 1:
            raise SystemExit(f"nvllm bench: {flag} takes positive whole numbers separated by commas, got {text!r}")
        return values

    if len(args.threads) > 1 and (args.query or args.speculation or args.target or args.embed or args.quality
                                  or args.profile):
        print(f"nvllm bench: --threads takes one count with --query, --speculation, --embed, --quality, --profile "
              f"or --target, got {','.join(map(str, args.threads))}", file=sys.stderr)
        return 2
    if args.profile:
        return _profile(args, numbers(args.concurrency, "--concurrency"))
    if args.query:
        return _query(args)
    if args.speculation:
        return _speculation(args)
    if args.speculation_query:
        return _speculation_query(args)
    if args.embed:
        return _embed(args)
    if args.quality:
        return _quality(args)
    if args.reference or args.formats:
        print("nvllm bench: --reference and --formats go with --quality", file=sys.stderr)
        return 2
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


def _speech_flags_refused(args: argparse.Namespace) -> str | None:
    """Why the speech benches' flags cannot go together as given, naming them; None where they can."""
    if args.transcribe and args.voice_query:
        return "--transcribe and --voice-query are two benches: give one"
    speech = "--transcribe" if args.transcribe else "--voice-query" if args.voice_query else None
    if speech is None:
        if args.chat_model:
            return "--chat-model goes with --voice-query"
        if args.clips is not None:
            return "--clips goes with --transcribe"
        return None
    others = [flag for flag, on in (("--query", args.query), ("--target", args.target), ("--embed", args.embed),
                                    ("--quality", args.quality), ("--speculation", args.speculation)) if on]
    if others:
        return f"{speech} is a bench of its own: drop {', '.join(others)}"
    if args.transcribe and args.chat_model:
        return "--chat-model goes with --voice-query"
    if args.voice_query and args.clips is not None:
        return "--clips goes with --transcribe"
    if args.voice_query and len(args.threads) > 1:
        return f"--threads takes one count with --voice-query, got {','.join(map(str, args.threads))}"
    if args.repeats is not None and args.repeats < 1:
        return f"--repeats must be at least 1, got {args.repeats}"
    if not Path(args.transcribe or args.voice_query).is_file():
        return f"{speech}: {args.transcribe or args.voice_query}: no such file"
    return None


def _transcribe(args: argparse.Namespace) -> int:
    import json

    from nvllm.bench.progress import Progress
    from nvllm.bench.transcription import bench_transcribe, format_transcribe
    from nvllm.config import ConfigError
    from nvllm.engine.assembly.factory import EngineBuildError

    try:
        clips = [int(x) for x in (args.clips or "1,16").split(",") if x.strip()]
    except ValueError:
        clips = []
    if not clips or min(clips) < 1 or len(set(clips)) != len(clips):
        print(f"nvllm bench: --clips takes positive whole numbers separated by commas, each once, got {args.clips!r}",
              file=sys.stderr)
        return 2
    try:
        results = bench_transcribe(Path(args.model), Path(args.transcribe), args.threads, clips, args.repeats,
                                   args.quantization or "", Progress(enabled=not args.json))
    except (ConfigError, EngineBuildError, ValueError) as e:
        print(f"nvllm bench: {e}", file=sys.stderr)
        return 2
    print(json.dumps(results[0] if len(results) == 1 else results) if args.json else format_transcribe(results))
    return 0


def _voice_query(args: argparse.Namespace) -> int:
    import json

    from nvllm.bench.voice_query import VoiceQueryError, format_voice_query, voice_query

    try:
        result = voice_query(Path(args.voice_query), Path(args.model),
                             Path(args.chat_model or f"models/{DEFAULT_MODEL_FILE}"), args.threads[0], args.repeats)
    except VoiceQueryError as e:
        print(f"nvllm bench: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result) if args.json else format_voice_query(result))
    return 0


def _query(args: argparse.Namespace) -> int:
    import json

    from nvllm.bench.query import QueryError, bench_decode_ms, drone_query, format_query
    from nvllm.config import ConfigError, load_settings
    from nvllm.engine.assembly.factory import EngineBuildError, build_engine

    if args.repeats < 1:
        print(f"nvllm bench: --repeats must be at least 1, got {args.repeats}", file=sys.stderr)
        return 2
    try:
        key = Path(args.api_key_file).read_text().strip() if args.api_key_file else ""
        result = drone_query([u.strip() for u in args.query.split(",") if u.strip()], args.repeats, key)
        if args.model_given:   # the same question's decode in this process, on the daemon's model and threads
            engine = build_engine(load_settings(overrides={"model": {
                "path": args.model, "threads": args.threads[0], "quantization": args.quantization or "",
                **({"activations": args.activations} if args.activations else {})}}))
            result["bench_gap_ms"] = bench_decode_ms(engine, args.repeats)
    except OSError as e:
        print(f"nvllm bench: --api-key-file: {e.strerror or e}", file=sys.stderr)
        return 2
    except QueryError as e:
        print(f"nvllm bench: {e}", file=sys.stderr)
        return 1
    except (ConfigError, EngineBuildError) as e:
        print(f"nvllm bench: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result) if args.json else format_query(result))
    return 0


def _speculation(args: argparse.Namespace) -> int:
    import json

    from nvllm.bench.speculation import bench_speculation, format_speculation
    from nvllm.config import ConfigError
    from nvllm.engine.assembly.factory import EngineBuildError

    try:
        result = bench_speculation(Path(args.model), args.gen_len, threads=args.threads[0],
                                   draft_model=args.draft_model)
    except (ConfigError, EngineBuildError) as e:
        print(f"nvllm bench: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result) if args.json else format_speculation(result))
    return 0


def _speculation_query(args: argparse.Namespace) -> int:
    import json

    from nvllm.bench.query import QueryError
    from nvllm.bench.speculation_query import bench_speculation_query, format_speculation_query

    try:
        key = Path(args.api_key_file).read_text().strip() if args.api_key_file else ""
        result = bench_speculation_query(args.speculation_query, args.gen_len, max(1, args.repeats), key)
    except OSError as e:
        print(f"nvllm bench: --api-key-file: {e.strerror or e}", file=sys.stderr)
        return 2
    except QueryError as e:
        print(f"nvllm bench: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result) if args.json else format_speculation_query(result))
    return 0


def _profile(args: argparse.Namespace, concurrency: list[int]) -> int:
    import json

    from nvllm.bench.step_profile import bench_profile, format_profile
    from nvllm.config import ConfigError
    from nvllm.engine.assembly.factory import EngineBuildError

    if args.prompt_len < 1 or args.gen_len < 1:
        print(f"nvllm bench: --prompt-len and --gen-len must be at least 1 with --profile, got {args.prompt_len} "
              f"and {args.gen_len}", file=sys.stderr)
        return 2
    try:
        result = bench_profile(args.model, concurrency, args.prompt_len, args.gen_len, args.threads[0],
                               args.quantization or "", args.activations or "")
    except (ConfigError, EngineBuildError) as e:
        print(f"nvllm bench: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result) if args.json else
          f"{result['model']}, {result['machine']['threads']} thread(s)\n" +
          "\n".join(format_profile(r) for r in result["runs"]))
    return 0


def _embed(args: argparse.Namespace) -> int:
    import json

    from nvllm.bench.embedding import bench_embed, format_embed
    from nvllm.config import ConfigError
    from nvllm.engine.assembly.factory import EngineBuildError

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


def _quality(args: argparse.Namespace) -> int:
    import json
    import tempfile

    from nvllm.bench.quality import Source, bench_quality, format_quality
    from nvllm.config import ConfigError
    from nvllm.engine.assembly.factory import EngineBuildError

    if args.text_tokens < 0 or args.text_tokens == 1:
        print(f"nvllm bench: --text-tokens must be 0 (all) or at least 2, got {args.text_tokens}", file=sys.stderr)
        return 2
    if args.activations == "float":
        print("nvllm bench: --activations float is --quality's reference; give exact or int8, or neither for both",
              file=sys.stderr)
        return 2
    model = Path(args.model)
    modes = (args.activations,) if args.activations else ("exact", "int8")
    with tempfile.TemporaryDirectory(prefix="nvllm-quality-") as scratch:
        try:
            sources = _quality_sources(model, args.formats, Path(scratch)) if args.formats else None
            result = bench_quality(Source(model, args.quantization or ""),
                                   Source(Path(args.reference)) if args.reference else None, modes, sources,
                                   args.threads[0], args.text_tokens)
        except (ConfigError, EngineBuildError, ValueError, OSError) as e:
            print(f"nvllm bench: {e}", file=sys.stderr)
            return 2
    print(json.dumps(result) if args.json else format_quality(result))
    return 0


def _quality_sources(model: Path, formats: str, scratch: Path) -> list[Source]:
    """--formats: each weight format of an F32/F16 --model as a Source: a GGUF written again in that file
    type into scratch, or a folder quantized at load."""
    from nvllm.bench.quality import Source
    from nvllm.model_files.listing import describe_gguf
    from nvllm.model_files.synthetic.mixture import FILE_TYPES
    from nvllm.model_files.synthetic.requantize import requantize

    names = [f.strip() for f in formats.split(",") if f.strip()]
    if not model.name.endswith(".gguf"):
        kinds = ("q8_0", "q4_0", "q4_k", "bf16", "f16")
        bad = [f for f in names if f not in kinds]
        if bad or not names:
            raise ValueError(f"--formats: a folder's are model.quantization's {', '.join(kinds)}, got {formats!r}")
        return [Source(model, f) for f in names]
    bad = [f for f in names if f not in FILE_TYPES]
    if bad or not names:
        raise ValueError(f"--formats: a GGUF's are the file types {', '.join(FILE_TYPES)}, got {formats!r}")
    row = describe_gguf(model)
    if row["error"]:
        raise ValueError(f"{model}: {row['error']}")
    stored = set(row["tensor_types"])
    if not stored <= {"F32", "F16", "BF16"}:
        raise ValueError(f"--formats: {model} must be an F32 or F16 file (its matrices are "
                         f"{', '.join(sorted(stored))}); quantizing a quantized file loses quality twice")
    out = []
    for f in names:
        print(f"  writing {model.stem} as {f}", file=sys.stderr)
        out.append(Source(requantize(model, f, scratch / f"{model.stem}-{f}.gguf")))
    return out
