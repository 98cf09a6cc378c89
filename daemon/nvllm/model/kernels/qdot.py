"""x @ W.T with x quantized to 16 or 8 bits and integer dot products: the NumPy twin of the kernels of
csrc/dot_*.c (csrc/packed.h).

For Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 weights (Q5_0's quants in -16..15, as Q4_0's are in -8..7; Q5_1's in
0..31 with Q4_1's min term), IQ4_NL (Q8_0's shape, its quants the table values its nibbles index), Q4_K
and Q5_K (each 32-value sub-block taken as a Q4_1 block whose scale is d * sc and whose min is -(dmin *
m)), IQ4_XS (each sub-block an IQ4_NL block of scale d * (sc - 32)), Q6_K and Q3_K (each half of 16
values summed and scaled by its own d * sc) and Q2_K (as Q3_K, then each half's min -(dmin * m) times
the sum of its 16 quants of x), the C kernels quantize each row of x, 32 values at a time, to 16 bits
(the "-i16" variants, the default: at most 32512, so that the kernels hold a quant as two int8 planes)
or int8 (as llama.cpp quantizes activations to its Q8_0 / Q8_1 blocks) with one float32 scale, sum each
block's products of integers exactly in int32, then scale in float32. This module does the same
arithmetic in the same order (csrc/packed.h gives it), so its result equals the C kernels' bit for bit;
the tests hold every C variant to it. It is a reference, not a fast path: BlockMatrix.matmul (weights
decoded to float32, x kept float32) is the exact product the quantized one is compared with.
"""
from __future__ import annotations

import numpy as np

from nvllm.model.quant.blocks import BlockMatrix
from nvllm.model.quant.dequantize import iq4nl_parts, iq4xs_parts, k4_parts, q2k_parts, q3k_parts, q6_parts
from nvllm.model.quant.formats import QK, QK_K

# Those with integer kernels, for x in 16 or 8 bits alike.
FORMATS = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")
# x's quants: largest magnitude, type. 16 bits: 127 * 255 + 127, so that the kernels hold each quant as two
# int8 planes, q = 255 hi + lo (csrc/packed.h)
BITS = {8: (127, np.int8), 16: (32512, np.int16)}
_ROUNDER = np.float32(12582912.0)  # 1.5 * 2^23: adding and taking it away rounds to an integer, ties to even


