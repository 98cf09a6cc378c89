"""`nvllm bench --quality`: what a model's arithmetic costs against a float reference, reported as llama.cpp's
`llama-perplexity --kl-divergence` reports it, and what a user then sees of it.

The reference is a model's float path (model.activations "float": its weights decoded, x never rounded):
the model's own, or that of --reference (an F16/F32 source, a float32 folder) where one is given. Each row
is one model (a file, or a folder quantized at load) in one activation mode. All rows read the same held
text in lockstep, a chunk at a time, each through a KV cache of its engine's format, and give over every
predicted position:
  ppl        exp(mean negative log-likelihood of the text's next token), and its change against the reference's
  KL         KL(reference || row) of the next-token distribution in nats: mean, median, 99th percentile, maximum
  same top   the share of positions whose most likely next token is the reference's
Then every row answers the chat prompts (bench/chat_prompts.py) greedily, ANSWER_TOKENS tokens at most,
batched on its engine (a request's greedy tokens do not depend on its batch):
  greedy =   the share of answers whose tokens equal the reference's
  first =    the share whose first token does (where a near-tie flips, the whole answer goes another way)

The text is "Execution model" from Python's reference manual as this Python ships it (pydoc_data.topics,
what `help("execmodel")` prints: plain English prose, about 2k tokens); its SHA-256 is in the result, since
another Python may ship a revised text. On random-weight files (`nvllm models synthesize`) the figures
check the arithmetic, not the language: their text is noise to them.

The activation mode is the process's (kernels/matmul.set_activations, read at every product), so one
loaded model serves every mode: each row sets its own before each of its calls.
"""

from __future__ import annotations

import hashlib
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nvllm.bench.chat_prompts import PROMPTS
from nvllm.config import load_settings
from nvllm.engine.assembly.factory import build_engine
from nvllm.engine.llm_engine import LLMEngine
from nvllm.model.decoder import ForwardBatch, Model
from nvllm.model.kernels import matmul
from nvllm.sampling_params import SamplingParams

TEXT_TOPIC = "execmodel"
ANSWER_TOKENS = 16
CHUNK = 128          # text tokens per forward call
BLOCK = 16           # KV page size
MAX_PROMPT = 240     # a chat prompt's tokens at most (the template's own included)


@dataclass(frozen=True)
class Source:
    """A model as loaded: its path, and for a folder the format it is quantized to at load ("" as stored)."""
    path: Path
    quantization: str = ""

    @property
    def label(self) -> str:
        return self.path.name + (f" as {self.quantization}" if self.quantization else "")


@dataclass
class Row:
    source: Source
    activations: str
    label: str = ""
    nll: list[np.ndarray] = field(default_factory=list)   # per chunk, each predicted position's
    kl: list[np.ndarray] = field(default_factory=list)
    same_top: list[np.ndarray] = field(default_factory=list)
    answers: list[list[int]] = field(default_factory=list)
    answer_text: str = ""   # the first prompt's answer
    seconds: float = 0.0

    def __post_init__(self) -> None:
        self.label = self.label or f"{self.source.label}, x {self.activations}"


def read_text() -> tuple[str, str]:
    """The held text and its SHA-256's first 16 hex digits."""
    from pydoc_data.topics import topics

    text = topics[TEXT_TOPIC]
    return text, hashlib.sha256(text.encode()).hexdigest()[:16]


def _engine(source: Source, threads: int, prompts: int) -> LLMEngine:
    """An engine for the prompts at once: max_model_len MAX_PROMPT + ANSWER_TOKENS, and pages for about
    half of that each (greedy tokens do not change when a sequence is preempted and recomputed)."""
    max_len = MAX_PROMPT + ANSWER_TOKENS
    settings = load_settings(overrides={
        "model": {"path": str(source.path), "quantization": source.quantization or None, "threads": threads},
        "cache": {"block_size": BLOCK, "num_blocks": prompts * max_len // BLOCK // 2 + max_len // BLOCK + 1,
                  "enable_prefix_caching": False},
        "scheduler": {"max_num_seqs": prompts, "max_model_len": max_len,
                      "max_num_batched_tokens": max(512, max_len)}})
    engine = build_engine(settings)
    if not isinstance(engine.model, Model) or engine.task != "generate":
        raise ValueError(f"{source.path}: not a model that generates text")
    return engine


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=1, keepdims=True))
    return x


