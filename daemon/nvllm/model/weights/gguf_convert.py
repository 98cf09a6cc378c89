"""A llama.cpp GGUF file -> a Hugging Face folder: config.json, model.safetensors (float32), tokenizer.json,
tokenizer_config.json (with the GGUF's chat template) and generation_config.json.

Llama architecture and byte-level BPE tokenizers only; gguf_file.py reads and checks the file and
gguf_weights.py dequantizes it, as they do for a GGUF served directly.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

import numpy as np
from tokenizers import Tokenizer as HFTokenizer

from nvllm.model.config import ModelConfig
from nvllm.model.weights.gguf_file import read_gguf
from nvllm.model.weights.gguf_reader import GGUFError
from nvllm.model.weights.gguf_weights import hf_tensors
from nvllm.text.tokenizer import Tokenizer


class Progress(Protocol):
    def step(self, msg: str) -> None: ...

    def count(self, what: str, i: int, n: int) -> None: ...


# ---------------------------------------------------------------- tokenizer

def check_tokenizer(tok: HFTokenizer) -> None:
    """Fail the pull now rather than serve a tokenizer that mangles text."""
    enc = tok.encode("What is 123?", add_special_tokens=False)
    digits = [t for t in enc.tokens if any(c.isdigit() for c in t)]
    if digits[-3:] != ["1", "2", "3"]:
        raise GGUFError(f"tokenizer does not split digits: {enc.tokens}")
    for text in ("Hello, world!", "Größe 東京 🚀", "def f(x):\n    return x * 2\n"):
        ids = tok.encode(text, add_special_tokens=False).ids
        if tok.decode(ids, skip_special_tokens=False) != text:
            raise GGUFError(f"tokenizer does not round-trip {text!r}")


def tokenizer_config(tok: Tokenizer, add_bos: bool, model_max_length: int) -> dict:
    added = {
        str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": False, "rstrip": t.rstrip,
                 "single_word": False, "special": t.special}   # the strips the file's rules gave (gguf_strip.py)
        for i, t in sorted(tok.backend.get_added_tokens_decoder().items())
    }
    named = tok.special_tokens
    return {
        "add_bos_token": add_bos,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in dict.fromkeys((tok.bos_token, tok.eos_token)) if t],
        "bos_token": named.get("bos_token"),
        "chat_template": tok.chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": named.get("eos_token"),
        "model_max_length": model_max_length,
        "pad_token": named.get("pad_token"),
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": named.get("unk_token"),
        "vocab_size": tok.vocab_size,
    }


def hf_config(c: ModelConfig, bos_id: int | None, eos_id: int | None) -> dict:
    return {
        "architectures": [c.architecture],
        "model_type": "llama",
        "attention_bias": c.attention_bias,
        "attention_dropout": 0.0,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": eos_id,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "max_position_embeddings": c.max_position_embeddings,
        "mlp_bias": False,
        "num_attention_heads": c.num_heads,
        "num_hidden_layers": c.num_layers,
        "num_key_value_heads": c.num_kv_heads,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_scaling": c.rope_scaling,
        "rope_theta": c.rope_theta,
        "tie_word_embeddings": c.tie_word_embeddings,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": c.vocab_size,
    }


# ---------------------------------------------------------------- folder

def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def build_folder(gguf_path: Path, out: Path, prog: Progress) -> None:
    """Write the HF files for the GGUF at gguf_path into the (empty) folder out."""
    from safetensors.numpy import save_file

    g = read_gguf(gguf_path)     # every check of a served GGUF, before anything is converted
    c = g.config
    if c.architecture != "LlamaForCausalLM":
        raise GGUFError(f"{gguf_path}: the converter writes Llama folders; this is {c.architecture}")
    tensors: dict[str, np.ndarray] = {}
    n = len(g.tensors)
    for i, (name, w) in enumerate(hf_tensors(g), 1):
        tensors[name] = w
        prog.count("dequantizing tensors", i, n)

    prog.step("building tokenizer")
    try:
        tok = Tokenizer.from_gguf_metadata(g.metadata, str(gguf_path))
    except ValueError as e:
        raise GGUFError(str(e)) from e
    check_tokenizer(tok.backend)
    tok.backend.save(str(out / "tokenizer.json"))
    bos_id, eos_id = tok.bos_token_id, tok.eos_token_id
    # what the tokenizer does, not the key: a SentencePiece file without it adds BOS (llama.cpp's default)
    add_bos = bos_id is not None and tok.encode("")[:1] == [bos_id]
    _write_json(out / "tokenizer_config.json", tokenizer_config(tok, add_bos, c.max_position_embeddings))
    _write_json(out / "config.json", hf_config(c, bos_id, eos_id))
    _write_json(out / "generation_config.json",
                {"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": eos_id})

    prog.step("writing model.safetensors (float32)")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # safetensors creates files owner-only
