"""The encoder (BERT, XLM-RoBERTa, NomicBert) over a packed batch of whole sequences: embeddings (word, absolute
position, token type) and their LayerNorm, then post-norm layers of bidirectional attention (every token of
a sequence sees all of its sequence, none of another) and a GELU MLP. NomicBert differs where its config says:
rotary positions on q and k in place of the position table, a SwiGLU MLP, no biases. Nothing is cached: a
sequence is computed in the one step that takes it whole, and what leaves the model is one vector per sequence
(the pooler's, model/pooler.py) or, for a cross-encoder, its classifier's score.

Every linear layer is one matmul for all tokens of the step; attention runs in C on the kernels' thread team,
a tile of a sequence's queries and one head a task (kernels/encoder_attention.py), and BERT's GELU in C
(ops.gelu_erf).
"""

from __future__ import annotations

import math

import numpy as np

from nvllm.model.decoder import ForwardBatch
from nvllm.model.encoder_config import EncoderConfig
from nvllm.model.kernels import matmul, ops, threads
from nvllm.model.kernels.encoder_attention import encoder_attention
from nvllm.model.kv_cache import KVCache
from nvllm.model.kv_layout import KVLayout
from nvllm.model.pooler import Pooling
from nvllm.model.quant.kv_format import F32, KVFormat
from nvllm.model.weights.encoder_layout import EncoderWeights

# Abramowitz and Stegun 7.1.26: erf within 1.5e-7 of the true value (NumPy has no erf).
_P = np.float32(0.3275911)
_A = [np.float32(a) for a in (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)]


def erf(x: np.ndarray) -> np.ndarray:
    ax = np.abs(x)
    t = np.float32(1.0) / (np.float32(1.0) + _P * ax)
    poly = ((((_A[4] * t + _A[3]) * t + _A[2]) * t + _A[1]) * t + _A[0]) * t
    return np.copysign(np.float32(1.0) - poly * np.exp(-ax * ax), x)


def gelu(x: np.ndarray) -> np.ndarray:
    """transformers' "gelu": x * (1 + erf(x / sqrt 2)) / 2, in place (in C where built: the same formula)."""
    if ops.lib is not None and x.flags.c_contiguous:
        return ops.gelu_erf(x)
    e = erf(x * np.float32(1 / math.sqrt(2)))
    e += np.float32(1.0)
    x *= e
    x *= np.float32(0.5)
    return x


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), in place (exp's argument capped: past 80 the product is 0 in float32 either way)."""
    s = np.exp(-np.maximum(x, np.float32(-80.0)))
    s += np.float32(1.0)
    x /= s
    return x


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> None:
    """Rotary positions on x [T, heads, d] in place (d = 2 * cos's last axis): NeoX's halves (x[i] with
    x[i + d/2]), or adjacent pairs where interleaved. cos, sin: [T, 1, d/2]."""
    half = x.shape[-1] // 2
    a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., :half], x[..., half:])
    a0 = a.copy()
    a *= cos
    a -= b * sin
    b *= cos
    b += a0 * sin


