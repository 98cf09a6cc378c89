"""Top-N logprobs per row, most likely first, ties by lower id."""

from __future__ import annotations

import numpy as np

from nvllm.model.sampling import draws

_F32 = np.float32


def _best(v: np.ndarray, ids: np.ndarray | None, floor: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's entries that can be among its nmax best with v >= floor: values and ids [W, c],
    sorted by value descending, then lower id first (-inf padding)."""
    w, width = v.shape
    if width > 256 and nmax < width:
        if ids is None and width >= nmax * draws.DRAW_BLOCK:
            # The nmax-th largest block maximum: at least nmax values reach it. Cheaper than a
            # partition of the whole row.
            bmax = np.maximum.reduceat(v, np.arange(0, width, draws.DRAW_BLOCK), axis=1)  # [W, blocks]
            nb = bmax.shape[1]
            low = np.partition(bmax, nb - nmax, axis=1)[:, nb - nmax]
        else:
            low = np.partition(v, width - nmax, axis=1)[:, width - nmax]
        cv, cid = draws.pack(v >= np.maximum(low, floor)[:, None], v, ids)
    else:
        cv = np.where(v >= floor[:, None], v, -np.inf).astype(_F32)
        cid = np.broadcast_to(np.arange(width), v.shape) if ids is None else ids
    order = np.lexsort((cid, -cv), axis=1)[:, :nmax]  # value descending, then lower id
    return np.take_along_axis(cv, order, axis=1), np.take_along_axis(cid, order, axis=1)


def fill_top(vals: np.ndarray, ids: np.ndarray | None, floor: np.ndarray, shift: np.ndarray,
             out_rows: np.ndarray, num_logprobs: np.ndarray, top: list) -> None:
    """Top-N (ids, logprobs) per row from logits vals [W, C] (>= floor; ids given, or the column)
    minus each row's log-normaliser shift [W]."""
    n_req = num_logprobs[out_rows]
    sel = np.flatnonzero(n_req >= 1)
    if not sel.size:
        return
    if sel.size < len(out_rows):
        vals, floor, shift = vals[sel], floor[sel], shift[sel]
        ids = None if ids is None else ids[sel]
    cv, cid = _best(vals, ids, floor, int(n_req[sel].max()))
    lp = np.minimum(cv - shift[:, None], 0).astype(_F32)
    finite = np.isfinite(cv)
    for j, i in enumerate(sel):
        count = min(int(n_req[i]), int(np.count_nonzero(finite[j])))
        top[out_rows[i]] = (cid[j, :count].astype(np.int64), lp[j, :count])
