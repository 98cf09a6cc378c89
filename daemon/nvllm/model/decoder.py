"""The decoder-only transformer (Llama, Qwen2, Qwen3, Phi-3, SmolLM3, Gemma 3) over a packed batch: embed,
RMSNorm, RoPE, paged attention, SwiGLU, lm_head only where logits are asked for. Every linear layer is one
matmul for all tokens of all sequences in the step. Qwen3 also RMS-norms each head of q and k before rope;
Phi-4-mini ropes only the first rotary_dim dims of each head (longrope scaled); SmolLM3 skips rope on its
NoPE layers. Gemma 3 adds norms on the attention's and the MLP's outputs, GeGLU, a scaled embedding, and
sliding-window layers with a rope of their own beside its global ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nvllm.model.attention import AttentionMetadata, paged_attention, write_kv
from nvllm.model.config import ModelConfig, layer_rope, rope_inv_freq
from nvllm.model.kernels import matmul, ops, threads
from nvllm.model.kernels.prefill import PagedPrefill
from nvllm.model.kernels.step import LayerSpec, StepLayers
from nvllm.model.kv_cache import KVCache
from nvllm.model.kv_layout import KVLayout
from nvllm.model.matrix.weight import DECODE_ROWS
from nvllm.model.pooler import Pooling
from nvllm.model.quant.kv_format import F32, KVFormat
from nvllm.model.weights.folder import load_weights
from nvllm.model.weights.layout import ModelWeights
from nvllm.model.workspace import Workspace


class NonFiniteLogits(RuntimeError):
    """The forward pass made NaN or inf logits (a model that diverges, or broken weights). Nothing can be
    sampled from them; the engine fails the step's requests and goes on."""

    def __init__(self, rows: np.ndarray, num_rows: int) -> None:
        self.rows = [int(r) for r in rows]
        shown = ", ".join(map(str, self.rows[:8])) + (", ..." if len(self.rows) > 8 else "")
        super().__init__(f"non-finite logits (NaN or inf) in row(s) {shown} of {num_rows}: the model's "
                         f"forward pass diverged")


@dataclass
class ForwardBatch:
    token_ids: np.ndarray       # [T] int64, sequences contiguous
    positions: np.ndarray       # [T] int64
    attn: AttentionMetadata     # group 0's (kv_layout.py); the only one for most models
    logits_indices: np.ndarray  # [R] int64: rows of T whose logits are wanted
    groups: list[AttentionMetadata] = field(default_factory=list)   # every group's, attn first
    token_types: np.ndarray | None = None   # [T] int64, an encoder's segment ids (None: all 0)

    def __post_init__(self) -> None:
        if not self.groups:
            self.groups = [self.attn]

    @classmethod
    def build(cls, token_ids: np.ndarray, positions: np.ndarray, slot_mapping: np.ndarray | Sequence[np.ndarray],
              query_lens: np.ndarray, context_lens: np.ndarray, block_tables: np.ndarray | Sequence[np.ndarray],
              logits_indices: np.ndarray) -> ForwardBatch:
        """slot_mapping and block_tables: one array, or one per group of the pool's layout (kv_layout.py)."""
        positions = np.asarray(positions, dtype=np.int64)
        qlens, clens = np.asarray(query_lens, dtype=np.int64), np.asarray(context_lens, dtype=np.int64)
        slots = [slot_mapping] if isinstance(slot_mapping, np.ndarray) else list(slot_mapping)
        tables = [block_tables] if isinstance(block_tables, np.ndarray) else list(block_tables)
        if len(slots) != len(tables):
            raise ValueError(f"slot_mapping, block_tables: need one of each per group, got {len(slots)} and "
                             f"{len(tables)}")
        groups = [AttentionMetadata(slot_mapping=np.asarray(sm, dtype=np.int64), query_lens=qlens, context_lens=clens,
                                    block_tables=np.asarray(bt, dtype=np.int32), positions=positions)
                  for sm, bt in zip(slots, tables)]
        return cls(np.asarray(token_ids, dtype=np.int64), positions, groups[0],
                   np.asarray(logits_indices, dtype=np.int64), groups)


def _into(y: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """The NumPy paths' result, copied into out where one is given."""
    if out is None:
        return y
    out[...] = y
    return out


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray | None = None) -> np.ndarray:
    if ops.lib is not None:
        return ops.rms_norm(x, weight, eps, out)
    var = np.einsum("th,th->t", x, x)[:, None] / np.float32(x.shape[-1])  # [T, 1]
    return _into(x * (1.0 / np.sqrt(var + np.float32(eps))) * weight, out)


