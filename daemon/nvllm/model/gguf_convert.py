"""A llama.cpp GGUF file -> a Hugging Face folder: config.json, model.safetensors (float32), tokenizer.json,
tokenizer_config.json (with the GGUF's chat template) and generation_config.json.

Llama architecture and byte-level BPE tokenizers only; the `gguf` package reads and dequantizes the file.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Protocol, Tuple

import numpy as np


class GGUFError(ValueError):
    """The GGUF holds something this converter does not handle; the message says what."""


class Progress(Protocol):
    def step(self, msg: str) -> None: ...

    def count(self, what: str, i: int, n: int) -> None: ...


# ---------------------------------------------------------------- tensors

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_tensor_name(gguf_name: str) -> str:
    """llama.cpp tensor name -> Hugging Face Llama name."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")  # blk.N.attn_q.weight
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    raise GGUFError(f"unexpected GGUF tensor {gguf_name!r}: this converter knows Llama only")


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order so rotate_half RoPE applies, as in the HF checkpoint.

    llama.cpp rotates adjacent pairs (x0, x1), (x2, x3)...; HF rotates x[i] with x[i + d/2].
    Its converter therefore interleaves each head's rows: GGUF row 2*i + j is HF row j*d/2 + i.
    """
    rows = w.shape[0]
    d = rows // n_heads
    # [H*d, in] -> [H, d/2, 2, in] -> [H, 2, d/2, in] -> [H*d, in]
    return np.ascontiguousarray(w.reshape(n_heads, d // 2, 2, -1).swapaxes(1, 2).reshape(w.shape))


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _f32_float(x: float) -> float:
    """A float32 metadata value as the short decimal it was written from (1e-05, not 9.99e-06)."""
    return float(str(np.float32(x)))


def gguf_hparams(reader) -> dict:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise GGUFError(f"GGUF architecture is {arch!r}; only 'llama' is supported")
    get = lambda k: _field(reader, f"llama.{k}")  # noqa: E731
    hp = {
        "hidden_size": int(get("embedding_length")),
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": int(get("attention.head_count")),
        "num_key_value_heads": int(get("attention.head_count_kv")),
        "max_position_embeddings": int(get("context_length")),
        "rms_norm_eps": _f32_float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": _f32_float(get("rope.freq_base")),
        "vocab_size": int(get("vocab_size") or len(_field(reader, "tokenizer.ggml.tokens"))),
    }
    hp["head_dim"] = hp["hidden_size"] // hp["num_attention_heads"]
    rot = get("rope.dimension_count")
    if rot is not None and int(rot) != hp["head_dim"]:
        raise GGUFError(f"partial rotary ({rot} of {hp['head_dim']}) is not supported")
    if get("rope.scaling.type") not in (None, "none"):
        raise GGUFError("GGUF rope scaling is not supported by this converter")
    return hp


def convert_tensors(reader, hp: dict, prog: Progress) -> Dict[str, np.ndarray]:
    """Dequantize every tensor to float32 [out, in] with HF names and HF Q/K row order."""
    from gguf.quants import dequantize

    h, d = hp["hidden_size"], hp["head_dim"]
    n_q, n_kv, inter = hp["num_attention_heads"], hp["num_key_value_heads"], hp["intermediate_size"]
    expected = {
        "input_layernorm": (h,), "post_attention_layernorm": (h,),
        "self_attn.q_proj": (n_q * d, h), "self_attn.k_proj": (n_kv * d, h),
        "self_attn.v_proj": (n_kv * d, h), "self_attn.o_proj": (h, n_q * d),
        "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h), "mlp.down_proj": (h, inter),
        "model.embed_tokens": (hp["vocab_size"], h), "model.norm": (h,),
        "lm_head": (hp["vocab_size"], h),
    }
    out: Dict[str, np.ndarray] = {}
    n = len(reader.tensors)
    for i, t in enumerate(reader.tensors, 1):
        name = hf_tensor_name(t.name)
        # dequantize returns NumPy order, i.e. GGUF's ne reversed: [out, in] as in HF.
        w = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)
        key = name.rsplit(".", 1)[0]
        key = key.split(".", 3)[3] if key.startswith("model.layers.") else key
        if w.shape != expected[key]:
            raise GGUFError(f"{t.name}: shape {w.shape}, expected {expected[key]}")
        if key == "self_attn.q_proj":
            w = unpermute_rope_rows(w, n_q)
        elif key == "self_attn.k_proj":
            w = unpermute_rope_rows(w, n_kv)
        out[name] = w
        prog.count("dequantizing tensors", i, n)
    missing = {"model.embed_tokens.weight", "model.norm.weight"} - out.keys()
    if missing:
        raise GGUFError(f"GGUF lacks {sorted(missing)}")
    return out


# ---------------------------------------------------------------- tokenizer

CONTROL_TOKEN_TYPE = 3  # llama.cpp's token_type for control (special) tokens
_PRETOKENIZERS = {"smollm"}  # GGUF `tokenizer.ggml.pre` values whose splitting we reproduce


def build_tokenizer(reader):
    """The GGUF vocabulary and merges as a `tokenizers` byte-level BPE, like the original."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    if _field(reader, "tokenizer.ggml.model") != "gpt2":
        raise GGUFError("only byte-level BPE ('gpt2') GGUF tokenizers are supported")
    pre = _field(reader, "tokenizer.ggml.pre")
    if pre not in _PRETOKENIZERS:
        raise GGUFError(f"unknown GGUF pre-tokenizer {pre!r}")
    tokens: List[str] = _field(reader, "tokenizer.ggml.tokens")
    types: List[int] = _field(reader, "tokenizer.ggml.token_type")
    merges: List[Tuple[str, str]] = []
    for m in _field(reader, "tokenizer.ggml.merges"):
        a, b = m.split(" ")  # byte-level symbols never hold a plain space
        merges.append((a, b))
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    # SmolLM2 ("smollm"): each digit alone, then GPT-2's byte-level split.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False, lstrip=False, rstrip=False,
                           single_word=False)
                for t, ty in zip(tokens, types) if ty == CONTROL_TOKEN_TYPE]
    tok.add_special_tokens(specials)
    return tok


