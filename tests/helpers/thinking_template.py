"""A Qwen3-style chat template that honours enable_thinking as Qwen3's own does (an empty think block in the
generation prompt when it is false), and tiny-qwen3 with it, for the chat_template_kwargs and reasoning tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

THINKING_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
EMPTY_THINK = "<think>\n\n</think>\n\n"
USER = [{"role": "user", "content": "Name a colour."}]
PROMPT = "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n"


def make_thinking_qwen3(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-qwen3 with THINKING_TEMPLATE as its chat template."""
    folder = tmp_path_factory.mktemp("qwen-thinking") / "tiny-qwen3-thinking"
    shutil.copytree(tiny_models["tiny-qwen3"], folder)
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = THINKING_TEMPLATE
    cfg_path.write_text(json.dumps(cfg))
    return folder


def make_think_tokens(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-llama with THINKING_TEMPLATE and, as Qwen3's and DeepSeek-R1's tokenizers have them, <think> and
    </think> as added tokens that are not special (text to the detokenizer); two embedding rows more."""
    import numpy as np
    from safetensors.numpy import load_file, save_file
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as Backend

    folder = tmp_path_factory.mktemp("think-tokens") / "tiny-think-tokens"
    shutil.copytree(tiny_models["tiny-llama"], folder)
    backend = Backend.from_file(str(folder / "tokenizer.json"))
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>")])
    backend.save(str(folder / "tokenizer.json"))
    config = json.loads((folder / "config.json").read_text())
    for name, changes in (("tokenizer_config.json", {"chat_template": THINKING_TEMPLATE}),
                          ("config.json", {"vocab_size": config["vocab_size"] + 2})):
        cfg = json.loads((folder / name).read_text())
        cfg.update(changes)
        (folder / name).write_text(json.dumps(cfg))
    weights = load_file(str(folder / "model.safetensors"))
    rows = np.random.default_rng(0).normal(0, 0.1, (2, config["hidden_size"])).astype(np.float32)
    for key in ("lm_head.weight", "model.embed_tokens.weight"):
        if key in weights:
            weights[key] = np.concatenate([weights[key], rows.astype(weights[key].dtype)])
    save_file(weights, str(folder / "model.safetensors"))
    return folder
