"""Write the goldens of the low-bit GGUF types: what transformers' GGUF loader computes for the files
helpers/gguf_type_cases.py makes (SmolLM2 and tiny256 in Q5_0, IQ4_NL, Q3_K_M, Q2_K and IQ4_XS).

Runs by hand, in the reference venv of make_golden.py plus `gguf` and `accelerate` (transformers' GGUF
loader needs both), with nvllm's sources on the path to make the files:

    .refvenv/bin/pip install gguf accelerate
    PYTHONPATH=daemon:tests .refvenv/bin/python tests/golden/make_golden_gguf.py \
        [--shipped models/smollm2-135m-instruct.gguf] [--folder models/smollm2-135m-instruct]

It writes
  gguf_types_greedy.json        per file ("smollm2-Q2_K", "tiny256-IQ4_XS", ...): tensors_sha256 and the
                                greedy cases (as make_golden.py's) whose every step leads by > CLEAR_MARGIN:
                                SmolLM2's chat and raw prompts (ids from the folder's tokenizer), tiny256's
                                seeded random ids.
  gguf_types_tiny256.safetensors  per tiny256 file: <type>_ids [32] int64 and <type>_logits [32, 64] float32,
                                the whole prompt in one pass.
transformers dequantizes every tensor with gguf.quants and runs float32, eager attention, one thread.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from golden_cases import MAIN_TEXT, SMOLLM2_GREEDY
from make_golden import chat_ids, run_logits, text_ids
from safetensors.numpy import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers.gguf_type_cases import (
    CLEAR_MARGIN,
    GREEDY_TOKENS,
    TINY256,
    TINY256_GREEDY_TOKENS,
    smollm2_files,
    tensors_sha256,
    tiny256_files,
)

GOLDEN_DIR = Path(__file__).resolve().parent
SEED = 1234


def load(path: Path) -> Any:
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                 attn_implementation="eager")
    return model.to("cpu").eval()


@torch.no_grad()
def greedy(model: Any, prompt_ids: list[int], eos: list[int], tokens: int) -> dict[str, Any]:
    """Greedy continuation (generate, stopping at EOS) with each step's top-1 lead over the top-2."""
    input_ids = torch.tensor([prompt_ids], dtype=torch.long)
    out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                         max_new_tokens=tokens, eos_token_id=eos, pad_token_id=eos[0],
                         return_dict_in_generate=True, output_logits=True)
    output_ids = [int(i) for i in out.sequences[0, len(prompt_ids):].tolist()]
    margins = []
    for step, raw in enumerate(out.logits):
        top2 = torch.topk(raw[0].float(), 2)
        if int(top2.indices[0]) != output_ids[step]:
            raise RuntimeError(f"step {step} is not the argmax of the raw logits (logits processor?)")
        margins.append(float(top2.values[0] - top2.values[1]))
    return {"prompt_ids": [int(i) for i in prompt_ids], "output_ids": output_ids,
            "stopped_at_eos": output_ids[-1] in eos, "min_margin": min(margins)}


def smollm2_prompts(folder: Path) -> list[tuple[str, list[int]]]:
    tok = AutoTokenizer.from_pretrained(folder)
    cases = [("main_text", [int(i) for i in text_ids(tok, MAIN_TEXT, 48)])]
    for name, kind, payload in SMOLLM2_GREEDY:
        ids = chat_ids(tok, payload) if kind == "chat" else [int(i) for i in tok(payload)["input_ids"]]
        cases.append((name, ids))
    return cases


def tiny256_prompts() -> list[tuple[str, list[int]]]:
    """Seeded random ids; the last (32 long) is also the logits prompt. A random model's top-2 are often
    close, so there are many, to keep a few clear ones for each type."""
    rng = np.random.default_rng(SEED)
    ordinary = TINY256["vocab"] - 1                     # the last id is EOS
    lengths = (4, 9, 17, 3, 5, 7, 11, 13, 19, 23, 6, 8, 10, 12, 14, 32)
    return [(f"random_{i}_{n}", rng.integers(0, ordinary, n).tolist()) for i, n in enumerate(lengths)]


def cases_for(model: Any, prompts: list[tuple[str, list[int]]], eos: list[int],
              tokens: int) -> tuple[list, list]:
    kept: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    for name, ids in prompts:
        case = {"name": name, **greedy(model, ids, eos, tokens)}
        (kept if case["min_margin"] > CLEAR_MARGIN else dropped).append(case)
    return kept, dropped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shipped", type=Path, default=Path("models/smollm2-135m-instruct.gguf"))
    parser.add_argument("--folder", type=Path, default=Path("models/smollm2-135m-instruct"))
    parser.add_argument("--only", action="append", choices=("smollm2", "tiny256"),
                        help="remake this group only, keeping the other's entries (repeatable)")
    args = parser.parse_args(argv)
    args.only = args.only or ["smollm2", "tiny256"]
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    greedy_path = GOLDEN_DIR / "gguf_types_greedy.json"
    logits_path = GOLDEN_DIR / "gguf_types_tiny256.safetensors"
    doc: dict[str, Any] = {"made_with": {"transformers": transformers.__version__, "torch": torch.__version__},
                           "clear_margin": CLEAR_MARGIN, "files": {}}
    tensors: dict[str, np.ndarray] = {}
    if greedy_path.exists():   # the groups not remade stay as they were
        kept_files = json.loads(greedy_path.read_text(encoding="utf-8"))["files"]
        doc["files"] = {k: v for k, v in kept_files.items() if k.split("-")[0] not in args.only}
    if logits_path.exists() and "tiny256" not in args.only:
        tensors = load_file(str(logits_path))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        groups = []
        if "smollm2" in args.only:
            groups.append(("smollm2", smollm2_files(args.shipped, out), smollm2_prompts(args.folder), [2],
                           GREEDY_TOKENS))
        if "tiny256" in args.only:
            groups.append(("tiny256", tiny256_files(out), tiny256_prompts(), [TINY256["vocab"] - 1],
                           TINY256_GREEDY_TOKENS))
        for group, files, prompts, eos, tokens in groups:
            for file_type, path in files.items():
                model = load(path)
                kept, dropped = cases_for(model, prompts, eos, tokens)
                doc["files"][f"{group}-{file_type}"] = {"tensors_sha256": tensors_sha256(path), "cases": kept}
                print(f"{group}-{file_type}: kept {[c['name'] for c in kept]}, dropped "
                      f"{[(c['name'], round(c['min_margin'], 4)) for c in dropped]}", file=sys.stderr)
                if group == "tiny256":
                    ids = np.array(prompts[-1][1], dtype=np.int64)
                    tensors[f"{file_type}_ids"] = ids
                    tensors[f"{file_type}_logits"] = run_logits(model, ids)
    doc["files"] = dict(sorted(doc["files"].items()))
    greedy_path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    save_file(tensors, str(logits_path))
    logits_path.chmod(0o644)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
