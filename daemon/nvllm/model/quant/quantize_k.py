"""The quantizers of Q2_K and Q3_K: float32 blocks -> their bytes, for quantize.py's table.

Each follows llama.cpp's reference quantizer (quantize_row_q{2,3}_K_ref in ggml-quants.c, the one its
tools use without an importance matrix) in float32 and in the same order of operations, as quantize.py's
Q4_K and Q6_K do (tests/model/quant/test_quantize_k.py holds them to scalar transcriptions of the reference).
Each takes super-blocks x [m, 256] float32 and returns their bytes [m, block_bytes].
"""
from __future__ import annotations

import numpy as np

from nvllm.model.quant.fitting import f16_bytes, fit_min_scale, nearest_int, running_sum

F = np.float32
GROUP_MAX_EPS = F(1e-15)  # below this largest magnitude a sub-block is all zero


def _crumbs(L: np.ndarray) -> np.ndarray:
    """2-bit quants [m, 256] -> qs [m, 64]: in each half of 128, byte l holds values l, l + 32, l + 64 and
    l + 96 in bits 0-1, 2-3, 4-5 and 6-7."""
    q = L.astype(np.uint8).reshape(len(L), 2, 4, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(len(L), 64)


def _stored(d16: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """The scales the blocks store: float16 d [m] times integer levels [m, g], in float32."""
    return d16.astype(F)[:, None] * levels.astype(F)


def q2_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q2_K_ref: 16 sub-blocks of 16, each fitted as scale * q - min (q in 0..3, weights |x|,
    absolute errors); scales and mins stored as 4-bit multiples of d = max scale / 15 and dmin = max min /
    15; the quants made again against the stored values."""
    m = len(x)
    cols = np.ascontiguousarray(x.reshape(m * 16, 16).T)  # [16, 16m]: one column per sub-block
    L, scales, mins = fit_min_scale(cols, np.abs(cols), nmax=3, rmin=-0.5, rdelta=0.1, nstep=15, use_mad=True)
    scales, mins = scales.reshape(m, 16), mins.reshape(m, 16)
    max_scale = np.maximum(scales.max(axis=1), 0)  # [m]; the reference starts both at 0
    max_min = np.maximum(mins.max(axis=1), 0)
    has_s, has_m = max_scale > 0, max_min > 0
    inv_s = np.where(has_s, F(15) / np.where(has_s, max_scale, F(1)), F(0))
    inv_m = np.where(has_m, F(15) / np.where(has_m, max_min, F(1)), F(0))
    ls = np.where(has_s[:, None], nearest_int(inv_s[:, None] * scales), 0).astype(np.int64)
    lm = np.where(has_m[:, None], nearest_int(inv_m[:, None] * mins), 0).astype(np.int64)
    packed = ((ls & 0xFF) | ((lm << 4) & 0xFF)).astype(np.uint8)  # int stores into uint8_t, as the C's
    d16 = np.where(has_s, max_scale / F(15), F(0)).astype("<f2")
    dmin16 = np.where(has_m, max_min / F(15), F(0)).astype("<f2")
    d = _stored(d16, packed & 0x0F)
    dm = _stored(dmin16, packed >> 4)
    sub = x.reshape(m, 16, 16)
    again = np.clip(nearest_int((sub + dm[:, :, None]) / np.where(d == 0, F(1), d)[:, :, None]), 0, 3)
    first = L.T.reshape(m, 16, 16)  # a sub-block whose stored scale is 0 keeps its first quants
    q = np.where((d == 0)[:, :, None], first, again).reshape(m, 256)
    return np.concatenate([packed, _crumbs(q), f16_bytes(d16.astype(F)), f16_bytes(dmin16.astype(F))], axis=1)


def _fit_q3(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """make_q3_quants(n 16, nmax 4, do_rmse) for every sub-block at once: x [16, s] -> (quants L [16, s] in
    -4..3, scale [s]) with x ~ scale * L. The first try maps the value of largest magnitude to -4; then up
    to five passes move one quant at a time where that raises the x^2-weighted fit (sumlx^2 / suml2)."""
    big = np.take_along_axis(x, np.abs(x).argmax(axis=0)[None, :], axis=0)[0]  # [s]
    zero = np.abs(big) < GROUP_MAX_EPS
    big = np.where(zero, F(1), big)
    iscale = F(-4) / big
    L = np.clip(nearest_int(iscale * x), -4, 3)
    w = x * x
    wx = w * x
    sumlx, suml2 = running_sum(wx * L), running_sum((w * L) * L)
    for _ in range(5):   # a pass that changes nothing leaves the state as it was: later ones change nothing
        for i in range(16):
            slx = sumlx - wx[i] * L[i]
            pos = slx > 0
            sl2 = suml2 - (w[i] * L[i]) * L[i]
            new = np.clip(nearest_int((x[i] * sl2) / np.where(pos, slx, F(1))), -4, 3)
            slx = slx + wx[i] * new
            sl2 = sl2 + (w[i] * new) * new
            take = pos & (new != L[i]) & (sl2 > 0) & ((slx * slx) * suml2 > (sumlx * sumlx) * sl2)
            L[i] = np.where(take, new, L[i])
            sumlx = np.where(take, slx, sumlx)
            suml2 = np.where(take, sl2, suml2)
    scale = np.where(suml2 > 0, sumlx / np.where(suml2 > 0, suml2, F(1)), F(0))
    L[:, zero] = -4   # the reference leaves an all-zero sub-block's stored quants 0: -4 less its offset
    return L, np.where(zero, F(0), scale)


def _pack_q3_scales(ls: np.ndarray) -> np.ndarray:
    """Six-bit scales [m, 16] (0..63) -> the 12 scale bytes dequantize.q3k_scales reads."""
    out = np.zeros((len(ls), 12), np.uint8)
    out[:, :8] = (ls[:, :8] & 0x0F) | ((ls[:, 8:] & 0x0F) << 4)
    high = (ls >> 4).reshape(len(ls), 4, 4)   # [m, k // 4, k % 4]
    out[:, 8:] = high[:, 0] | (high[:, 1] << 2) | (high[:, 2] << 4) | (high[:, 3] << 6)
    return out


def q3_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q3_K_ref: 16 sub-blocks of 16, each fitted as scale * q (q in -4..3); the scales stored
    as 6-bit multiples (less 32) of d = -(the largest-magnitude scale) / 32; the quants made again against
    the stored scales, their third bit to hmask (bit j // 32 of byte j % 32 for value j)."""
    m = len(x)
    cols = np.ascontiguousarray(x.reshape(m * 16, 16).T)
    L, scales = _fit_q3(cols)
    scales = scales.reshape(m, 16)
    top = np.take_along_axis(scales, np.abs(scales).argmax(axis=1)[:, None], axis=1)[:, 0]  # [m]
    some = top != 0
    iscale = F(-32) / np.where(some, top, F(1))
    ls = np.where(some[:, None], np.clip(nearest_int(iscale[:, None] * scales), -32, 31) + 32, 0)
    ls = ls.astype(np.uint8)
    d16 = np.where(some, F(1) / iscale, F(0)).astype("<f2")
    d = _stored(d16, np.where(some[:, None], ls.astype(np.int64) - 32, -32))
    sub = x.reshape(m, 16, 16)
    again = np.clip(nearest_int(sub / np.where(d == 0, F(1), d)[:, :, None]), -4, 3)
    first = L.T.reshape(m, 16, 16)
    q = (np.where((d == 0)[:, :, None], first, again) + 4).astype(np.uint8).reshape(m, 256)
    high = (q >> 2) & 1   # [m, 256]: value j's bit goes to bit j // 32 of hmask[j % 32]
    hmask = (high.reshape(m, 8, 32) << np.arange(8, dtype=np.uint8)[:, None]).sum(axis=1, dtype=np.uint8)
    return np.concatenate([hmask, _crumbs(q & 3), _pack_q3_scales(ls), f16_bytes(d16.astype(F))], axis=1)
