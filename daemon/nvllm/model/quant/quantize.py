"""Quantizers: float32 weights [rows, in] -> the GGUF block bytes of Q8_0, Q5_0, Q5_1, Q4_0, the K-quants
(Q2_K .. Q6_K; Q2_K and Q3_K in quantize_k.py), IQ4_NL and IQ4_XS (quantize_iq4.py), BF16, F16.

The inverse of dequantize.py's dequantizers, in vectorised NumPy. Each follows llama.cpp's reference
quantizer (quantize_row_*_ref in ggml-quants.c, the one its tools use without an importance matrix) in
float32 and in the same order of operations, so the blocks are those llama.cpp would write: Q8_0, Q5_0,
Q5_1, Q4_0, BF16 and F16 bit for bit as `gguf.quants.quantize` writes them; the K-quants, IQ4_NL and
IQ4_XS, which gguf does not write, bit for bit as plain scalar transcriptions of the reference
(tests/model/quant/test_quantize.py and test_quantize_k.py hold them).

choose_format() picks a matrix's format for model.quantization (model/weights/conversion.py applies it
as the loader lays the matrices out): a matrix whose row length is not a whole number of the format's
blocks falls back as llama.cpp does, to a type it fits of no lower quality (Q4_K -> Q8_0 -> F32).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from nvllm.model.quant import quantize_iq4, quantize_k
from nvllm.model.quant.fitting import f16_bytes, fit_min_scale, inverse, nearest_int, round_away, running_sum
from nvllm.model.quant.formats import FORMATS, QK, QK_K, BlockFormat

# model.quantization's values -> llama.cpp's type names
KINDS: dict[str, str] = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_k": "Q4_K", "bf16": "BF16", "f16": "F16"}
# where a matrix goes when its rows do not split into the asked format's blocks (llama.cpp's rule:
# the next type that fits, of no lower quality)
FALLBACK: dict[str, str] = {"Q4_K": "Q8_0", "Q4_0": "F32", "Q8_0": "F32"}
_BY_NAME: dict[str, BlockFormat] = {f.name: f for f in FORMATS.values()}

_CHUNK_VALUES = 1 << 18  # values quantized at a time: the temporaries (1 MB each) stay in L2


# ---------------------------------------------------------------- the formats
# Each takes blocks x [m, block_elems] float32 (C-contiguous) and returns their bytes [m, block_bytes].


def _q8_0(x: np.ndarray) -> np.ndarray:
    """Where the reference is undefined (a quotient that is NaN, or past +-127 when 1/d overflows) the
    quant is 0, or clamped: the block's d then carries the NaN or inf on. The KV pool's q8_0 writes
    (csrc/ops.c) are held to this."""
    d = np.abs(x).max(axis=1) / np.float32(127)  # [m]
    r = round_away(np.clip(x * inverse(d)[:, None], np.float32(-127), np.float32(127)))
    q = np.where(np.isnan(r), np.float32(0), r).astype(np.int8)  # [m, 32]
    return np.concatenate([f16_bytes(d), q.view(np.uint8)], axis=1)


def _q4_0(x: np.ndarray) -> np.ndarray:
    """The scale is the value of largest magnitude (the first such) over -8, so it maps to 0."""
    m = len(x)
    big = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)[:, 0]  # [m]
    d = big / np.float32(-8)
    q = np.trunc(x * inverse(d)[:, None] + np.float32(8.5))  # (int8_t) truncates toward zero
    q = np.minimum(q, 15).astype(np.uint8).reshape(m, 2, QK // 2)  # value j and j + 16 share byte j
    return np.concatenate([f16_bytes(d), q[:, 0] | (q[:, 1] << 4)], axis=1)


def _q5_0(x: np.ndarray) -> np.ndarray:
    """As Q4_0 with 32 levels: the scale is the value of largest magnitude over -16; each quant's fifth
    bit goes to the 32-bit qh, bit j for value j."""
    m = len(x)
    big = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)[:, 0]  # [m]
    d = big / np.float32(-16)
    q = np.minimum(np.trunc(x * inverse(d)[:, None] + np.float32(16.5)), 31).astype(np.uint32)  # [m, 32]
    qh = (((q >> 4) & 1) << np.arange(QK, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)  # [m]
    q = (q & 0x0F).astype(np.uint8).reshape(m, 2, QK // 2)
    return np.concatenate([f16_bytes(d), qh.astype("<u4").view(np.uint8).reshape(m, 4),
                           q[:, 0] | (q[:, 1] << 4)], axis=1)


def _q5_1(x: np.ndarray) -> np.ndarray:
    """The block's span [min, max] in 31 steps of d, min stored as m; each quant's fifth bit to qh, bit j
    for value j (as gguf.quants writes it: the quants rounded up from a half and held to 31)."""
    m = len(x)
    lo, hi = x.min(axis=1), x.max(axis=1)
    d = (hi - lo) / np.float32(31)
    q = np.minimum(np.trunc((x - lo[:, None]) * inverse(d)[:, None] + np.float32(0.5)), 31).astype(np.uint32)
    qh = (((q >> 4) & 1) << np.arange(QK, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)  # [m]
    q = (q & 0x0F).astype(np.uint8).reshape(m, 2, QK // 2)
    return np.concatenate([f16_bytes(d), f16_bytes(lo), qh.astype("<u4").view(np.uint8).reshape(m, 4),
                           q[:, 0] | (q[:, 1] << 4)], axis=1)


def _bf16(x: np.ndarray) -> np.ndarray:
    """The top half of each float32, rounded to nearest even; a NaN stays a (quiet) NaN."""
    n = x.view(np.uint32).copy()
    nan = (n & 0x7FFFFFFF) > 0x7F800000
    n[nan] = (n[nan] & np.uint32(0xFFFF0000)) | np.uint32(0x00400000)
    n += np.uint32(0x7FFF) + ((n >> 16) & 1)  # never wraps: the largest non-NaN is -inf
    return (n >> 16).astype("<u2").view(np.uint8).reshape(len(x), -1)


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype("<f2").view(np.uint8).reshape(len(x), -1)


def _f32(x: np.ndarray) -> np.ndarray:
    return x.astype("<f4").view(np.uint8).reshape(len(x), -1)


# ---------------------------------------------------------------- Q4_K

def _six_bits(values: np.ndarray, top: np.ndarray) -> np.ndarray:
    """values [m, 8] >= 0 -> nearest_int(63 / top * v) as uint8, at most 63 (0 where top is not > 0)."""
    inv = np.where(top > 0, np.float32(63) / np.where(top > 0, top, np.float32(1)), np.float32(0))  # [m]
    q = nearest_int(inv[:, None] * values).astype(np.int64) & 0xFF  # the C stores an int in a uint8_t
    return np.minimum(q, 63).astype(np.uint8)


def _pack_k4_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Six-bit scales and mins [m, 8] -> the 12 scale bytes (the layout dequantize._k4_scales reads)."""
    out = np.empty((len(ls), 12), np.uint8)
    out[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    out[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:] & 0x0F) | ((lm[:, 4:] & 0x0F) << 4)
    return out


