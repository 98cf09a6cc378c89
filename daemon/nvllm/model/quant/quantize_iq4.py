"""The quantizers of IQ4_NL and IQ4_XS: float32 blocks -> their bytes, for quantize.py's table.

Both follow llama.cpp's quantize_row_iq4_nl_impl as its quantize tool calls it without an importance
matrix (quantize_iq4_nl and quantize_iq4_xs: weights x^2, 7 tries each way), in float32 and in the same
order of operations (tests/model/quant/test_quantize_k.py holds them to a scalar transcription). Each block of
32 values gets the scale whose nearest table values (IQ4_VALUES) fit it best in the weighted least-squares
sense; IQ4_XS then stores its eight scales as 6-bit multiples (less 32) of d = -(the largest-magnitude
scale) / 32 and picks the quants again against those.
"""
from __future__ import annotations

import numpy as np

from nvllm.model.quant.fitting import f16_bytes, inverse, nearest_int, running_sum
from nvllm.model.quant.formats import IQ4_VALUES

F = np.float32
GROUP_MAX_EPS = F(1e-15)
NTRY = 7
_VALUES = IQ4_VALUES.astype(F)


def _lower_wins(v: np.float32, k: int) -> bool:
    """best_index_int8's last test between table values k and k + 1, in float32 as the C does it."""
    return bool(np.float32(v - _VALUES[k]) < np.float32(_VALUES[k + 1] - v))


def _threshold(k: int) -> np.float32:
    """The least float32 between values k and k + 1 that goes to k + 1. The test is monotone in v, so
    one such float splits the interval; it lies within a few ulps of the midpoint."""
    t = np.float32((_VALUES[k] + _VALUES[k + 1]) / 2)
    while not _lower_wins(np.nextafter(t, F(-np.inf)), k):
        t = np.nextafter(t, F(-np.inf))
    while _lower_wins(t, k):
        t = np.nextafter(t, F(np.inf))
    return t


def _unit_tables() -> tuple[np.ndarray, np.ndarray]:
    """Per unit interval [u, u + 1), u = -128..114: the index of its first value, and the threshold in
    it (+inf if none; the table values lie at least 6 apart, so a unit holds at most one)."""
    thresholds = np.array([_threshold(k) for k in range(15)], F)
    units = np.arange(-128, 115, dtype=F)
    base = np.searchsorted(thresholds, units, side="left")       # thresholds below u
    inside = np.floor(thresholds).astype(np.int64) + 128          # the unit each threshold lies in
    step = np.full(len(units), np.inf, F)
    step[inside] = thresholds
    return base.astype(np.int64), step


_UNIT_BASE, _UNIT_STEP = _unit_tables()


def _nearest_value(v: np.ndarray) -> np.ndarray:
    """best_index_int8: the index of the table value nearest v (the lower one unless the upper is
    strictly nearer), 0 and 15 at the ends. Its binary search and float test come to fixed thresholds,
    found once; a value's unit interval then gives its index with one comparison."""
    u = np.clip(np.floor(v), F(-128), F(114)).astype(np.int64) + 128
    return _UNIT_BASE[u] + (v >= _UNIT_STEP[u])


def _fit(x: np.ndarray) -> np.ndarray:
    """The scale of each block of 32: x [32, s] (a column per block) -> d [s] (0 for an all-zero block)."""
    w = x * x
    big = np.take_along_axis(x, np.abs(x).argmax(axis=0)[None, :], axis=0)[0]  # [s]
    zero = np.abs(big) < GROUP_MAX_EPS
    big = np.where(zero, F(1), big)

    def sums(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        q = _VALUES[_nearest_value(iscale * x)]
        wq = w * q
        return running_sum(wq * x), running_sum(wq * q)

    sumqx, sumq2 = sums(F(1) / (-big / _VALUES[0]))
    d = np.where(sumq2 > 0, sumqx / np.where(sumq2 > 0, sumq2, F(1)), F(0))
    best = d * sumqx
    for itry in range(-NTRY, NTRY + 1):
        sumqx, sumq2 = sums(F(itry + int(IQ4_VALUES[0])) / big)
        take = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
        d = np.where(take, sumqx / np.where(take, sumq2, F(1)), d)
        best = np.where(take, d * sumqx, best)
    return np.where(zero, F(0), d)


def _nibbles(L: np.ndarray) -> np.ndarray:
    """Table indices [m, 32k] -> qs [m, 16k]: in each 32, byte j holds value j low and j + 16 high."""
    q = L.astype(np.uint8).reshape(len(L), -1, 2, 16)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(len(L), -1)


def iq4_nl(x: np.ndarray) -> np.ndarray:
    """Blocks x [m, 32] -> [m, 18]: d = the block's scale (as float16), each value its nearest table value
    at 1 / d."""
    d = _fit(np.ascontiguousarray(x.T))
    L = _nearest_value(inverse(d)[:, None] * x)
    return np.concatenate([f16_bytes(d), _nibbles(L)], axis=1)


def iq4_xs(x: np.ndarray) -> np.ndarray:
    """Super-blocks x [m, 256] -> [m, 136]: d, scales_h (bits 2s, 2s + 1: scale s's top two), scales_l
    (nibble s % 2 of byte s // 2: its low four), qs as IQ4_NL's, a run of 16 bytes per sub-block."""
    m = len(x)
    scales = _fit(np.ascontiguousarray(x.reshape(m * 8, 32).T)).reshape(m, 8)
    top = np.take_along_axis(scales, np.abs(scales).argmax(axis=1)[:, None], axis=1)[:, 0]  # [m]
    d = -top / F(32)
    ls = np.clip(nearest_int(inverse(d)[:, None] * scales), -32, 31)  # [m, 8]
    dl = d[:, None] * ls
    L = _nearest_value(inverse(dl)[:, :, None] * x.reshape(m, 8, 32)).reshape(m, 256)
    stored = (ls + 32).astype(np.uint16)
    high = ((stored >> 4) << np.arange(0, 16, 2, dtype=np.uint16)).sum(axis=1, dtype=np.uint16)  # [m]
    low = (stored & 0x0F).astype(np.uint8).reshape(m, 4, 2)
    return np.concatenate([f16_bytes(d), high.astype("<u2").view(np.uint8).reshape(m, 2),
                           low[:, :, 0] | (low[:, :, 1] << 4), _nibbles(L)], axis=1)
