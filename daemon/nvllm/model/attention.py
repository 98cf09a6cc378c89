"""Paged attention over the page pool, for a packed batch of prefill chunks and decode tokens.

Tokens of one sequence are contiguous in the packed batch. New keys and values are written to the pool
by slot mapping first, so every query then reads its whole context (cached and new) through its block
table alone: causal within a chunk, full attention to what was cached before.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class AttentionMetadata:
    slot_mapping: np.ndarray   # [T] int64: pool slot of each new token
    query_lens: np.ndarray     # [S] int64: new tokens of each sequence, in batch order
    context_lens: np.ndarray   # [S] int64: tokens in the cache for each sequence once this step is written
    block_tables: np.ndarray   # [S, max_blocks] int32, padded with 0 (padding is masked out)
    positions: np.ndarray      # [T] int64

    def __post_init__(self) -> None:
        self.query_starts = np.concatenate([[0], np.cumsum(self.query_lens)])  # [S + 1]
        self.decode_rows = np.flatnonzero(self.query_lens == 1)                  # sequences with one new token
        self.prefill_rows = np.flatnonzero(self.query_lens > 1)


def write_kv(k_pool: np.ndarray, v_pool: np.ndarray, k: np.ndarray, v: np.ndarray,
             slot_mapping: np.ndarray) -> None:
    """Scatter new keys/values [T, nkv, hd] into the pool [num_blocks, block_size, nkv, hd]."""
    nb, bs, nkv, hd = k_pool.shape
    k_pool.reshape(nb * bs, nkv, hd)[slot_mapping] = k
    v_pool.reshape(nb * bs, nkv, hd)[slot_mapping] = v


def _softmax_rows(scores: np.ndarray) -> np.ndarray:
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


def _gather(pool: np.ndarray, block_tables: np.ndarray, num_tokens: int) -> np.ndarray:
    """A sequence's first num_tokens keys (or values): [S, MB] tables -> [S, num_tokens, nkv, hd]."""
    nb, bs, nkv, hd = pool.shape
    num_blocks = -(-num_tokens // bs)
    g = pool[block_tables[:, :num_blocks]]                     # [S, mb, bs, nkv, hd]
    return g.reshape(g.shape[0], num_blocks * bs, nkv, hd)[:, :num_tokens]


def paged_attention(q: np.ndarray, k_pool: np.ndarray, v_pool: np.ndarray,
                    meta: AttentionMetadata, scale: float) -> np.ndarray:
    """q [T, nh, hd] against the pool -> [T, nh, hd]. K/V of this step must already be written."""
    T, nh, hd = q.shape
    nkv = k_pool.shape[2]
    group = nh // nkv
    out = np.empty_like(q)

    rows = meta.decode_rows
    if rows.size:
        # All single-token sequences at once, padded to the longest context and masked.
        ctx = meta.context_lens[rows]                           # [Sd]
        c = int(ctx.max())
        k = _gather(k_pool, meta.block_tables[rows], c)         # [Sd, C, nkv, hd]
        v = _gather(v_pool, meta.block_tables[rows], c)
        tok = meta.query_starts[rows]
        qd = q[tok].reshape(rows.size, nkv, group, hd)          # [Sd, nkv, g, hd]
        scores = qd @ k.transpose(0, 2, 3, 1)                   # [Sd, nkv, g, hd] @ [Sd, nkv, hd, C] -> [Sd, nkv, g, C]
        scores *= scale
        pad = np.arange(c) >= ctx[:, None]                      # [Sd, C]
        scores[np.broadcast_to(pad[:, None, None, :], scores.shape)] = -np.inf
        probs = _softmax_rows(scores)
        od = probs @ v.transpose(0, 2, 1, 3)                    # [Sd, nkv, g, C] @ [Sd, nkv, C, hd] -> [Sd, nkv, g, hd]
        out[tok] = od.reshape(rows.size, nh, hd)

    for s in meta.prefill_rows:
        # One chunk at a time: a chunk is already a large matmul of its own.
        start, n = int(meta.query_starts[s]), int(meta.query_lens[s])
        c = int(meta.context_lens[s])
        k = _gather(k_pool, meta.block_tables[s:s + 1], c)[0]  # [C, nkv, hd]
        v = _gather(v_pool, meta.block_tables[s:s + 1], c)[0]
        qs = q[start:start + n].reshape(n, nkv, group, hd).transpose(1, 2, 0, 3)  # [nkv, g, n, hd]
        scores = qs @ k.transpose(1, 2, 0)[:, None]              # [nkv, g, n, hd] @ [nkv, 1, hd, C] -> [nkv, g, n, C]
        scores *= scale
        future = np.arange(c)[None, :] > meta.positions[start:start + n, None]  # [n, C]: causal mask
        scores[np.broadcast_to(future, scores.shape)] = -np.inf
        probs = _softmax_rows(scores)
        os_ = probs @ v.transpose(1, 0, 2)[:, None]              # [nkv, g, n, C] @ [nkv, 1, C, hd] -> [nkv, g, n, hd]
        out[start:start + n] = os_.transpose(2, 0, 1, 3).reshape(n, nh, hd)
    return out
