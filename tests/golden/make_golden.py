"""Write the golden reference files that nvllm's tests compare against, using transformers + torch.

nvllm never depends on torch or transformers: this script runs once, by hand, in a separate venv, and its
output (small safetensors and JSON files in tests/golden/) is committed. CI reads those files only.

How to run (from the repository root):

    python3 -m venv .refvenv
    .refvenv/bin/pip install torch==2.13.0            # CPU wheel; pin it, other versions are huge
    .refvenv/bin/pip install transformers numpy safetensors tokenizers jinja2
    python models/make_test_models.py --out models         # tiny-llama, tiny-qwen2, tiny-llama-f16, tiny-qwen3,
                                                           # tiny-phi3, tiny-smollm3, tiny-gemma3
    nvllm models pull                                      # models/smollm2-135m-instruct
    .refvenv/bin/python tests/golden/make_golden.py [--models-dir models] [--only NAME]

When to regenerate: whenever a model folder's bytes change (make_test_models.py or the pull's weight
conversion changed), when the prompts or cases change (golden_cases.py, beside this script), or when moving
to another transformers/torch version (tests/golden/README.md records the versions used). Running twice
gives byte-identical files (everything is seeded, torch runs on one thread); check with
`sha256sum tests/golden/*` before and after.

For each model folder NAME it writes:
  NAME.safetensors        prompt_ids [64] int64 and logits [64, V] float32 of the whole prompt run at once;
                          batch_<i>_ids / batch_<i>_logits for prompts of lengths 5, 17, 33, 64, each run
                          alone.
                          Large vocabularies (SmolLM2) store vocab_subset [2048] int64 and *_logits_subset
                          [T, 2048] instead: seeded random ids plus the top-16 ids of every stored position.
  NAME_greedy.json        greedy continuations (chat and raw prompts), with the smallest top-1/top-2 gap.
  tokenizer_NAME.json     encode and chat-template cases as transformers tokenizes them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import torch
import transformers
from golden_cases import (  # beside this script: run as one, its directory is on sys.path
    ALWAYS_KEEP,
    BATCH_LENGTHS,
    BATCH_TEXTS,
    CHAT_CASES,
    ENCODE_TEXTS,
    MAIN_TEXT,
    MAX_NEW_TOKENS,
    NEAR_TIE,
    PROMPT_LEN,
    SMOLLM2_GREEDY,
    SMOLLM2_GREEDY_MIN,
    TINY_GREEDY,
    TINY_GREEDY_PER_KIND,
)
from safetensors.numpy import save_file
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

MODEL_NAMES = ("tiny-llama", "tiny-qwen2", "tiny-llama-f16", "tiny-qwen3", "smollm2-135m-instruct", "tiny-phi3",
               "tiny-smollm3", "tiny-gemma3")
SUBSET_SIZE = 2048  # columns kept for vocabularies larger than FULL_VOCAB_LIMIT
SUBSET_TOP_K = 16
FULL_VOCAB_LIMIT = 8192
SEED = 1234
GOLDEN_DIR = Path(__file__).resolve().parent


def load(model_dir: Path) -> tuple[Any, Any]:
    """The reference model (float32, eager attention, CPU, eval) and its tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    model.to("cpu").eval()
    return model, tokenizer


@torch.no_grad()
def run_logits(model: Any, ids: np.ndarray) -> np.ndarray:
    """Logits for every position of one unpadded prompt: [T] -> [T, V] float32."""
    input_ids = torch.from_numpy(ids)[None, :]  # [T] -> [1, T]
    out = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
    return out.logits[0].to(torch.float32).numpy().copy()  # [1, T, V] -> [T, V]


def ordinary_ids(tokenizer: Any, vocab_size: int) -> np.ndarray:
    """Ids the tokenizer can produce from plain text: below vocab_size, not special, not added."""
    excluded = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder.keys())
    limit = min(vocab_size, len(tokenizer))
    return np.array([i for i in range(limit) if i not in excluded], dtype=np.int64)


def text_ids(tokenizer: Any, text: str, length: int) -> np.ndarray:
    """A real text tokenized as a raw prompt and truncated to `length` tokens."""
    ids = tokenizer(text)["input_ids"]
    if len(ids) < length:
        raise ValueError(f"text gives {len(ids)} tokens, need {length}: {text[:40]!r}")
    return np.array(ids[:length], dtype=np.int64)


