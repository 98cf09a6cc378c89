"""llama.cpp's tensor names and row order -> Hugging Face's (Llama's, with Qwen2's biases and Qwen3's q/k
norms; BERT's and NomicBert's for an encoder), for the GGUF reader and `nvllm models pull`'s conversion alike."""
from __future__ import annotations

import numpy as np

from nvllm.model.weights.gguf_reader import GGUFError

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_qkv": "self_attn.qkv_proj",    # phi3: q|k|v fused, as its checkpoint stores them
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Gemma 3's norms under llama.cpp's names: its ffn_norm is the pre-feedforward norm, not Llama's post-attention.
_GEMMA3_LAYER_NAMES = {**_LAYER_NAMES, "post_attention_norm": "post_attention_layernorm",
                       "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's llama3 rope scaling: one divisor per frequency
# phi3's longrope: one divisor per frequency past the original context, and one within it
ROPE_FACTORS = ("rope_factors_long.weight", "rope_factors_short.weight")
ROPE_TABLES = (ROPE_FREQS, *ROPE_FACTORS)   # tensors that are rope's parameters, not weights


def hf_tensor_name(gguf_name: str, arch: str = "llama") -> str:
    """llama.cpp tensor name -> Hugging Face name (Llama's, plus Qwen2's biases and Qwen3's q/k norms; phi3's
    fused attn_qkv, and its ffn_up, which holds gate|up as Phi-3's gate_up_proj does; a gemma3 file's own
    norms)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    names = _GEMMA3_LAYER_NAMES if arch == "gemma3" else _LAYER_NAMES
    parts = gguf_name.split(".")  # blk.N.attn_q.weight
    if arch == "phi3" and len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] == "ffn_up":
        return f"model.layers.{int(parts[1])}.mlp.gate_up_proj.{parts[3]}"
    if (len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in names
            and parts[3] in ("weight", "bias")):
        return f"model.layers.{int(parts[1])}.{names[parts[2]]}.{parts[3]}"
    raise GGUFError(f"unexpected GGUF tensor {gguf_name!r}: nvllm knows Llama only "
                    "(with Qwen2's q/k/v biases and Qwen3's q/k norms)")


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order so rotate_half RoPE applies, as in the HF checkpoint.

    llama.cpp rotates adjacent pairs (x0, x1), (x2, x3)...; HF rotates x[i] with x[i + d/2].
    Its converter therefore interleaves each head's rows: GGUF row 2*i + j is HF row j*d/2 + i.
    """
    rows = w.shape[0]
    d = rows // n_heads
    # [H*d, in] -> [H, d/2, 2, in] -> [H, 2, d/2, in] -> [H*d, in]  (a bias [H*d] has in = 1)
    return np.ascontiguousarray(w.reshape(n_heads, d // 2, 2, -1).swapaxes(1, 2).reshape(w.shape))



# BERT under llama.cpp's names (its converter's map, read backwards): BertModel's own names, unprefixed.
_BERT_GLOBAL_NAMES = {
    "token_embd.weight": "embeddings.word_embeddings.weight",
    "position_embd.weight": "embeddings.position_embeddings.weight",
    "token_types.weight": "embeddings.token_type_embeddings.weight",
    "token_embd_norm.weight": "embeddings.LayerNorm.weight",
    "token_embd_norm.bias": "embeddings.LayerNorm.bias",
    "cls.weight": "pooler.dense.weight",       # a classifier's dense before tanh: llama.cpp's `cls`
    "cls.bias": "pooler.dense.bias",
    "cls.output.weight": "classifier.weight",  # the classifier itself: llama.cpp's `cls_out`
    "cls.output.bias": "classifier.bias",
}
_BERT_LAYER_NAMES = {
    "attn_q": "attention.self.query",
    "attn_k": "attention.self.key",
    "attn_v": "attention.self.value",
    "attn_output": "attention.output.dense",
    "attn_output_norm": "attention.output.LayerNorm",
    "ffn_up": "intermediate.dense",
    "ffn_down": "output.dense",
    "layer_output_norm": "output.LayerNorm",
}


def bert_tensor_name(gguf_name: str) -> str:
    """llama.cpp tensor name of a bert GGUF -> BertModel's (BertForSequenceClassification's head:
    classifier, and its pooler where the file has one)."""
    return _encoder_name(gguf_name, _BERT_GLOBAL_NAMES, _BERT_LAYER_NAMES, "encoder.layer", "bert")


def _encoder_name(gguf_name: str, global_names: dict[str, str], layer_names: dict[str, str], layers: str,
                  arch: str) -> str:
    """A tensor's name by the tables: a global one's, or blk.N.<kind>.weight|bias -> <layers>.N.<name>.<kind>."""
    if gguf_name in global_names:
        return global_names[gguf_name]
    parts = gguf_name.split(".")  # blk.N.attn_q.weight
    if (len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in layer_names
            and parts[3] in ("weight", "bias")):
        return f"{layers}.{int(parts[1])}.{layer_names[parts[2]]}.{parts[3]}"
    raise GGUFError(f"unexpected tensor {gguf_name!r} in a {arch} GGUF")


# NomicBert under llama.cpp's names (its converter's map, read backwards): nomic's own names. ffn_up is fc11, the
# SwiGLU's up; ffn_gate is fc12, the half that goes through silu.
_NOMIC_GLOBAL_NAMES = {
    "token_embd.weight": "embeddings.word_embeddings.weight",
    "token_types.weight": "embeddings.token_type_embeddings.weight",
    "token_embd_norm.weight": "emb_ln.weight",
    "token_embd_norm.bias": "emb_ln.bias",
}
_NOMIC_LAYER_NAMES = {
    "attn_qkv": "attn.Wqkv",
    "attn_output": "attn.out_proj",
    "attn_output_norm": "norm1",
    "ffn_up": "mlp.fc11",
    "ffn_gate": "mlp.fc12",
    "ffn_down": "mlp.fc2",
    "layer_output_norm": "norm2",
}


def nomic_bert_tensor_name(gguf_name: str) -> str:
    """llama.cpp tensor name of a nomic-bert GGUF -> NomicBertModel's (nomic's checkpoint names)."""
    return _encoder_name(gguf_name, _NOMIC_GLOBAL_NAMES, _NOMIC_LAYER_NAMES, "encoder.layers", "nomic-bert")
