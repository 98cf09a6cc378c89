"""x @ W.T for F16 and BF16 weights as the packed float kernels compute it (csrc/dot_float.h, the order
csrc/packed.h gives): the NumPy twin the tests hold every C variant to, bit for bit.

x stays float32. Each output sums its products in four float32 sums, sum j taking those at k = j mod 4 in
increasing k, each step a rounded product then a rounded add (no fused multiply-add), and the four are
added as (s0 + s1) + (s2 + s3). A reference, not a fast path: one NumPy step per four values of a row.
"""

from __future__ import annotations

import numpy as np

from nvllm.model.quant.blocks import BlockMatrix

FORMATS = ("F16", "BF16")
SUMS = 4


def matmul(w: BlockMatrix, x: np.ndarray) -> np.ndarray:
    """x [T, in] float32 -> [T, out] float32, bit for bit as the C kernels give it."""
    if w.fmt.name not in FORMATS:
        raise ValueError(f"w: the float kernels read {', '.join(FORMATS)}, not {w.fmt.name}")
    x = np.asarray(x, dtype=np.float32)
    n_out, n_in = w.shape
    if x.ndim != 2 or x.shape[1] != n_in:
        raise ValueError(f"x: need [T, {n_in}], got {list(x.shape)}")
    wf = w.dequantize()
    s = np.zeros((x.shape[0], n_out, SUMS), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for k in range(0, n_in, SUMS):
            n = min(SUMS, n_in - k)
            s[:, :, :n] += x[:, None, k:k + n] * wf[None, :, k:k + n]
        return (s[:, :, 0] + s[:, :, 1]) + (s[:, :, 2] + s[:, :, 3])
