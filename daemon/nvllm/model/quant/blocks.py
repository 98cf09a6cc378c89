"""A tensor held as its blocks in a GGUF format, and the NumPy product by it: the reference the C
kernels (model/kernels/) are held to, and the path where they were not built.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from nvllm.model.quant.dequantize import check_raw, dequantize, dequantize_into
from nvllm.model.quant.formats import BlockFormat, raw_nbytes, rows_and_blocks

_CHUNK_VALUES = 1 << 18  # values matmul dequantizes at a time: 1 MB of float32, near the cache


@dataclass
class BlockMatrix:
    """A matrix kept in its file format: its blocks, and the NumPy product by them (model/matrix's
    QuantizedWeight adds the C kernels)."""

    fmt: BlockFormat
    blocks: np.ndarray  # uint8 [rows, row_bytes], a view of the mapped file
    shape: tuple[int, int]  # (out_features, in_features): GGUF's [rows, row length]

    def __post_init__(self) -> None:
        self.shape = tuple(int(n) for n in self.shape)  # type: ignore[assignment]
        if len(self.shape) != 2:
            raise ValueError(f"a {self.fmt.name} weight is 2-D, got shape {self.shape}")
        rows, per_row = rows_and_blocks(self.fmt, self.shape)
        want = (rows, per_row * self.fmt.block_bytes)
        b = self.blocks
        if not isinstance(b, np.ndarray) or b.dtype != np.uint8 or b.shape != want:
            got = f"{b.dtype} {b.shape}" if isinstance(b, np.ndarray) else type(b).__name__
            raise ValueError(f"{self.fmt.name} weight of shape {self.shape} needs uint8 blocks {want}, got {got}")

    @classmethod
    def from_raw(cls, fmt: BlockFormat, raw: np.ndarray, shape: tuple[int, int]) -> BlockMatrix:
        """From the tensor's raw bytes (1-D uint8, exactly raw_nbytes), without copying them."""
        if len(shape) != 2:
            raise ValueError(f"a {fmt.name} weight is 2-D, got shape {tuple(shape)}")
        check_raw(fmt, raw, shape)
        rows = int(shape[0])
        return cls(fmt, raw.reshape(rows, raw_nbytes(fmt, shape[1:])), shape)

    @property
    def nbytes(self) -> int:
        return int(self.blocks.nbytes)

    def dequantize(self) -> np.ndarray:
        """float32 [out, in] (for F32, a view of the blocks)."""
        return self._rows(0, self.shape[0])

    def _rows(self, start: int, stop: int) -> np.ndarray:
        """Rows start:stop as float32 [stop - start, in]."""
        raw = self.blocks[start:stop].reshape(-1)  # rows are contiguous in the file: a view
        return dequantize(self.fmt, raw, (stop - start, self.shape[1]))

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` (1-D integers, each in 0..out-1) as float32 [len(ids), in], dequantizing only those
        rows: an embedding lookup in a token table kept in its file format."""
        ids = checked_row_ids(ids, self.shape[0], self.fmt.name)
        raw = self.blocks[ids.astype(np.intp)].reshape(-1)  # [n, row_bytes] gathered, then flat
        return dequantize(self.fmt, raw, (len(ids), self.shape[1]))

    def matmul(self, x: np.ndarray, decode: Callable[[int, int, np.ndarray], object] | None = None,
               scratch: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """x [T, in] -> x @ W.T [T, out] float32, dequantizing a bounded chunk of rows at a time and
        multiplying by it with BLAS. decode(start, stop, out) writes rows start:stop dequantized into `out`,
        its result unused (NumPy's dequantizer unless given: kernels.matmul passes its C one); scratch,
        float32 of at least one row, holds the chunk (one of _CHUNK_VALUES is made unless given); the product
        goes into `out` when given (float32 [T, out], its rows possibly spaced wider)."""
        x = np.asarray(x, dtype=np.float32)
        n_out, n_in = self.shape
        if x.ndim != 2 or x.shape[1] != n_in:
            raise ValueError(f"matmul by a {self.fmt.name} weight {self.shape} needs x [T, {n_in}], got {x.shape}")
        y = np.empty((x.shape[0], n_out), np.float32) if out is None else out
        if self.fmt.name == "F32":
            np.matmul(x, self._rows(0, n_out).T, out=y)
            return y
        if decode is None:
            def decode(start: int, stop: int, out: np.ndarray) -> None:
                dequantize_into(self.fmt, self.blocks[start:stop].reshape(-1), out)
        return chunked_matmul(self.shape, x, decode, scratch, y)


def checked_row_ids(ids: np.ndarray, n_rows: int, fmt_name: str) -> np.ndarray:
    """ids as a 1-D integer array of rows of a weight of n_rows rows, or a ValueError naming the bad one."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
        raise ValueError(f"rows of a {fmt_name} weight need 1-D integer ids, got {ids.dtype} {ids.shape}")
    bad = ids[(ids < 0) | (ids >= n_rows)]
    if bad.size:
        raise ValueError(f"row id {int(bad[0])} is out of range for a {fmt_name} weight of {n_rows} rows")
    return ids


def chunked_matmul(shape: tuple[int, int], x: np.ndarray, decode: Callable[[int, int, np.ndarray], object],
                   scratch: np.ndarray | None, y: np.ndarray) -> np.ndarray:
    """y = x @ W.T for W [out, in] of `shape` decoded a chunk of rows at a time into scratch by decode(start,
    stop, out) and multiplied by BLAS (BlockMatrix.matmul's loop, for any storage that decodes rows)."""
    n_out, n_in = shape
    if scratch is None:
        scratch = np.empty(_CHUNK_VALUES, np.float32)
    step = max(1, min(n_out, scratch.size // max(1, n_in)))
    for start in range(0, n_out, step):   # one chunk for most matrices: BLAS writes y itself
        stop = min(n_out, start + step)
        w = scratch[:(stop - start) * n_in].reshape(stop - start, n_in)
        decode(start, stop, w)
        np.matmul(x, w.T, out=y[:, start:stop])
    return y
