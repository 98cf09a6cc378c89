"""The forward pass's activations, allocated once per model and reused by every step (decoder.Model.forward).

A prefill chunk's activations are the largest arrays a step makes: for 512 tokens of the Qwen2.5-1.5B
shape, gate_up alone is 35 MiB. Made afresh in every layer of every step, they came and went through
malloc, whose heap keeps what it was once given, so the resident set grew with the longest steps. Here
they are made once, for the most tokens a step takes (the scheduler's budget: `reserve`, which the engine's
factory calls and logs), and each step works in views of them. A step longer than that (a direct caller of
Model.forward) grows them. Attention needs no such arrays: its kernels keep a tile's state, not a score
matrix (csrc/attention.c).

A layer never needs more than the residual stream and two arrays at once (an op's input and its output),
so three buffers hold everything: `x`; a wide one for qkv, the projections back to the stream and
gate_up; a narrow one for the norms' outputs, attention's and the gated product. Each view is used only
after the last one in its buffer is dead (decoder.py's order: norm -> qkv -> attention -> o -> norm ->
gate_up -> act -> down).

Not shared between threads: one model's forward passes run one at a time (the engine thread's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nvllm.model.config import ModelConfig


@dataclass
class Activations:
    """One step's views, [T, ...] each; h, attn and act share memory, and so do qkv, out and gate_up."""
    x: np.ndarray        # the residual stream [T, H]
    h: np.ndarray        # a norm's output [T, H]
    qkv: np.ndarray      # [T, (nh + 2 nkv) hd]
    attn: np.ndarray     # [T, nh, hd]
    out: np.ndarray      # a projection back to the stream [T, H]
    gate_up: np.ndarray  # [T, 2I]
    act: np.ndarray      # the gated activation [T, I]


class Workspace:
    def __init__(self, config: ModelConfig) -> None:
        c = config
        self._hidden, self._heads, self._inter = c.hidden_size, (c.num_heads, c.head_dim), c.intermediate_size
        self._qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
        # floats per token of each buffer
        self._widths = {"x": c.hidden_size, "wide": max(self._qkv, c.hidden_size, 2 * c.intermediate_size),
                        "narrow": max(c.hidden_size, c.num_heads * c.head_dim, c.intermediate_size)}
        self.rows = 0
        self._buffers: dict[str, np.ndarray] = {}

    def bytes_for(self, rows: int) -> int:
        """What reserving `rows` tokens takes."""
        return 4 * rows * sum(self._widths.values())

    @property
    def nbytes(self) -> int:
        return self.bytes_for(self.rows)

    def reserve(self, rows: int) -> None:
        """Room for steps of up to `rows` tokens (never less than is held)."""
        if rows > self.rows:
            self._buffers = {}   # the old buffers go before the new ones are made
            self._buffers = {name: np.empty(rows * width, np.float32) for name, width in self._widths.items()}
            self.rows = rows

    def take(self, rows: int) -> Activations:
        """Views for a step of `rows` tokens, each contiguous."""
        self.reserve(rows)
        b, H, (nh, hd), inter = self._buffers, self._hidden, self._heads, self._inter

        def view(name: str, *shape: int) -> np.ndarray:
            return b[name][:rows * int(np.prod(shape))].reshape(rows, *shape)

        return Activations(x=view("x", H), h=view("narrow", H), qkv=view("wide", self._qkv),
                           attn=view("narrow", nh, hd), out=view("wide", H), gate_up=view("wide", 2 * inter),
                           act=view("narrow", inter))
