"""What every tiny model maker shares (make_test_models.py, tiny_rope_models.py, tiny_gemma3.py): the byte-level
BPE tokenizer trained on a fixed corpus and its files, the seeded weights and their safetensors, the Llama
config the others start from."""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Before tokenizers trains anything: one thread, so the merges cannot depend on scheduling.
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("RAYON_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 0, 1, 2
TOKENIZER_VOCAB = 512

CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{%- for message in loop_messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.",
    "Hello, world! How are you today? I am fine, thank you. What is the weather like?",
    "A drone flies over the field at 120 meters and reports its battery at 87 percent.",
    "The answer is 42. Count: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 2024 3.14159 -7 +8 1e-5",
    "Question: what is 123 + 456? Answer: 579. Question: what is 12 * 12? Answer: 144.",
    "The system is ready. The user asks a question and the assistant gives an answer.",
    "Once upon a time there was a little robot who wanted to learn how to talk.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "import numpy as np\nx = np.zeros((4, 8), dtype=np.float32)\ny = x @ x.T\n",
    "int main(void) { int n = 0; while (n < 10) { n++; } return n; }",
    '{"name": "nvllm", "version": "0.1.0", "tags": ["llm", "numpy"], "ok": true}',
    "Die Größe des Hauses ist schön. Über den Straßen fährt ein Bäcker.",
    "Le café est très bon à Paris, où l'été est chaud. Ça va? Déjà vu.",
    "東京は日本の首都です。こんにちは、世界。今日はいい天気ですね。",
    "Привет, мир! Как дела? Москва и Санкт-Петербург.",
    "Emoji test: 🚀 🙂 👍 ✨ — en dash – and “quotes” and ‘single’ … ellipsis.",
    "In the morning the birds sing, and in the evening the stars come out over the hills.",
    "Please write a short poem about the sea, the wind and the long road home.",
]


# ---------------------------------------------------------------- tokenizer

# Qwen2's pre-tokenizer split: transformers rebuilds exactly this for model_type qwen2, whatever
# tokenizer.json says, so a Qwen2 folder must carry it to tokenize the same in both.
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


def train_tokenizer(vocab_size: int = TOKENIZER_VOCAB, qwen2: bool = False) -> Tokenizer:
    """A byte-level BPE like SmolLM2's (digits split one by one, GPT-2 byte alphabet), or with
    qwen2=True like Qwen2's (NFC, Qwen2's split regex)."""
    tok = Tokenizer(models.BPE())
    if qwen2:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    return tok


def write_tokenizer(out: Path, tok: Tokenizer, bos_token: str | None,
                    tokenizer_class: str = "PreTrainedTokenizerFast") -> None:
    tok.save(str(out / "tokenizer.json"))
    added = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    cfg = {
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": bos_token,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "model_max_length": 2048,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": tokenizer_class,
        "unk_token": None,
    }
    write_json(out / "tokenizer_config.json", cfg)


# ---------------------------------------------------------------- weights

def _normal(rng: np.random.Generator, shape: tuple, std: float) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)


def _norm_weight(rng: np.random.Generator, n: int) -> np.ndarray:
    # Not all ones, so a missing or misplaced norm changes the output.
    return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)


