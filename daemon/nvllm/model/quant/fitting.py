"""The arithmetic llama.cpp's reference quantizers share, in vectorised float32 NumPy: its rounding
(nearest_int, roundf), its sums added first to last, and its fits of a scale and a min to sub-blocks
(make_qkx2_quants), for quantize.py and quantize_k.py.
"""
from __future__ import annotations

import numpy as np


def f16_bytes(x: np.ndarray) -> np.ndarray:
    """float32 [m] -> little-endian float16 bytes [m, 2] (round to nearest even, as GGML_FP32_TO_FP16)."""
    return x.astype("<f2").view(np.uint8).reshape(len(x), 2)


def round_away(x: np.ndarray) -> np.ndarray:
    """C's roundf: halves away from zero, exactly (x + 0.5 would round 0.49999997 up)."""
    a = np.abs(x)
    fl = np.floor(a)
    return np.copysign(fl + (a - fl >= 0.5), x)


def nearest_int(x: np.ndarray) -> np.ndarray:
    """llama.cpp's nearest_int (adding 1.5 * 2^23 to a float32): ties to even, as float32.

    The reference asserts |x| <= 4194303; beyond that it returns garbage that its callers clamp, so
    here x is first clipped to that range (the clamps that follow give the same result)."""
    return np.rint(np.clip(x, -4194303.0, 4194303.0))


def inverse(d: np.ndarray) -> np.ndarray:
    """1/d, or 0 where d is 0 (`d ? 1.0f/d : 0.0f`)."""
    safe = np.where(d == 0, np.float32(1), d)
    return np.where(d == 0, np.float32(0), np.float32(1) / safe)


def running_sum(terms: np.ndarray) -> np.ndarray:
    """terms [n, m] -> their sums [m] added first to last, as the reference's loops add in float32
    (np.sum adds pairwise, which rounds differently)."""
    acc = terms[0].copy()
    for row in terms[1:]:
        acc += row
    return acc



F = np.float32


def fit_min_scale(x: np.ndarray, w: np.ndarray, nmax: int = 15, rmin: float = -1.0, rdelta: float = 0.1,
                  nstep: int = 20, use_mad: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """make_qkx2_quants for every sub-block at once: x, w [n, s] (a column per sub-block of n values)
    -> (quants L [n, s] in 0..nmax, scale [s], min [s] >= 0) with x ~ scale * L - min. The defaults are
    Q4_K's (nmax 15, rmin -1, rdelta 0.1, nstep 20, squared error); use_mad weighs absolute errors.

    A first fit spans [min(x, 0), max(x)] in nmax steps; then nstep + 1 nearby step counts are tried, each
    with the weighted least-squares scale and offset for its quants, and the one of least weighted
    error is kept."""
    def error(diff: np.ndarray) -> np.ndarray:
        return running_sum(w * (np.abs(diff) if use_mad else diff * diff))

    hi = x.max(axis=0)
    lo = np.minimum(x.min(axis=0), 0)  # [s]
    flat = hi == lo  # such a sub-block is all zero quants, scale 0
    lo = np.where(flat, hi - 1, lo)  # any span but 0 for them: their results are dropped
    sum_w = running_sum(w)
    sum_x = running_sum(w * x)
    iscale = F(nmax) / (hi - lo)
    scale = F(1) / iscale
    L = np.clip(nearest_int(iscale * (x - lo)), 0, nmax)  # float32 quants [n, s]
    best = error(scale * L + lo - x)
    for step in range(nstep + 1):
        # the range starts at the best offset so far, as in the reference
        iscale = (F(rmin) + F(rdelta) * F(step) + F(nmax)) / (hi - lo)
        la = np.clip(nearest_int(iscale * (x - lo)), 0, nmax)
        wl = w * la
        sum_l, sum_l2, sum_xl = running_sum(wl), running_sum(wl * la), running_sum(wl * x)
        det = sum_w * sum_l2 - sum_l * sum_l
        ok = det > 0
        det = np.where(ok, det, F(1))
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
        above = this_min > 0  # the offset may only lower values: refit the scale alone
        this_min = np.where(above, F(0), this_min)
        this_scale = np.where(above, sum_xl / np.where(above, sum_l2, F(1)), this_scale)
        err = error(this_scale * la + this_min - x)
        take = ok & (err < best) & ~flat
        L = np.where(take, la, L)
        best = np.where(take, err, best)
        scale = np.where(take, this_scale, scale)
        lo = np.where(take, this_min, lo)
    L[:, flat] = 0
    lo = np.where(flat, np.minimum(hi, 0), lo)
    return L, np.where(flat, F(0), scale), -lo
