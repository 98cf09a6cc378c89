"""What quantizing the weights costs: perplexity and agreement with the float32 model, per format.

    .venv/bin/python tools/quality.py                      # SmolLM2 folder and GGUF under models/
    .venv/bin/python tools/quality.py --formats q8_0,q4_k --tokens 1024
    .venv/bin/python tools/quality.py --formats '' --gguf '' --kv-cache-dtypes f16,bf16,q8_0   # the KV pool's

How a GGUF's activation modes (exact, int8) score against its float path, with KL percentiles and greedy
chat answers: `nvllm bench --quality --model FILE.gguf` (bench/quality.py), which this tool leaves to it.

Offline and deterministic. For each format, every 2-D tensor of the float32 folder (the projections and
the tied embedding) is quantized with nvllm's quantizers (model/quant/quantize.py, llama.cpp's reference
arithmetic) and decoded back to float32 (model/quant/dequantize.py), written to a scratch folder and loaded by
nvllm's own loader; the shipped GGUF is loaded as nvllm serves it. A format written "PROJ/EMBED"
quantizes the embedding to EMBED instead (the shipped GGUF keeps its embedding at Q8_0). A matrix whose
rows are not a whole number of the format's blocks falls back as quantize_weight does (q4_k -> q8_0).

Each model reads the same text through Model.forward, a chunk at a time through the paged KV cache, and
the table gives, over every position but the first:
  ppl       the perplexity of the text, exp(mean negative log-likelihood of each next token)
  top-1 =   the share of positions whose most likely next token is the float32 model's
  KL        the mean KL divergence from the float32 model's next-token distribution, in nats
  next ok   the share of positions whose most likely next token is the text's
  MB        the bytes of the 2-D weights in the format (what would be resident)
  stored as the formats the 2-D tensors ended in, with counts (after any fallback)

The text is "Execution model" from the Python reference manual as this Python ships it
(pydoc_data.topics, the text `help("execmodel")` prints): plain English prose, about 2k tokens. Its
SHA-256 is printed, since another Python version may ship a revised text.

--kv-cache-dtypes FORMATS scores the KV pool's formats (cache.dtype) instead: the float32 folder (or, with
--folder '', the GGUF) reads the text once with its pool in f32, the reference, and once per format.
"""
from __future__ import annotations

import argparse
import functools
import math
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "daemon"))

from nvllm.bench.quality import TEXT_TOPIC, read_text  # noqa: E402
from nvllm.config import load_settings  # noqa: E402
from nvllm.engine.assembly.factory import load_model  # noqa: E402
from nvllm.model.decoder import ForwardBatch, Model  # noqa: E402
from nvllm.model.quant.dequantize import dequantize  # noqa: E402
from nvllm.model.quant.quantize import KINDS, choose_format, quantize  # noqa: E402

DEFAULT_FOLDER = REPO / "models" / "smollm2-135m-instruct"
DEFAULT_GGUF = REPO / "models" / "smollm2-135m-instruct.gguf"
DEFAULT_FORMATS = "bf16,q8_0,q4_k,q4_0/q8_0,q4_0"
BLOCK = 16  # KV page size
CHUNK = 256  # tokens per forward call


@dataclass
class Scores:
    ppl: float
    agree: float
    kl: float
    next_ok: float
    mb: float
    seconds: float
    stored: str = ""  # the formats the 2-D tensors ended in, with their counts


