"""A matrix kept in a GGUF block format (Q8_0 ... Q6_K, and the one-value blocks F16, BF16, F32),
multiplied by the blocks in place."""

from __future__ import annotations

import numpy as np

from nvllm.model.kernels import threads
from nvllm.model.kernels.matmul import FORMATS, dequantized_matmul, quant_matmul
from nvllm.model.matrix.weight import DECODE_ROWS, Weight
from nvllm.model.quant.blocks import BlockMatrix
from nvllm.model.quant.packed import PackedMatrix


class QuantizedWeight(BlockMatrix, Weight):
    """W as its blocks [out, row bytes]. Up to DECODE_ROWS rows of x (decode) the C kernels multiply by the
    blocks in place (kernels.matmul.quant_matmul: integer dot products on x quantized to 16 bits where the
    format has them); more rows (prefill) go to BLAS on the blocks decoded a chunk of rows at a time
    (kernels.matmul.dequantized_matmul). Both fall back to the NumPy twin BlockMatrix.matmul where the
    kernels were not built. No float32 copy of the matrix outlives a call. F16 and BF16 are formats of
    one-value blocks to the kernels, so they are this type too: a class of their own would repeat it."""

    def _decode(self, rows: int) -> bool:
        """Whether `rows` rows of x go to quant_matmul (F32 blocks: one row goes to BLAS, as DenseWeight's)."""
        return 2 <= rows <= DECODE_ROWS if self.fmt.name == "F32" else rows <= DECODE_ROWS

    def apply(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        decode = self._decode(x.shape[0])
        if self.fmt.name == "F32" and not decode:             # BLAS on the blocks, no copy
            w = self.blocks.view(np.float32)
            if out is None:
                return x @ w.T
            np.matmul(x, w.T, out=out)
            return out
        x = np.ascontiguousarray(x, dtype=np.float32)
        if not decode:
            # prefill: BLAS on the blocks decoded a chunk at a time (SmolLM2's Q4_1 matrices, 512 rows,
            # 2 threads: 1.3x the C tile on decoded blocks, which was itself 1.8x the integer path)
            return dequantized_matmul(self, x, out)
        return quant_matmul(self, x, threads.count, out)

    def decode_blocks(self, rows: int) -> tuple[BlockMatrix | PackedMatrix, ...] | None:
        return (self,) if self._decode(rows) and self.fmt.name in FORMATS else None

    def buffers(self) -> tuple[np.ndarray, ...]:
        return (self.blocks,)

    @property
    def formats(self) -> tuple[str, ...]:
        return (self.fmt.name,)