def prompts_for(name: str, tokenizer: Any, vocab_size: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """The main prompt [64] and the batch prompts (lengths BATCH_LENGTHS)."""
    if name.startswith("smollm2"):
        main = text_ids(tokenizer, MAIN_TEXT, PROMPT_LEN)
        batch = [text_ids(tokenizer, t, n) for t, n in zip(BATCH_TEXTS, BATCH_LENGTHS)]
        return main, batch
    # Tiny random models: seeded random ids over the ordinary vocabulary exercise the whole embedding table.
    rng = np.random.default_rng(SEED)
    pool = ordinary_ids(tokenizer, vocab_size)
    main = rng.choice(pool, size=PROMPT_LEN).astype(np.int64)
    batch = [rng.choice(pool, size=n).astype(np.int64) for n in BATCH_LENGTHS]
    return main, batch


def top_ids(all_logits: list[np.ndarray]) -> set[int]:
    """The top-SUBSET_TOP_K ids of every position of every [T, V] array."""
    top: set[int] = set()
    for logits in all_logits:
        # [T, V] -> [T, K]: unordered top-k per row is enough for a set
        top.update(np.argpartition(-logits, SUBSET_TOP_K, axis=-1)[:, :SUBSET_TOP_K].ravel().tolist())
    return top


def vocab_subset(top: set[int], vocab_size: int) -> np.ndarray:
    """Sorted ids: the given top ids, filled up to SUBSET_SIZE with seeded random ids."""
    if len(top) > SUBSET_SIZE:
        raise ValueError(f"top-{SUBSET_TOP_K} union has {len(top)} ids, more than {SUBSET_SIZE}")
    rest = np.setdiff1d(np.arange(vocab_size, dtype=np.int64), np.array(sorted(top), dtype=np.int64))
    fill = np.random.default_rng(SEED).choice(rest, size=SUBSET_SIZE - len(top), replace=False)
    return np.sort(np.concatenate([np.array(sorted(top), dtype=np.int64), fill.astype(np.int64)]))


def folder_fingerprint(model_dir: Path) -> dict[str, str]:
    """sha256 of the folder's model files, so a test can tell that these goldens are stale."""
    names = sorted(p.name for p in model_dir.iterdir()
                   if p.suffix in (".json", ".safetensors") and not p.name.startswith("."))
    return {n: hashlib.sha256((model_dir / n).read_bytes()).hexdigest() for n in names}


def write_logits(
    name: str, fingerprint: dict[str, str], model: Any, tokenizer: Any, out_dir: Path
) -> dict[str, Any]:
    vocab_size = model.config.vocab_size
    main, batch = prompts_for(name, tokenizer, vocab_size)
    main_logits = run_logits(model, main)
    batch_logits = [run_logits(model, ids) for ids in batch]
    tensors: dict[str, np.ndarray] = {"prompt_ids": main}
    report: dict[str, Any] = {"max_abs_logit": float(np.abs(main_logits).max())}
    if vocab_size > FULL_VOCAB_LIMIT:
        top = top_ids([main_logits, *batch_logits])
        report["subset_top_ids"] = len(top)
        subset = vocab_subset(top, vocab_size)
        tensors["vocab_subset"] = subset
        tensors["logits_subset"] = np.ascontiguousarray(main_logits[:, subset])  # [T, V] -> [T, S]
        for i, (ids, logits) in enumerate(zip(batch, batch_logits)):
            tensors[f"batch_{i}_ids"] = ids
            tensors[f"batch_{i}_logits_subset"] = np.ascontiguousarray(logits[:, subset])  # [T, V] -> [T, S]
    else:
        tensors["logits"] = main_logits
        for i, (ids, logits) in enumerate(zip(batch, batch_logits)):
            tensors[f"batch_{i}_ids"] = ids
            tensors[f"batch_{i}_logits"] = logits
    info = {
        "model": name,
        "folder_sha256": fingerprint,
        "num_batch": len(batch),
        "vocab_size": vocab_size,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    # One metadata key: safetensors writes several keys in hash order, which would change the bytes per run.
    metadata = {"golden": json.dumps(info, sort_keys=True)}
    path = out_dir / f"{name}.safetensors"
    save_file(tensors, str(path), metadata=metadata)
    path.chmod(0o644)
    return report


def eos_ids(model: Any) -> list[int]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        return []
    return sorted({int(eos)} if isinstance(eos, int) else {int(e) for e in eos})


def chat_ids(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
    )
    return [int(i) for i in ids]


@torch.no_grad()
def greedy_case(model: Any, tokenizer: Any, name: str, kind: str, payload: Any) -> dict[str, Any]:
    if kind == "chat":
        prompt_ids = chat_ids(tokenizer, payload)
    else:
        prompt_ids = [int(i) for i in tokenizer(payload)["input_ids"]]
    input_ids = torch.tensor([prompt_ids], dtype=torch.long)
    eos = eos_ids(model)
    out = model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=MAX_NEW_TOKENS,
        pad_token_id=eos[0] if eos else None,
        return_dict_in_generate=True,
        output_scores=True,
        output_logits=True,
    )
    output_ids = [int(i) for i in out.sequences[0, len(prompt_ids):].tolist()]
    margins = []
    for step, (scores, raw) in enumerate(zip(out.scores, out.logits)):
        top2 = torch.topk(scores[0].float(), 2)
        if int(top2.indices[0]) != output_ids[step] or int(torch.argmax(raw[0])) != output_ids[step]:
            raise RuntimeError(f"{name}: step {step} is not the argmax of the raw logits (logits processor?)")
        margins.append(float(top2.values[0] - top2.values[1]))
    case: dict[str, Any] = {"name": name, "kind": kind}
    case["messages" if kind == "chat" else "prompt"] = payload
    case.update(
        prompt_ids=prompt_ids,
        output_ids=output_ids,
        output_text=tokenizer.decode(output_ids, skip_special_tokens=True),
        stopped_at_eos=bool(output_ids) and output_ids[-1] in eos,
        eos_token_ids=eos,
        min_margin=min(margins),
        margins=margins,
    )
    return case


def eos_then_margin(case: dict[str, Any]) -> tuple[bool, float]:
    """Sort key: cases that stop at EOS first (they test stopping), then the widest margins."""
    return (not case["stopped_at_eos"], -case["min_margin"])


def choose_cases(cases: list[dict[str, Any]], least: int, per_kind: int | None) -> list[dict[str, Any]]:
    """The cases to keep, in the order listed.

    Only cases with a clear greedy path (min_margin > NEAR_TIE) or in ALWAYS_KEEP count as clear. With
    per_kind, keep that many chat and that many raw cases, those stopping at EOS first, then the widest
    margins; without, keep every clear case. Top up with the widest margins if fewer than `least` are clear.
    """
    clear = [c for c in cases if c["min_margin"] > NEAR_TIE or c["name"] in ALWAYS_KEEP]
    if per_kind is not None:
        clear = [c for kind in ("chat", "raw")
                 for c in sorted((c for c in clear if c["kind"] == kind), key=eos_then_margin)[:per_kind]]
    unclear = sorted((c for c in cases if c not in clear), key=lambda c: -c["min_margin"])
    chosen = clear + unclear[: max(0, least - len(clear))]
    return [c for c in cases if c in chosen]


def crosses_original_context(model: Any, case: dict[str, Any]) -> bool:
    """A longrope case that grows past the original context: there transformers' Phi-3 drops its cache and
    recomputes every key with the long factors, which a paged cache does not do; such cases are left out."""
    original = getattr(model.config, "original_max_position_embeddings", None)
    if model.config.model_type != "phi3" or original is None:
        return False
    return len(case["prompt_ids"]) <= original < len(case["prompt_ids"]) + len(case["output_ids"])


def summary(case: dict[str, Any]) -> dict[str, Any]:
    return {"name": case["name"], "min_margin": case["min_margin"], "eos": case["stopped_at_eos"],
            "text": case["output_text"]}


def greedy_candidates(name: str) -> tuple[tuple[tuple[str, str, Any], ...], int, int | None]:
    """The candidate cases, the least number to keep, and how many of each kind (None: all clear ones)."""
    if name.startswith("smollm2"):
        return SMOLLM2_GREEDY, SMOLLM2_GREEDY_MIN, None
    return TINY_GREEDY, 2 * TINY_GREEDY_PER_KIND, TINY_GREEDY_PER_KIND


def write_greedy(name: str, model: Any, tokenizer: Any, out_dir: Path) -> dict[str, Any]:
    candidates, least, per_kind = greedy_candidates(name)
    cases = [greedy_case(model, tokenizer, *c) for c in candidates]
    cases = [c for c in cases if not crosses_original_context(model, c)]
    kept = choose_cases(cases, least, per_kind)
    path = out_dir / f"{name}_greedy.json"
    path.write_text(json.dumps(kept, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return {"kept": [summary(c) for c in kept], "dropped": [summary(c) for c in cases if c not in kept]}


def encode_texts(tokenizer: Any) -> list[str]:
    texts = list(ENCODE_TEXTS)
    # A special token's text inside ordinary text: the tokenizer splits it out as the special id.
    if tokenizer.eos_token:
        texts.append(f"before{tokenizer.eos_token}after")
    return texts


def tokenizer_json_disagreements(
    model_dir: Path, tokenizer: Any, greedy: tuple[tuple[str, str, Any], ...]
) -> list[str]:
    """Cases where transformers' tokenizer differs from tokenizer.json run by the tokenizers library alone.

    nvllm runs tokenizer.json as it is. Some transformers classes (e.g. Qwen2Tokenizer, GPT2Tokenizer in
    transformers 5) rebuild the normalizer and pre-tokenizer in code and ignore the file's; where the two
    differ, the folder's tokenizer.json and its model_type/tokenizer_class contradict each other.
    """
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    problems = []
    for text in encode_texts(tokenizer):
        ours, theirs = raw.encode(text).ids, [int(i) for i in tokenizer(text)["input_ids"]]
        if ours != theirs:
            problems.append(f"encode {text!r}: tokenizer.json {ours} != transformers {theirs}")
    chats = list(CHAT_CASES) + [(payload, True) for _, kind, payload in greedy if kind == "chat"]
    raws = [payload for _, kind, payload in greedy if kind == "raw"]
    for text in raws:
        ours, theirs = raw.encode(text).ids, [int(i) for i in tokenizer(text)["input_ids"]]
        if ours != theirs:
            problems.append(f"greedy prompt {text!r}: tokenizer.json {ours} != transformers {theirs}")
    for messages, add_generation_prompt in chats:
        rendered = tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False
        )
        ours = raw.encode(rendered, add_special_tokens=False).ids
        theirs = chat_ids(tokenizer, messages, add_generation_prompt)
        if ours != theirs:
            problems.append(f"chat {rendered!r}: tokenizer.json {ours} != transformers {theirs}")
    return problems


def write_tokenizer(name: str, tokenizer: Any, out_dir: Path) -> None:
    texts = encode_texts(tokenizer)
    encode = []
    for text in texts:
        ids = [int(i) for i in tokenizer(text)["input_ids"]]
        encode.append({"text": text, "ids": ids, "decoded": tokenizer.decode(ids, skip_special_tokens=True)})
    chat = []
    for messages, add_generation_prompt in CHAT_CASES:
        rendered = tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False
        )
        chat.append({
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "text": rendered,
            "ids": chat_ids(tokenizer, messages, add_generation_prompt),
        })
    doc = {"model": name, "encode": encode, "chat": chat}
    path = out_dir / f"tokenizer_{name}.json"
    path.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def make(name: str, models_dir: Path, out_dir: Path, allow_mismatch: bool) -> dict[str, Any]:
    fingerprint = folder_fingerprint(models_dir / name)
    model, tokenizer = load(models_dir / name)
    report: dict[str, Any] = {"model": name, "tokenizer_class": type(tokenizer).__name__}
    problems = tokenizer_json_disagreements(models_dir / name, tokenizer, greedy_candidates(name)[0])
    if problems:
        print(f"{name}: transformers does not tokenize as tokenizer.json does:", file=sys.stderr)
        print("\n".join("  " + p for p in problems), file=sys.stderr)
        if not allow_mismatch:
            raise SystemExit(f"{name}: fix the folder (or pass --allow-tokenizer-mismatch)")
        report["tokenizer_mismatches"] = len(problems)
    report["logits"] = write_logits(name, fingerprint, model, tokenizer, out_dir)
    report["greedy"] = write_greedy(name, model, tokenizer, out_dir)
    write_tokenizer(name, tokenizer, out_dir)
    if folder_fingerprint(models_dir / name) != fingerprint:
        raise SystemExit(f"{name}: the model folder changed while the goldens were made; run again")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models-dir", type=Path, default=Path("models"))
    parser.add_argument("--out", type=Path, default=GOLDEN_DIR)
    parser.add_argument("--only", action="append", help="model folder name (repeatable)")
    parser.add_argument("--allow-tokenizer-mismatch", action="store_true",
                        help="write the goldens even where transformers disagrees with tokenizer.json")
    args = parser.parse_args(argv)

    torch.manual_seed(SEED)
    torch.set_num_threads(1)  # one thread: the same float sums, hence the same bytes, on every run
    torch.use_deterministic_algorithms(True)
    names = args.only or [n for n in MODEL_NAMES if (args.models_dir / n / "config.json").is_file()]
    if not names:
        print(f"no model folders under {args.models_dir}", file=sys.stderr)
        return 1
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"safetensors {safetensors.__version__}", file=sys.stderr)
    for name in names:
        report = make(name, args.models_dir, args.out, args.allow_tokenizer_mismatch)
        print(json.dumps(report, ensure_ascii=False, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
