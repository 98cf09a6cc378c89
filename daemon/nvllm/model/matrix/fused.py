"""Matrices whose outputs are laid side by side, each in its own storage: a fused q|k|v or gate|up whose
parts a file stores in different formats (a Q4_K_M file keeps some attn_v in Q6_K)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nvllm.model.matrix.weight import Weight, new_out
from nvllm.model.quant.blocks import BlockMatrix
from nvllm.model.quant.packed import PackedMatrix


class FusedWeight(Weight):
    """W = the parts' rows stacked, [sum of out, in]. Each part writes its own columns of the one output
    array, so a call makes no concatenation."""

    def __init__(self, parts: Sequence[Weight]) -> None:
        if not parts or len({p.shape[1] for p in parts}) != 1:
            raise ValueError(f"fused parts need one input size, got {[p.shape for p in parts]}")
        self.parts = tuple(parts)
        self.shape = (sum(p.shape[0] for p in parts), parts[0].shape[1])

    def apply(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        y = new_out(x, self.shape[0], out)
        at = 0
        for p in self.parts:
            p.apply(x, y[:, at:at + p.shape[0]])
            at += p.shape[0]
        return y

    def decode_blocks(self, rows: int) -> tuple[BlockMatrix | PackedMatrix, ...] | None:
        parts = [p.decode_blocks(rows) for p in self.parts]
        return None if any(p is None for p in parts) else tuple(b for p in parts for b in p or ())

    def rows(self, ids: np.ndarray) -> np.ndarray:
        return self.dequantize()[ids]

    def dequantize(self) -> np.ndarray:
        return np.concatenate([p.dequantize() for p in self.parts], axis=0)

    def buffers(self) -> tuple[np.ndarray, ...]:
        return tuple(b for p in self.parts for b in p.buffers())

    @property
    def formats(self) -> tuple[str, ...]:
        return tuple(f for p in self.parts for f in p.formats)