def layer_tensors(rng: np.random.Generator, cfg: dict, i: int, bias: bool,
                  std: float, qk_norm: bool = False) -> dict[str, np.ndarray]:
    """One decoder layer in HF names, [out, in] orientation; with qk_norm, Qwen3's per-head q/k norms."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q_out, kv_out = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    p = f"model.layers.{i}."
    t = {
        p + "input_layernorm.weight": _norm_weight(rng, h),
        p + "self_attn.q_proj.weight": _normal(rng, (q_out, h), std),
        p + "self_attn.k_proj.weight": _normal(rng, (kv_out, h), std),
        p + "self_attn.v_proj.weight": _normal(rng, (kv_out, h), std),
        p + "self_attn.o_proj.weight": _normal(rng, (h, q_out), std),
        p + "post_attention_layernorm.weight": _norm_weight(rng, h),
        p + "mlp.gate_proj.weight": _normal(rng, (inter, h), std),
        p + "mlp.up_proj.weight": _normal(rng, (inter, h), std),
        p + "mlp.down_proj.weight": _normal(rng, (h, inter), std),
    }
    if bias:
        for name, n in (("q", q_out), ("k", kv_out), ("v", kv_out)):
            t[p + f"self_attn.{name}_proj.bias"] = _normal(rng, (n,), 0.1)
    if qk_norm:   # drawn last, so the other models' draws (and bytes) stay as they were
        t[p + "self_attn.q_norm.weight"] = _norm_weight(rng, d)
        t[p + "self_attn.k_norm.weight"] = _norm_weight(rng, d)
    return t


def iter_weight_groups(cfg: dict, seed: int, bias: bool, std: float,
                       embed_std: float, qk_norm: bool = False) -> Iterator[dict[str, np.ndarray]]:
    """Embeddings, then each layer, then the final norm (+ lm_head): one dict at a time."""
    rng = np.random.default_rng(seed)
    v, h = cfg["vocab_size"], cfg["hidden_size"]
    yield {"model.embed_tokens.weight": _normal(rng, (v, h), embed_std)}
    for i in range(cfg["num_hidden_layers"]):
        yield layer_tensors(rng, cfg, i, bias, std, qk_norm)
    last = {"model.norm.weight": _norm_weight(rng, h)}
    if not cfg["tie_word_embeddings"]:
        last["lm_head.weight"] = _normal(rng, (v, h), embed_std)
    yield last


def _to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    return ((bits + rounding) >> 16).astype(np.uint16)


def save_tensors(tensors: dict[str, np.ndarray], path: Path, dtype: str) -> int:
    """Write one safetensors file in float32, float16 or bfloat16; returns the data bytes."""
    meta = {"format": "pt"}
    if dtype == "float32" or dtype == "float16":
        arrs = {k: np.ascontiguousarray(a.astype(dtype, copy=False)) for k, a in tensors.items()}
        save_file(arrs, str(path), metadata=meta)
        return sum(a.nbytes for a in arrs.values())
    assert dtype == "bfloat16", dtype
    bits = {k: _to_bf16_bits(a) for k, a in tensors.items()}  # NumPy has no bf16: write raw bits
    import safetensors
    specs: dict[str, Any]
    if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.7
        specs = {k: safetensors.TensorSpec(dtype="bfloat16", shape=b.shape, data_ptr=b.ctypes.data,
                                           data_len=b.nbytes) for k, b in bits.items()}
    else:
        specs = {k: {"dtype": "bfloat16", "shape": b.shape, "data": b.tobytes()}
                 for k, b in bits.items()}
    safetensors.serialize_file(specs, str(path), metadata=meta)
    return sum(b.nbytes for b in bits.values())


def write_weights(out: Path, cfg: dict, dtype: str, seed: int, bias: bool, std: float,
                  embed_std: float, num_shards: int = 1, qk_norm: bool = False) -> None:
    """Write the checkpoint; with num_shards > 1, layers are split evenly and indexed."""
    groups = iter_weight_groups(cfg, seed, bias, std, embed_std, qk_norm)
    if num_shards == 1:
        merged: dict[str, np.ndarray] = {}
        for g in groups:
            merged.update(g)
        save_tensors(merged, out / "model.safetensors", dtype)
        return
    # Group i (0 = embeddings, 1..L = layers, L+1 = final) goes to shard i * num_shards // (L+2).
    n_groups = cfg["num_hidden_layers"] + 2
    weight_map: dict[str, str] = {}
    total = 0
    shard: dict[str, np.ndarray] = {}
    shard_idx = 0
    for gi, g in enumerate(groups):
        target = gi * num_shards // n_groups
        if target != shard_idx:
            total += _flush_shard(out, shard, shard_idx, num_shards, dtype, weight_map)
            shard, shard_idx = {}, target
        shard.update(g)
    total += _flush_shard(out, shard, shard_idx, num_shards, dtype, weight_map)
    index = {"metadata": {"total_size": total},
             "weight_map": dict(sorted(weight_map.items()))}
    write_json(out / "model.safetensors.index.json", index)


def _flush_shard(out: Path, shard: dict[str, np.ndarray], idx: int, n: int, dtype: str,
                 weight_map: dict[str, str]) -> int:
    name = f"model-{idx + 1:05d}-of-{n:05d}.safetensors"
    for k in shard:
        weight_map[k] = name
    return save_tensors(shard, out / name, dtype)


# ---------------------------------------------------------------- folders

def write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def llama_config(vocab: int, dtype: str, tied: bool) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": tied,
        "vocab_size": vocab,
        "bos_token_id": IM_START_ID,
        "eos_token_id": IM_END_ID,
        "torch_dtype": dtype,
        "use_cache": True,
    }
