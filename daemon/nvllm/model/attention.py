"""Paged attention over the page pool, for a packed batch of prefill chunks and decode tokens.

Tokens of one sequence are contiguous in the packed batch. New keys and values are written to the pool
by slot mapping first, so every query then reads its whole context (cached and new) through its block
table alone: causal within a chunk, full attention to what was cached before. With the C kernels, decode
tokens and prefill chunks each take one call (csrc/attention.c), and a token gets the same bits either
way; the NumPy paths below are their twins (and serve soft-capped scores, which the kernels do not).
A sliding-window layer (Gemma 3's) masks too: a query at position p sees keys p - window + 1 .. p, as
transformers' sliding mask does. Where its group gave back the pages before the window
(model/kv_layout.py), their table entries point at the zeroed null page: skipped or masked, never
weighted.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from nvllm.model.kernels import matmul, ops, threads
from nvllm.model.kernels.prefill import PagedPrefill
from nvllm.model.quant.kv_format import of_pool

# Query rows per tile in a prefill chunk: tiles skip the keys their causal mask would hide, and a
# tile's scores stay small enough to remain in cache.
PREFILL_TILE = 128


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
        self.decode_tokens = self.query_starts[self.decode_rows]
        if self.decode_rows.size:
            ctx = self.context_lens[self.decode_rows]
            tok = self.decode_tokens
            # Decode tokens that sit side by side in the batch (all of them, in a pure decode step) are
            # read and written in place; others go through a gathered copy.
            self.decode_span = (int(tok[0]), int(tok[-1]) + 1) if tok[-1] - tok[0] == tok.size - 1 else None
            self.paged_decode = (ops.PagedDecode(np.ascontiguousarray(self.block_tables[self.decode_rows]),
                                                     np.ascontiguousarray(ctx))
                                 if ops.lib is not None else None)
            self.decode_width = int(ctx.max())
        self.paged_prefill = None
        if self.prefill_rows.size and ops.lib is not None:
            rows = self.prefill_rows
            self.paged_prefill = PagedPrefill(np.ascontiguousarray(self.block_tables[rows]),
                                              np.ascontiguousarray(self.context_lens[rows]),
                                              np.ascontiguousarray(self.query_starts[rows]),
                                              np.ascontiguousarray(self.query_lens[rows]),
                                              np.ascontiguousarray(self.positions, dtype=np.int64))

    @functools.cached_property
    def decode_bias(self) -> np.ndarray:
        """NumPy path: additive mask for padded key positions, 0 where a key exists, -inf past the context."""
        ctx = self.context_lens[self.decode_rows]
        return np.where(np.arange(self.decode_width) < ctx[:, None], 0.0, -np.inf
                        ).astype(np.float32)[:, None, None, :]                   # [Sd, 1, 1, C]

    def window_bias(self, window: int) -> np.ndarray:
        """NumPy path: decode_bias with the keys before each sliding window's start masked too (made once
        per step: every sliding layer shares it)."""
        made = self.__dict__.setdefault("_window_bias", {})
        if window not in made:
            first = np.maximum(self.context_lens[self.decode_rows] - window, 0)
            before = np.arange(self.decode_width) < first[:, None]
            made[window] = np.where(before[:, None, None, :], np.float32(-np.inf), self.decode_bias)
        return made[window]


def write_kv(k_pool: np.ndarray, v_pool: np.ndarray, k: np.ndarray, v: np.ndarray,
             slot_mapping: np.ndarray) -> None:
    """Scatter new keys/values [T, nkv, hd] into the pool [num_blocks, block_size, nkv, hd / per element],
    stored in the pool's KV format (quant/kv_format.py)."""
    fmt = of_pool(k_pool)
    nb, bs, nkv, width = k_pool.shape
    k_pool.reshape(nb * bs, nkv, width)[slot_mapping] = fmt.encode(k)
    v_pool.reshape(nb * bs, nkv, width)[slot_mapping] = fmt.encode(v)