def quantize_rows(x: np.ndarray, bits: int = 8) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x float32 [T, in] (in a multiple of 32) -> (d [T, nb] float32, q [T, nb, 32] int8 or int16 for bits 8
    or 16, s [T, nb] float32): each block of 32 values is d * q with d = amax / 127 (or / 32512), and
    s = d * sum(q). A block with NaN or inf gets d = s = NaN, q = 0."""
    if bits not in BITS:
        raise ValueError(f"bits: need 8 or 16, got {bits!r}")
    qmax, qtype = BITS[bits]
    x = np.asarray(x, dtype=np.float32)
    T, n_in = x.shape
    if n_in % QK:
        raise ValueError(f"x: rows of {n_in} values are not whole blocks of {QK}")
    v = x.reshape(T, n_in // QK, QK)
    with np.errstate(invalid="ignore", over="ignore"):
        a = np.abs(v)
        finite = np.all(a <= np.finfo(np.float32).max, axis=2)
        amax = np.where(finite, np.max(np.where(np.isnan(a), 0, a), axis=2), 0).astype(np.float32)
        d = amax / np.float32(qmax)
        nz = d != 0
        idv = np.where(nz, np.float32(1) / np.where(nz, d, np.float32(1)), np.float32(0)).astype(np.float32)
        scaled = np.where(finite[:, :, None], v * idv[:, :, None], np.float32(0)).astype(np.float32)
    q = ((scaled + _ROUNDER) - _ROUNDER).astype(qtype)
    s = d * q.astype(np.int32).sum(axis=2).astype(np.float32)
    d = np.where(finite, d, np.float32(np.nan)).astype(np.float32)
    s = np.where(finite, s, np.float32(np.nan)).astype(np.float32)
    return d, q, s


def weight_quants(w: BlockMatrix) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(dw [out, nb] float32, quants [out, nb, 32] int8 as the dot products take them, mw [out, nb] or None);
    for Q6_K, Q3_K and Q2_K dw is [out, nb, 2], a scale for each half of 16 values (and Q2_K's mw a min
    for each half)."""
    name = w.fmt.name
    if name not in FORMATS:
        raise ValueError(f"w: no integer kernel for {name}; those are {', '.join(FORMATS)}")
    n_out, n_in = w.shape
    nb = n_in // QK
    if name == "Q6_K":
        q, scales = q6_parts(w.blocks.reshape(n_out * (n_in // QK_K), w.fmt.block_bytes))
        return scales.reshape(n_out, nb, 2), np.ascontiguousarray(q.reshape(n_out, nb, QK)), None
    blocks = w.blocks.reshape(-1, w.fmt.block_bytes)
    if name == "Q2_K":
        q, d, dm = q2k_parts(blocks)
        return (d.reshape(n_out, nb, 2), np.ascontiguousarray(q.reshape(n_out, nb, QK).astype(np.int8)),
                (-dm).reshape(n_out, nb, 2))
    if name == "Q3_K":
        q, d = q3k_parts(blocks)
        return d.reshape(n_out, nb, 2), np.ascontiguousarray(q.reshape(n_out, nb, QK)), None
    if name in ("IQ4_NL", "IQ4_XS"):
        q, d = iq4nl_parts(blocks) if name == "IQ4_NL" else iq4xs_parts(blocks)
        return d.reshape(n_out, nb), np.ascontiguousarray(q.reshape(n_out, nb, QK)), None
    if name in ("Q4_K", "Q5_K"):   # each sub-block of 32 as a Q4_1 block: dw = d * sc, mw = -(dmin * m)
        q, d, dm = k4_parts(w.blocks.reshape(n_out * (n_in // QK_K), w.fmt.block_bytes), name)
        return (d.reshape(n_out, nb), np.ascontiguousarray(q.reshape(n_out, nb, QK).astype(np.int8)),
                (-dm).reshape(n_out, nb))
    b = w.blocks.reshape(n_out, nb, w.fmt.block_bytes)
    dw = b[:, :, 0:2].copy().view("<f2")[:, :, 0].astype(np.float32)
    mw = None
    if name == "Q8_0":
        q = b[:, :, 2:].view(np.int8)
    else:
        five = name in ("Q5_0", "Q5_1")
        qs_at = {"Q4_0": 2, "Q4_1": 4, "Q5_0": 6, "Q5_1": 8}[name]
        qs = b[:, :, qs_at:qs_at + QK // 2]
        q = np.concatenate([qs & 15, qs >> 4], axis=2).astype(np.int8)  # low nibbles, then high
        if five:   # bit j of the little-endian uint32 qh (before qs) is value j's fifth bit
            qh = np.ascontiguousarray(b[:, :, qs_at - 4:qs_at])
            q |= (np.unpackbits(qh, axis=2, bitorder="little") << 4).astype(np.int8)
        if name in ("Q4_0", "Q5_0"):
            q -= 16 if five else 8
        else:
            mw = b[:, :, 2:4].copy().view("<f2")[:, :, 0].astype(np.float32)
    return dw, np.ascontiguousarray(q), mw


def matmul(w: BlockMatrix, x: np.ndarray, bits: int = 8) -> np.ndarray:
    """x [T, in] float32 -> [T, out] float32 as csrc/dot_*.c compute it with x in `bits` (8 or 16), bit for
    bit. Each block's 32 products sum exactly in int32 (at most 32 * 128 * 32512 < 2^27)."""
    x = np.asarray(x, dtype=np.float32)
    n_out, n_in = w.shape
    if x.ndim != 2 or x.shape[1] != n_in:
        raise ValueError(f"x: need [T, {n_in}], got {list(x.shape)}")
    T = x.shape[0]
    dx, qx, sx = quantize_rows(x, bits)
    dw, qw, mw = weight_quants(w)
    nb = n_in // QK
    acc = np.zeros((T, n_out), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for b in range(nb):
            if dw.ndim == 3:   # Q6_K, Q3_K, Q2_K: each half of 16 values summed and scaled apart, the low one first
                for h in (0, 1):
                    part = slice(16 * h, 16 * h + 16)
                    p = (qx[:, b, part].astype(np.int32) @ qw[:, b, part].astype(np.int32).T).astype(np.float32)
                    acc += (dx[:, b][:, None] * dw[:, b, h][None, :]) * p
                if mw is not None:   # Q2_K: then each half's min times the half's sum of x's quants
                    for h in (0, 1):
                        sx_h = qx[:, b, 16 * h:16 * h + 16].astype(np.int32).sum(axis=1).astype(np.float32)
                        acc += (dx[:, b][:, None] * mw[:, b, h][None, :]) * sx_h[:, None]
                continue
            p = (qx[:, b].astype(np.int32) @ qw[:, b].astype(np.int32).T).astype(np.float32)  # exact [T, out]
            dd = dx[:, b][:, None] * dw[:, b][None, :]  # one rounding
            acc += dd * p
            if mw is not None:
                acc += sx[:, b][:, None] * mw[:, b][None, :]
    return acc
