"""The page pool: every layer's keys and values, in fixed-size pages addressed by slot.

A slot is `block_id * block_size + offset`; the block manager (engine/) decides which pages a sequence
owns, this module only holds the arrays and knows their byte arithmetic.
"""

from __future__ import annotations

import numpy as np


class KVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: np.dtype = np.float32) -> None:
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        # Allocated once and written through, so every page is resident now and the
        # resident set does not grow later under load.
        self.pool = np.empty((num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim), dtype=dtype)
        self.pool.fill(0)

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                        itemsize: int = 4) -> int:
        return num_layers * 2 * block_size * num_kv_heads * head_dim * itemsize

    @property
    def nbytes(self) -> int:
        return self.pool.nbytes

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    def layer(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Views of layer i's keys and values, each [num_blocks, block_size, kv_heads, head_dim]."""
        return self.pool[i, 0], self.pool[i, 1]
