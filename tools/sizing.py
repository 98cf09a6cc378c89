"""The sizing table of docs/configuration.md ("Sizing for a board"): weights, page pool and full-length
sequences at once, per weight format, for the default model and two larger Llama/Qwen shapes, on boards
with 8, 16 and 64 GiB available.

Every cell is what `nvllm serve --dry-run --memory-gb N --model M [--quantization Q]` prints for that
model, format and board: both go through engine/factory.plan_for_board, from config.json alone. The
shapes below are the models' own config.json values (nothing is downloaded); each is written to a
temporary folder that holds only config.json, which is all planning reads. The default model's GGUF as
shipped (Q4_1) is planned from its header when it has been pulled into models/.

    python tools/sizing.py                        # the table, with the settings' defaults
    python tools/sizing.py --max-pool-mb 0        # without the 2 GiB cap on the pool
    python tools/sizing.py --max-model-len 1024   # shorter contexts: more sequences at once
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from nvllm.config import DEFAULT_MODEL_FILE, load_settings
from nvllm.engine.assembly.factory import EngineBuildError, plan_for_board, read_model_info
from nvllm.engine.assembly.memory import GiB, format_bytes

REPO = Path(__file__).resolve().parent.parent
BOARDS_GIB = (8, 16, 64)
FORMATS = ("f32", "bf16", "q8_0", "q4_k")

SHAPES: dict[str, dict[str, Any]] = {
    "SmolLM2-135M-Instruct": {
        "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "vocab_size": 49152, "max_position_embeddings": 8192, "rope_theta": 100000.0,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": True},
    "Qwen2.5-1.5B-Instruct": {
        "architectures": ["Qwen2ForCausalLM"], "hidden_size": 1536, "intermediate_size": 8960,
        "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
        "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True},
    "Qwen2.5-7B-Instruct": {
        "architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "vocab_size": 152064, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False},
}


def plan_cell(path: Path, quantization: str, gib: float, overrides: dict[str, Any]) -> tuple[str, str]:
    """(weights, "pool, N sequences") for one model, format and board, as the dry run plans them."""
    settings = load_settings(None, {"model": {"path": str(path), "quantization": quantization},
                                    **overrides})
    info = read_model_info(settings)
    weights = format_bytes(info.weight_bytes)
    if info.weight_bytes >= gib * GiB:
        return weights, "weights do not fit"
    # A folder quantized at load reads each matrix as float32 first: where the weights and the largest
    # of those do not fit, the figures hold for a GGUF of the format, whose blocks load as they are.
    note = " (as a GGUF)" if info.load_peak_bytes >= gib * GiB else ""
    try:
        _, plan = plan_for_board(settings, gib)
    except EngineBuildError:   # what is left after the weights cannot hold one max_model_len sequence
        return weights, f"no room for one {settings.scheduler.max_model_len}-token sequence"
    return weights, f"{format_bytes(plan.sizing.pool_bytes)}, {plan.full_length_seqs}{note}"


def rows(overrides: dict[str, Any], gguf: Path | None) -> list[list[str]]:
    out = []
    with tempfile.TemporaryDirectory(prefix="nvllm-sizing-") as tmp:
        for name, shape in SHAPES.items():
            folder = Path(tmp) / name
            folder.mkdir()
            (folder / "config.json").write_text(json.dumps(shape))
            models = [(f, folder) for f in FORMATS]
            if gguf is not None and name.startswith("SmolLM2"):
                models.append(("Q4_1 GGUF", gguf))
            for fmt, path in models:
                cells = [plan_cell(path, "" if fmt == "Q4_1 GGUF" else fmt, gib, overrides) for gib in BOARDS_GIB]
                label = {"f32": "float32", "Q4_1 GGUF": "Q4_1 (the GGUF as shipped)"}.get(fmt, fmt)
                out.append([name, label, cells[0][0]] + [c[1] for c in cells])
    return out


def table(overrides: dict[str, Any], gguf: Path | None) -> str:
    head = ["model", "weights as", "weights"] + [f"{g} GiB: pool, sequences" for g in BOARDS_GIB]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows(overrides, gguf)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-pool-mb", type=int, default=None, help="cache.max_pool_mb (default: the setting's)")
    p.add_argument("--max-model-len", type=int, default=None, help="scheduler.max_model_len (default: the setting's)")
    p.add_argument("--gguf", default=str(REPO / "models" / DEFAULT_MODEL_FILE),
                   help="the default model's GGUF, planned as shipped when the file exists")
    args = p.parse_args(argv)
    overrides = {"cache": {"max_pool_mb": args.max_pool_mb}, "scheduler": {"max_model_len": args.max_model_len}}
    gguf = Path(args.gguf) if Path(args.gguf).is_file() else None
    print(table(overrides, gguf))
    return 0


if __name__ == "__main__":
    sys.exit(main())
