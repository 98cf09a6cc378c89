"""What every matrix of a linear layer is: W [out, in] in some storage, and the one way to multiply by it
(vLLM's quant_method.apply). model/decoder.py calls `apply` and asks nothing else; each loader builds the
storage a matrix needs. A new storage is one subclass in this folder, its kernel in model/kernels/.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from nvllm.model.quant.blocks import BlockMatrix
from nvllm.model.quant.packed import PackedMatrix

# Rows of x up to which a call is a decode step for the kernels (the C tiles and the integer dot
# products); more rows (prefill) go to BLAS. Measured with 2 threads on SmolLM2-135M's matrices (a Zen 4
# with AVX-512): the float tile is 1.1 to 10 times faster than OpenBLAS's sgemm for 2 .. 64 rows (which
# packs the whole matrix on every call); past ~64 rows BLAS's packed kernels catch up.
DECODE_ROWS = 64


class Weight(ABC):
    """A matrix W [out, in]: `apply(x)` is x @ W.T for x [T, in] float32."""

    shape: tuple[int, int]   # (out, in)

    @abstractmethod
    def apply(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """x [T, in] float32 -> x @ W.T [T, out] float32; into `out` when given (a float32 [T, out] whose
        rows may be spaced wider, as a slice of the columns of a wider array is)."""

    @abstractmethod
    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of W as float32 [len(ids), in]: a token embedding's lookup."""

    @abstractmethod
    def dequantize(self) -> np.ndarray:
        """W as float32 [out, in]."""

    @abstractmethod
    def buffers(self) -> tuple[np.ndarray, ...]:
        """The arrays that hold W, to count memory shared between weights once."""

    @property
    @abstractmethod
    def formats(self) -> tuple[str, ...]:
        """llama.cpp's name of each part's storage ("F32", "Q4_K", ...)."""

    def decode_blocks(self, rows: int) -> tuple[BlockMatrix | PackedMatrix, ...] | None:
        """What `apply` multiplies `rows` rows of x by through kernels.matmul.quant_matmul, as BlockMatrix or
        PackedMatrix parts in output column order; None where it takes another path (BLAS, a NumPy twin). A decode
        step's layers run in one C call only when every matrix has them (kernels/step.py)."""
        return None

    @property
    def nbytes(self) -> int:
        return sum(int(b.nbytes) for b in self.buffers())

    def shares_memory(self, other: Weight) -> bool:
        return any(np.shares_memory(a, b) for a in self.buffers() for b in other.buffers())


def new_out(x: np.ndarray, n_out: int, out: np.ndarray | None) -> np.ndarray:
    """`out`, or a new float32 [T, n_out] for it."""
    return np.empty((x.shape[0], n_out), np.float32) if out is None else out