class TextReader:
    """One model reading the text a chunk at a time through its own KV cache (one sequence)."""

    def __init__(self, engine: LLMEngine, num_tokens: int) -> None:
        assert isinstance(engine.model, Model)
        self.model = engine.model
        pages = -(-num_tokens // BLOCK)
        self.cache = self.model.make_kv_cache(pages + 1, BLOCK, engine.kv_cache.format)
        self.table = np.arange(pages, dtype=np.int32)[None, :]

    def log_probs(self, ids: np.ndarray, start: int, stop: int, activations: str) -> np.ndarray:
        """Log-probabilities [stop - start, V] of the next token after each of positions start .. stop - 1,
        the earlier ones already in the cache."""
        matmul.set_activations(activations)
        pos = np.arange(start, stop)
        fb = ForwardBatch.build(ids[start:stop], pos, pos, np.array([stop - start]), np.array([stop]), self.table,
                                np.arange(stop - start))
        return _log_softmax(self.model.forward(fb, self.cache))


def _read_text(rows: list[Row], ref: Row, readers: dict[tuple[Source, str], TextReader], ids: np.ndarray,
               progress: bool) -> None:
    """Every row's per-position figures against the reference's, the rows in lockstep a chunk at a time."""
    targets = ids[1:]
    for start in range(0, len(ids) - 1, CHUNK):
        stop = min(len(ids) - 1, start + CHUNK)   # the last token is only ever a target
        t = targets[start:stop]
        base = readers[ref.source, ref.activations].log_probs(ids, start, stop, ref.activations)
        p = np.exp(base)
        ref.nll.append(-base[np.arange(len(t)), t])
        base_top = base.argmax(axis=1)
        for row in rows:
            t0 = time.perf_counter()
            logp = readers[row.source, row.activations].log_probs(ids, start, stop, row.activations)
            row.seconds += time.perf_counter() - t0
            row.nll.append(-logp[np.arange(len(t)), t])
            row.kl.append(np.maximum(np.sum(p * (base - logp), axis=1), 0.0))
            row.same_top.append(logp.argmax(axis=1) == base_top)
        if progress:
            print(f"\r  text: {stop}/{len(ids) - 1} tokens", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)


def _answer(row: Row, engine: LLMEngine, prompts: tuple[str, ...]) -> None:
    """The row's greedy answers to every prompt, all in one batch."""
    matmul.set_activations(row.activations)
    params = SamplingParams(temperature=0, max_tokens=ANSWER_TOKENS)
    tag = f"quality-{row.activations}-{time.monotonic_ns()}"
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", {"messages": [{"role": "user", "content": prompt}]}, params)
    tokens: dict[str, list[int]] = {}
    text = ""
    t0 = time.perf_counter()
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.token_ids)
            if out.request_id == f"{tag}-0":
                text += out.text
    row.seconds += time.perf_counter() - t0
    row.answers = [tokens.get(f"{tag}-{i}", []) for i in range(len(prompts))]
    row.answer_text = text


