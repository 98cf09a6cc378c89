"""tiny-gemma3 for make_test_models.py: Gemma3ForCausalLM as transformers
writes its config (layer_types, rope_parameters per layer type), six layers of which the sixth is global
(llama.cpp's fixed pattern, so the GGUF form agrees), a sliding window of 8 so the 64-token golden
prompts run far past it, linear rope scaling on the global layer (the 4B's factor 8), bfloat16, tied; its
writers are tiny_kit.py's."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import tiny_kit as kit

CONFIG: dict[str, Any] = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "head_dim": 32,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 64,
    "intermediate_size": 128,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
    "max_position_embeddings": 512,
    "num_attention_heads": 4,
    "num_hidden_layers": 6,
    "num_key_value_heads": 2,
    "query_pre_attn_scalar": 32,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {"full_attention": {"factor": 8.0, "rope_theta": 1000000.0, "rope_type": "linear"},
                        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
    "sliding_window": 8,
    "tie_word_embeddings": True,
    "use_bidirectional_attention": False,
    "use_cache": True,
    "dtype": "bfloat16",
}


def tensors(cfg: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    """Every tensor in HF names, [out, in]; norm weights near 0, as Gemma's (1 + w) RMSNorm is trained."""
    rng = np.random.default_rng(seed)
    h, inter, d, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"], cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d

    def normal(*shape: int, std: float = 0.08) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    t = {"model.embed_tokens.weight": normal(v, h, std=0.12)}   # tied: logits of a spread of order one
    for i in range(cfg["num_hidden_layers"]):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        t.update({a + "q_proj.weight": normal(q, h), a + "k_proj.weight": normal(kv, h),
                  a + "v_proj.weight": normal(kv, h), a + "o_proj.weight": normal(h, q),
                  a + "q_norm.weight": normal(d, std=0.2), a + "k_norm.weight": normal(d, std=0.2),
                  p + "mlp.gate_proj.weight": normal(inter, h), p + "mlp.up_proj.weight": normal(inter, h),
                  p + "mlp.down_proj.weight": normal(h, inter)})
        for norm in ("input", "post_attention", "pre_feedforward", "post_feedforward"):
            t[p + f"{norm}_layernorm.weight"] = normal(h, std=0.2)
    t["model.norm.weight"] = normal(h, std=0.2)
    return t


def make(out: Path, tok: Any) -> None:
    cfg = {**CONFIG, "vocab_size": tok.get_vocab_size(), "bos_token_id": kit.IM_START_ID,
           "eos_token_id": kit.IM_END_ID, "pad_token_id": kit.ENDOFTEXT_ID}
    kit.write_json(out / "config.json", cfg)
    kit.write_json(out / "generation_config.json",
                   {"bos_token_id": kit.IM_START_ID, "eos_token_id": kit.IM_END_ID, "pad_token_id": kit.ENDOFTEXT_ID})
    kit.write_tokenizer(out, tok, bos_token="<|im_start|>")
    kit.save_tensors(dict(sorted(tensors(cfg, seed=6).items())), out / "model.safetensors", "bfloat16")
