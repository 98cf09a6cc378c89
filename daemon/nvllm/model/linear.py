"""The one way the decoder multiplies by a weight, whatever form the weight is kept in.

A weight is one of:
- a float32 ndarray [in, out] (a folder's weights, or a GGUF's dequantized ones): x @ w, through BLAS;
- a QuantizedWeight (out, in), a GGUF tensor's blocks kept in its file format: the C matmul kernels
  multiply by the blocks in place (matmul_kernels.quant_matmul, itself falling back to the NumPy twin
  QuantizedWeight.matmul where the kernels were not built), so no float32 copy of the model exists;
- a tuple of QuantizedWeights whose outputs are laid side by side: a fused q|k|v or gate|up whose
  parts the file stores in different formats (a Q4_K_M file keeps some attn_v in Q6_K).

The token embedding is gathered by embedding_rows, which dequantizes only the rows asked for, so a
tied lm_head stays quantized too.
"""

from __future__ import annotations

import os
from typing import Tuple, Union

import numpy as np

from nvllm.model.matmul_kernels import MAX_THREADS, quant_matmul
from nvllm.model.quants import QuantizedWeight

Weight = Union[np.ndarray, QuantizedWeight, Tuple[QuantizedWeight, ...]]


def default_threads() -> int:
    """One per core this process may use, but one (left to the gRPC loop and the board's other work)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - 1)


threads = min(MAX_THREADS, default_threads())   # for the in-place kernels; set_threads keeps it with BLAS's


def set_threads(n: int) -> None:
    """Threads the in-place matmul kernels use (the engine sets it with the BLAS thread count)."""
    global threads
    threads = min(MAX_THREADS, max(1, int(n)))


def linear(x: np.ndarray, w: Weight) -> np.ndarray:
    """x [T, in] float32 times the weight -> [T, out] float32, C-contiguous and writable."""
    if isinstance(w, np.ndarray):
        return x @ w                                                     # [T, in] @ [in, out]
    if isinstance(w, QuantizedWeight):
        return quant_matmul(w, np.ascontiguousarray(x, dtype=np.float32), threads)
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