def silu_mul(gate_up: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """SwiGLU's silu(gate) * up for gate_up [T, 2I] -> [T, I]."""
    if ops.lib is not None:
        return ops.silu_mul(gate_up, out)
    gate, up = np.split(gate_up, 2, axis=1)
    return _into(gate / (1.0 + np.exp(-gate)) * up, out)


def rope_order(config: ModelConfig) -> np.ndarray:
    """The q|k columns [(nh+nkv)*hd] in the order that puts a partial rotary's pairs (i, i + rd/2) hd/2 apart:
    per head, the rotated first half, the first half of the dims passed through, the rotated second half,
    then the rest."""
    hd, rd = config.head_dim, config.rope_dim
    half, rest = rd // 2, (hd - rd) // 2
    head = np.concatenate([np.arange(half), rd + np.arange(rest), half + np.arange(half), rd + rest + np.arange(rest)])
    heads = config.num_heads + config.num_kv_heads
    return (np.arange(heads)[:, None] * hd + head[None, :]).ravel().astype(np.int64)


def gelu_tanh_mul(gate_up: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """GeGLU's gelu_pytorch_tanh(gate) * up for gate_up [T, 2I] -> [T, I], in float32."""
    if ops.lib is not None:
        return ops.gelu_tanh_mul(gate_up, out)
    gate, up = np.split(gate_up, 2, axis=1)
    inner = np.float32(math.sqrt(2.0 / math.pi)) * (gate + np.float32(0.044715) * gate * gate * gate)
    return _into(np.float32(0.5) * gate * (np.float32(1.0) + np.tanh(inner)) * up, out)


class Model:
    def __init__(self, config: ModelConfig, weights: ModelWeights) -> None:
        self.config = config
        self.weights = weights
        # "generate"; a decoder embedder ("embed": pooling set) or a Qwen3-Reranker ("rerank": judge_tokens, the
        # ids of "no" and "yes") when its files or model.task say so (engine/assembly/pooling_model.py)
        self.task = "generate"
        self.pooling: Pooling | None = None
        self.judge_tokens: tuple[int, int] | None = None
        c = config
        self.q_size = c.num_heads * c.head_dim
        self.kv_size = c.num_kv_heads * c.head_dim
        self.scale = float(c.head_dim ** -0.5)
        if c.query_pre_attn_scalar is not None:   # Gemma 3: its own scalar, not head_dim
            self.scale = float(c.query_pre_attn_scalar ** -0.5)
        self.inv_freq = rope_inv_freq(c)  # [rope_dim/2] float32
        longrope = c.rope_scaling is not None and c.rope_scaling.get("rope_type") == "longrope"
        self.long_inv_freq = rope_inv_freq(c, long=True) if longrope else None
        self.long_rope = False
        self.set_context(c.max_position_embeddings)
        # Partial rotary on the C rope, which pairs x[i] with x[i + hd/2]: each q and k head's columns are
        # reordered (rope_order) so that its rotary pairs sit hd/2 apart, the dims passed through beside them
        # rotated by angle 0. q.k is the same sum in another order; v is not moved.
        self.rope_perm = rope_order(c) if c.rope_dim != c.head_dim else None
        # Sliding layers with a rope of their own (Gemma 3): its frequencies, else None (one rope for all).
        self.local_inv_freq = (rope_inv_freq(layer_rope(c, True))
                               if any(c.sliding_layers) and c.rope_local_theta is not None else None)
        # Which pages each layer's keys and values go in (one group, or Gemma 3's sliding and global groups).
        self.kv_layout = KVLayout.of(c)
        # Steps run their layers in one C call (kernels/step.py) where every matrix allows it, decode and
        # prefill alike; False runs them layer by layer here, the twin the tests hold it to.
        self.layers_in_c = True
        # Each step's activations, in arrays made once (the engine reserves its budget's worth).
        self.workspace = Workspace(c)
        # by what the matrices multiply in C for the step's rows (_step_layers): (pool, plan)
        self._steps: dict[tuple[bool, bool, bool], tuple[np.ndarray, StepLayers | None]] = {}

    def set_context(self, max_model_len: int) -> None:
        """longrope's factors for every position, chosen once by the longest sequence served (as vLLM and
        llama.cpp choose them): the long ones past the original context, else the short. transformers
        chooses by each sequence's length, which would make a sequence's keys depend on its chunking."""
        s = self.config.rope_scaling
        self.long_rope = (self.long_inv_freq is not None and s is not None
                          and max_model_len > s["original_max_position_embeddings"])

    @classmethod
    def from_dir(cls, model_dir: str | Path, quantization: str = "") -> Model:
        """A Hugging Face folder's model; quantization as load_weights takes it (model.quantization)."""
        config, weights = load_weights(model_dir, quantization=quantization)
        return cls(config, weights)

    def make_kv_cache(self, num_blocks: int, block_size: int = 16, fmt: KVFormat = F32,
                      resident_blocks: int | None = None, layout: KVLayout | None = None) -> KVCache:
        """resident_blocks: back only the first so many blocks now (KVCache.back_blocks the rest).
        layout: the layers' groups (None: the model's, kv_layout)."""
        c = self.config
        return KVCache(c.num_layers, num_blocks, block_size, c.num_kv_heads, c.head_dim, fmt,
                       resident_blocks=resident_blocks, layout=layout or self.kv_layout)

    def _rope_tables(self, positions: np.ndarray, inv_freq: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        if inv_freq is None:
            inv_freq = self.long_inv_freq if self.long_rope and self.long_inv_freq is not None else self.inv_freq
        freqs = positions.astype(np.float32)[:, None] * inv_freq[None, :]       # [T, rope_dim/2]
        s = self.config.rope_scaling
        if s is None or s.get("rope_type") != "longrope":
            return np.cos(freqs), np.sin(freqs)
        f = np.float32(s["attention_factor"])                                   # longrope scales cos and sin
        return np.cos(freqs) * f, np.sin(freqs) * f

    def _rotate(self, qkv: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """NumPy path: rotary embedding of q and k in qkv [T, (nh+2nkv)*hd], as transformers' rotate_half
        does for Llama, Qwen2 and Qwen3; q also takes the softmax scale, so scores need no pass of their own.
        Returns q [T, nh, hd] and k [T, nkv, hd]."""
        c = self.config
        T, nh, nkv, hd = qkv.shape[0], c.num_heads, c.num_kv_heads, c.head_dim
        head_scale = np.concatenate([np.full(nh, self.scale, np.float32), np.ones(nkv, np.float32)])
        cs, sn = cos[:, None, :] * head_scale[:, None], sin[:, None, :] * head_scale[:, None]
        x = qkv[:, :self.q_size + self.kv_size].reshape(T, nh + nkv, hd)
        rd = cos.shape[1] * 2                                                    # rope_dim: hd, or Phi-4's part
        x1, x2 = x[..., :rd // 2], x[..., rd // 2:rd]                             # [T, nh+nkv, rd/2] each
        qk = np.concatenate([x1 * cs - x2 * sn, x2 * cs + x1 * sn, x[..., rd:] * head_scale[:, None]], axis=-1)
        return qk[:, :nh], qk[:, nh:]

    def _norm_heads(self, qkv: np.ndarray, q_norm: np.ndarray, k_norm: np.ndarray) -> None:
        """Qwen3: RMSNorm over each head of q and of k in qkv [T, (nh+2nkv)*hd], in place, so that rope
        (and on the C path the KV write) then takes the normed values."""
        c = self.config
        T, hd, qk_size = qkv.shape[0], c.head_dim, self.q_size + self.kv_size
        for start, end, weight in ((0, self.q_size, q_norm), (self.q_size, qk_size, k_norm)):
            # [T, n*hd] -> [T*n, hd], a contiguous copy (reshape alone is a strided view for one head: Gemma's KV)
            heads = np.ascontiguousarray(qkv[:, start:end].reshape(-1, hd))
            qkv[:, start:end] = rms_norm(heads, weight, c.rms_norm_eps).reshape(T, end - start)

    def _step_layers(self, batch: ForwardBatch, kv_cache: KVCache) -> StepLayers | None:
        """The C step for this batch, if every matrix multiplies its rows in C (Weight.decode_blocks): a decode
        step (one new token per sequence, side by side, up to DECODE_ROWS) or one with prefill chunks;
        built once per pool and kind of rows."""
        T, meta = batch.token_ids.shape[0], batch.attn
        # Soft-capped attention is not in the paged kernels: such a model's layers run one by one.
        decode = 1 <= T <= DECODE_ROWS and not meta.prefill_rows.size and meta.decode_span == (0, T)
        if (not self.layers_in_c or matmul.lib is None or ops.lib is None or T < 1
                or self.config.attn_logit_softcapping is not None or not (decode or meta.prefill_rows.size)):
            return None
        # what each matrix multiplies in C depends on these (Weight.decode_blocks)
        key = (T == 1, T <= DECODE_ROWS, T <= DECODE_ROWS or matmul.integer_products())
        pool, plan = self._steps.get(key, (None, None))
        if pool is not kv_cache.pool:
            plan, c = None, self.config
            specs: list[LayerSpec] = []
            for n, layer in enumerate(self.weights.layers):
                mats = [m.decode_blocks(T) for m in (layer.qkv, layer.o, layer.gate_up, layer.down)]
                if any(m is None for m in mats):
                    break
                qkv, o, gate_up, down = (m or () for m in mats)
                sliding = bool(c.sliding_layers) and c.sliding_layers[n]
                specs.append(LayerSpec(layer.input_norm, qkv, o, layer.post_norm, gate_up, down, layer.qkv_bias,
                                       layer.q_norm, layer.k_norm, layer.attn_out_norm, layer.ffn_out_norm,
                                       (c.sliding_window or 0) if sliding else 0,
                                       sliding and self.local_inv_freq is not None, nope=n in c.nope_layers))
            else:
                plan = StepLayers(specs, kv_cache.pool, c.num_heads, c.num_kv_heads, c.head_dim,
                                    c.intermediate_size, c.rms_norm_eps, gelu=c.hidden_act != "silu",
                                    qk_order=self.rope_perm, layer_slots=kv_cache.layout.layer_slot,
                                    layer_groups=kv_cache.layout.layer_group)
            self._steps[key] = (kv_cache.pool, plan)
        return plan

    def forward(self, batch: ForwardBatch, kv_cache: KVCache) -> np.ndarray:
        """Run every token of the batch; returns logits [len(logits_indices), vocab] in float32.
        Raises NonFiniteLogits if any of them is NaN or inf."""
        c, w = self.config, self.weights
        last = rms_norm(self._layers(batch, kv_cache)[batch.logits_indices], w.norm, c.rms_norm_eps)   # [R, H]
        return self._logits(last)

    def _logits(self, last: np.ndarray) -> np.ndarray:
        c = self.config
        logits = self.weights.lm_head.apply(last)                               # [R, V]
        if c.final_logit_softcapping is not None:
            cap = np.float32(c.final_logit_softcapping)
            logits = np.tanh(logits / cap) * cap
        # Sampling from NaN would pick garbage quietly; one pass over [R, V] is cheap next to lm_head.
        if not np.isfinite(logits).all():
            raise NonFiniteLogits(np.flatnonzero(~np.isfinite(logits).all(axis=1)), logits.shape[0])
        return logits

    def pool(self, batch: ForwardBatch, kv_cache: KVCache,
             dimensions: list[int | None] | None = None) -> list[np.ndarray]:
        """A decoder embedder's vector (Qwen3-Embedding: its last token's final state, pooled as its files
        say) or a reranker's score (Qwen3-Reranker: logit("yes") - logit("no") at its last token, whose sigmoid
        is P(yes) of the two), one per sequence ending in the batch (logits_indices)."""
        w, eps = self.weights, self.config.rms_norm_eps
        last = rms_norm(self._layers(batch, kv_cache)[batch.logits_indices], w.norm, eps)   # [S, H]
        if self.judge_tokens is not None:   # the logits a generation request gets there, to the bit
            no, yes = self.judge_tokens
            return [np.array([row[yes] - row[no]], np.float32) for row in self._logits(last)]
        assert self.pooling is not None and self.pooling.method == "last"   # pooling_model.py sets them so
        n = last.shape[0]
        return self.pooling(last, np.arange(n), np.ones(n, np.int64), dimensions)

    def _layers(self, batch: ForwardBatch, kv_cache: KVCache) -> np.ndarray:
        """Every layer over the batch; returns the residual stream [T, H] (the workspace's, until the next step)."""
        c, w = self.config, self.weights
        T = batch.token_ids.shape[0]
        nh, nkv, hd = c.num_heads, c.num_kv_heads, c.head_dim
        cos, sin = self._rope_tables(batch.positions)               # [T, rope_dim/2] each
        qk_size = self.q_size + self.kv_size
        # With the C kernels, rope and the KV writes are one call per layer, set up once per step.
        c_cos, c_sin = cos, sin
        if self.rope_perm is not None:   # the dims passed through: angle 0
            rest = (T, (hd - cos.shape[1] * 2) // 2)
            c_cos, c_sin = (np.concatenate([cos, np.ones(rest, np.float32)], axis=1),
                            np.concatenate([sin, np.zeros(rest, np.float32)], axis=1))
        # Rope tables by layer kind: the global (or only) rope, SmolLM3's NoPE (angle 0: q and k stay as they
        # are) and Gemma 3's sliding layers' own; the C tables have partial rotary's passed-through dims.
        c_tables = {"global": (c_cos, c_sin)}
        np_tables = {"global": (cos, sin)}
        if c.nope_layers:
            c_tables["nope"] = (np.ones_like(c_cos), np.zeros_like(c_sin))
            np_tables["nope"] = (np.ones_like(cos), np.zeros_like(sin))
        if self.local_inv_freq is not None:
            c_tables["local"] = np_tables["local"] = self._rope_tables(batch.positions, self.local_inv_freq)
        writers: dict[tuple[str, int], ops.RopeWriteKV] = {}

        def writer(kind: str, group: int) -> ops.RopeWriteKV:
            """Rope and the KV write for a kind of layer into a group's slots, set up once per step."""
            if (kind, group) not in writers:
                writers[kind, group] = ops.RopeWriteKV(*c_tables[kind], batch.groups[group].slot_mapping, nh, nkv,
                                                       hd, self.scale)
            return writers[kind, group]

        layout = kv_cache.layout
        if len(batch.groups) != layout.num_groups:
            raise ValueError(f"batch: need slots and block tables for each of the pool's {layout.num_groups} groups "
                             f"of layers (kv_layout.py), got {len(batch.groups)}")
        a = self.workspace.take(T)
        x = a.x
        if c.embed_scale != 1.0:
            np.multiply(w.embed.rows(batch.token_ids), np.float32(c.embed_scale), out=x)
        else:
            x[...] = w.embed.rows(batch.token_ids)                               # [T, H]
        in_c = self._step_layers(batch, kv_cache)
        if in_c is not None:
            if batch.attn.prefill_rows.size:   # prefill attention's tasks over every sequence, decode rows too
                attentions: list[ops.PagedDecode | PagedPrefill] = [
                    PagedPrefill(m.block_tables, m.context_lens, m.query_starts[:-1], m.query_lens,
                                 m.positions) for m in batch.groups]
            else:
                decodes = [m.paged_decode for m in batch.groups]
                assert all(d is not None for d in decodes)   # ops.lib is loaded
                attentions = decodes  # type: ignore[assignment]
            in_c(x, [writer("global", g) for g in range(layout.num_groups)], attentions,
                 threads.count, writer("local", 0) if "local" in c_tables else None,
                 (a.h, a.qkv, a.attn.reshape(T, -1), a.out, a.gate_up, a.act))
        for i, layer in enumerate(w.layers if in_c is None else ()):
            h = rms_norm(x, layer.input_norm, c.rms_norm_eps, a.h)
            qkv = layer.qkv.apply(h, a.qkv)                                     # [T, (nh+2nkv)*hd]
            if layer.qkv_bias is not None:
                qkv += layer.qkv_bias
            if layer.q_norm is not None:
                assert layer.k_norm is not None  # laid out together (weights/layout.py)
                self._norm_heads(qkv, layer.q_norm, layer.k_norm)
            sliding = bool(c.sliding_layers) and c.sliding_layers[i]
            kind = "nope" if i in c.nope_layers else "local" if sliding and "local" in c_tables else "global"
            meta = batch.groups[layout.layer_group[i]]
            kv_pool = kv_cache.layer(i)                                         # [2, NB, bs, nkv, hd]
            v = qkv[:, qk_size:].reshape(T, nkv, hd)
            if ops.lib is not None:
                if self.rope_perm is not None:
                    qkv[:, :qk_size] = qkv[:, self.rope_perm]
                writer(kind, layout.layer_group[i])(qkv, kv_pool)                # q, k in place
                q, k = qkv[:, :self.q_size].reshape(T, nh, hd), qkv[:, self.q_size:qk_size].reshape(T, nkv, hd)
            else:
                q, k = self._rotate(qkv, *np_tables[kind])                      # [T, nh, hd], [T, nkv, hd]
                write_kv(kv_pool[0], kv_pool[1], k, v, meta.slot_mapping)
            window = (c.sliding_window or 0) if sliding else 0
            attn = paged_attention(q, k, v, kv_pool, meta, window, c.attn_logit_softcapping, a.attn)   # [T, nh, hd]
            out = layer.o.apply(attn.reshape(T, nh * hd), a.out)                # [T, H]
            if layer.attn_out_norm is not None:                                 # Gemma 3's norm of it
                out = rms_norm(out, layer.attn_out_norm, c.rms_norm_eps, a.h)
            x += out
            h = rms_norm(x, layer.post_norm, c.rms_norm_eps, a.h)
            gu = layer.gate_up.apply(h, a.gate_up)                              # [T, 2I]
            act = (gelu_tanh_mul if c.hidden_act != "silu" else silu_mul)(gu, a.act)
            out = layer.down.apply(act, a.out)                                  # [T, H]
            if layer.ffn_out_norm is not None:
                out = rms_norm(out, layer.ffn_out_norm, c.rms_norm_eps, a.h)
            x += out
        return x
