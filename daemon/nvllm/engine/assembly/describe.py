"""What a model is, read from its files without loading its weights, for the daemon's model listings
(Ollama's /api/tags, /api/show, /api/ps): its format, architecture and size, its quantization, its shape
(context length, embedding length, layers, heads), its chat template and sampling defaults. A GGUF's header
is read without its vocabulary; a folder's config.json, tokenizer_config.json and generation_config.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nvllm.config import Settings
from nvllm.engine.assembly.planning import EngineBuildError, is_gguf, model_path, read_model_info
from nvllm.engine.assembly.speech_model import is_speech
from nvllm.model.weights.gguf_file import open_gguf
from nvllm.text.chat_template import select_chat_template, template_takes_tools

# llama.cpp's llama_ftype (general.file_type) -> the name its files are known by
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
              12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
              19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
              26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16"}
# A folder's torch_dtype -> the same kind of name
DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
# generation_config.json's sampling defaults -> Ollama's parameter names
PARAMETERS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
              "repetition_penalty": "repeat_penalty"}


@dataclass(frozen=True)
class ModelDescription:
    path: Path
    format: str                      # "gguf" or "safetensors"
    architecture: str                # Ollama's family: general.architecture, or config.json's model_type
    parameter_count: int
    quantization: str                # "Q4_K_M", "Q8_0", "F16", "BF16", "F32"...
    context_length: int
    embedding_length: int
    block_count: int
    head_count: int
    head_count_kv: int
    task: str                        # "generate", "embed", "rerank", "transcribe"
    chat_template: str = ""
    takes_tools: bool = False
    parameters: dict[str, Any] = field(default_factory=dict)   # sampling defaults, by Ollama's names


def human_count(n: int) -> str:
    """A parameter count as Ollama shows it: 134.52M, 1.54B, 812K."""
    for div, unit in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= div:
            return f"{n / div:.2f}".rstrip("0").rstrip(".") + unit
    return str(n)


def describe_model(settings: Settings) -> ModelDescription:
    """The model settings.model.path names, read from its files (EngineBuildError where they cannot be)."""
    path = model_path(settings)
    info = read_model_info(settings)
    try:
        if is_gguf(path):
            return _gguf(path, info.num_params, info.task)
        return _folder(path, info.num_params, info.task, is_speech(path))
    except (OSError, ValueError) as e:
        raise EngineBuildError(f"cannot read {path}: {e}") from e


def _gguf(path: Path, params: int, task: str) -> ModelDescription:
    f = open_gguf(path, vocabulary=False)
    try:
        meta = f.metadata
        arch = str(meta.get("general.architecture") or "")

        def num(key: str) -> int:
            v = meta.get(f"{arch}.{key}")
            return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0
        ftype = meta.get("general.file_type")
        count = meta.get("general.parameter_count")
        template = meta.get("tokenizer.chat_template")
        template = template if isinstance(template, str) else ""
        return ModelDescription(
            path, "gguf", arch, count if isinstance(count, int) and count > 0 else params,
            FILE_TYPES.get(ftype, "unknown") if isinstance(ftype, int) else "unknown", num("context_length"),
            num("embedding_length"), num("block_count"), num("attention.head_count"),
            num("attention.head_count_kv") or num("attention.head_count"), task, template,
            template_takes_tools(template))
    finally:
        f.close()


def _folder(path: Path, params: int, task: str, speech: bool) -> ModelDescription:
    config = _json(path / "config.json")
    inner = config.get("text_config")
    text: dict[str, Any] = inner if isinstance(inner, dict) else config

    def num(*keys: str) -> int:
        for k in keys:
            v = text.get(k)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
        return 0
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    template = "" if speech else (select_chat_template(path, _json(path / "tokenizer_config.json")) or "")
    generation = _json(path / "generation_config.json")
    parameters = {ours: generation[theirs] for theirs, ours in PARAMETERS.items()
                  if isinstance(generation.get(theirs), (int, float)) and not isinstance(generation[theirs], bool)}
    return ModelDescription(
        path, "safetensors", str(config.get("model_type") or ""), params, DTYPES.get(dtype, dtype.upper()),
        num("max_position_embeddings", "max_target_positions", "n_positions"),
        num("hidden_size", "d_model", "n_embd"), num("num_hidden_layers", "decoder_layers", "n_layer"),
        num("num_attention_heads", "decoder_attention_heads", "n_head"),
        num("num_key_value_heads", "num_attention_heads", "decoder_attention_heads", "n_head"), task, template,
        template_takes_tools(template), parameters)


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}
