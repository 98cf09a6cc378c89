"""The one way the decoder multiplies by a weight, whatever form the weight is kept in.

A weight is one of:
- a float32 ndarray [in, out] (a folder's weights, or a GGUF's dequantized ones): x @ w, through BLAS;
  the loader lays these out as the transpose of a C-contiguous [out, in], so that 2 .. SMALL_T rows of
  x (decode steps) go to the C tile for plain floats instead (matmul_kernels.float_matmul, on that
  [out, in] in place: each weight read once, no packing), and one row or more than SMALL_T (prefill)
  to BLAS, which reads the same memory as a transposed operand, no copy;
- a QuantizedWeight (out, in), a GGUF tensor's blocks kept in its file format: for up to SMALL_T rows
  of x the C matmul kernels multiply by the blocks in place (matmul_kernels.quant_matmul); for more
  (prefill) BLAS multiplies by the blocks decoded a chunk of rows at a time into a scratch buffer
  (matmul_kernels.dequantized_matmul). Both fall back to the NumPy twin QuantizedWeight.matmul where the
  kernels were not built. No float32 copy of the model exists;
- a tuple of QuantizedWeights whose outputs are laid side by side: a fused q|k|v or gate|up whose
  parts the file stores in different formats (a Q4_K_M file keeps some attn_v in Q6_K).

The token embedding is gathered by embedding_rows, which dequantizes only the rows asked for, so a
tied lm_head stays quantized too.
"""

from __future__ import annotations

from typing import Tuple, Union

import numpy as np

from nvllm.cgroup import usable_cpus
from nvllm.model.matmul_kernels import MAX_THREADS, dequantized_matmul, float_matmul, quant_matmul
from nvllm.model.quants import QuantizedWeight

Weight = Union[np.ndarray, QuantizedWeight, Tuple[QuantizedWeight, ...]]

# Rows of x for which a float32 matrix goes to the C tile rather than BLAS: SMALL_T_MIN .. SMALL_T.
# Measured with 2 threads on SmolLM2-135M's matrices (a Zen 4 with AVX-512): the tile is 1.1 to 10 times
# faster than OpenBLAS's sgemm for 2 .. 64 rows (which packs the whole matrix on every call); past ~64
# rows BLAS's packed kernels catch up. For one row BLAS's sgemv packs nothing and streams the weights
# 10-30% faster than the tile does. Every row of a batch in this range gets the same bits whatever the
# batch around it.
SMALL_T_MIN = 2
SMALL_T = 64


def default_threads() -> int:
    """model.threads = 0: one per core this process may use (its affinity mask and its cgroup's CPU
    quota, nvllm/cgroup.py), but one, left to the gRPC loop and the board's other work."""
    return max(1, usable_cpus().count - 1)


threads = min(MAX_THREADS, default_threads())   # for the in-place kernels; set_threads keeps it with BLAS's


def set_threads(n: int) -> None:
    """Threads the in-place matmul kernels use (the engine sets it with the BLAS thread count)."""
    global threads
    threads = min(MAX_THREADS, max(1, int(n)))


def linear(x: np.ndarray, w: Weight) -> np.ndarray:
    """x [T, in] float32 times the weight -> [T, out] float32, C-contiguous and writable."""
    if isinstance(w, np.ndarray):
        if SMALL_T_MIN <= x.shape[0] <= SMALL_T and w.ndim == 2 and w.dtype == np.float32 \
                and w.T.flags.c_contiguous:
            return float_matmul(w.T, np.ascontiguousarray(x, dtype=np.float32), threads)   # [out, in] in place
        return x @ w                                                     # [T, in] @ [in, out]
    if isinstance(w, QuantizedWeight):
        if w.fmt.name == "F32" and not SMALL_T_MIN <= x.shape[0] <= SMALL_T:
            return x @ w.blocks.view(np.float32).T                       # BLAS on the blocks, no copy
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.shape[0] > SMALL_T and w.fmt.name != "F32":
            # prefill: BLAS on the blocks decoded a chunk at a time (SmolLM2's Q4_1 matrices, 512 rows,
            # 2 threads: 1.3x the C tile on decoded blocks, which was itself 1.8x the integer path)
            return dequantized_matmul(w, x)
        return quant_matmul(w, x, threads)   # decode: integer dot products where the format has them
    if isinstance(w, tuple) and w:
        return np.concatenate([linear(x, part) for part in w], axis=1)   # [T, out_1 + out_2 + ...]
    raise TypeError(f"linear: not a weight: {type(w).__name__}")


def weight_nbytes(w: Weight | None) -> int:
    """Bytes the weight holds in memory (its blocks, for a quantized one)."""
    if w is None:
        return 0
    if isinstance(w, tuple):
        return sum(weight_nbytes(part) for part in w)
    return int(w.nbytes)


def embedding_rows(w: np.ndarray | QuantizedWeight, ids: np.ndarray) -> np.ndarray:
    """Rows `ids` of the token embedding [V, H] as float32 [len(ids), H]; a quantized table dequantizes
    only those rows."""
    if isinstance(w, QuantizedWeight):
        return w.rows(ids)
    return w[ids]
