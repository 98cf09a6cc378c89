"""The per-row draws: one uniform from each row's own generator, then an inverse-CDF search over the row's
kept tokens, either packed (few survivors) or over the whole row by blocks."""

from __future__ import annotations

import numpy as np

DRAW_BLOCK = 256  # un-truncated rows draw through per-block sums instead of a vocab-long cumsum
PACK_MAX = 2048  # rows keeping at most this many tokens draw from them packed

_F32 = np.float32


def uniforms(generators: list[np.random.Generator], rows: np.ndarray) -> np.ndarray:
    """One uniform per row, from that row's own generator, so a seeded row's draw ignores the rest."""
    u = np.empty(rows.size, dtype=np.float64)
    for j, i in enumerate(rows):
        u[j] = generators[i].random()
    return u


def row_counts(mask: np.ndarray) -> np.ndarray:
    """[M, V] bool -> [M] trues per row; sparse masks go through flatnonzero, much faster than
    a per-row count_nonzero."""
    m, width = mask.shape
    if np.count_nonzero(mask) <= PACK_MAX * m:
        return np.bincount(np.flatnonzero(mask) // width, minlength=m)
    return np.count_nonzero(mask, axis=1)


def pack(mask: np.ndarray, v: np.ndarray, ids: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Each row's entries where mask holds, in column order: values [M, C] (-inf padding) and
    token ids [M, C] (0 padding; ids[r, c] when given, else the column c)."""
    m, width = mask.shape
    flat = np.flatnonzero(mask)  # row-major, so columns ascend within a row (2-D nonzero is 10x slower)
    r_of, col = np.divmod(flat, width)
    counts = np.bincount(r_of, minlength=m)
    out_w = max(int(counts.max()) if m else 0, 1)
    pos = np.arange(flat.size) - (np.cumsum(counts) - counts)[r_of]
    vals = np.full((m, out_w), -np.inf, dtype=_F32)
    vals[r_of, pos] = v.reshape(-1)[flat] if v.flags.c_contiguous else v[r_of, col]
    out_ids = np.zeros((m, out_w), dtype=np.int64)
    out_ids[r_of, pos] = col if ids is None else ids[r_of, col]
    return vals, out_ids


def _uniform_below(u: np.ndarray, total: np.ndarray) -> np.ndarray:
    """u * total as float32, strictly below total so that the search always lands on a kept token."""
    target = (u * total).astype(_F32)
    return np.minimum(target, np.nextafter(total, _F32(0)))


def packed(vals: np.ndarray, ids: np.ndarray, mx: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse-CDF draw over packed kept logits [M, C] (token-id order, -inf padding).

    Returns the tokens and each row's log-normaliser (max + log kept mass; NaN if no mass)."""
    m, width = vals.shape
    e = np.exp(vals - mx[:, None])  # [M, C], 0 on padding
    cdf = np.cumsum(e, axis=1)
    total = cdf[:, -1]
    j = np.count_nonzero(cdf <= _uniform_below(u, total)[:, None], axis=1)
    tok = ids[np.arange(m), np.minimum(j, width - 1)]
    shift = mx + np.log(e.sum(axis=1))
    shift[~(total > 0)] = np.nan
    return tok, shift


def full(x: np.ndarray, mx: np.ndarray, thr: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse-CDF draw over whole rows (tokens with logit >= thr): find the block by block sums,
    then the token inside it, instead of a vocab-long sequential cumsum."""
    m, vocab = x.shape
    nb = -(-vocab // DRAW_BLOCK)
    e = np.zeros((m, nb * DRAW_BLOCK), dtype=_F32)
    ev = e[:, :vocab]
    np.subtract(x, mx[:, None], out=ev)
    np.exp(ev, out=ev)
    if np.isfinite(thr).any():
        ev *= x >= thr[:, None]
    e3 = e.reshape(m, nb, DRAW_BLOCK)  # [M, V'] -> [M, blocks, B]
    bsum = e3.sum(axis=2)  # [M, blocks]
    cb = np.cumsum(bsum, axis=1)
    total = cb[:, -1]
    target = _uniform_below(u, total)
    b = np.minimum(np.count_nonzero(cb <= target[:, None], axis=1), nb - 1)
    r = np.arange(m)
    inner = e3[r, b]  # [M, B]
    rest = target - np.where(b > 0, cb[r, np.maximum(b - 1, 0)], _F32(0))
    icdf = np.cumsum(inner, axis=1)
    j = np.count_nonzero(icdf <= rest[:, None], axis=1)
    # Rounding between a block's sum and its inner cumsum: keep to the block's last kept token.
    last = DRAW_BLOCK - 1 - np.argmax(inner[:, ::-1] > 0, axis=1)
    tok = b.astype(np.int64) * DRAW_BLOCK + np.minimum(j, last)
    shift = mx + np.log(bsum.sum(axis=1))
    shift[~(total > 0)] = np.nan
    return tok, shift