def _gather(pool: np.ndarray, block_tables: np.ndarray, num_tokens: int, first_block: int = 0) -> np.ndarray:
    """The first num_tokens keys (or values) of each sequence, as float32: [S, MB] tables ->
    [S, num_tokens, nkv, hd]; from block first_block on (a sliding window's), [S, num_tokens - first, ...]."""
    nb, bs, nkv, width = pool.shape
    num_blocks = -(-num_tokens // bs)
    g = np.take(pool, block_tables[:, first_block:num_blocks], axis=0)   # [S, mb, bs, nkv, width]
    n = num_tokens - first_block * bs
    return of_pool(pool).decode(g.reshape(g.shape[0], (num_blocks - first_block) * bs, nkv, width)[:, :n])


def _decode(q: np.ndarray, kv_pool: np.ndarray, meta: AttentionMetadata, out: np.ndarray, window: int = 0,
            softcap: float | None = None) -> None:
    """Every single-token sequence at once: the C kernel reads each page in place; the NumPy path
    gathers the pages, pads to the longest context and masks (window > 0: a sliding window's keys only).
    Soft-capped scores (cap * tanh(s / cap)) take the NumPy path: the kernel has no cap."""
    rows, tok = meta.decode_rows, meta.decode_tokens
    if ops.lib is not None and meta.paged_decode is not None and softcap is None:
        # the sequences shared out over the matmul kernels' threads, when there are several
        team = (threads.count, matmul.team_run) if matmul.lib is not None else (1, None)
        if meta.decode_span is not None:
            t0, t1 = meta.decode_span
            meta.paged_decode(q[t0:t1], kv_pool, out[t0:t1], team[0], team[1], window)
        else:
            o = np.empty((rows.size,) + q.shape[1:], dtype=np.float32)
            meta.paged_decode(q[tok], kv_pool, o, team[0], team[1], window)
            out[tok] = o
        return
    nh, hd = q.shape[1], q.shape[2]
    _, _, bs, nkv, width = kv_pool.shape
    c = meta.decode_width
    nblk = -(-c // bs)
    # Keys and values of every sequence in one gather: [2, NB, bs, nkv, hd] -> [2, Sd, C, nkv, hd]
    kv = np.take(kv_pool, meta.block_tables[rows, :nblk], axis=1).reshape(2, rows.size, nblk * bs, nkv, width)
    kv = of_pool(kv_pool).decode(kv)
    ctx = meta.context_lens[rows]
    if ctx.min() < c:
        # Past a shorter context lie slots of other or freed sequences, which may hold NaN from a step
        # that failed: the -inf mask cannot hide them (NaN * 0 is NaN), so zero them in the copy.
        kv[:, np.arange(nblk * bs) >= ctx[:, None]] = 0
    k, v = kv[0, :, :c], kv[1, :, :c]                              # [Sd, C, nkv, hd] each
    qd = q[tok].reshape(rows.size, nkv, nh // nkv, hd)             # [Sd, nkv, g, hd]
    # [Sd, nkv, g, hd] @ [Sd, nkv, hd, C] -> [Sd, nkv, g, C]
    scores = qd @ k.transpose(0, 2, 3, 1)
    if softcap is not None:
        scores = np.tanh(scores / np.float32(softcap)) * np.float32(softcap)
    scores += meta.window_bias(window) if window else meta.decode_bias
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    # [Sd, nkv, g, C] @ [Sd, nkv, C, hd] -> [Sd, nkv, g, hd]
    o = scores @ v.transpose(0, 2, 1, 3)
    o /= scores.sum(axis=-1, keepdims=True)                        # normalise the [g, hd] result, not the [g, C] scores
    out[tok] = o.reshape(rows.size, nh, hd)


def _prefill(q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray, window: int = 0,
             softcap: float | None = None) -> np.ndarray:
    """One chunk's queries [n, nh, hd] over its whole context k, v [C, nkv, hd]; causal by position (and
    with window > 0, each query sees its last `window` keys only).

    The query heads that share a KV head are stacked as rows, so each tile is one large matmul per KV
    head rather than many small ones.
    """
    n, nh, hd = q.shape
    nkv = k.shape[1]
    g = nh // nkv
    qh = np.ascontiguousarray(q.reshape(n, nkv, g, hd).transpose(1, 0, 2, 3)).reshape(nkv, n * g, hd)
    kt = k.transpose(1, 2, 0)                                       # [nkv, hd, C] view
    vh = v.transpose(1, 0, 2)                                       # [nkv, C, hd] view
    out = np.empty((n, nh, hd), dtype=q.dtype)
    for t0 in range(0, n, PREFILL_TILE):
        t1 = min(n, t0 + PREFILL_TILE)
        out[t0:t1] = _prefill_tile(qh[:, t0 * g:t1 * g], kt, vh, positions[t0:t1], g, window, softcap)
    return out


def _prefill_tile(qt: np.ndarray, kt: np.ndarray, vh: np.ndarray, pos: np.ndarray, g: int,
                  window: int = 0, softcap: float | None = None) -> np.ndarray:
    """One tile's stacked queries qt [nkv, t*g, hd] against keys kt [nkv, hd, C] and values vh [nkv, C, hd]
    -> [t, nh, hd]; pos [t] are the tile's positions, which set its causal limits (and a sliding window's
    starts: keys from `lo`, the first row's window start, are all the tile reads)."""
    nkv, rows, hd = qt.shape
    t = rows // g
    lo = max(0, int(pos[0]) - window + 1) if window else 0          # keys before this no row's window holds
    width = int(pos[-1]) + 1                                        # keys this tile can see at all
    s = qt @ kt[:, :, lo:width]                                     # [nkv, t*g, hd] @ [nkv, hd, W] -> [nkv, t*g, W]
    if softcap is not None:                                         # before the mask, as transformers caps
        s = np.tanh(s / np.float32(softcap)) * np.float32(softcap)
    pos = pos - lo                                                  # from here on, counted from lo
    width -= lo
    from_lo = pos - window + 1
    starts = np.repeat(np.maximum(from_lo, 0), g) if window and from_lo.max() > 0 else None
    if ops.lib is not None:
        # Row i of the tile sees keys [0, pos[i]]; the kernel exponentiates up to there and zeroes the rest.
        sums = ops.softmax_causal_rows(s, np.repeat(pos + 1, g), starts)
    else:
        if starts is not None:   # a sliding window: keys before each row's start are hidden too
            s[..., :int(starts.max())] += np.where(np.arange(int(starts.max()))[None, :] < starts[:, None],
                                                   np.float32(-np.inf), np.float32(0))
        first = int(pos[0]) + 1                                     # keys before this are visible to every row
        if first < width:
            hidden = np.arange(first, width)[None, :] > pos[:, None]  # [t, W - first]
            bias = np.where(np.repeat(hidden, g, axis=0), -np.inf, 0.0).astype(np.float32)
            s[..., first:] += bias                                  # [t*g, W - first] causal part
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        sums = s.sum(axis=-1, keepdims=True)
    o = s @ vh[:, lo:lo + width]                                    # [nkv, t*g, W] @ [nkv, W, hd] -> [nkv, t*g, hd]
    o /= sums
    return o.reshape(nkv, t, g, hd).transpose(1, 0, 2, 3).reshape(t, nkv * g, hd)


def paged_attention(q: np.ndarray, k_new: np.ndarray, v_new: np.ndarray, kv_pool: np.ndarray,
                    meta: AttentionMetadata, window: int = 0, softcap: float | None = None,
                    out: np.ndarray | None = None) -> np.ndarray:
    """q [T, nh, hd], already scaled by 1/sqrt(hd), against one layer's pool
    [2, num_blocks, block_size, nkv, hd / per element] in its KV format -> [T, nh, hd]. window > 0: a
    sliding-window layer, each query attending to its last `window` positions only; softcap: scores become
    softcap * tanh(scores / softcap) before the mask.

    K/V of this step (k_new, v_new [T, nkv, hd]) must already be written to the pool; a chunk with
    nothing cached before it reads them directly instead of gathering its pages back. out: where to write
    the result (a new array if None).
    """
    out = np.empty_like(q) if out is None else out
    k_pool, v_pool = kv_pool[0], kv_pool[1]
    fmt = of_pool(kv_pool)
    if meta.decode_rows.size:
        _decode(q, kv_pool, meta, out, window, softcap)
    if meta.paged_prefill is not None and softcap is None:
        # every chunk at once, in tiles on the matmul kernels' threads, with decode's arithmetic per token
        team = (threads.count, matmul.team_run) if matmul.lib is not None else (1, None)
        meta.paged_prefill(q, kv_pool, out, team[0], team[1], window)
        return out
    for s in meta.prefill_rows:
        start, n = int(meta.query_starts[s]), int(meta.query_lens[s])
        c = int(meta.context_lens[s])
        if c == n:   # a whole prompt from position 0: its keys are all new, read as the pool holds them
            k, v = fmt.round_trip(k_new[start:start + n]), fmt.round_trip(v_new[start:start + n])
            base = 0
        else:
            # a sliding layer reads from the page holding its first query's window start on
            first = max(0, int(meta.positions[start]) - window + 1) // k_pool.shape[1] if window else 0
            base = first * k_pool.shape[1]
            k = _gather(k_pool, meta.block_tables[s:s + 1], c, first)[0]  # [C - base, nkv, hd]
            v = _gather(v_pool, meta.block_tables[s:s + 1], c, first)[0]
        pos = meta.positions[start:start + n] - base                        # counted from the first key read
        out[start:start + n] = _prefill(q[start:start + n], k, v, pos, window, softcap)
    return out
