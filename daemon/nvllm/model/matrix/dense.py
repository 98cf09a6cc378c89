"""A float32 matrix (a folder's weights, or a GGUF's dequantized ones), multiplied by BLAS or by the C tile
for plain floats."""

from __future__ import annotations

import numpy as np

from nvllm.model.kernels import threads
from nvllm.model.kernels.matmul import float_blocks, float_matmul
from nvllm.model.matrix.weight import DECODE_ROWS, Weight
from nvllm.model.quant.blocks import BlockMatrix
from nvllm.model.quant.packed import PackedMatrix


class DenseWeight(Weight):
    """W as a float32 array [out, in]. Laid out C-contiguous (as the loaders do), 2 .. DECODE_ROWS rows of x
    (batched decode) go to the C tile (kernels.matmul.float_matmul: each weight read once, no packing) and
    one row or more (prefill) to BLAS, which reads the same memory as a transposed operand: for one row its
    sgemv packs nothing and streams the weights 10-30% faster than the tile. Every row of a batch in the
    tile's range gets the same bits whatever the batch around it."""

    def __init__(self, array: np.ndarray) -> None:
        if not isinstance(array, np.ndarray) or array.ndim != 2:
            got = f"{array.dtype} {array.shape}" if isinstance(array, np.ndarray) else type(array).__name__
            raise ValueError(f"a dense weight is a 2-D array [out, in], got {got}")
        self.array = array
        self.shape = (int(array.shape[0]), int(array.shape[1]))

    def _tile(self, rows: int) -> bool:
        """Whether `rows` rows of x go to the C tile (else BLAS)."""
        a = self.array
        return 2 <= rows <= DECODE_ROWS and a.dtype == np.float32 and a.flags.c_contiguous

    def apply(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        a = self.array
        if self._tile(x.shape[0]):
            return float_matmul(a, np.ascontiguousarray(x, dtype=np.float32), threads.count, out)
        if out is None:
            return x @ a.T                                               # [T, in] @ [in, out]
        np.matmul(x, a.T, out=out)
        return out

    def decode_blocks(self, rows: int) -> tuple[BlockMatrix | PackedMatrix, ...] | None:
        return (float_blocks(self.array),) if self._tile(rows) else None

    def rows(self, ids: np.ndarray) -> np.ndarray:
        return self.array[ids]

    def dequantize(self) -> np.ndarray:
        return self.array

    def buffers(self) -> tuple[np.ndarray, ...]:
        return (self.array,)

    @property
    def formats(self) -> tuple[str, ...]:
        return ("F32",)


