"""Record what llama.cpp's own `llama-embedding` makes of the tiny encoder GGUFs (tests/golden/converted/, written
by convert_tiny_encoders.py) for the inputs of pooling_cases.py: pooling_llamacpp.json.

Standard library only; run with any Python from the repository root, after building the tool in llama.cpp's
build folder (LLAMA_CPP, default /work/llama/llama.cpp):

    cmake --build $LLAMA_CPP/build --target llama-embedding -j2
    python3 tests/golden/make_golden_llamacpp.py [--llama-cpp DIR]

Each run's exact command line is stored beside its outputs (`command`: the binary as
$LLAMA_CPP/build/bin/llama-embedding, PROMPT standing for each case's `prompt`). One call per prompt (a
prompt llama.cpp fails on then fails alone: its case holds `error` instead of the output), one thread
(-t 1); --verbose-prompt prints the ids llama.cpp tokenized, stored as `input_ids`.

  embedding runs  tiny-bert.f32, tiny-bert.f16, tiny-bert-cls.f32 with the GGUF's own pooling (mean, cls),
                  with --embd-normalize -1 (the pooled vector as it is) and with the default (2, L2); for
                  tiny-bert.f32 also with -fa off (flash attention, on by default on the CPU, rounds K and V
                  to float16). The texts, then each pair as one text "A[SEP]B" (llama.cpp has no pair input
                  for embeddings; "[SEP]" is parsed as the special token: [CLS] A [SEP] B [SEP]).
                  tiny-nomic-bert.f32 and .f16 (mean pooling, rotary, SwiGLU) the same way, --embd-normalize -1,
                  with -fa off, and the f32 by default too.
  rank runs       tiny-bert-reranker.f32 with --pooling rank and "query\tdocument" prompts (llama-embedding
                  puts the EOS text, [SEP], between them), --embd-normalize -1, by default and with -fa off.
                  tiny-xlmr-reranker.f32 the same (its </s> EOS and </s> SEP between them: <s> A </s></s> B
                  </s>). Only the first number of each output row is the score: llama.cpp keeps one number per
                  sequence and llama-embedding reads n_embd (32) from there, the rest being whatever memory
                  follows; the default normalization (L2 over that row) therefore prints scores of about 0.
  tokenize run    tiny-xlmr-reranker.f32, -fa off, --pooling rank, each of pooling_cases.UNIGRAM_TEXTS and
                  EMBED_TEXTS as one prompt: the ids llama.cpp's SentencePiece Unigram tokenizer gives (and the
                  score of the text alone).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pooling_cases import EMBED_PAIRS, EMBED_TEXTS, RERANK_DOCUMENTS, RERANK_QUERY, UNIGRAM_TEXTS  # noqa: E402

GOLDEN_DIR = Path(__file__).resolve().parent
ROOT = GOLDEN_DIR.parent.parent
COMMON = ["-t", "1", "--embd-output-format", "array", "--verbose-prompt"]
TOKEN_LINE = re.compile(r"^\s*(\d+) -> '")
ROW_LINE = re.compile(r"^\[\[[^\[\]]*\]\]$")


def run(binary: Path, gguf: Path, prompt: str, extra: list[str], tries: int = 5) -> dict[str, Any]:
    """One llama-embedding call on one prompt: its ids and output row, or how it failed.

    llama.cpp logs through a background thread, and now and then (a few calls in a hundred here) the process
    exits before the last lines reach stdout: a call whose output is cut short is made again."""
    args = ["-m", str(gguf.relative_to(ROOT)), *COMMON, *extra, "-p", prompt]
    for _ in range(tries):
        proc = subprocess.run([str(binary), *args], cwd=ROOT, capture_output=True, text=True)
        ids = [int(m.group(1)) for line in proc.stdout.splitlines() if (m := TOKEN_LINE.match(line))]
        if proc.returncode != 0:
            why = [line.split(": ", 1)[-1] for line in proc.stderr.splitlines()
                   if "GGML_ASSERT" in line or "error" in line]
            return {"input_ids": ids, "error": f"exit {proc.returncode}: " + " | ".join(why)}
        rows = [line.strip() for line in proc.stdout.splitlines() if ROW_LINE.match(line.strip())]
        if len(rows) == 1 and ids:
            # Not json.loads: the unwritten part of a rank row may print as nan or inf.
            return {"input_ids": ids, "row": [float(v) for v in rows[0].strip("[]").split(",")]}
    raise SystemExit(f"{gguf.name}: no complete output for {prompt!r} in {tries} tries; the last:\n{proc.stdout}")


def command(gguf: str, extra: list[str]) -> str:
    return shlex.join(["$LLAMA_CPP/build/bin/llama-embedding", "-m", f"tests/golden/converted/{gguf}", *COMMON, *extra,
                       "-p", "PROMPT"])


# (GGUF, normalization, flash attention): "auto" is llama.cpp's default, on here on the CPU, and it rounds K and V
# to float16 (differences of ~1e-3 from float32); "off" leaves only ggml's float16 GELU table (~1e-5).
EMBEDDING_RUNS = (("tiny-bert.f32.gguf", "none", "auto"), ("tiny-bert.f32.gguf", "l2", "auto"),
                  ("tiny-bert.f32.gguf", "none", "off"),
                  ("tiny-bert.f16.gguf", "none", "auto"), ("tiny-bert.f16.gguf", "l2", "auto"),
                  ("tiny-bert-cls.f32.gguf", "none", "auto"), ("tiny-bert-cls.f32.gguf", "l2", "auto"),
                  ("tiny-nomic-bert.f32.gguf", "none", "off"), ("tiny-nomic-bert.f32.gguf", "none", "auto"),
                  ("tiny-nomic-bert.f16.gguf", "none", "off"))
RANK_RUNS = (("tiny-bert-reranker.f32.gguf", "auto"), ("tiny-bert-reranker.f32.gguf", "off"),
             ("tiny-xlmr-reranker.f32.gguf", "auto"), ("tiny-xlmr-reranker.f32.gguf", "off"))
TOKENIZE_GGUF = "tiny-xlmr-reranker.f32.gguf"


def flags(normalize: str, flash_attn: str) -> list[str]:
    fa = ["-fa", "off"] if flash_attn == "off" else []
    return [*fa, *(["--embd-normalize", "-1"] if normalize == "none" else [])]


def embedding_runs(binary: Path, gguf_dir: Path) -> list[dict[str, Any]]:
    prompts = [*EMBED_TEXTS, *(f"{a}[SEP]{b}" for a, b in EMBED_PAIRS)]
    kinds = ["text"] * len(EMBED_TEXTS) + ["pair"] * len(EMBED_PAIRS)
    runs = []
    for name, normalize, flash_attn in EMBEDDING_RUNS:
        extra = flags(normalize, flash_attn)
        cases = []
        for kind, prompt in zip(kinds, prompts):
            got = run(binary, gguf_dir / name, prompt, extra)
            if "row" in got:
                got["embedding"] = got.pop("row")
            cases.append({"kind": kind, "prompt": prompt, **got})
        runs.append({"gguf": name, "kind": "embedding", "normalize": normalize, "flash_attn": flash_attn,
                     "command": command(name, extra), "cases": cases})
    return runs


def rank_runs(binary: Path, gguf_dir: Path) -> list[dict[str, Any]]:
    runs = []
    for name, flash_attn in RANK_RUNS:
        extra = ["--pooling", "rank", *flags("none", flash_attn)]
        cases = []
        for doc in RERANK_DOCUMENTS:
            got = run(binary, gguf_dir / name, f"{RERANK_QUERY}\t{doc}", extra)
            if "row" in got:
                got["score"] = got.pop("row")[0]   # the rest of the row is not written by llama.cpp
            cases.append({"query": RERANK_QUERY, "document": doc, "prompt": f"{RERANK_QUERY}\t{doc}", **got})
        runs.append({"gguf": name, "kind": "rank", "normalize": "none", "flash_attn": flash_attn,
                     "command": command(name, extra), "cases": cases})
    return runs


def tokenize_run(binary: Path, gguf_dir: Path) -> dict[str, Any]:
    extra = ["--pooling", "rank", *flags("none", "off")]
    cases = []
    for text in (*UNIGRAM_TEXTS, *EMBED_TEXTS):
        got = run(binary, gguf_dir / TOKENIZE_GGUF, text, extra)
        if "row" in got:
            got["score"] = got.pop("row")[0]
        cases.append({"prompt": text, **got})
    return {"gguf": TOKENIZE_GGUF, "kind": "tokenize", "normalize": "none", "flash_attn": "off",
            "command": command(TOKENIZE_GGUF, extra), "cases": cases}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-cpp", type=Path, default=Path(os.environ.get("LLAMA_CPP", "/work/llama/llama.cpp")))
    parser.add_argument("--gguf-dir", type=Path, default=GOLDEN_DIR / "converted")
    parser.add_argument("--out", type=Path, default=GOLDEN_DIR / "pooling_llamacpp.json")
    args = parser.parse_args(argv)
    binary = args.llama_cpp / "build" / "bin" / "llama-embedding"
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True)
    gguf_dir = args.gguf_dir.resolve()
    runs = [*embedding_runs(binary, gguf_dir), *rank_runs(binary, gguf_dir), tokenize_run(binary, gguf_dir)]
    info = {"llama_cpp": " ".join((version.stdout + version.stderr).split()), "runs": []}
    head = json.dumps(info, ensure_ascii=False, indent=1)
    body = []
    for r in runs:   # one key per line, one case per line
        cases = ",\n".join("    " + json.dumps(c, ensure_ascii=False) for c in r["cases"])
        meta = ", ".join(f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in r.items() if k != "cases")
        body.append("  {" + meta + ',\n   "cases": [\n' + cases + "\n   ]}")
    args.out.write_text(head[: head.rindex("[]")] + "[\n" + ",\n".join(body) + "\n ]\n}\n", encoding="utf-8")
    print(f"{args.out}: {len(runs)} runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