def run_model(model: Model, ids: np.ndarray, chunk: int = CHUNK, kv: str = "f32") -> tuple[np.ndarray, np.ndarray]:
    """Log-probabilities [T-1, V] of each next token after positions 0..T-2 (float32), and the
    model's argmax there [T-1]: one sequence fed `chunk` tokens per forward through the KV cache,
    whose pages hold keys and values in KV format `kv`."""
    from nvllm.model.quant.kv_format import by_name

    t = len(ids)
    pages = -(-t // BLOCK)
    cache = model.make_kv_cache(pages + 1, BLOCK, by_name(kv))
    table = np.arange(pages, dtype=np.int32)[None, :]  # [1, pages]
    out = []
    for start in range(0, t - 1, chunk):
        stop = min(t - 1, start + chunk)  # the last token is only ever a target
        pos = np.arange(start, stop)
        fb = ForwardBatch.build(ids[start:stop], pos, pos, np.array([stop - start]), np.array([stop]), table,
                                np.arange(stop - start))
        logits = model.forward(fb, cache).astype(np.float64)  # [n, V]
        logits -= logits.max(axis=1, keepdims=True)
        logits -= np.log(np.exp(logits).sum(axis=1, keepdims=True))
        out.append(logits.astype(np.float32))
    logp = np.concatenate(out)
    return logp, logp.argmax(axis=1)


def score(logp: np.ndarray, top: np.ndarray, ids: np.ndarray, base: tuple[np.ndarray, np.ndarray] | None,
          mb: float, seconds: float) -> Scores:
    targets = ids[1:]
    nll = -logp[np.arange(len(targets)), targets].astype(np.float64)
    if base is None:
        agree, kl = 1.0, 0.0
    else:
        base_logp, base_top = base
        agree = float(np.mean(top == base_top))
        p = np.exp(base_logp.astype(np.float64))
        kl = float(np.mean(np.sum(p * (base_logp.astype(np.float64) - logp), axis=1)))
    return Scores(math.exp(nll.mean()), agree, kl, float(np.mean(top == targets)), mb, seconds)


def quantized_folder(src: Path, dst: Path, spec: str) -> tuple[float, Counter]:
    """The folder at src with every 2-D tensor quantized per spec ("q4_0" or "q4_0/q8_0": projections /
    embedding) and decoded back to float32, written to dst; returns the MB the formats would take and
    how many tensors each format got."""
    from safetensors.numpy import load_file, save_file

    proj, _, embed = spec.partition("/")
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, dst / f.name)
    nbytes = 0
    stored: Counter = Counter()
    for path in sorted(src.glob("*.safetensors")):
        tensors = load_file(path)
        for name, w in tensors.items():
            if w.ndim != 2:
                continue
            kind = embed if embed and "embed_tokens" in name else proj
            fmt, _ = choose_format(kind, w.shape[1])
            blocks = quantize(fmt, np.ascontiguousarray(w, dtype=np.float32))
            nbytes += blocks.nbytes
            stored[fmt.name] += 1
            tensors[name] = dequantize(fmt, blocks.reshape(-1), w.shape)
        save_file(tensors, str(dst / path.name))
    return nbytes / 1e6, stored


def weight_mb_f32(folder: Path) -> tuple[float, Counter]:
    from safetensors import safe_open

    shapes = []
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), "np") as f:
            shapes += [f.get_slice(name).get_shape() for name in f.keys()]
    matrices = [s for s in shapes if len(s) == 2]
    return sum(4 * int(np.prod(s)) for s in matrices) / 1e6, Counter({"F32": len(matrices)})


def gguf_mb(path: Path) -> tuple[float, Counter]:
    from nvllm.model.weights.gguf_file import read_gguf

    matrices = [(fmt.name, raw.nbytes) for fmt, raw, shape in read_gguf(path).tensors.values() if len(shape) == 2]
    return sum(n for _, n in matrices) / 1e6, Counter(name for name, _ in matrices)


def load(path: Path, quantization: str = "", activations: str = "exact") -> Model:
    from nvllm.model.kernels import matmul

    matmul.set_activations(activations)   # the engine's job; Model.forward alone is run here
    model = load_model(load_settings(overrides={"model": {"path": str(path), "quantization": quantization}})).model
    if not isinstance(model, Model):
        raise SystemExit(f"{path}: not a model that generates text")
    return model


def measure(name: str, make, ids: np.ndarray, base, size: tuple[float, Counter], chunk: int = CHUNK
            ) -> tuple[Scores, tuple[np.ndarray, np.ndarray]]:
    t0 = time.perf_counter()
    model = make()
    logp, top = run_model(model, ids, chunk)
    del model
    s = score(logp, top, ids, base, size[0], time.perf_counter() - t0)
    s.stored = ",".join(f"{k}:{n}" for k, n in size[1].most_common())
    print(f"  {name}: ppl {s.ppl:.4f} (loaded and read in {s.seconds:.0f} s)", file=sys.stderr)
    return s, (logp, top)


def check_spec(spec: str) -> None:
    for part in spec.split("/"):
        if part not in KINDS:
            raise SystemExit(f"quality.py: --formats: {part!r} is not one of {', '.join(KINDS)}")


