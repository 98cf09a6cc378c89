"""A matrix repacked at load into panels of 8 rows (quant/packed.py's layout), multiplied by the kernels of
kernels/csrc/dot_*.c: what the loaders make of every matrix in a packable GGUF format when the C kernels
are built (QuantizedWeight keeps the file's blocks as they are, for the NumPy paths and tests)."""

from __future__ import annotations

import numpy as np

from nvllm.model.kernels import matmul, threads
from nvllm.model.kernels.matmul import INT_FORMATS, dequantize_rows, dequantized_matmul, pack, quant_matmul
from nvllm.model.matrix.quantized import QuantizedWeight
from nvllm.model.matrix.weight import DECODE_ROWS, Weight
from nvllm.model.quant.blocks import BlockMatrix, checked_row_ids
from nvllm.model.quant.packed import PackedMatrix, packable


class PackedWeight(PackedMatrix, Weight):
    """W as its panels, multiplied in place by the C kernels (kernels.matmul.quant_matmul): x quantized to 8
    or 16 bits and integer dot products, for any number of rows (prefill's too: the integer GEMM is 1.2-2.7x
    BLAS on decoded rows here, and a row's product is the same bits whatever rows share its call); F16 and
    BF16 in float32, each lane of a vector its own row, up to DECODE_ROWS rows, and more rows of them
    (prefill) by BLAS on rows decoded a chunk at a time, as every format with activations "float". The
    panels hold the file's bytes, no more."""

    @classmethod
    def of(cls, w: BlockMatrix) -> PackedWeight:
        pm = pack(w)
        return cls(pm.fmt, pm.data, pm.shape)

    def _by_kernels(self, rows: int) -> bool:
        """Whether `rows` rows of x go to quant_matmul (else BLAS on decoded rows), as apply chooses."""
        return rows <= DECODE_ROWS or (self.fmt.name in INT_FORMATS and matmul.integer_products())

    def apply(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        if not self._by_kernels(x.shape[0]):
            return dequantized_matmul(self, x, out)
        return quant_matmul(self, x, threads.count, out)

    def decode_blocks(self, rows: int) -> tuple[PackedMatrix, ...] | None:
        return (self,) if self._by_kernels(rows) else None

    def rows(self, ids: np.ndarray) -> np.ndarray:
        ids = checked_row_ids(ids, self.shape[0], self.fmt.name)
        out = np.empty((len(ids), self.shape[1]), np.float32)
        for i, r in enumerate(ids.tolist()):
            dequantize_rows(self, r, r + 1, 1, out[i:i + 1])
        return out

    def dequantize(self) -> np.ndarray:
        return dequantize_rows(self, 0, self.shape[0], threads.count)

    def buffers(self) -> tuple[np.ndarray, ...]:
        return (self.data,)

    @property
    def formats(self) -> tuple[str, ...]:
        return (self.fmt.name,)


def in_kernel_layout(w: Weight) -> Weight:
    """w packed where the C kernels are built and its format is packed; w itself otherwise."""
    if matmul.lib is not None and isinstance(w, QuantizedWeight) and packable(w.fmt):
        return PackedWeight.of(w)
    return w