def layer_norm(x: np.ndarray, norm: tuple[np.ndarray, np.ndarray], eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    d = x - mean
    var = np.einsum("th,th->t", d, d)[:, None] / np.float32(x.shape[-1])
    d *= np.float32(1.0) / np.sqrt(var + np.float32(eps))
    d *= norm[0]
    d += norm[1]
    return d


class Encoder:
    """A BERT-family model: `pool(batch)` gives each sequence's vector (embedding) or score (cross-encoder)."""

    def __init__(self, config: EncoderConfig, weights: EncoderWeights, pooling: Pooling) -> None:
        self.config = config
        self.weights = weights
        self.pooling = pooling
        self.scale = np.float32(config.head_dim ** -0.5)
        d = config.rotary_dim
        self.inv_freq = (1.0 / config.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d)) if d else None
        # Whether a pair's second segment reads its own token-type row: False for a GGUF, as llama.cpp reads it.
        self.token_types = True

    @property
    def task(self) -> str:
        return "rerank" if self.config.head else "embed"

    @property
    def output_size(self) -> int:
        return self.config.num_labels if self.config.head else self.pooling.size(self.config.hidden_size)

    def make_kv_cache(self, num_blocks: int, block_size: int = 16, fmt: KVFormat = F32,
                      resident_blocks: int | None = None, layout: KVLayout | None = None) -> KVCache:
        """A pool of no layers: its pages hold nothing and only count a running sequence's tokens, so that
        admission and the token budget work as for any model."""
        return KVCache(0, num_blocks, block_size, 1, 8, fmt, layout=KVLayout.single(0))

    def hidden(self, batch: ForwardBatch) -> np.ndarray:
        """The last layer's token states [T, H] for a batch of whole sequences (query_lens are their lengths,
        positions count from 0 in each)."""
        c, w = self.config, self.weights
        T, H, nh, hd = batch.token_ids.shape[0], c.hidden_size, c.num_heads, c.head_dim
        lens = batch.attn.query_lens
        if (batch.positions >= c.max_tokens).any():
            raise ValueError(f"positions: {c.architecture} takes sequences of up to {c.max_tokens} tokens")
        types = batch.token_types if batch.token_types is not None and self.token_types else np.zeros(T, np.int64)
        if types.size and (types.min() < 0 or types.max() >= c.type_vocab_size):
            raise ValueError(f"token_types: need ids below the model's type_vocab_size {c.type_vocab_size}")
        x = w.embed.rows(batch.token_ids)
        if w.positions is not None:
            x += w.positions.rows(batch.positions + c.position_offset)
        x += w.token_types.rows(types)
        rope = self._rope(batch.positions)
        x = layer_norm(x, w.embed_norm, c.layer_norm_eps)
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        attn = np.empty((T, H), np.float32)
        for layer in w.layers:
            qkv = layer.qkv.apply(x)
            if layer.qkv_bias is not None:
                qkv += layer.qkv_bias
            if rope is not None:   # q and k of every head, their first rotary_dim values
                qk = qkv.reshape(T, 3 * nh, hd)[:, :2 * nh, :c.rotary_dim]
                rotate(qk, *rope, c.rope_interleaved)
            self._attention(qkv, starts, lens, attn)
            out = layer.o.apply(attn)
            if layer.o_bias is not None:
                out += layer.o_bias
            out += x
            x = layer_norm(out, layer.attn_norm, c.layer_norm_eps)
            up = layer.up.apply(x)
            if layer.up_bias is not None:
                up += layer.up_bias
            if c.mlp == "swiglu":   # gate then up
                act = silu(up[:, :c.intermediate_size])
                act *= up[:, c.intermediate_size:]
            else:
                act = gelu(up)
            out = layer.down.apply(np.ascontiguousarray(act))
            if layer.down_bias is not None:
                out += layer.down_bias
            out += x
            x = layer_norm(out, layer.ffn_norm, c.layer_norm_eps)
        return x

    def _attention(self, qkv: np.ndarray, starts: np.ndarray, lens: np.ndarray, attn: np.ndarray) -> None:
        """qkv [T, 3H] -> attn [T, H]: each sequence's tokens see all of it. In C on the kernels' thread team
        where built (kernels/encoder_attention.py); the NumPy twin calls BLAS per sequence, whose threads then
        spin on the cores the next matmul wants."""
        c = self.config
        nh, hd = c.num_heads, c.head_dim
        if ops.lib is not None and matmul.lib is not None:
            encoder_attention(qkv, starts, lens, nh, hd, float(self.scale), attn, threads.count, matmul.team_run)
            return
        for a, n in zip(starts, lens):
            q, k, v = qkv[a:a + n].reshape(n, 3, nh, hd).transpose(1, 2, 0, 3)   # [nh, n, hd] each
            scores = np.matmul(q * self.scale, k.transpose(0, 2, 1))                # [nh, n, n]
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            attn[a:a + n] = np.matmul(scores, v).transpose(1, 0, 2).reshape(n, nh * hd)

    def _rope(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """cos and sin [T, 1, rotary_dim / 2] of each token's position (None without rotary positions);
        the angles in float64, as float32 loses ~1e-4 of them at a few thousand tokens."""
        if self.inv_freq is None:
            return None
        angles = positions.astype(np.float64)[:, None, None] * self.inv_freq
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

    def pool(self, batch: ForwardBatch, kv_cache: KVCache | None = None,
             dimensions: list[int | None] | None = None) -> list[np.ndarray]:
        """One vector per sequence of the batch: its pooled embedding, or its classifier's scores (the raw
        logits, [num_labels]) for a cross-encoder. kv_cache: unused (nothing is cached), as Model.pool takes it."""
        x = self.hidden(batch)
        lens = batch.attn.query_lens
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        head = self.weights.head
        if head is None:
            return self.pooling(x, starts, lens, dimensions)
        h = np.ascontiguousarray(x[starts])
        if head.dense is not None:
            h = head.dense.apply(h)
            if head.dense_bias is not None:
                h += head.dense_bias
            h = np.tanh(h)
        scores = head.out.apply(h)
        scores += head.out_bias
        return list(scores)
