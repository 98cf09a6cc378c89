"""The decoder's weights as every reader lays them out: which tensors make each matrix (q|k|v and gate|up
fused), and the one function that asks a reader for them (a folder's, weights/folder.py, or a GGUF's,
weights/gguf_weights.py, alike)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from nvllm.model.config import ModelConfig, ModelLoadError
from nvllm.model.matrix.weight import Weight

Parts = list[tuple[str, tuple[int, ...]]]   # tensors fused into one, by Hugging Face name, [out, in] each


@dataclass
class LayerWeights:
    """A layer's weights: the matrices as Weights (out, in), whatever their storage; the norms and biases
    float32 arrays."""
    input_norm: np.ndarray     # [H]
    qkv: Weight                # ((nh + 2*nkv) * hd, H), q then k then v
    qkv_bias: np.ndarray | None  # [(nh + 2*nkv) * hd]
    o: Weight                  # (H, nh * hd)
    post_norm: np.ndarray      # [H]
    gate_up: Weight            # (2 * I, H), gate then up
    down: Weight               # (H, I)
    q_norm: np.ndarray | None = None  # [hd], Qwen3: every q head is RMS-normed with it before rope
    k_norm: np.ndarray | None = None  # [hd], likewise every k head
    attn_out_norm: np.ndarray | None = None  # [H], Gemma 3: the attention's output is RMS-normed with it
    ffn_out_norm: np.ndarray | None = None   # [H], likewise the MLP's (post_norm is its pre-feedforward norm)


@dataclass
class ModelWeights:
    embed: Weight              # (V, H): a token's row is gathered by Weight.rows, in place
    layers: list[LayerWeights]
    norm: np.ndarray           # [H]
    lm_head: Weight            # (V, H); for tied embeddings embed itself, no copy

    @property
    def nbytes(self) -> int:
        """Bytes the weights hold in memory, each shared buffer once (a tied lm_head is embed's)."""
        total = self.embed.nbytes + self.norm.nbytes
        total += sum(v.nbytes for layer in self.layers for v in vars(layer).values() if v is not None)
        if not self.lm_head.shares_memory(self.embed):
            total += self.lm_head.nbytes
        return total


class TensorReader(Protocol):
    """What lay_out asks of a reader: a tensor by name, several fused along their first axis, and `in`.
    A 2-D result is a Weight, in the storage the reader chooses; a 1-D one a float32 array."""

    def __contains__(self, name: str) -> bool: ...

    def get(self, name: str, shape: tuple[int, ...]) -> Any: ...

    def joined(self, parts: Parts) -> Any: ...


def layer_matrices(config: ModelConfig, n: int) -> dict[str, Parts]:
    """Layer n's matrices as the tensors fused into each, [out, in] each: q|k|v, o, gate|up, down."""
    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    a, p = f"model.layers.{n}.self_attn.", f"model.layers.{n}."
    kv = config.num_kv_heads * d
    if config.architecture == "Phi3ForCausalLM":   # Phi-3 stores q|k|v and gate|up fused, in that order
        return {"qkv": [(a + "qkv_proj.weight", (config.num_heads * d + 2 * kv, h))],
                "o": [(a + "o_proj.weight", (h, config.num_heads * d))],
                "gate_up": [(p + "mlp.gate_up_proj.weight", (2 * i, h))],
                "down": [(p + "mlp.down_proj.weight", (h, i))]}
    return {"qkv": [(a + "q_proj.weight", (config.num_heads * d, h)), (a + "k_proj.weight", (kv, h)),
                    (a + "v_proj.weight", (kv, h))],
            "o": [(a + "o_proj.weight", (h, config.num_heads * d))],
            "gate_up": [(p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h))],
            "down": [(p + "mlp.down_proj.weight", (h, i))]}


def lay_out(t: TensorReader, config: ModelConfig, model_dir: Path) -> ModelWeights:
    """The weights in the decoder's layout, from `t` (Hugging Face tensor names)."""
    h, d = config.hidden_size, config.head_dim
    nh, nkv, v = config.num_heads, config.num_kv_heads, config.vocab_size

    layers = []
    for n in range(config.num_layers):
        p = f"model.layers.{n}."
        a = p + "self_attn."
        m = layer_matrices(config, n)
        bias = None
        if config.attention_bias:
            bias = t.joined([(a + "q_proj.bias", (nh * d,)), (a + "k_proj.bias", (nkv * d,)),
                             (a + "v_proj.bias", (nkv * d,))])
        q_norm = k_norm = None
        if config.qk_norm:
            q_norm, k_norm = t.get(a + "q_norm.weight", (d,)), t.get(a + "k_norm.weight", (d,))
        layers.append(LayerWeights(
            input_norm=t.get(p + "input_layernorm.weight", (h,)),
            qkv=t.joined(m["qkv"]),
            qkv_bias=bias,
            o=t.joined(m["o"]),
            post_norm=t.get(p + "post_attention_layernorm.weight", (h,)),
            gate_up=t.joined(m["gate_up"]),
            down=t.joined(m["down"]),
            q_norm=q_norm,
            k_norm=k_norm,
        ))
    if config.post_norms:
        layers = [_gemma3_norms(t, config, n, layer) for n, layer in enumerate(layers)]
    embed = t.get("model.embed_tokens.weight", (v, h))
    if config.tie_word_embeddings or "lm_head.weight" not in t:
        if not config.tie_word_embeddings:
            raise ModelLoadError(f"{model_dir}: tensor 'lm_head.weight' is missing and embeddings are not tied")
        lm_head = embed
    else:
        lm_head = t.get("lm_head.weight", (v, h))
    norm = t.get("model.norm.weight", (h,)) + np.float32(config.norm_offset)
    return ModelWeights(embed=embed, layers=layers, norm=norm, lm_head=lm_head)


def _gemma3_norms(t: TensorReader, config: ModelConfig, n: int, layer: LayerWeights) -> LayerWeights:
    """Gemma 3's four norms per layer (input, post_attention on the attention's output, pre_feedforward
    as post_norm, post_feedforward on the MLP's output), and its q/k norms, each with norm_offset added
    once here (a folder stores w for RMSNorm's 1 + w; llama.cpp's converter stores 1 + w, offset 0)."""
    p, h, one = f"model.layers.{n}.", config.hidden_size, np.float32(config.norm_offset)
    assert layer.q_norm is not None and layer.k_norm is not None   # config.qk_norm is set with post_norms
    return replace(layer, input_norm=layer.input_norm + one, q_norm=layer.q_norm + one, k_norm=layer.k_norm + one,
                   post_norm=t.get(p + "pre_feedforward_layernorm.weight", (h,)) + one,
                   attn_out_norm=layer.post_norm + one,
                   ffn_out_norm=t.get(p + "post_feedforward_layernorm.weight", (h,)) + one)