def bench_quality(model: Source, reference: Source | None = None, activations: tuple[str, ...] = ("exact", "int8"),
                  sources: list[Source] | None = None, threads: int = 0, max_tokens: int = 0,
                  prompts: tuple[str, ...] = PROMPTS, progress: bool = True) -> dict[str, Any]:
    """The figures of each source (default: the model alone) in each activation mode against the reference
    (default: the model) in "float". max_tokens: read only the text's first N tokens (0: all of it)."""
    sources = sources or [model]
    reference = reference or model
    ref = Row(reference, "float")
    rows = [Row(s, a) for s in sources for a in activations if not (s == reference and a == "float")]
    engines: dict[Source, LLMEngine] = {}
    for s in dict.fromkeys([reference, *sources]):
        if progress:
            print(f"  loading {s.label}", file=sys.stderr)
        engines[s] = _engine(s, threads, len(prompts))
    vocab = {s: e.model.config.vocab_size for s, e in engines.items()}
    if len(set(vocab.values())) > 1:
        raise ValueError("the models do not share one vocabulary: " +
                         ", ".join(f"{s.label} {v}" for s, v in vocab.items()))
    text, digest = read_text()
    tokenizer = engines[reference].tokenizer
    ids = np.array(tokenizer.encode(text, add_special_tokens=False), dtype=np.int64)
    for s, e in engines.items():
        if e.tokenizer.encode(text, add_special_tokens=False) != ids.tolist():
            raise ValueError(f"{s.label} does not tokenize the text as {reference.label} does")
    if max_tokens:
        ids = ids[:max_tokens]
    readers = {(r.source, r.activations): TextReader(engines[r.source], len(ids)) for r in (ref, *rows)}
    _read_text(rows, ref, readers, ids, progress)
    del readers
    for row in (ref, *rows):
        if progress:
            print(f"  answering {len(prompts)} prompts: {row.label}", file=sys.stderr)
        _answer(row, engines[row.source], prompts)
    return _result(ref, rows, prompts, len(ids), digest, threads)


def _result(ref: Row, rows: list[Row], prompts: tuple[str, ...], tokens: int, digest: str,
            threads: int) -> dict[str, Any]:
    ref_ppl = math.exp(float(np.concatenate(ref.nll).mean()))
    out = []
    for row in rows:
        kl = np.concatenate(row.kl)
        ppl = math.exp(float(np.concatenate(row.nll).mean()))
        out.append({
            "label": row.label, "model": str(row.source.path), "quantization": row.source.quantization,
            "activations": row.activations, "ppl": ppl, "ppl_change": ppl / ref_ppl - 1,
            "kl_mean": float(kl.mean()), "kl_median": float(np.median(kl)),
            "kl_p99": float(np.percentile(kl, 99)), "kl_max": float(kl.max()),
            "same_top": float(np.concatenate(row.same_top).mean()),
            "greedy_equal": float(np.mean([a == b for a, b in zip(row.answers, ref.answers)])),
            "first_equal": float(np.mean([a[:1] == b[:1] for a, b in zip(row.answers, ref.answers)])),
            "differing_prompts": [i for i, (a, b) in enumerate(zip(row.answers, ref.answers)) if a != b],
            "first_answer": row.answer_text, "seconds": row.seconds})
    return {"reference": {"label": ref.label, "model": str(ref.source.path), "ppl": ref_ppl,
                          "first_answer": ref.answer_text},
            "text": {"topic": TEXT_TOPIC, "python": sys.version.split()[0], "sha256": digest, "tokens": tokens},
            "prompts": len(prompts), "answer_tokens": ANSWER_TOKENS, "first_prompt": prompts[0],
            "threads": threads, "rows": out}


def format_quality(result: dict[str, Any]) -> str:
    ref, text = result["reference"], result["text"]
    lines = [f"reference: {ref['label']}, ppl {ref['ppl']:.4f} over {text['tokens'] - 1} predicted tokens of "
             f"pydoc_data.topics[{text['topic']!r}] (Python {text['python']}, sha256 {text['sha256']}...); "
             f"{result['prompts']} chat prompts answered greedily, {result['answer_tokens']} tokens at most",
             f"{'row':40} {'ppl':>9} {'vs ref':>8} {'KL mean':>9} {'KL med':>9} {'KL p99':>9} {'KL max':>8} "
             f"{'same top':>8} {'greedy =':>8} {'first =':>8}"]
    for r in result["rows"]:
        lines.append(f"{r['label'][:40]:40} {r['ppl']:9.4f} {r['ppl_change']:+8.3%} {r['kl_mean']:9.6f} "
                     f"{r['kl_median']:9.6f} {r['kl_p99']:9.5f} {r['kl_max']:8.4f} {r['same_top']:8.2%} "
                     f"{r['greedy_equal']:8.2%} {r['first_equal']:8.2%}")
    lines.append(f"{result['first_prompt']!r} answered, {result['answer_tokens']} tokens at most:")
    lines.append(f"  {ref['label']}: {ref['first_answer']!r}")
    lines += [f"  {r['label']}: {r['first_answer']!r}" for r in result["rows"]]
    return "\n".join(lines)
