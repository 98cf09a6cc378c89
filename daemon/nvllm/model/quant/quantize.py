"""Quantizers: float32 weights [rows, in] -> the GGUF block bytes of Q8_0, Q5_0, Q4_0, Q6_K, Q4_K, BF16, F16.

The inverse of dequantize.py's dequantizers, in vectorised NumPy. Each follows llama.cpp's reference
quantizer (quantize_row_*_ref in ggml-quants.c, the one its tools use without an importance matrix) in
float32 and in the same order of operations, so the blocks are those llama.cpp would write: Q8_0, Q5_0,
Q4_0, BF16 and F16 bit for bit as `gguf.quants.quantize` writes them; Q6_K and Q4_K, which gguf does not
write, bit for bit as plain scalar transcriptions of the reference (tests/model/test_quantize.py holds them).

choose_format() picks a matrix's format for model.quantization (model/weights/conversion.py applies it
as the loader lays the matrices out): a matrix whose row length is not a whole number of the format's
blocks falls back as llama.cpp does, to a type it fits of no lower quality (Q4_K -> Q8_0 -> F32).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from nvllm.model.quant.formats import FORMATS, QK, QK_K, BlockFormat

# model.quantization's values -> llama.cpp's type names
KINDS: dict[str, str] = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_k": "Q4_K", "bf16": "BF16", "f16": "F16"}
# where a matrix goes when its rows do not split into the asked format's blocks (llama.cpp's rule:
# the next type that fits, of no lower quality)
FALLBACK: dict[str, str] = {"Q4_K": "Q8_0", "Q4_0": "F32", "Q8_0": "F32"}
_BY_NAME: dict[str, BlockFormat] = {f.name: f for f in FORMATS.values()}

_CHUNK_VALUES = 1 << 18  # values quantized at a time: the temporaries (1 MB each) stay in L2


# ---------------------------------------------------------------- shared arithmetic


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    """float32 [m] -> little-endian float16 bytes [m, 2] (round to nearest even, as GGML_FP32_TO_FP16)."""
    return x.astype("<f2").view(np.uint8).reshape(len(x), 2)


def _round_away(x: np.ndarray) -> np.ndarray:
    """C's roundf: halves away from zero, exactly (x + 0.5 would round 0.49999997 up)."""
    a = np.abs(x)
    fl = np.floor(a)
    return np.copysign(fl + (a - fl >= 0.5), x)


def _nearest_int(x: np.ndarray) -> np.ndarray:
    """llama.cpp's nearest_int (adding 1.5 * 2^23 to a float32): ties to even, as float32.

    The reference asserts |x| <= 4194303; beyond that it returns garbage that its callers clamp, so
    here x is first clipped to that range (the clamps that follow give the same result)."""
    return np.rint(np.clip(x, -4194303.0, 4194303.0))


def _inverse(d: np.ndarray) -> np.ndarray:
    """1/d, or 0 where d is 0 (`d ? 1.0f/d : 0.0f`)."""
    safe = np.where(d == 0, np.float32(1), d)
    return np.where(d == 0, np.float32(0), np.float32(1) / safe)


def _running_sum(terms: np.ndarray) -> np.ndarray:
    """terms [n, m] -> their sums [m] added first to last, as the reference's loops add in float32
    (np.sum adds pairwise, which rounds differently)."""
    acc = terms[0].copy()
    for row in terms[1:]:
        acc += row
    return acc


# ---------------------------------------------------------------- the formats
# Each takes blocks x [m, block_elems] float32 (C-contiguous) and returns their bytes [m, block_bytes].


def _q8_0(x: np.ndarray) -> np.ndarray:
    """Where the reference is undefined (a quotient that is NaN, or past +-127 when 1/d overflows) the
    quant is 0, or clamped: the block's d then carries the NaN or inf on. The KV pool's q8_0 writes
    (csrc/ops.c) are held to this."""
    d = np.abs(x).max(axis=1) / np.float32(127)  # [m]
    r = _round_away(np.clip(x * _inverse(d)[:, None], np.float32(-127), np.float32(127)))
    q = np.where(np.isnan(r), np.float32(0), r).astype(np.int8)  # [m, 32]
    return np.concatenate([_f16_bytes(d), q.view(np.uint8)], axis=1)


