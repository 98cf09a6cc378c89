"""nvllm models pull | list | synthesize | quantize | export | import | keygen | sign | reload: the models the registry
knows and models of the Hugging Face Hub (model_files/hub.py), fetched into and listed from a folder;
random-weight GGUFs of real models' shapes, for benchmarks without downloads; a GGUF written again in another
file type, as llama.cpp's quantize tool writes it; and models carried to offline boards in bundles, checked and
optionally signed (cli/bundles.py); and a new version of a model put in service by a running daemon
(cli/model_reload.py)."""

from __future__ import annotations

import argparse
import json
import sys

from nvllm.cli.bundles import BUNDLE_ACTIONS, add_bundle_parsers, cmd_bundles
from nvllm.cli.model_reload import add_reload_parser, cmd_reload
from nvllm.config import DEFAULT_MODEL


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    m = sub.add_parser("models", help="pull, list, synthesize, quantize, export or import models")
    msub = m.add_subparsers(dest="action", required=True)
    mp = msub.add_parser("pull", help="fetch a known model, or a model of the Hugging Face Hub, into DIR",
                         description="A known model's GGUF (the folder too with --folder), or a model of the "
                                     "Hugging Face Hub: ORG/REPO (its folder of safetensors, config and tokenizer "
                                     "files, as DIR/REPO), ORG/REPO:QUANT or ORG/REPO/FILE.gguf (one GGUF, as "
                                     "DIR/FILE.gguf; QUANT picks it by name as llama-server's -hf does, Q4_K_M "
                                     "when none is given), or Ollama's hf.co/ORG/REPO:QUANT. Every file is checked "
                                     "against the Hub's sha256; a cut pull resumes when run again. HF_ENDPOINT "
                                     "names a mirror, HF_TOKEN a token for gated models.")
    mp.add_argument("name", help=f"a known model ({DEFAULT_MODEL}, whisper-tiny.en) or a Hub reference")
    mp.add_argument("--dir", default="models")
    mp.add_argument("--revision", default=None, help="a Hub repository's branch, tag or commit (default main)")
    mp.add_argument("--quiet", action="store_true", help="no progress on stderr")
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
    add_reload_parser(msub)
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
    if args.action == "reload":
        return cmd_reload(args)
    if args.action == "synthesize":
        return cmd_synthesize(args)
    if args.action == "quantize":
        return cmd_quantize(args)
    if args.action == "pull":
        if args.name not in registry.KNOWN_MODELS:
            return cmd_pull_hub(args)
        if args.revision is not None:
            print("nvllm models pull: --revision is for Hub references (ORG/REPO...)", file=sys.stderr)
            return 2
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


def cmd_pull_hub(args: argparse.Namespace) -> int:
    """`nvllm models pull ORG/REPO[:QUANT]`: the path on stdout; progress (a bar on a terminal) and errors, one
    line each, on stderr."""
    from nvllm.model_files import hub, registry

    ref = hub.parse_ref(args.name)
    if ref is None:
        print(f"nvllm models pull: unknown model {args.name!r}; known models: {', '.join(registry.KNOWN_MODELS)}; "
              "or a Hugging Face Hub reference: ORG/REPO, ORG/REPO:QUANT, ORG/REPO/FILE.gguf", file=sys.stderr)
        return 1
    if args.folder:
        print("nvllm models pull: --folder is for the known models; a Hub folder is pulled as ORG/REPO",
              file=sys.stderr)
        return 2
    try:
        pulled = hub.pull_from_hub(ref, args.dir, None if args.quiet else _StatusLines(),
                                   revision=args.revision, show_bar=not args.quiet)
    except hub.HubError as e:
        print(f"nvllm models pull: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("nvllm models pull: interrupted; run it again to resume", file=sys.stderr)
        return 130
    print(pulled.path)
    return 0


class _StatusLines:
    """Each new status of a pull as a line on stderr; on a terminal, a file's is its progress bar's."""

    def __init__(self) -> None:
        self.last = ""
        self.tty = sys.stderr.isatty()

    def __call__(self, event: dict) -> None:
        status = event.get("status", "")
        if status != self.last and not (self.tty and "completed" in event):
            self.last = status
            total = event.get("total") or 0
            size = f" ({total / 1e6:.1f} MB)" if total >= 100_000 else f" ({total / 1e3:.1f} kB)" if total else ""
            print(f"nvllm pull: {status}{size}", file=sys.stderr, flush=True)


def _list_value(v: object) -> str:
    """A `models list` value on one line: a GGUF's tensor types as Q4_1:210,F32:61."""
    if isinstance(v, dict):
        return ",".join(f"{k}:{n}" for k, n in v.items())
    return str(v)
