"""nvllm models pull | list | synthesize | quantize | export | import | keygen | sign: the models the registry
knows, fetched into and listed from a folder; random-weight GGUFs of real models' shapes, for benchmarks
without downloads; a GGUF written again in another file type, as llama.cpp's quantize tool writes it; and
models carried to offline boards in bundles, checked and optionally signed (cli/bundles.py)."""

from __future__ import annotations

import argparse
import json
import sys

from nvllm.cli.bundles import BUNDLE_ACTIONS, add_bundle_parsers, cmd_bundles
from nvllm.config import DEFAULT_MODEL


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    m = sub.add_parser("models", help="pull, list, synthesize, quantize, export or import models")
    msub = m.add_subparsers(dest="action", required=True)
    mp = msub.add_parser("pull", help="fetch a known model's GGUF into DIR (the folder too with --folder)")
    mp.add_argument("name")
    mp.add_argument("--dir", default="models")
    mp.add_argument("--quiet", action="store_true")
    mp.add_argument("--folder", action="store_true",
                    help="also write the float32 Hugging Face folder DIR/NAME (538 MB for the default model, "
                         "for model.quantization and tools/quality.py); the GGUF DIR/NAME.gguf is always kept")
    ml = msub.add_parser("list", help="models in DIR")
    ml.add_argument("--dir", default="models")
    ml.add_argument("--json", action="store_true")
    ms = msub.add_parser("synthesize", help="write a random-weight GGUF of a real model's exact shape",
                         description="A random-weight GGUF of a real model's shape, with a working tokenizer, "
                                     "in the tensor types llama.cpp's quantize tool picks for --type: for speed "
                                     "and memory figures without downloading weights (its answers are noise).")
    ms.add_argument("shape", help="one of " + ", ".join(_shape_names()))
    ms.add_argument("--type", default="Q4_K_M",
                    help="F32, F16, Q8_0, Q5_0, Q4_K_M, Q3_K_M, Q2_K, IQ4_XS or IQ4_NL (default Q4_K_M)")
    ms.add_argument("--out", required=True, help="the GGUF file to write")
    ms.add_argument("--seed", type=int, default=0)
    ms.add_argument("--quiet", action="store_true")
    mq = msub.add_parser("quantize", help="write a GGUF again in another file type",
                         description="A GGUF written again in --type, each tensor in the type llama.cpp's "
                                     "quantize tool picks for it (from F16 or F32, its very bytes). From a "
                                     "quantized file the values are read back and quantized again, as "
                                     "llama-quantize --allow-requantize does: quality is lost twice.")
    mq.add_argument("src", help="the GGUF file to read")
    mq.add_argument("--type", required=True,
                    help="F32, F16, Q8_0, Q5_0, Q4_K_M, Q3_K_M, Q2_K, IQ4_XS or IQ4_NL")
    mq.add_argument("--out", required=True, help="the GGUF file to write")
    add_bundle_parsers(msub)
    m.set_defaults(func=cmd_models)


def _shape_names() -> list[str]:
    from nvllm.model_files.synthetic.shapes import SHAPES

    return list(SHAPES)


def cmd_quantize(args: argparse.Namespace) -> int:
    from pathlib import Path

    from nvllm.model_files.synthetic.mixture import FILE_TYPES
    from nvllm.model_files.synthetic.requantize import requantize

    if args.type not in FILE_TYPES:
        print(f"nvllm models quantize: --type must be one of {', '.join(FILE_TYPES)}, got {args.type!r}",
              file=sys.stderr)
        return 2
    if Path(args.out).resolve() == Path(args.src).resolve():
        print("nvllm models quantize: --out must not be the file being read", file=sys.stderr)
        return 2
    try:
        path = requantize(Path(args.src), args.type, Path(args.out))
    except OSError as e:
        print(f"nvllm models quantize: cannot write {args.out}: {e.strerror or e}", file=sys.stderr)
        return 1
    except ValueError as e:   # the loader's GGUFError, UnsupportedTensorType, ModelLoadError: each says what
        print(f"nvllm models quantize: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


def cmd_synthesize(args: argparse.Namespace) -> int:
    from pathlib import Path

    from nvllm.model_files.synthetic.mixture import FILE_TYPES
    from nvllm.model_files.synthetic.shapes import SHAPES
    from nvllm.model_files.synthetic.writer import synthesize

    if args.shape not in SHAPES:
        print(f"nvllm models synthesize: unknown shape {args.shape!r}; known: {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    if args.type not in FILE_TYPES:
        print(f"nvllm models synthesize: --type must be one of {', '.join(FILE_TYPES)}, got {args.type!r}",
              file=sys.stderr)
        return 2
    try:
        path = synthesize(SHAPES[args.shape], args.type, Path(args.out), args.seed, progress=not args.quiet)
    except OSError as e:
        print(f"nvllm models synthesize: cannot write {args.out}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(path)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from nvllm.model_files import listing, registry

    if args.action in BUNDLE_ACTIONS:
        return cmd_bundles(args)
    if args.action == "synthesize":
        return cmd_synthesize(args)
    if args.action == "quantize":
        return cmd_quantize(args)
    if args.action == "pull":
        try:
            path = registry.pull(args.name, args.dir, progress=not args.quiet, folder=args.folder)
        except registry.RegistryError as e:
            print(f"nvllm models pull: {e}", file=sys.stderr)
            return 1
        print(path)
        return 0
    models = listing.list_models(args.dir)
    if args.json:
        print(json.dumps(models, indent=2, default=str))
        return 0
    if not models:
        print(f"no models in {args.dir}; known: " + ", ".join(registry.KNOWN_MODELS)
              + f" (nvllm models pull {DEFAULT_MODEL})")
        return 0
    for m in models:
        print("  ".join(f"{k}={_list_value(v)}" for k, v in m.items()))
    return 0


def _list_value(v: object) -> str:
    """A `models list` value on one line: a GGUF's tensor types as Q4_1:210,F32:61."""
    if isinstance(v, dict):
        return ",".join(f"{k}:{n}" for k, n in v.items())
    return str(v)
