"""The page pool: every layer's keys and values, in fixed-size pages addressed by slot.

A slot is `block_id * block_size + offset`; the block manager (engine/) decides which pages a sequence
owns, this module only holds the arrays and knows their byte arithmetic.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import math
import mmap
import os
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from nvllm.model.kv_layout import KVLayout
from nvllm.model.quant.kv_format import F32, KVFormat

# Linux mmap flags; Python's mmap module lacks them on other systems (MAP_POPULATE: Linux only).
_MAP_ANONYMOUS = getattr(mmap, "MAP_ANONYMOUS", None)
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
# madvise(MADV_POPULATE_WRITE) backs a range as writes would, without writing (Linux 5.14; 23 in the
# generic mman-common.h that arm64 and x86 use), and fails with ENOMEM instead of waking the OOM killer.
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


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
    3-5x slower on a VM that hands freed memory back to its host (docs/operating.md, "At rest,
    start-up and memory: measured"); advised afterwards, khugepaged may merge the backed pages in the background.
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


def reserved_zeros(shape: tuple[int, ...], dtype: DTypeLike) -> tuple[np.ndarray, str]:
    """A zero-filled array whose pages are mapped but not yet backed (back_range backs them), and how.

    Not advised MADV_HUGEPAGE: a huge page would back (and zero) 2 MiB around the first block written,
    where the caller backs a range at a time.
    """
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0 or _MAP_ANONYMOUS is None:
        return np.zeros(shape, dtype=dtype), "np.zeros, backed block by block"
    try:
        pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | _MAP_ANONYMOUS)
    except OSError as e:
        raise MemoryError(f"cannot map {nbytes} bytes for the KV page pool: {e}") from e
    return np.frombuffer(pages, dtype=np.uint8).view(dtype).reshape(shape), "anonymous mmap, backed block by block"


class _Populate:
    """libc's madvise through ctypes (which lets go of the GIL while the kernel backs the range)."""
    usable = os.name == "posix"
    _madvise: Any = None

    @classmethod
    def range(cls, start: int, length: int) -> bool:
        """MADV_POPULATE_WRITE over [start, start + length) (start page-aligned); False where the kernel or
        libc lacks it; MemoryError when memory runs out."""
        if not cls.usable:
            return False
        if cls._madvise is None:
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
                fn = libc.madvise
            except (OSError, AttributeError):
                cls.usable = False
                return False
            fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
            cls._madvise = fn
        while cls._madvise(start, length, _MADV_POPULATE_WRITE) != 0:
            err = ctypes.get_errno()
            if err != errno.EINTR:
                break
        else:
            return True
        if err in (errno.ENOMEM, errno.EFAULT, errno.EAGAIN):
            raise MemoryError(f"cannot back {length} bytes of the KV page pool: {os.strerror(err)}")
        cls.usable = False   # EINVAL: a kernel before 5.14 (or not Linux); pages are touched instead
        return False


def back_range(array: np.ndarray, axis: int, start: int, stop: int) -> None:
    """Make resident the pages under array's indices [start, stop) along `axis` (of a C-contiguous,
    zero-filled array), for every index of the axes before it; raises MemoryError when memory runs out.

    Only bytes of those indices are written (where madvise cannot back them, one zero per page): pages
    they share with neighbouring indices, which may be in use, keep their contents.
    """
    if start >= stop or array.size == 0:
        return
    if not array.flags.c_contiguous:
        raise ValueError("back_range takes a C-contiguous array")
    rows = math.prod(array.shape[:axis])
    flat = array.reshape(rows, -1).view(np.uint8)
    per_index = flat.shape[1] // array.shape[axis]
    base, row_bytes, page = array.ctypes.data, flat.shape[1], mmap.PAGESIZE
    lo, hi = start * per_index, stop * per_index
    for r in range(rows):
        first = base + r * row_bytes + lo
        aligned = first - first % page
        if _Populate.range(aligned, first - aligned + hi - lo):
            continue
        row = flat[r]
        row[lo] = 0
        row[lo + page - first % page:hi:page] = 0


class KVCache:
    """Every layer's pages [slots, 2 (K, V), num_blocks, block_size, nkv, hd / per element], in one KV
    format (quant/kv_format.py: f32, f16, bf16 or q8_0); slots is the number of layers (or, for a model
    of sliding and global layers, the layers of one group: kv_layout.py)."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, fmt: KVFormat = F32, resident_blocks: int | None = None,
                 layout: KVLayout | None = None) -> None:
        """resident_blocks: back only the first so many blocks now, the rest by back_blocks (None: all).
        layout: the layers' groups (None: one group of every layer)."""
        fmt.check_head_dim(head_dim)
        self.layout = KVLayout.single(num_layers) if layout is None else layout
        if len(self.layout.layer_slot) != num_layers:
            raise ValueError(f"layout: need {num_layers} layers, got {len(self.layout.layer_slot)}")
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.format = fmt
        shape = (self.layout.slots, 2, num_blocks, block_size, num_kv_heads, head_dim // fmt.per_element)
        if resident_blocks is None or resident_blocks >= num_blocks:
            # Allocated and made resident once, now, so the resident set does not grow later under load.
            self.pool, self.populated_by = resident_zeros(shape, fmt.dtype)
        else:
            # Blocks are handed out only once backed (engine/assembly/pool_backing.py), so none faults in later.
            self.pool, self.populated_by = reserved_zeros(shape, fmt.dtype)
            self.back_blocks(0, resident_blocks)

    def back_blocks(self, start: int, stop: int) -> None:
        """Make blocks [start, stop) resident in every layer's keys and values (MemoryError when memory
        runs out; the blocks before start stay as they are, so it may be called while they are in use)."""
        back_range(self.pool, 2, start, stop)

    def layer(self, layer: int) -> np.ndarray:
        """Layer's keys and values [2, num_blocks, block_size, nkv, hd / per element]."""
        return self.pool[self.layout.layer_slot[layer]]

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                        fmt: KVFormat = F32) -> int:
        return num_layers * 2 * block_size * num_kv_heads * fmt.head_bytes(head_dim)

    @property
    def nbytes(self) -> int:
        return self.pool.nbytes
