"""nvllm's embedding throughput beside llama.cpp's llama-embedding on the same GGUF, the same shape of work
(`inputs` inputs of `tokens` tokens, 2,048 tokens a batch) and the same thread count, alternating the two.

    .venv/bin/python tools/embed_side_by_side.py MODEL.gguf --llama-embedding PATH/TO/llama-embedding \\
        [--threads 2] [--repeats 3] [--inputs 64] [--tokens 128] [--json]

nvllm's side is `nvllm bench --embed --json --threads T` (in its own process: inputs of exactly `tokens` ids,
[CLS] ... [SEP] around random ordinary ids, one warm-up pass, then the best of 3 passes). llama.cpp's side is
llama-embedding on `inputs` lines of text, each of which nvllm's own tokenizer for the file makes exactly
`tokens` tokens; a first run with --verbose-prompt checks that llama.cpp tokenizes every line to the same ids
(so the work is the same to the token) and warms the file cache. Then each round runs llama-embedding 3 times
(-t T -b B -ub B, --pooling as the file's pooling_type says; it warms up with an empty run itself) and takes
the best, as the bench takes its best of 3: llama.cpp's figure is its own timing line, prompt eval time over
the tokens it reports (which must be inputs x tokens; the load, tokenizing and printing outside it are left
out), with the total-time figure beside it. Rounds alternate nvllm and llama.cpp `repeats` times, so a busy
neighbour slows both; each side's median over the rounds is printed with its range, and the ratio
(nvllm / llama.cpp, per round) with its range.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from nvllm.model.weights.gguf_file import open_gguf
from nvllm.text.tokenizer import Tokenizer

WORDS = ("the drone holds its position above the field while the operator asks how much battery is left a small "
         "language model answers on the board itself with no network in well under a second what is the capital "
         "of france paris lies on the river please summarise weather report light wind from west some rain in "
         "afternoon degrees quick brown fox jumps over lazy dog return list of waypoints as json once upon time "
         "there was robot who wanted to learn paint colours sky at sunset numbers system prompt tells assistant "
         "be brief answer english ask when unsure camera signal motor landing altitude compass checklist").split()
POOLING = {1: "mean", 2: "cls", 3: "last", 4: "rank"}
INNER = 3   # llama-embedding runs a round, the best taken (nvllm bench --embed takes its best of 3)
_PROMPT_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_TOTAL = re.compile(r"total time =\s*([\d.]+) ms")
_TOKEN_LINE = re.compile(r"^\s*(\d+) -> '", re.M)
_PROMPT_COUNT = re.compile(r"number of tokens in prompt = (\d+)")


def texts_of(tok: Tokenizer, inputs: int, tokens: int, seed: int = 0) -> list[str]:
    """`inputs` lines of words, each `tokens` tokens long by `tok` (its special tokens counted), all different."""
    rng = random.Random(seed)
    fillers = [w for w in [".", ",", "a", *WORDS] if len(tok.encode(w, add_special_tokens=False)) == 1]
    if not fillers:
        raise ValueError("no one-token word to fill a line with")
    lines = []
    for i in range(inputs):
        words = [f"line {i}"]
        n = len(tok.encode(" ".join(words)))
        while n < tokens:
            pool = WORDS if tokens - n > 4 else fillers
            for _ in range(50):
                cand = " ".join([*words, rng.choice(pool)])
                m = len(tok.encode(cand))
                if m <= tokens:
                    words, n = cand.split(" "), m
                    break
            else:
                raise ValueError(f"cannot make line {i} exactly {tokens} tokens long")
        if n != tokens:
            raise ValueError(f"line {i} is {n} tokens, not {tokens}")
        lines.append(" ".join(words))
    return lines


def llama_run(binary: str, model: str, prompts: Path, threads: int, batch: int, pooling: str,
              extra: tuple[str, ...] = ()) -> str:
    cmd = [binary, "-m", model, "-f", str(prompts), "-t", str(threads), "-b", str(batch), "-ub", str(batch),
           "--pooling", pooling, "--perf", "-lv", "4", "--embd-output-format", "array", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"llama-embedding failed ({r.returncode}): {r.stderr[-2000:]}")
    return r.stderr + r.stdout   # the timings are logged to stderr, --verbose-prompt's ids printed to stdout


def llama_figures(log: str, want_tokens: int) -> tuple[float, float]:
    """(prompt-eval tokens/s, total-time tokens/s) from llama.cpp's timing lines."""
    m = _PROMPT_EVAL.search(log)
    t = _TOTAL.search(log)
    if not m or not t:
        raise RuntimeError("llama-embedding printed no timing lines (prompt eval time, total time)")
    ms, n = float(m.group(1)), int(m.group(2))
    if n != want_tokens:
        raise RuntimeError(f"llama-embedding evaluated {n} tokens, expected {want_tokens}")
    return n / ms * 1e3, n / float(t.group(1)) * 1e3


