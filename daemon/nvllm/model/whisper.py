"""Whisper (WhisperForConditionalGeneration) on the engine: `encode` turns a window's log-mel frames into the
decoder's cross-attention keys and values (whisper_encoder.py, whisper_cross.py), once per window; `forward`
runs the decoder over a packed batch as Model.forward runs an LLM's (model/decoder.py): prefill chunks and
decode rows of many sequences in one step, every linear layer one matmul for all of them, self-attention in the
paged KV pool (model/attention.py), logits only for the rows asked.

What differs from the LLM's decoder: learnt positions added to the token embeddings (no rope: the pool's
write goes through the rope kernel at angle 0, which only scales q and writes k and v), LayerNorm with biases
(pre-norm), biases on every projection but k, after self-attention a cross-attention to the sequence's own
window, an exact-GELU MLP, and logits from the token embedding (tied).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nvllm.model.attention import paged_attention, write_kv
from nvllm.model.decoder import ForwardBatch, NonFiniteLogits
from nvllm.model.encoder import gelu, layer_norm
from nvllm.model.kernels import ops
from nvllm.model.kv_cache import KVCache
from nvllm.model.kv_layout import KVLayout
from nvllm.model.quant.kv_format import F32, KVFormat
from nvllm.model.weights.whisper_files import read_whisper
from nvllm.model.weights.whisper_layout import WhisperWeights
from nvllm.model.whisper_config import LAYER_NORM_EPS, WhisperConfig
from nvllm.model.whisper_cross import CrossAttention, CrossKV
from nvllm.model.whisper_encoder import encode_states, linear
from nvllm.text.tokenizer import Tokenizer


class Whisper:
    task = "transcribe"

    def __init__(self, config: WhisperConfig, weights: WhisperWeights) -> None:
        self.config = config
        self.weights = weights
        c = config
        self.heads, self.head_dim = c.decoder_attention_heads, c.decoder_head_dim
        self.scale = float(self.head_dim ** -0.5)
        self.kv_layout = KVLayout.single(c.decoder_layers)
        # The format a window's cross keys and values are held in (f16 halves them; whisper_cross.py).
        self.cross_format: KVFormat = F32

    def make_kv_cache(self, num_blocks: int, block_size: int = 16, fmt: KVFormat = F32,
                      resident_blocks: int | None = None, layout: KVLayout | None = None) -> KVCache:
        """The decoder's self-attention pages (as Model.make_kv_cache: resident_blocks backed now, the rest by
        KVCache.back_blocks)."""
        c = self.config
        return KVCache(c.decoder_layers, num_blocks, block_size, self.heads, self.head_dim, fmt,
                       resident_blocks=resident_blocks, layout=layout or self.kv_layout)

    def encode(self, features: np.ndarray) -> CrossKV:
        """features [n_mels, 3000] (audio/features.log_mel of one 30-s window) -> the encoder, then every decoder
        layer's cross k and v of its states, in cross_format."""
        states = encode_states(self.weights, self.config, features)
        kv = [linear(layer.cross.kv, layer.cross.kv_bias, states) for layer in self.weights.decoder_layers]
        return CrossKV.from_projections(kv, self.heads, self.cross_format)

    def forward(self, batch: ForwardBatch, kv_cache: KVCache, cross: list[CrossKV]) -> np.ndarray:
        """The decoder over the batch (cross[i] the i-th sequence's window); logits [len(logits_indices), V]
        float32. Raises NonFiniteLogits where any is NaN or inf."""
        c, w = self.config, self.weights
        T, d = batch.token_ids.shape[0], c.d_model
        nh, hd = self.heads, self.head_dim
        if T and (batch.positions.min() < 0 or batch.positions.max() >= c.max_target_positions):
            raise ValueError(f"positions: Whisper's decoder takes up to {c.max_target_positions} tokens")
        x = w.embed.rows(batch.token_ids) + w.decoder_positions[batch.positions]      # [T, d]
        meta = batch.attn
        cross_attention = CrossAttention(meta, cross)
        write = None
        if ops.lib is not None:   # angle 0: the rope kernel scales q and writes k and v into the pool
            half = (T, hd // 2)
            write = ops.RopeWriteKV(np.ones(half, np.float32), np.zeros(half, np.float32), meta.slot_mapping, nh, nh,
                                    hd, self.scale)
        attn = np.empty((T, nh, hd), np.float32)
        for i, layer in enumerate(w.decoder_layers):
            a = layer.attn
            qkv = linear(a.qkv, a.qkv_bias, layer_norm(x, layer.attn_norm, LAYER_NORM_EPS))    # [T, 3d]
            kv_pool = kv_cache.layer(i)
            k, v = qkv[:, d:2 * d].reshape(T, nh, hd), qkv[:, 2 * d:].reshape(T, nh, hd)
            if write is not None:
                write(qkv, kv_pool)
            else:
                qkv[:, :d] *= np.float32(self.scale)
                write_kv(kv_pool[0], kv_pool[1], k, v, meta.slot_mapping)
            paged_attention(qkv[:, :d].reshape(T, nh, hd), k, v, kv_pool, meta, out=attn)
            x += linear(a.o, a.o_bias, attn.reshape(T, d))
            x_ = layer.cross
            q = linear(x_.q, x_.q_bias, layer_norm(x, layer.cross_norm, LAYER_NORM_EPS))
            q *= np.float32(self.scale)
            x += linear(x_.o, x_.o_bias, cross_attention(i, q.reshape(T, nh, hd), attn).reshape(T, d))
            f = layer.ffn
            x += linear(f.fc2, f.fc2_bias, gelu(linear(f.fc1, f.fc1_bias, layer_norm(x, layer.ffn_norm,
                                                                                       LAYER_NORM_EPS))))
        last = layer_norm(np.ascontiguousarray(x[batch.logits_indices]), w.decoder_norm, LAYER_NORM_EPS)
        logits = w.embed.apply(last)
        if not np.isfinite(logits).all():
            raise NonFiniteLogits(np.flatnonzero(~np.isfinite(logits).all(axis=1)), logits.shape[0])
        return logits


def load_whisper(path: Path | str, quantization: str | None = None) -> tuple[Whisper, Tokenizer]:
    """Whisper from a Hugging Face folder, a CTranslate2 folder or a whisper.cpp ggml file
    (weights/whisper_files.py), and its tokenizer (with the timestamp tokens)."""
    config, weights, tokenizer = read_whisper(Path(path), quantization)
    return Whisper(config, weights), tokenizer