def _q4_0(x: np.ndarray) -> np.ndarray:
    """The scale is the value of largest magnitude (the first such) over -8, so it maps to 0."""
    m = len(x)
    big = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)[:, 0]  # [m]
    d = big / np.float32(-8)
    q = np.trunc(x * _inverse(d)[:, None] + np.float32(8.5))  # (int8_t) truncates toward zero
    q = np.minimum(q, 15).astype(np.uint8).reshape(m, 2, QK // 2)  # value j and j + 16 share byte j
    return np.concatenate([_f16_bytes(d), q[:, 0] | (q[:, 1] << 4)], axis=1)


def _q5_0(x: np.ndarray) -> np.ndarray:
    """As Q4_0 with 32 levels: the scale is the value of largest magnitude over -16; each quant's fifth
    bit goes to the 32-bit qh, bit j for value j."""
    m = len(x)
    big = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)[:, 0]  # [m]
    d = big / np.float32(-16)
    q = np.minimum(np.trunc(x * _inverse(d)[:, None] + np.float32(16.5)), 31).astype(np.uint32)  # [m, 32]
    qh = (((q >> 4) & 1) << np.arange(QK, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)  # [m]
    q = (q & 0x0F).astype(np.uint8).reshape(m, 2, QK // 2)
    return np.concatenate([_f16_bytes(d), qh.astype("<u4").view(np.uint8).reshape(m, 4),
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

_Q4K_STEPS = np.arange(21, dtype=np.float32)  # make_qkx2_quants(nmax 15, rmin -1, rdelta 0.1, nstep 20)


def _fit_sub_blocks(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """make_qkx2_quants for every sub-block at once: x, w [32, s] (a column per sub-block of 32 values)
    -> (quants L [32, s] in 0..15, scale [s], min [s] >= 0) with x ~ scale * L - min.

    A first fit spans [min(x, 0), max(x)] in 15 steps; then 21 nearby step counts are tried, each with
    the weighted least-squares scale and offset for its quants, and the one of least weighted squared
    error is kept."""
    hi = x.max(axis=0)
    lo = np.minimum(x.min(axis=0), 0)  # [s]
    flat = hi == lo  # such a sub-block is all zero quants, scale 0
    lo = np.where(flat, hi - 1, lo)  # any span but 0 for them: their results are dropped
    sum_w = _running_sum(w)
    sum_x = _running_sum(w * x)
    iscale = np.float32(15) / (hi - lo)
    scale = np.float32(1) / iscale
    L = np.clip(_nearest_int(iscale * (x - lo)), 0, 15)  # float32 quants [32, s]
    diff = scale * L + lo - x
    best = _running_sum(w * (diff * diff))
    for step in _Q4K_STEPS:
        # the range starts at the best offset so far, as in the reference
        iscale = (np.float32(-1) + np.float32(0.1) * step + np.float32(15)) / (hi - lo)
        la = np.clip(_nearest_int(iscale * (x - lo)), 0, 15)
        wl = w * la
        sum_l, sum_l2, sum_xl = _running_sum(wl), _running_sum(wl * la), _running_sum(wl * x)
        det = sum_w * sum_l2 - sum_l * sum_l
        ok = det > 0
        det = np.where(ok, det, np.float32(1))
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
        above = this_min > 0  # the offset may only lower values: refit the scale alone
        this_min = np.where(above, np.float32(0), this_min)
        this_scale = np.where(above, sum_xl / np.where(above, sum_l2, np.float32(1)), this_scale)
        diff = this_scale * la + this_min - x
        err = _running_sum(w * (diff * diff))
        take = ok & (err < best) & ~flat
        L = np.where(take, la, L)
        best = np.where(take, err, best)
        scale = np.where(take, this_scale, scale)
        lo = np.where(take, this_min, lo)
    L[:, flat] = 0
    lo = np.where(flat, np.minimum(hi, 0), lo)
    return L, np.where(flat, np.float32(0), scale), -lo


def _six_bits(values: np.ndarray, top: np.ndarray) -> np.ndarray:
    """values [m, 8] >= 0 -> nearest_int(63 / top * v) as uint8, at most 63 (0 where top is not > 0)."""
    inv = np.where(top > 0, np.float32(63) / np.where(top > 0, top, np.float32(1)), np.float32(0))  # [m]
    q = _nearest_int(inv[:, None] * values).astype(np.int64) & 0xFF  # the C stores an int in a uint8_t
    return np.minimum(q, 63).astype(np.uint8)


def _pack_k4_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Six-bit scales and mins [m, 8] -> the 12 scale bytes (the layout dequantize._k4_scales reads)."""
    out = np.empty((len(ls), 12), np.uint8)
    out[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    out[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:] & 0x0F) | ((lm[:, 4:] & 0x0F) << 4)
    return out


def _q4_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q4_K_ref: each super-block of 256 is 8 sub-blocks of 32, each fitted as
    scale * q - min (q in 0..15, weights rms(sub-block) + |x|); the scales and mins are then stored
    as 6-bit multiples of d = max scale / 63 and dmin = max min / 63, and the quants are made again
    against those stored values."""
    m = len(x)
    cols = np.ascontiguousarray(x.reshape(m * 8, 32).T)  # [32, 8m]: one column per sub-block
    rms = np.sqrt(_running_sum(cols * cols) / np.float32(32))
    L, scales, mins = _fit_sub_blocks(cols, rms + np.abs(cols))
    scales, mins = scales.reshape(m, 8), mins.reshape(m, 8)
    max_scale = np.maximum(scales.max(axis=1), 0)  # [m]; the reference starts both at 0
    max_min = np.maximum(mins.max(axis=1), 0)
    ls, lm = _six_bits(scales, max_scale), _six_bits(mins, max_min)
    d16 = (max_scale / np.float32(63)).astype("<f2")
    dmin16 = (max_min / np.float32(63)).astype("<f2")
    d = d16.astype(np.float32)[:, None] * ls  # [m, 8] the stored scale of each sub-block
    dm = dmin16.astype(np.float32)[:, None] * lm
    sub = x.reshape(m, 8, 32)
    again = np.clip(_nearest_int((sub + dm[:, :, None]) / np.where(d == 0, np.float32(1), d)[:, :, None]), 0, 15)
    first = L.T.reshape(m, 8, 32)  # a sub-block whose stored scale is 0 keeps its first quants
    q = np.where((d == 0)[:, :, None], first, again).astype(np.uint8).reshape(m, 4, 2, 32)
    qs = q[:, :, 0] | (q[:, :, 1] << 4)  # [m, 4, 32]: run i holds sub-block 2i low, 2i + 1 high
    head = np.concatenate([d16.view(np.uint8).reshape(m, 2), dmin16.view(np.uint8).reshape(m, 2)], axis=1)
    return np.concatenate([head, _pack_k4_scales(ls, lm), qs.reshape(m, QK_K // 2)], axis=1)


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
        lq = np.clip(_nearest_int(iscale * x), -32, 31)
        wx = w * x
        return lq, _running_sum(wx * lq), _running_sum((w * lq) * lq)

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
    ls = np.minimum(_nearest_int(iscale[:, None] * scales), 127).astype(np.int8)  # [m, 16]
    d = d16.astype(np.float32)[:, None] * ls  # [m, 16] the stored scale of each sub-block
    sub = x.reshape(m, 16, 16)
    again = np.clip(_nearest_int(sub / np.where(d == 0, np.float32(1), d)[:, :, None]), -32, 31) + 32
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
    "F32": _f32, "F16": _f16, "BF16": _bf16, "Q8_0": _q8_0, "Q5_0": _q5_0, "Q4_0": _q4_0,
    "Q6_K": _q6_k, "Q4_K": _q4_k,
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
