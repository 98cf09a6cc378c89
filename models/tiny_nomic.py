"""The tiny NomicBert embedder for make_test_models.py (beside this file, which lists it with the others): the folder
as nomic-embed-text-v1.5's is laid out, at tiny-bert's size, with tiny-bert's WordPiece tokenizer (tiny_encoders.py).

  tiny-nomic-bert  NomicBertModel: rotary positions (NeoX's halves, base 1000, the whole of each head), a SwiGLU
                   MLP (fc2(fc11(x) * silu(fc12(x)))), post-norm layers, no biases, no position table; a
                   sentence-transformers folder with mean pooling, then Normalize

config.json carries nomic's own keys (n_embd, n_layer, n_head, n_inner, rotary_emb_*, prenorm, qkv_proj_bias,
mlp_fc1_bias, mlp_fc2_bias, activation_function "swiglu") with the values llama.cpp's converter requires:
n_positions 8192 and max_trained_positions 2048 (it writes a context of 2048), causal, prenorm and every bias
false, rotary_emb_fraction 1.0, not interleaved. The tensors have nomic's names (embeddings.*, emb_ln, and per
layer attn.Wqkv (q|k|v, one matrix), attn.out_proj, mlp.fc11 / fc12 / fc2, norm1, norm2). The embedding has
rows past the tokenizer's, up to a multiple of 64 (pad_vocab_size_multiple), as nomic's 30528 rows are past
bert-base's 30522 tokens: 960 rows for 896 tokens.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import tiny_kit as kit
from tiny_encoders import (
    ST_NORMALIZE,
    ST_POOLING,
    Draw,
    pooling_config,
    train_wordpiece,
    write_sentence_transformers,
    write_wordpiece,
)

VOCAB_MULTIPLE = 64


def nomic_config(tokens: int) -> dict[str, Any]:
    """nomic-embed-text-v1.5's config.json at a tiny size."""
    return {
        "activation_function": "swiglu",
        "architectures": ["NomicBertModel"],
        "attn_pdrop": 0.0,
        "bos_token_id": None,
        "causal": False,
        "dense_seq_output": True,
        "embd_pdrop": 0.0,
        "eos_token_id": None,
        "fused_bias_fc": True,
        "fused_dropout_add_ln": True,
        "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-12,
        "max_trained_positions": 2048,
        "mlp_fc1_bias": False,
        "mlp_fc2_bias": False,
        "model_type": "nomic_bert",
        "n_embd": 32,
        "n_head": 4,
        "n_inner": 64,
        "n_layer": 2,
        "n_positions": 8192,
        "pad_vocab_size_multiple": VOCAB_MULTIPLE,
        "parallel_block": False,
        "parallel_block_tied_norm": False,
        "prenorm": False,
        "qkv_proj_bias": False,
        "reorder_and_upcast_attn": False,
        "resid_pdrop": 0.0,
        "rotary_emb_base": 1000,
        "rotary_emb_fraction": 1.0,
        "rotary_emb_interleaved": False,
        "rotary_emb_scale_base": None,
        "rotary_scaling_factor": None,
        "scale_attn_by_inverse_layer_idx": False,
        "scale_attn_weights": True,
        "summary_activation": None,
        "summary_first_dropout": 0.0,
        "summary_proj_to_labels": True,
        "summary_type": "cls_index",
        "summary_use_proj": True,
        "torch_dtype": "float32",
        "type_vocab_size": 2,
        "use_cache": True,
        "use_flash_attn": True,
        "use_rms_norm": False,
        "use_xentropy": True,
        "vocab_size": tokens // VOCAB_MULTIPLE * VOCAB_MULTIPLE + VOCAB_MULTIPLE,
    }


def nomic_tensors(cfg: dict[str, Any], draw: Draw) -> dict[str, np.ndarray]:
    """NomicBertModel's tensors in nomic's names ([out, in]); q and k drawn larger so that attention is not flat."""
    h, inter = cfg["n_embd"], cfg["n_inner"]
    t = {"embeddings.word_embeddings.weight": draw.normal(cfg["vocab_size"], h, std=1.0),
         "embeddings.token_type_embeddings.weight": draw.normal(cfg["type_vocab_size"], h, std=0.5),
         "emb_ln.weight": draw.norm(h), "emb_ln.bias": draw.normal(h, std=0.1)}
    for i in range(cfg["n_layer"]):
        p = f"encoder.layers.{i}."
        qk = draw.normal(2 * h, h, std=0.35)
        t.update({
            p + "attn.Wqkv.weight": np.concatenate([qk, draw.normal(h, h, std=0.2)]),
            p + "attn.out_proj.weight": draw.normal(h, h, std=0.2),
            p + "mlp.fc11.weight": draw.normal(inter, h, std=0.3),
            p + "mlp.fc12.weight": draw.normal(inter, h, std=0.3),
            p + "mlp.fc2.weight": draw.normal(h, inter, std=0.2),
            p + "norm1.weight": draw.norm(h), p + "norm1.bias": draw.normal(h, std=0.1),
            p + "norm2.weight": draw.norm(h), p + "norm2.bias": draw.normal(h, std=0.1),
        })
    return t


def make_tiny_nomic_bert(out: Path, _tok: Any = None) -> None:
    tok = train_wordpiece()
    write_wordpiece(out, tok)
    cfg = nomic_config(tok.get_vocab_size())
    kit.write_json(out / "config.json", cfg)
    kit.save_tensors(dict(sorted(nomic_tensors(cfg, Draw(35)).items())), out / "model.safetensors", "float32")
    write_sentence_transformers(out, [("1_Pooling", ST_POOLING), ("2_Normalize", ST_NORMALIZE)])
    kit.write_json(out / "1_Pooling" / "config.json", pooling_config(cfg["n_embd"], "mean_tokens"))


NOMIC_BUILDERS = {"tiny-nomic-bert": make_tiny_nomic_bert}