def kv_formats(args: argparse.Namespace) -> int:
    """The --kv-cache-dtypes table: one model, its pool in f32 (the reference) and in each format."""
    from nvllm.model.quant.kv_format import NAMES
    from nvllm.model.weights.gguf_file import read_gguf
    from nvllm.text.tokenizer import Tokenizer

    kinds = [k for k in args.kv_cache_dtypes.split(",") if k]
    for k in kinds:
        if k not in NAMES:
            raise SystemExit(f"quality.py: --kv-cache-dtypes: {k!r} is not one of {', '.join(NAMES)}")
    has_folder = str(args.folder) not in ("", ".")
    path = args.folder if has_folder else args.gguf
    tok = (Tokenizer.from_dir(path) if has_folder
           else Tokenizer.from_gguf_metadata(read_gguf(path).metadata, str(path)))
    ids = np.array(tok.encode(read_text()[0], add_special_tokens=False), dtype=np.int64)
    if args.tokens:
        ids = ids[:args.tokens]
    model = load(path)
    print(f"{path.name}: {len(ids)} tokens; KV pool formats against f32", file=sys.stderr)
    base = run_model(model, ids)
    rows = [("f32", score(*base, ids, None, 0.0, 0.0))]
    for k in kinds:
        rows.append((k, score(*run_model(model, ids, kv=k), ids, base, 0.0, 0.0)))
    f32_ppl = rows[0][1].ppl
    print(f"{'KV format':10} {'ppl':>9} {'vs f32':>8} {'top-1 =':>8} {'KL':>8}")
    for name, s in rows:
        print(f"{name:10} {s.ppl:9.4f} {s.ppl / f32_ppl - 1:+8.3%} {s.agree:8.2%} {max(s.kl, 0.0):8.5f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", type=Path, default=DEFAULT_FOLDER, help="float32 Hugging Face folder")
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF, help="a GGUF of the same model ('' to skip)")
    ap.add_argument("--formats", default=DEFAULT_FORMATS,
                    help=f"comma-separated, each KIND or PROJ/EMBED of {', '.join(KINDS)} "
                         f"(default {DEFAULT_FORMATS})")
    ap.add_argument("--tokens", type=int, default=0, help="read only the first N tokens of the text")
    ap.add_argument("--through-loader", action="store_true",
                    help="load each format with model.quantization set instead of a re-quantized folder "
                         "(once the loader honours the setting; PROJ/EMBED is not possible then)")
    ap.add_argument("--kv-cache-dtypes", default="",
                    help="comma-separated KV pool formats (f16, bf16, q8_0) to score against an f32 pool")
    args = ap.parse_args(argv)
    if args.kv_cache_dtypes:
        return kv_formats(args)
    specs = [s for s in args.formats.split(",") if s]
    for spec in specs:
        check_spec(spec)

    from nvllm.text.tokenizer import Tokenizer

    if str(args.folder) in ("", "."):   # --folder '' arrives as Path(".")
        raise SystemExit("quality.py: --folder '' goes with --kv-cache-dtypes; a GGUF's activation modes against "
                         "its float path: nvllm bench --quality --model FILE.gguf")
    text, digest = read_text()
    tok = Tokenizer.from_dir(args.folder)
    ids = np.array(tok.encode(text, add_special_tokens=False), dtype=np.int64)
    if args.tokens:
        ids = ids[:args.tokens]
    print(f"text: pydoc_data.topics[{TEXT_TOPIC!r}] of Python {sys.version.split()[0]}, {len(text)} characters, "
          f"sha256 {digest}..., {len(ids)} tokens ({len(ids) - 1} predicted)", file=sys.stderr)

    rows: list[tuple[str, Scores]] = []
    s, base = measure("f32", lambda: load(args.folder), ids, None, weight_mb_f32(args.folder))
    rows.append(("f32 (folder)", s))
    for spec in specs:
        if args.through_loader:
            s, _ = measure(spec, functools.partial(load, args.folder, spec), ids, base, (float("nan"), Counter()))
        else:
            with tempfile.TemporaryDirectory(prefix="nvllm-quality-") as tmp:
                t0 = time.perf_counter()
                size = quantized_folder(args.folder, Path(tmp), spec)
                print(f"  {spec}: quantized in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
                s, _ = measure(spec, lambda: load(Path(tmp)), ids, base, size)
        rows.append((spec, s))
    if str(args.gguf) and args.gguf.is_file():
        s, _ = measure("gguf", lambda: load(args.gguf), ids, base, gguf_mb(args.gguf))
        rows.append((args.gguf.name, s))

    print(f"{'format':28} {'ppl':>9} {'top-1 =':>8} {'KL':>8} {'next ok':>8} {'MB':>7}  stored as")
    for name, s in rows:
        print(f"{name:28} {s.ppl:9.4f} {s.agree:8.2%} {max(s.kl, 0.0):8.4f} {s.next_ok:8.2%} {s.mb:7.1f}  {s.stored}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