def check_tokenizer(tok) -> None:
    """Fail the pull now rather than serve a tokenizer that mangles text."""
    enc = tok.encode("What is 123?", add_special_tokens=False)
    digits = [t for t in enc.tokens if any(c.isdigit() for c in t)]
    if digits[-3:] != ["1", "2", "3"]:
        raise GGUFError(f"tokenizer does not split digits: {enc.tokens}")
    for text in ("Hello, world!", "Größe 東京 🚀", "def f(x):\n    return x * 2\n"):
        ids = tok.encode(text, add_special_tokens=False).ids
        if tok.decode(ids, skip_special_tokens=False) != text:
            raise GGUFError(f"tokenizer does not round-trip {text!r}")


def tokenizer_config(reader, tok, model_max_length: int) -> dict:
    tokens: List[str] = _field(reader, "tokenizer.ggml.tokens")
    types: List[int] = _field(reader, "tokenizer.ggml.token_type")
    added = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        for i, (t, ty) in enumerate(zip(tokens, types)) if ty == CONTROL_TOKEN_TYPE
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": "<|im_start|>",
        "chat_template": _field(reader, "tokenizer.chat_template"),
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "model_max_length": model_max_length,
        "pad_token": "<|im_end|>",
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": "<|endoftext|>",
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
    }


def hf_config(hp: dict, bos_id: int, eos_id: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": eos_id,
        "head_dim": hp["head_dim"],
        "hidden_act": "silu",
        "hidden_size": hp["hidden_size"],
        "intermediate_size": hp["intermediate_size"],
        "max_position_embeddings": hp["max_position_embeddings"],
        "mlp_bias": False,
        "num_attention_heads": hp["num_attention_heads"],
        "num_hidden_layers": hp["num_hidden_layers"],
        "num_key_value_heads": hp["num_key_value_heads"],
        "rms_norm_eps": hp["rms_norm_eps"],
        "rope_scaling": None,
        "rope_theta": hp["rope_theta"],
        "tie_word_embeddings": hp["tie_word_embeddings"],
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": hp["vocab_size"],
    }


# ---------------------------------------------------------------- folder

def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def build_folder(gguf_path: Path, out: Path, prog: Progress) -> None:
    """Write the HF files for the GGUF at gguf_path into the (empty) folder out."""
    from gguf import GGUFReader
    from safetensors.numpy import save_file

    reader = GGUFReader(str(gguf_path))
    hp = gguf_hparams(reader)
    tensors = convert_tensors(reader, hp, prog)
    hp["tie_word_embeddings"] = "lm_head.weight" not in tensors

    prog.step("building tokenizer")
    tok = build_tokenizer(reader)
    check_tokenizer(tok)
    tok.save(str(out / "tokenizer.json"))
    # By name, not GGUF metadata: this GGUF says eos = <|im_start|>, the original says <|im_end|>.
    bos_id, eos_id = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    _write_json(out / "tokenizer_config.json",
                tokenizer_config(reader, tok, hp["max_position_embeddings"]))
    _write_json(out / "config.json", hf_config(hp, bos_id, eos_id))
    _write_json(out / "generation_config.json",
                {"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": eos_id})

    prog.step("writing model.safetensors (float32)")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # safetensors creates files owner-only
