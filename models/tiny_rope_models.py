"""The tiny random Phi-3 and SmolLM3 folders, whose difference from Llama is where rope goes; make_test_models.py
(beside this file) lists them with the others; tiny_kit.py lends the weights, tokenizer and writers.

  tiny-phi3     Phi3ForCausalLM as Phi-4-mini lays it out: fused qkv_proj and gate_up_proj, partial rotary
                (0.75 of each head), longrope ("su" in older configs) with original context 40, so the
                64-token goldens take the long factors and the shorter ones the short; float32, tied
  tiny-smollm3  SmolLM3ForCausalLM: Llama's tensors, 4 layers, the 4th NoPE (no_rope_layers), float32, tied
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import tiny_kit as b


def _generation(out: Path) -> None:
    b.write_json(out / "generation_config.json",
                 {"bos_token_id": b.ENDOFTEXT_ID, "eos_token_id": [b.IM_END_ID, b.ENDOFTEXT_ID],
                   "pad_token_id": b.ENDOFTEXT_ID})


def phi3_config(vocab: int) -> dict:
    rng = np.random.default_rng(21)
    freqs = 6   # 0.75 of head_dim 16 -> 12 rotary dims
    return {
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "embd_pdrop": 0.0,
        "resid_pdrop": 0.0,
        "hidden_act": "silu",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "original_max_position_embeddings": 40,
        "partial_rotary_factor": 0.75,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "longrope",
                         "short_factor": [round(float(f), 4) for f in 1.0 + rng.random(freqs)],
                         "long_factor": [round(float(f), 4) for f in 1.0 + 8.0 * rng.random(freqs)]},
        "sliding_window": None,
        "tie_word_embeddings": True,
        "vocab_size": vocab,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "float32",
        "use_cache": True,
    }


def make_tiny_phi3(out: Path, tok: Any) -> None:
    cfg = phi3_config(tok.get_vocab_size())
    b.write_json(out / "config.json", cfg)
    _generation(out)
    b.write_tokenizer(out, tok, bos_token=None)
    tensors: dict[str, np.ndarray] = {}
    for group in b.iter_weight_groups(cfg, seed=11, bias=False, std=0.08, embed_std=0.15):
        for name, t in group.items():
            if name.endswith("q_proj.weight"):   # Phi-3's checkpoint holds them fused, q|k|v and gate|up
                qkv = [t] + [group[name.replace("q_proj", x)] for x in ("k_proj", "v_proj")]
                tensors[name.replace("q_proj", "qkv_proj")] = np.concatenate(qkv)
            elif name.endswith("gate_proj.weight"):
                tensors[name.replace("gate_proj", "gate_up_proj")] = np.concatenate(
                    [t, group[name.replace("gate", "up")]])
            elif not name.endswith(("k_proj.weight", "v_proj.weight", "up_proj.weight")):
                tensors[name] = t
    b.save_tensors(tensors, out / "model.safetensors", "float32")


def make_tiny_smollm3(out: Path, tok: Any) -> None:
    cfg = b.llama_config(tok.get_vocab_size(), "float32", tied=True)
    cfg.update({"architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "num_hidden_layers": 4,
                "rope_theta": 5000.0, "no_rope_layers": [1, 1, 1, 0], "no_rope_layer_interval": 4,
                "use_sliding_window": False, "sliding_window": None, "bos_token_id": None,
                "eos_token_id": 2, "pad_token_id": 0})
    del cfg["head_dim"]
    b.write_json(out / "config.json", cfg)
    _generation(out)
    b.write_tokenizer(out, tok, bos_token=None)
    b.write_weights(out, cfg, "float32", seed=12, bias=False, std=0.08, embed_std=0.15)


ROPE_BUILDERS = {"tiny-phi3": make_tiny_phi3, "tiny-smollm3": make_tiny_smollm3}
