"""The page pool: every layer's keys and values, in fixed-size pages addressed by slot.

A slot is `block_id * block_size + offset`; the block manager (engine/) decides which pages a sequence
owns, this module only holds the arrays and knows their byte arithmetic.
"""

from __future__ import annotations

import math
import mmap

import numpy as np
from numpy.typing import DTypeLike

from nvllm.model.quant.kv_format import F32, KVFormat

# Linux mmap flags; Python's mmap module lacks them on other systems (MAP_POPULATE: Linux only).
_MAP_ANONYMOUS = getattr(mmap, "MAP_ANONYMOUS", None)
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def _touch_each_page(flat: np.ndarray) -> None:
    """Write a zero into every page of a zeroed byte view, so the kernel backs each one now."""
    flat[::mmap.PAGESIZE] = 0


def resident_zeros(shape: tuple[int, ...], dtype: DTypeLike) -> tuple[np.ndarray, str]:
    """A zero-filled array whose pages are all resident now, and how they were made resident.

    Where the mmap flags exist the kernel maps fresh zeroed pages and, with MAP_POPULATE, backs them
    all in the one mmap call, with no second pass writing 2 GiB of zeros over them. One write per page
    afterwards costs milliseconds on backed pages and backs any that MAP_POPULATE left out (it fails
    quietly, e.g. short of memory, where a fault now still fails at start-up rather than later).
    MADV_HUGEPAGE comes after populating on purpose: faulting the pool in as huge pages was measured
    3-5x slower on a VM that hands freed memory back to its host (README, "At rest, start-up and
    memory: measured"); advised afterwards, khugepaged may merge the backed pages in the background.
    """
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    if nbytes == 0 or _MAP_ANONYMOUS is None:
        array = np.zeros(shape, dtype=dtype)
        _touch_each_page(array.reshape(-1).view(np.uint8))
        return array, "np.zeros, touched page by page"
    try:
        pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_POPULATE)
    except OSError as e:  # refused outright (e.g. overcommit limits): fail as np.empty would
        raise MemoryError(f"cannot map {nbytes} bytes for the KV page pool: {e}") from e
    how = "anonymous mmap, " + ("MAP_POPULATE" if _MAP_POPULATE else "touched page by page")
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            pages.madvise(mmap.MADV_HUGEPAGE)
            how += ", then MADV_HUGEPAGE"
        except OSError:  # THP compiled out or disabled: base pages serve as well
            pass
    flat = np.frombuffer(pages, dtype=np.uint8)  # keeps the mapping alive as long as any view of it
    _touch_each_page(flat)
    return flat.view(dtype).reshape(shape), how


class KVCache:
    """Every layer's pages [L, 2 (K, V), num_blocks, block_size, nkv, hd / per element], in one KV
    format (quant/kv_format.py: f32, f16, bf16 or q8_0)."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, fmt: KVFormat = F32) -> None:
        fmt.check_head_dim(head_dim)
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.format = fmt
        # Allocated and made resident once, now, so the resident set does not grow later under load.
        self.pool, self.populated_by = resident_zeros(
            (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim // fmt.per_element), fmt.dtype)

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                        fmt: KVFormat = F32) -> int:
        return num_layers * 2 * block_size * num_kv_heads * fmt.head_bytes(head_dim)

    @property
    def nbytes(self) -> int:
        return self.pool.nbytes
