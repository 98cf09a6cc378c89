"""Top-k, top-p and min-p as one cut-off logit per row: the row keeps the tokens whose logit is >= it."""

from __future__ import annotations

import numpy as np

# top-p first looks for its cut-off among this many best tokens; rows that need more look at 8x.
TOP_P_PREFIX = 1024
TOP_P_RTOL = 1e-6

_F32 = np.float32


def thresholds(x: np.ndarray, mx: np.ndarray, k: np.ndarray, p: np.ndarray,
               minp: np.ndarray) -> np.ndarray:
    """[M] cut-off per row: the row keeps the tokens whose logit is >= it."""
    thr = np.full(x.shape[0], -np.inf, dtype=_F32)
    on = minp > 0
    thr[on] = mx[on] + np.log(minp[on])
    need = np.flatnonzero((k > 0) | (p < 1))
    if need.size:
        xn = x[need] if need.size < x.shape[0] else x
        cut = _sorted_cutoffs(xn, mx[need], k[need], p[need], thr[need], None, None)
        thr[need] = np.maximum(thr[need], cut)
    return thr


def _top_sorted(x: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """[M, V] -> each row's `length` largest values, descending [M, length], and the largest value
    left out [M] (-inf when none is)."""
    rows, vocab = x.shape
    if length >= vocab:
        return np.sort(x, axis=1)[:, ::-1], np.full(rows, -np.inf, dtype=_F32)
    part = np.partition(x, vocab - length, axis=1)
    return np.sort(part[:, vocab - length:], axis=1)[:, ::-1], part[:, :vocab - length].max(axis=1)


def _sorted_cutoffs(x: np.ndarray, mx: np.ndarray, k: np.ndarray, p: np.ndarray, floor: np.ndarray,
                    length: int | None, z_all: np.ndarray | None) -> np.ndarray:
    """Cut-off of top-k then top-p, from each row's largest values sorted.

    Looks at the best max(k, TOP_P_PREFIX) values first; rows whose answer lies beyond them are
    redone with 8 times as many, up to a full sort. The cumulative sums are sequential, so their
    value at a position does not depend on how far the prefix reached: the answer depends on the
    row alone. A row whose prefix already holds every token above `floor` (its min-p cut-off) need
    not look further: a top-p cut-off below the floor changes nothing.
    """
    rows, vocab = x.shape
    if length is None:
        length = int(np.where(k > 0, k, 0).max())
        length = min(vocab, max(length, TOP_P_PREFIX if (p < 1).any() else 1))
    top, left_out = _top_sorted(x, length)  # [M, L] descending, [M]
    r = np.arange(rows)
    tk = np.where(k > 0, top[r, np.clip(k - 1, 0, length - 1)], -np.inf).astype(_F32)
    cut = tk.copy()
    redo = np.zeros(rows, dtype=bool)
    pr = np.flatnonzero(p < 1)
    if pr.size:
        t = top if pr.size == rows else top[pr]
        w = np.subtract(t, mx[pr, None])  # [P, L] probabilities, unnormalised
        np.exp(w, out=w)
        kp = k[pr] > 0
        if kp.any():
            w[kp] *= t[kp] >= tk[pr[kp], None]  # top-p shares out what top-k left
        cum = np.cumsum(w, axis=1)
        # The mass being shared: top-k's survivors (ties with the k-th included), or the whole row.
        z = np.full(pr.size, np.nan, dtype=_F32)
        if kp.any():
            kr, ki = pr[kp], np.flatnonzero(kp)
            inside = left_out[kr] < tk[kr]  # else a tie with the k-th lies beyond the prefix
            count = np.count_nonzero(t[kp] >= tk[kr, None], axis=1)  # survivors, ties included
            z[ki[inside]] = cum[ki[inside], count[inside] - 1]
            redo[kr[~inside]] = True
        if (~kp).any():
            if z_all is None:
                z_all = np.full(rows, np.nan, dtype=_F32)
                fr = pr[~kp]
                tmp = np.subtract(x[fr], mx[fr, None])  # [F, V]
                z_all[fr] = np.exp(tmp, out=tmp).sum(axis=1)
            z[~kp] = z_all[pr[~kp]]
        # cum ascends along a row, so the first position reaching the target is a count.
        m = np.count_nonzero(cum < (p[pr] * z * _F32(1 - TOP_P_RTOL))[:, None], axis=1)
        hit = m < length
        cut[pr] = np.where(hit, np.maximum(cut[pr], t[np.arange(pr.size), np.minimum(m, length - 1)]),
                           cut[pr])
        # Not reached: look further, unless the whole row was in view (then rounding: keep all),
        # or everything min-p keeps was (then the cut-off is min-p's).
        redo[pr[~hit & ~kp & (left_out[pr] >= floor[pr]) & (length < vocab)]] = True
    if redo.any() and length < vocab:
        again = np.flatnonzero(redo)
        z_again = None if z_all is None else z_all[again]
        cut[again] = _sorted_cutoffs(x[again], mx[again], k[again], p[again], floor[again],
                                     min(vocab, length * 8), z_again)
    return cut