def _k4(x: np.ndarray, nmax: int) -> np.ndarray:
    """quantize_row_q4_K_ref (nmax 15) and quantize_row_q5_K_ref (nmax 31): each super-block of 256 is 8
    sub-blocks of 32, each fitted as scale * q - min (q in 0..nmax, weights rms(sub-block) + |x|); the
    scales and mins are then stored as 6-bit multiples of d = max scale / 63 and dmin = max min / 63, and
    the quants are made again against those stored values. Q5_K's fifth bits go to qh: bit 2i of qh[l]
    for value l of sub-block 2i, bit 2i + 1 for sub-block 2i + 1."""
    m = len(x)
    cols = np.ascontiguousarray(x.reshape(m * 8, 32).T)  # [32, 8m]: one column per sub-block
    rms = np.sqrt(running_sum(cols * cols) / np.float32(32))
    if nmax == 15:
        L, scales, mins = fit_min_scale(cols, rms + np.abs(cols))
    else:
        L, scales, mins = fit_min_scale(cols, rms + np.abs(cols), nmax=31, rmin=-0.5, rdelta=0.1, nstep=15)
    scales, mins = scales.reshape(m, 8), mins.reshape(m, 8)
    max_scale = np.maximum(scales.max(axis=1), 0)  # [m]; the reference starts both at 0
    max_min = np.maximum(mins.max(axis=1), 0)
    ls, lm = _six_bits(scales, max_scale), _six_bits(mins, max_min)
    d16 = (max_scale / np.float32(63)).astype("<f2")
    dmin16 = (max_min / np.float32(63)).astype("<f2")
    d = d16.astype(np.float32)[:, None] * ls  # [m, 8] the stored scale of each sub-block
    dm = dmin16.astype(np.float32)[:, None] * lm
    sub = x.reshape(m, 8, 32)
    again = np.clip(nearest_int((sub + dm[:, :, None]) / np.where(d == 0, np.float32(1), d)[:, :, None]), 0, nmax)
    first = L.T.reshape(m, 8, 32)  # a sub-block whose stored scale is 0 keeps its first quants
    q = np.where((d == 0)[:, :, None], first, again).astype(np.uint8)  # [m, 8, 32]
    head = np.concatenate([d16.view(np.uint8).reshape(m, 2), dmin16.view(np.uint8).reshape(m, 2),
                           _pack_k4_scales(ls, lm)], axis=1)
    if nmax == 31:
        fifth = (q >> 4) << np.arange(8, dtype=np.uint8)[:, None]   # sub-block s's bit at bit s of qh[l]
        head = np.concatenate([head, np.bitwise_or.reduce(fifth, axis=1)], axis=1)
        q &= 0x0F
    q = q.reshape(m, 4, 2, 32)
    qs = q[:, :, 0] | (q[:, :, 1] << 4)  # [m, 4, 32]: run i holds sub-block 2i low, 2i + 1 high
    return np.concatenate([head, qs.reshape(m, QK_K // 2)], axis=1)


def _q4_k(x: np.ndarray) -> np.ndarray:
    return _k4(x, 15)


def _q5_k(x: np.ndarray) -> np.ndarray:
    return _k4(x, 31)


# ---------------------------------------------------------------- Q6_K

_Q6K_TRIES = [np.float32(0.1) * np.float32(i) for i in range(-9, 10) if i]  # make_qx_quants' is = -9..9


def _fit_symmetric(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """make_qx_quants(n 16, nmax 32, rmse_type 1) for every sub-block at once: x [16, s] (a column per
    sub-block) -> (quants L [16, s] in 0..63, scale [s]) with x ~ scale * (L - 32).

    The first try maps the value of largest magnitude to -32; 18 nearby scales are then tried, and the
    one whose quants best fit in the x^2-weighted least squares sense (largest sumlx^2 / suml2) is kept."""
    big = np.take_along_axis(x, np.abs(x).argmax(axis=0)[None, :], axis=0)[0]  # [s]
    zero = np.abs(big) < np.float32(1e-15)  # GROUP_MAX_EPS: an all-zero sub-block, quants 0, scale 0
    big = np.where(zero, np.float32(1), big)
    w = x * x

    def fit(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lq = np.clip(nearest_int(iscale * x), -32, 31)
        wx = w * x
        return lq, running_sum(wx * lq), running_sum((w * lq) * lq)

    lq, sumlx, suml2 = fit(np.float32(-32) / big)
    L = lq + 32
    scale = np.where(suml2 != 0, sumlx / np.where(suml2 != 0, suml2, np.float32(1)), np.float32(0))
    best = scale * sumlx
    for step in _Q6K_TRIES:
        lq, sumlx, suml2 = fit(-(np.float32(32) + step) / big)
        take = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        L = np.where(take, lq + 32, L)
        scale = np.where(take, sumlx / np.where(take, suml2, np.float32(1)), scale)
        best = np.where(take, scale * sumlx, best)
    L[:, zero] = 0
    return L, np.where(zero, np.float32(0), scale)


def _q6_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q6_K_ref: each super-block of 256 is 16 sub-blocks of 16, each fitted as scale * q
    (q in -32..31); the scales are stored as int8 multiples of d = -(largest-magnitude scale) / 128, and
    the quants are made again against those stored scales. A super-block of all-zero scales is all zero."""
    m = len(x)
    cols = np.ascontiguousarray(x.reshape(m * 16, 16).T)  # [16, 16m]: one column per sub-block
    L, scales = _fit_symmetric(cols)
    scales = scales.reshape(m, 16)
    top = np.take_along_axis(scales, np.abs(scales).argmax(axis=1)[:, None], axis=1)[:, 0]  # [m]
    empty = np.abs(top) < np.float32(1e-15)
    iscale = np.float32(-128) / np.where(empty, np.float32(1), top)
    d16 = np.where(empty, np.float32(0), np.float32(1) / iscale).astype("<f2")
    ls = np.minimum(nearest_int(iscale[:, None] * scales), 127).astype(np.int8)  # [m, 16]
    d = d16.astype(np.float32)[:, None] * ls  # [m, 16] the stored scale of each sub-block
    sub = x.reshape(m, 16, 16)
    again = np.clip(nearest_int(sub / np.where(d == 0, np.float32(1), d)[:, :, None]), -32, 31) + 32
    first = L.T.reshape(m, 16, 16)  # a sub-block whose stored scale is 0 keeps its first quants
    q = np.where((d == 0)[:, :, None], first, again).astype(np.uint8).reshape(m, 2, 4, 32)  # half, k, l
    ql = (q[:, :, :2] & 0x0F) | ((q[:, :, 2:] & 0x0F) << 4)  # [m, 2, 2, 32]: ql[l + 32k] holds k and k + 2
    qh = (q >> 4) << np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]
    qh = qh[:, :, 0] | qh[:, :, 1] | qh[:, :, 2] | qh[:, :, 3]  # [m, 2, 32]
    out = np.concatenate([ql.reshape(m, 128), qh.reshape(m, 64), ls.view(np.uint8),
                          d16.view(np.uint8).reshape(m, 2)], axis=1)
    out[empty] = 0
    return out


_QUANTIZERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "F32": _f32, "F16": _f16, "BF16": _bf16, "Q8_0": _q8_0, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q4_0": _q4_0,
    "Q6_K": _q6_k, "Q5_K": _q5_k, "Q4_K": _q4_k, "Q3_K": quantize_k.q3_k, "Q2_K": quantize_k.q2_k,
    "IQ4_NL": quantize_iq4.iq4_nl, "IQ4_XS": quantize_iq4.iq4_xs,
}
WRITES = tuple(_QUANTIZERS)  # the formats this module writes


# ---------------------------------------------------------------- entry points


def quantize(fmt: BlockFormat, x: np.ndarray) -> np.ndarray:
    """float32 x [rows, n] -> its blocks in `fmt` as uint8 [rows, n / block_elems * block_bytes].

    ValueError when fmt is not one nvllm writes, x is not a 2-D float32 array, or n is not a whole
    number of blocks."""
    if fmt.name not in _QUANTIZERS:
        raise ValueError(f"nvllm does not quantize to {fmt.name}; it writes {', '.join(WRITES)}")
    if not isinstance(x, np.ndarray) or x.ndim != 2 or x.dtype != np.float32:
        what = f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
        raise ValueError(f"quantizing to {fmt.name} takes a 2-D float32 array, got {what}")
    rows, n = x.shape
    if n % fmt.block_elems:
        raise ValueError(f"{fmt.name} row length {n} is not a multiple of its block of {fmt.block_elems} values")
    per_row = n // fmt.block_elems
    out = np.empty((rows, per_row * fmt.block_bytes), np.uint8)
    if rows == 0 or n == 0:
        return out
    blocks = np.ascontiguousarray(x).reshape(rows * per_row, fmt.block_elems)
    flat = out.reshape(rows * per_row, fmt.block_bytes)
    step = max(1, _CHUNK_VALUES // fmt.block_elems)
    with np.errstate(all="ignore"):  # inf and NaN weights give what the reference gives, without warnings
        for start in range(0, len(blocks), step):
            flat[start:start + step] = _QUANTIZERS[fmt.name](blocks[start:start + step])
    return out


def choose_format(kind: str, row_len: int) -> tuple[BlockFormat, str]:
    """The format a matrix with rows of `row_len` gets for model.quantization `kind`, and why it is not
    the one asked for ("" when it is)."""
    if kind not in KINDS:
        raise ValueError(f"model.quantization must be one of {', '.join(KINDS)}, got {kind!r}")
    name = KINDS[kind]
    reason = ""
    while row_len % _BY_NAME[name].block_elems:
        nxt = FALLBACK[name]
        reason = (f"rows of {row_len} values are not a multiple of {name}'s {_BY_NAME[name].block_elems}: "
                  f"stored as {nxt}")
        name = nxt
    return _BY_NAME[name], reason
