"""What the matmul kernels check of their arguments before C reads raw memory by them: a weight's blocks, x,
out and the thread count, and the float32 array a plain float tile reads as F32 blocks. The C code trusts
these checks: a wrong shape, dtype or stride would read past the memory, not fail.
"""

from __future__ import annotations

import ctypes

import numpy as np

from nvllm.model.kernels.threads import MAX as MAX_THREADS
from nvllm.model.quant.blocks import BlockMatrix
from nvllm.model.quant.formats import FORMATS as _BLOCK_FORMATS

_F32 = next(f for f in _BLOCK_FORMATS.values() if f.name == "F32")


def ptr(a: np.ndarray) -> int:
    # as ops._ptr: from_buffer is the cheap way to an address, for writable contiguous memory only
    if a.flags.writeable and a.flags.c_contiguous and a.size:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))  # type: ignore[arg-type]  # stubs lack ndarray's buffer
    return a.ctypes.data


def check_weight(w: BlockMatrix) -> None:
    # The kernel walks the blocks by their row length alone: anything else would read past them.
    if not isinstance(w, BlockMatrix):
        raise ValueError(f"w: need a BlockMatrix, got {type(w).__name__}")
    b, fmt = w.blocks, w.fmt
    rows, n_in = w.shape
    row_bytes = n_in // fmt.block_elems * fmt.block_bytes
    if n_in % fmt.block_elems:
        raise ValueError(f"w: {fmt.name} rows of {n_in} values are not whole blocks of {fmt.block_elems}")
    if not isinstance(b, np.ndarray) or b.dtype != np.uint8 or b.shape != (rows, row_bytes):
        got = f"{b.dtype} {b.shape}" if isinstance(b, np.ndarray) else type(b).__name__
        raise ValueError(f"w.blocks: a {fmt.name} weight {w.shape} needs uint8 [{rows}, {row_bytes}], got {got}")
    if b.size and not b.flags.c_contiguous:
        raise ValueError(f"w.blocks: need rows of {row_bytes} bytes one after the other (C-contiguous), "
                         f"got strides {b.strides}")


def check_x(x: np.ndarray, n_in: int) -> None:
    if not isinstance(x, np.ndarray):
        raise ValueError(f"x: need a NumPy array, got {type(x).__name__}")
    if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != n_in:
        raise ValueError(f"x: need float32 [T, {n_in}], got {x.dtype} {list(x.shape)}")
    # rows may be strided (a slice of a wider array), values within a row must be contiguous
    if x.size and (x.strides[1] != 4 or x.strides[0] % 4 or x.strides[0] < 0
                   or (x.shape[0] > 1 and x.strides[0] < 4 * n_in)):
        raise ValueError(f"x: need rows of contiguous float32 values at a positive row stride, got strides "
                         f"{x.strides}")


def check_out(out: np.ndarray, shape: tuple[int, int], x: np.ndarray) -> None:
    if not isinstance(out, np.ndarray):
        raise ValueError(f"out: need a NumPy array, got {type(out).__name__}")
    # rows may be spaced wider (the columns of a wider array: a fused weight's parts), each row contiguous
    rows_ok = out.size == 0 or (out.strides[1] == 4 and out.strides[0] % 4 == 0
                                and (shape[0] == 1 or out.strides[0] >= 4 * shape[1]))
    if out.dtype != np.float32 or out.shape != shape or not rows_ok:
        raise ValueError(f"out: need a float32 {list(shape)} with contiguous rows, got {out.dtype} "
                         f"{list(out.shape)} strides {out.strides}")
    if not out.flags.writeable:
        raise ValueError("out: is written, but is read-only")
    if np.may_share_memory(out, x):
        raise ValueError("out: overlaps x; the kernel reads x while it writes out")


def check_threads(threads: int) -> None:
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or not 1 <= threads <= MAX_THREADS:
        raise ValueError(f"threads: need an integer in [1, {MAX_THREADS}], got {threads!r}")


def float_blocks(w: np.ndarray) -> BlockMatrix:
    """A C-contiguous float32 w [out, in] as a BlockMatrix of format F32 over the same memory (no copy):
    what the plain float tile multiplies."""
    if not isinstance(w, np.ndarray) or w.dtype != np.float32 or w.ndim != 2:
        got = f"{w.dtype} {list(w.shape)}" if isinstance(w, np.ndarray) else type(w).__name__
        raise ValueError(f"w: need a float32 [out, in] array, got {got}")
    if w.size and not w.flags.c_contiguous:
        raise ValueError(f"w: need rows of {w.shape[1]} values one after the other (C-contiguous), "
                         f"got strides {w.strides}")
    blocks = w.view(np.uint8) if w.size else np.zeros((w.shape[0], 4 * w.shape[1]), np.uint8)
    return BlockMatrix(_F32, blocks, w.shape)
