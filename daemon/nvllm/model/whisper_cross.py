"""Whisper's cross-attention: a window's keys and values (CrossKV), computed once from the encoder's states, and
each sequence's query rows attending to all of its own window's frames.

A layer's k and v are held as a small KV pool of their own, [2, pages, PAGE, heads, head size] in a KV format (f32,
or f16 at half the bytes), the window's frames in page order (the last page padded with zeros past them), so the
paged attention kernels (csrc/attention.c) read them in place: a decode row is PagedDecode over those pages, a
chunk of several rows PagedPrefill with every row placed at the last frame, so that its causal limit lets it see
them all. Each sequence is its own call (its window is its own array); the NumPy path, where the kernels are not
built, is BLAS over the heads.

Measured on tiny's heads (6 x 64, 1500 frames), one row against one layer's window: 93 us in f32 pages of 16
rows, 110 us in one page of 1500 rows; 355 us in f16 (the kernel widens f16 a value at a time), so f32 is the
default and f16 the way to halve the bytes held.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from nvllm.model.attention import AttentionMetadata
from nvllm.model.kernels import ops
from nvllm.model.kernels.prefill import PagedPrefill
from nvllm.model.quant.kv_format import F32, KVFormat

PAGE = 16   # rows of a page of the window's keys and values


@dataclass
class CrossKV:
    """One window's cross-attention keys and values, per decoder layer: layers[l] [2 (k, v), pages, PAGE, heads,
    head size / per element] in `fmt`, frames [0, frames) in page order. k(l) and v(l) are the float32 [frames, d]
    they hold."""
    layers: list[np.ndarray]
    frames: int
    fmt: KVFormat = F32
    _decode: ops.PagedDecode | None = field(default=None, repr=False)

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.layers)

    def k(self, layer: int) -> np.ndarray:
        return self._plain(layer, 0)

    def v(self, layer: int) -> np.ndarray:
        return self._plain(layer, 1)

    def _plain(self, layer: int, which: int) -> np.ndarray:
        return self.rows(layer, which).reshape(self.frames, -1)

    def rows(self, layer: int, which: int) -> np.ndarray:
        """Layer's k (which 0) or v (1) as float32 [frames, heads, head size]."""
        pool = self.layers[layer][which]
        rows = pool.reshape((-1,) + pool.shape[2:])[:self.frames]
        return np.asarray(self.fmt.decode(rows), np.float32)

    @property
    def table(self) -> np.ndarray:
        """The block table [1, pages] of the window's own pool: its pages in order."""
        return np.arange(self.layers[0].shape[1], dtype=np.int32)[None] if self.layers else np.zeros((1, 0), np.int32)

    def decoder(self) -> ops.PagedDecode:
        """The decode kernel over this window's pages (made once: its table and length never change)."""
        if self._decode is None:
            self._decode = ops.PagedDecode(self.table, np.array([self.frames], np.int64))
        return self._decode

    @classmethod
    def from_projections(cls, kv: list[np.ndarray], heads: int, fmt: KVFormat = F32) -> CrossKV:
        """kv[l]: layer l's k|v [frames, 2d] float32 -> the window's pools."""
        layers, frames = [], 0
        for a in kv:
            frames, two_d = a.shape
            d = two_d // 2
            pages = -(-frames // PAGE)
            pool = np.zeros((2, pages * PAGE, heads, d // heads // fmt.per_element), fmt.dtype)
            pool[0, :frames] = fmt.encode(a[:, :d].reshape(frames, heads, d // heads))
            pool[1, :frames] = fmt.encode(a[:, d:].reshape(frames, heads, d // heads))
            layers.append(pool.reshape((2, pages, PAGE) + pool.shape[2:]))
        return cls(layers, frames, fmt)


class CrossAttention:
    """One step's cross-attention, set up once and called layer by layer: the batch's sequences (their rows in
    the packed batch, attn.query_starts and query_lens) each against cross[i], the i-th sequence's window."""

    def __init__(self, attn: AttentionMetadata, cross: list[CrossKV]) -> None:
        lens = attn.query_lens
        if len(cross) != lens.size:
            raise ValueError(f"cross: need one CrossKV per sequence of the batch ({lens.size}), got {len(cross)}")
        self.rows = [(int(a), int(n)) for a, n in zip(attn.query_starts[:-1], lens)]
        self.cross = cross
        self.prefill: list[PagedPrefill | None] = [None] * len(cross)
        if ops.lib is not None:
            for i, ((_, n), c) in enumerate(zip(self.rows, cross)):
                if n > 1:   # every row at the last frame: all of them seen
                    self.prefill[i] = PagedPrefill(c.table, np.array([c.frames], np.int64),
                                                   np.zeros(1, np.int64), np.array([n], np.int64),
                                                   np.full(n, c.frames - 1, np.int64))

    def __call__(self, layer: int, q: np.ndarray, out: np.ndarray) -> np.ndarray:
        """q [T, nh, hd] (scaled) -> out [T, nh, hd]."""
        for (a, n), c, pre in zip(self.rows, self.cross, self.prefill):
            pool = c.layers[layer]
            if ops.lib is None:
                out[a:a + n] = _attend(q[a:a + n], c.rows(layer, 0), c.rows(layer, 1))
            elif pre is None:
                c.decoder()(q[a:a + 1], pool, out[a:a + 1])
            else:
                pre(q[a:a + n], pool, out[a:a + n])
        return out


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """NumPy path: q [n, nh, hd] against k, v [frames, nh, hd] -> [n, nh, hd], every frame seen."""
    s = np.matmul(q.transpose(1, 0, 2), k.transpose(1, 2, 0))          # [nh, n, frames]
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    o = np.matmul(s, v.transpose(1, 0, 2))                               # [nh, n, hd]
    o /= s.sum(axis=-1, keepdims=True)
    return o.transpose(1, 0, 2)
