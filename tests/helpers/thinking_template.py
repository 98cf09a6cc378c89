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