def check_tokens(log: str, expected: list[list[int]]) -> None:
    """llama.cpp's ids for each prompt (--verbose-prompt) against nvllm's."""
    counts = [int(c) for c in _PROMPT_COUNT.findall(log)]
    ids = [int(i) for i in _TOKEN_LINE.findall(log)]
    got, at = [], 0
    for c in counts:
        got.append(ids[at:at + c])
        at += c
    if got != expected:
        bad = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
        raise RuntimeError(f"llama.cpp tokenizes prompt {bad} differently: {got[bad][:20] if bad < len(got) else None}"
                           f" vs nvllm's {expected[bad][:20] if bad < len(expected) else None}")


def nvllm_run(model: str, threads: int, inputs: int, tokens: int) -> dict[str, Any]:
    cmd = [sys.executable, "-c", "import sys; from nvllm.cli import main; sys.exit(main())", "bench", "--embed",
           "--json", "--model", model, "--threads", str(threads), "--inputs", str(inputs), "--prompt-len", str(tokens)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"nvllm bench failed ({r.returncode}): {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def spread(xs: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(xs), 2), "min": round(min(xs), 2), "max": round(max(xs), 2)}


def side_by_side(model: str, binary: str, threads: int, repeats: int, inputs: int, tokens: int,
                 batch: int) -> dict[str, Any]:
    f = open_gguf(model)
    try:
        meta = f.metadata
        tok = Tokenizer.from_gguf_metadata(meta, model)
        arch = meta["general.architecture"]
        kind = meta.get(f"{arch}.pooling_type")
    finally:
        f.close()
    if kind not in POOLING:
        raise ValueError(f"{model}: {arch}.pooling_type is {kind!r}, not an embedding model's pooling")
    texts = texts_of(tok, inputs, tokens)
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "prompts.txt"
        prompts.write_text("\n".join(texts))   # one prompt a line, no empty last line
        check_tokens(llama_run(binary, model, prompts, threads, batch, POOLING[kind], ("--verbose-prompt",)),
                     [tok.encode(t) for t in texts])
        rounds = []
        for _ in range(repeats):
            nv = nvllm_run(model, threads, inputs, tokens)
            runs = [llama_figures(llama_run(binary, model, prompts, threads, batch, POOLING[kind]), inputs * tokens)
                    for _ in range(INNER)]
            rounds.append({"nvllm": nv["tokens_per_s"], "nvllm_seconds": nv["seconds"],
                           "llama": max(r[0] for r in runs), "llama_runs": [round(r[0], 1) for r in runs],
                           "llama_total": max(r[1] for r in runs)})
    return {"model": model, "architecture": arch, "pooling": POOLING[kind], "threads": threads, "inputs": inputs,
            "tokens": tokens, "batch": batch, "rounds": rounds,
            "nvllm_tokens_per_s": spread([r["nvllm"] for r in rounds]),
            "llama_tokens_per_s": spread([r["llama"] for r in rounds]),
            "llama_total_tokens_per_s": spread([r["llama_total"] for r in rounds]),
            "ratio": spread([r["nvllm"] / r["llama"] for r in rounds])}


def format_result(r: dict[str, Any]) -> str:
    def line(name: str, s: dict[str, float]) -> str:
        return f"  {name:<34} {s['median']:>9.1f}  ({s['min']:.1f} to {s['max']:.1f})"
    return "\n".join([
        f"{r['model']} ({r['architecture']}, {r['pooling']} pooling): {r['inputs']} x {r['tokens']} tokens, "
        f"{r['threads']} threads, batch {r['batch']}, {len(r['rounds'])} rounds (median, range)",
        line("nvllm tokens/s", r["nvllm_tokens_per_s"]),
        line("llama-embedding tokens/s (eval)", r["llama_tokens_per_s"]),
        line("llama-embedding tokens/s (total)", r["llama_total_tokens_per_s"]),
        f"  {'ratio nvllm / llama.cpp':<34} {r['ratio']['median']:>9.2f}  "
        f"({r['ratio']['min']:.2f} to {r['ratio']['max']:.2f})"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("model", help="the GGUF embedding model")
    ap.add_argument("--llama-embedding", required=True, help="llama.cpp's llama-embedding binary")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="rounds, each nvllm then llama.cpp (default 3)")
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=128, help="tokens an input, its special tokens counted")
    ap.add_argument("--batch", type=int, default=2048, help="llama-embedding's -b and -ub (default 2048)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.inputs < 1 or args.tokens < 3 or args.threads < 1:
        ap.error("--repeats, --inputs and --threads must be at least 1, --tokens at least 3")
    try:
        r = side_by_side(args.model, args.llama_embedding, args.threads, args.repeats, args.inputs, args.tokens,
                         args.batch)
    except (OSError, RuntimeError, ValueError) as e:
        print(f"embed_side_by_side: {e}", file=sys.stderr)
        return 1
    print(json.dumps(r) if args.json else format_result(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
